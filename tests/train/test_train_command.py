"""`gptlab train` as a user runs it: resume, --no-resume, --force, --time-limit, Ctrl-C, defaults, --init-from."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptlab.cli.main import main
from gptlab.load.checkpoints import list_checkpoints
from gptlab.model.io import load_model
from tests.conftest import with_ctrl_c

ROOT = Path(__file__).resolve().parents[2]


def tiny(prepared: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(prepared / "data"), "--tokenizer", str(prepared / "tokenizer"), "--out", str(out),
            "--model.n-layer", "2", "--model.n-head", "2", "--model.n-embd", "32", "--model.block-size", "32",
            "--seq-len", "32", "--micro-batch", "4", "--batch-tokens", "128", "--max-steps", "6", "--precision", "fp32",
            "--device", "cpu", "--eval-every", "3", "--eval-batches", "2", "--checkpoint-every", "3", "--log-every", "1",
            "--schedule.warmup-steps", "2", "--sample-tokens", "8", *extra]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "model.safetensors")


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_train_command_resumes_the_run_in_out_and_then_has_nothing_left_to_do(prepared, tmp_path, capsys):
    assert main(tiny(prepared, tmp_path / "straight")) == 0
    assert main(tiny(prepared, tmp_path / "run", "--max-steps=6")) == 0
    last = tmp_path / "run" / "checkpoints" / "step_000006"
    __import__("shutil").rmtree(last)
    capsys.readouterr()
    assert main(tiny(prepared, tmp_path / "run")) == 0
    assert "resumed from" in capsys.readouterr().out
    assert losses(tmp_path / "run") == losses(tmp_path / "straight")
    assert main(tiny(prepared, tmp_path / "run")) == 0
    assert "already finished" in capsys.readouterr().out


def test_train_command_no_resume_is_refused_on_a_run_and_force_starts_over(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny(prepared, out)) == 0
    capsys.readouterr()
    assert main(tiny(prepared, out, "--no-resume", "--max-steps", "3")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other settings (max_steps 6 -> 3)" in err and "--force" in err
    assert [p.name for p in list_checkpoints(out)] == ["step_000003", "step_000006"]
    assert main(tiny(prepared, out, "--no-resume", "--max-steps", "3", "--force")) == 0
    assert [p.name for p in list_checkpoints(out)] == ["step_000003"] and len(losses(out)) == 3


def test_train_command_time_limit_stops_early_and_a_rerun_finishes_the_same_run(prepared, tmp_path, capsys):
    assert main(tiny(prepared, tmp_path / "straight")) == 0
    out = tmp_path / "run"
    assert main(tiny(prepared, out, "--time-limit", "1e-9")) == 0
    assert "time limit after 1 steps" in capsys.readouterr().out
    assert [p.name for p in list_checkpoints(out)] == ["step_000001"]
    assert main(tiny(prepared, out)) == 0  # the time limit may change between runs
    assert losses(out) == losses(tmp_path / "straight")


def test_train_command_ctrl_c_saves_a_checkpoint_exits_130_and_the_run_resumes(prepared, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "gptlab", *tiny(prepared, out, "--max-steps", "100000", "--checkpoint-every", "0")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=with_ctrl_c)
    deadline = time.monotonic() + 120
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the run to start, not timing it
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    step = int(stdout.split("interrupted at step ")[1].split(":")[0])
    assert list_checkpoints(out)[-1].name == f"step_{step:06d}" and "Traceback" not in stderr
    elapsed = json.loads((list_checkpoints(out)[-1] / "trainer_state.json").read_text())["elapsed"]
    budget = str(elapsed * (1 + 1e-9))  # the run's time so far counts: this budget leaves it one step
    assert main(tiny(prepared, out, "--max-steps", "100000", "--checkpoint-every", "0", "--time-limit", budget)) == 0
    assert list_checkpoints(out)[-1].name == f"step_{step + 1:06d}"


def test_train_command_takes_the_models_vocabulary_from_the_data(prepared, tmp_path, capsys):
    """The preset says 4096 ids; the data's tokenizer has 512: the model gets 512 unless told otherwise."""
    assert main(tiny(prepared, tmp_path / "auto", "--max-steps", "1")) == 0
    config = json.loads((list_checkpoints(tmp_path / "auto")[-1] / "config.json").read_text())
    assert config["vocab_size"] == 512
    assert main(tiny(prepared, tmp_path / "wide", "--max-steps", "1", "--model.vocab-size", "1024")) == 0
    assert "the model has 1,024 ids, the data's tokenizer 512" in capsys.readouterr().out
    assert json.loads((list_checkpoints(tmp_path / "wide")[-1] / "config.json").read_text())["vocab_size"] == 1024


