"""Checkpoints: everything a run needs to continue exactly, in versioned files, written atomically.

    OUT/checkpoints/step_000500/
        config.json          model config (gptlab.model.io)
        model.safetensors    weights of the plain model (never compile/DDP wrapper keys)
        optimizer.pt         optimizer state: tensors and numbers only, loaded with weights_only=True
        rng.pt               RNG states (tensors), weights_only=True as well
        trainer_state.json   format_version, step, tokens seen, loader states (one per rank),
                             best val loss, the training config, the data directory and tokenizer fingerprint

A checkpoint is written into `.step_000500.tmp/` and renamed into place, so a
crash mid-write (kill -9 included) leaves the previous checkpoints intact and
no half checkpoint under a real name. `latest` is simply the highest step.
Kept: the last `keep_last` checkpoints plus the best by val loss (`best.json` names it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from gptlab.model.io import load_state, save_model
from gptlab.runtime import GptlabError, atomic_write_text

FORMAT_VERSION = 1
PREFIX = "step_"


def checkpoint_dir(out: str | os.PathLike) -> Path:
    return Path(out) / "checkpoints"


def list_checkpoints(out: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def save_checkpoint(out, step: int, model, optimizer, trainer_state: dict, rng: dict, keep_last: int, val_loss: float | None) -> Path:
    root = checkpoint_dir(out)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng, tmp / "rng.pt")
    atomic_write_text(tmp / "trainer_state.json", json.dumps({"format_version": FORMAT_VERSION, **trainer_state}, indent=1))
    for path in tmp.iterdir():  # make the contents durable before the rename publishes them
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _update_best(root, final, val_loss)
    _prune(out, keep_last)
    return final


def _update_best(root: Path, path: Path, val_loss: float | None) -> None:
    best_file = root / "best.json"
    best = json.loads(best_file.read_text()) if best_file.is_file() else None
    if val_loss is not None and (best is None or val_loss < best["val_loss"] or not (root / best["checkpoint"]).is_dir()):
        atomic_write_text(best_file, json.dumps({"checkpoint": path.name, "val_loss": val_loss}))


def _prune(out, keep_last: int) -> None:
    root = checkpoint_dir(out)
    best_file = root / "best.json"
    best = json.loads(best_file.read_text())["checkpoint"] if best_file.is_file() else None
    for path in list_checkpoints(out)[:-keep_last]:
        if path.name != best:
            shutil.rmtree(path)


def load_checkpoint(path: str | os.PathLike, model, optimizer, device) -> tuple[dict, dict]:
    """Restore model and optimizer in place; return (trainer_state, rng)."""
    from safetensors.torch import load_file

    path = Path(path)
    state_path = path / "trainer_state.json"
    if not state_path.is_file():
        raise GptlabError(f"no checkpoint at {path} (no trainer_state.json)")
    trainer_state = json.loads(state_path.read_text())
    if trainer_state.get("format_version") != FORMAT_VERSION:
        raise GptlabError(f"{path} is checkpoint format {trainer_state.get('format_version')}; this gptlab reads {FORMAT_VERSION}")
    load_state(model, load_file(path / "model.safetensors", device=str(device)), str(path / "model.safetensors"))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
    return trainer_state, rng
