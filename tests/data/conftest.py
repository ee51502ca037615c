"""Shared by the data tests: a small tokenizer with an end-of-text token, synthetic documents, and reading shards back."""

import json

import numpy as np
import pytest

from gptlab.data.shards import open_shard, split_shards
from gptlab.tokenizer import Tokenizer

QUIET = {"progress": False}


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé 世界 🎉\n" * 50
    tok = Tokenizer.train([text], vocab_size=300, special_tokens=["<|endoftext|>"])
    tok.save(tmp_path_factory.mktemp("tok"))
    return tok


def make_documents(n=40, seed=0):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "Ünïcödé", "世界", "🎉", "<|endoftext|>", "\n", "  "]
    return [f"doc {i}: " + " ".join(rng.choice(words, size=int(rng.integers(5, 200)))) for i in range(n)]


def documents_as_jsonl(tmp_path, documents, name="docs.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(documents)), encoding="utf-8")
    return str(path)


def decode_split(directory, split, tokenizer):
    """The split's documents, decoded from its shards by cutting the stream at end-of-text ids."""
    stream = np.concatenate([np.asarray(open_shard(path, verify=True)[1]) for path, _ in split_shards(directory, split)])
    eot = tokenizer.eot_id
    assert stream[0] == eot  # every document is preceded by the separator
    cuts = np.flatnonzero(stream == eot)
    return [tokenizer.decode(stream[a + 1 : b].tolist()) for a, b in zip(cuts, [*cuts[1:], len(stream)])]


def folder_bytes(directory):
    """Every file under `directory` (relative path -> bytes): a folder's exact state, to compare before and after."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}
