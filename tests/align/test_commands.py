"""The alignment commands side by side (sft, dpo, grpo, rm, ppo): the flags they share, and bad input each refuses in one
line, before any compute, leaving no run folder, with the corrected command then running."""

import json
import re

import pytest

from gptlab.cli.main import main

# what every command that trains from --init takes, with the same meaning (gptlab.train.config.TrainConfig's fields)
SHARED = {"--init", "--preset", "--no-resume", "--force", "--out", "--max-steps", "--micro-batch", "--seq-len", "--seed",
          "--precision", "--device", "--compile", "--grad-clip", "--activation-checkpointing", "--optimizer.lr",
          "--schedule.kind", "--schedule.warmup-steps", "--parallel.fsdp", "--checkpoint-every", "--keep-last",
          "--log-every", "--time-limit", "--tensorboard", "--wandb", "--trackio", "--sample-every", "--task-every"}
# ... and what the two that read data with a val split take (grpo samples its prompts from --task)
SHARED_WITH_DATA = {"--data", "--tokenizer", "--batch-tokens", "--val-fraction", "--on-error", "--eval-every",
                    "--eval-batches", "--tasks", "--task-examples"}
COMMANDS = ("sft", "dpo", "grpo", "rm", "ppo")
WITH_DATA = ("sft", "dpo", "rm")  # the commands that read --data (grpo and ppo sample their prompts)
CHEAP = {  # the least each command needs to run a step on the tiny chat model
    "sft": ["--max-steps", "1", "--batch-tokens", "256", "--micro-batch", "4", "--seq-len", "64", "--task-examples", "2",
            "--eval-every", "0", "--precision", "fp32", "--device", "cpu"],
    "dpo": ["--max-steps", "1", "--batch-tokens", "256", "--micro-batch", "2", "--seq-len", "64", "--task-examples", "2",
            "--eval-every", "0", "--precision", "fp32", "--device", "cpu", "--val-fraction", "0"],
    "grpo": ["--max-steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--micro-batch", "4", "--max-new-tokens", "4",
             "--eval-examples", "2", "--eval-samples", "2", "--train-examples", "20", "--precision", "fp32", "--device", "cpu"],
    "rm": ["--max-steps", "1", "--batch-tokens", "256", "--micro-batch", "2", "--seq-len", "64", "--eval-every", "0",
           "--precision", "fp32", "--device", "cpu", "--val-fraction", "0"],
    "ppo": ["--max-steps", "1", "--rollout-prompts", "4", "--minibatches", "1", "--ppo-epochs", "1", "--micro-batch", "4",
            "--max-new-tokens", "4", "--eval-examples", "2", "--eval-samples", "2", "--train-examples", "20", "--precision", "fp32",
            "--device", "cpu"],
}


