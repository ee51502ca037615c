"""A run folder read back: its config, metrics, samples and machine, and the figures derived from them.

    run = load_run("runs/shakespeare/train")
    run.series("loss", x="tokens")    # ([tokens...], [train loss...])
    run.summary()                     # {"steps": 600, "tokens": ..., "best_val_loss": ..., "tokens_per_s": ...}

X axes: step, tokens, time (seconds of training, summed over resumes) and flops (tokens x the training
FLOPs per token of the saved model config, 6N + 12 L d T: gptlab.model.accounting, as MFU counts them).
Evaluations are logged with their step only; their tokens and time are read off the train records by
linear interpolation from (step 0, 0 tokens, 0 s), exact at every logged step.
Not here: writing these files (gptlab.train, gptlab.runs.samples, gptlab.runs.machine), drawing (gptlab.runs.plots).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from gptlab.runs.machine import MACHINE_FILE
from gptlab.runs.samples import read_samples
from gptlab.runtime import GptlabError, read_json, read_text

AXES = ("step", "tokens", "time", "flops")
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "train_config.json"
MARKER_FILE = "gptlab_run.json"
CARDS = "eval-*/eval.json"  # report cards `gptlab eval` saves for a model of this run, a folder per suite (gptlab.eval.card's format)


@dataclass
class RunRecord:
    path: Path
    name: str
    config: dict | None  # train_config.json (None for a folder without one)
    records: list[dict]  # metrics.jsonl, in order
    samples: list[dict]  # samples.jsonl
    machine: dict | None  # machine.json
    command: str | None  # the gptlab command that made it (gptlab_run.json)
    cards: dict | None = None  # {"eval-core": card, ...}: the report cards, read as plain JSON (runs does not import eval)

    def card_figures(self) -> tuple[list[dict], list[dict]]:
        """(rows, aggregates) of all the run's cards together, in folder order."""
        cards = list((self.cards or {}).values())
        return [row for card in cards for row in card["rows"]], [item for card in cards for item in card.get("aggregates", [])]

    @property
    def train(self) -> list[dict]:
        """The per-step records (they carry the train loss)."""
        return [record for record in self.records if "loss" in record]

    @property
    def evals(self) -> list[dict]:
        """The records logged at evaluations: val figures and benchmark scores."""
        return [record for record in self.records if "loss" not in record]

    def flops_per_token(self) -> float | None:
        """Training FLOPs per token of the saved model at the run's seq_len (None without a config)."""
        from gptlab.model.accounting import flops_per_token

        model = self._model_config()
        return None if model is None else float(flops_per_token(model, self.config.get("seq_len"))["training"])

    def params(self) -> int | None:
        from gptlab.model.accounting import param_counts

        model = self._model_config()
        return None if model is None else param_counts(model)["total"]

    def _model_config(self):
        from gptlab.model.io import config_from_dict

        if not self.config or not isinstance(self.config.get("model"), dict):
            return None
        try:
            return config_from_dict(self.config["model"])
        except (GptlabError, TypeError):  # a config from another gptlab version: no model figures, the rest still reads
            return None

    def check_axis(self, x: str) -> None:
        """`x` is an axis this run can be drawn against (FLOPs need the model config)."""
        if x not in AXES:
            raise GptlabError(f"unknown x axis {x!r}; use one of {', '.join(AXES)}")
        if x == "flops" and self.flops_per_token() is None:
            raise GptlabError(f"{self.path} has no {CONFIG_FILE} with a model config, so its FLOPs are unknown; use --x tokens")

    def x_values(self, steps: list[float], x: str) -> list[float]:
        """The `x` coordinate of each step: itself, or tokens, time, FLOPs interpolated along the train records."""
        self.check_axis(x)
        if x == "step":
            return list(steps)
        import numpy as np

        key = "elapsed" if x == "time" else "tokens"
        known = [(0, 0.0)] + [(r["step"], r[key]) for r in self.train if r.get(key) is not None]
        values = np.interp(steps, [step for step, _ in known], [value for _, value in known])  # flat past the last
        return (values * self.flops_per_token() if x == "flops" else values).tolist()

    def series(self, key: str, x: str = "step") -> tuple[list[float], list[float]]:
        """(xs, ys) of every record that logged `key` as a finite number."""
        points = [(r["step"], r[key]) for r in self.records if _finite(r.get(key))]
        steps = [step for step, _ in points]
        return self.x_values(steps, x), [value for _, value in points]

    def summary(self) -> dict:
        """The run's final figures: what `gptlab runs compare` tabulates and the report opens with."""
        last = self.train[-1] if self.train else {}
        val = [r["val_loss"] for r in self.evals if _finite(r.get("val_loss"))]
        bpb = [r["val_bpb"] for r in self.evals if _finite(r.get("val_bpb"))]
        rates = [r["tokens_per_s"] for r in self.train if _finite(r.get("tokens_per_s"))]
        mfus = [r["mfu"] for r in self.train if _finite(r.get("mfu"))]
        per_token = self.flops_per_token()
        return {
            "name": self.name, "steps": last.get("step"), "tokens": last.get("tokens"), "time": last.get("elapsed"),
            "final_loss": last.get("loss"), "best_val_loss": min(val) if val else None,
            "final_val_loss": val[-1] if val else None, "val_bpb": bpb[-1] if bpb else None,
            "tokens_per_s": statistics.median(rates) if rates else None,  # the median: the first steps compile and warm up
            "mfu": statistics.median(mfus) if mfus else None, "params": self.params(),
            "flops": last["tokens"] * per_token if per_token is not None and last.get("tokens") is not None else None,
        }


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's records. A cut-off last line (a crash mid-write) is left out; damage elsewhere is an error."""
    damaged = "the metrics log is damaged"
    numbered = [(number, line) for number, line in enumerate(read_text(path, damaged).splitlines(), 1) if line.strip()]
    records = []
    for index, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if index == len(numbered) - 1:
                break
            raise GptlabError(f"{path} line {number} is not JSON; {damaged}") from None
        if not isinstance(record, dict):
            raise GptlabError(f"{path} line {number} is not a record (a JSON object); {damaged}")
        records.append(record)
    return records


