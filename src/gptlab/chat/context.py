"""Fitting a conversation into a model's context: drop the oldest turns until the prompt fits.

A turn is a user message and the assistant's reply after it. The system message,
if any, and the newest user message are always kept:

    [system, user1, assistant1, user2, assistant2, user3]   room for ~4 messages
      -> [system, user2, assistant2, user3]                 dropped 2

Not here: the format itself (gptlab.chat.format), generation (gptlab.infer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gptlab.chat.format import ChatFormat, Message
from gptlab.runtime import GptlabError


def fit_context(chat_format: ChatFormat, messages: Sequence[Message], room: int, *,
                tools: Sequence[Mapping] | None = None) -> tuple[list[Message], int]:
    """(messages, how many were dropped): the newest turns whose generation prompt is at most `room` tokens.

    A turn's tool calls and results go with it. Raises GptlabError when even the system message and the newest
    user message alone (with the tools block, if `tools`) do not fit.
    """
    messages = list(messages)
    start = 1 if messages and messages[0].get("role") == "system" else 0
    head = messages[:start]
    # Cut points: the start of each turn (a user message), oldest first; the last is the newest user message.
    cuts = [n for n in range(start, len(messages)) if messages[n].get("role") == "user"] or [start]
    for cut in cuts:
        kept = head + messages[cut:]
        length = len(chat_format.prompt(kept, tools=tools))
        if length <= room:
            return kept, cut - start
    raise GptlabError(
        f"the message needs {length} tokens of context (with the system prompt and chat tokens) but only {room} are "
        "left after the reply's tokens: shorten it, shorten the system prompt, or ask for fewer reply tokens"
    )
