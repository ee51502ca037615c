"""Streaming text into special tokens and the parts between them, with bounded memory.

Shared by training (which counts pieces) and `encode_iterable` (which encodes
them). The text between special tokens goes to a `take(text, final)` function
that returns (result, characters used): with `final` false the text may go on
in the next chunk, so `take` uses only a prefix no further text could change
(patterns.split_stable) and the rest is offered again with what follows.
Streaming so gives exactly the parts the whole text would give; a special
token cut between two chunks is held back until it is complete.

Not here: reading files (gptlab.tokenizer.train), BPE (gptlab.tokenizer.core).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gptlab.tokenizer.specials import SpecialMatcher

Take = Callable[[str, bool], tuple[Any, int]]


def stream_parts(
    chunks: Iterable[str],
    matcher: SpecialMatcher,
    take: Take,
    buffer_chars: int = 1 << 20,
) -> Iterator[tuple[Any, bool]]:
    """Yield (special token, True) and (take's result for the text between them, False), in order."""
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
            yield (part, True) if special else (take(part, True)[0], False)
        open_text = "".join(part for part, _ in parts[last_special + 1 :])
        result, used = take(open_text, False)
        yield result, False
        buffer = open_text[used:] + held
        # A piece that never ends (no pre-split, endless whitespace) must not make this quadratic.
        threshold = max(buffer_chars, 2 * len(buffer))
    for part, special in matcher.split(buffer):
        yield (part, True) if special else (take(part, True)[0], False)
