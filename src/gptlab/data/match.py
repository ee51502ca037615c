"""Does a tokenizer belong with prepared data? Checked before any compute is spent.

A prepared folder's manifest records the fingerprint of the tokenizer that
made its shards (gptlab.tokenizer.Tokenizer.fingerprint: a hash of everything
that decides the ids). Training, evaluation and fine-tuning compare it with the
tokenizer they were given and refuse a mismatch, naming both.
Not here: the manifest format (gptlab.data.shards).
"""

from __future__ import annotations

import os
from pathlib import Path

from gptlab.data.shards import read_manifest
from gptlab.data.workspace import TOKENIZER_NAMES
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer.pretrained import load_any


def data_fingerprint(data: str | os.PathLike) -> str:
    return str(read_manifest(data).get("tokenizer", {}).get("fingerprint"))


def check_tokenizer(data: str | os.PathLike, tokenizer: Tokenizer, name: str) -> Tokenizer:
    """`tokenizer` (called `name` in messages) if the data at `data` was prepared with it; else one clear error."""
    expected = data_fingerprint(data)
    if tokenizer.fingerprint() != expected:
        raise GptlabError(
            f"{data} was prepared with another tokenizer (fingerprint {expected}) than {name} "
            f"(fingerprint {tokenizer.fingerprint()}, {tokenizer.vocab_size:,} ids): use data prepared with that "
            f"tokenizer (`gptlab data prepare SOURCE -t TOKENIZER`), or the tokenizer the data was prepared with"
        )
    return tokenizer


def load_matching_tokenizer(data: str | os.PathLike, spec: str) -> Tokenizer:
    """Load the tokenizer `spec` names (a folder, or gpt2 / cl100k_base) and check it against the data."""
    return check_tokenizer(data, load_any(spec), spec)


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer a user names: a gptlab or Hugging Face folder or file, or a name (gpt2, cl100k_base)."""
    return load_any(spec)


def find_model_tokenizer(folder: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer saved with a model: `FOLDER/tokenizer/` (gptlab checkpoints and runs) or tokenizer files in
    FOLDER itself (Hugging Face folders); None when there is none."""
    folder = Path(folder)
    for candidate in (folder / "tokenizer", folder):
        if any((candidate / name).is_file() for name in (*TOKENIZER_NAMES, "vocab.json")):
            return load_any(str(candidate))
    return None


def data_tokenizer(data: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer `gptlab data prepare` saved beside the shards (DATA/tokenizer.json or tokenizer.model), checked;
    None in older folders."""
    found = [name for name in TOKENIZER_NAMES if (Path(data) / name).is_file()]
    if not found:
        return None
    return check_tokenizer(data, load_any(str(data)), f"{data}/{found[0]}")
