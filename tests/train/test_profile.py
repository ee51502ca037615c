"""Profiling against what it measures: the accounting's FLOPs and memory beside torch's own counts, activation
checkpointing against the plain step, and `gptlab profile`'s files and errors."""

import dataclasses
import json
import os
import shutil

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gptlab.cli.main import main
from gptlab.load.checkpoints import list_checkpoints
from gptlab.model import GPT, preset
from gptlab.model.accounting import activation_bytes_per_layer, flops_per_token, training_memory
from gptlab.model.io import save_model
from gptlab.runtime import check_out_dir
from gptlab.train import Trainer
from gptlab.train.measure import LiveTensorBytes
from gptlab.train.optim import OptimizerConfig, build_optimizer
from gptlab.train.profile import PROFILE_FILES, ProfileConfig, describe, profile_training, timeline_peak

from .conftest import tiny_config

CPU = torch.device("cpu")
B, T = 4, 32


def batch(config, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (2, B, T), generator=generator)


def counted_flops(model: GPT, x, y) -> int:
    with FlopCounterMode(display=False) as counter:
        model(x, y)[1].backward()
    return counter.get_total_flops()


def vector_params(config) -> int:
    """Biases and norm gains: parameters in N that no matmul multiplies."""
    return sum(p.numel() for p in GPT(config).parameters() if p.dim() < 2)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_flops_per_token_equal_the_flop_counter_over_forward_and_backward(name):
    """6N + 12 L d T is every matmul of a training step: FlopCounterMode counts forward (2 FLOPs per weight and
    token, QK^T and AV) and backward (twice that: the gradients of the inputs and of the weights), the lm_head
    over the padded rows, attention over the full T x T square (neither convention halves it for the mask).

    The one gap, exact: N is every non-embedding parameter (PaLM's and nanoGPT's convention), biases and norm
    gains included, which no matmul multiplies: 6 x 896 of 275,712 FLOPs per token for gpt2-tiny (1.9%),
    6 x 121,344 of 6 x 123.7M for GPT-2 (0.1%)."""
    config = preset(name)
    torch.manual_seed(0)
    model = GPT(config).set_attention("math")  # math: its two attention matmuls are plain ops the counter knows
    x, y = batch(config)
    expected = flops_per_token(config, T)["training"] - 6 * vector_params(config)
    assert counted_flops(model, x, y) == expected * B * T


def test_the_flop_counter_misses_only_attention_under_cpu_sdpa():
    """The CPU's fused SDPA kernel (_scaled_dot_product_flash_attention_for_cpu) has no FLOP formula in torch
    2.13: counted, the step is the dense 6N alone. gptlab profile counts with math attention for that reason."""
    config = preset("gpt2-tiny")
    torch.manual_seed(0)
    x, y = batch(config)
    flops = flops_per_token(config, T)
    dense = flops["dense"] - 6 * vector_params(config)
    assert counted_flops(GPT(config), x, y) == dense * B * T  # a torch with the formula: (dense + attention) x B T


def _unique_bytes(tensors) -> int:
    storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes() for tensor in tensors}
    return sum(storages.values())


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_parameters_gradients_and_adamw_states_are_the_estimate_byte_for_byte(name):
    config = preset(name)
    model = GPT(config)
    optimizer = build_optimizer(model, OptimizerConfig(), "cpu")
    x, y = batch(config)
    model(x, y)[1].backward()
    gradients = _unique_bytes(p.grad for p in model.parameters())
    optimizer.step()
    states = [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t) and t.dim() > 0]
    estimate = training_memory(config, B, T, param_dtype="fp32", amp="fp32", optimizer="adamw")
    assert _unique_bytes(model.parameters()) == estimate["parameters"]  # tied weights once
    assert gradients == estimate["gradients"]
    assert _unique_bytes(states) == estimate["optimizer"]  # exp_avg, exp_avg_sq; the step counts are scalars


def saved_tensor_bytes(config, *, dropout: float = 0.0) -> int:
    """Bytes of the storages autograd saves for backward during a forward with the loss, parameters left out
    (they exist anyway). A storage saved twice (q, k, v are views of one qkv output) counts once."""
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(config, dropout=dropout)).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    x, y = batch(config)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(x, y)[1]
    del loss
    return sum(saved.values())


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_activation_estimate_is_the_saved_tensor_bytes_of_one_block(name):
    """One block's saved bytes inside the model's forward: the step with 4 blocks minus the step with 2, halved (the
    embeddings, final norm, head and loss cancel; tests/model/test_accounting.py checks a block alone). The estimate
    leaves out a few floats per token, 1.2% and 0.7% here: SDPA's logsumexp (B x heads x T in fp32) and the norms'
    statistics (LayerNorm's mean and rstd, RMSNorm's rstd). 3% allows that and no missing tensor."""
    config = preset(name, block_size=T)
    two, four = (saved_tensor_bytes(dataclasses.replace(config, n_layer=n)) for n in (2, 4))
    estimate = activation_bytes_per_layer(config, B, T, param_dtype="fp32", amp="fp32", flash_attention=True)
    assert estimate <= (four - two) / 2 <= 1.03 * estimate


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    """Dropout on: the recomputed forward replays the RNG, so it draws the same masks as the first."""
    config = preset("llama-tiny", dropout=0.1)
    x, y = batch(config)
    results = []
    for on in (False, True):
        torch.manual_seed(0)
        model = GPT(config).train().set_activation_checkpointing(on)
        torch.manual_seed(1)
        loss = model(x, y)[1]
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (plain_loss, plain), (loss, grads) = results
    assert torch.equal(loss, plain_loss)
    for name, grad in plain.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-6, atol=1e-7)


