"""What several commands share: finding a model and its tokenizer from what the user names, and the device flag.

A model is named by any folder gptlab makes or reads:

    runs/shakespeare                        a `gptlab run` folder: its newest checkpoint
    runs/shakespeare/best                   ... or the best by val loss (also RUN/latest)
    runs/train-20261123-201500              a `gptlab train` folder, the same way
    runs/.../checkpoints/step_000600        one checkpoint
    out/hf                                  a Hugging Face folder (gpt2, llama, qwen3), e.g. from `gptlab export hf`
    gpt2                                    a hub name already in the local Hugging Face cache

Its tokenizer is --tokenizer when given, else the one saved with the model
(`CHECKPOINT/tokenizer/`, or the tokenizer files of a Hugging Face folder),
else GPT-2's for a Hugging Face GPT-2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gptlab.runtime import GptlabError

GPT2_VOCAB_SIZE = 50257
DEVICE_HELP = "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps (default auto)"


MODEL_HELP = ("a run folder (its newest checkpoint; RUN/best for the best), a checkpoint, "
              "a Hugging Face folder, or a cached hub name such as gpt2")


def add_model_argument(parser: argparse.ArgumentParser, *, positional: bool = False, required: bool = True) -> None:
    """The model a command reads, as args.checkpoint: `--checkpoint MODEL`, or a positional MODEL."""
    if positional:
        parser.add_argument("checkpoint", metavar="MODEL", help=MODEL_HELP)
    else:
        parser.add_argument("--checkpoint", required=required, metavar="MODEL", help=MODEL_HELP)


def model_path(spec: str) -> Path:
    """The folder holding the model `spec` names (a checkpoint, a gptlab model, a Hugging Face folder)."""
    from gptlab.model.hf import pretrained_path
    from gptlab.train.checkpoint import find_checkpoint

    return find_checkpoint(spec) or pretrained_path(spec)


def load_model_from(spec: str, device="cpu"):
    """(model, folder) for any model `spec` names; one clear error when it names none."""
    from gptlab.model.hf import load_pretrained_directory

    path = model_path(spec)
    return load_pretrained_directory(path, device=device), path


def load_model_tokenizer(spec: str, path: Path, model, explicit: str | None, *, required: bool = True):
    """(tokenizer, what to call it): --tokenizer, else the model's own, else GPT-2's for a Hugging Face GPT-2;
    checked against the model's vocabulary. (None, "") when there is none and none is required."""
    from gptlab.data.match import find_model_tokenizer
    from gptlab.tokenizer.pretrained import load_any

    if explicit:
        tokenizer, name = load_any(explicit), explicit
    else:
        tokenizer, name = find_model_tokenizer(path), f"the tokenizer saved with {spec}"
        if tokenizer is None and _is_hf_gpt2(path, model):
            tokenizer, name = load_any("gpt2"), f"gpt2 (the tokenizer of the Hugging Face GPT-2 {spec})"
    if tokenizer is None:
        if required:
            raise GptlabError(f"no tokenizer saved with {spec} ({path}); pass --tokenizer DIR (or gpt2)")
        return None, ""
    if tokenizer.vocab_size > model.config.vocab_size:
        raise GptlabError(f"{name} has {tokenizer.vocab_size:,} ids but the model only {model.config.vocab_size:,}: "
                          "is it the model's tokenizer? pass the right one with --tokenizer")
    return tokenizer, name


def _is_hf_gpt2(path: Path, model) -> bool:
    """A Hugging Face GPT-2 with GPT-2's vocabulary (its config.json says model_type gpt2)."""
    if model.config.arch != "gpt2" or model.config.vocab_size != GPT2_VOCAB_SIZE:
        return False
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "gpt2"
    except (OSError, json.JSONDecodeError):
        return False


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


def add_tuning_parser(stages, name: str, *, help: str, description: str, presets: dict, default: str,
                      skip: tuple[str, ...], init_help: str, handler) -> argparse.ArgumentParser:
    """The parser of a command that trains from --init with a preset and dotted overrides (sft, dpo, grpo)."""
    from gptlab.runtime.config import describe_fields

    parser = stages.add_parser(
        name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"config fields (dotted, --key value; defaults of the {default} preset):\n"
        + describe_fields(presets[default](), skip=skip),
    )
    parser.add_argument("--init", required=True, metavar="MODEL", help=init_help)
    parser.add_argument("--preset", default=default, choices=sorted(presets), help=f"{default} (default)")
    parser.add_argument("--no-resume", action="store_true", help="start from step 0; refused if --out holds a run (see --force)")
    parser.add_argument("--force", action="store_true", help="start over: first clear the run in --out (its own files only)")
    parser.set_defaults(handler=handler, accepts_overrides=True)
    return parser


def run_tuning(config, run_fn, args: argparse.Namespace) -> int:
    """Run `run_fn(config, runtime=..., resume=..., force=...)` on the config's device; 130 when interrupted."""
    from gptlab.runtime.device import init_runtime, shutdown_runtime

    runtime = init_runtime(config.device)
    try:
        result = run_fn(config, runtime=runtime, resume=not args.no_resume, force=args.force)
    finally:
        shutdown_runtime(runtime)
    return 0 if result.status != "interrupted" else 130
