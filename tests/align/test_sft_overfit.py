"""SFT on a few dozen conversations warns twice: before training, that the run will pass over them many times
(epochs); during training, when val loss rises while the train loss falls far below it."""

import json
import random

from gptlab.align.finetune.overfit import GAP, RISE, overfitting_warning
from gptlab.chat import ChatFormat
from gptlab.chat.data import Mixture, MixtureConfig
from gptlab.cli.main import main
from gptlab.data.match import find_model_tokenizer
from gptlab.train.checkpoint import list_checkpoints

from .test_sft import base  # noqa: F401 - the module's tiny pretrained model


def secrets(path, n=10, seed=0):
    """Conversations whose answers are random letters: learnable by heart, never from the question."""
    rng = random.Random(seed)
    rows = [{"messages": [{"role": "user", "content": f"What is secret {i}?"},
                          {"role": "assistant", "content": "".join(rng.choice("abcdefghij") for _ in range(4))}]} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_args(model, data, out, steps):
    return ["sft", "--init", str(model), "--data", str(data), "--out", str(out), "--max-steps", str(steps), "--batch-tokens", "512",
            "--micro-batch", "8", "--seq-len", "64", "--precision", "fp32", "--device", "cpu", "--val-fraction", "0.2",
            "--eval-batches", "1", "--log-every", "1", "--tasks", "none"]


def test_the_epoch_warning_gives_the_passes_over_the_data_before_training(base, tmp_path, capsys):  # noqa: F811
    data = secrets(tmp_path / "secrets.jsonl")
    assert main([*sft_args(base, data, tmp_path / "sft", 12), "--eval-every", "0"]) == 0
    printed = capsys.readouterr().out
    # by hand: the rendered length of every training conversation, cut to a row of seq_len + 1
    chat = ChatFormat(find_model_tokenizer(list_checkpoints(tmp_path / "sft")[-1]))
    train = Mixture.load(MixtureConfig.from_spec(str(data), val_fraction=0.2), "train")
    tokens = sum(min(len(chat.render(train.get(0, i)).ids), 65) for i in range(len(train)))
    epochs = 12 * (512 / 64) / (tokens / 65)
    assert epochs > 4
    line = next(line for line in printed.splitlines() if line.startswith("warning: 12 steps"))
    assert f"pass over the {len(train)} training conversations about {epochs:.0f} times (epochs)" in line
    assert "add conversations, or train about" in line and "--max-steps" in line
    assert printed.index(line) < printed.index("step      1")  # before training

    capsys.readouterr()
    assert main([*sft_args(base, data, tmp_path / "short", 1), "--eval-every", "0"]) == 0
    assert "warning: " not in capsys.readouterr().out  # one pass or so: no line


def test_the_overfitting_warning_comes_when_val_loss_rises_as_train_loss_falls(base, tmp_path, capsys):  # noqa: F811
    data = secrets(tmp_path / "secrets.jsonl")
    out = tmp_path / "sft"
    assert main([*sft_args(base, data, out, 60), "--eval-every", "10", "--optimizer.lr", "1e-2"]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if "(overfitting)" in line]
    assert len(lines) == 1  # said once
    step = int(lines[0].split("at step ")[1].split()[0])
    # what the line says held in the metrics the run recorded at that step
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    vals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    val = dict(vals)[step]
    best_before = min(loss for at, loss in vals if at < step)
    train = [r["loss"] for r in records if "loss" in r and r["step"] <= step][-10:]
    assert val > best_before * RISE and sum(train) / len(train) < GAP * val
    assert f"val loss {val:.3f} rose above its best {best_before:.3f}" in lines[0]


def test_overfitting_warning_by_hand():
    losses = [3.0, 1.0, 0.2, *([0.017] * 10)]
    assert "val loss 8.200 rose above its best 3.100 while the train loss fell to 0.017" in overfitting_warning(losses, 8.2, 3.1, 40)
    assert overfitting_warning(losses, 3.2, 3.1, 40) == ""  # within 5% of its best: not rising
    assert overfitting_warning([5.0] * 10, 8.2, 3.1, 40) == ""  # train loss not far below val
    assert overfitting_warning(losses, 8.2, None, 40) == ""  # the first evaluation has nothing to rise from
