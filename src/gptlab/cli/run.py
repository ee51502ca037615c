"""`gptlab run`: the whole pipeline, configured by dotted overrides (e.g. --tokenizer.vocab_size 8192)."""

from __future__ import annotations

import argparse
import sys


def register(stages) -> None:
    parser = stages.add_parser(
        "run",
        help="run the whole pipeline end to end (default: Shakespeare on this machine)",
        description="Options are the fields of RunConfig: --corpus, --out, --val_every, --tokenizer.vocab_size, "
        "--tokenizer.pattern, --tokenizer.special_tokens (comma-separated).",
    )
    parser.set_defaults(handler=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from gptlab.pipeline import RunConfig, run_pipeline
    from gptlab.runtime.config import apply_overrides

    config = apply_overrides(RunConfig(), args.overrides)
    run_pipeline(config, color=sys.stdout.isatty())
    return 0
