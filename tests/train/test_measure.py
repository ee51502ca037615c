"""The measured path of `gptlab model info --measure`: its figures' arithmetic and plumbing (never their
speed), the live-bytes counter against hand sums, and training_memory against that counter."""

import dataclasses
import math

import pytest
import torch

from gptlab.cli.main import main
from gptlab.model import preset
from gptlab.model.accounting import flops_per_token
from gptlab.runtime import GptlabError
from gptlab.train.fit import micro_batch_memory
from gptlab.train.measure import LiveTensorBytes, matmul_size, measure_training

CPU = torch.device("cpu")


def test_live_tensor_bytes_counts_each_storage_from_creation_to_release():
    with LiveTensorBytes() as live:
        a = torch.zeros(1000)  # 4,000 bytes
        b = torch.ones(2000)  # 8,000: 12,000 alive
        view = a[:10].view(2, 5)  # shares a's storage: nothing new
        a.add_(1)  # in place: nothing new
        del a, view  # a's storage is freed with its last view: 8,000 alive
        c = b[:500] * 2  # a new 2,000: 10,000 alive
        assert live.live == 10_000
    assert live.peak == 12_000
    del b, c


def test_measure_training_gives_positive_finite_figures_that_add_up():
    config = preset("gpt2-tiny", vocab_size=512, block_size=32)
    m = measure_training(config, batch_size=2, seq_len=32, precision="fp32", device=CPU, steps=1)
    figures = {field.name: getattr(m, field.name) for field in dataclasses.fields(m)}
    assert all(math.isfinite(value) and value > 0 for value in figures.values() if isinstance(value, (int, float)))
    # gpt2-tiny at T = 32 (tests/model/test_accounting.py): 6N = 6 x 41,856, attention 12 L d T = 12 x 2 x 32 x 32
    assert m.flops_per_token == flops_per_token(config, 32)["training"] == 251_136 + 24_576
    assert m.tokens_per_second == pytest.approx(2 * 32 / m.seconds_per_step)
    assert m.achieved_flops == pytest.approx(m.flops_per_token * m.tokens_per_second)
    assert m.mfu == pytest.approx(m.achieved_flops / m.peak_flops)
    assert (m.device, m.precision, m.matmul_size, m.memory_kind) == ("cpu", "fp32", 1024, "peak live tensor bytes")
    assert m.estimated_memory == micro_batch_memory(config, 2, 32, precision="fp32", device=CPU)


def test_matmul_size_is_the_mlp_width_within_bounds():
    cuda = torch.device("cuda")  # only named: nothing runs on it
    assert matmul_size(preset("gpt2"), cuda) == 3072 and matmul_size(preset("gpt2"), CPU) == 2048
    assert matmul_size(preset("gpt2-tiny"), cuda) == 1024  # 128 wide: raised to 1024
    assert matmul_size(preset("gpt2", n_embd=1600, n_head=25), cuda) == 6400


@pytest.mark.parametrize(("name", "precision"), [("gpt2-mini", "fp32"), ("gpt2-mini", "bf16"), ("llama-mini", "fp32")])
def test_training_memory_estimate_is_the_measured_peak_or_a_little_more(name, precision):
    """The estimate counts every gradient at once; at the peak (backward's start) the blocks' are not made yet."""
    config = preset(name, block_size=64, vocab_size=8192)  # a smaller vocabulary: bf16 on CPU is slow
    m = measure_training(config, batch_size=4, seq_len=64, precision=precision, device=CPU, steps=1)
    assert 0.85 * m.estimated_memory <= m.peak_memory <= 1.03 * m.estimated_memory


def test_measure_training_refuses_what_it_cannot_measure():
    config = preset("gpt2-tiny", vocab_size=512, block_size=32)
    with pytest.raises(GptlabError, match="2 warm-up steps"):
        measure_training(config, batch_size=1, seq_len=32, precision="fp32", device=CPU, warmup=1)
    with pytest.raises(GptlabError, match="longer than the model's context"):
        measure_training(config, batch_size=1, seq_len=64, precision="fp32", device=CPU)


MEASURE_ARGV = ["model", "info", "--preset", "gpt2-tiny", "--measure", "--device", "cpu", "--steps", "1", "--batch-size", "2",
                "--seq-len", "32"]


def test_cli_model_info_measure_prints_the_measured_figures_beside_the_datasheet_line(capsys):
    assert main([*MEASURE_ARGV, "--precision", "fp32"]) == 0  # asked for: auto differs between CPUs (test below)
    out = capsys.readouterr().out
    assert "throughput  datasheet arithmetic, h100 peak 989 TFLOP/s" in out
    assert "measured    cpu, fp32, batch 2 x 32: " in out and "1 steps after 2 warm-up" in out
    assert "this device's peak" in out and "(fp32 1024 x 1024 matmuls): MFU " in out
    assert "GiB measured (peak live tensor bytes)" in out and "estimate / measured" in out
    assert "fp32 activations" in out  # the table follows the measured precision


@pytest.mark.parametrize(("native_bf16", "expected"), [(True, "bf16"), (False, "fp32")])
def test_cli_model_info_measure_auto_takes_what_training_picks_on_this_cpu(native_bf16, expected, monkeypatch, capsys):
    import gptlab.runtime.device as device

    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: native_bf16)  # both kinds of CPU, on any host
    assert main(MEASURE_ARGV) == 0
    out = capsys.readouterr().out
    assert f"measured    cpu, {expected}, batch 2 x 32: " in out and f"{expected} activations" in out


@pytest.mark.parametrize(("extra", "message"), [(["--warmup", "1"], "--warmup must be at least 2"),
                                                 (["--precision", "fp16"], "fp16 training needs a GPU")])
def test_cli_model_info_measure_errors_in_one_line(extra, message, capsys):
    assert main(["model", "info", "--preset", "gpt2-tiny", "--measure", "--device", "cpu", *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
