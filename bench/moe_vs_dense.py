"""Mixture of experts against a dense model on Shakespeare, at equal training FLOPs and at equal wall-clock.

    .venv/bin/python bench/moe_vs_dense.py                  # 3 seeds, 5 configs, both budgets (about 25 minutes)
    .venv/bin/python bench/moe_vs_dense.py --out docs/bench_moe_vs_dense.txt
    .venv/bin/python bench/moe_vs_dense.py --quick          # a smoke run: 1 seed, a few steps (about 2 minutes)

Every config trains the `shakespeare-cpu` recipe (2,048 tokens a step, its optimizer and schedule) with a
llama-mini model (4 x 128, SwiGLU 384 wide) as the dense baseline and, in its place, sparse feed-forward layers:

    8e top-2 half    8 experts, 2 per token, each 192 wide: the dense model's active size (the `moe-mini` preset)
    8e top-1 full    8 experts, 1 per token, each 384 wide (Switch)
    16e top-4 +1sh   16 fine-grained experts 96 wide, 4 per token, plus 1 shared (DeepSeekMoE; active 480 wide)
    8e top-2 bias    as "8e top-2 half", balanced by DeepSeek-V3's bias update instead of the auxiliary loss

on the data of bench/shakespeare_cpu.py (the BPE tokenizer and the model never see the held-out works), scored
in bits per byte on those works. Budgets:

    flops   the dense model trains --steps steps; each config trains the steps that spend the same training FLOPs,
            from its active parameters (gptlab.model.accounting.flops_per_token counts only the experts a token visits)
    time    each config trains for --seconds of wall-clock on this machine (TrainConfig.time_limit: the schedule
            follows the share of the budget spent, so every run ends annealed)

Runs interleave the configs within each seed (dense, moe, moe, ..., then the next seed), so a busy moment of a
shared machine falls on all of them. Per config and budget: bits per byte mean +- sd over the seeds, Welch's
t-test p against dense, steps/s (over the whole fit, set-up included), and the expert load from the run's metrics.jsonl (gptlab.train.moe_stats):
the mean over the logged steps of the worst layer's max/mean load (1: balanced) and of the dropped fraction.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

from machine import header
from scipy.stats import ttest_ind
from shakespeare_cpu import prepare

from gptlab.model import preset
from gptlab.model.accounting import flops_per_token
from gptlab.model.config import MoEConfig
from gptlab.model.io import load_model
from gptlab.pipeline import evaluate_split
from gptlab.runtime import atomic_write_text
from gptlab.train import Trainer, train_preset

# name -> the sparse layers (None: the dense baseline)
CONFIGS = {
    "dense": None,
    "8e top-2 half": MoEConfig(n_experts=8, top_k=2, expert_hidden=192),
    "8e top-1 full": MoEConfig(n_experts=8, top_k=1, expert_hidden=384),
    "16e top-4 +1sh": MoEConfig(n_experts=16, top_k=4, expert_hidden=96, n_shared=1),
    "8e top-2 bias": MoEConfig(n_experts=8, top_k=2, expert_hidden=192, aux_loss=0.0, bias_update=0.001),
}


def run_config(base, name: str, budget: str, args, seed: int, out: Path):
    """The TrainConfig of one run: the config's model, and steps (flops) or a time limit (time)."""
    model = preset("llama-mini", vocab_size=base.model.vocab_size, block_size=base.seq_len)
    if CONFIGS[name] is not None:
        model = dataclasses.replace(model, moe=CONFIGS[name])
    if budget == "flops":
        dense = flops_per_token(dataclasses.replace(model, moe=MoEConfig()), base.seq_len)["training"]
        steps = max(1, round(args.steps * dense / flops_per_token(model, base.seq_len)["training"]))
        limits = dict(max_steps=steps, time_limit=0.0, log_every=max(1, steps // 10))
    else:
        limits = dict(max_steps=10**9, time_limit=args.seconds, log_every=max(1, round(args.seconds)))
    return dataclasses.replace(base, model=model, seed=seed, out=str(out), **limits)


def load_figures(out: Path) -> tuple[float, float]:
    """(mean worst-layer max/mean load, mean dropped fraction) over the logged steps; nan for a dense run."""
    loads, dropped = [], []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        layers = record.get("moe_layers")
        if layers:
            loads.append(max(layer["max_load"] for layer in layers))
            dropped.append(statistics.mean(layer["dropped"] for layer in layers))
    return (statistics.mean(loads), statistics.mean(dropped)) if loads else (float("nan"), float("nan"))


def train_and_score(config) -> dict:
    start = time.perf_counter()
    result = Trainer(config, log=lambda line: None, resume=False).fit()
    seconds = time.perf_counter() - start
    bpb = evaluate_split(load_model(result.checkpoint), config)["bpb"]
    max_load, dropped = load_figures(Path(config.out))
    return dict(bpb=bpb, steps=result.steps, steps_per_s=result.steps / seconds, max_load=max_load, dropped=dropped)


def summary_lines(budget: str, runs: dict[str, list[dict]]) -> list[str]:
    """One line per config: bpb mean +- sd, p vs dense, steps, steps/s, load figures."""
    lines = [f"budget {budget}:",
             f"  {'config':<16}{'val bpb':>18}{'p vs dense':>12}{'steps':>8}{'steps/s':>9}{'max/mean load':>15}{'dropped':>9}"]
    dense = [run["bpb"] for run in runs["dense"]]
    for name, seeds in runs.items():
        bpb = [run["bpb"] for run in seeds]
        spread = f" +- {statistics.stdev(bpb):.4f}" if len(bpb) > 1 else ""
        p = ttest_ind(bpb, dense, equal_var=False).pvalue if name != "dense" and len(bpb) > 1 and len(dense) > 1 else None
        mean = {key: statistics.mean(run[key] for run in seeds) for key in ("steps", "steps_per_s", "max_load", "dropped")}
        lines.append(f"  {name:<16}{statistics.mean(bpb):>8.4f}{spread:<10}{'' if p is None else f'{p:.2g}':>12}"
                     f"{round(mean['steps']):>8}{mean['steps_per_s']:>9.2f}{mean['max_load']:>15.2f}{mean['dropped']:>9.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", nargs="+", default=["flops", "time"], choices=["flops", "time"])
    parser.add_argument("--steps", type=int, default=150, help="the dense model's steps under the flops budget (default 150)")
    parser.add_argument("--seconds", type=float, default=20, help="seconds of training per run under the time budget (default 20)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), help="rows (dense always runs)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 6 dense steps, 3 s: proves the script runs")
    parser.add_argument("--out", default=None, help="also write the summary to this file (docs/bench_moe_vs_dense.txt)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seconds, args.seeds = 6, 3.0, 1
    names = ["dense", *[name for name in args.configs if name != "dense"]]
    lines = [header(f"MoE vs dense on Shakespeare: {args.steps} dense steps of FLOPs, {args.seconds:g} s, {args.seeds} seeds",
                    ["gptlab", "torch"])]
    print(lines[0], flush=True)
    base = train_preset("shakespeare-cpu")
    with tempfile.TemporaryDirectory() as tmp:
        data, _ = prepare(Path(tmp), base.model.vocab_size)
        base = dataclasses.replace(base, data=str(data), tokenizer=str(Path(tmp) / "tokenizer"), eval_every=0, checkpoint_every=0)
        for budget in args.budgets:
            runs: dict[str, list[dict]] = {name: [] for name in names}
            for seed in range(args.seeds):
                for name in names:  # interleaved: dense, moe, moe, ... within each seed
                    out = Path(tmp) / f"{budget}-{name.replace(' ', '_')}-{seed}"
                    run = train_and_score(run_config(base, name, budget, args, seed, out))
                    runs[name].append(run)
                    print(f"  {budget} seed {seed} {name:<16} {run['bpb']:.4f} bpb  {run['steps']} steps  "
                          f"{run['steps_per_s']:.2f} steps/s", flush=True)
            lines += summary_lines(budget, runs)
            print("\n".join(summary_lines(budget, runs)), flush=True)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
