"""`prepare_shards`: documents from a source into shuffled, fixed-size token shards with a manifest.

Two passes, both resumable, with bounded memory:

1. Tokenize. Documents stream from the source in a fixed order and are cut
   into blocks of up to BLOCK_CHARS characters; worker processes encode the
   blocks (each document preceded by the end-of-text token, its text encoded
   as ordinary text), and the parent writes each block, in order, to
   `OUT/.prepare/block_NNNNNN.npy` (tokens) + `.json` (document lengths and
   counts; written last, so its presence means the block is complete). At most
   a few blocks are in flight at once.
2. Shard. A seeded permutation of all documents (identity with shuffle off)
   puts the first documents in the val split (a fraction of documents, or
   enough documents to reach a token count) and the rest in train. Each
   split's token stream is cut into shards of exactly `shard_tokens` tokens
   (the last one shorter; a document may continue into the next shard, as
   in build-nanogpt), gathered from the memory-mapped blocks and written
   atomically as `OUT/{split}_NNNNNN.bin` (format: gptlab.data.shards).

Then `manifest.json` is written (atomically) and `.prepare/` removed. A rerun
with the same arguments after a crash (even kill -9) skips the complete
blocks and shards and finishes the job: the output is a pure function of the
source, the tokenizer and the arguments, so nothing is duplicated or lost.
The permutation needs 24 bytes per document in memory; a shard needs
`shard_tokens` ids; disk holds the blocks and the shards until the end.

Not here: reading sources (gptlab.data.sources), the shard format (gptlab.data.shards),
batching (gptlab.data.loader).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from gptlab.data.shards import MANIFEST_FORMAT, MANIFEST_NAME, VERSION, dtype_for, read_header, write_shard
from gptlab.data.sources import Source, SourceOptions, open_source
from gptlab.runtime import GptlabError, atomic_write, atomic_write_text, default_workers, process_context
from gptlab.tokenizer import Tokenizer

BLOCK_CHARS = 1 << 22  # characters of text per tokenizing task (at most)
MIN_BLOCK_CHARS = 1 << 16
WORK_DIR = ".prepare"
TOKEN_BYTES_NAME = "token_bytes.npy"
JOB_FILE = "job.json"


@dataclass(frozen=True, kw_only=True)
class PrepareConfig:
    """What `gptlab data prepare` does; every field but `workers` and `progress` decides the output."""

    val: float = 0.0  # < 1: fraction of documents; >= 1: a token count (whole documents, at least this many tokens)
    shard_tokens: int = 100_000_000
    seed: int = 1337
    shuffle: bool = True
    workers: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.val < 0:
            raise GptlabError(f"val must be a fraction in [0, 1) or a token count >= 1, got {self.val}")
        if self.val >= 1 and self.val != int(self.val):
            raise GptlabError(f"a val token count must be a whole number, got {self.val}")
        if self.shard_tokens < 1:
            raise GptlabError(f"shard_tokens must be at least 1, got {self.shard_tokens}")

    def identity(self) -> dict:
        return {"val": self.val, "shard_tokens": self.shard_tokens, "seed": self.seed, "shuffle": self.shuffle}


@dataclass
class PrepareResult:
    out: Path
    manifest: dict
    status: str  # "prepared", "resumed" (finished an interrupted run) or "already prepared"
    seconds: float


# ---------------------------------------------------------------- pass 1: tokenize into blocks

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


def _block_paths(work: Path, index: int) -> tuple[Path, Path]:
    return work / f"block_{index:06d}.npy", work / f"block_{index:06d}.json"


def _done_blocks(work: Path) -> list[dict]:
    """Metadata of the complete blocks, in order (a block is complete when its .json exists)."""
    done = []
    while True:
        tokens_path, meta_path = _block_paths(work, len(done))
        if not meta_path.is_file() or not tokens_path.is_file():
            return done
        done.append(json.loads(meta_path.read_text()))


def _write_block(work: Path, index: int, tokens: np.ndarray, lengths: np.ndarray, read: int, size: int, counts: dict) -> dict:
    tokens_path, meta_path = _block_paths(work, index)
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


def tokenize_blocks(source: Source, tokenizer: Tokenizer, work: Path, config: PrepareConfig) -> list[dict]:
    done = _done_blocks(work)
    counts = {
        "empty_skipped": done[-1]["empty_skipped"] if done else 0,
        "utf8_replaced": done[-1]["utf8_replaced"] if done else 0,
    }
    source.utf8_replaced = counts["utf8_replaced"]
    skip = sum(meta["documents_read"] for meta in done)
    workers = config.workers or default_workers()
    total = source.total_bytes()
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenize", disable=not config.progress, smoothing=0.1)
    n_documents = sum(len(meta["lengths"]) for meta in done)
    n_tokens = sum(sum(meta["lengths"]) for meta in done)
    start = time.perf_counter()
    new_tokens = 0

    def record(documents_read: int, size: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
        nonlocal n_documents, n_tokens, new_tokens
        counts["utf8_replaced"] = source.utf8_replaced
        done.append(_write_block(work, len(done), tokens, lengths, documents_read, size, counts))
        n_documents += len(lengths)
        n_tokens += len(tokens)
        new_tokens += len(tokens)
        rate = new_tokens / max(time.perf_counter() - start, 1e-9)
        bar.set_postfix_str(f"{n_documents:,} docs, {n_tokens:,} tokens, {rate / 1e6:.2f}M tok/s", refresh=False)
        bar.update(size)

    if done and total:
        bar.update(min(total, sum(meta["bytes"] for meta in done)))
    blocks = _blocks(source, skip, counts, block_target(total, workers))
    with bar:
        if workers == 1:
            _init_worker(tokenizer)
            for documents, read, size in blocks:
                record(read, size, *_encode_block(documents))
            return done
        # Ordered results with at most 2 blocks per worker in flight: memory stays bounded.
        with process_context().Pool(workers, initializer=_init_worker, initargs=(tokenizer,)) as pool:
            pending: deque = deque()
            for documents, read, size in blocks:
                pending.append((pool.apply_async(_encode_block, (documents,)), read, size))
                while len(pending) >= 2 * workers:
                    result, read_, size_ = pending.popleft()
                    record(read_, size_, *result.get())
            while pending:
                result, read_, size_ = pending.popleft()
                record(read_, size_, *result.get())
    return done


# ---------------------------------------------------------------- pass 2: shuffle, split, shard


def split_documents(lengths: np.ndarray, config: PrepareConfig) -> dict[str, np.ndarray]:
    """Document numbers of each split, in output order: a seeded permutation, val first."""
    n = len(lengths)
    order = np.random.default_rng(config.seed).permutation(n) if config.shuffle else np.arange(n)
    if config.val == 0:
        n_val = 0
    elif config.val < 1:
        n_val = max(1, round(config.val * n))
    else:
        cumulative = np.cumsum(lengths[order])
        n_val = int(np.searchsorted(cumulative, int(config.val))) + 1
    if n_val >= n and config.val:
        raise GptlabError(
            f"--val {config.val:g} takes all {n:,} documents ({int(lengths.sum()):,} tokens), leaving none to train on"
        )
    splits = {"train": order[n_val:]}
    if n_val:
        splits["val"] = order[:n_val]
    return splits


def write_split_shards(
    out: Path, split: str, order: np.ndarray, table: dict, blocks: list[np.ndarray], fingerprint: str, config: PrepareConfig
) -> list[dict]:
    """Cut the split's token stream into shards; skip shards a previous run completed."""
    lengths = table["length"][order]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    dtype = blocks[0].dtype
    entries = []
    n_shards = max(1, -(-total // config.shard_tokens))
    for index in tqdm(range(n_shards), desc=f"{split} shards", disable=not config.progress or n_shards < 2):
        low, high = index * config.shard_tokens, min((index + 1) * config.shard_tokens, total)
        first = int(np.searchsorted(ends, low, side="right"))  # first document ending after `low`
        last = int(np.searchsorted(starts, high, side="left"))  # documents [first, last) overlap the shard
        n_started = int(np.count_nonzero(starts[first:last] >= low))
        path = out / f"{split}_{index:06d}.bin"
        entry = {"file": path.name, "tokens": high - low, "documents": n_started}
        entries.append(entry)
        if path.is_file():
            try:
                header = read_header(path)
                if header.n_tokens == high - low and header.fingerprint == fingerprint and header.n_documents == n_started:
                    continue
            except GptlabError:
                pass  # a damaged leftover: write it again
        shard = np.empty(high - low, dtype=dtype)
        cursor = 0
        for position in range(first, last):
            document = order[position]
            block, offset, length = (int(table[key][document]) for key in ("block", "offset", "length"))
            begin = max(low - int(starts[position]), 0)
            end = min(high - int(starts[position]), length)
            shard[cursor : cursor + end - begin] = blocks[block][offset + begin : offset + end]
            cursor += end - begin
        assert cursor == high - low, (cursor, high - low)
        write_shard(path, shard, n_documents=n_started, fingerprint=fingerprint)
    return entries


# ---------------------------------------------------------------- the job


def write_token_bytes(path: Path, tokenizer: Tokenizer) -> None:
    """UTF-8 bytes each id stands for (0 for special tokens): turns a loss per token into bits per byte."""
    specials = set(tokenizer.special_tokens.values())
    lengths = np.zeros(tokenizer.vocab_size, dtype=np.int32)
    for i, token in tokenizer.vocab.items():
        lengths[i] = 0 if i in specials else len(token)
    with atomic_write(path, "wb") as handle:
        np.save(handle, lengths)


def _check_job(out: Path, work: Path, job: dict, force: bool) -> bool:
    """True if `out` already holds this exact job, finished. Errors on a different job unless forced."""
    manifest_path = out / MANIFEST_NAME
    job_path = work / JOB_FILE
    previous = None
    if manifest_path.is_file():
        previous = json.loads(manifest_path.read_text()).get("job")
    elif job_path.is_file():
        previous = json.loads(job_path.read_text())
    if previous is not None and previous != job:
        if not force:
            what = "prepared data" if manifest_path.is_file() else "an unfinished prepare"
            raise GptlabError(
                f"{out} holds {what} made with other arguments; rerun with the same arguments, "
                "use another --out, or pass --force to replace it"
            )
        _remove_outputs(out)
        return False
    return manifest_path.is_file()


def _remove_outputs(out: Path) -> None:
    """Delete what prepare writes (shards, manifest, work directory), nothing else."""
    for path in [*out.glob("train_*.bin"), *out.glob("val_*.bin"), out / MANIFEST_NAME, out / TOKEN_BYTES_NAME]:
        path.unlink(missing_ok=True)
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)


def prepare_shards(
    source: Source | str | list[str],
    tokenizer: Tokenizer,
    out: str | os.PathLike,
    config: PrepareConfig | None = None,
    *,
    options: SourceOptions | None = None,
    force: bool = False,
) -> PrepareResult:
    """Tokenize a source into `out`: shards, manifest; resumes an interrupted run with the same arguments."""
    config = config or PrepareConfig()
    start = time.perf_counter()
    if not isinstance(source, Source):
        source = open_source(source, options)
    if tokenizer.eot_id is None:
        raise GptlabError("the tokenizer has no end-of-text token (e.g. <|endoftext|>) to separate documents")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GptlabError(f"--out {out} exists and is not a directory")
    work = out / WORK_DIR
    fingerprint = tokenizer.fingerprint()
    job = {"source": source.describe(), "tokenizer": fingerprint, **config.identity()}
    if _check_job(out, work, job, force):
        shutil.rmtree(work, ignore_errors=True)
        manifest = json.loads((out / MANIFEST_NAME).read_text())
        return PrepareResult(out, manifest, "already prepared", time.perf_counter() - start)
    resumed = work.is_dir() and any(work.iterdir())
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_text(work / JOB_FILE, json.dumps(job, indent=1))

    metas = tokenize_blocks(source, tokenizer, work, config)
    lengths_per_block = [np.asarray(meta["lengths"], dtype=np.int64) for meta in metas]
    lengths = np.concatenate(lengths_per_block) if lengths_per_block else np.zeros(0, dtype=np.int64)
    if len(lengths) == 0:
        raise GptlabError(f"the source has no documents with text ({metas[-1]['empty_skipped'] if metas else 0} empty ones skipped)")
    table = {
        "block": np.concatenate([np.full(len(b), i, dtype=np.int32) for i, b in enumerate(lengths_per_block)]),
        "offset": np.concatenate([np.cumsum(b) - b for b in lengths_per_block]),
        "length": lengths,
    }
    blocks = [np.load(_block_paths(work, i)[0], mmap_mode="r") for i in range(len(metas))]
    splits = {}
    for split, order in split_documents(lengths, config).items():
        entries = write_split_shards(out, split, order, table, blocks, fingerprint, config)
        splits[split] = {
            "tokens": sum(entry["tokens"] for entry in entries),
            "documents": len(order),
            "shards": entries,
        }
    write_token_bytes(out / TOKEN_BYTES_NAME, tokenizer)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": VERSION,
        "source": source.describe(),
        "tokenizer": {"fingerprint": fingerprint, "vocab_size": tokenizer.vocab_size, "eot_id": tokenizer.eot_id},
        "dtype": str(np.dtype(dtype_for(tokenizer.vocab_size)).name),
        **config.identity(),
        "documents": {
            "read": sum(meta["documents_read"] for meta in metas),
            "kept": int(len(lengths)),
            "empty_skipped": metas[-1]["empty_skipped"],
            "utf8_replaced": metas[-1]["utf8_replaced"],
        },
        "splits": splits,
        "token_bytes": TOKEN_BYTES_NAME,
        "job": job,
    }
    atomic_write_text(out / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
    del blocks
    shutil.rmtree(work, ignore_errors=True)
    return PrepareResult(out, manifest, "resumed" if resumed else "prepared", time.perf_counter() - start)
