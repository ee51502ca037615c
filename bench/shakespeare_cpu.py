"""`gptlab run`'s training recipe against nanoGPT's CPU recipe for Shakespeare, at equal wall-clock.

nanoGPT's README trains a character-level model on a CPU with
`train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1
--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0` (lr 1e-3, beta2 0.99, 100 warmup steps, min lr 1e-4, weight decay 0.1). We rebuild that
configuration in our code: a byte-level "tokenizer" with no merges (one id per byte: Shakespeare is
ASCII, so one id per character) and the same model, batch, schedule and steps.

Both sides train on the same documents and are scored on the same held-out works (every tenth work,
the ones `gptlab run` holds out: neither tokenizer nor model sees them), in bits per byte, so the
different tokenizers compare fairly.

Budgets: the published recipe is 2,000 iterations, about 100 s here; a budget of B seconds gives the
recipe 20 x B iterations (its cosine decays over all of them, as its README's --lr_decay_iters). Each seed
runs the recipe first, then gptlab's default recipe (the `shakespeare-cpu` preset, time-budgeted: its
schedule follows the share of `--time-limit` spent) with exactly the recipe's measured wall-clock. Seeds
set the weights and the batches of both sides; the two sides alternate, so a busy moment of a shared machine
falls on both. Printed per budget: every seed's bits per byte, mean +- standard deviation, the ratio of
the means, and Welch's t-test (unequal variances) of gptlab's seeds against the recipe's.

    .venv/bin/python bench/shakespeare_cpu.py                          # 100 s and 600 s, 3 seeds each (about 75 minutes)
    .venv/bin/python bench/shakespeare_cpu.py --budgets 100 --seeds 1  # a quick look (about 4 minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from machine import header
from scipy.stats import ttest_ind

from gptlab.data.corpus import shakespeare_files
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.model import preset
from gptlab.model.io import load_model
from gptlab.pipeline import RunConfig, evaluate_split
from gptlab.tokenizer import Tokenizer
from gptlab.train import Trainer, train_preset
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig


def nanogpt_recipe(data: Path, out: Path, steps: int, seed: int):
    """train_shakespeare_char.py with the README's CPU overrides, in gptlab's Trainer."""
    return dataclasses.replace(
        train_preset("shakespeare-cpu"),
        data=str(data),
        out=str(out),
        model=preset("gpt2-mini", vocab_size=257, n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, bias=False),
        optimizer=OptimizerConfig(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, impl="torch"),  # its loop on a CPU
        schedule=ScheduleConfig(kind="cosine", warmup_steps=100 * steps // 2000, min_lr_ratio=0.1),
        batch_tokens=12 * 64,
        micro_batch=12,
        seq_len=64,
        max_steps=steps,
        precision="fp32",
        loader_mode="random",  # nanoGPT's get_batch: random windows
        fused_loss=False,  # its model.py: the full logits, then F.cross_entropy
        seed=seed,
        eval_every=0,
        checkpoint_every=0,
        log_every=500,
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
    result = Trainer(config, log=lambda line: None, resume=False).fit()
    seconds = time.perf_counter() - start
    model = load_model(result.checkpoint)
    return evaluate_split(model, config)["bpb"], seconds, result.steps


def one_seed(root: Path, char_data: Path, bpe_data: Path, budget: float, seed: int) -> tuple[float, float]:
    """The recipe, then gptlab given the recipe's wall-clock; both scored on the held-out works."""
    steps = round(20 * budget)
    recipe = nanogpt_recipe(char_data, root / f"recipe-{budget:g}-{seed}", steps, seed)
    recipe_bpb, recipe_seconds, _ = train_and_score(recipe)
    ours = dataclasses.replace(train_preset("shakespeare-cpu"), data=str(bpe_data), tokenizer=str(bpe_data.parent / "tokenizer"),
                               out=str(root / f"gptlab-{budget:g}-{seed}"), seed=seed, max_steps=10**9,
                               time_limit=recipe_seconds, eval_every=0, checkpoint_every=0, log_every=500)
    ours_bpb, ours_seconds, ours_steps = train_and_score(ours)
    print(f"  seed {seed}: recipe {recipe_bpb:.4f} bpb ({steps} steps, {recipe_seconds:.0f} s)   "
          f"gptlab {ours_bpb:.4f} bpb ({ours_steps} steps, {ours_seconds:.0f} s)", flush=True)
    return recipe_bpb, ours_bpb


def summary(budget: float, recipe: list[float], ours: list[float]) -> None:
    def show(values):
        spread = f" +- {statistics.stdev(values):.4f}" if len(values) > 1 else ""
        return f"{statistics.mean(values):.4f}{spread}"

    ratio = statistics.mean(ours) / statistics.mean(recipe)
    p = f", Welch t-test p = {ttest_ind(ours, recipe, equal_var=False).pvalue:.2g}" if len(ours) > 1 else ""
    print(f"budget {budget:g} s: recipe {show(recipe)}  gptlab {show(ours)} bits per byte (n={len(ours)} seeds each)")
    print(f"  gptlab / recipe = {ratio:.3f}: {1 - ratio:.1%} fewer bits per byte{p}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[100, 600], help="seconds per run (default 100 600)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per side and budget (default 3)")
    args = parser.parse_args()
    print(header("Shakespeare on CPU: gptlab's default recipe vs nanoGPT's CPU recipe, equal wall-clock", ["gptlab", "torch"]))
    ours = train_preset("shakespeare-cpu")
    print("# score: bits per byte on the same held-out works (every tenth of the 42, unseen by tokenizers and models), the whole val split.")
    print(f"# recipe: byte-level (257 ids), 4x128, block 64, batch 12, 20 x budget iterations, fp32; gptlab: shakespeare-cpu, "
          f"BPE {ours.model.vocab_size}, {ours.model.n_layer}x{ours.model.n_embd}, {ours.optimizer.kind}, {ours.batch_tokens} tokens/step, "
          f"time-budgeted, {ours.precision}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        char_data, _ = prepare(root / "char", 257)
        bpe_data, _ = prepare(root / "bpe", ours.model.vocab_size)
        for budget in args.budgets:
            print(f"budget {budget:g} s", flush=True)
            pairs = [one_seed(root, char_data, bpe_data, budget, seed) for seed in range(args.seeds)]
            summary(budget, [a for a, _ in pairs], [b for _, b in pairs])


if __name__ == "__main__":
    main()
