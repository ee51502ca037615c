"""GRPO rollout speed: the whole step's groups in one engine call vs one prompt at a time, side by side.

    .venv/bin/python bench/grpo_rollout.py                                  # the demo's model size, random weights
    .venv/bin/python bench/grpo_rollout.py --model runs/shakespeare/sft     # a chat model (its answers stop early)

Rollouts are most of GRPO's time. One round samples P prompts x G completions three ways:

- engine:      gptlab.align.rl.rollout.rollout, every request in one batched KV-cache Engine call (what gptlab grpo does)
- per-prompt:  generate(model, [prompt] * G): each prompt's group as one static batch, prompt after prompt
- one-by-one:  generate(model, [prompt]): one completion at a time (KV cache, batch 1)

Reported: generated tokens/s (stop tokens included) per way, medians over `--rounds`, the ratio of the
engine to each, and a Mann-Whitney test of the rounds (p: how likely a gap this large is from noise).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import header
from scipy.stats import mannwhitneyu

from gptlab.align.rl.rollout import rollout
from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.chat.tasks import get_task
from gptlab.data.corpus import shakespeare_documents
from gptlab.infer.generate import SamplingConfig, generate
from gptlab.model import GPT, preset
from gptlab.tokenizer import Tokenizer


def load(path: str | None) -> tuple[GPT, ChatFormat]:
    if path:
        from gptlab.data.match import find_model_tokenizer
        from gptlab.model.io import load_model

        return load_model(path).eval(), ChatFormat(find_model_tokenizer(path))
    torch.manual_seed(0)
    tokenizer = add_chat_tokens(Tokenizer.train(shakespeare_documents()[:6], vocab_size=4096))
    model = GPT(preset("gpt2-mini", vocab_size=tokenizer.vocab_size, n_layer=4, n_head=4, n_embd=192, block_size=128))
    return model.eval(), ChatFormat(tokenizer)


def engine(model, prompts, sampling, G, seed) -> int:
    groups = rollout(model, prompts, sampling, samples=G, seed=seed)
    return sum(len(c.tokens) for group in groups for c in group)


def per_prompt(model, prompts, sampling, G, seed) -> int:
    total = 0
    for i, prompt in enumerate(prompts):
        rows = generate(model, [prompt] * G, SamplingConfig(**{**sampling.__dict__, "seed": seed + i}))
        total += sum(len(row) + (len(row) < sampling.max_new_tokens) for row in rows)  # + the stop token
    return total


def one_by_one(model, prompts, sampling, G, seed) -> int:
    total = 0
    for i, prompt in enumerate(prompts):
        for j in range(G):
            (row,) = generate(model, [prompt], SamplingConfig(**{**sampling.__dict__, "seed": seed + i * G + j}))
            total += len(row) + (len(row) < sampling.max_new_tokens)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a chat model folder or run (default: the demo's size, random weights)")
    parser.add_argument("--prompts", type=int, default=16, help="P: prompts per rollout (default 16)")
    parser.add_argument("--group", type=int, default=8, help="G: completions per prompt (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="longest completion (default 32)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every way (default 5)")
    args = parser.parse_args()
    print(header("GRPO rollouts: one engine call vs one prompt at a time", ["torch"]))
    model, chat = load(args.model)
    task = get_task("arithmetic", digits=1)
    prompts = [chat.prompt([{"role": "user", "content": e.question}]) for e in task.examples("train", args.prompts)]
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, stop_tokens=chat.stop_tokens,
                              vocab_size=chat.tokenizer.vocab_size)
    ways = {"engine": engine, "per-prompt": per_prompt, "one-by-one": one_by_one}
    engine(model, prompts[:2], sampling, 2, 0)  # warm up
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds):
        for name, way in ways.items():
            start = time.perf_counter()
            tokens = way(model, prompts, sampling, args.group, 1000 * round_)
            rates[name].append(tokens / (time.perf_counter() - start))
    print(f"model: {args.model or 'random, gpt2 4 layers x 192'}; P={args.prompts} x G={args.group}, "
          f"max_new_tokens {args.max_new_tokens}, temperature 1; {args.rounds} rounds (medians)")
    best = statistics.median(rates["engine"])
    for name, values in rates.items():
        rate = statistics.median(values)
        versus = "" if name == "engine" else (f"  engine is {best / rate:5.2f}x  p={mannwhitneyu(rates['engine'], values).pvalue:.3f}"
                                              " (Mann-Whitney)")
        print(f"{name:11s} {rate:9,.0f} generated tokens/s{versus}  (rounds: {', '.join(f'{v:,.0f}' for v in values)})")


if __name__ == "__main__":
    main()
