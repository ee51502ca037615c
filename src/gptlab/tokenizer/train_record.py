"""What `gptlab tokenizer train` trained a folder's tokenizer from, so that rerunning it is allowed.

`training.json` beside the tokenizer file:

    {"format": "gptlab-tokenizer-train", "version": 1, "file": "tokenizer.json",
     "inputs": [{"path": "corpus/a.txt", "bytes": 120, "sha256": "..."}, ...], "settings": {...}, "fingerprint": SHA-256 of tokenizer.json}

A rerun with the same inputs (by content) and settings into that folder keeps the tokenizer (training is
deterministic: it would write the same bytes); other inputs or settings, or a tokenizer file this command did
not record, are refused with one line naming what is there and `--force`. Not here: training (gptlab.tokenizer).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.config import config_changes

RECORD_FILE = "training.json"
FORMAT = "gptlab-tokenizer-train"
VERSION = 1


def training_record(file_name: str, files: Sequence[Path], settings: dict) -> dict:
    """The record of a training run: each input file's path, size and SHA-256, and the settings."""
    inputs = [{"path": str(path), "bytes": path.stat().st_size, "sha256": file_digest(path)} for path in files]
    return {"format": FORMAT, "version": VERSION, "file": file_name, "inputs": inputs, "settings": settings}


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _read(out: Path) -> dict | None:
    try:
        record = json.loads((out / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def _differences(old: dict, new: dict) -> str:
    """"inputs: 2 -> 3 files" or "settings: vocab_size 300 -> 400": what a rerun changes."""
    changes = config_changes(old.get("settings", {}), new["settings"])
    if [entry["sha256"] for entry in old.get("inputs", [])] != [entry["sha256"] for entry in new["inputs"]]:
        changes.insert(0, f"inputs: {len(old.get('inputs', []))} -> {len(new['inputs'])} files, other contents")
    return ", ".join(changes) or "the tokenizer file was changed since"


def reuse_or_refuse(out: Path, record: dict, force: bool) -> bool:
    """True when `out` already holds the tokenizer this record describes (nothing to train); False when there is
    none yet or `force` replaces it; else one GptlabError saying what is there and what to pass."""
    path = out / record["file"]
    if not path.exists() or force:
        return False
    earlier = _read(out)
    if earlier is None:
        raise GptlabError(f"{path} already exists and was not trained by this command (no {RECORD_FILE} beside it); "
                          "pass --force to replace it, or another --out")
    fingerprint = file_digest(path)
    same = {key: value for key, value in earlier.items() if key != "fingerprint"} == record
    if same and earlier.get("fingerprint") == fingerprint:
        return True
    differs = _differences(earlier, record) if earlier.get("fingerprint") == fingerprint else "the tokenizer file was changed since"
    raise GptlabError(f"{out} holds a tokenizer trained with other inputs or settings ({differs}); "
                      "pass --force to replace it, or another --out")


def save_record(out: Path, record: dict) -> None:
    """Written after the tokenizer file (its SHA-256 is the fingerprint): a record always describes a finished tokenizer."""
    atomic_write_text(out / RECORD_FILE, json.dumps({**record, "fingerprint": file_digest(out / record["file"])}, indent=1) + "\n")
