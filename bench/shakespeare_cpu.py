"""`gptlab run`'s training recipe against nanoGPT's CPU recipe for Shakespeare, at equal wall-clock.

nanoGPT's README trains a character-level model on a CPU with
`train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1
--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0` (lr 1e-3, beta2 0.99, 100 warmup steps, min lr 1e-4, weight decay 0.1). We rebuild that
configuration in our code: a byte-level "tokenizer" with no merges (one id per byte: Shakespeare is
ASCII, so one id per character) and the same model, batch, schedule and steps.

Both sides train on the same documents and are scored on the same held-out works (every tenth work,
the ones `gptlab run` holds out: neither tokenizer nor model sees them), in bits per byte, so the
different tokenizers compare fairly. The recipe runs first; gptlab's `shakespeare-cpu` preset then gets the same wall-clock
(`--time_limit`, and its cosine schedule is stretched to the steps that fit, measured in a short
probe run).

    .venv/bin/python bench/shakespeare_cpu.py             # the full comparison (about 3 minutes on 2 cores)
    .venv/bin/python bench/shakespeare_cpu.py --steps 200 # a quick look: both recipes shortened
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from pathlib import Path

from machine import header

from gptlab.data.corpus import shakespeare_files
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.model import preset
from gptlab.model.io import load_model
from gptlab.pipeline import RunConfig, evaluate_split
from gptlab.tokenizer import Tokenizer
from gptlab.train import Trainer, train_preset
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig


def nanogpt_recipe(data: Path, out: Path, steps: int):
    """train_shakespeare_char.py with the README's CPU overrides, in gptlab's Trainer."""
    return dataclasses.replace(
        train_preset("shakespeare-cpu"),
        data=str(data),
        out=str(out),
        model=preset("gpt2-mini", vocab_size=257, n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, bias=False),
        optimizer=OptimizerConfig(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=100 * steps // 2000, min_lr_ratio=0.1),
        batch_tokens=12 * 64,
        micro_batch=12,
        seq_len=64,
        max_steps=steps,
        precision="fp32",
        eval_every=0,
        checkpoint_every=0,
        log_every=100,
    )


def prepare(root: Path, vocab_size: int) -> tuple[Path, Tokenizer]:
    """The tokenizer on the training works only; shards with exactly the held-out works as the val split."""
    files = shakespeare_files()
    held_out = files[RunConfig().val_every - 1 :: RunConfig().val_every]
    train_files = [path for path in files if path not in held_out]
    tokenizer = Tokenizer.train(files=train_files, vocab_size=vocab_size, pattern="gpt4")
    tokenizer.save(root / "tokenizer")
    prepare_shards([str(path) for path in train_files], tokenizer, root / "data",
                   PrepareConfig(val=0, shard_tokens=10_000_000, progress=False), val_source=[str(path) for path in held_out])
    return root / "data", tokenizer


def train_and_score(config) -> tuple[float, float, int]:
    start = time.perf_counter()
    result = Trainer(config, log=lambda line: print("    " + line, flush=True), resume=False).fit()
    seconds = time.perf_counter() - start
    model = load_model(result.checkpoint)
    return evaluate_split(model, config)["bpb"], seconds, result.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="the recipe's steps (2000 in nanoGPT's README)")
    args = parser.parse_args()
    print(header("Shakespeare on CPU: gptlab run's recipe vs nanoGPT's CPU recipe, equal wall-clock", ["gptlab", "torch"]))
    print("# score: bits per byte on the same held-out works (every tenth of the 42, unseen by tokenizers and models), the whole val split.")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        char_data, _ = prepare(root / "char", 257)
        recipe = nanogpt_recipe(char_data, root / "char" / "run", args.steps)
        print(f"nanoGPT recipe: byte-level (257 ids), 4x128, block 64, batch 12, {args.steps} steps, fp32")
        recipe_bpb, recipe_seconds, _ = train_and_score(recipe)

        ours = train_preset("shakespeare-cpu")
        bpe_data, tokenizer = prepare(root / "bpe", ours.model.vocab_size)
        base = dataclasses.replace(ours, data=str(bpe_data), out=str(root / "bpe" / "probe"), tokenizer=str(root / "bpe" / "tokenizer"))
        # Probe the step time, then fit the schedule to the steps that fit in the recipe's time.
        probe_steps = 20
        probe = dataclasses.replace(base, max_steps=probe_steps, eval_every=0, checkpoint_every=0, log_every=probe_steps)
        per_step = Trainer(probe, log=lambda *_: None, resume=False).fit().seconds / probe_steps  # the loop only
        steps = max(10, math.floor(recipe_seconds / per_step))
        run = dataclasses.replace(base, out=str(root / "bpe" / "run"), max_steps=steps, time_limit=recipe_seconds, eval_every=0, checkpoint_every=0)
        print(f"gptlab shakespeare-cpu: BPE {tokenizer.vocab_size}, {run.model.n_layer}x{run.model.n_embd}, block {run.seq_len}, "
              f"{run.batch_tokens} tokens/step, {steps} steps (~{per_step:.2f} s/step), {run.precision}")
        ours_bpb, ours_seconds, ours_steps = train_and_score(run)

    print(f"nanoGPT recipe  val {recipe_bpb:.4f} bpb  in {recipe_seconds:.0f} s ({args.steps} steps)")
    print(f"gptlab run      val {ours_bpb:.4f} bpb  in {ours_seconds:.0f} s ({ours_steps} steps)")
    print(f"ratio (gptlab bpb / recipe bpb, < 1: gptlab better): {ours_bpb / recipe_bpb:.3f}")


if __name__ == "__main__":
    main()