def load_run(path: str | os.PathLike, name: str | None = None) -> RunRecord:
    """Read the run in `path` (a folder with metrics.jsonl); one clear error for anything else."""
    path = Path(path)
    if not path.exists():
        raise GptlabError(f"{path} does not exist; pass a run folder (one with {METRICS_FILE})")
    if not path.is_dir():
        raise GptlabError(f"{path} is a file, not a run folder; pass the folder that holds {METRICS_FILE}")
    if not (path / METRICS_FILE).is_file():
        inner = sorted(p.name for p in path.iterdir() if (p / METRICS_FILE).is_file())
        hint = f"; its runs are {', '.join(str(path / n) for n in inner)}" if inner else ""
        raise GptlabError(f"{path} has no {METRICS_FILE}, so it is not a training run{hint}")
    config = read_json(path / CONFIG_FILE) if (path / CONFIG_FILE).is_file() else None
    machine = read_json(path / MACHINE_FILE) if (path / MACHINE_FILE).is_file() else None
    marker = read_json(path / MARKER_FILE) if (path / MARKER_FILE).is_file() else {}
    cards = {file.parent.name: read_json(file) for file in sorted(path.glob(CARDS))}
    return RunRecord(path=path, name=name or str(path), config=config if isinstance(config, dict) else None,
                     records=read_metrics(path / METRICS_FILE), samples=read_samples(path), machine=machine,
                     command=marker.get("command") if isinstance(marker, dict) else None,
                     cards={name: card for name, card in cards.items() if isinstance(card, dict) and isinstance(card.get("rows"), list)})