def peak_step_bytes(config, checkpointing: bool) -> int:
    """The most tensor bytes alive at once over a forward and backward, from the model's build."""
    x, y = batch(config)
    with LiveTensorBytes() as live:
        model = GPT(config).train().set_activation_checkpointing(checkpointing)
        model(x, y)[1].backward()
    return live.peak


def test_activation_checkpointing_saves_the_memory_the_accounting_expects():
    """6 blocks whose activations outweigh the rest: checkpointing keeps 6 block inputs and one block's activations
    instead of 6 blocks'. Measured (live tensor bytes, deterministic: the same ops on any CPU) the peak falls to 46%,
    and by 90% of the estimated saving: at each peak other tensors are alive too (the gradients made so far, the
    recomputed block's temporaries), which the estimate does not place at the same moment."""
    config = preset("gpt2-tiny", n_layer=6, block_size=T, vocab_size=64)
    plain, checkpointed = peak_step_bytes(config, False), peak_step_bytes(config, True)
    estimates = [training_memory(config, B, T, amp="fp32", activation_checkpointing=on)["activations"] for on in (False, True)]
    saving = estimates[0] - estimates[1]
    assert checkpointed < 0.6 * plain
    assert 0.8 * saving <= plain - checkpointed <= 1.1 * saving


def test_trainer_resumes_with_activation_checkpointing_as_the_same_run(prepared, tmp_path):
    """The switch is free to change on resume (it recomputes the same numbers): 3 steps plain, then 3 checkpointed
    equal 6 plain steps, dropout on."""
    model = dataclasses.replace(tiny_config(prepared, tmp_path).model, dropout=0.1)
    config = tiny_config(prepared, tmp_path / "straight", model=model)
    straight = Trainer(config, log=lambda *_: None).fit()
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(list_checkpoints(tmp_path / "resumed")[-1])
    resumed_config = dataclasses.replace(config, out=str(tmp_path / "resumed"), activation_checkpointing=True)
    resumed = Trainer(resumed_config, log=lambda *_: None).fit()
    assert resumed.losses == pytest.approx(straight.losses[3:], rel=1e-6)


