"""`gptlab` entry point: subcommands by stage, one-line errors, non-zero exit codes.

Exit codes: 0 ok, 1 a user error (GptlabError, missing or unreadable file),
2 bad command-line usage, 130 interrupted.

Flags are hyphenated (`--vocab-size`, `--model.n-layer`); underscores are
accepted as aliases (`--vocab_size`), so either spelling works everywhere.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
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


# Every stage: the module under gptlab.cli that builds its parser, and its line in `gptlab --help`
STAGES = {
    "tokenizer": ("tokenizer", "train, use, compare and view tokenizers (byte-level BPE, SentencePiece BPE)"),
    "data": ("data", "corpora and token shards"),
    "model": ("model", "inspect model configs: parameters, FLOPs, memory"),
    "train": ("train", "train a GPT on prepared shards (resumes a run in --out)"),
    "profile": ("profile", "time, trace and count a training step: phases, ops, memory, MFU"),
    "sweep": ("sweep", "scaling-law sweep: model sizes x FLOP budgets, resumable, or a SLURM array"),
    "fit": ("fit", "fit scaling laws to a sweep: IsoFLOP minima, power laws, L(N, D), predictions"),
    "sft": ("sft", "fine-tune a model on conversations (chat format, loss on the assistant's tokens)"),
    "dpo": ("dpo", "align a chat model with preference pairs (DPO, IPO)"),
    "grpo": ("grpo", "reinforcement learning with verifiable rewards (GRPO, DAPO, Dr. GRPO, REINFORCE, expert iteration)"),
    "ppo": ("ppo", "RLHF with PPO: a value model, a KL penalty to the start, clipped policy and value losses"),
    "rm": ("rm", "train a reward model on preference pairs (Bradley-Terry)"),
    "rm-score": ("rm", "score replies, or rank preference pairs, with a trained reward model"),
    "run": ("run", "run the whole pipeline end to end on a corpus (default: Shakespeare; --corpus DIR|FILE|hf:NAME for your own)"),
    "runs": ("runs", "reports of training runs, and comparisons of several"),
    "sample": ("sample", "generate text from a saved model"),
    "chat": ("chat", "talk to a chat model (after `gptlab sft`) in the terminal"),
    "serve": ("serve", "serve a model over an OpenAI-compatible HTTP API, with a web chat"),
    "eval": ("eval", "evaluate a model: a report card (CORE, chat tasks, an LM judge), val bits per byte"),
    "export": ("export", "write a model in another format (hf: a Hugging Face folder; gguf: llama.cpp, Ollama)"),
}


def build_parser(stage: str | None = None) -> ArgumentParser:
    """The command line: every stage in full, or only `stage` in full and the others as their names and help lines
    ("" for names only). A command builds its own stage alone, so it imports only what that stage needs:
    `gptlab tokenizer encode` starts in a tenth of a second, without torch."""
    from gptlab import __version__

    parser = ArgumentParser(prog="gptlab", description="Build a GPT language model from scratch.")
    parser.add_argument("--version", action="version", version=f"gptlab {__version__}")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE", required=True, parser_class=ArgumentParser)
    full = {module for module, _ in STAGES.values()} if stage is None else {STAGES[stage][0]} if stage in STAGES else set()
    for name, (module, line) in STAGES.items():
        if module not in full:
            stages.add_parser(name, help=line)
        elif name not in stages.choices:  # a module may register more than one stage (rm: rm and rm-score)
            importlib.import_module(f"gptlab.cli.{module}").register(stages)
    for name in THREADED:
        if STAGES[name][0] in full:
            add_threads_argument(stages.choices[name])
    return parser


def command_stage(argv: list[str]) -> str:
    """The stage a command line names (its first word that is not an option), or "" when it names none."""
    return next((word for word in argv if not word.startswith("-")), "")


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
        argv = hyphenate(sys.argv[1:] if argv is None else list(argv))
        parser = build_parser(command_stage(argv))  # may import torch: seconds in which a Ctrl-C is likely
        args, extra = parser.parse_known_args(argv)
    except KeyboardInterrupt:
        print("gptlab: interrupted", file=sys.stderr)
        return 130
    if extra and not getattr(args, "accepts_overrides", False):
        stage = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices[args.stage]
        parser.error(_unrecognized(stage, extra))  # suggestions from the command's own flags
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
