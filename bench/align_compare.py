"""PPO, GRPO and DPO side by side on the demo setting, from two seeds of the base model, at equal training sequences.

    .venv/bin/python bench/align_compare.py                           # seeds 1 and 2, into /tmp/gptlab-align-compare
    .venv/bin/python bench/align_compare.py --workspace DIR --seeds 1,2,3
    .venv/bin/python bench/align_compare.py --stages demo,sft         # prepare only; --stages report: tables only

Each stage is the `gptlab` command a user runs (printed, with its wall-clock time), into WORKSPACE/seed-S/:

    demo   gptlab run with a fixed step count instead of the 180 s budget, so every machine trains the same base model
    sft    gptlab sft on two-digit sums (their held-out questions are not in the training set: nothing to memorise)
    rm     gptlab rm: a reward model on task pairs (verified reply vs the same reply made wrong)
    ppo    gptlab ppo with that reward model as the reward (RLHF)
    ppo_verifier  gptlab ppo with the task's verifier as the reward: the algorithm, apart from the reward model
    grpo   gptlab grpo with the task's verifier as the reward
    dpo    gptlab dpo on task pairs

A finished stage is recorded in WORKSPACE/seed-S/STAGE.json and skipped on a rerun; a command that is not
there (an older gptlab) is reported as missing. The methods start from the same SFT model, draw their prompts
from the same task's train split and train on the same number of sequences (SEQUENCES: sampled completions
for PPO and GRPO, chosen + rejected replies for DPO); wall-clock time and generated tokens are reported beside.
Every model is then measured here the same way, on the same held-out questions: greedy accuracy, pass@1 (16
samples at temperature 1), and the KL to the SFT model, sum over a sample's tokens of log pi(t) - log pi_sft(t),
averaged over the samples (a Monte Carlo estimate of KL(pi || pi_sft) per reply). Changes are paired over
questions with 95% t intervals; pooled over seeds, each question's change is averaged over the seeds first.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from machine import header

FP32 = ["--precision", "fp32", "--threads", "1"]  # the result must not depend on native bf16 or on the core count
BASE_STEPS = 600  # the demo's pretraining, fixed in steps (the demo itself runs 180 s: 991 steps on a 2-core EPYC)
TASK = "arithmetic[digits=2]"  # 1 to 2 digit sums: 500 held-out questions, thousands to train on
SFT_STEPS = 400  # chosen so that the chat model is right on some held-out sums, not all (measured: see docs)
RM_STEPS = 600  # 32 pairs each: at 150 steps and lr 1e-4 the reward model stayed at chance on sums (measured)
SEQUENCES = 3840  # training sequences per method: half GRPO's preset (30 steps x 16 prompts x 8 samples), to fit 2 cores
HELDOUT = 100  # held-out questions measured (the task's first 100 test questions)
SAMPLES = 16  # samples per held-out question for pass@1 and the KL
MAX_NEW_TOKENS = 24  # as GRPO's preset


def stages(seed: int, folder: Path) -> dict[str, list[str]]:
    """Stage name -> the gptlab command line (without `gptlab`), in order."""
    sft, task_data = str(folder / "sft"), f"task:{TASK.replace('[', '[n=40000,')}"
    pairs = f"task:{TASK.replace('[', f'[n={SEQUENCES // 2},')}"
    return {
        "demo": ["run", "--out", str(folder / "demo"), "--train.seed", str(seed), "--train.time-limit", "0",
                 "--train.max-steps", str(BASE_STEPS), "--train.precision", "fp32", "--sft.precision", "fp32",
                 "--sft.max-steps", "20", "--sft.task-examples", "10", "--card-examples", "10", "--threads", "1"],
        "sft": ["sft", "--init", str(folder / "demo" / "train"), "--data", task_data, "--max-steps", str(SFT_STEPS),
                "--seed", str(seed), "--task-examples", str(HELDOUT), "--out", sft, *FP32],
        "rm": ["rm", "--init", sft, "--data", f"task:{TASK.replace('[', '[n=20000,')}", "--optimizer.lr", "3e-4", "--max-steps",
               str(RM_STEPS), "--eval-every", "100", "--seed", str(seed), "--out", str(folder / "rm"), *FP32],
        "ppo": ["ppo", "--init", sft, "--task", TASK, "--reward", f"rm:{folder / 'rm'}", "--rollout-prompts", "64",
                "--minibatches", "2", "--ppo-epochs", "2", "--max-steps", str(SEQUENCES // 64 * 4), "--seed", str(seed),
                "--out", str(folder / "ppo"), *FP32],
        "ppo_verifier": ["ppo", "--init", sft, "--task", TASK, "--reward", "verifier", "--rollout-prompts", "64",
                         "--minibatches", "2", "--ppo-epochs", "2", "--max-steps", str(SEQUENCES // 64 * 4), "--seed", str(seed),
                         "--out", str(folder / "ppo_verifier"), *FP32],
        "grpo": ["grpo", "--init", sft, "--task", TASK, "--prompts-per-step", "16", "--group-size", "8",
                 "--max-steps", str(SEQUENCES // 128), "--seed", str(seed), "--out", str(folder / "grpo"), *FP32],
        "dpo": ["dpo", "--init", sft, "--data", pairs, "--max-steps", str(SEQUENCES // 64), "--seed", str(seed),
                "--out", str(folder / "dpo"), *FP32],
    }


def gptlab() -> str:
    return str(Path(sys.executable).parent / "gptlab")


def available(verb: str) -> bool:
    """Whether this gptlab has the command (the RM and PPO commands are newer than the others)."""
    return subprocess.run([gptlab(), verb, "--help"], capture_output=True).returncode == 0


def run_stage(folder: Path, name: str, argv: list[str], log) -> dict | None:
    """Run one command (niced: it shares the machine), or read back its record; None if the command is missing."""
    record = folder / f"{name}.json"
    if record.is_file():
        return json.loads(record.read_text())
    if not available(argv[0]):
        log(f"  {name}: `gptlab {argv[0]}` is not in this gptlab: skipped")
        return None
    command = shlex.join(["gptlab", *argv])
    log(f"  {name}: {command}")
    start = time.perf_counter()
    with open(folder / f"{name}.log", "w") as output:
        code = subprocess.run(["nice", "-n", "10", gptlab(), *argv], stdout=output, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    if code:
        tail = (folder / f"{name}.log").read_text().strip().splitlines()[-1:]
        log(f"  {name}: failed (exit {code}) after {seconds:.0f} s: {' '.join(tail)}  (log: {folder / f'{name}.log'})")
        return None
    result = {"command": command, "seconds": seconds, "generated_tokens": generated_tokens(folder / name)}
    write_record(record, result)
    log(f"    done in {seconds:.0f} s")
    return result


def write_record(path: Path, result: dict) -> None:
    """Whole or not at all: a rerun trusts what it finds (two invocations may share a workspace)."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(result, indent=1))
    os.replace(temporary, path)


