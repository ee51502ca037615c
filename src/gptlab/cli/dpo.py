"""`gptlab dpo`: align a chat model with preference pairs (Direct Preference Optimisation).

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

from gptlab.cli.sft import IGNORED

DEFAULT_PRESET = "dpo-cpu"


def register(stages) -> None:
    from gptlab.align.dpo import DPO_PRESETS
    from gptlab.runtime.config import describe_fields

    parser = stages.add_parser(
        "dpo",
        help="align a chat model with preference pairs (DPO, IPO)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Direct Preference Optimisation: the model learns to prefer each pair's chosen reply over the "
        "rejected one, staying near the --init model (JSONL in the TRL preference formats, hf:DATASET, built-in "
        "task:NAME with verified-wrong rejections; see gptlab.align.pairs).",
        epilog=f"config fields (dotted, --key value; defaults of the {DEFAULT_PRESET} preset):\n"
        + describe_fields(DPO_PRESETS[DEFAULT_PRESET](), skip=IGNORED),
    )
    parser.add_argument("--init", required=True, metavar="MODEL", help="the model to align (and the reference): a run, checkpoint or model folder")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(DPO_PRESETS), help=f"{DEFAULT_PRESET} (default)")
    parser.add_argument("--no-resume", action="store_true", help="start from step 0; refused if --out holds a run (see --force)")
    parser.add_argument("--force", action="store_true", help="start over: first clear the run in --out (its own files only)")
    parser.set_defaults(handler=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from gptlab.align.dpo import DPO_PRESETS, run_dpo
    from gptlab.cli.sft import resolve_config
    from gptlab.runtime.device import init_runtime, shutdown_runtime

    config = resolve_config(args, DPO_PRESETS)
    runtime = init_runtime(config.device)
    try:
        result = run_dpo(config, runtime=runtime, resume=not args.no_resume, force=args.force)
    finally:
        shutdown_runtime(runtime)
    return 0 if result.status != "interrupted" else 130
