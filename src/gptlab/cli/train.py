"""`gptlab train`: a preset, then dotted overrides (--data DIR --model.n-layer 6 --optimizer.lr 1e-3).

With --seeds N it trains N such runs, seeds S..S+N-1, into OUT-seedS each (gptlab.train.seeds).

Under torchrun every rank runs this same command:
    torchrun --nproc_per_node=8 -m gptlab train --preset gpt2-124m-fineweb --data data/edu10B --out runs/gpt2

The model's vocabulary defaults to the data's tokenizer's; with --init-from the
model's settings come from the weights it starts from.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

DEFAULT_PRESET = "shakespeare-cpu"


def register(stages) -> None:
    from gptlab.runtime.config import describe_fields
    from gptlab.train import train_preset

    parser = stages.add_parser(
        "train",
        help="train a GPT on prepared shards (resumes a run in --out)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a GPT on shards made by `gptlab data prepare`. Rerunning the same command resumes the run "
        "in --out; other settings into the same --out are refused (--force starts over), except a larger --max-steps "
        "with --extend, which trains the run on.",
        epilog=f"config fields (dotted, --key value or --key=value; defaults of the {DEFAULT_PRESET} preset):\n"
        + describe_fields(train_preset(DEFAULT_PRESET)),
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, help=f"{DEFAULT_PRESET} (default) or gpt2-124m-fineweb")
    parser.add_argument("--depth", type=int, default=None,
                        help="one dial: n_layer, width (64 x depth), heads, lr, batch and steps from the depth "
                        "(gptlab.train.config.at_depth); explicit --model.* etc. still win")
    parser.add_argument("--from-fit", metavar="FILE",
                        help="with --depth: the tokens (compute-optimal D for the model's N) and the lr law of a scaling fit "
                        "(the fit.json `gptlab fit` writes) instead of Chinchilla's 20 tokens per parameter and sqrt-width lrs")
    parser.add_argument("--no-resume", action="store_true", help="start from step 0; refused if --out holds a run (see --force)")
    parser.add_argument("--force", action="store_true", help="start over: first clear the run in --out (its own files only)")
    parser.add_argument("--extend", action="store_true",
                        help="train the run in --out on to a larger --max-steps (a finished run too), from its last checkpoint; "
                        "the learning rate then follows the longer run's schedule from that step (a decayed cosine rises again)")
    parser.add_argument("--seeds", type=int, metavar="N",
                        help="train N runs, seeds S..S+N-1 (S: --seed), into OUT-seedS each, then print their mean ± std "
                        "over seeds (compare two recipes with `gptlab runs compare --group NAME='OUT-seed*' ...`)")
    parser.set_defaults(handler=run, accepts_overrides=True)


def resolve_config(preset: str, overrides: list[str], depth: int | None = None, from_fit: str | None = None):
    """The preset (sized by --depth) with the overrides, the model's vocabulary taken from the data (or the model from --init-from)."""
    from gptlab.data.shards import read_manifest
    from gptlab.data.workspace import TOKENIZER_NAMES
    from gptlab.load.model_folders import find_model
    from gptlab.model.hf import read_pretrained_config
    from gptlab.runtime import GptlabError
    from gptlab.runtime.config import apply_overrides, parse_overrides
    from gptlab.train import train_preset
    from gptlab.train.config import at_depth

    base = train_preset(preset)
    if from_fit and depth is None:
        raise GptlabError(f"--from-fit {from_fit} sets the rules of the depth dial; pass --depth N too")
    rule = None
    if from_fit:
        from gptlab.scaling.fit import read_depth_rule

        rule = read_depth_rule(from_fit)
    given = dict(parse_overrides(overrides))
    if depth is not None and given.get("init_from"):
        raise GptlabError(f"--init-from {given['init_from']} sets the model; drop --depth {depth}")
    defaults = {}
    if given.get("init_from"):
        init = read_pretrained_config(find_model(given["init_from"]))
        architecture = sorted(key for key in given if key.startswith("model.") and key != "model.dropout")
        if architecture:
            raise GptlabError(f"--init-from {given['init_from']} sets the model; drop {', '.join('--' + k.replace('_', '-') for k in architecture)}")
        defaults = {f"model.{key}": value for key, value in dataclasses.asdict(init).items() if key != "dropout"}
    elif given.get("data") and "model.vocab_size" not in given:
        defaults = {"model.vocab_size": int(read_manifest(given["data"])["tokenizer"]["vocab_size"])}
    if given.get("data") and "tokenizer" not in given and any((Path(given["data"]) / name).is_file() for name in TOKENIZER_NAMES):
        defaults["tokenizer"] = given["data"]  # the tokenizer `data prepare` saved with the shards
    defaults.update(follow_seq_len(base, given))
    config = apply_overrides(base, overrides, defaults=defaults)
    return apply_overrides(at_depth(config, depth, rule), overrides) if depth is not None else config  # explicit flags still win


