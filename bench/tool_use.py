"""Tool use, measured: the same chat model with and without the calculator on held-out multi-digit arithmetic, and
the fine-tuned model against the same model after reinforcement learning with tools, over seeds.

    .venv/bin/gptlab run                                    # the demo: its pretrained model is runs/shakespeare/train
    .venv/bin/python bench/tool_use.py --base runs/shakespeare/train --seeds 2

For each seed: `gptlab sft --preset sft-tools` fine-tunes the demo's pretrained model on the tool-use mixture
(gptlab.align.finetune.sft.TOOL_MIXTURE: sums and products answered through the calculator, a few answered without
it, word problems with the calculator, questions a Python program answers); then `gptlab grpo` trains it on with
tools (RL_STEPS steps; the rollouts run the calculator, the reward is the verifier's). Every model answers the
held-out questions greedily, offered the tools and not: accuracy, paired differences on the same questions (95%
t-intervals, the seeds' questions pooled), and the cost per answer in tokens (the model's own and the tools' fed
back), tool calls and seconds (batched generation, tools included). A finished training run is reused (the
commands resume), so a second call only measures. Writes a table (stdout) and, with --json, the numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from machine import header

from gptlab.align.finetune.sft import TOOL_MIXTURE
from gptlab.chat import ChatFormat
from gptlab.chat.data import MixtureConfig, load_task
from gptlab.eval.stats import mean_interval
from gptlab.infer import SamplingConfig, generate
from gptlab.load.decoding import load_for_decoding
from gptlab.tools import load_tools
from gptlab.tools.turn import ToolTurn

ROOT = Path(__file__).resolve().parents[1]
GPTLAB = [sys.executable, "-m", "gptlab"]
HELD_OUT = {  # name -> (task, its options, the tools offered "with tools", the share of --questions asked)
    "3-4 digit + and *": ("arithmetic", {"digits": 4, "min_digits": 3, "ops": "+*"}, "calculator", 1.0),
    "word problems": ("word_problems", {}, "calculator", 0.4),
    "compute (python)": ("compute", {}, "python", 0.4),
}
SAMPLED = 0.8  # `gptlab chat`'s default temperature: answers sampled as a chat samples them, with tools
RL_TASK = "arithmetic[digits=4,min_digits=3,ops=+*,tools=1,work=0]"  # its train split: never a held-out question
RL_FLAGS = ["--max-steps", "60", "--max-new-tokens", "64", "--optimizer.lr", "2e-4", "--probe-prompts", "256",
            "--eval-examples", "50", "--eval-samples", "4"]


def run(command: list[str], log: Path) -> float:
    """A gptlab command, its output kept in `log`; its seconds. A failure stops the benchmark with the log's tail."""
    began = time.perf_counter()
    with open(log, "a") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        sys.exit(f"{' '.join(command[2:])} failed ({done.returncode}); see {log}:\n{log.read_text()[-2000:]}")
    return time.perf_counter() - began


def train(base: Path, out: Path, seed: int) -> tuple[Path, Path]:
    """The seed's fine-tuned model and its RL-trained successor (a finished run is resumed, which does nothing)."""
    sft, rl = out / f"sft-{seed}", out / f"rl-{seed}"
    run([*GPTLAB, "sft", "--init", str(base), "--preset", "sft-tools", "--out", str(sft), "--seed", str(seed),
         "--task-examples", "50"], out / f"sft-{seed}.log")
    run([*GPTLAB, "grpo", "--init", str(sft), "--out", str(rl), "--task", RL_TASK, "--seed", str(seed), *RL_FLAGS],
        out / f"rl-{seed}.log")
    return sft, rl


def answers(folder: Path, task, tools: str | None, n: int, temperature: float = 0.0, batch: int = 50) -> dict:
    """Answers to the first n held-out questions of a task (greedy, or sampled at `temperature` with a fixed seed),
    offered `tools` or none: per question whether it was right, the model's own tokens, the tokens the tools fed
    back, its tool calls; the seconds per answer."""
    model, tokenizer, _ = load_for_decoding(str(folder), torch.device("cpu"))
    chat = ChatFormat(tokenizer)
    toolbox = load_tools(tools) if tools else None
    specs = toolbox.specs() if toolbox else None
    examples = task.examples("test", n)
    rows = {"right": [], "own": [], "fed": [], "calls": [], "seconds": 0.0}
    for start in range(0, n, batch):
        chunk = examples[start : start + batch]
        prompts = [chat.prompt([{"role": "user", "content": e.question}], tools=specs) for e in chunk]
        room = model.config.block_size - max(len(p) for p in prompts)
        config = SamplingConfig(max_new_tokens=min(96, room), temperature=temperature, stop_tokens=chat.stop_tokens,
                                vocab_size=tokenizer.vocab_size, seed=start)
        turns = [ToolTurn(chat, toolbox) if toolbox else None for _ in chunk]
        began = time.perf_counter()
        outputs = generate(model, prompts, config, tools=turns)
        rows["seconds"] += time.perf_counter() - began
        for example, tokens, turn in zip(chunk, outputs, turns):
            final = [m for m in chat.parse_reply(tokens) if m["role"] == "assistant"][-1]["content"]
            own = sum(chat.generated_mask(tokens)) + 1  # and the stop token
            rows["right"].append(int(task.verify(example, final)))
            rows["own"].append(own)
            rows["fed"].append(len(tokens) + 1 - own)
            rows["calls"].append(len(turn.runs) if turn else 0)
    rows["seconds"] /= n
    return rows


