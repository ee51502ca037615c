"""A training run's checkpoints, found by the name a user gives: the layout every stage reads, below all of them.

    OUT/checkpoints/step_000500/    one checkpoint (gptlab.train.checkpoint writes it)
    OUT/checkpoints/best.json       {"checkpoint": "step_000400", "step": 400, "val_loss": 3.1}
    RUN/train/checkpoints/          the same inside a `gptlab run` folder

Reading only: saving, pruning and resuming are gptlab.train.checkpoint's.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptlab.runtime import GptlabError, read_json

PREFIX = "step_"


def checkpoint_dir(out: str | os.PathLike) -> Path:
    return Path(out) / "checkpoints"


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX):])


def list_checkpoints(out: str | os.PathLike) -> list[Path]:
    """Checkpoint folders under a run's folder (complete or not), oldest first."""
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=step_of)


def find_checkpoint(spec: str | os.PathLike) -> Path | None:
    """The checkpoint a path names: a run's folder (its newest), `RUN/best`, `RUN/latest`; None if it is no run folder.

    A run folder is a training folder (it has checkpoints/) or a `gptlab run` folder (it has train/checkpoints/).
    """
    path = Path(spec).expanduser()
    which = None
    if not path.exists() and path.name in ("best", "latest"):
        path, which = path.parent, path.name
    for run in (path, path / "train"):
        if checkpoint_dir(run).is_dir():
            return _pick(run, which or "latest")
    return None


def _pick(run: Path, which: str) -> Path:
    if which == "best":
        best_file = checkpoint_dir(run) / "best.json"
        if not best_file.is_file():
            raise GptlabError(f"{run} has no best checkpoint yet (no best.json: no evaluation was saved); use {run} for the latest")
        return checkpoint_dir(run) / read_json(best_file)["checkpoint"]
    found = list_checkpoints(run)
    if not found:
        raise GptlabError(f"{run} holds no checkpoint yet")
    return found[-1]