def generated_tokens(run: Path) -> float | None:
    """Tokens sampled in training, from the logged mean completion length (RL runs): length x completions."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    lengths = [row["length"] for row in map(json.loads, path.read_text().splitlines()) if "length" in row]
    return sum(lengths) / len(lengths) * SEQUENCES if lengths else None


def measure(folder: Path, name: str, start: str, log) -> dict:
    """Held-out greedy right/wrong, right samples of SAMPLES and the KL to the start, per question (cached)."""
    record = folder / f"{name}.measure.json"
    if record.is_file():
        return json.loads(record.read_text())
    import torch

    from gptlab.align.rl.rollout import rollout
    from gptlab.align.start import find_init
    from gptlab.chat import ChatFormat
    from gptlab.chat.tasks import get_task
    from gptlab.data.match import find_model_tokenizer
    from gptlab.eval.chat import grade
    from gptlab.infer.generate import SamplingConfig
    from gptlab.model.io import load_model

    torch.set_num_threads(1)
    path, reference_path = find_init(str(folder / name)), find_init(start)
    model, reference = load_model(path).eval(), load_model(reference_path).eval()
    chat = ChatFormat(find_model_tokenizer(path) or find_model_tokenizer(reference_path))
    task = get_task("arithmetic", digits=2)
    examples = task.examples("test", HELDOUT)
    greedy = [g.correct for g in grade(model, chat, task, examples, max_new_tokens=MAX_NEW_TOKENS)]
    prompts = [chat.prompt([{"role": "user", "content": example.question}]) for example in examples]
    sampling = SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, stop_tokens=chat.stop_tokens,
                              vocab_size=chat.tokenizer.vocab_size)
    groups = rollout(model, prompts, sampling, samples=SAMPLES, seed=20240)
    right = [sum(task.verify(example, chat.tokenizer.decode([t for t in c.tokens if t not in chat.stop_tokens])) for c in group)
             for example, group in zip(examples, groups)]
    kl = [sample_kl(model, reference, prompt, group) for prompt, group in zip(prompts, groups)]
    result = {"greedy": greedy, "right": right, "kl": kl}
    write_record(record, result)
    log(f"    measured {name}: accuracy {sum(greedy) / len(greedy):.3f}, pass@1 {sum(right) / (SAMPLES * len(right)):.3f}")
    return result


def sample_kl(model, reference, prompt: list[int], group) -> float:
    """Mean over the samples of sum_t log pi(t) - log pi_ref(t): the samples are pi's, so this estimates KL(pi || ref)."""
    import torch

    from gptlab.align.logprobs import token_logprobs
    from gptlab.align.rl.rollout import pad_rows

    sequences = [prompt + c.tokens for c in group]
    x, y = pad_rows(sequences, [len(prompt)] * len(group), max(map(len, sequences)))
    with torch.no_grad():
        difference = token_logprobs(model, x, y) - token_logprobs(reference, x, y)
    return float(difference.sum(-1).mean())


