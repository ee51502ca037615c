"""Chat: the conversation format, rendering with loss masks, SFT data sources, built-in tasks with verifiers."""

from gptlab.chat.format import CHAT_TOKENS, END, ROLE_TOKENS, ROLES, ChatFormat, Rendered, add_chat_tokens, chat_template, check_messages

__all__ = ["CHAT_TOKENS", "END", "ROLES", "ROLE_TOKENS", "ChatFormat", "Rendered", "add_chat_tokens", "chat_template", "check_messages"]
