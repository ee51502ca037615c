"""`gptlab run`: the whole pipeline, configured by dotted overrides (e.g. --tokenizer.vocab-size 8192)."""

from __future__ import annotations

import argparse
import sys


def register(stages) -> None:
    from gptlab.pipeline import FIXED_FIELDS, RunConfig
    from gptlab.runtime.config import describe_fields

    parser = stages.add_parser(
        "run",
        help="run the whole pipeline end to end on a corpus (default: Shakespeare; --corpus DIR|FILE|hf:NAME for your own)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Corpus -> tokenizer -> shards -> training -> evaluation -> sample -> fine-tuning -> chat -> report cards, "
        "every artefact under --out (default runs/<the corpus's name>). --corpus takes the built-in shakespeare, a folder or "
        "file of text (any text files; binary ones are skipped) or hf:NAME[:CONFIG]; what the built-in corpus has and "
        "yours may not (a held-out split, a sample prompt) is derived from your text, and said. "
        "Rerunning the same command reuses the finished stages and resumes training; other settings into the "
        "same --out are refused (--force starts over).",
        epilog="config fields (dotted, --key value or --key=value):\n" + describe_fields(RunConfig(), skip=FIXED_FIELDS),
    )
    parser.add_argument("--force", action="store_true", help="start over: first clear the run in --out (its own files only)")
    parser.set_defaults(handler=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from gptlab.pipeline import FIXED_FIELDS, RunConfig, run_pipeline
    from gptlab.runtime.config import apply_overrides

    config = apply_overrides(RunConfig(), args.overrides, fixed=FIXED_FIELDS)
    run_pipeline(config, color=sys.stdout.isatty(), force=args.force)
    return 0
