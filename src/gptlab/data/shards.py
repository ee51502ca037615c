"""Token shards: a 64-byte header, then raw token ids (little-endian uint16 or uint32).

    offset  size  field
         0     8  magic b"GPTLABTK"
         8     4  format version (uint32) = 1
        12     4  bytes per token (uint32): 2 (uint16) or 4 (uint32)
        16     8  number of tokens (uint64)
        24     8  number of documents that start in this shard (uint64)
        32    16  tokenizer fingerprint (16 ASCII hex characters)
        48     4  CRC-32 of the token bytes (uint32)
        52    12  zero
        64     -  the tokens

A shard whose size does not match its header is truncated; a wrong magic,
version or checksum means it is not a shard or is damaged. Ids are read
through a numpy memmap, so a shard is never loaded whole; checking the CRC
reads it once (under 0.1 s for 100M uint16 tokens from the page cache, bench/data_shard_verify.py).
The errors for a damaged shard say how to repair it: the prepare command that
made it, rerun, rewrites damaged and missing shards.

Not here: tokenizing (gptlab.data.prepare), batching (gptlab.data.loader).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptlab.runtime import GptlabError, atomic_write, read_json

MAGIC = b"GPTLABTK"
VERSION = 1
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIQQ16sI12x")
CRC_BLOCK = 1 << 24  # tokens per CRC update, so checking a shard reads it in bounded memory
REPAIR = "to repair, rerun the `gptlab data prepare` command that made it (same arguments): it rewrites damaged and missing shards"


@dataclass(frozen=True)
class ShardHeader:
    itemsize: int
    n_tokens: int
    n_documents: int
    fingerprint: str
    crc32: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u2" if self.itemsize == 2 else "<u4")


def dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")


def crc32_of(tokens: np.ndarray) -> int:
    crc = 0
    for start in range(0, len(tokens), CRC_BLOCK):
        crc = zlib.crc32(np.ascontiguousarray(tokens[start : start + CRC_BLOCK]).view(np.uint8), crc)
    return crc


def write_shard(path: str | os.PathLike, tokens: np.ndarray, *, n_documents: int, fingerprint: str) -> Path:
    """Write a shard atomically: a temporary name beside `path`, then a rename."""
    path = Path(path)
    if tokens.dtype not in (np.dtype("<u2"), np.dtype("<u4")):
        raise GptlabError(f"shard tokens must be uint16 or uint32, not {tokens.dtype}")
    fingerprint_bytes = fingerprint.encode("ascii")
    if len(fingerprint_bytes) != 16:
        raise GptlabError(f"tokenizer fingerprint must be 16 characters, got {fingerprint!r}")
    header = _HEADER.pack(MAGIC, VERSION, tokens.dtype.itemsize, len(tokens), n_documents, fingerprint_bytes, crc32_of(tokens))
    with atomic_write(path, "wb") as handle:
        handle.write(header)
        handle.write(memoryview(np.ascontiguousarray(tokens)).cast("B"))  # no copy of the shard
    return path


def read_header(path: str | os.PathLike) -> ShardHeader:
    """Parse and check a shard's header against the file's size (a truncated shard fails here)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(HEADER_BYTES)
        size = path.stat().st_size
    except FileNotFoundError:
        raise GptlabError(f"shard not found: {path}; {REPAIR}") from None
    if len(raw) < HEADER_BYTES:
        raise GptlabError(f"{path} is not a gptlab shard: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header; {REPAIR}")
    magic, version, itemsize, n_tokens, n_documents, fingerprint, crc = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise GptlabError(f"{path} is not a gptlab shard (magic {magic!r}, expected {MAGIC!r}); {REPAIR}")
    if version != VERSION:
        raise GptlabError(f"{path} is shard format version {version}; this gptlab reads version {VERSION}")
    if itemsize not in (2, 4):
        raise GptlabError(f"{path} has a corrupt header: {itemsize} bytes per token; {REPAIR}")
    expected = HEADER_BYTES + n_tokens * itemsize
    if size != expected:
        raise GptlabError(
            f"{path} is truncated or corrupt: header says {n_tokens:,} tokens ({expected:,} bytes), "
            f"file has {size:,} bytes; {REPAIR}"
        )
    return ShardHeader(itemsize, n_tokens, n_documents, fingerprint.decode("ascii", errors="replace"), crc)