def interval_text(differences: list[float]) -> str:
    from gptlab.eval.stats import mean_interval

    low, high = mean_interval(differences)
    return f"{sum(differences) / len(differences):+.3f} ({low:+.3f} to {high:+.3f})"


def rm_accuracy(folder: Path) -> tuple[int, int] | None:
    """The reward model's held-out pair accuracy: task test questions, verified reply vs the same reply made wrong."""
    if not (folder / "rm.json").is_file():
        return None
    from gptlab.align.preference.pairs import wrong_reply
    from gptlab.align.rl.rm_reward import load_reward_model
    from gptlab.chat.tasks import get_task

    task = get_task("arithmetic", digits=2)
    scorer = load_reward_model(str(folder / "rm"))
    examples = [example for example in task.examples("test", task.test_size) if wrong_reply(task, example)]
    prompts = [[{"role": "user", "content": example.question}] for example in examples]
    chosen = scorer.score(prompts, [example.reply for example in examples])
    rejected = scorer.score(prompts, [wrong_reply(task, example) for example in examples])
    return sum(c > r for c, r in zip(chosen, rejected)), len(examples)


def verdict(differences: list[float]) -> str:
    """Helps / hurts when the 95% interval excludes 0, else no measurable change."""
    from gptlab.eval.stats import mean_interval

    low, high = mean_interval(differences)
    return "helps" if low > 0 else "hurts" if high < 0 else "no measurable change"


def method_rows(runs: list[dict], measures: list[dict], starts: list[dict]) -> list[str]:
    """Table rows of one method over one or more seeds (each question's change averaged over the seeds)."""
    n = len(starts[0]["greedy"])
    greedy = [sum(m["greedy"][i] - s["greedy"][i] for m, s in zip(measures, starts)) / len(starts) for i in range(n)]
    sampled = [sum(m["right"][i] - s["right"][i] for m, s in zip(measures, starts)) / (SAMPLES * len(starts)) for i in range(n)]
    before = sum(sum(s["greedy"]) for s in starts) / (n * len(starts))
    after = sum(sum(m["greedy"]) for m in measures) / (n * len(starts))
    pass_before = sum(sum(s["right"]) for s in starts) / (SAMPLES * n * len(starts))
    pass_after = sum(sum(m["right"]) for m in measures) / (SAMPLES * n * len(starts))
    kl = sum(sum(m["kl"]) / n for m in measures) / len(measures)
    seconds = sum(run["seconds"] for run in runs) / len(runs)
    tokens = [run["generated_tokens"] for run in runs if run.get("generated_tokens")]
    generated = f"{sum(tokens) / len(tokens):,.0f}" if tokens else "0"
    return [f"{before:.3f} -> {after:.3f}", interval_text(greedy), f"{pass_before:.3f} -> {pass_after:.3f}",
            interval_text(sampled), f"{kl:.2f}", f"{seconds:.0f}", generated, verdict(sampled)]