def test_train_command_init_from_a_run_starts_from_its_weights(prepared, tmp_path, capsys):
    assert main(tiny(prepared, tmp_path / "base")) == 0
    base = list_checkpoints(tmp_path / "base")[-1]
    # lr 0 and no decay: the fine-tuned weights stay the ones it started from
    args = ["train", "--init-from", str(tmp_path / "base"), "--data", str(prepared / "data"), "--out", str(tmp_path / "tuned"),
            "--seq-len", "32", "--micro-batch", "4", "--batch-tokens", "128", "--max-steps", "2", "--precision", "fp32",
            "--device", "cpu", "--optimizer.lr", "0", "--model.dropout", "0.1"]
    assert main(args) == 0
    tuned = list_checkpoints(tmp_path / "tuned")[-1]
    for name, tensor in weights(base).items():
        assert torch.equal(weights(tuned)[name], tensor), name
    config = json.loads((tuned / "config.json").read_text())
    assert config["n_layer"] == 2 and config["dropout"] == 0.1
    assert (tuned / "tokenizer" / "tokenizer.json").is_file()  # the base run's tokenizer came along
    capsys.readouterr()
    assert main([*args[:-2], "--model.n-layer", "3", "--out", str(tmp_path / "other")]) == 1
    assert "sets the model; drop --model.n-layer" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_train_command_defaults_to_the_tokenizer_saved_with_the_data(prepared, tmp_path, capsys):
    """No --tokenizer: the data folder's own tokenizer.json goes into every checkpoint, so sampling just works."""
    args = tiny(prepared, tmp_path / "run", "--max-steps", "1")
    i = args.index("--tokenizer")
    assert main(args[:i] + args[i + 2 :]) == 0
    checkpoint = list_checkpoints(tmp_path / "run")[-1]
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["tokenizer"] == str(prepared / "data")
    assert (checkpoint / "tokenizer" / "tokenizer.json").read_bytes() == (prepared / "data" / "tokenizer.json").read_bytes()
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(tmp_path / "run"), "--prompt", "A", "--max-new-tokens", "3", "--seed", "0"]) == 0


def test_depth_is_one_dial_for_shape_lr_batch_and_steps(prepared):
    """--depth 3: 3 layers of 192 in heads of 64; lr by sqrt of the widths; batch from DeepSeek's fit at a
    Chinchilla run's compute; steps for 20 tokens per parameter. Explicit flags still win."""
    import math

    from gptlab.cli.train import resolve_config
    from gptlab.model import GPT
    from gptlab.train import train_preset

    data = ["--data", str(prepared / "data")]
    config = resolve_config("shakespeare-cpu", data, depth=3)
    base = train_preset("shakespeare-cpu")
    assert (config.model.n_layer, config.model.n_embd, config.model.n_head, config.model.head_dim) == (3, 192, 3, 64)
    scale = math.sqrt(base.model.n_embd / 192)
    assert config.optimizer.lr == base.optimizer.lr * scale
    assert (config.optimizer.embedding_lr, config.optimizer.head_lr) == (base.optimizer.embedding_lr * scale, base.optimizer.head_lr * scale)
    params = sum(p.numel() for p in GPT(config.model).parameters())  # brute force: the built model
    fit = 0.292 * (6 * params * 20 * params) ** 0.3271
    assert config.batch_tokens == 2 ** int(math.log2(fit)) and config.batch_tokens % (config.micro_batch * config.seq_len) == 0
    assert config.max_steps == math.ceil(20 * params / config.batch_tokens)
    wider = resolve_config("shakespeare-cpu", [*data, "--model.n-head", "4", "--max-steps", "7"], depth=3)
    assert (wider.model.n_head, wider.max_steps, wider.model.n_embd) == (4, 7, 192)


