"""The chat format: role tokens around each message, and rendering a conversation into ids and a loss mask.

    <|endoftext|><|system|>Be brief.<|end|><|user|>2+2?<|end|><|assistant|>4<|end|>

Every conversation starts with the tokenizer's end-of-text token (the same
document boundary pretraining saw), then each message is its role's token, its
content encoded as ordinary text (special-token text inside a message stays
text), and `<|end|>`. Only the assistant's content and its `<|end|>` are
training targets; a prompt for generation ends with `<|assistant|>` and the
model answers until it emits `<|end|>`. `<|tool|>` is reserved for tool turns.

The same format is written as a Jinja chat template for Hugging Face
(`chat_template()`), so `AutoTokenizer.apply_chat_template` gives the same ids.

Not here: reading conversation files (gptlab.chat.data), batching for SFT
(gptlab.chat.loader), growing a model's embedding rows (gptlab.model.resize).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant")  # roles a conversation may use today
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
END = "<|end|>"  # closes every message; the assistant's stop token
CHAT_TOKENS = (*ROLE_TOKENS.values(), END)

Message = Mapping[str, object]  # {"role": "user", "content": "..."}; an assistant's may hold "tool_calls"


class Conversation(list):
    """A conversation's messages (a list), and the tools it offers the assistant (OpenAI's fine-tuning shape:
    {"messages": [...], "tools": [{"type": "function", "function": {...}}]}); `tools` is () when none are offered."""

    def __init__(self, messages: Sequence[Message] = (), tools: Sequence[Mapping] = ()) -> None:
        super().__init__(messages)
        self.tools = tuple(tools)

    def __repr__(self) -> str:
        return f"Conversation({list(self)!r}, tools={list(self.tools)!r})" if self.tools else f"Conversation({list(self)!r})"


@dataclass(frozen=True)
class Rendered:
    """A conversation as ids, with mask[i] = 1 where ids[i] is a training target (assistant content and its <|end|>)."""

    ids: list[int]
    mask: list[int]


def add_chat_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer with the chat tokens added as special tokens at the next free ids (itself if it has them).

    Existing ids never move, so a model trained on `tokenizer` keeps its meaning; the new rows
    are grown with `gptlab.model.resize.grow_vocab`.
    """
    if tokenizer.eot_id is None:
        raise GptlabError("the tokenizer has no end-of-text token (<|endoftext|>), which starts every conversation")
    missing = [token for token in CHAT_TOKENS if token not in tokenizer.special_tokens]
    if not missing:
        return tokenizer
    return tokenizer.with_special_tokens(missing)


class ChatFormat:
    """Renders conversations with a tokenizer that holds the chat tokens (see `add_chat_tokens`)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        missing = [token for token in CHAT_TOKENS if token not in tokenizer.special_tokens]
        if missing or tokenizer.eot_id is None:
            raise GptlabError(
                f"the tokenizer lacks the chat tokens {', '.join(missing) or '<|endoftext|>'}: "
                "fine-tune with `gptlab sft`, which adds them, or call gptlab.chat.add_chat_tokens"
            )
        self.tokenizer = tokenizer
        self.bos = tokenizer.eot_id
        self.role_ids = {role: tokenizer.special_tokens[token] for role, token in ROLE_TOKENS.items()}
        self.end = tokenizer.special_tokens[END]

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        """Ids that end an assistant turn: <|end|>, and end-of-text for safety."""
        return (self.end, self.bos)

    def render(self, messages: Sequence[Message], *, for_generation: bool = False) -> Rendered:
        """A conversation as ids and a loss mask; `for_generation` appends the assistant's opening.

        With a tokenizer where "2+2?" is [17, 11, 17, 30] and "4" is [19] (ids made up), and the
        chat tokens eot=0, <|system|>=512, <|user|>=513, <|assistant|>=514, <|end|>=516:

            render([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])
            ids  [0, 513, 17, 11, 17, 30, 516, 514, 19, 516]
            mask [0,   0,  0,  0,  0,  0,   0,   0,  1,   1]

            render([{"role": "user", "content": "2+2?"}], for_generation=True).ids
                 [0, 513, 17, 11, 17, 30, 516, 514]

        Messages are checked first (gptlab.chat.format.check_messages): a bad one raises.
        """
        check_messages(messages, for_generation=for_generation)
        ids, mask = [self.bos], [0]
        for message in messages:
            role = message["role"]
            content = self.tokenizer.encode_ordinary(message["content"])
            target = int(role == "assistant")
            ids += [self.role_ids[role], *content, self.end]
            mask += [0, *[target] * len(content), target]
        if for_generation:
            ids.append(self.role_ids["assistant"])
            mask.append(0)
        return Rendered(ids, mask)

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        """Ids to generate the assistant's next message from."""
        return self.render(messages, for_generation=True).ids


def check_messages(messages: Sequence[Message], *, for_generation: bool = False) -> None:
    """Raise GptlabError naming the first problem: not a list, unknown role, empty or non-text content,
    a system message after the first, or (for training) no assistant message; for generation the last
    message must not be the assistant's."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence) or not messages:
        raise GptlabError("a conversation is a non-empty list of messages like {\"role\": \"user\", \"content\": \"...\"}")
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise GptlabError(f"message {n} is not an object with role and content: {message!r:.60}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise GptlabError(f"message {n} has unknown role {role!r}; use one of {', '.join(ROLES)}")
        if role == "system" and n > 0:
            raise GptlabError(f"message {n} is a system message; only the first message may be one")
        if not isinstance(content, str):
            raise GptlabError(f"message {n} ({role}) content must be text, got {type(content).__name__}")
        if not content.strip():
            raise GptlabError(f"message {n} ({role}) has empty content")
    roles = [message["role"] for message in messages]
    if for_generation:
        if roles[-1] == "assistant":
            raise GptlabError("the last message is the assistant's: end with a user message to generate a reply")
    elif "assistant" not in roles:
        raise GptlabError("the conversation has no assistant message: nothing to train on")


def chat_template(start: str | None = None) -> str:
    """A Jinja template for transformers' `apply_chat_template` that renders exactly as ChatFormat.render.

    It opens with the end-of-text token: `start`, its text, where the folder's eos_token is the end of a turn
    (a Hugging Face export); else the eos_token (<|endoftext|>, or a SentencePiece model's </s>, whose bos_token
    <s> differs), as a GGUF file's tokenizer has it."""
    opening = "{{ eos_token }}" if start is None else "{{ " + json.dumps(start) + " }}"
    return opening + (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>' + message['content'] + '" + END + "' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '" + ROLE_TOKENS["assistant"] + "' }}{% endif %}"
    )
