"""Training throughput of the 30M-parameter configuration: gptlab's step against nanoGPT's model.py step, same run.

    .venv/bin/python bench/train_throughput.py                    # fp32 and bf16, 5 rounds of 3 steps each
    .venv/bin/python bench/train_throughput.py --rounds 9 --compile

The configuration (the issue's): 6 layers x 384, 6 heads, block 256, batch 8, vocab 50,304, no biases.
One step = forward, loss, backward, clip the gradient norm to 1, AdamW, zero the gradients: what
nanoGPT's train.py does per iteration and what gptlab's Trainer does (gptlab.train.trainer._train_step).

Sides, each on the same random batches:
- nanogpt:  bench/nanogpt_model.py, nanoGPT's model.py restated, with its configure_optimizers
            (AdamW, fused only on CUDA: a Python loop over tensors on a CPU).
- gptlab:   gptlab.model.GPT (arch gpt2) as the Trainer runs it by default: torch's fused AdamW kernel (impl auto)
            and the head fused with the cross-entropy in chunks (fused_loss, gptlab.model.loss).
- gptlab-unfused-loss: the same with the plain head and F.cross_entropy, as nanoGPT computes its loss.
- gptlab-readable: the default side with gptlab's readable AdamW, the reference the fused kernel is tested against.
- gptlab-compiled (--compile): the default side under torch.compile, as `--compile` trains.

bf16: both sides under torch.autocast(bfloat16), as gptlab trains with --precision bf16 (nanoGPT's
train.py autocasts on CUDA only). Sides are timed in turn, `--rounds` rounds, so drift on a shared
machine falls on all alike; the medians are compared, with a Mann-Whitney test of the rounds.
Also printed: the achieved matmul FLOP/s of each side, against a plain matmul of the head's shape.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
from machine import header
from nanogpt_model import NanoGPT
from scipy.stats import mannwhitneyu

from gptlab.model import GPT, preset
from gptlab.model.accounting import flops_per_token
from gptlab.train.optim import OptimizerConfig, build_optimizer

VOCAB, LAYERS, HEADS, WIDTH, BLOCK, BATCH = 50_304, 6, 6, 384, 256, 8


def sides(compile_too: bool) -> dict:
    """name -> (model, optimizer, forward's keywords), every model starting from the same weights where the layouts match."""
    torch.manual_seed(0)
    nano = NanoGPT(VOCAB, BLOCK, LAYERS, HEADS, WIDTH, bias=False)
    config = preset("gpt2", vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, block_size=BLOCK, bias=False)
    made = {"nanogpt": (nano, nano.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu"), {})}
    for name, impl, fused in [("gptlab", "auto", True), ("gptlab-unfused-loss", "auto", False), ("gptlab-readable", "gptlab", True)]:
        model = GPT(config)
        made[name] = (model, build_optimizer(model, OptimizerConfig(lr=6e-4, impl=impl), "cpu"), {"fused_loss": fused})
    if compile_too:  # the plain loss: torch.compile fuses it its own way
        model = GPT(config)
        made["gptlab-compiled"] = (torch.compile(model), build_optimizer(model, OptimizerConfig(lr=6e-4), "cpu"), {})
    return made


def step(model, optimizer, x, y, cast, kwargs) -> None:
    with cast:
        _, loss = model(x, y, **kwargs)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_round(model, optimizer, kwargs, batches, cast) -> float:
    start = time.perf_counter()
    for x, y in batches:
        step(model, optimizer, x, y, cast, kwargs)
    return (time.perf_counter() - start) / len(batches)


def matmul_peak(cast) -> float:
    """FLOP/s of one matmul of the head's shape (B*T x C) @ (C x V): about the best this machine does."""
    a, b = torch.randn(BATCH * BLOCK, WIDTH), torch.randn(WIDTH, VOCAB)
    with cast:
        a @ b
        start = time.perf_counter()
        for _ in range(3):
            a @ b
    return 3 * 2 * a.shape[0] * WIDTH * VOCAB / (time.perf_counter() - start)


def measure(precision: str, rounds: int, steps: int, compile_too: bool) -> None:
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    made = sides(compile_too)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, VOCAB, (BATCH, BLOCK), generator=generator),) * 2 for _ in range(steps)]
    for side in made.values():  # warm up: allocations, optimizer state, compilation
        time_round(*side, batches[:2], cast)
    times = {name: [] for name in made}
    for _ in range(rounds):
        for name, side in made.items():
            times[name].append(time_round(*side, batches, cast))
    config = made["gptlab"][0].config
    flops = flops_per_token(config, BLOCK)["training"] * BATCH * BLOCK
    peak = matmul_peak(cast)
    anchor = statistics.median(times["nanogpt"])
    print(f"\n## {precision}: {rounds} rounds x {steps} steps, medians (matmul of the head's shape: {peak / 1e9:.0f} GFLOP/s)")
    print(f"{'side':<17}{'s/step':>9}{'tokens/s':>10}{'GFLOP/s':>9}{'of matmul':>10}{'speed vs nanogpt':>18}{'p':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        p = "" if name == "nanogpt" else f"{mannwhitneyu(values, times['nanogpt']).pvalue:.3f}"
        print(f"{name:<17}{median:>9.3f}{BATCH * BLOCK / median:>10,.0f}{flops / median / 1e9:>9.0f}"
              f"{flops / median / peak:>10.0%}{anchor / median:>17.2f}x{p:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side (default 5)")
    parser.add_argument("--steps", type=int, default=3, help="steps per round (default 3)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--compile", action="store_true", help="also time gptlab under torch.compile")
    args = parser.parse_args()
    print(header("Training throughput, 30M configuration: gptlab vs nanoGPT's model.py step", ["gptlab", "torch"]))
    print(f"# {LAYERS} layers x {WIDTH}, {HEADS} heads, block {BLOCK}, batch {BATCH}, vocab {VOCAB:,}, "
          f"{torch.get_num_threads()} threads; speed > 1: gptlab faster; p: Mann-Whitney of the rounds")
    for precision in (["fp32", "bf16"] if args.precision == "both" else [args.precision]):
        measure(precision, args.rounds, args.steps, args.compile)


if __name__ == "__main__":
    main()
