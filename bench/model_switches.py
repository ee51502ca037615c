"""What each architecture switch costs per training step, side by side with the arch's own model.

    .venv/bin/python bench/model_switches.py                          # gpt2-mini, batch 4 x 256, CPU fp32
    .venv/bin/python bench/model_switches.py --preset gpt2 --device cuda --batch 16 --seq-len 1024

One forward + backward (no optimizer) per step, each switch alone on top of the preset, then all
of them together. Weights are random (`torch.manual_seed`): speed does not depend on them. Besides
the time, each line shows the parameters and the training FLOPs per token that gptlab.model.accounting
counts for it. Whether a switch trains a better model is a different question: train it
(`gptlab train --model.activation relu2 ...`) and compare validation bits per byte.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch
from machine import header

from gptlab.model import GPT, preset
from gptlab.model.accounting import flops_per_token, param_counts


def variants(window: int) -> dict[str, dict]:
    every = dict(position="rotary", norm="rms", activation="relu2", qk_norm=True, tie_embeddings=False,
                 logit_softcap=15.0, zero_init=True, attn_window=window, window_pattern="SSSL")
    return {
        "arch's own": {},
        "position rotary": dict(position="rotary"),
        "norm rms": dict(norm="rms"),
        "activation relu2": dict(activation="relu2"),
        "activation swiglu": dict(activation="swiglu"),
        "qk_norm": dict(qk_norm=True),
        "untied head": dict(tie_embeddings=False),
        "logit_softcap 15": dict(logit_softcap=15.0),
        f"window {window} SSSL": dict(attn_window=window, window_pattern="SSSL"),
        "all of the above": every,
    }


def step_seconds(model: GPT, idx: torch.Tensor, amp) -> float:
    """Wall time of one forward + backward."""
    if idx.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with amp:
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    model.zero_grad(set_to_none=True)
    if idx.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def median_step_seconds(models: dict[str, GPT], idx: torch.Tensor, rounds: int, amp) -> dict[str, float]:
    """Round robin over the variants (a warm-up round first), so a busy machine slows them all alike; the median."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(rounds + 1):
        for name, model in models.items():
            seconds = step_seconds(model, idx, amp)
            if round_:
                times[name].append(seconds)
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-mini", help="model preset (default gpt2-mini)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    parser.add_argument("--window", type=int, default=64, help="attn_window of the sliding-window line (default 64)")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per variant, taken round robin (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (bf16 autocast on cuda)")
    args = parser.parse_args()
    device = torch.device(args.device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    print(header(f"model switches: training step time, {args.preset}, batch {args.batch} x {args.seq_len}, {device}",
                 ["torch"]))
    block_size = max(args.seq_len, preset(args.preset).block_size)
    configs = {name: preset(args.preset, **overrides, block_size=block_size) for name, overrides in variants(args.window).items()}
    idx = torch.randint(0, configs["arch's own"].vocab_size, (args.batch, args.seq_len + 1), device=device)
    models = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        models[name] = GPT(config).to(device).train()
    seconds = median_step_seconds(models, idx, args.rounds, amp)
    baseline = seconds["arch's own"]
    print(f"{'switch':<20}{'ms/step':>10}{'ratio':>8}{'params':>14}{'FLOPs/token':>16}")
    for name, config in configs.items():
        print(f"{name:<20}{seconds[name] * 1e3:>10.1f}{seconds[name] / baseline:>8.2f}{param_counts(config)['total']:>14,}"
              f"{flops_per_token(config, args.seq_len)['training']:>16,}")

if __name__ == "__main__":
    main()
