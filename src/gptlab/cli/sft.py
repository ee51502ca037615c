"""`gptlab sft`: supervised fine-tuning of a base model on conversations (gptlab.align.launch.fine_tune).

    gptlab sft --init runs/shakespeare/train --data "task:arithmetic[n=20000], chats.jsonl" --out runs/sft

A preset (sft-cpu), then dotted overrides as in `gptlab train` (--max-steps 300
--optimizer.lr 5e-4 --rows pad). The model's settings come from --init; the
held-out task accuracy is printed before and after. Rerunning the same command
resumes; under torchrun every rank runs it.
"""

from __future__ import annotations

import argparse


def register(stages) -> None:
    from gptlab.cli.common import add_tuning_parser

    add_tuning_parser(
        stages, "sft", handler=run,
        help="fine-tune a model on conversations (chat format, loss on the assistant's tokens)",
        description="Supervised fine-tuning: the base model gains the chat tokens and learns from conversations "
        "(JSONL in the OpenAI messages format, hf:DATASET, built-in task:NAME; see gptlab.chat.data for mixtures).",
        init_help="the base model: a run, checkpoint or model folder",
    )


def run(args: argparse.Namespace) -> int:
    from gptlab.cli.common import run_tuning

    return run_tuning("sft", args)
