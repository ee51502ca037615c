"""A run folder belongs to one run: resumed with the same settings, refused with others, never mixed or lost."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptlab.load.checkpoints import list_checkpoints
from gptlab.runtime import GptlabError
from gptlab.train import Trainer
from gptlab.train.checkpoint import prune, save_checkpoint

from .conftest import tiny_config


def quiet(config, **kwargs):
    return Trainer(config, log=lambda *_: None, **kwargs)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes: "the disk as we found it"."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def metric_steps(out: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_a_folder_that_is_not_a_gptlab_run_is_refused_and_left_alone(prepared, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"my": "own config"}')
    (out / "data").mkdir()
    (out / "data" / "notes.txt").write_text("my data")
    before = snapshot(out)
    for force in (False, True):
        with pytest.raises(GptlabError, match=r"is not empty and is not a gptlab run folder \(it holds config.json, data/\)"):
            quiet(tiny_config(prepared, out), force=force).fit()
    assert snapshot(out) == before


def test_a_file_as_out_is_one_clear_error(prepared, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(GptlabError, match="is a file, not a folder"):
        quiet(tiny_config(prepared, tmp_path / "file")).fit()
    assert (tmp_path / "file").read_text() == "x"


def test_other_settings_into_a_run_folder_are_refused_and_change_nothing(prepared, tmp_path):
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out, max_steps=6)).fit()
    before = snapshot(out)
    with pytest.raises(GptlabError, match=r"holds a run with other settings \(max_steps 6 -> 3\).*--force to start over"):
        quiet(tiny_config(prepared, out, max_steps=3)).fit()
    assert snapshot(out) == before


def test_force_starts_over_and_nothing_of_the_old_run_remains(prepared, tmp_path):
    """A 12-step run, then a 3-step run with --force: checkpoints, metrics and best.json are the new run's only."""
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out, max_steps=12, checkpoint_every=2, eval_every=2)).fit()
    (out / "my_notes.txt").write_text("the user's own file")
    result = quiet(tiny_config(prepared, out, max_steps=3, checkpoint_every=2, eval_every=2), force=True).fit()
    assert [p.name for p in list_checkpoints(out)] == ["step_000002", "step_000003"]
    assert metric_steps(out) == [1, 2, 3]
    best = json.loads((out / "checkpoints" / "best.json").read_text())
    assert best["checkpoint"] in ("step_000002", "step_000003") and best["val_loss"] == pytest.approx(
        min(r["val_loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r))
    assert result.checkpoint.is_dir() and (out / "my_notes.txt").read_text() == "the user's own file"


def test_no_resume_into_a_folder_with_a_run_is_refused(prepared, tmp_path):
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out, max_steps=6)).fit()
    before = snapshot(out)
    with pytest.raises(GptlabError, match="--no-resume would start over; pass --force"):
        quiet(tiny_config(prepared, out, max_steps=6), resume=False).fit()
    assert snapshot(out) == before


def test_rerunning_a_finished_run_trains_nothing_and_keeps_its_files(prepared, tmp_path):
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out, max_steps=4)).fit()
    before = snapshot(out)
    result = quiet(tiny_config(prepared, out, max_steps=4, log_every=2)).fit()  # log_every may change
    assert result.status == "already finished" and result.steps == 4 and result.losses == []
    assert result.checkpoint == list_checkpoints(out)[-1]
    assert {k: v for k, v in snapshot(out).items() if k not in ("gptlab_run.json", "train_config.json")} == {
        k: v for k, v in before.items() if k not in ("gptlab_run.json", "train_config.json")}


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    model, out = torch.nn.Linear(2, 2), tmp_path / "run"
    for step in (10, 12):
        save_checkpoint(out / "checkpoints" / f"step_{step:06d}", model)
    newest = save_checkpoint(out / "checkpoints" / "step_000003", model)
    prune(out, keep_last=2, keep=newest)
    assert newest.is_dir() and [p.name for p in list_checkpoints(out)] == ["step_000003", "step_000010", "step_000012"]


def test_a_resumed_run_logs_each_step_once_with_the_uninterrupted_runs_values(prepared, tmp_path):
    """Killed after step 5 (checkpoint at 3, metrics to 5): the resumed run's log equals an uninterrupted one's."""
    straight = quiet(tiny_config(prepared, tmp_path / "straight")).fit()
    out = tmp_path / "killed"
    quiet(tiny_config(prepared, out)).fit()
    shutil.rmtree(out / "checkpoints" / "step_000006")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(line for line in lines if json.loads(line)["step"] <= 5) + "\n")
    quiet(tiny_config(prepared, out)).fit()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metric_steps(out) == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in records if "loss" in r] == straight.losses


