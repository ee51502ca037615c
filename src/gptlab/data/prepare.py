"""`prepare_shards`: documents from a source into shuffled, fixed-size token shards with a manifest.

Two passes, both resumable, with bounded memory:

1. Tokenize (gptlab.data.blocks). Worker processes encode the source's
   documents, each preceded by the end-of-text token, into blocks of tokens
   with their document lengths, in `OUT/.prepare/` (a val source too).
2. Shard. A seeded permutation of all documents (identity with shuffle off)
   puts the first documents in the val split (a fraction of documents, by
   default 1% and at least one, or enough documents to reach a token count)
   and the rest in train. With a val source, its documents are the val split
   and the source's the train split, each permuted (same seed). Each split's
   token stream is cut into shards of exactly `shard_tokens` tokens (the last
   one shorter; a document may continue into the next shard, as in
   build-nanogpt), gathered from the memory-mapped blocks and written
   atomically as `OUT/{split}_NNNNNN.bin` (format: gptlab.data.shards). A
   shard already on disk is kept when its header and CRC-32 say it holds
   exactly those tokens.

Then `token_bytes.npy` and `manifest.json` are written (atomically) and
`.prepare/` removed. The output is a pure function of the source, the
tokenizer and the arguments, so a rerun with the same arguments after a crash
(even kill -9) finishes the job, skipping the complete blocks and shards, and
a rerun on a finished folder checks every shard and, if one is missing or
damaged, tokenizes the source again and rewrites only those. A source of a
single document gets no val split from a fraction (the manifest's
"val_skipped" says so). The permutation needs 24 bytes per document in
memory; a shard needs `shard_tokens` ids; disk holds the blocks and the
shards until the end.

Not here: reading sources (gptlab.data.sources), the shard format (gptlab.data.shards),
what --out may hold and undoing a rejected run (gptlab.data.workspace), batching (gptlab.data.loader).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from gptlab.data.blocks import PREFIXES, block_paths, tokenize_blocks
from gptlab.data.shards import MANIFEST_FORMAT, MANIFEST_NAME, VERSION, crc32_of, dtype_for, shard_problem, write_shard
from gptlab.data.sources import Source, SourceOptions, open_source
from gptlab.data.workspace import (
    JOB_FILE,
    OUTPUT_PATTERNS,
    TOKEN_BYTES_NAME,
    WORK_DIR,
    JobState,
    damaged_shards,
    job_state,
    remove_leftovers,
    remove_outputs,
    undo_when_rejected,
)
from gptlab.runtime import GptlabError, atomic_write_bytes, atomic_write_text, check_out_dir
from gptlab.tokenizer import Tokenizer

DEFAULT_VAL = 0.01  # 1% of the documents (at least one); build-nanogpt holds out 1 of its ~100 FineWeb-Edu shards


@dataclass(frozen=True, kw_only=True)
class PrepareConfig:
    """What `gptlab data prepare` does; every field but `workers` and `progress` decides the output."""

    # < 1: fraction of documents; >= 1: a token count (whole documents, at least this many tokens); 0: no val split.
    # None (the CLI's default too): DEFAULT_VAL, or 0 when a val source gives the val split.
    val: float | None = None
    shard_tokens: int = 100_000_000
    seed: int = 1337
    shuffle: bool = True
    workers: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.val is not None and self.val < 0:
            raise GptlabError(f"val must be a fraction in [0, 1) or a token count >= 1, got {self.val}")
        if self.val is not None and self.val >= 1 and self.val != int(self.val):
            raise GptlabError(f"a val token count must be a whole number, got {self.val}")
        if self.shard_tokens < 1:
            raise GptlabError(f"shard_tokens must be at least 1, got {self.shard_tokens}")
        if self.workers is not None and self.workers < 1:
            raise GptlabError(f"--workers {self.workers}: give at least 1 process (or leave it out for one per core)")

    def resolved(self, *, val_source: bool) -> PrepareConfig:
        """This config with `val` decided; a val share and a val source cannot both choose the val split."""
        if val_source:
            if self.val:
                raise GptlabError(f"--val-from gives the val split, so --val must be 0 or unset, not {self.val:g}")
            return replace(self, val=0.0)
        return self if self.val is not None else replace(self, val=DEFAULT_VAL)

    def identity(self) -> dict:
        return {"val": self.val, "shard_tokens": self.shard_tokens, "seed": self.seed, "shuffle": self.shuffle}


@dataclass
class PrepareResult:
    out: Path
    manifest: dict
    # "prepared", "resumed" (finished an interrupted run), "repaired" (rewrote what was missing or damaged)
    # or "already prepared" (every shard checked)
    status: str
    seconds: float
    rewritten: list[str] = field(default_factory=list)  # "repaired": what was wrong, e.g. "train_000001.bin is damaged"


# ---------------------------------------------------------------- pass 2: shuffle, split, shard


def split_documents(lengths: np.ndarray, config: PrepareConfig, n_val_source: int = 0) -> tuple[dict[str, np.ndarray], str | None]:
    """Document numbers of each split, in output order, and why there is no val split when a fraction gave none.

    Without a val source, a seeded permutation with val first; with one, the last `n_val_source` documents
    (the val source's) are val, and each split is permuted by the same generator.
    """
    n = len(lengths)
    generator = np.random.default_rng(config.seed)

    def order(count: int) -> np.ndarray:
        return generator.permutation(count) if config.shuffle else np.arange(count)

    if n_val_source:
        train = order(n - n_val_source)
        return {"train": train, "val": n - n_val_source + order(n_val_source)}, None
    permutation = order(n)
    if config.val == 0:
        return {"train": permutation}, None
    if config.val < 1 and n == 1:
        return {"train": permutation}, "the source has a single document, which train needs"
    if config.val < 1:
        n_val = max(1, round(config.val * n))
    else:
        n_val = int(np.searchsorted(np.cumsum(lengths[permutation]), int(config.val))) + 1
    if n_val >= n:
        raise GptlabError(
            f"--val {config.val:g} takes all {n:,} documents ({int(lengths.sum()):,} tokens), leaving none to train on; "
            "lower --val"
        )
    return {"train": permutation[n_val:], "val": permutation[:n_val]}, None


def write_split_shards(
    out: Path, split: str, order: np.ndarray, table: dict, blocks: list[np.ndarray], fingerprint: str, config: PrepareConfig
) -> list[dict]:
    """Cut the split's token stream into shards; keep a shard on disk that holds exactly the same tokens."""
    lengths = table["length"][order]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    entries = []
    n_shards = max(1, -(-total // config.shard_tokens))
    for index in tqdm(range(n_shards), desc=f"{split} shards", disable=not config.progress or n_shards < 2):
        low, high = index * config.shard_tokens, min((index + 1) * config.shard_tokens, total)
        first = int(np.searchsorted(ends, low, side="right"))  # first document ending after `low`
        last = int(np.searchsorted(starts, high, side="left"))  # documents [first, last) overlap the shard
        n_started = int(np.count_nonzero(starts[first:last] >= low))
        path = out / f"{split}_{index:06d}.bin"
        entries.append({"file": path.name, "tokens": high - low, "documents": n_started})
        shard = _gather(range(first, last), order, starts, table, blocks, low, high)
        expected = {"n_tokens": high - low, "n_documents": n_started, "fingerprint": fingerprint}
        if path.exists() and shard_problem(path, **expected, crc32=crc32_of(shard)) is None:
            continue
        write_shard(path, shard, n_documents=n_started, fingerprint=fingerprint)
    return entries


def _gather(positions: range, order: np.ndarray, starts: np.ndarray, table: dict, blocks: list[np.ndarray], low: int, high: int) -> np.ndarray:
    """Tokens [low, high) of a split's stream: the parts of the documents at `positions` of `order` that fall there."""
    shard = np.empty(high - low, dtype=blocks[0].dtype)
    cursor = 0
    for position in positions:
        document = order[position]
        block, offset, length = (int(table[key][document]) for key in ("block", "offset", "length"))
        begin = max(low - int(starts[position]), 0)
        end = min(high - int(starts[position]), length)
        shard[cursor : cursor + end - begin] = blocks[block][offset + begin : offset + end]
        cursor += end - begin
    assert cursor == high - low, (cursor, high - low)
    return shard


# ---------------------------------------------------------------- the job


def token_bytes_file(tokenizer: Tokenizer) -> bytes:
    """token_bytes.npy: UTF-8 bytes each id stands for (0 for special tokens); turns a loss per token into bits per byte."""
    specials = set(tokenizer.special_tokens.values())
    lengths = np.zeros(tokenizer.vocab_size, dtype=np.int32)
    for i, token in tokenizer.vocab.items():
        lengths[i] = 0 if i in specials else len(token)
    buffer = io.BytesIO()
    np.save(buffer, lengths)
    return buffer.getvalue()


def _write_tokenizer_files(out: Path, tokenizer: Tokenizer, token_bytes: bytes) -> list[str]:
    """token_bytes.npy and the tokenizer itself (so training and evaluation find it beside the data); what was rewritten."""
    files = {TOKEN_BYTES_NAME: token_bytes, tokenizer.FILE_NAME: tokenizer.file_bytes()}
    return [f"{name} was missing or damaged" for name, data in files.items() if _write_if_changed(out / name, data)]


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Write `data` atomically unless the file already holds it (a finished file is rewritten only when damaged)."""
    if path.is_file() and path.read_bytes() == data:
        return False
    atomic_write_bytes(path, data)
    return True


def prepare_shards(
    source: Source | str | list[str],
    tokenizer: Tokenizer,
    out: str | os.PathLike,
    config: PrepareConfig | None = None,
    *,
    options: SourceOptions | None = None,
    force: bool = False,
    val_source: Source | str | list[str] | None = None,
) -> PrepareResult:
    """Tokenize a source into `out`: shards and manifest.

    Resumes an interrupted run with the same arguments, checks a finished folder and rewrites what is missing
    or damaged, and leaves nothing behind when the input is rejected. `val_source` (the same kinds as `source`,
    read with the same options): its documents are the val split, and the source's the train split.
    """
    start = time.perf_counter()
    sources = [each if isinstance(each, Source) else open_source(each, options) for each in (source, val_source) if each is not None]
    config = (config or PrepareConfig()).resolved(val_source=val_source is not None)
    if tokenizer.eot_id is None:
        raise GptlabError("the tokenizer has no end-of-text token (e.g. <|endoftext|>) to separate documents")
    out = Path(out)
    check_out_dir(out, OUTPUT_PATTERNS, flag="--out")
    job = {"source": sources[0].describe(), "tokenizer": tokenizer.fingerprint(), **config.identity()}
    if len(sources) > 1:
        job["val_source"] = sources[1].describe()
    state = job_state(out, job, force)
    token_bytes = token_bytes_file(tokenizer)
    damaged: list[str] = []
    if state.status == "finished":
        damaged = damaged_shards(out, state.manifest)
        if not damaged:
            rewritten = _write_tokenizer_files(out, tokenizer, token_bytes)
            remove_leftovers(out)
            status = "repaired" if rewritten else "already prepared"
            return PrepareResult(out, state.manifest, status, time.perf_counter() - start, rewritten)
    for each in sources:
        each.check()  # bad input fails here, before anything is made or tokenized
    _refuse_overlap(sources)
    if state.remove_work:
        shutil.rmtree(out / WORK_DIR)
    with undo_when_rejected(out):
        manifest = _run(sources, tokenizer, out, config, job, state, token_bytes)
    remove_leftovers(out)
    status = {"finished": "repaired", "resume": "resumed", "new": "prepared"}[state.status]
    return PrepareResult(out, manifest, status, time.perf_counter() - start, damaged)


def _refuse_overlap(sources: list[Source]) -> None:
    """A file in both splits would have the model scored on text it trained on."""
    files = [each.local_files() for each in sources]
    if len(files) < 2 or files[0] is None or files[1] is None:
        return
    shared = sorted({path.resolve() for path in files[0]} & {path.resolve() for path in files[1]})
    if shared:
        raise GptlabError(
            f"{len(shared)} file(s) are in both the source and --val-from (first: {shared[0]}); "
            "the val split must be held out of train: remove them from one of the two"
        )


def _run(sources: list[Source], tokenizer: Tokenizer, out: Path, config: PrepareConfig, job: dict, state: JobState, token_bytes: bytes) -> dict:
    """Both passes and the manifest: `out` holds the finished job when it returns."""
    work = out / WORK_DIR
    work.mkdir(parents=True, exist_ok=True)
    if not (work / JOB_FILE).is_file():
        atomic_write_text(work / JOB_FILE, json.dumps(job, indent=1))
    metas = [
        tokenize_blocks(each, tokenizer, work, prefix=prefix, workers=config.workers, progress=config.progress)
        for each, prefix in zip(sources, PREFIXES)
    ]
    kept = [sum(len(meta["lengths"]) for meta in each) for each in metas]
    for each, named, n_kept in zip(metas, ("the source", "the val source (--val-from)"), kept):
        if n_kept == 0:
            empty = each[-1]["empty_skipped"] if each else 0
            raise GptlabError(f"{named} has no documents with text ({empty} empty ones skipped)")
    table, blocks = _document_table(work, metas)
    splits, val_skipped = split_documents(table["length"], config, kept[1] if len(kept) > 1 else 0)
    if state.replaces:
        remove_outputs(out, keep_work=True)  # another job's data, replaced now that this job's input has been read
    fingerprint = tokenizer.fingerprint()
    manifest_splits = {}
    for split, order in splits.items():
        entries = write_split_shards(out, split, order, table, blocks, fingerprint, config)
        manifest_splits[split] = {"tokens": sum(entry["tokens"] for entry in entries), "documents": len(order), "shards": entries}
    _write_tokenizer_files(out, tokenizer, token_bytes)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": VERSION,
        "source": job["source"],
        **({"val_source": job["val_source"]} if "val_source" in job else {}),
        "tokenizer": {"fingerprint": fingerprint, "vocab_size": tokenizer.vocab_size, "eot_id": tokenizer.eot_id, "file": tokenizer.FILE_NAME},
        "dtype": str(np.dtype(dtype_for(tokenizer.vocab_size)).name),
        **config.identity(),
        "documents": _document_counts(metas, len(table["length"])),
        "splits": manifest_splits,
        **({"val_skipped": val_skipped} if val_skipped else {}),
        "token_bytes": TOKEN_BYTES_NAME,
        "job": job,
    }
    _write_if_changed(out / MANIFEST_NAME, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def _document_table(work: Path, metas: list[list[dict]]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Per document (the source's, then the val source's): its block, offset in the block and length; the blocks, mapped."""
    per_block = [np.asarray(meta["lengths"], dtype=np.int64) for each in metas for meta in each]
    paths = [block_paths(work, index, prefix)[0] for each, prefix in zip(metas, PREFIXES) for index in range(len(each))]
    table = {
        "block": np.concatenate([np.full(len(lengths), i, dtype=np.int32) for i, lengths in enumerate(per_block)]),
        "offset": np.concatenate([np.cumsum(lengths) - lengths for lengths in per_block]),
        "length": np.concatenate(per_block),
    }
    return table, [np.load(path, mmap_mode="r") for path in paths]


def _document_counts(metas: list[list[dict]], kept: int) -> dict:
    """Documents read, kept, skipped as empty, repaired as not UTF-8, over both sources (the last block holds the totals)."""
    return {
        "read": sum(meta["documents_read"] for each in metas for meta in each),
        "kept": kept,
        "empty_skipped": sum(each[-1]["empty_skipped"] for each in metas if each),
        "utf8_replaced": sum(each[-1]["utf8_replaced"] for each in metas if each),
    }
