"""Decoding speed: gptlab's KV-cache engine vs full recomputation each step, side by side, same model and prompt.

    .venv/bin/python bench/generate.py                    # gpt2-mini (4 layers, d=128, 50257 vocab), random weights
    .venv/bin/python bench/generate.py --preset gpt2      # GPT-2 124M (slow on a CPU)

Three ways to produce the same greedy tokens:

- kv-cache:  `generate(model, [prompt], use_cache=True)`: prefill once, then one position per step.
- recompute: `generate(model, [prompt], use_cache=False)`: gptlab's reference; every step reruns the
             whole sequence, and GPT.forward returns logits at every position.
- nanogpt:   nanoGPT's `generate` loop (crop to block_size, rerun the sequence, take the last logits,
             append). nanoGPT's forward applies lm_head to the last position only when it has no targets;
             a forward hook on the final norm does the same here, so this line costs what nanoGPT's loop costs.

tokens/s = new tokens / wall time of the whole call, prefill included. Weights are random
(`torch.manual_seed`): speed does not depend on them. Every mode must produce identical tokens.
"""

from __future__ import annotations

import argparse
import time

import torch
from machine import header

from gptlab.infer import SamplingConfig, generate
from gptlab.model import GPT, preset


def nanogpt_generate(model: GPT, idx: torch.Tensor, new_tokens: int) -> list[int]:
    """nanoGPT's generate (greedy), with lm_head on the last position only."""
    block = model.config.block_size
    last_only = model.transformer["ln_f"].register_forward_hook(lambda module, inputs, output: output[:, -1:])
    try:
        with torch.inference_mode():
            for _ in range(new_tokens):
                idx_cond = idx if idx.size(1) <= block else idx[:, -block:]
                logits, _ = model(idx_cond)
                next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
                idx = torch.cat([idx, next_token], dim=1)
    finally:
        last_only.remove()
    return idx[0, -new_tokens:].tolist()


def timed(run, device: torch.device) -> tuple[float, list[int]]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-mini", help="model preset (default gpt2-mini)")
    parser.add_argument("--block-size", type=int, default=1024, help="context length of the model (default 1024)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per mode; the best is shown")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    if args.prompt_tokens + args.new_tokens > args.block_size:
        parser.error(f"--prompt-tokens + --new-tokens = {args.prompt_tokens + args.new_tokens} > --block-size {args.block_size}")
    device = torch.device(args.device)

    print(header("Decoding: KV cache vs full recomputation (nanoGPT generate), same model, prompt and tokens", ["gptlab", "torch"]))
    torch.manual_seed(args.seed)
    config = preset(args.preset, block_size=args.block_size)
    model = GPT(config).to(device).eval()
    prompt = torch.randint(0, config.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(args.seed)).tolist()
    print(
        f"# model: {args.preset} (block_size {config.block_size}), {model.num_params() / 1e6:.1f}M params, "
        f"float32 on {device}, torch threads {torch.get_num_threads()}"
    )
    print(f"# prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, greedy, batch 1; best of {args.repeats}")

    def greedy(new: int) -> SamplingConfig:
        return SamplingConfig(max_new_tokens=new, temperature=0)

    idx = torch.tensor([prompt], device=device)
    modes = {
        "kv-cache": lambda new: generate(model, [prompt], greedy(new))[0],
        "recompute": lambda new: generate(model, [prompt], greedy(new), use_cache=False)[0],
        "nanogpt": lambda new: nanogpt_generate(model, idx, new),
    }
    rates, outputs = {}, {}
    for name, run in modes.items():
        run(8)  # warm-up: allocator, kernels
        best = float("inf")
        for _ in range(args.repeats):
            seconds, outputs[name] = timed(lambda run=run: run(args.new_tokens), device)
            best = min(best, seconds)
        rates[name] = args.new_tokens / best
        print(f"{name:<10} {args.new_tokens} tokens in {best:7.2f} s  {rates[name]:9.1f} tokens/s", flush=True)
    print(
        f"ratio  kv-cache / nanogpt {rates['kv-cache'] / rates['nanogpt']:.2f}   "
        f"kv-cache / recompute {rates['kv-cache'] / rates['recompute']:.2f}"
    )
    identical = all(tokens == outputs["kv-cache"] for tokens in outputs.values())
    print(f"tokens identical: {'yes' if identical else 'NO'}")
    if not identical:
        raise SystemExit("the modes produced different tokens")


if __name__ == "__main__":
    main()
