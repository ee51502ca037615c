"""The text samples a run printed, one JSON object a line in OUT/samples.jsonl:

    {"step": 600, "text": "ROMEO: ..."}

Appended by the Trainer as it prints them (rank 0), cut back on resume like the metrics
(a resumed run samples those steps again), read by the report.
Not here: how samples are drawn (gptlab.infer, the caller's sample_fn).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gptlab.runtime import atomic_write_text, read_text

SAMPLES_FILE = "samples.jsonl"


def append_sample(out: str | os.PathLike, step: int, text: str) -> None:
    path = Path(out) / SAMPLES_FILE
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": step, "text": text}) + "\n")


def read_samples(out: str | os.PathLike) -> list[dict]:
    """The samples in order ([] when the run printed none); a damaged line ends the list, as a crash mid-write leaves it."""
    path = Path(out) / SAMPLES_FILE
    if not path.is_file():
        return []
    samples = []
    for line in read_text(path, "the samples log is damaged").splitlines():
        try:
            samples.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return samples


def truncate_samples(out: str | os.PathLike, step: int) -> None:
    """Keep the samples of steps up to `step` (0: none), so a resumed run's file never mixes two runs."""
    path = Path(out) / SAMPLES_FILE
    if path.is_file():
        kept = [sample for sample in read_samples(out) if sample["step"] <= step]
        atomic_write_text(path, "".join(json.dumps(sample) + "\n" for sample in kept))
