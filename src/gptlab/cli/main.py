"""`gptlab` entry point: subcommands by stage, one-line errors, non-zero exit codes.

Exit codes: 0 ok, 1 a user error (GptlabError, missing or unreadable file),
2 bad command-line usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from gptlab.runtime import GptlabError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line instead of the usage block."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> ArgumentParser:
    from gptlab.cli import data, model, run, sample, tokenizer, train
    from gptlab.cli import eval as eval_cli

    parser = ArgumentParser(prog="gptlab", description="Build a GPT language model from scratch.")
    from gptlab import __version__

    parser.add_argument("--version", action="version", version=f"gptlab {__version__}")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE", required=True, parser_class=ArgumentParser)
    tokenizer.register(stages)
    data.register(stages)
    model.register(stages)
    train.register(stages)
    run.register(stages)
    sample.register(stages)
    eval_cli.register(stages)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        return args.handler(args) or 0
    except GptlabError as error:
        print(f"gptlab: error: {error}", file=sys.stderr)
        return 1
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
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
