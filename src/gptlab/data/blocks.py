"""Pass 1 of `gptlab data prepare`: a source's documents into token blocks in the work folder, resumably.

Documents stream from the source in a fixed order and are cut into blocks of
up to BLOCK_CHARS characters; worker processes encode the blocks (each
document preceded by the end-of-text token, its text encoded as ordinary
text), and the parent writes each block, in order, as

    {prefix}_NNNNNN.npy     the block's tokens (uint16 or uint32, gptlab.data.shards.dtype_for)
    {prefix}_NNNNNN.json    {"documents_read", "bytes", "lengths": [tokens per kept document],
                             "empty_skipped", "utf8_replaced"}: running totals; written last,
                             so its presence means the block is complete
    {prefix}_complete.json  {"blocks": N} once the source is read to its end

with prefix "block" for the source and "val_block" for a val source. A rerun
skips the documents of complete blocks (and does not read a complete source
again). At most two blocks per worker are in flight, so memory stays bounded.

Not here: shuffling, splitting and shards (gptlab.data.prepare).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from gptlab.data.shards import dtype_for
from gptlab.data.sources import Source
from gptlab.runtime import atomic_write, atomic_write_text, default_workers, read_json
from gptlab.runtime.processes import worker_pool
from gptlab.tokenizer import Tokenizer

BLOCK_CHARS = 1 << 22  # characters of text per tokenizing task (at most)
MIN_BLOCK_CHARS = 1 << 16
PREFIXES = ("block", "val_block")  # blocks of the source, and of the val source


_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_block(documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of the documents, each preceded by the end-of-text id, and each document's length."""
    tokenizer = _worker_tokenizer
    packed, counts = tokenizer.encode_ordinary_packed(documents)
    ids = np.frombuffer(packed, dtype=np.uint32)
    lengths = np.asarray(counts, dtype=np.int64) + 1
    tokens = np.empty(len(ids) + len(documents), dtype=dtype_for(tokenizer.vocab_size))
    starts = np.cumsum(lengths) - lengths  # where each document's end-of-text id goes
    tokens[starts] = tokenizer.eot_id
    keep = np.ones(len(tokens), dtype=bool)
    keep[starts] = False
    tokens[keep] = ids
    return tokens, lengths


def block_target(total_bytes: int | None, workers: int) -> int:
    """Characters per block: BLOCK_CHARS, or less for small inputs so every worker gets several blocks."""
    if not total_bytes:
        return BLOCK_CHARS
    return min(BLOCK_CHARS, max(MIN_BLOCK_CHARS, total_bytes // (4 * workers)))


def _blocks(source: Source, skip_documents: int, counts: dict, target: int) -> Iterator[tuple[list[str], int, int]]:
    """(documents kept, documents read, text bytes) per block of about `target` characters, after skipping what earlier runs did."""
    kept: list[str] = []
    read = chars = size = 0  # size: UTF-8 bytes, for the progress bar
    for number, document in enumerate(source):
        if number < skip_documents:
            continue
        read += 1
        size += len(document.encode("utf-8"))
        if document.strip():
            kept.append(document)
            chars += len(document)
        else:
            counts["empty_skipped"] += 1
        if chars >= target:
            yield kept, read, size
            kept, read, chars, size = [], 0, 0, 0
    if read:
        yield kept, read, size


def block_paths(work: Path, index: int, prefix: str = "block") -> tuple[Path, Path]:
    return work / f"{prefix}_{index:06d}.npy", work / f"{prefix}_{index:06d}.json"


def _done_blocks(work: Path, prefix: str) -> list[dict]:
    """Metadata of the complete blocks, in order (a block is complete when its .json exists)."""
    done = []
    while True:
        tokens_path, meta_path = block_paths(work, len(done), prefix)
        if not meta_path.is_file() or not tokens_path.is_file():
            return done
        done.append(json.loads(meta_path.read_text()))


def _write_block(
    work: Path, prefix: str, index: int, tokens: np.ndarray, lengths: np.ndarray, read: int, size: int, counts: dict
) -> dict:
    tokens_path, meta_path = block_paths(work, index, prefix)
    with atomic_write(tokens_path, "wb") as handle:
        np.save(handle, tokens)
    meta = {
        "documents_read": read,
        "bytes": size,
        "lengths": lengths.tolist(),
        "empty_skipped": counts["empty_skipped"],
        "utf8_replaced": counts["utf8_replaced"],
    }
    atomic_write_text(meta_path, json.dumps(meta))
    return meta


def tokenize_blocks(
    source: Source, tokenizer: Tokenizer, work: Path, *, prefix: str = "block", workers: int | None = None, progress: bool = True
) -> list[dict]:
    """Pass 1 for one source: its blocks' metadata, after resuming past the blocks a previous run completed."""
    done = _done_blocks(work, prefix)
    complete = work / f"{prefix}_complete.json"
    if complete.is_file() and read_json(complete).get("blocks") == len(done):
        return done  # read to its end by an earlier run: no need to read the source again
    counts = {
        "empty_skipped": done[-1]["empty_skipped"] if done else 0,
        "utf8_replaced": done[-1]["utf8_replaced"] if done else 0,
    }
    source.utf8_replaced = counts["utf8_replaced"]
    skip = sum(meta["documents_read"] for meta in done)
    workers = workers or default_workers()
    total = source.total_bytes()
    description = "tokenize" if prefix == PREFIXES[0] else "tokenize val"
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=description, disable=not progress, smoothing=0.1)
    n_documents = sum(len(meta["lengths"]) for meta in done)
    n_tokens = sum(sum(meta["lengths"]) for meta in done)
    start = time.perf_counter()
    new_tokens = 0

    def record(documents_read: int, size: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
        nonlocal n_documents, n_tokens, new_tokens
        counts["utf8_replaced"] = source.utf8_replaced
        done.append(_write_block(work, prefix, len(done), tokens, lengths, documents_read, size, counts))
        n_documents += len(lengths)
        n_tokens += len(tokens)
        new_tokens += len(tokens)
        rate = new_tokens / max(time.perf_counter() - start, 1e-9)
        bar.set_postfix_str(f"{n_documents:,} docs, {n_tokens:,} tokens, {rate / 1e6:.2f}M tok/s", refresh=False)
        bar.update(size)

    if done and total:
        bar.update(min(total, sum(meta["bytes"] for meta in done)))
    with bar:
        _encode_in_order(_blocks(source, skip, counts, block_target(total, workers)), tokenizer, workers, record)
    atomic_write_text(complete, json.dumps({"blocks": len(done)}))
    return done


def _encode_in_order(blocks: Iterator, tokenizer: Tokenizer, workers: int, record: Callable) -> None:
    """Encode each block (in worker processes unless workers == 1) and record the results in source order."""
    if workers == 1:
        _init_worker(tokenizer)
        for documents, read, size in blocks:
            record(read, size, *_encode_block(documents))
        return
    # Ordered results with at most 2 blocks per worker in flight: memory stays bounded.
    with worker_pool(workers, initializer=_init_worker, initargs=(tokenizer,)) as pool:  # workers ignore Ctrl-C
        pending: deque = deque()
        for documents, read, size in blocks:
            pending.append((pool.apply_async(_encode_block, (documents,)), read, size))
            while len(pending) >= 2 * workers:
                result, read_, size_ = pending.popleft()
                record(read_, size_, *result.get())
        while pending:
            result, read_, size_ = pending.popleft()
            record(read_, size_, *result.get())