def test_profile_training_writes_its_files_and_reports_the_checkpointing_trade(tmp_path):
    config = ProfileConfig(model=preset("gpt2-tiny", n_layer=4, block_size=T), batch_size=B, steps=2, warmup=2,
                           trace_steps=1, activation_checkpointing=True, peak_seconds=0.01)
    summary = profile_training(config, CPU, tmp_path / "prof")
    assert sorted(summary["files"]) == sorted(path.name for path in (tmp_path / "prof").iterdir())
    assert set(summary["files"]) == {"profile.json", "ops.txt", "trace.json", "memory_timeline.json"}  # no CUDA snapshot
    assert json.loads((tmp_path / "prof" / "profile.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["flops_per_token"]["counted"] > summary["flops_per_token"]["accounting"]  # the recomputed forwards
    without = summary["without_checkpointing"]
    assert summary["memory"]["peak"] < without["memory"]["peak"]
    assert summary["memory"]["estimate"]["activations"] < without["memory"]["estimate"]["activations"]
    assert any(line.startswith("checkpoint  peak ") for line in describe(summary))


def test_timeline_peak_is_the_largest_moment_by_category():
    timeline = [[1, 2, 3], [[0, 10, 0, 0, 0, 5, 0, 0, 0], [0, 10, 20, 0, 0, 30, 0, 0, 0], [0, 10, 20, 0, 0, 0, 0, 0, 0]]]
    assert timeline_peak(timeline) == {"total": 60, "parameter": 10, "optimizer_state": 20, "input": 0, "temporary": 0,
                                       "activation": 30, "gradient": 0, "autograd_detail": 0, "unknown": 0}


def test_cli_profile_writes_the_trace_ops_timeline_and_summary(tmp_path, capsys):
    out = tmp_path / "prof"
    argv = ["profile", "--preset", "gpt2-tiny", "--model.n-layer", "3", "--batch", "2", "--seq-len", "32", "--steps", "2",
            "--warmup", "2", "--trace-steps", "1", "--device", "cpu", "--precision", "fp32", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "profile.json").read_text())
    assert summary["format"] == "gptlab-profile" and summary["config"]["model"]["n_layer"] == 3
    assert {"seconds", "tokens_per_second", "flops_per_token", "achieved_flops", "peak_flops", "peak_source", "mfu",
            "memory", "machine"} <= summary.keys()
    assert set(summary["seconds"]) == {"forward", "backward", "optimizer", "step"}
    model = preset("gpt2-tiny", n_layer=3)
    assert summary["flops_per_token"]["accounting"] == flops_per_token(model, 32)["training"]
    assert summary["flops_per_token"]["counted"] == flops_per_token(model, 32)["training"] - 6 * vector_params(model)
    assert summary["peak_source"].startswith("measured: fp32 1024 x 1024 matmuls")
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    assert timeline_peak(json.loads((out / "memory_timeline.json").read_text()))["total"] > 0
    assert "Self CPU" in (out / "ops.txt").read_text()
    for start in ("profile     gpt2-tiny on cpu", "time        forward ", "FLOPs/token ", "MFU         ", "memory      peak "):
        assert start in printed
    assert sorted(check_out_dir(out, PROFILE_FILES)) == sorted(summary["files"])  # a rerun may replace them all


def test_cli_profile_reads_the_model_of_a_saved_folder(tmp_path, capsys):
    model = preset("llama-tiny", n_layer=1)
    save_model(GPT(model), tmp_path / "model")
    argv = ["profile", "--checkpoint", str(tmp_path / "model"), "--batch", "2", "--steps", "1", "--warmup", "2",
            "--trace-steps", "1", "--device", "cpu", "--out", str(tmp_path / "prof")]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert summary["config"]["model"] == dataclasses.asdict(model) and summary["seq_len"] == model.block_size
    assert summary["config"]["optimizer"]["kind"] == "adamw"
    assert f"profile     {tmp_path / 'model'} on cpu" in capsys.readouterr().out


def test_cli_profile_refuses_a_folder_holding_something_else(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["profile", "--preset", "gpt2-tiny", "--device", "cpu", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "notes.txt" in err and "pass a new or empty --out" in err and err.count("\n") == 1
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--preset", "gpt9"], "unknown preset 'gpt9'"),
    (["--checkpoint", "/nonexistent/run"], "no model at /nonexistent/run"),
    (["--preset", "gpt2-tiny", "--batch", "0"], "--batch must be at least 1, got 0"),
    (["--preset", "gpt2-tiny", "--seq-len", "65"], "seq_len 65 is longer than the model's context (64)"),
    (["--preset", "gpt2-tiny", "--model.n-layers", "3"], "unknown option --model.n-layers"),
    (["--preset", "gpt2-tiny", "--warmup", "1"], "--warmup must be at least 2"),
])
def test_cli_profile_errors_in_one_line(tmp_path, capsys, extra, message):
    assert main(["profile", *extra, "--device", "cpu", "--out", str(tmp_path / "prof")]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "prof").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_profile_training_on_cuda_writes_the_allocator_snapshot_and_uses_the_datasheet_peak(tmp_path):
    config = ProfileConfig(model=preset("gpt2-tiny", block_size=T), batch_size=B, precision="bf16", steps=2, warmup=2,
                           trace_steps=1, peak_seconds=0.05)
    summary = profile_training(config, torch.device("cuda"), tmp_path / "prof")
    assert "memory_snapshot.pickle" in summary["files"] and (tmp_path / "prof" / "memory_snapshot.pickle").stat().st_size
    assert summary["memory"]["kind"] == "torch.cuda.max_memory_allocated" and summary["memory"]["peak"] > 0
    known = any(key in torch.cuda.get_device_name().lower() for key in ("a100", "h100", "h200"))
    assert summary["peak_source"].startswith("datasheet" if known else "measured")
    assert "Self CUDA" in (tmp_path / "prof" / "ops.txt").read_text()


def test_cli_profile_says_each_phase_as_it_begins_and_keeps_the_profilers_usdt_lines_off_stderr(tmp_path, capfd):
    """capfd: the profiler's C++ side writes to fd 2 itself, past sys.stderr."""
    argv = ["profile", "--preset", "gpt2-tiny", "--model.n-layer", "1", "--batch", "2", "--seq-len", "16", "--steps", "1",
            "--warmup", "2", "--trace-steps", "1", "--device", "cpu", "--precision", "fp32", "--activation-checkpointing",
            "--out", str(tmp_path / "prof")]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    progress = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("profile: ")]
    assert [line.split(" ")[0] for line in progress] == ["building", "tracing", "writing", "recording", "writing", "counting",
                                                         "finding", "the"]
    assert progress[1] == "tracing 1 steps with torch.profiler" and "without activation checkpointing" in progress[-1]
    assert out.index("profile: building") < out.index("profile     gpt2-tiny on cpu")  # before the summary
    assert "USDT" not in err and "profiler_start" not in err and "SyncActivityProfilerHandler" not in err


def test_without_kineto_lines_passes_every_other_stderr_line_on(capfd):
    from gptlab.train.profile import without_kineto_lines

    with without_kineto_lines():
        os.write(2, b"USDT:2026-11-26 09:36:44 14716:14716 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning of the profiled code\n")
        os.write(2, b"STAGE:2026-11-26 09:37:39 15025:15025 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "a warning of the profiled code\nafter\n"