def follow_seq_len(base, given: dict[str, str], *, model: bool = True) -> dict:
    """What a --seq-len the user set changes where they did not set it: the model's block_size follows it (the model
    must see whole sequences; not with --init-from, whose model is fixed), and the batch is rounded to the nearest
    multiple (at least one) of seq_len x micro_batch, so that it divides into micro-batches. `model=False`: the
    model is not this config's to change (gptlab run's fine-tuning)."""
    if "seq_len" not in given:
        return {}
    try:
        seq_len = int(given["seq_len"])
        micro_batch = int(given.get("micro_batch", base.micro_batch))
    except ValueError:
        return {}  # the override parser names the flag and the type
    if seq_len < 1 or micro_batch < 0:
        return {}
    derived = {}
    if model and "model.block_size" not in given and not given.get("init_from"):
        derived["model.block_size"] = seq_len
    per_pass = seq_len * max(micro_batch, 1)
    batch_tokens = max(1, round(base.batch_tokens / per_pass)) * per_pass
    if "batch_tokens" not in given and batch_tokens != base.batch_tokens:
        derived["batch_tokens"] = batch_tokens
    return derived


def describe_derived(derived: dict) -> str:
    """"--seq-len 256: --model.block-size 256 and --batch-tokens 4096 follow it (set them to choose)"."""
    from gptlab.runtime.config import flag

    return " and ".join(f"{flag(key)} {value}" for key, value in derived.items())


def run(args: argparse.Namespace) -> int:
    from gptlab.pipeline import hellaswag_fn, text_sampler
    from gptlab.runtime.device import init_runtime, shutdown_runtime
    from gptlab.train import Trainer

    config = resolve_config(args.preset, args.overrides, args.depth, args.from_fit)
    from gptlab.runtime.config import parse_overrides
    from gptlab.train import train_preset

    derived = follow_seq_len(train_preset(args.preset), dict(parse_overrides(args.overrides)))
    if derived and args.depth is None:
        verb = "follow" if len(derived) > 1 else "follows"
        print(f"--seq-len {config.seq_len}: {describe_derived(derived)} {verb} it (set {'them' if len(derived) > 1 else 'it'} to choose)")
    if args.from_fit:
        tokens = config.max_steps * config.batch_tokens
        print(f"from the fit {args.from_fit}: depth {args.depth} trains {tokens:,} tokens in {config.max_steps:,} steps, "
              f"AdamW lr {config.optimizer.lr:.3g}")
    runtime = init_runtime(config.device)

    def build(one) -> Trainer:
        return Trainer(one, runtime=runtime, sample_fn=text_sampler(one.sample_tokens), task_fn=hellaswag_fn(one),
                       resume=not args.no_resume, force=args.force, extend=args.extend)

    try:
        if args.seeds is not None:
            return train_over_seeds(config, args.seeds, build, runtime)
        result = build(config).fit()
        if runtime.is_main:
            print(result.line())
    finally:
        shutdown_runtime(runtime)
    return 0 if result.status != "interrupted" else 130


def train_over_seeds(config, seeds: int, build, runtime) -> int:
    """--seeds N: the runs in turn, then their summary (not after a Ctrl-C, which leaves seeds untrained)."""
    from gptlab.train.seeds import seeds_summary, train_seeds

    runs = train_seeds(config, seeds, build, runtime=runtime)
    if runs.stopped:
        return 130
    if runtime.is_main:
        print(seeds_summary(runs))
    return 0
