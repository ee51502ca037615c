"""`gptlab rm` trains a reward model (gptlab.align.launch.fine_tune); `gptlab rm-score` scores text with one.

    gptlab rm --init runs/sft --out runs/rm                                 the rm-cpu preset's task pairs
    gptlab rm --init runs/sft --data prefs.jsonl --out runs/rm --center-rewards-coefficient 0.01
    gptlab rm-score runs/rm --prompt "2+3?" --reply "5" --reply "6"          one score per reply, a line each
    gptlab rm-score runs/rm --data "task:arithmetic[split=test,n=200]"      accuracy and margin on those pairs

Training takes a preset (rm-cpu), then dotted overrides as in `gptlab dpo`; pairs in the formats `gptlab dpo --data`
reads, each jsonl record with an optional "margin". Rerunning the same command resumes; under torchrun every rank
runs it. Scoring is a verb of its own, rm-score, rather than `gptlab rm score`: rm passes unknown flags on as dotted
overrides (--max-steps 200), whose values a subcommand position would mistake for a subcommand's name.
"""

from __future__ import annotations

import argparse


def register(stages) -> None:
    from gptlab.cli.common import DEVICE_HELP, add_tuning_parser

    add_tuning_parser(
        stages, "rm", handler=run,
        help="train a reward model on preference pairs (Bradley-Terry)",
        description="Reward model: the --init model's trunk and a scalar head learn to score each pair's chosen reply "
        "above the rejected one (JSONL in the TRL preference formats with an optional margin, hf:DATASET, built-in "
        "task:NAME with verified-wrong rejections). The --out folder ends up a reward model for gptlab rm-score, "
        "rm:DIR rewards and gptlab ppo.",
        init_help="the model whose trunk scores (usually an SFT chat model): a run, checkpoint or model folder",
    )
    score = stages.add_parser(
        "rm-score", help="score replies, or rank preference pairs, with a trained reward model",
        description="Score replies with a reward model trained by gptlab rm (normalised: 0 is an ordinary train reply), "
        "or measure its accuracy on preference pairs.",
    )
    score.add_argument("model", metavar="DIR", help="a gptlab rm --out folder, or one of its checkpoints")
    what = score.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="the user's message the replies answer (use with --reply)")
    what.add_argument("--data", metavar="PAIRS", help="preference pairs, as gptlab dpo --data reads them: prints accuracy and margin")
    score.add_argument("--reply", action="append", default=[], metavar="TEXT", help="a reply to score (repeat for more)")
    score.add_argument("--device", default="auto", help=DEVICE_HELP)
    score.set_defaults(handler=run_score)


def run(args: argparse.Namespace) -> int:
    from gptlab.cli.common import run_tuning

    return run_tuning("rm", args)


def run_score(args: argparse.Namespace) -> int:
    from gptlab.align.rl.rm_reward import load_reward_model, score_pairs
    from gptlab.cli.common import pick_device
    from gptlab.runtime import GptlabError

    if args.prompt is not None and not args.reply:
        raise GptlabError("--prompt needs at least one --reply TEXT to score")
    if args.data is not None and args.reply:
        raise GptlabError("--reply goes with --prompt; with --data the pairs hold the replies")
    scorer = load_reward_model(args.model, pick_device(args.device))
    if args.prompt is not None:
        for score in scorer.score([args.prompt] * len(args.reply), args.reply):
            print(f"{score:.4f}")
        return 0
    figures = score_pairs(scorer, args.data)
    print(f"pairs {figures['pairs']}: accuracy {figures['accuracy']:.3f} (95% interval {figures['accuracy_low']:.3f}"
          f"-{figures['accuracy_high']:.3f}), mean margin {figures['margin']:.3f}")
    return 0
