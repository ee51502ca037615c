"""`gptlab profile`: time, trace and count one training step of a model on this machine (gptlab.train.profile).

    gptlab profile --out prof                                   the demo model (train preset shakespeare-cpu)
    gptlab profile --preset gpt2-mini --model.n-layer 6 --batch 8 --seq-len 256 --out prof
    gptlab profile --checkpoint runs/shakespeare --precision bf16 --activation-checkpointing --out prof

A preset is a model preset (its model with AdamW) or a training preset (its model, optimizer, micro-batch,
seq_len, precision and loss); a checkpoint or model folder gives its model with AdamW. `--model.*` and
`--optimizer.*` override either.
"""

from __future__ import annotations

import argparse
import dataclasses

from gptlab.cli.common import DEVICE_HELP, add_model_argument

DEFAULT_PRESET = "shakespeare-cpu"
OWN_FLAGS = {"batch_size": "--batch", "seq_len": "--seq-len", "precision": "--precision", "steps": "--steps",
             "warmup": "--warmup", "trace_steps": "--trace-steps", "activation_checkpointing": "--activation-checkpointing"}


def register(stages) -> None:
    parser = stages.add_parser("profile", help="time, trace and count a training step: phases, ops, memory, MFU",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", metavar="NAME",
                        help=f"a model preset (gpt2-tiny, gpt2-mini, llama-124m, ...) or a training preset ({DEFAULT_PRESET}, "
                        f"gpt2-124m-fineweb); default {DEFAULT_PRESET}")
    add_model_argument(source, required=False)
    parser.add_argument("--out", required=True, metavar="DIR", help="where to write profile.json, trace.json, ops.txt, ...")
    parser.add_argument("--batch", type=int, metavar="B", help="sequences per step (default: the training preset's "
                        "micro-batch, else 8)")
    parser.add_argument("--seq-len", type=int, metavar="T", help="tokens per sequence (default: the training preset's, "
                        "else the block size)")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                        help="autocast precision (default auto: the training preset's, else as training picks it here)")
    parser.add_argument("--steps", type=int, default=10, metavar="N", help="timed steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="steps before timing, at least 2 (default 3)")
    parser.add_argument("--trace-steps", type=int, default=2, metavar="N", help="steps the profiler traces (default 2)")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute each block in backward (and measure the step without it, to compare)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.set_defaults(handler=run, accepts_overrides=True)


def resolve_config(args: argparse.Namespace, device):
    """The ProfileConfig: the source's model and optimizer with the --model.* / --optimizer.* overrides, then the flags."""
    from gptlab.load.model_folders import find_model
    from gptlab.model import PRESETS as MODEL_PRESETS
    from gptlab.model import preset
    from gptlab.model.hf import read_pretrained_config
    from gptlab.runtime import GptlabError
    from gptlab.runtime.config import apply_overrides
    from gptlab.runtime.device import resolve_precision
    from gptlab.train import PRESETS as TRAIN_PRESETS
    from gptlab.train import train_preset
    from gptlab.train.profile import ProfileConfig

    name = args.preset or (None if args.checkpoint else DEFAULT_PRESET)
    settings = {}
    if args.checkpoint:
        base = ProfileConfig(model=read_pretrained_config(find_model(args.checkpoint)))
    elif name in TRAIN_PRESETS:
        train = train_preset(name)
        base = ProfileConfig(model=train.model, optimizer=train.optimizer, fused_loss=train.fused_loss,
                             grad_clip=train.grad_clip, activation_checkpointing=train.activation_checkpointing)
        settings = {"batch_size": train.micro_batch or None, "seq_len": train.seq_len,
                    "precision": train.precision if train.precision in ("fp32", "bf16") else None}
    elif name in MODEL_PRESETS:
        base = ProfileConfig(model=preset(name))
    else:
        raise GptlabError(f"unknown preset {name!r}; model presets: {', '.join(MODEL_PRESETS)}; "
                          f"training presets: {', '.join(TRAIN_PRESETS)}")
    fixed = {key: f"pass {flag}" for key, flag in OWN_FLAGS.items()}
    fixed.update(fused_loss="the training preset's is used", grad_clip="the training preset's is used",
                 peak_seconds="fixed at 1 s")
    config = apply_overrides(base, args.overrides, fixed=fixed)
    precision = args.precision if args.precision != "auto" else settings.get("precision") or resolve_precision("auto", device)
    if precision not in ("fp32", "bf16"):
        raise GptlabError(f"precision {precision} (auto on {device}) is not profiled here; pass --precision fp32 or bf16")
    changes = {"batch_size": args.batch or settings.get("batch_size") or 8,
               "seq_len": args.seq_len or settings.get("seq_len") or 0, "precision": precision, "steps": args.steps,
               "warmup": args.warmup, "trace_steps": args.trace_steps,
               "activation_checkpointing": args.activation_checkpointing or config.activation_checkpointing}
    return dataclasses.replace(config, **changes), name or args.checkpoint


def _check_counts(args: argparse.Namespace) -> None:
    """Counts below 1 in one line with exit 1 (argparse would print its usage block's error, exit 2)."""
    from gptlab.runtime import GptlabError

    for flag, value in (("--batch", args.batch), ("--seq-len", args.seq_len), ("--steps", args.steps),
                        ("--trace-steps", args.trace_steps)):
        if value is not None and value < 1:
            raise GptlabError(f"{flag} must be at least 1, got {value}")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gptlab.runtime import check_out_dir
    from gptlab.runtime.device import init_runtime
    from gptlab.train.profile import PROFILE_FILES, describe, profile_training

    _check_counts(args)
    check_out_dir(args.out, PROFILE_FILES)  # refused before the model is read or built
    runtime = init_runtime(args.device)
    config, name = resolve_config(args, runtime.device)
    summary = profile_training(config, runtime.device, args.out, log=lambda line: print(f"profile: {line}", flush=True))
    for line in describe(summary, name):
        print(line)
    print((Path(args.out) / "ops.txt").read_text(), end="")
    return 0
