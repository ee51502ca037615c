"""Training throughput on a busy CPU: thread count and OpenMP wait policy, alone and beside one competing process.

    .venv/bin/python bench/threads_busy.py                       # 4 rounds of 6 s per measurement
    .venv/bin/python bench/threads_busy.py --rounds 3 --seconds 4  # quicker; 3 rounds cannot reach p < 0.1

The model is the demo's (`gptlab run`: shakespeare_cpu, 4 x 128, rotary, RMSNorm, ReLU^2, QK-norm; 16 x 128
tokens a step) trained as the Trainer does (fused loss, AdamW, gradient clipping), on random batches.
Sides (each in a fresh process, since libgomp reads OMP_WAIT_POLICY once at load):
- all/default:  one thread per core, libgomp's own waiting (spin about 300,000 times, then sleep): gptlab before
- all/passive:  one thread per core, threads sleep at a barrier at once (OMP_WAIT_POLICY=passive)
- 1:            one thread
- auto:         gptlab's default, `--threads auto`: the cores less those other work keeps busy at start,
                then the Trainer's BusyWatch each step (fewer threads while other work holds the cores)
Competitors, stopped when the measured side ends:
- alone:  nothing
- burn:   one pure-Python loop (one core busy), the "other CPU-bound process" of a shared machine, there
          before the measured side starts
- twin:   a second copy of the same side's training, started 3 s before: two `gptlab train` runs at once
- late:   the measured side trains alone for 3 s, then the loop starts under it and the timing begins: the
          machine getting busy mid-run (what BusyWatch answers)
Printed: each side's median tokens/s per competitor, the ratio to all/default alone, and Mann-Whitney tests
of passive and auto against all/default rounds for each competitor.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time

from machine import header
from scipy.stats import mannwhitneyu

DEFAULT = {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": ""}
SIDES = {  # name: (--threads, environment); "" = unset
    "all/default": ("all", DEFAULT),
    "all/passive": ("all", {**DEFAULT, "OMP_WAIT_POLICY": "passive"}),
    "1": ("1", DEFAULT),
    "auto": ("auto", DEFAULT),
}
BASE = "all/default"
COMPETITORS = ("alone", "burn", "twin", "late")
LEAD = 3.0  # seconds a run trains alone before the other work starts: past BusyWatch's first windows
BURN = "while True: pass"


def train_worker(threads: str, seconds: float, warmup: int = 5) -> None:
    """Train the demo's model: `warmup` steps, "ready" on stdout, untimed steps until "go" on stdin, then `seconds`
    timed; print tokens/s (the measured side). The twin gets no "go" and trains until it is stopped."""
    import torch

    from gptlab.model import GPT
    from gptlab.runtime.processes import default_workers
    from gptlab.runtime.threads import BusyWatch, set_threads, threads_are_automatic
    from gptlab.train.config import shakespeare_cpu
    from gptlab.train.optim import build_optimizer

    count = set_threads(default_workers() if threads == "all" else threads)
    config = shakespeare_cpu()
    torch.manual_seed(0)
    model = GPT(config.model)
    optimizer = build_optimizer(model, config.optimizer)
    x = torch.randint(0, config.model.vocab_size, (config.micro_batch, config.seq_len))
    watch = BusyWatch(count, adapt=threads_are_automatic())  # as the Trainer makes it
    steps, start = -warmup, None
    while start is None or time.perf_counter() - start < seconds:
        if steps == 0:
            print("ready", flush=True)
        if steps >= 0 and start is None and select.select([sys.stdin], [], [], 0)[0]:
            sys.stdin.readline()
            steps, start = 0, time.perf_counter()
        step_start = time.perf_counter()
        _, loss = model(x, x, fused_loss=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        watch.step(time.perf_counter() - step_start)
        steps += 1
    rate = steps * x.numel() / (time.perf_counter() - start)
    print(f"{rate:.1f} {watch.current}", flush=True)


def start_worker(threads: str, env: dict, seconds: float) -> subprocess.Popen:
    """A training worker that has printed "ready" (imports done, warm)."""
    worker = subprocess.Popen([sys.executable, __file__, "--worker", threads, "--seconds", str(seconds)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "ready"
    return worker


def measure(side: str, competitor: str, seconds: float) -> float:
    """Tokens/s of `side` while `competitor` runs beside it (see the module docstring for each competitor)."""
    threads, settings = SIDES[side]
    env = {key: value for key, value in os.environ.items() if key not in (*settings, "OMP_NUM_THREADS")}
    env.update({key: value for key, value in settings.items() if value})
    others = []
    try:
        if competitor == "burn":
            others.append(subprocess.Popen([sys.executable, "-c", BURN]))
        elif competitor == "twin":
            others.append(start_worker(threads, env, 3600))
            time.sleep(LEAD)  # the twin trains alone first, as a run that was there before
        measured = start_worker(threads, env, seconds)
        if competitor == "late":
            time.sleep(LEAD)  # the measured side trains alone first; the other work starts under it
            others.append(subprocess.Popen([sys.executable, "-c", BURN]))
            time.sleep(0.5)
        measured.stdin.write("go\n")
        measured.stdin.flush()
        out = measured.stdout.readline()
        measured.wait()
    finally:
        for other in others:
            other.kill()
            other.wait()
    return float(out.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=6.0)
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
    base = statistics.median(rates[BASE, "alone"])
    print(f"{'side':<12}" + "".join(f"{c:>22}" for c in COMPETITORS) + f"    (ratios to {BASE} alone)")
    for side in SIDES:
        cells = [f"{statistics.median(rates[side, c]):>9,.0f} ({statistics.median(rates[side, c]) / base:4.2f}x)" for c in COMPETITORS]
        print(f"{side:<12}" + "".join(f"{cell:>22}" for cell in cells))
    for side in ("all/passive", "auto"):
        for competitor in COMPETITORS:
            ours, theirs = rates[side, competitor], rates[BASE, competitor]
            p = mannwhitneyu(ours, theirs).pvalue
            print(f"{side} vs {BASE}, {competitor}: ratio {statistics.median(ours) / statistics.median(theirs):.2f}, "
                  f"Mann-Whitney p = {p:.3g} ({len(ours)} rounds each)")


if __name__ == "__main__":
    main()
