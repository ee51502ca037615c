"""`gptlab run`, the main job, end to end on the built-in corpus (small sizes to stay fast)."""

import json
from pathlib import Path

import pytest

from gptlab.cli.main import main
from gptlab.data.corpus import shakespeare_files
from gptlab.data.shards import open_shard, split_shards
from gptlab.eval.card import Card
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer

SMALL = [
    "--tokenizer.vocab-size", "512",
    "--train.max-steps", "12", "--train.model.n-layer", "1", "--train.model.n-embd", "32", "--train.model.n-head", "2",
    "--train.batch-tokens", "1024", "--train.micro-batch", "8", "--train.eval-every", "6", "--train.eval-batches", "2",
    "--train.checkpoint-every", "6", "--train.log-every", "1", "--train.precision", "fp32", "--sample.max-new-tokens", "20",
    "--sft.data", "task:arithmetic[n=300], task:sorting[n=300]", "--sft.max-steps", "4", "--sft.batch-tokens", "1024",
    "--sft.micro-batch", "8", "--sft.eval-every", "2", "--sft.eval-batches", "2", "--sft.task-examples", "8",
    "--sft.precision", "fp32", "--card-examples", "12",
]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str]:
    """One small run, shared: (its folder, what it printed)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("pipeline") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", "--out", str(out), *SMALL]) == 0
    return out, printed.getvalue()


def test_run_goes_from_corpus_to_samples_and_reports_every_figure(finished):
    out, log = finished
    config = json.loads((out / "config.json").read_text())
    assert config["tokenizer"]["vocab_size"] == 512 and config["train"]["max_steps"] == 12 and config["out"] == str(out)
    # config.json is what ran: the paths and the vocabulary the run set itself
    assert config["train"]["data"] == str(out / "data") and config["train"]["out"] == str(out / "train")
    assert config["train"]["tokenizer"] == str(out / "tokenizer") and config["train"]["model"]["vocab_size"] == 512

    # Tokenizer: the held-out compression printed is the real one, recomputed from the held-out works.
    tokenizer = Tokenizer.load(out / "tokenizer")
    assert tokenizer.vocab_size == 512 and tokenizer.special_tokens == {"<|endoftext|>": 511}
    held_out = shakespeare_files()[9::10]
    text = "".join(path.read_text(encoding="utf-8") for path in held_out)
    ratio = len(text.encode()) / sum(len(tokenizer.encode(path.read_text(encoding="utf-8"))) for path in held_out)
    assert f"{ratio:.2f} bytes/token" in log and ratio > 1.5

    # Data: one held-out set: the val split is exactly the works the tokenizer never saw, the rest is train.
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["tokenizer"]["fingerprint"] == tokenizer.fingerprint()
    val = [int(i) for path, _ in split_shards(out / "data", "val") for i in open_shard(path)[1]]
    expected = [i for path in held_out for i in [tokenizer.eot_id, *tokenizer.encode_ordinary(path.read_text(encoding="utf-8"))]]
    assert sorted(val) == sorted(expected) and len(val) == len(expected)
    assert manifest["splits"]["train"]["documents"] == len(shakespeare_files()) - len(held_out)

    # Training: 12 steps, metrics, checkpoint with its tokenizer, the loss plot; loss went down.
    records = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 12 and losses[-1] < losses[0]
    checkpoint = out / "train" / "checkpoints" / "step_000012"
    assert (checkpoint / "tokenizer" / "tokenizer.json").is_file() and (out / "train" / "loss.png").is_file()
    assert load_model(checkpoint).config.vocab_size == 512

    # Evaluation and sampling are reported.
    assert "val bits per byte" in log and "[7/10] sample" in log

    # Fine-tuning: the chat model in OUT/sft, task accuracy before and after, a conversation, how to talk to it.
    sft = out / "sft" / "checkpoints" / "step_000004"
    chat_tokenizer = Tokenizer.load(sft / "tokenizer")
    assert load_model(sft).config.vocab_size == chat_tokenizer.vocab_size == 512 + 7  # the chat tokens and the tool tokens
    assert chat_tokenizer.encode_ordinary("To be, or not") == tokenizer.encode_ordinary("To be, or not")
    assert "arithmetic_accuracy:" in log and "sorting_accuracy:" in log and "before fine-tuning" in log
    assert "[9/10] chat" in log and log.count("assistant: ") == 2 and f"gptlab chat {out / 'sft'}" in log
    assert f"gptlab dpo --init {out / 'sft'}" in log  # and how to align it

    # Report cards: the base model on the held-out works, the chat model on the tasks' held-out questions, saved.
    base, chat = Card.load(out / "train" / "eval-heldout" / "eval.json"), Card.load(out / "sft" / "eval-tasks" / "eval.json")
    assert [(row.task, row.n, row.chance) for row in base.rows] == [("next_line", 12, 0.25), ("last_word", 12, 0.0)]
    assert [(row.task, row.n) for row in chat.rows] == [("arithmetic", 12), ("sorting", 12)]
    assert "[10/10] report cards" in log and base.text().splitlines()[2] in log and chat.aggregates[0].name in log


def test_rerunning_the_same_run_reuses_every_finished_stage_and_changes_nothing(finished, capsys):
    out, _ = finished
    before = snapshot(out)
    assert main(["run", "--out", str(out), *SMALL, "--sample.max-new-tokens", "5"]) == 0  # sampling may change
    log = capsys.readouterr().out
    assert "resuming the run" in log and "reused" in log and "already prepared" in log and "already finished" in log
    after = snapshot(out)
    changed = {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
    assert changed <= {"gptlab_run.json", "config.json", "train/gptlab_run.json", "train/train_config.json",
                       "sft/gptlab_run.json", "sft/train_config.json"}


def test_another_config_or_a_foreign_folder_is_refused_and_left_as_it_was(finished, tmp_path, capsys):
    out, _ = finished
    before = snapshot(out)
    assert main(["run", "--out", str(out), *SMALL, "--train.max-steps", "5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other settings (train.max_steps 12 -> 5)" in err and "--force" in err
    assert snapshot(out) == before

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    assert main(["run", "--out", str(mine), *SMALL, "--force"]) == 1
    assert "is not a gptlab run folder (it holds config.json)" in capsys.readouterr().err
    assert (mine / "config.json").read_text() == '{"mine": true}' and len(list(mine.iterdir())) == 1

    (tmp_path / "file").write_text("x")
    assert main(["run", "--out", str(tmp_path / "file"), *SMALL]) == 1
    assert "is a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "reason"), [
    ("--train.out", "the run trains into OUT/train"),
    ("--train.data", "prepares its own data"),
    ("--train.model.vocab-size", "set --tokenizer.vocab-size"),
    ("--sft.init-from", "fine-tunes the model it pretrained"),
    ("--sft.model.n-layer", "set --train.model"),
])
def test_run_refuses_fields_it_sets_itself(tmp_path, capsys, flag, reason):
    assert main(["run", "--out", str(tmp_path / "run"), flag, "7"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} cannot be set here" in err and reason in err
    assert not (tmp_path / "run").exists()


def test_a_run_refused_before_training_leaves_nothing_and_the_corrected_command_needs_no_force(tmp_path, capsys):
    """4096 tokens per step do not divide into micro-batches of 3 x 128: found after the tokenizer and data
    stages, before training; the new run's folder is removed, so the corrected command simply runs."""
    out = tmp_path / "runs" / "new"
    bad = ["run", "--out", str(out), *SMALL, "--train.micro-batch", "3"]
    assert main(bad) == 1
    err = capsys.readouterr().err
    assert "does not divide" in err and "change --train.batch-tokens or --train.micro-batch" in err  # as this command spells them
    assert not (tmp_path / "runs").exists()
    assert main(["run", "--out", str(out), *SMALL, "--train.max-steps", "1"]) == 0


