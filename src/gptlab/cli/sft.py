"""`gptlab sft`: supervised fine-tuning of a base model on conversations.

    gptlab sft --init runs/shakespeare/train --data "task:arithmetic[n=20000], chats.jsonl" --out runs/sft

A preset (sft-cpu), then dotted overrides as in `gptlab train` (--max-steps 300
--optimizer.lr 5e-4 --rows pad). The model's settings come from --init; the
held-out task accuracy is printed before and after. Rerunning the same command
resumes; under torchrun every rank runs it.
"""

from __future__ import annotations

import argparse
import dataclasses

DEFAULT_PRESET = "sft-cpu"
# set by --init, or meaningless for conversations: left out of --help
IGNORED = ("init_from", "model", "loader_mode", "hellaswag_every", "hellaswag_path", "hellaswag_limit")


def register(stages) -> None:
    from gptlab.align.sft import SFT_PRESETS
    from gptlab.cli.common import add_tuning_parser

    add_tuning_parser(
        stages, "sft", presets=SFT_PRESETS, default=DEFAULT_PRESET, skip=IGNORED, handler=run,
        help="fine-tune a model on conversations (chat format, loss on the assistant's tokens)",
        description="Supervised fine-tuning: the base model gains the chat tokens and learns from conversations "
        "(JSONL in the OpenAI messages format, hf:DATASET, built-in task:NAME; see gptlab.chat.data for mixtures).",
        init_help="the base model: a run, checkpoint or model folder",
    )


def resolve_config(args: argparse.Namespace, presets: dict | None = None, ignored: tuple[str, ...] = IGNORED):
    """The preset with the overrides; seq_len shortened to the base model's context when the preset's is longer.
    `presets` and `ignored` (fields refused): SFT's by default (gptlab dpo passes its own)."""
    from gptlab.align.sft import SFT_PRESETS
    from gptlab.align.start import find_init
    from gptlab.model.hf import read_pretrained_config
    from gptlab.runtime import GptlabError
    from gptlab.runtime.config import apply_overrides, parse_overrides

    given = dict(parse_overrides(args.overrides))
    for key in given:
        if key == "init_from" or (key.startswith("model.") and key != "model.dropout"):
            raise GptlabError(f"--{key.replace('_', '-')}: the model is the one --init names; drop it")
    base = (presets or SFT_PRESETS)[args.preset]()
    init = read_pretrained_config(find_init(args.init))
    defaults = {"init_from": args.init, **{f"model.{key}": value for key, value in dataclasses.asdict(init).items()}}
    if "seq_len" not in given and base.seq_len > init.block_size:
        defaults["seq_len"] = init.block_size
        if "batch_tokens" not in given and "micro_batch" not in given:
            defaults["micro_batch"] = base.batch_tokens // init.block_size
    unused = {key: "this command does not use it" for key in ignored if key not in ("init_from", "model")}
    return apply_overrides(base, args.overrides, defaults=defaults, fixed=unused)


def run(args: argparse.Namespace) -> int:
    from gptlab.align.sft import run_sft
    from gptlab.cli.common import run_tuning

    return run_tuning(resolve_config(args), run_sft, args)
