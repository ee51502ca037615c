"""`gptlab grpo`: reinforcement learning with verifiable rewards on a built-in task.

    gptlab grpo --init runs/shakespeare/sft --task "arithmetic[digits=1]" --out runs/grpo
    gptlab grpo --init runs/sft --task spelling --loss dapo --clip-high 0.28 --reward "verifier, my_rewards.py:brevity*0.1"

A preset (grpo-cpu), then dotted overrides as in `gptlab train`. The model's
settings come from --init (a chat model: gptlab sft's output); held-out
accuracy, pass@1 and pass@k are printed before and after. Rerunning the same
command resumes; under torchrun every rank runs it.
"""

from __future__ import annotations

import argparse

DEFAULT_PRESET = "grpo-cpu"
# set by --init or by the prompts, or meaningless without a val split: left out of --help and refused
IGNORED = ("init_from", "model", "data", "tokenizer", "batch_tokens", "loader_mode", "eval_every", "eval_batches",
           "hellaswag_every", "hellaswag_path", "hellaswag_limit")
# why, for the flags gptlab sft and dpo take that grpo does not: each names what to pass instead
REASONS = {
    "init_from": "the model is the one --init names", "model": "the model is the one --init names",
    "data": "GRPO's prompts come from --task", "tokenizer": "GRPO uses the tokenizer saved with the --init chat model",
    "batch_tokens": "GRPO does not use it (a step is --prompts-per-step x --group-size completions)",
    "eval_every": "GRPO has no val loss (no val split); --task-every sets the steps between held-out task evaluations",
    "eval_batches": "GRPO has no val loss (no val split); --eval-examples sets the held-out prompts per evaluation",
}


def register(stages) -> None:
    from gptlab.align.grpo import GRPO_PRESETS
    from gptlab.cli.common import add_tuning_parser

    add_tuning_parser(
        stages, "grpo", presets=GRPO_PRESETS, default=DEFAULT_PRESET, skip=IGNORED, handler=run,
        help="reinforcement learning with verifiable rewards (GRPO, DAPO, Dr. GRPO, REINFORCE, expert iteration)",
        description="GRPO: the chat model samples a group of answers per prompt, a verifier scores them, and the "
        "policy gradient favours the better ones (see gptlab.align.grpo for the loss variants).",
        init_help="the chat model: a run, checkpoint or model folder",
    )


def resolve_config(args: argparse.Namespace):
    from gptlab.align.grpo import GRPO_PRESETS
    from gptlab.align.start import find_init
    from gptlab.runtime import GptlabError
    from gptlab.runtime.config import apply_overrides, parse_overrides

    find_init(args.init)  # a missing --init is named before anything else
    for key, _ in parse_overrides(args.overrides):
        if key.startswith("model.") and key != "model.dropout":
            raise GptlabError(f"--{key.replace('_', '-')}: the model is the one --init names; drop it")
    unused = {key: REASONS.get(key, "GRPO does not use it") for key in IGNORED}
    return apply_overrides(GRPO_PRESETS[args.preset](), args.overrides, defaults={"init_from": args.init}, fixed=unused)


def run(args: argparse.Namespace) -> int:
    from gptlab.align.grpo import run_grpo
    from gptlab.cli.common import run_tuning

    return run_tuning(resolve_config(args), run_grpo, args)
