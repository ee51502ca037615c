"""`gptlab train --seq-len N` alone: the model's block_size and the batch follow it where the user did not set them,
and where something must still change, the first error names every flag to change."""

import re

import pytest

from gptlab.cli.main import main
from gptlab.cli.train import resolve_config
from gptlab.train import train_preset


def test_seq_len_sets_the_block_size_and_rounds_the_batch_to_whole_micro_batches(prepared):
    data = ["--data", str(prepared / "data")]
    base = train_preset("shakespeare-cpu")
    assert (base.seq_len, base.model.block_size, base.batch_tokens, base.micro_batch) == (128, 128, 2048, 16)
    config = resolve_config("shakespeare-cpu", [*data, "--seq-len", "256"])
    # 2048 tokens round to one micro-batch of 16 x 256 = 4096 (at least one)
    assert (config.seq_len, config.model.block_size, config.batch_tokens) == (256, 256, 4096)
    config = resolve_config("shakespeare-cpu", [*data, "--seq-len", "48", "--micro-batch", "4"])
    assert (config.model.block_size, config.batch_tokens) == (48, 11 * 4 * 48)  # 2048 / 192 = 10.7 -> 11 micro-batches
    assert config.batch_tokens % (config.micro_batch * config.seq_len) == 0
    explicit = resolve_config("shakespeare-cpu", [*data, "--seq-len", "64", "--model.block-size", "128", "--batch-tokens", "512"])
    assert (explicit.model.block_size, explicit.batch_tokens) == (128, 512)  # what the user set wins


@pytest.mark.parametrize(("extra", "named"), [
    (["--model.block-size", "128"], "set --model.block-size 256 (or a shorter --seq-len)"),
    (["--model.block-size", "128", "--batch-tokens", "2048"],
     "a batch of 2,048 tokens does not divide by --micro-batch 16 x --seq-len 256 = 4,096; "
     "set --model.block-size 256 and --batch-tokens 4096 (or a shorter --seq-len)"),
])
def test_what_must_still_change_is_named_in_the_first_error_with_hyphens(prepared, tmp_path, capsys, extra, named):
    out = tmp_path / "run"
    assert main(["train", "--data", str(prepared / "data"), "--out", str(out), "--seq-len", "256", *extra]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and not re.search(r"--[\w.-]*_", err)  # flags as the user types them
    assert not out.exists()


def test_train_with_only_seq_len_changed_runs_and_says_what_followed(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--data", str(prepared / "data"), "--out", str(out), "--seq-len", "48", "--micro-batch", "4",
            "--model.n-layer", "1", "--model.n-embd", "32", "--model.n-head", "2", "--max-steps", "1", "--eval-batches", "1",
            "--precision", "fp32", "--device", "cpu", "--sample-tokens", "4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "--seq-len 48: --model.block-size 48 and --batch-tokens 2112 follow it (set them to choose)" in printed
    assert "finished after 1 steps" in printed


def test_gptlab_run_brings_the_block_size_and_batch_along_with_train_seq_len():
    from gptlab.cli.run import resolve_config as resolve_run

    config, said = resolve_run(["--train.seq-len", "256"])
    assert (config.train.seq_len, config.train.model.block_size, config.train.batch_tokens) == (256, 256, 4096)
    assert said == "--train.seq-len 256: --train.model.block-size 256 and --train.batch-tokens 4096 follow it"
    config, said = resolve_run(["--train.seq-len", "64"])  # fine-tuning's 128-token sequences no longer fit: they follow too
    assert (config.train.model.block_size, config.train.batch_tokens, config.sft.seq_len, config.sft.batch_tokens) == (64, 2048, 64, 2048)
    assert said == "--train.seq-len 64: --train.model.block-size 64 and --sft.seq-len 64 follow it"
    config, _ = resolve_run(["--train.seq-len", "64", "--sft.seq-len", "32"])
    assert config.sft.seq_len == 32  # what the user set wins
    assert resolve_run([])[1] == ""