def open_shard(path: str | os.PathLike, *, verify: bool = False) -> tuple[ShardHeader, np.ndarray]:
    """The header and a read-only memmap of the tokens; `verify` also checks the CRC (reads the shard once)."""
    header = read_header(path)
    if header.n_tokens == 0:
        return header, np.zeros(0, dtype=header.dtype)
    tokens = np.memmap(path, dtype=header.dtype, mode="r", offset=HEADER_BYTES, shape=(header.n_tokens,))
    if verify and crc32_of(tokens) != header.crc32:
        raise GptlabError(f"{path} is damaged: its tokens do not match the CRC-32 in its header; {REPAIR}")
    return header, tokens


def shard_problem(path: str | os.PathLike, *, n_tokens: int, n_documents: int, fingerprint: str, crc32: int | None = None) -> str | None:
    """Why `path` is not the expected shard ("is missing", "is damaged", other counts), or None if it is; reads it once."""
    path = Path(path)
    if not path.is_file():
        return "is missing"
    try:
        header, _ = open_shard(path, verify=True)
    except GptlabError:
        return "is damaged"
    if header.fingerprint != fingerprint:
        return f"was made with tokenizer {header.fingerprint}, not {fingerprint}"
    if (header.n_tokens, header.n_documents) != (n_tokens, n_documents):
        return f"holds {header.n_tokens:,} tokens of {header.n_documents:,} documents, not {n_tokens:,} of {n_documents:,}"
    if crc32 is not None and header.crc32 != crc32:
        return "holds other tokens"
    return None


# ---------------------------------------------------------------- the manifest of a prepared directory

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "gptlab-shards"

# manifest.json, written last (atomically) by `gptlab data prepare`:
# {"format": "gptlab-shards", "version": 1,
#  "source": {...}, "tokenizer": {"fingerprint": "...", "vocab_size": 4096, "eot_id": 4095},
#  "dtype": "uint16", "shard_tokens": 100000000, "seed": 1337, "shuffle": true, "val": {"fraction": 0.01},
#  "documents": {"read": 42, "kept": 42, "empty_skipped": 0, "utf8_replaced": 0},
#  "token_bytes": "token_bytes.npy",   (int32 per id: UTF-8 bytes it decodes to, 0 for special tokens)
#  "splits": {"train": {"tokens": N, "documents": D, "shards": [{"file": "train_000000.bin", "tokens": n, "documents": d}]},
#             "val": {...}}}


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of a prepared directory, checked for format and version."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise GptlabError(f"no prepared data at {directory} (no {MANIFEST_NAME}; make it with `gptlab data prepare`)")
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise GptlabError(f"{path} is not a gptlab shard manifest")
    if manifest.get("version") != VERSION:
        raise GptlabError(f"{path} is manifest version {manifest.get('version')}; this gptlab reads version {VERSION}")
    return manifest


def split_shards(directory: str | os.PathLike, split: str) -> list[tuple[Path, int]]:
    """(path, token count) of each shard of `split`, in order; a clear error if the split is empty or missing."""
    manifest = read_manifest(directory)
    splits = manifest.get("splits", {})
    if split not in splits:
        raise GptlabError(f"{directory} has no {split!r} split (it has: {', '.join(splits) or 'none'})")
    shards = [(Path(directory) / entry["file"], int(entry["tokens"])) for entry in splits[split]["shards"]]
    if sum(tokens for _, tokens in shards) == 0:
        raise GptlabError(f"the {split!r} split of {directory} is empty")
    return shards
