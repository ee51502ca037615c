"""Run metrics: a JSONL log, the console line, optional TensorBoard / trackio / Weights & Biases, and a loss plot.

    OUT/metrics.jsonl   one JSON object per logged step: {"step", "loss", "lr", "grad_norm", "tokens",
                        "tokens_per_s", "mfu", "elapsed"} and, at evaluations, {"val_loss", "val_bpb"};
                        elapsed: seconds of training so far, resumed runs counting on from their checkpoint
                        MoE runs add {"moe_aux_loss", "moe_max_load", "moe_layers": [per sparse layer]}
                        (gptlab.train.moe_stats); only numbers go to the console and the scalar sinks
    OUT/loss.png        train and val loss against step, drawn at the end
    OUT/tensorboard/    TensorBoard event files (--tensorboard): each number of a record as a scalar at its step; a resumed
                        run opens its writer with purge_step, so TensorBoard drops what was logged after the checkpoint
                        and shows each step once
    trackio             the same scalars in trackio's local store ($TRACKIO_DIR, default ~/.cache/huggingface/trackio),
                        project --trackio NAME; `trackio show` opens its dashboard. W&B (--wandb) gets whole records.

Only rank 0 writes. Not here: what is measured (gptlab.train.trainer).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gptlab.runtime import GptlabError, atomic_write
from gptlab.runtime.optional import require


class MetricsLog:
    def __init__(self, out: str | os.PathLike, enabled: bool, tensorboard: bool = False, wandb_project: str = "", config: dict | None = None,
                 trackio_project: str = "") -> None:
        self.path = Path(out) / "metrics.jsonl"
        self.enabled = enabled
        self.tensorboard = self.wandb = self.trackio = None
        self.writer_class, self.purge_step = None, None  # TensorBoard's writer opens on the first record (see truncate_after)
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            self.writer_class = require("torch.utils.tensorboard", extra="tracking", purpose="--tensorboard",
                                        needs="tensorboard").SummaryWriter
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise GptlabError("--wandb needs the wandb package: pip install wandb") from None
            self.wandb = wandb.init(project=wandb_project, config=config or {})
        if trackio_project:
            self.trackio = _start_trackio(trackio_project, config or {})

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        step = record.get("step", 0)
        scalars = {key: value for key, value in record.items() if key != "step" and isinstance(value, (int, float))}
        if self.writer_class is not None and self.tensorboard is None:
            self.tensorboard = self.writer_class(str(self.path.parent / "tensorboard"), purge_step=self.purge_step)
        if self.tensorboard is not None:
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, value, step)
        if self.trackio is not None:
            self.trackio.log(scalars, step=step)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (0: all): a resumed run logs them again, so logs never mix two runs.
        TensorBoard's event files are append-only: its writer, opened later, purges them from step + 1."""
        if step and self.tensorboard is None:
            self.purge_step = step + 1
        if not self.enabled or not self.path.is_file():
            return
        kept = [record for record in self.records() if record.get("step", 0) <= step] if step else []
        with atomic_write(self.path) as handle:
            handle.writelines(json.dumps(record) + "\n" for record in kept)

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.trackio is not None:
            self.trackio.finish()
            self.trackio = None


def _start_trackio(project: str, config: dict):
    """trackio's module, with a run started in `project` (it speaks W&B's init / log / finish)."""
    trackio = require("trackio", extra="tracking", purpose="--trackio")
    trackio.init(project=project, config=config)
    return trackio


def plot_losses(records: list[dict], path: str | os.PathLike) -> Path | None:
    """Train and val loss curves as a PNG (None when matplotlib is missing or nothing was logged)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    if not train:
        return None
    figure, axis = plt.subplots(figsize=(7, 4), dpi=120)
    axis.plot(*zip(*train), label="train loss", linewidth=1)
    if val:
        axis.plot(*zip(*val), "o-", label="val loss", linewidth=1.5)
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats/token)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    path = Path(path)
    with atomic_write(path, "wb") as handle:
        figure.savefig(handle, format="png")
    plt.close(figure)
    return path


STANDARD = ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "elapsed")  # the Trainer's own


def console_line(record: dict, max_steps: int, eta_seconds: float | None, spent: float | None = None) -> str:
    """The step's line; `spent`: the share of a time budget used, shown instead of the step count it makes moot."""
    where = f"step {record['step']:>6} ({spent:.0%} of time)" if spent is not None else f"step {record['step']:>6}/{max_steps}"
    parts = [where, f"loss {record['loss']:.4f}", f"lr {record['lr']:.2e}", f"norm {record['grad_norm']:.2f}", f"{record['tokens_per_s']:,.0f} tok/s"]
    if record.get("mfu") is not None:
        parts.append(f"mfu {100 * record['mfu']:.1f}%")
    parts += [f"{key} {value:.3g}" for key, value in record.items() if key not in STANDARD and isinstance(value, (int, float))]
    if eta_seconds is not None:
        minutes, seconds = divmod(int(eta_seconds), 60)
        parts.append(f"eta {minutes}m{seconds:02d}s")
    return " | ".join(parts)