@pytest.mark.parametrize("depth", ["-1", "0"])
def test_depth_refuses_bad_values(prepared, capsys, depth):
    assert main(tiny(prepared, prepared / "never", "--depth", depth)) == 1
    assert f"--depth must be at least 1, got {depth}" in capsys.readouterr().err
    assert not (prepared / "never").exists()


def test_train_command_sets_every_model_switch_from_flags(prepared, tmp_path):
    """Every switch is a --model.FIELD flag; the run trains, samples, and its checkpoint holds the switches."""
    out = tmp_path / "run"
    switches = ["--model.position", "rotary", "--model.norm", "rms", "--model.activation", "relu2", "--model.qk-norm", "true",
                "--model.tie-embeddings", "false", "--model.logit-softcap", "15", "--model.zero-init", "true",
                "--model.attn-window", "8", "--model.window-pattern", "SL"]
    assert main(tiny(prepared, out, *switches)) == 0
    config = load_model(list_checkpoints(out)[-1]).config
    assert (config.position, config.norm, config.activation, config.qk_norm, config.tie_embeddings) == ("rotary", "rms", "relu2", True, False)
    assert (config.logit_softcap, config.zero_init, config.layer_windows) == (15.0, True, (8, 0))
    assert losses(out)[-1] < losses(out)[0]


def test_train_command_takes_micro_batch_0_as_auto_and_saves_the_pick(prepared, tmp_path, capsys):
    """The host has far more than a 2-layer model's few MB free: auto takes all 4 sequences of the step at once."""
    out = tmp_path / "run"
    assert main(tiny(prepared, out, "--micro-batch", "0", "--max-steps", "3")) == 0
    printed = capsys.readouterr().out
    assert "128 tokens/step = 1 x 4 x 32" in printed and "micro-batch auto: 4 (estimated " in printed
    assert json.loads((out / "train_config.json").read_text())["micro_batch"] == 4


def _fit_file(path, dial) -> str:
    import json

    path.write_text(json.dumps({"format": "gptlab-fit", "version": 1, "depth_dial": dial}))
    return str(path)