def help_flags(command: str, capsys) -> dict[str, str]:
    """{flag: its metavar or type} from `gptlab COMMAND --help` (options and the config fields' epilog)."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    return {flag: kind for flag, kind in re.findall(r"^  (--[a-z0-9.-]+)(?: ([A-Z][A-Z,.{}-]*))?", text, flags=re.M)}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptlab: error: ") and "Traceback" not in err, err
    return err


def test_the_alignment_commands_share_their_common_flags_with_the_same_types(capsys):
    flags = {command: help_flags(command, capsys) for command in COMMANDS}
    for command in COMMANDS:
        expected = SHARED - {"--task-every"} if command == "rm" else SHARED  # a reward model generates nothing to grade
        assert expected <= set(flags[command]), (command, sorted(expected - set(flags[command])))
    for command in WITH_DATA:
        expected = SHARED_WITH_DATA - {"--tasks", "--task-examples"} if command == "rm" else SHARED_WITH_DATA
        assert expected <= set(flags[command]), (command, sorted(expected - set(flags[command])))
    for flag in SHARED | SHARED_WITH_DATA:  # INT everywhere, or FLOAT, ...
        assert len({flags[command][flag] for command in COMMANDS if flag in flags[command]}) == 1, flag


@pytest.mark.parametrize("flag, instead", [("--eval-every", "--task-every"), ("--eval-batches", "--eval-examples"),
                                           ("--data", "--task")])
def test_grpo_refuses_the_flags_it_has_no_use_for_naming_what_to_pass(chat_model, tmp_path, capsys, flag, instead):
    out = tmp_path / "run"
    assert main(["grpo", "--init", str(chat_model), "--out", str(out), flag, "2", *CHEAP["grpo"]]) == 1
    assert instead in one_line_error(capsys) and not out.exists()


def test_dpo_takes_eval_batches_and_task_every_as_sft_does(chat_model, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["dpo", "--init", str(chat_model), "--data", "task:arithmetic[n=16,digits=1]", "--out", str(out),
            *CHEAP["dpo"], "--max-steps", "2", "--val-fraction", "0.5", "--eval-every", "1", "--eval-batches", "1",
            "--task-every", "1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {record["step"] for record in records if "arithmetic_accuracy" in record} == {1, 2}  # every step, as asked
    assert "step      1: val loss" in printed and "(2 pairs)" in printed  # 1 batch of micro_batch 2 at step 1
    assert "preference_accuracy" in printed  # before and after: every held-out pair


@pytest.mark.parametrize("command", COMMANDS)
def test_a_data_folder_given_to_init_is_named_as_one(command, prepared, tmp_path, capsys):
    out = tmp_path / "run"
    data = ["--data", "task:arithmetic[n=8]"] if command in WITH_DATA else []
    assert main([command, "--init", str(prepared / "data"), *data, "--out", str(out), *CHEAP[command]]) == 1
    err = one_line_error(capsys)
    assert f"--init {prepared / 'data'} is a prepared data folder (manifest.json), not a model" in err
    assert "config.json" not in err and not out.exists()


@pytest.mark.parametrize("command", ["dpo", "grpo", "rm", "ppo"])
def test_dpo_grpo_rm_and_ppo_refuse_fsdp_in_one_line_leaving_nothing(command, chat_model, tmp_path, capsys):
    out = tmp_path / "run"
    data = ["--data", "task:arithmetic[n=8,digits=1]"] if command in WITH_DATA else []
    assert main([command, "--init", str(chat_model), *data, "--out", str(out), "--parallel.fsdp", "true", *CHEAP[command]]) == 1
    err = one_line_error(capsys)
    assert f"gptlab {command} does not support --parallel.fsdp" in err and "before:" not in capsys.readouterr().out
    assert not out.exists()


SFT_ROWS = [{"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 4
DPO_ROWS = [{"prompt": "Say hi.", "chosen": "hi"}, {"prompt": "Say hi.", "chosen": "hi", "rejected": "hi"}] * 2


@pytest.mark.parametrize("command, rows, reasons, unit", [
    ("sft", SFT_ROWS, [":1: ", "'wizard'", ":3: "], "conversations"),
    ("dpo", DPO_ROWS, [':1: no "rejected" field', ":2: chosen and rejected are the same reply", ":3: "], "pairs"),
])
def test_sft_and_dpo_with_no_valid_rows_name_the_first_reasons_then_run_when_fixed(command, rows, reasons, unit,
                                                                                    chat_model, tmp_path, capsys):
    data, out = tmp_path / "rows.jsonl", tmp_path / "run"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = [command, "--init", str(chat_model), "--data", str(data), "--out", str(out), *CHEAP[command], "--tasks", "none"]
    assert main(args) == 1
    err = one_line_error(capsys)
    assert f"the mixture holds no {unit}: no valid row in {data}" in err and "and 1 more" in err
    assert all(reason in err for reason in reasons) and f"{data}:4:" not in err and not out.exists()
    fixed = ([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] if command == "sft"
             else [{"prompt": "Say hi.", "chosen": "hi", "rejected": "bye"}]) * 8
    data.write_text("".join(json.dumps(row) + "\n" for row in fixed))
    assert main(args) == 0 and "finished after 1 steps" in capsys.readouterr().out
