"""Rerunning into a run folder: compared on what the user asked for, fields added since are no change at their
default, and --extend trains a finished run on to more steps."""

import dataclasses
import json
from pathlib import Path

import pytest

from gptlab.runtime import GptlabError
from gptlab.train import Trainer
from gptlab.train.schedule import learning_rate

from .conftest import tiny_config


def quiet(config, **kwargs):
    return Trainer(config, log=lambda *_: None, **kwargs)


def with_warmup(config, warmup: int):
    return dataclasses.replace(config, schedule=dataclasses.replace(config.schedule, warmup_steps=warmup))


def logged(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def forget_fields(out: Path, *keys: str) -> None:
    """Make the run record look written by a gptlab before these (dotted) fields existed."""
    marker = out / "gptlab_run.json"
    record = json.loads(marker.read_text())
    for snapshot in (record["config"], record["asked"]):
        for key in keys:
            *parents, name = key.split(".")
            target = snapshot
            for part in parents:
                target = target[part]
            del target[name]
    marker.write_text(json.dumps(record))


def test_a_refused_rerun_names_only_the_users_own_changes_not_a_warmup_gptlab_shortened(prepared, tmp_path):
    """A warmup of 100 in a 4-step run ran as 1 step; asking again for 100 in a 6-step run is no warmup change."""
    out = tmp_path / "run"
    quiet(with_warmup(tiny_config(prepared, out, max_steps=4), 100)).fit()
    with pytest.raises(GptlabError) as refused:
        quiet(with_warmup(tiny_config(prepared, out, max_steps=6), 100)).fit()
    message = str(refused.value)
    assert "other settings (max_steps 4 -> 6);" in message and "warmup" not in message
    assert "pass --extend to train it on to the new --max-steps" in message


def test_a_field_added_since_the_run_was_saved_is_no_change_at_its_default(prepared, tmp_path):
    """Top-level (grad_clip) and nested (optimizer.kind) fields missing from an older record: the same command resumes."""
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out, max_steps=3)).fit()
    forget_fields(out, "grad_clip", "optimizer.kind", "schedule.decay_fraction")
    result = quiet(tiny_config(prepared, out, max_steps=3)).fit()
    assert result.status == "already finished" and result.steps == 3


def test_a_field_added_since_the_run_was_saved_is_a_change_away_from_its_default(prepared, tmp_path):
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out, max_steps=3)).fit()
    forget_fields(out, "grad_clip", "optimizer.kind")
    config = tiny_config(prepared, out, max_steps=3, grad_clip=0.5)
    with pytest.raises(GptlabError, match=r"other settings \(grad_clip 1\.0 -> 0\.5\)"):
        quiet(config).fit()
    with pytest.raises(GptlabError, match=r"other settings \(optimizer\.kind adamw -> muon\)"):
        quiet(dataclasses.replace(config, grad_clip=1.0, optimizer=dataclasses.replace(config.optimizer, kind="muon"))).fit()


def test_extend_trains_a_finished_run_on_to_the_new_max_steps_on_the_longer_schedule(prepared, tmp_path):
    out = tmp_path / "run"
    first = quiet(tiny_config(prepared, out, max_steps=4)).fit()
    trained = logged(out)
    lines = []
    longer = tiny_config(prepared, out, max_steps=7)
    result = Trainer(longer, log=lines.append, extend=True).fit()
    assert first.status == "finished" and result.status == "finished" and result.steps == 7 and len(result.losses) == 3
    records = logged(out)
    assert [r["step"] for r in records] == list(range(1, 8))
    assert records[:4] == trained  # the first 4 steps stay as trained
    # steps 5..7 (0-based 4..6) follow the 7-step schedule
    assert [r["lr"] for r in records[4:]] == [learning_rate(step, longer.optimizer.lr, 7, longer.schedule) for step in (4, 5, 6)]
    assert any("extending the run from 4 to 7 steps" in line for line in lines)
    again = quiet(tiny_config(prepared, out, max_steps=7)).fit()  # the record now holds 7 steps: a plain rerun resumes
    assert again.status == "already finished" and again.steps == 7


def test_extend_refuses_fewer_steps_a_missing_run_and_force(prepared, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(GptlabError, match="holds none; leave out --extend"):
        quiet(tiny_config(prepared, out, max_steps=4), extend=True).fit()
    assert not out.exists()
    quiet(tiny_config(prepared, out, max_steps=4)).fit()
    with pytest.raises(GptlabError, match="--max-steps 3 is fewer than the run's 4 steps"):
        quiet(tiny_config(prepared, out, max_steps=3), extend=True).fit()
    with pytest.raises(GptlabError, match="cannot be combined with --force"):
        quiet(tiny_config(prepared, out, max_steps=6), extend=True, force=True).fit()
    with pytest.raises(GptlabError, match=r"other settings \(seed 1337 -> 1\)"):  # only max_steps may change
        quiet(tiny_config(prepared, out, max_steps=6, seed=1), extend=True).fit()
