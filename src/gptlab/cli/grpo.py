"""`gptlab grpo`: reinforcement learning with verifiable rewards on a built-in task (gptlab.align.launch.fine_tune).

    gptlab grpo --init runs/shakespeare/sft --task "arithmetic[digits=1]" --out runs/grpo
    gptlab grpo --init runs/sft --task spelling --loss dapo --clip-high 0.28 --reward "verifier, my_rewards.py:brevity*0.1"

A preset (grpo-cpu), then dotted overrides as in `gptlab train`. The model's
settings come from --init (a chat model: gptlab sft's output); held-out
accuracy, pass@1 and pass@k are printed before and after. Rerunning the same
command resumes; under torchrun every rank runs it. The flags sft and dpo take
that grpo has no use for are refused naming what to pass instead.
"""

from __future__ import annotations

import argparse


def register(stages) -> None:
    from gptlab.cli.common import add_tuning_parser

    add_tuning_parser(
        stages, "grpo", handler=run,
        help="reinforcement learning with verifiable rewards (GRPO, DAPO, Dr. GRPO, REINFORCE, expert iteration)",
        description="GRPO: the chat model samples a group of answers per prompt, a verifier scores them, and the "
        "policy gradient favours the better ones (see gptlab.align.rl.grpo for the loss variants).",
        init_help="the chat model: a run, checkpoint or model folder",
    )


def run(args: argparse.Namespace) -> int:
    from gptlab.cli.common import run_tuning

    return run_tuning("grpo", args)
