"""Streaming text into pieces and special tokens, with bounded memory.

Shared by training (which counts pieces) and `encode_iterable` (which encodes
them). Streaming gives exactly the parts the whole text would give: a special
token cut between two chunks is held back until it is complete, and so is a
piece that more text could extend (see patterns.split_stable).

Not here: reading files (gptlab.tokenizer.train), BPE (gptlab.tokenizer.bpe).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import regex

from gptlab.tokenizer.patterns import split, split_stable
from gptlab.tokenizer.specials import SpecialMatcher


def _parts_of(text: str, matcher: SpecialMatcher, compiled: regex.Pattern | None) -> Iterator[tuple[str, bool]]:
    for part, special in matcher.split(text):
        if special:
            yield part, True
        else:
            for piece in split(part, compiled):
                yield piece, False


def stream_parts(
    chunks: Iterable[str],
    matcher: SpecialMatcher,
    compiled: regex.Pattern | None,
    buffer_chars: int = 1 << 20,
) -> Iterator[tuple[str, bool]]:
    """Yield (piece, is_special) for the concatenation of `chunks`, in order."""
    buffer, threshold = "", buffer_chars
    for chunk in chunks:
        buffer += chunk
        if len(buffer) < threshold:
            continue
        cut = matcher.safe_end(buffer)
        head, held = buffer[:cut], buffer[cut:]
        parts = matcher.split(head)
        last_special = max((i for i, (_, special) in enumerate(parts) if special), default=-1)
        for part, special in parts[: last_special + 1]:
            if special:
                yield part, True
            else:
                yield from ((piece, False) for piece in split(part, compiled))
        open_text = "".join(part for part, _ in parts[last_special + 1 :])
        pieces, rest = split_stable(open_text, compiled, final=False)
        yield from ((piece, False) for piece in pieces)
        buffer = rest + held
        # A piece that never ends (no pre-split, endless whitespace) must not make this quadratic.
        threshold = max(buffer_chars, 2 * len(buffer))
    yield from _parts_of(buffer, matcher, compiled)
