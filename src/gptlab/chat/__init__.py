"""Chat: the conversation format, rendering with loss masks, SFT data sources, built-in tasks with verifiers."""

from gptlab.chat.format import (
    CALL,
    CHAT_TOKENS,
    END,
    ROLE_TOKENS,
    TOOL_TOKENS,
    ChatFormat,
    Conversation,
    Rendered,
    add_chat_tokens,
    chat_template,
    check_messages,
)
from gptlab.chat.messages import ROLES

__all__ = ["CALL", "CHAT_TOKENS", "END", "ROLES", "ROLE_TOKENS", "TOOL_TOKENS", "ChatFormat", "Conversation", "Rendered", "add_chat_tokens",
           "chat_template", "check_messages"]
