"""`gptlab ppo`: RLHF with PPO against a reward model, a task's verifier or an LM judge (gptlab.align.launch.fine_tune).

    gptlab ppo --init runs/sft --reward rm:runs/rm --task "arithmetic[digits=1]" --out runs/ppo
    gptlab ppo --init runs/sft --reward verifier --kl-target 6 --value-model shared --out runs/ppo
    gptlab ppo --init runs/sft --reward judge:http://localhost:8000/v1 --missing-eos-penalty 1 --out runs/ppo
    gptlab ppo --init runs/sft --prompts prompts.jsonl --reward rm:runs/rm --val-fraction 0.1 --out runs/ppo

A preset (ppo-cpu), then dotted overrides as in `gptlab train`. The model's settings come from --init (a chat
model: gptlab sft's output), which is also the frozen reference of the KL penalty; --task or --prompts (.jsonl files, hf: datasets,
task: parts) gives the prompts.
Held-out reward and task accuracy are printed before and after. Rerunning the same command resumes; under
torchrun every rank runs it. The flags sft and dpo take that ppo has no use for are refused naming what to pass.
"""

from __future__ import annotations

import argparse


def register(stages) -> None:
    from gptlab.cli.common import add_tuning_parser

    add_tuning_parser(
        stages, "ppo", handler=run,
        help="RLHF with PPO: a value model, a KL penalty to the start, clipped policy and value losses",
        description="PPO: the chat model answers each prompt, the reward scores the answer, and clipped policy and value "
        "updates (GAE advantages, a per-token KL penalty to the start) favour better answers (see gptlab.align.rl.ppo).",
        init_help="the chat model (also the frozen reference): a run, checkpoint or model folder",
    )


def run(args: argparse.Namespace) -> int:
    from gptlab.cli.common import run_tuning

    return run_tuning("ppo", args)
