"""The mixture-of-experts layer's expert dispatch: one grouped matmul against the per-expert loop, same weights.

    .venv/bin/python bench/moe_dispatch.py                                  # CPU fp32, 3 shapes (about 5 minutes on 2 cores)
    .venv/bin/python bench/moe_dispatch.py --out docs/bench_moe_dispatch.txt
    .venv/bin/python bench/moe_dispatch.py --device cuda --dtype fp32 bf16  # on a GPU: F.grouped_mm
    .venv/bin/python bench/moe_dispatch.py --quick                          # a smoke run (seconds)

Each shape builds one `MoE` layer (gptlab.model.moe, SwiGLU experts, top 2, random weights: speed does not
depend on them) and times forward + backward of `tokens` rows with `moe.impl` "grouped" (tokens sorted by expert,
F.grouped_mm or its padded-bmm fallback) and "loop" (one matmul pair per expert), swapping only the impl on the
same module. A dense SwiGLU MLP as wide as the active experts together (top_k x expert_hidden) is timed beside
them for scale: the routing, sorting and scatter are what a sparse layer costs over it. The three alternate
over `--rounds` rounds, so a busy moment of a shared machine falls on all of them; printed are the medians in
tokens/s and the ratios grouped/loop and grouped/dense.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from machine import header

from gptlab.model import preset
from gptlab.model.config import MoEConfig
from gptlab.model.mlp import MLP
from gptlab.model.moe import MoE
from gptlab.runtime import atomic_write_text

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SHAPES = ["8x256x4096", "32x256x4096", "8x512x16384"]  # experts x d_model x tokens
QUICK_SHAPES = ["8x64x512", "32x64x512"]


def build(shape: str, top_k: int, device: str, dtype: torch.dtype) -> tuple[MoE, MLP, torch.Tensor]:
    """The sparse layer (expert_hidden = d_model), the dense MLP of its active width, and the input rows."""
    experts, d, tokens = (int(part) for part in shape.split("x"))
    config = dataclasses.replace(preset("llama-tiny"), n_embd=d, n_head=4, n_kv_head=4,
                                 moe=MoEConfig(n_experts=experts, top_k=top_k, expert_hidden=d))
    torch.manual_seed(0)
    sparse = MoE(config)
    for weight in (sparse.router.weight, sparse.experts_fc, sparse.experts_proj):
        torch.nn.init.normal_(weight, std=0.02)
    dense = MLP(dataclasses.replace(config, moe=MoEConfig(), mlp_hidden=top_k * d, bias=False))
    x = torch.randn(tokens, d, device=device, dtype=dtype)
    return sparse.to(device, dtype).train(), dense.to(device, dtype).train(), x


def step_seconds(module: torch.nn.Module, x: torch.Tensor, iters: int) -> float:
    """Mean seconds of forward + backward (gradients on the weights and the input)."""
    x = x.detach().requires_grad_()
    synchronize = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        module(x).square().mean().backward()
        module.zero_grad(set_to_none=True)
        x.grad = None
    synchronize()
    if isinstance(module, MoE):
        module.pop_stats()  # the training statistics are not wanted here; keep them from piling up
    return (time.perf_counter() - start) / iters


def check_same(sparse: MoE, x: torch.Tensor) -> None:
    """Both dispatches give the same output before either is timed (the loop is the reference)."""
    outputs = []
    with torch.no_grad():
        for impl in ("grouped", "loop"):
            sparse.moe = dataclasses.replace(sparse.moe, impl=impl)
            outputs.append(sparse(x).float())
    sparse.pop_stats()
    tolerance = 1e-4 if x.dtype == torch.float32 else 3e-2
    if not torch.allclose(*outputs, atol=tolerance, rtol=tolerance):
        raise SystemExit(f"grouped and loop differ by {(outputs[0] - outputs[1]).abs().max():.3g}: not timing them")


def measure(shape: str, top_k: int, device: str, dtype: torch.dtype, rounds: int, iters: int) -> dict[str, float]:
    """Median tokens/s of grouped, loop and dense, the three alternating round by round."""
    sparse, dense, x = build(shape, top_k, device, dtype)
    check_same(sparse, x)
    impls = {
        "grouped": (sparse, dataclasses.replace(sparse.moe, impl="grouped")),
        "loop": (sparse, dataclasses.replace(sparse.moe, impl="loop")),
        "dense": (dense, None),
    }
    samples: dict[str, list[float]] = {name: [] for name in impls}
    for round_index in range(rounds + 1):  # round 0 warms up (allocator, kernels) and is not counted
        for name, (module, moe) in impls.items():
            if moe is not None:
                module.moe = moe  # only the dispatch changes; the router and expert weights stay the same
            seconds = step_seconds(module, x, iters)
            if round_index:
                samples[name].append(x.shape[0] / seconds)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=None, help=f"EXPERTSxD_MODELxTOKENS (default {' '.join(SHAPES)})")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", nargs="+", default=["fp32"], choices=list(DTYPES))
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds after a warm-up round (default 5)")
    parser.add_argument("--iters", type=int, default=3, help="forward + backward passes per round (default 3)")
    parser.add_argument("--quick", action="store_true", help="small shapes, 2 rounds of 1 pass: proves the script runs")
    parser.add_argument("--out", default=None, help="also write the table to this file (docs/bench_moe_dispatch.txt)")
    args = parser.parse_args()
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    rounds, iters = (2, 1) if args.quick else (args.rounds, args.iters)
    lines = [header(f"MoE expert dispatch, grouped vs loop, top {args.top_k}, forward + backward, {args.device}", ["gptlab", "torch"]),
             f"{'experts x d x tokens':<22}{'dtype':<7}{'grouped tok/s':>15}{'loop tok/s':>13}{'dense tok/s':>14}"
             f"{'grouped/loop':>14}{'grouped/dense':>15}"]
    print("\n".join(lines), flush=True)
    for shape in shapes:
        for name in args.dtype:
            rate = measure(shape, args.top_k, args.device, DTYPES[name], rounds, iters)
            line = (f"{shape:<22}{name:<7}{rate['grouped']:>15,.0f}{rate['loop']:>13,.0f}{rate['dense']:>14,.0f}"
                    f"{rate['grouped'] / rate['loop']:>14.2f}{rate['grouped'] / rate['dense']:>15.2f}")
            lines.append(line)
            print(line, flush=True)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
