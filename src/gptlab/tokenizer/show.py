"""The token viewer: text with coloured token boundaries (as the Tiktokenizer web app shows them) and stats.

Not here: encoding (gptlab.tokenizer.core).
"""

from __future__ import annotations

from dataclasses import dataclass

from gptlab.tokenizer.formats import token_to_text

# Background colours that keep default foreground text readable, cycled per token.
_BACKGROUNDS = ["48;5;153", "48;5;187", "48;5;224", "48;5;194", "48;5;230", "48;5;189"]
_RESET = "\x1b[0m"


@dataclass(frozen=True)
class TokenStats:
    tokens: int
    characters: int
    bytes: int

    @property
    def bytes_per_token(self) -> float:
        """The compression ratio: UTF-8 bytes per token."""
        return self.bytes / self.tokens if self.tokens else 0.0

    def __str__(self) -> str:
        return (
            f"{self.tokens:,} tokens, {self.characters:,} characters, {self.bytes:,} bytes, "
            f"{self.bytes_per_token:.2f} bytes/token"
        )


def token_stats(text: str, ids: list[int]) -> TokenStats:
    return TokenStats(tokens=len(ids), characters=len(text), bytes=len(text.encode("utf-8")))


def render_tokens(tokenizer, ids: list[int], color: bool = True) -> str:
    """Each token's text on a cycling background; without colour, tokens are separated by '|'.

    A token that holds part of a UTF-8 character shows its bytes as \\xNN.
    """
    parts = []
    for position, i in enumerate(ids):
        text = token_to_text(tokenizer.token_bytes(i))
        if color:
            # Colour each line separately so backgrounds do not bleed across line ends.
            code = _BACKGROUNDS[position % len(_BACKGROUNDS)]
            text = "\n".join(f"\x1b[30;{code}m{line}{_RESET}" if line else "" for line in text.split("\n"))
        parts.append(text)
    return "".join(parts) if color else "|".join(parts)
