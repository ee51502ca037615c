"""What checking a shard's CRC-32 costs when the loader opens it: gptlab `open_shard(verify=True)` vs reading the file once.

The loader verifies every shard of a split when it is built, so a damaged shard is an error
naming the file instead of wrong tokens mid-training. This measures that check on shards of
--tokens ids (default 100M, the default `--shard-tokens`), uint16 (vocabularies up to 65,536)
and uint32, against the floor of any check: reading the file's bytes once (`readinto` a
reused 32 MiB buffer), and against opening without the check (a memmap, no read).

    .venv/bin/python bench/data_shard_verify.py
    .venv/bin/python bench/data_shard_verify.py --tokens 10M

The shards are written to a temporary folder and read from the page cache (the usual case
when training has just prepared or read them); best of --repeats runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import header  # noqa: E402

from gptlab.data.shards import open_shard, write_shard  # noqa: E402


def best_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def read_once(path: Path, buffer: bytearray) -> None:
    """Every byte of the file, through one reused buffer (no allocation per run): the floor of any check."""
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass


def count(text: str) -> int:
    multiplier = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if multiplier > 1 else text) * multiplier)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=count, default=100_000_000, help="tokens per shard (default 100M)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(header("Shard CRC-32 check on open: gptlab open_shard(verify=True) vs reading the file once", ["gptlab", "numpy"]))
    print(f"# shard of {args.tokens:,} random ids, page cache warm; best of {args.repeats}; ratio = verify / read once")
    with tempfile.TemporaryDirectory(prefix="gptlab-bench-") as scratch:
        for dtype in (np.uint16, np.uint32):
            path = Path(scratch) / f"train_{np.dtype(dtype).name}.bin"
            tokens = np.random.default_rng(0).integers(0, np.iinfo(dtype).max, size=args.tokens, dtype=dtype)
            write_shard(path, tokens, n_documents=1, fingerprint="0" * 16)
            del tokens
            open_shard(path, verify=True)  # warm the page cache
            verify = best_seconds(partial(open_shard, path, verify=True), args.repeats)
            plain = best_seconds(partial(open_shard, path), args.repeats)
            read = best_seconds(partial(read_once, path, bytearray(32 << 20)), args.repeats)
            size = path.stat().st_size
            print(
                f"{np.dtype(dtype).name:>6} {size / 1e6:,.0f} MB  verify {verify:.3f} s ({size / verify / 1e9:.1f} GB/s)  "
                f"read once {read:.3f} s  open without check {plain * 1e3:.2f} ms  ratio {verify / read:.2f}"
            )
            path.unlink()


if __name__ == "__main__":
    main()