def interrupt_once(monkeypatch, trainer_class, at_step: int) -> None:
    """Ctrl-C (KeyboardInterrupt) once, right after `trainer_class` logs step `at_step`."""
    real_log_step = trainer_class._log_step
    done = []

    def log_step(self, *args):
        real_log_step(self, *args)
        if self.state.step == at_step and not done:
            done.append(True)
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer_class, "_log_step", log_step)


def test_ctrl_c_during_training_stops_the_run_with_130_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    from gptlab.train import Trainer

    interrupt_once(monkeypatch, Trainer, at_step=3)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *SMALL]) == 130
    log = capsys.readouterr().out
    assert "interrupted: rerun the same command to resume" in log and "[6/9]" not in log
    assert sorted(p.name for p in (out / "train" / "checkpoints").iterdir()) == ["step_000003"]
    assert main(["run", "--out", str(out), *SMALL]) == 0
    log = capsys.readouterr().out
    assert "resumed from" in log and "step_000003 at step 3" in log and "val bits per byte" in log
    records = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 13))  # each step logged once


def test_ctrl_c_during_fine_tuning_stops_with_130_and_the_same_command_resumes_it(tmp_path, monkeypatch, capsys):
    from gptlab.align.finetune.sft import SFTTrainer

    interrupt_once(monkeypatch, SFTTrainer, at_step=2)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *SMALL]) == 130
    log = capsys.readouterr().out
    assert "interrupted: rerun the same command to resume" in log and "[9/10]" not in log
    assert sorted(p.name for p in (out / "sft" / "checkpoints").iterdir()) == ["step_000002"]
    assert main(["run", "--out", str(out), *SMALL]) == 0
    log = capsys.readouterr().out
    assert "already finished" in log and "step_000002 at step 2" in log and "[9/10] chat" in log