@pytest.mark.parametrize("damage", ["no_state", "bad_weights", "flipped_byte"])
def test_a_damaged_newest_checkpoint_is_set_aside_with_a_warning_and_the_run_resumes_from_the_one_before(prepared, tmp_path, damage):
    straight = quiet(tiny_config(prepared, tmp_path / "straight")).fit()
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out)).fit()
    newest = out / "checkpoints" / "step_000006"
    if damage == "no_state":
        (newest / "trainer_state.json").unlink()
    elif damage == "bad_weights":
        (newest / "model.safetensors").write_bytes(b"not safetensors")
    else:
        data = bytearray((newest / "model.safetensors").read_bytes())
        data[-5] ^= 0xFF
        (newest / "model.safetensors").write_bytes(bytes(data))
    lines = []
    result = Trainer(tiny_config(prepared, out), log=lines.append).fit()
    warning = next(line for line in lines if line.startswith("warning:"))
    assert "step_000006" in warning and "resuming from step_000003" in warning
    assert (out / "checkpoints" / "step_000006.damaged").is_dir()
    assert result.losses == straight.losses[3:]
    for name, tensor in load_file(list_checkpoints(tmp_path / "straight")[-1] / "model.safetensors").items():
        assert torch.equal(load_file(newest / "model.safetensors")[name], tensor)


def test_a_run_whose_only_checkpoint_is_damaged_is_an_error_not_a_restart(prepared, tmp_path):
    out = tmp_path / "run"
    quiet(tiny_config(prepared, out, max_steps=3)).fit()
    (out / "checkpoints" / "step_000003" / "optimizer.pt").write_bytes(b"")
    before = snapshot(out)
    with pytest.raises(GptlabError, match=r"step_000003 is damaged: .*optimizer.pt.*no earlier checkpoint is whole"):
        quiet(tiny_config(prepared, out, max_steps=3)).fit()
    assert snapshot(out) == before


def test_a_tokenizer_other_than_the_datas_is_refused_before_any_compute(prepared, tmp_path):
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.tokenizer import Tokenizer

    other = Tokenizer.train(shakespeare_documents()[6:8], vocab_size=400)
    other.save(tmp_path / "other")
    with pytest.raises(GptlabError, match=r"prepared with another tokenizer .* than .*other \(fingerprint"):
        Trainer(tiny_config(prepared, tmp_path / "run", tokenizer=str(tmp_path / "other")))
    assert not (tmp_path / "run").exists()


def test_a_warmup_longer_than_the_run_is_shortened_with_a_note(prepared, tmp_path):
    lines = []
    config = tiny_config(prepared, tmp_path / "run", max_steps=6)
    config = dataclasses.replace(config, schedule=dataclasses.replace(config.schedule, warmup_steps=100))
    trainer = Trainer(config, log=lines.append)
    assert trainer.config.schedule.warmup_steps == 1
    assert any("warmup of 100 steps is not shorter than the run (6 steps); shortened to 1" in line for line in lines)
    trainer.fit()
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["schedule"]["warmup_steps"] == 1  # the config that ran


def test_without_out_a_run_gets_its_own_new_folder(prepared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = []
    first = Trainer(tiny_config(prepared, "", max_steps=1), log=lines.append).fit()
    second = Trainer(tiny_config(prepared, "", max_steps=1), log=lambda *_: None).fit()
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(name.startswith("train-") for name in folders)
    assert first.checkpoint.parent.parent != second.checkpoint.parent.parent
    assert any(line.startswith("no --out given: training into runs/train-") for line in lines)


def test_checkpoint_files_get_the_users_usual_permissions(prepared, tmp_path):
    quiet(tiny_config(prepared, tmp_path / "run", max_steps=1)).fit()
    expected = 0o666 & ~_umask()
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == expected, path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_run_made_before_run_records_is_refused_and_force_starts_it_over(prepared, tmp_path):
    out = tmp_path / "old"
    (out / "checkpoints" / "step_000003").mkdir(parents=True)
    (out / "train_config.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    before = snapshot(out)
    with pytest.raises(GptlabError, match="made by an earlier gptlab, without a run record.*--force to start over"):
        quiet(tiny_config(prepared, out, max_steps=2)).fit()
    assert snapshot(out) == before
    quiet(tiny_config(prepared, out, max_steps=2), force=True).fit()
    assert metric_steps(out) == [1, 2] and [p.name for p in list_checkpoints(out)] == ["step_000002"]

    (out / "gptlab_run.json").unlink()
    (out / "notes.txt").write_text("mine")  # not only a run's files any more: never cleared
    with pytest.raises(GptlabError, match="is not a gptlab run folder"):
        quiet(tiny_config(prepared, out, max_steps=2), force=True).fit()
    assert (out / "notes.txt").read_text() == "mine"


def test_a_new_run_refused_before_training_leaves_nothing_behind(prepared, tmp_path):
    """Batches larger than a shard are found when the loaders open, after the folder was claimed: it is removed."""
    out = tmp_path / "new" / "run"
    with pytest.raises(GptlabError, match="sequential batches come from one shard"):
        quiet(tiny_config(prepared, out, micro_batch=8000, batch_tokens=8000 * 32)).fit()
    assert not (tmp_path / "new").exists()
    quiet(tiny_config(prepared, out, max_steps=1)).fit()  # the corrected command needs no --force