HEAD = ("| method (reward) | greedy acc. before -> after | change (95% CI) | pass@1 before -> after | change (95% CI) "
        "| KL to SFT (nats/reply) | wall-clock s | generated tokens | pass@1 verdict |")
LABELS = {"ppo": "PPO (reward model)", "ppo_verifier": "PPO (verifier)", "grpo": "GRPO (verifier)", "dpo": "DPO (task pairs)"}


def table(title: str, seeds: list[int], results: dict) -> str:
    """One markdown table: a row per method present for every listed seed."""
    lines = [f"### {title}", "", HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    for method, label in LABELS.items():
        if all(method in results[seed]["measures"] for seed in seeds):
            cells = method_rows([results[seed]["runs"][method] for seed in seeds],
                                [results[seed]["measures"][method] for seed in seeds],
                                [results[seed]["measures"]["sft"] for seed in seeds])
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        else:
            lines.append(f"| {label} | not run (see above) |" + " |" * 7)
    lines.append("")
    for seed in seeds:
        accuracy = results[seed].get("rm_accuracy")
        if accuracy:
            from gptlab.eval.stats import wilson_interval

            low, high = wilson_interval(*accuracy)
            lines.append(f"seed {seed}: reward model held-out pair accuracy {accuracy[0]}/{accuracy[1]} = "
                         f"{accuracy[0] / accuracy[1]:.3f} (95% Wilson {low:.3f}-{high:.3f})")
    return "\n".join(lines)


def run_seed(workspace: Path, seed: int, log, only: list[str] | None = None) -> dict:
    """Every stage of one seed (or those in `only`), then the measurements of each model that exists."""
    folder = workspace / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    log(f"seed {seed}: {folder}")
    runs = {}
    for name, argv in stages(seed, folder).items():
        if only and name not in only:  # not run now, but a finished one is still measured and reported
            if (folder / f"{name}.json").is_file():
                runs[name] = json.loads((folder / f"{name}.json").read_text())
            continue
        if name in ("ppo",) and "rm" not in runs:
            log("  ppo: needs the reward model: skipped")
            continue
        result = run_stage(folder, name, argv, log)
        if result is not None:
            runs[name] = result
        elif name in ("demo", "sft"):
            raise SystemExit(f"seed {seed}: the {name} stage failed; the methods need it")
    measures = {name: measure(folder, name, str(folder / "sft"), log) for name in ("sft", *LABELS) if name in runs}
    return {"runs": runs, "measures": measures, "rm_accuracy": rm_accuracy(folder)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default="/tmp/gptlab-align-compare", help="models and runs (reused on a rerun)")
    parser.add_argument("--seeds", default="1,2", help="seeds of the base model, comma-separated (default 1,2)")
    parser.add_argument("--stages", default="", help="only these stages, comma-separated (e.g. demo,sft to prepare)")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    workspace = Path(args.workspace)
    print(header("PPO, GRPO and DPO at equal training sequences on the demo setting", ["torch"]))
    print(f"# {SEQUENCES:,} training sequences per method; task {TASK}; {HELDOUT} held-out questions x {SAMPLES} samples; fp32")
    start = time.perf_counter()
    only = [name for name in args.stages.split(",") if name] or None
    results = {seed: run_seed(workspace, seed, lambda line: print(line, flush=True), only) for seed in seeds}
    for seed in seeds:
        print("\n" + table(f"seed {seed}", [seed], results))
    if len(seeds) > 1:
        print("\n" + table(f"pooled over seeds {', '.join(map(str, seeds))} (means; each question's change averaged over seeds)",
                           seeds, results))
    print(f"\n# bench wall-clock this invocation: {time.perf_counter() - start:.0f} s; stage commands: WORKSPACE/seed-S/STAGE.json")


if __name__ == "__main__":
    main()
