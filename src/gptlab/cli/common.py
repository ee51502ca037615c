"""What several commands' parsers share: the model argument, the device flag, counts, and the fine-tuning commands'
parser. Argument parsing only: finding and loading a model lives in gptlab.load (model_folders, decoding), the
fine-tuning start-up in gptlab.align.launch.
"""

from __future__ import annotations

import argparse

DEVICE_HELP = "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps (default auto)"
MODEL_HELP = ("a run folder (its newest checkpoint; RUN/best for the best), a checkpoint, "
              "a Hugging Face folder, or a cached hub name such as gpt2")


def add_model_argument(parser: argparse.ArgumentParser, *, positional: bool = False, required: bool = True) -> None:
    """The model a command reads, as args.checkpoint: `--checkpoint MODEL`, or a positional MODEL."""
    if positional:
        parser.add_argument("checkpoint", metavar="MODEL", help=MODEL_HELP)
    else:
        parser.add_argument("--checkpoint", required=required, metavar="MODEL", help=MODEL_HELP)


def add_quantize_argument(parser: argparse.ArgumentParser) -> None:
    """--quantize none|int8|int4: weight-only quantisation right after the model loads (gptlab.infer.quantize)."""
    parser.add_argument("--quantize", choices=("none", "int8", "int4"), default="none",
                        help="weights in int8 (per output channel) or int4 (groups of 32), on cpu or cuda (default none)")


def add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    """--draft MODEL --draft-tokens K: speculative decoding with a small model sharing the tokenizer (gptlab.infer.speculative)."""
    parser.add_argument("--draft", metavar="MODEL", help="a small draft model with the same tokenizer that guesses tokens for "
                        "the model to check: same output when greedy, same distribution when sampled, faster when it guesses well")
    parser.add_argument("--draft-tokens", type=int, default=4, metavar="K", help="tokens the draft guesses per step (default 4)")


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """--quantize and --draft/--draft-tokens: what `sample`, `chat` and `serve` decode with."""
    add_quantize_argument(parser)
    add_draft_arguments(parser)


TOOLS_HELP = ("tools the model may call while it answers: calculator, python (a sandbox), path/to/tools.py (its "
              "public functions) or path/to/tools.py:function, comma-separated")


def add_tool_arguments(parser, *, default: str = "") -> None:
    """--tools SPEC --tool-calls N --tool-seconds S: tools that run while the model generates (gptlab.tools);
    `default` says in the help what no --tools means."""
    parser.add_argument("--tools", metavar="SPEC", help=TOOLS_HELP + (f" ({default})" if default else ""))
    parser.add_argument("--tool-calls", type=positive, default=8, metavar="N", help="most tool calls per reply (default 8)")
    parser.add_argument("--tool-seconds", type=float, default=20.0, metavar="S",
                        help="most seconds all tool calls of one reply may take, each at most half (default 20)")


def load_toolbox(args: argparse.Namespace):
    """The Toolbox --tools names, or None without it: loaded before the model, so a bad spec costs no loading."""
    if not getattr(args, "tools", None):
        return None
    from gptlab.tools import load_tools, reply_limits

    return load_tools(args.tools, reply_limits(args.tool_calls, args.tool_seconds))


def check_tool_tokens(args: argparse.Namespace, tokenizer) -> None:
    """One error line when --tools is given for a model whose tokenizer lacks the tool tokens."""
    from gptlab.chat import ChatFormat
    from gptlab.runtime import GptlabError

    try:
        supported = ChatFormat(tokenizer).supports_tools
    except GptlabError:
        supported = False
    if not supported:
        raise GptlabError(f"--tools needs a chat model with the tool tokens, and {args.checkpoint}'s tokenizer lacks them: "
                          "fine-tune it with `gptlab sft` (which adds them) on conversations with tool calls")


def load_for_decoding(args: argparse.Namespace):
    """(model, tokenizer, draft or None) as --checkpoint, --device, --quantize, --tokenizer and --draft ask
    (gptlab.load.decoding)."""
    from gptlab.load.decoding import load_for_decoding as load

    return load(args.checkpoint, pick_device(args.device), tokenizer=args.tokenizer, quantize=getattr(args, "quantize", "none"),
                draft=getattr(args, "draft", None), draft_tokens=getattr(args, "draft_tokens", 4))


def pick_device(name: str):
    """--device: auto or an available device, else one clear error (gptlab.runtime.device.detect_device)."""
    from gptlab.runtime.device import detect_device

    return detect_device(name)


def positive(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_tuning_parser(stages, name: str, *, help: str, description: str, init_help: str, handler) -> argparse.ArgumentParser:
    """The parser of a command that trains from --init with a preset and dotted overrides (sft, dpo, grpo:
    gptlab.align.launch.FINE_TUNINGS holds each one's presets and the fields it refuses)."""
    from gptlab.align.launch import FINE_TUNINGS
    from gptlab.runtime.config import describe_fields

    tuning = FINE_TUNINGS[name]
    parser = stages.add_parser(
        name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"config fields (dotted, --key value; defaults of the {tuning.default} preset):\n"
        + describe_fields(tuning.presets[tuning.default](), skip=tuning.ignored),
    )
    parser.add_argument("--init", required=True, metavar="MODEL", help=init_help)
    parser.add_argument("--preset", default=tuning.default, choices=sorted(tuning.presets), help=f"{tuning.default} (default)")
    parser.add_argument("--no-resume", action="store_true", help="start from step 0; refused if --out holds a run (see --force)")
    parser.add_argument("--force", action="store_true", help="start over: first clear the run in --out (its own files only)")
    parser.set_defaults(handler=handler, accepts_overrides=True)
    return parser


def run_tuning(name: str, args: argparse.Namespace) -> int:
    """`gptlab NAME` (sft, dpo, grpo): gptlab.align.launch.fine_tune with the parsed flags; 130 when interrupted."""
    from gptlab.align.launch import fine_tune

    result = fine_tune(name, args.preset, args.overrides, args.init, resume=not args.no_resume, force=args.force)
    return 0 if result.status != "interrupted" else 130
