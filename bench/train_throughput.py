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
- gptlab-glibc-malloc: the default side with glibc's own malloc settings, which gptlab's runtime changes
            (gptlab.runtime.memory: freed temporaries kept for the next step instead of unmapped).
- gptlab-unfused-loss: the same with the plain head and F.cross_entropy, as nanoGPT computes its loss.
- gptlab-readable: the default side with gptlab's readable AdamW, the reference the fused kernel is tested against.
- gptlab-compiled (--compile): the default side under torch.compile, as `--compile` trains.

bf16: both sides under torch.autocast(bfloat16), as gptlab trains with --precision bf16 (nanoGPT's
train.py autocasts on CUDA only). Each side lives in a process of its own (malloc's settings are
per process), idle while the others run. Sides are timed in turn, `--rounds` rounds, so drift on a shared
machine falls on all alike; the medians are compared, with a Mann-Whitney test of the rounds.
Also printed: the achieved matmul FLOP/s of each side, against a plain matmul of the head's shape.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from contextlib import nullcontext

import torch
from machine import header
from nanogpt_model import NanoGPT
from scipy.stats import mannwhitneyu

from gptlab.model import GPT, preset
from gptlab.model.accounting import flops_per_token
from gptlab.runtime.memory import keep_freed_memory
from gptlab.train.optim import OptimizerConfig, build_optimizer

VOCAB, LAYERS, HEADS, WIDTH, BLOCK, BATCH = 50_304, 6, 6, 384, 256, 8


SIDES = ["nanogpt", "gptlab", "gptlab-glibc-malloc", "gptlab-unfused-loss", "gptlab-readable"]


def make_side(name: str) -> tuple:
    """(model, optimizer, forward's keywords) of one side, every model starting from the same weights where the layouts match."""
    torch.manual_seed(0)
    if name == "nanogpt":
        nano = NanoGPT(VOCAB, BLOCK, LAYERS, HEADS, WIDTH, bias=False)
        return nano, nano.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu"), {}
    if name not in ("gptlab-glibc-malloc", "nanogpt"):
        keep_freed_memory()  # what init_runtime does for every gptlab run; nanoGPT's train.py leaves glibc's default
    config = preset("gpt2", vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, block_size=BLOCK, bias=False)
    model = GPT(config)
    impl = "gptlab" if name == "gptlab-readable" else "auto"
    optimizer = build_optimizer(model, OptimizerConfig(lr=6e-4, impl=impl), "cpu")
    if name == "gptlab-compiled":  # the plain loss: torch.compile fuses it its own way
        return torch.compile(model), optimizer, {}
    return model, optimizer, {"fused_loss": name != "gptlab-unfused-loss"}


def worker(name: str, precision: str, steps: int, conn) -> None:
    """One side in a process of its own (so glibc's settings are each side's own): a round's s/step per request."""
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    model, optimizer, kwargs = make_side(name)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, VOCAB, (BATCH, BLOCK), generator=generator),) * 2 for _ in range(steps)]
    time_round(model, optimizer, kwargs, batches[:2], cast)  # warm up: allocations, optimizer state, compilation
    conn.send("ready")
    while conn.recv():
        conn.send(time_round(model, optimizer, kwargs, batches, cast))


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
    context = multiprocessing.get_context("spawn")
    pipes = {}
    for name in SIDES + (["gptlab-compiled"] if compile_too else []):  # one at a time: warm-ups do not overlap
        mine, theirs = context.Pipe()
        context.Process(target=worker, args=(name, precision, steps, theirs), daemon=True).start()
        mine.recv()
        pipes[name] = mine
    times = {name: [] for name in pipes}
    for _ in range(rounds):  # sides in turn, each waiting idle while the others run
        for name, pipe in pipes.items():
            pipe.send(True)
            times[name].append(pipe.recv())
    for pipe in pipes.values():
        pipe.send(False)
    config = preset("gpt2", vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, block_size=BLOCK, bias=False)
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
