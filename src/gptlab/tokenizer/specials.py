"""Special tokens (e.g. `<|endoftext|>`): finding them in text, tiktoken's conventions.

Text is cut at special tokens before anything else, so no piece and no merge
ever crosses one. Where two special tokens overlap, the longest wins:

    >>> SpecialMatcher(["<|a|>", "<|a|><|a|>"]).split("x<|a|><|a|>y")
    [('x', False), ('<|a|><|a|>', True), ('y', False)]
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Literal

import regex

from gptlab.runtime import GptlabError

AllowedSpecial = Literal["all"] | Collection[str]


class SpecialMatcher:
    """Finds occurrences of a fixed set of special tokens, longest first."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens = sorted(set(tokens), key=lambda token: (-len(token), token))
        alternatives = "|".join(regex.escape(token) for token in self.tokens)
        self.regex = regex.compile(alternatives) if self.tokens else None
        self.longest = max((len(token) for token in self.tokens), default=0)

    def split(self, text: str) -> list[tuple[str, bool]]:
        """Cut `text` into (part, is_special) pairs, in order; empty parts are left out."""
        if self.regex is None:
            return [(text, False)] if text else []
        parts, position = [], 0
        for match in self.regex.finditer(text):
            if match.start() > position:
                parts.append((text[position : match.start()], False))
            parts.append((match.group(), True))
            position = match.end()
        if position < len(text):
            parts.append((text[position:], False))
        return parts

    def search(self, text: str) -> str | None:
        if self.regex is None:
            return None
        match = self.regex.search(text)
        return match.group() if match else None

    def safe_end(self, text: str) -> int:
        """Where a buffer may be cut without splitting a special token that more text could complete."""
        if self.regex is None:
            return len(text)
        for start in range(max(0, len(text) - self.longest + 1), len(text)):
            tail = text[start:]
            if any(token.startswith(tail) for token in self.tokens):
                return start
        return len(text)


def resolve_special_sets(
    special_tokens: Collection[str], allowed_special: AllowedSpecial, disallowed_special: AllowedSpecial
) -> tuple[set[str], set[str]]:
    """tiktoken's rules: allowed ones encode as special ids; disallowed ones in text raise."""
    known = set(special_tokens)
    allowed = known if allowed_special == "all" else set(allowed_special)
    disallowed = known - allowed if disallowed_special == "all" else set(disallowed_special)
    unknown = (allowed | disallowed) - known
    if unknown:
        raise GptlabError(
            f"unknown special token(s) {sorted(unknown)}; this tokenizer has {sorted(known) or 'none'}"
        )
    return allowed, disallowed


def raise_disallowed(token: str) -> None:
    raise GptlabError(
        f"text contains the special token {token!r}. Pass allowed_special={{{token!r}}} (or 'all') to encode it "
        f"as a special token, or disallowed_special=() to encode it as ordinary text "
        f"(CLI: --allow-special / --special-as-text)"
    )
