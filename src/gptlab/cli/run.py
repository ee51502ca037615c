"""`gptlab run`: the whole pipeline, configured by dotted overrides (e.g. --tokenizer.vocab_size 8192)."""

from __future__ import annotations

import argparse
import sys


def register(stages) -> None:
    parser = stages.add_parser(
        "run",
        help="run the whole pipeline end to end (default: Shakespeare on this machine)",
        description="Options are the fields of RunConfig as dotted overrides: --corpus, --out, --val_every, "
        "--tokenizer.vocab_size, --tokenizer.pattern, --data.val, --train.max_steps, --train.model.n_layer, "
        "--train.optimizer.lr (any TrainConfig field under --train.), --sample.max_new_tokens, ...",
    )
    parser.set_defaults(handler=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from gptlab.pipeline import RunConfig, run_pipeline
    from gptlab.runtime.config import apply_overrides

    config = apply_overrides(RunConfig(), args.overrides)
    run_pipeline(config, color=sys.stdout.isatty())
    return 0
