"""Training throughput on a busy CPU: thread count and OpenMP wait policy, alone and beside one competing process.

    .venv/bin/python bench/threads_busy.py                       # 3 rounds of 8 s per measurement
    .venv/bin/python bench/threads_busy.py --rounds 5 --seconds 10

The model is the demo's (`gptlab run`: shakespeare_cpu, 4 x 128, rotary, RMSNorm, ReLU^2, QK-norm; 16 x 128
tokens a step) trained as the Trainer does (fused loss, AdamW, gradient clipping), on random batches.
Sides (each in a fresh process, since libgomp reads OMP_WAIT_POLICY once at load):
- threads=all, active:   one thread per core, threads spin at each barrier (libgomp's default; gptlab before)
- threads=all, passive:  one thread per core, threads sleep at a barrier (gptlab's default wait policy now)
- threads=1:             one thread
- threads=auto:          gptlab's default: the cores less those other work keeps busy at start, passive
Competitors, started a second before the measured side and stopped after it:
- alone:  nothing
- burn:   one pure-Python loop (one core busy), the "other CPU-bound process" of a shared machine
- twin:   a second copy of the same side's training: two `gptlab train` runs at once
Printed: each side's median tokens/s per competitor, the ratio to threads=all/active alone, and for each
competitor a Mann-Whitney test of passive against active rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from machine import header
from scipy.stats import mannwhitneyu

SIDES = {  # name: (--threads, OMP_WAIT_POLICY)
    "all/active": ("all", "active"),
    "all/passive": ("all", "passive"),
    "1": ("1", "passive"),
    "auto": ("auto", "passive"),
}
COMPETITORS = ("alone", "burn", "twin")
BURN = "while True: pass"


def train_worker(threads: str, seconds: float, warmup: int = 5) -> None:
    """Train the demo's model for `seconds` after `warmup` steps; print tokens/s (the measured side and the twin)."""
    import torch

    from gptlab.runtime.processes import default_workers
    from gptlab.runtime.threads import set_threads
    from gptlab.train.config import shakespeare_cpu
    from gptlab.train.optim import build_optimizer

    count = set_threads(default_workers() if threads == "all" else threads)
    config = shakespeare_cpu()
    from gptlab.model import GPT

    torch.manual_seed(0)
    model = GPT(config.model)
    optimizer = build_optimizer(model, config.optimizer)
    x = torch.randint(0, config.model.vocab_size, (config.micro_batch, config.seq_len))
    steps, start = -warmup, None
    while start is None or time.perf_counter() - start < seconds:
        if steps == 0:
            start = time.perf_counter()
        _, loss = model(x, x, fused_loss=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
    rate = steps * x.numel() / (time.perf_counter() - start)
    print(f"{rate:.1f} {count}", flush=True)


def measure(side: str, competitor: str, seconds: float) -> float:
    """Tokens/s of `side` while `competitor` runs beside it."""
    threads, policy = SIDES[side]
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    env.pop("OMP_NUM_THREADS", None)
    worker = [sys.executable, __file__, "--worker", threads, "--seconds"]
    other = None
    if competitor == "burn":
        other = subprocess.Popen([sys.executable, "-c", BURN])
    elif competitor == "twin":
        other = subprocess.Popen([*worker, str(seconds * 4)], env=env, stdout=subprocess.DEVNULL)
    try:
        time.sleep(1.0 if other else 0.0)
        out = subprocess.run([*worker, str(seconds)], env=env, check=True, capture_output=True, text=True).stdout
    finally:
        if other:
            other.kill()
            other.wait()
    return float(out.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--worker", metavar="THREADS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return train_worker(args.worker, args.seconds)
    print(header("Training throughput on a busy CPU (demo model, tokens/s)", ["torch"]))
    rates = {(side, competitor): [] for side in SIDES for competitor in COMPETITORS}
    for round_ in range(args.rounds):  # sides in turn within a round: drift of a shared machine falls on all alike
        for competitor in COMPETITORS:
            for side in SIDES:
                rates[side, competitor].append(measure(side, competitor, args.seconds))
        print(f"# round {round_ + 1}/{args.rounds} done", flush=True)
    base = statistics.median(rates["all/active", "alone"])
    print(f"{'side':<12}" + "".join(f"{c:>22}" for c in COMPETITORS))
    for side in SIDES:
        cells = [f"{statistics.median(rates[side, c]):>9,.0f} ({statistics.median(rates[side, c]) / base:4.2f}x)" for c in COMPETITORS]
        print(f"{side:<12}" + "".join(f"{cell:>22}" for cell in cells))
    for competitor in COMPETITORS:
        p = mannwhitneyu(rates["all/passive", competitor], rates["all/active", competitor]).pvalue
        print(f"passive vs active, {competitor}: ratio "
              f"{statistics.median(rates['all/passive', competitor]) / statistics.median(rates['all/active', competitor]):.2f}, "
              f"Mann-Whitney p = {p:.3g}")


if __name__ == "__main__":
    main()