def seen_in_training(task, n: int) -> int:
    """How many of the n held-out questions appear among the fine-tuning mixture's training conversations."""
    held_out = {example.question for example in task.examples("test", n)}
    seen = set()
    for part in MixtureConfig.from_spec(TOOL_MIXTURE).parts:
        trained = load_task(part.source.removeprefix("task:"), part.task_options)
        if trained.name == task.name:
            seen |= {example.question for example in trained.examples("train", part.n)}
    return len(held_out & seen)


def paired(a: list[int], b: list[int]) -> tuple[float, float, float]:
    """Mean of a - b over the same questions, with its 95% t-interval."""
    differences = [x - y for x, y in zip(a, b)]
    low, high = mean_interval(differences)
    return sum(differences) / len(differences), low, high


def measure(args) -> tuple[dict, dict]:
    """Every seed's two models on every held-out task, with and without tools; the pooled rows and per-seed accuracy."""
    results: dict = {}
    per_seed: dict = {}
    tasks = {name: load_task(task, tuple(options.items())) for name, (task, options, _, _) in HELD_OUT.items()}
    counts = {name: min(round(args.questions * HELD_OUT[name][3]), task.test_size) for name, task in tasks.items()}
    for name, task in tasks.items():
        print(f"held out: {name}, {counts[name]} questions of {task!r}; {seen_in_training(task, counts[name])} of them "
              "in the training data")
    for seed in range(args.seeds):
        for stage, folder in zip(("sft", "rl"), train(args.base, args.out, seed)):
            for name, task in tasks.items():
                for offered, temperature in ((HELD_OUT[name][2], 0.0), (None, 0.0), (HELD_OUT[name][2], SAMPLED)):
                    key = (stage, name, "yes" if offered else "no", f"t={temperature:g}")
                    rows = answers(folder, task, offered, counts[name], temperature)
                    pooled = results.setdefault(key, {"right": [], "own": [], "fed": [], "calls": [], "seconds": []})
                    for field in ("right", "own", "fed", "calls"):
                        pooled[field] += rows[field]
                    pooled["seconds"].append(rows["seconds"])
                    per_seed.setdefault(key, []).append(sum(rows["right"]) / len(rows["right"]))
    return results, per_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="the pretrained model (the demo's: runs/shakespeare/train)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-tool-use"), help="where the trained models go")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--questions", type=int, default=500, help="held-out arithmetic questions (the other tasks: 0.4 of it)")
    parser.add_argument("--json", type=Path, help="write the numbers here too")
    args = parser.parse_args()
    if not args.base.exists():
        sys.exit(f"no pretrained model at {args.base}: run the demo first (.venv/bin/gptlab run)")
    args.out.mkdir(parents=True, exist_ok=True)
    print(header("tool use: with and without tools, fine-tuned and after RL", ["torch"]))
    results, per_seed = measure(args)
    report(results, per_seed, args)


def report(results: dict, per_seed: dict, args) -> None:
    print(f"\n{'model':<5} {'task':<18} {'tools':<5} {'decode':<6} {'accuracy':>8} {'per seed':>12} {'own tok':>8} {'fed tok':>8} "
          f"{'calls':>6} {'s/answer':>9}")
    table = {}
    for key, rows in results.items():
        n = len(rows["right"])
        row = {"accuracy": sum(rows["right"]) / n, "per_seed": per_seed[key], "own_tokens": sum(rows["own"]) / n,
               "fed_tokens": sum(rows["fed"]) / n, "calls": sum(rows["calls"]) / n,
               "seconds": sum(rows["seconds"]) / len(rows["seconds"])}
        table[" / ".join(key)] = row
        seeds = " ".join(f"{a:.2f}" for a in row["per_seed"])
        print(f"{key[0]:<5} {key[1]:<18} {key[2]:<5} {key[3]:<6} {row['accuracy']:>8.3f} {seeds:>12} {row['own_tokens']:>8.1f} "
              f"{row['fed_tokens']:>8.1f} {row['calls']:>6.2f} {row['seconds']:>9.4f}")
    print(f"\npaired differences over the same questions ({args.seeds} seeds pooled), 95% t-intervals:")
    comparisons = {}
    for name in HELD_OUT:
        sampled = f"t={SAMPLED:g}"
        for label, a, b in ((f"sft: with - without tools, {name}", ("sft", name, "yes", "t=0"), ("sft", name, "no", "t=0")),
                            (f"rl - sft, with tools, {name}", ("rl", name, "yes", "t=0"), ("sft", name, "yes", "t=0")),
                            (f"rl - sft, with tools, {sampled}, {name}", ("rl", name, "yes", sampled), ("sft", name, "yes", sampled))):
            mean, low, high = paired(results[a]["right"], results[b]["right"])
            comparisons[label] = {"mean": mean, "low": low, "high": high}
            print(f"  {label:<56} {mean:+.3f}  [{low:+.3f}, {high:+.3f}]{'  excludes 0' if low > 0 or high < 0 else ''}")
    if args.json:
        args.json.write_text(json.dumps({"table": table, "paired": comparisons}, indent=1) + "\n")


if __name__ == "__main__":
    main()
