"""Checkpoints: everything a run needs to continue exactly, in versioned files, written atomically.

    step_000500/
        model.safetensors    weights of the plain module (never compile/DDP wrapper keys)
        config.json          the model config, for gptlab's GPT (gptlab.model.io); other modules have none
        optimizer.pt         optimizer state: tensors and numbers only, loaded with weights_only=True
        scaler.pt            the fp16 GradScaler's state, when there is one
        rng.pt               torch (CPU, CUDA), numpy and Python RNG states of every rank, as tensors (weights_only too)
        trainer_state.json   format_version, the caller's state (step, tokens, loader positions, ...),
                             and the size and CRC-32 of every file above, written last

`save_checkpoint` / `load_checkpoint` work for any `torch.nn.Module` and
optimizer, so custom loops can use them too. A checkpoint is written into
`.step_000500.tmp/` and renamed into place, so a crash mid-write (kill -9
included) leaves no half checkpoint under a real name; loading checks every
file against its recorded size and checksum and names the one that is damaged.

A training run's folder (`OUT/checkpoints/`) keeps the last `keep_last`
checkpoints plus the best by val loss (`best.json`); pruning never deletes the
checkpoint just written. Not here: the training loop (gptlab.train.trainer), finding a run's checkpoints
(gptlab.load.checkpoints).
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

from gptlab.load.checkpoints import checkpoint_dir, list_checkpoints, step_of
from gptlab.model import GPT
from gptlab.model.io import load_state, save_model, save_safetensors
from gptlab.runtime import GptlabError, atomic_write_text, read_json
from gptlab.runtime.device import rng_state, set_rng_state

FORMAT_VERSION = 1
STATE_NAME = "trainer_state.json"
WEIGHTS_NAME = "model.safetensors"
DAMAGED_SUFFIX = ".damaged"


# ---------------------------------------------------------------- one checkpoint


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc


def _module_weights(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors to save, and aliases {name: saved name} for parameters shared under two names (tied weights)."""
    tensors, aliases, seen = {}, {}, {}
    for name, tensor in model.state_dict().items():
        key = (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = tensor.detach().to("cpu").clone(memory_format=torch.contiguous_format)
    return tensors, aliases


def _save_weights(model: torch.nn.Module, directory: Path) -> None:
    if isinstance(model, GPT):
        save_model(model, directory)
        return
    tensors, aliases = _module_weights(model)
    save_safetensors(tensors, directory / WEIGHTS_NAME, {"gptlab_aliases": json.dumps(aliases)})


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer | dict | None = None,
                    *, state: dict | None = None, scaler=None, rng_states: list[dict] | None = None,
                    attach: Callable[[Path], None] | None = None) -> Path:
    """Write one checkpoint folder at `path` (e.g. out/checkpoints/step_000500): complete, or not there at all.

    `optimizer`: the optimizer, or its state dict (a sharded optimizer's, gathered by every rank beforehand).
    `rng_states`: one `rng_state()` per rank under DDP (default: this process's). `attach(folder)` writes
    more files into the checkpoint before it is sealed (the trainer saves the tokenizer this way).
    """
    final = Path(path)
    tmp = final.parent / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _save_weights(model, tmp)
        if optimizer is not None:
            torch.save(optimizer if isinstance(optimizer, dict) else optimizer.state_dict(), tmp / "optimizer.pt")
        if scaler is not None and scaler.is_enabled():
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        torch.save({"ranks": rng_states or [rng_state()]}, tmp / "rng.pt")
        if attach is not None:
            attach(tmp)
        files = {p.relative_to(tmp).as_posix(): {"bytes": p.stat().st_size, "crc32": _crc32(p)}
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        for name in files:  # durable before the rename publishes them
            with open(tmp / name, "rb") as handle:
                os.fsync(handle.fileno())
        record = {"format_version": FORMAT_VERSION, **(state or {}), "files": files}
        atomic_write_text(tmp / STATE_NAME, json.dumps(record, indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.parent / f".{final.name}.old"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def read_checkpoint_state(path: str | os.PathLike) -> dict:
    """The trainer state of a checkpoint, after checking every file it lists; a clear error naming what is wrong."""
    path = Path(path)
    state_path = path / STATE_NAME
    if not path.is_dir():
        raise GptlabError(f"no checkpoint at {path}")
    if not state_path.is_file():
        raise GptlabError(f"checkpoint {path} is incomplete: it has no {STATE_NAME} (written last, so the save did not finish)")
    state = read_json(state_path)
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        version = state.get("format_version") if isinstance(state, dict) else None
        raise GptlabError(f"{state_path} is checkpoint format {version!r}; this gptlab reads {FORMAT_VERSION}")
    for name, expected in state.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise GptlabError(f"checkpoint {path} is damaged: {name} is missing")
        if file.stat().st_size != expected["bytes"] or _crc32(file) != expected["crc32"]:
            raise GptlabError(f"checkpoint {path} is damaged: {file} does not match the size and checksum recorded when it was saved")
    return state


def _load_weights(model: torch.nn.Module, path: Path, device) -> None:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    weights = path / WEIGHTS_NAME
    try:
        tensors = load_file(weights, device=str(device))
        with safe_open(weights, framework="pt") as handle:
            aliases = json.loads((handle.metadata() or {}).get("gptlab_aliases", "{}"))
    except (SafetensorError, OSError, json.JSONDecodeError) as error:
        raise GptlabError(f"{weights} is damaged or not safetensors: {error}") from None
    if isinstance(model, GPT):
        load_state(model, tensors, str(weights))
        return
    tensors.update({name: tensors[saved] for name, saved in aliases.items() if saved in tensors})
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        raise GptlabError(f"{weights} does not match the model: {str(error).splitlines()[0]} ...") from None


def _torch_file(path: Path, device) -> dict:
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # torch raises several types for a damaged file
        raise GptlabError(f"{path} is damaged: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from None


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    *, scaler=None, device: str | torch.device = "cpu", restore_rng: bool = True, rank: int = 0) -> dict:
    """Restore model (and optimizer, scaler, this rank's RNGs) in place from a checkpoint folder; return its trainer state."""
    path = Path(path)
    state = read_checkpoint_state(path)
    _load_weights(model, path, device)
    if optimizer is not None:
        if not (path / "optimizer.pt").is_file():
            raise GptlabError(f"checkpoint {path} holds no optimizer state (optimizer.pt)")
        optimizer.load_state_dict(_torch_file(path / "optimizer.pt", device))
    if scaler is not None and scaler.is_enabled() and (path / "scaler.pt").is_file():
        scaler.load_state_dict(_torch_file(path / "scaler.pt", "cpu"))
    if restore_rng:
        saved = _torch_file(path / "rng.pt", "cpu")
        ranks = saved.get("ranks", [saved])  # one state per rank; older checkpoints hold one state
        if rank >= len(ranks):
            raise GptlabError(f"checkpoint {path} holds the RNG states of {len(ranks)} ranks; resume with that many")
        set_rng_state(ranks[rank])
    state.pop("files", None)
    state.pop("format_version", None)
    return state


# ---------------------------------------------------------------- a run's checkpoints


def resume_point(out: str | os.PathLike, warn: Callable[[str], None]) -> Path | None:
    """The newest checkpoint that checks out. Damaged ones above it are set aside (renamed `*.damaged`) with a warning;
    if every checkpoint is damaged, the newest one's problem is the error: never "no checkpoint, start over"."""
    found = list_checkpoints(out)
    problems = []
    for path in reversed(found):
        try:
            read_checkpoint_state(path)
            break
        except GptlabError as error:
            problems.append((path, str(error)))
    else:
        if problems:
            raise GptlabError(f"{problems[0][1]}; no earlier checkpoint is whole. Remove it to start over, or pass --force")
        return None
    for damaged, reason in problems:
        aside = damaged.with_name(damaged.name + DAMAGED_SUFFIX)
        os.replace(damaged, aside)
        warn(f"warning: {reason}; set aside as {aside.name}, resuming from {path.name}")
    return path


def record_best(out: str | os.PathLike, path: Path, val_loss: float | None) -> None:
    """best.json names the kept checkpoint with the lowest val loss of this run."""
    best_file = checkpoint_dir(out) / "best.json"
    best = read_json(best_file) if best_file.is_file() else None
    stale = best is None or not (best_file.parent / best["checkpoint"]).is_dir() or best["checkpoint"] == path.name
    if val_loss is not None and (stale or val_loss < best["val_loss"]):
        atomic_write_text(best_file, json.dumps({"checkpoint": path.name, "step": step_of(path), "val_loss": val_loss}))


def forget_after(out: str | os.PathLike, step: int) -> None:
    """On resume at `step`: a best.json naming a later (damaged, set aside) checkpoint no longer holds."""
    best_file = checkpoint_dir(out) / "best.json"
    if best_file.is_file() and read_json(best_file).get("step", 0) > step:
        best_file.unlink()


def prune(out: str | os.PathLike, keep_last: int, keep: Path) -> None:
    """Delete all but the last `keep_last` checkpoints, the best one, and `keep` (the one just written)."""
    best_file = checkpoint_dir(out) / "best.json"
    best = read_json(best_file)["checkpoint"] if best_file.is_file() else None
    for path in list_checkpoints(out)[:-keep_last]:
        if path.name not in (best, keep.name):
            shutil.rmtree(path)