def test_depth_from_fit_trains_the_fits_compute_optimal_tokens_at_its_lr(prepared, tmp_path):
    """--from-fit: D is the fitted N_opt(C) = k C^a inverted at the model's N (counted as the fit counts), and
    lr = k N^g; the embedding and head lrs move by the same factor. Checked against the inversion done by hand."""
    import math

    from gptlab.cli.train import resolve_config
    from gptlab.model import GPT
    from gptlab.train import train_preset

    dial = {"count": "non_embedding", "params": {"coefficient": 0.05, "exponent": 0.6}, "source": "isoflop",
            "lr": {"coefficient": 0.2, "exponent": -0.3}}
    fit = _fit_file(tmp_path / "fit.json", dial)
    config = resolve_config("shakespeare-cpu", ["--data", str(prepared / "data")], depth=3, from_fit=fit)
    params = GPT(config.model).num_params(embeddings=False)  # brute force: the built model, without embeddings
    budget = (params / 0.05) ** (1 / 0.6)  # N = k C^a solved for C
    tokens = budget / (6 * params)
    assert config.max_steps == math.ceil(tokens / config.batch_tokens)
    assert config.optimizer.lr == pytest.approx(0.2 * params ** -0.3)
    base = train_preset("shakespeare-cpu").optimizer
    factor = config.optimizer.lr / base.lr
    assert (config.optimizer.embedding_lr, config.optimizer.head_lr) == pytest.approx((base.embedding_lr * factor, base.head_lr * factor))
    no_lr = resolve_config("shakespeare-cpu", ["--data", str(prepared / "data")], depth=3,
                           from_fit=_fit_file(tmp_path / "nolr.json", {**dial, "lr": None}))
    assert no_lr.max_steps == config.max_steps and no_lr.optimizer.lr == base.lr * math.sqrt(128 / 192)  # the sqrt-width rule


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ({"format": "other"}, "is not a fit made by `gptlab fit`"),
    ({"format": "gptlab-fit", "version": 1, "depth_dial": None}, "has no compute-optimal law"),
    ({"format": "gptlab-fit", "version": 1, "depth_dial": {"count": "total", "params": {"coefficient": 1.0, "exponent": -0.5}}},
     "bigger budgets want smaller models"),
])
def test_from_fit_refuses_bad_files_in_one_line(prepared, tmp_path, capsys, content, message):
    import json

    fit = tmp_path / "fit.json"
    if content is not None:
        fit.write_text(json.dumps(content))
    assert main(tiny(prepared, tmp_path / "never", "--depth", "2", "--from-fit", str(fit))) == 1
    assert message in capsys.readouterr().err and not (tmp_path / "never").exists()


def test_from_fit_needs_depth(prepared, tmp_path, capsys):
    assert main(tiny(prepared, tmp_path / "never", "--from-fit", str(tmp_path / "fit.json"))) == 1
    assert "pass --depth N too" in capsys.readouterr().err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_eval_force_into_a_training_run_is_refused_and_the_run_stays_a_training_run(prepared, tmp_path, capsys):
    """--force replaces a command's own output, never another command's folder: the run's record and files stay."""
    from tests.eval.test_cli_card import write_tasks

    run = tmp_path / "run"
    assert main(tiny(prepared, run, "--max-steps=3")) == 0
    before = snapshot(run)
    science, _ = write_tasks(tmp_path / "data")
    capsys.readouterr()
    for force in ((), ("--force",)):
        assert main(["eval", str(run), "--suite", "core", "--tasks", "arc_easy", "--task-data", f"arc_easy={science}",
                     "--precision", "fp32", "--out", str(run), *force]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"--out {run} holds a `gptlab train` run, not a `gptlab eval` one" in err and "pass another --out" in err
        assert snapshot(run) == before
    assert main(tiny(prepared, run, "--max-steps=3")) == 0
    assert "already finished" in capsys.readouterr().out


def test_sample_tokens_0_trains_without_samples_and_exits_0(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny(prepared, out, "--max-steps=3", "--sample-tokens=0", "--sample-every", "1")) == 0
    printed = capsys.readouterr().out
    assert "sample:" not in printed and len(losses(out)) == 3 and not (out / "samples.jsonl").exists()
    assert main(tiny(prepared, tmp_path / "sampled", "--max-steps=3")) == 0
    assert "sample:" in capsys.readouterr().out  # the same run with samples prints them (what 0 turns off)


@pytest.mark.parametrize("extra, message", [
    (["--model.moe.top-k", "5"], "moe.top_k 5 does nothing in a dense model (moe.n_experts 0): set --model.moe.n-experts N "
                                 "for a mixture of experts, or leave out --model.moe.top-k"),
    (["--model.moe.aux-loss", "0.1"], "leave out --model.moe.aux-loss"),
    (["--parallel.expert-parallel", "true"], "--parallel.expert-parallel shards the experts of a mixture of experts, and "
                                             "this model is dense (moe.n_experts 0)"),
    (["--parallel.expert-parallel", "true", "--model.moe.n-experts", "4", "--compile", "true"],
     "expert_parallel with compile is not supported here"),
])
def test_train_refuses_silent_moe_and_expert_parallel_combinations_in_one_process(prepared, tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    assert main(tiny(prepared, out, *extra)) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
