"""`gptlab dpo`: align a chat model with preference pairs, Direct Preference Optimisation (gptlab.align.launch.fine_tune).

    gptlab dpo --init runs/sft --out runs/dpo                     the dpo-cpu preset's task pairs
    gptlab dpo --init runs/sft --data prefs.jsonl --out runs/dpo --beta 0.2 --loss ipo

A preset (dpo-cpu), then dotted overrides as in `gptlab sft` (--max-steps 200
--optimizer.lr 5e-5 --reference model). The model's settings come from --init,
which is also the frozen reference; held-out preference accuracy and task
accuracy are printed before and after. Rerunning the same command resumes;
under torchrun every rank runs it.
"""

from __future__ import annotations

import argparse


def register(stages) -> None:
    from gptlab.cli.common import add_tuning_parser

    add_tuning_parser(
        stages, "dpo", handler=run,
        help="align a chat model with preference pairs (DPO, IPO)",
        description="Direct Preference Optimisation: the model learns to prefer each pair's chosen reply over the "
        "rejected one, staying near the --init model (JSONL in the TRL preference formats, hf:DATASET, built-in "
        "task:NAME with verified-wrong rejections; see gptlab.align.preference.pairs).",
        init_help="the model to align (and the reference): a run, checkpoint or model folder",
    )


def run(args: argparse.Namespace) -> int:
    from gptlab.cli.common import run_tuning

    return run_tuning("dpo", args)
