"""Speculative decoding: a small draft trained by gptlab guesses, the demo model checks; acceptance rate and speed-up.

    .venv/bin/python bench/speculative.py                          # target runs/shakespeare (what `make demo` writes)
    .venv/bin/python bench/speculative.py --model /tmp/demo --draft runs/my-draft

The target is the demo model. The draft is a 1-layer model of the same width trained by `gptlab train` on the
target's prepared data (DEMO/data) with its tokenizer, for --train-seconds in all, into --draft-out (a folder this
bench owns; a rerun resumes it up to that limit, then reuses it). Each configuration decodes the same prompts, batch 1, --new-tokens each (no stop
token, so every run makes the same number of tokens); tokens/s = new tokens / wall time of the whole call, prefill
included; each figure is the median of --rounds rounds, the configurations taking turns within a round. Greedy speculative output is checked equal to the target's
own greedy output before anything is timed. The draft alone is timed too: speculative decoding pays only when a
draft pass costs much less than a target pass and the draft guesses well.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from machine import REPO_ROOT, header

from gptlab.infer import SamplingConfig, generate
from gptlab.infer.speculative import SpeculativeDecoder
from gptlab.load.model_folders import load_model, load_model_tokenizer

PROMPTS = ["ROMEO:\n", "First Citizen:\nBefore we proceed any further, hear me speak.\n", "KING HENRY:\n", "To be"]


def train_draft(model: str, out: Path, seconds: int, layers: int) -> None:
    """`gptlab train` a small draft on the target's data and tokenizer; rerunning resumes or reuses the run in `out`."""
    run = Path(model)
    data, tokenizer = run / "data", run / "tokenizer"
    if not (data / "manifest.json").is_file():
        sys.exit(f"no prepared data at {data}: give --draft MODEL, or a --model made by `gptlab run` (make demo)")
    command = [sys.executable, "-m", "gptlab", "train", "--data", str(data), "--tokenizer", str(tokenizer), "--out", str(out),
               "--model.n-layer", str(layers), "--time-limit", str(seconds), "--eval-every", "0", "--checkpoint-every", "100000"]
    print(f"# training the draft: {' '.join(command[2:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def timed(run) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    tokens = run()
    return time.perf_counter() - start, tokens


def rate(runs: list[tuple[float, list[list[int]]]]) -> float:
    """Median tokens/s over the rounds."""
    return statistics.median(sum(map(len, tokens)) / seconds for seconds, tokens in runs)


def measure(target, draft, prompts: list[list[int]], config: SamplingConfig, ks: list[int], rounds: int) -> list[str]:
    """Rows of the table for one sampling mode: target alone, draft alone, then speculative at each K.

    The configurations take turns within each round, so a change in the machine's load hits all of them alike."""
    decoders = {k: SpeculativeDecoder(target, draft, k) for k in ks}
    runs = {"target": lambda: [generate(target, [ids], config)[0] for ids in prompts],
            "draft": lambda: [generate(draft, [ids], config)[0] for ids in prompts]}
    runs.update({k: (lambda decoder=decoder: decoder.generate(prompts, config)) for k, decoder in decoders.items()})
    if config.temperature == 0:
        expected = runs["target"]()
        for k, decoder in decoders.items():
            if decoder.generate(prompts, config) != expected:
                sys.exit(f"K={k}: greedy speculative tokens differ from the target's own: a bug")
    times: dict = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(timed(run))
    base, drafted = rate(times["target"]), rate(times["draft"])
    rows = [f"  target alone     {base:7.1f} tok/s", f"  draft alone      {drafted:7.1f} tok/s   ({drafted / base:.2f}x the target)"]
    for k, decoder in decoders.items():
        speed, stats = rate(times[k]), decoder.stats  # every pass yields its accepted guesses + 1 (no stop token here)
        rows.append(f"  speculative K={k} {speed:7.1f} tok/s   speed-up {speed / base:.2f}x   acceptance "
                    f"{stats.acceptance_rate:5.1%}   {(stats.accepted + stats.steps) / stats.steps:.2f} tokens per target pass")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/shakespeare", help="the target: a `gptlab run` folder (default runs/shakespeare)")
    parser.add_argument("--draft", help="a draft model sharing the target's tokenizer (default: train one into --draft-out)")
    parser.add_argument("--draft-out", default="runs/bench-speculative-draft", help="where the trained draft goes")
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--train-seconds", type=int, default=330, help="the draft's training time, in total over reruns")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ks", default="2,4,6", help="draft tokens per step to try, comma-separated")
    parser.add_argument("--temperature", type=float, default=0.8, help="for the sampled rows (default 0.8, top-k 50)")
    args = parser.parse_args()
    print(header("Speculative decoding: draft + target vs the target alone, batch 1, CPU", ["gptlab", "torch"]), flush=True)
    draft_spec = args.draft
    if draft_spec is None:
        out = Path(args.draft_out) if Path(args.draft_out).is_absolute() else REPO_ROOT / args.draft_out
        train_draft(args.model, out, args.train_seconds, args.draft_layers)  # resumes up to the limit; nothing to do once there
        draft_spec = str(out)
    target, path = load_model(args.model)
    draft, draft_path = load_model(draft_spec)
    tokenizer, _ = load_model_tokenizer(args.model, path, target, None)
    own, _ = load_model_tokenizer(draft_spec, draft_path, draft, None)
    if own.fingerprint() != tokenizer.fingerprint():
        sys.exit(f"the draft {draft_spec} has another tokenizer than {args.model}")
    target, draft = target.float().eval(), draft.float().eval()
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    print(f"# target {path}: {target.config.n_layer} layers, n_embd {target.config.n_embd}, {target.num_params() / 1e6:.2f}M params")
    print(f"# draft  {draft_path}: {draft.config.n_layer} layers, n_embd {draft.config.n_embd}, {draft.num_params() / 1e6:.2f}M params")
    print(f"# {len(prompts)} prompts x {args.new_tokens} new tokens, float32, torch threads {torch.get_num_threads()}, "
          f"median of {args.rounds} rounds")
    ks = [int(k) for k in args.ks.split(",")]
    for name, config in [
        ("greedy (same tokens as the target alone, checked)", SamplingConfig(max_new_tokens=args.new_tokens, temperature=0, vocab_size=tokenizer.vocab_size)),
        (f"sampled (temperature {args.temperature}, top-k 50, seed 0)",
         SamplingConfig(max_new_tokens=args.new_tokens, temperature=args.temperature, top_k=50, seed=0, vocab_size=tokenizer.vocab_size)),
    ]:
        print(f"\n{name}")
        for row in measure(target, draft, prompts, config, ks, args.rounds):
            print(row, flush=True)


if __name__ == "__main__":
    main()
