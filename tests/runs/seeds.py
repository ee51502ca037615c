"""Run folders written by hand, as the Trainer leaves them, for comparisons over seeds without training."""

import json
from pathlib import Path


def fake_run(folder: Path, *, val_bpb: float | None = None, loss: float = 3.0, val_loss: float | None = None,
             steps: int = 6, rate: float = 1000.0) -> Path:
    """A finished run's metrics.jsonl: a train record at the last step, then its evaluation (if any val figure)."""
    folder.mkdir(parents=True)
    records = [{"step": steps, "loss": loss, "lr": 1e-3, "tokens": 128 * steps, "elapsed": 1.5, "tokens_per_s": rate}]
    evaluation = {key: value for key, value in (("val_loss", val_loss), ("val_bpb", val_bpb)) if value is not None}
    if evaluation:
        records.append({"step": steps, **evaluation})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return folder


def fake_group(root: Path, name: str, bpbs: list[float], first_seed: int = 1337, **figures) -> list[Path]:
    """NAME-seedS folders under root, one per val bpb, the losses following it."""
    return [fake_run(root / f"{name}-seed{first_seed + i}", val_bpb=bpb, val_loss=bpb * 1.5, loss=bpb * 1.4,
                     rate=1000.0 + 7 * i * i, **figures) for i, bpb in enumerate(bpbs)]
