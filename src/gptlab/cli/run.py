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
    parser.add_argument("--track", metavar="NAME", help="a record track's recipe and time budget: cpu-100s and cpu-600s "
                        "(pretraining only, into runs/NAME, scored on the held-out works) or demo (the default run); "
                        "docs/records.md")
    parser.add_argument("--record", type=int, metavar="N", help="with --track: its record N instead of the latest (0: the first)")
    parser.set_defaults(handler=run, accepts_overrides=True)


def base_config(track: str | None = None, record: int | None = None):
    """The run before the user's flags: the default run, or a track's record (gptlab.tracks)."""
    from gptlab.pipeline import RunConfig
    from gptlab.runtime import GptlabError
    from gptlab.tracks import get_track

    if track is None:
        if record is not None:
            raise GptlabError(f"--record {record} picks a record of a track; pass --track NAME too")
        return RunConfig()
    return get_track(track).config(record)


def resolve_config(overrides: list[str], track: str | None = None, record: int | None = None):
    """The run's config from its flags; a --train.seq-len alone brings the model's block_size and the batch along,
    as in `gptlab train` (gptlab.cli.train.follow_seq_len), and a block_size shorter than fine-tuning's sequences
    brings those (and their batch) along too. Returns (config, what followed, in words)."""
    from gptlab.cli.train import describe_derived, follow_seq_len
    from gptlab.pipeline import FIXED_FIELDS
    from gptlab.runtime.config import apply_overrides, parse_overrides

    base, pairs = base_config(track, record), parse_overrides(overrides)
    given = {stage: {key[len(stage) + 1:]: value for key, value in pairs if key.startswith(stage + ".")} for stage in ("train", "sft")}
    derived = {f"train.{key}": value for key, value in follow_seq_len(base.train, given["train"]).items()}
    block = derived.get("train.model.block_size")
    if block is not None and block < base.sft.seq_len and "seq_len" not in given["sft"]:  # fine-tuning fits the model too
        sft = {"seq_len": block, **follow_seq_len(base.sft, {**given["sft"], "seq_len": str(block)}, model=False)}
        derived.update({f"sft.{key}": value for key, value in sft.items()})
    config = apply_overrides(base, overrides, fixed=FIXED_FIELDS, defaults=derived)
    said = f"--train.seq-len {config.train.seq_len}: {describe_derived(derived)} follow{'s' * (len(derived) == 1)} it" if derived else ""
    return config, said


def run(args: argparse.Namespace) -> int:
    from gptlab.pipeline import run_pipeline

    config, said = resolve_config(args.overrides, args.track, args.record)
    if said:
        print(said)
    run_pipeline(config, color=sys.stdout.isatty(), force=args.force)
    return 0
