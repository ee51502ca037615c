"""Metrics sinks read back by their own libraries: every number of metrics.jsonl, at its step."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gptlab.train import Trainer

from .conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def logged_numbers(out: Path) -> dict[str, list[tuple[int, float]]]:
    """{key: [(step, value), ...]} of every number in metrics.jsonl: what a sink should hold."""
    series: dict[str, list] = {}
    for record in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                series.setdefault(key, []).append((record["step"], value))
    return series


def test_tensorboard_holds_every_logged_number_at_its_step(prepared, tmp_path):
    out = tmp_path / "run"
    Trainer(tiny_config(prepared, out, max_steps=4, eval_every=2, tensorboard=True), log=lambda *_: None).fit()
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    expected = logged_numbers(out)
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "val_bpb"} <= expected.keys()
    assert set(events.Tags()["scalars"]) == expected.keys()
    for key, points in expected.items():  # event files store float32
        assert [(event.step, event.value) for event in events.Scalars(key)] == [(step, float(np.float32(value))) for step, value in points], key


# Trains with --trackio, then reads trackio's SQLite store back through trackio's own API: fit() must have finished
# the run (flushed its logs to disk) before it returns. One process for both saves a Python + torch start.
TRACKIO_TRAIN_AND_READ = """
import json, sys
from pathlib import Path
from gptlab.train import Trainer
from tests.train.conftest import tiny_config
Trainer(tiny_config(Path(sys.argv[1]), Path(sys.argv[2]), max_steps=4, eval_every=2, trackio="gptlab-test"), log=lambda *_: None).fit()
import trackio
from trackio.sqlite_storage import SQLiteStorage
runs = list(trackio.Api().runs("gptlab-test"))
print(json.dumps({"runs": len(runs), "config": runs[0].config, "logs": SQLiteStorage.get_logs("gptlab-test", runs[0].name)}, default=str))
"""


def test_trackio_stores_every_logged_number_at_its_step_locally(prepared, tmp_path):
    """A process of its own, since trackio reads TRACKIO_DIR when imported: it trains with --trackio, then reads the store back."""
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", TRACKIO_TRAIN_AND_READ, str(prepared), str(out)], capture_output=True, text=True,
                            env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    stored = json.loads(result.stdout.splitlines()[-1])
    assert stored["runs"] == 1 and stored["config"]["max_steps"] == 4 and stored["config"]["trackio"] == "gptlab-test"
    found: dict[str, list] = {}
    for entry in stored["logs"]:
        for key, value in entry.items():
            if key not in ("step", "timestamp"):
                found.setdefault(key, []).append((entry["step"], value))
    assert found == logged_numbers(out)


def test_tensorboard_holds_each_step_once_after_a_killed_run_resumes(prepared, tmp_path):
    """Killed after step 6 but before its checkpoint: the resumed run trains 4..6 again, and TensorBoard
    (purge_step) keeps only the second time, equal to metrics.jsonl, which holds each step once."""
    out = tmp_path / "run"
    Trainer(tiny_config(prepared, out, max_steps=6, eval_every=3, tensorboard=True), log=lambda *_: None).fit()
    shutil.rmtree(out / "checkpoints" / "step_000006")
    Trainer(tiny_config(prepared, out, max_steps=6, eval_every=3, tensorboard=True), log=lambda *_: None).fit()
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    expected = logged_numbers(out)
    assert [step for step, _ in expected["loss"]] == [1, 2, 3, 4, 5, 6]
    assert set(events.Tags()["scalars"]) == expected.keys()
    for key, points in expected.items():
        assert [(event.step, event.value) for event in events.Scalars(key)] == [(step, float(np.float32(value))) for step, value in points], key
