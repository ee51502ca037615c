"""Batch encoding over processes. Each worker gets the tokenizer once, then batches of texts.

Small batches stay in this process: starting workers costs more than it saves.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from gptlab.runtime import default_workers, process_context

PARALLEL_MIN_CHARS = 1 << 20
_worker_tokenizer = None


def _init(tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_chunk(args: tuple) -> list[list[int]]:
    texts, allowed, disallowed = args
    return [_worker_tokenizer.encode(t, allowed_special=allowed, disallowed_special=disallowed) for t in texts]


def encode_batch(tokenizer, texts: Sequence[str], *, workers, allowed_special, disallowed_special) -> list[list[int]]:
    texts = list(texts)
    workers = workers or default_workers()
    total = sum(map(len, texts))
    if workers == 1 or total < PARALLEL_MIN_CHARS or len(texts) < 2:
        return [tokenizer.encode(t, allowed_special=allowed_special, disallowed_special=disallowed_special) for t in texts]
    # Ordered chunks of about equal size; several per worker to even out the load.
    target = total // (4 * workers) + 1
    chunks, current, size = [], [], 0
    for text in texts:
        current.append(text)
        size += len(text)
        if size >= target:
            chunks.append(current)
            current, size = [], 0
    if current:
        chunks.append(current)
    allowed = allowed_special if allowed_special == "all" else frozenset(allowed_special)
    disallowed = disallowed_special if disallowed_special == "all" else frozenset(disallowed_special)
    with process_context().Pool(workers, initializer=_init, initargs=(tokenizer,)) as pool:
        results = pool.map(_encode_chunk, [(chunk, allowed, disallowed) for chunk in chunks])
    return [ids for chunk in results for ids in chunk]
