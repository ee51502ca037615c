"""Batch encoding over all cores: threads over the compiled encoder (it frees the GIL), else processes.

Texts are cut into ordered chunks of about equal size, several per worker to
even out the load; each chunk is encoded in one call (one piece cache).
Small batches stay in this thread: starting workers costs more than it saves.
Worker processes ignore Ctrl-C; this process ends them (gptlab.runtime.processes.worker_pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from gptlab.runtime import default_workers
from gptlab.runtime.processes import worker_pool

PARALLEL_MIN_CHARS = 1 << 20  # processes: below this, starting them costs more than it saves
THREAD_MIN_CHARS = 1 << 16  # threads start for free, but a tiny batch is not worth splitting
_worker_tokenizer = None


def _init(tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_chunk(args: tuple) -> list[list[int]]:
    texts, allowed, disallowed = args
    return _worker_tokenizer.encode_many(texts, allowed_special=allowed, disallowed_special=disallowed)


def _chunks(texts: list[str], total: int, workers: int) -> list[list[str]]:
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
    return chunks


def encode_batch(tokenizer, texts: Sequence[str], *, workers, allowed_special, disallowed_special) -> list[list[int]]:
    texts = list(texts)
    workers = workers or default_workers()
    total = sum(map(len, texts))
    threads = tokenizer._fast() is not None
    if workers == 1 or total < (THREAD_MIN_CHARS if threads else PARALLEL_MIN_CHARS) or len(texts) < 2:
        return tokenizer.encode_many(texts, allowed_special=allowed_special, disallowed_special=disallowed_special)
    allowed = allowed_special if allowed_special == "all" else frozenset(allowed_special)
    disallowed = disallowed_special if disallowed_special == "all" else frozenset(disallowed_special)
    chunks = _chunks(texts, total, workers)
    if threads:
        with ThreadPoolExecutor(workers) as pool:
            results = list(
                pool.map(lambda chunk: tokenizer.encode_many(chunk, allowed_special=allowed, disallowed_special=disallowed), chunks)
            )
    else:
        with worker_pool(workers, initializer=_init, initargs=(tokenizer,)) as pool:
            results = pool.map(_encode_chunk, [(chunk, allowed, disallowed) for chunk in chunks])
    return [ids for chunk in results for ids in chunk]
