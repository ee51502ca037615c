"""`gptlab profile` on a mixture of experts: the router's, dispatch's and experts' share of the step from the
model's record_function ranges, and FLOPs/MFU from the active parameters (checked by FlopCounterMode)."""

import json

import torch

from gptlab.cli.main import main
from gptlab.model import GPT, preset
from gptlab.model.accounting import flops_per_token, param_counts
from gptlab.train.profile import MOE_RANGES, moe_ranges


def test_moe_forward_marks_the_router_dispatch_and_experts_ranges():
    torch.manual_seed(0)
    model = GPT(preset("moe-tiny")).float().train()
    x = torch.randint(0, 512, (2, 16))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with torch.profiler.record_function("forward"):
            model(x, x)[1].backward()
    events = profiler.key_averages()
    counts = {event.key: event.count for event in events if event.key in MOE_RANGES}
    assert counts == {"moe.router": 2, "moe.dispatch": 4, "moe.experts": 2}  # 2 sparse layers; dispatch in and out
    ranges = moe_ranges(events, cuda=False)
    assert all(value > 0 for value in ranges["seconds"].values())
    assert 0 < sum(ranges["share"].values()) < 1  # inside the forward range, which also holds attention and the head


def test_cli_profile_moe_reports_the_router_share_and_active_flops(tmp_path, capsys):
    out = tmp_path / "prof"
    argv = ["profile", "--preset", "moe-tiny", "--batch", "2", "--seq-len", "32", "--steps", "2",
            "--warmup", "2", "--trace-steps", "1", "--device", "cpu", "--precision", "fp32", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "profile.json").read_text())
    model = preset("moe-tiny")  # grouped experts; the count runs the per-expert loop (grouped_mm has no FLOP formula)
    flops, counts = flops_per_token(model, 32), param_counts(model)
    vectors = sum(p.numel() for p in GPT(model).parameters() if p.dim() < 2)  # norm gains: in N, in no matmul
    assert summary["flops_per_token"]["accounting"] == flops["training"]
    assert summary["flops_per_token"]["counted"] == flops["training"] - 6 * vectors  # top_k experts' matmuls per token
    assert summary["mfu"] == flops["training"] * summary["tokens_per_second"] / summary["peak_flops"]
    moe = summary["moe"]
    assert (moe["active_params"], moe["total_params"]) == (counts["active"], counts["total"])
    assert set(moe["share"]) == {"router", "dispatch", "experts"} and 0 < moe["share"]["router"] < 1
    assert "MoE         of the traced steps' time, forward ranges: router " in printed
    assert f"{counts['active']:,} active of {counts['total']:,} parameters" in printed
