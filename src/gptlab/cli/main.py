"""`gptlab` entry point: subcommands by stage, one-line errors, non-zero exit codes.

Exit codes: 0 ok, 1 a user error (GptlabError, missing or unreadable file),
2 bad command-line usage, 130 interrupted.

Flags are hyphenated (`--vocab-size`, `--model.n-layer`); underscores are
accepted as aliases (`--vocab_size`), so either spelling works everywhere.
"""

from __future__ import annotations

import argparse
import difflib
import signal
import sys

from gptlab.runtime import GptlabError
from gptlab.runtime.threads import parse_threads, set_threads

# Commands that compute with torch take --threads; the data and tokenizer commands size their worker processes with --workers.
THREADED = ("model", "train", "profile", "sweep", "fit", "sft", "dpo", "grpo", "ppo", "rm", "rm-score", "run", "sample", "chat", "serve", "eval", "export")


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line instead of the usage block."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --out never silently means --output-format
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> ArgumentParser:
    from gptlab import __version__
    from gptlab.cli import (
        chat,
        data,
        dpo,
        export,
        fit,
        grpo,
        model,
        ppo,
        profile,
        rm,
        run,
        runs,
        sample,
        serve,
        sft,
        sweep,
        tokenizer,
        train,
    )
    from gptlab.cli import eval as eval_cli

    parser = ArgumentParser(prog="gptlab", description="Build a GPT language model from scratch.")
    parser.add_argument("--version", action="version", version=f"gptlab {__version__}")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE", required=True, parser_class=ArgumentParser)
    for module in (tokenizer, data, model, train, profile, sweep, fit, sft, dpo, grpo, ppo, rm, run, runs, sample, chat, serve, eval_cli, export):
        module.register(stages)
    for name in THREADED:
        add_threads_argument(stages.choices[name])
    return parser


def _threads(text: str) -> str | int:
    try:
        return parse_threads(text)
    except GptlabError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """--threads on a command and every subcommand under it (gptlab.runtime.threads: why, and what auto does)."""
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for action in subcommands:
        for sub in action.choices.values():
            add_threads_argument(sub)
    if not subcommands:
        parser.add_argument("--threads", type=_threads, default="auto", metavar="N|auto",
                            help="CPU threads for torch (default auto: the cores other work leaves free, sampled at start; training "
                                 "moves to fewer while other work holds the cores, and back)")


def hyphenate(argv: list[str]) -> list[str]:
    """--vocab_size 10 -> --vocab-size 10: underscores in a flag's name are aliases of hyphens (values untouched)."""
    out = []
    for item in argv:
        if item.startswith("--") and len(item) > 2:
            name, equals, value = item.partition("=")
            item = name.replace("_", "-") + equals + value
        out.append(item)
    return out


def _all_flags(parser: argparse.ArgumentParser) -> list[str]:
    flags = [option for action in parser._actions for option in action.option_strings]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags += _all_flags(sub)
    return flags


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    known = set(_all_flags(parser))
    hints = []
    for item in extra:
        close = difflib.get_close_matches(item.split("=")[0], known, n=1, cutoff=0.7) if item.startswith("--") else []
        if close:
            hints.append(f"{item}: did you mean {close[0]}?")
    return f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else "")


def main(argv: list[str] | None = None) -> int:
    try:
        return run_command(argv)
    finally:
        if argv is None:  # the command line's own run is over: a Ctrl-C while the interpreter exits changes nothing
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_command(argv: list[str] | None) -> int:
    """Parse and run one command: its exit code, with user errors and Ctrl-C as one line each."""
    try:
        parser = build_parser()  # imports torch and every stage: seconds in which a Ctrl-C is likely
        args, extra = parser.parse_known_args(hyphenate(sys.argv[1:] if argv is None else list(argv)))
    except KeyboardInterrupt:
        print("gptlab: interrupted", file=sys.stderr)
        return 130
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(_unrecognized(parser, extra))
    args.overrides = extra
    try:
        if hasattr(args, "threads"):
            set_threads(args.threads)
        return args.handler(args) or 0
    except GptlabError as error:
        print(f"gptlab: error: {error}", file=sys.stderr)
        return 1
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, UnicodeDecodeError) as error:
        print(f"gptlab: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gptlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `gptlab tokenizer encode ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
