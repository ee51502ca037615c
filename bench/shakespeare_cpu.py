"""The record tracks (gptlab.tracks) against nanoGPT's CPU recipe and against their previous record, at equal wall-clock.

nanoGPT's README trains a character-level model on a CPU with
`train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1
--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0` (lr 1e-3, beta2 0.99, 100 warmup steps, min lr 1e-4, weight decay 0.1). We rebuild that
configuration in our code: a byte-level "tokenizer" with no merges (one id per byte: Shakespeare is
ASCII, so one id per character) and the same model, batch, schedule and steps.

Every side trains on the same documents and is scored on the same works in bits per byte, so different
tokenizers compare fairly. --split test (records): the 38 training works, scored on the 4 held-out works
(every tenth, the ones `gptlab run` holds out: no tokenizer or model sees them). --split validation
(choosing settings): the training works less every tenth of them, scored on those; the held-out works are
not touched.

Sides, for a track of budget B seconds (20 x B recipe iterations; the published 2,000 take about 100 s):
- recipe: nanoGPT's recipe (left out with --no-recipe);
- record 0, 1, ...: every record of the track up to its latest (or --record N); --latest-only: that one alone;
- candidate: with --candidate FLAGS, the last record with those `gptlab run` flags on top.
Each seed runs the recipe first, then every gptlab side with exactly the recipe's measured wall-clock as its
time limit (B without the recipe). Seeds set the weights and batches; the sides alternate within a seed, so
a busy moment of a shared machine falls on all. Printed per track: each seed's bits per byte, each side's
mean +- standard deviation, ratios to the recipe, and Welch's t-test of each side against the one before it
(a record against the record it improved on).

    .venv/bin/python bench/shakespeare_cpu.py --latest-only cpu-600s              # the records (about 75 minutes)
    .venv/bin/python bench/shakespeare_cpu.py --tracks cpu-100s --seeds 1        # a quick look (about 8 minutes)
    .venv/bin/python bench/shakespeare_cpu.py --tracks cpu-100s --split validation --no-recipe --latest-only \\
        --candidate "--train.optimizer.lr 5e-3"                                  # trying a change
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import statistics
import tempfile
import time
from pathlib import Path

from machine import header

from gptlab.data.corpus import shakespeare_files
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.model import preset
from gptlab.model.io import load_model
from gptlab.pipeline import evaluate_split
from gptlab.runs.groups import welch_difference
from gptlab.tokenizer import Tokenizer
from gptlab.tracks import get_track, selection_split
from gptlab.train import Trainer, train_preset
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig


def nanogpt_recipe(steps: int):
    """train_shakespeare_char.py with the README's CPU overrides, in gptlab's Trainer."""
    return dataclasses.replace(
        train_preset("shakespeare-cpu"),
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
        eval_every=0,
        checkpoint_every=0,
    )


def split_files(split: str) -> tuple[list[Path], list[Path]]:
    """(training files, scored files) of the split."""
    files = shakespeare_files()
    if split == "validation":
        return selection_split(files)
    return [path for index, path in enumerate(files, 1) if index % 10], files[9::10]


def prepare(root: Path, vocab_size: int, pattern: str = "gpt4", split: str = "test") -> tuple[Path, Tokenizer]:
    """The tokenizer on the split's training works only, and shards whose val split is exactly its scored works
    (ROOT/tokenizer, ROOT/data). bench/moe_vs_dense.py and bench/recipe_ablation.py use the same data."""
    train, scored = split_files(split)
    tokenizer = Tokenizer.train(files=train, vocab_size=vocab_size, pattern=pattern)
    tokenizer.save(root / "tokenizer")
    prepare_shards([str(path) for path in train], tokenizer, root / "data",
                   PrepareConfig(val=0, shard_tokens=10_000_000, progress=False), val_source=[str(path) for path in scored])
    return root / "data", tokenizer


def prepared(root: Path, split: str, vocab_size: int, pattern: str, cache: dict) -> Path:
    """The folder of `prepare` for this tokenizer, made once per run."""
    if (vocab_size, pattern) not in cache:
        folder = root / f"data-{vocab_size}-{pattern}"
        prepare(folder, vocab_size, pattern, split)
        cache[vocab_size, pattern] = folder
    return cache[vocab_size, pattern]


def sides(track, args) -> list[tuple[str, object]]:
    """(name, the side's RunConfig, or None for nanoGPT's recipe) in the order each seed trains them: the recipe,
    then every record up to the latest (or --record N), oldest first; only the last with --latest-only."""
    last = track.latest if args.record is None else track.check_record(args.record)
    first = last if args.latest_only is not None and (not args.latest_only or track.name in args.latest_only) else 0
    chosen = [("recipe", None)] if args.recipe else []
    chosen += [(f"record {record}", track.config(record)) for record in range(first, last + 1)]
    if args.candidate:
        chosen.append(("candidate", track.config(last, shlex.split(args.candidate))))
    return chosen


def train_and_score(config) -> tuple[float, float, int]:
    start = time.perf_counter()
    result = Trainer(config, log=lambda line: None, resume=False).fit()
    seconds = time.perf_counter() - start
    return evaluate_split(load_model(result.checkpoint), config)["bpb"], seconds, result.steps


def one_seed(root: Path, track, chosen, seed: int, args, cache: dict) -> dict[str, float]:
    """Every side at one seed; the gptlab sides get the recipe's wall-clock (the track's budget without it)."""
    scores, budget, parts = {}, track.budget, []
    for name, run in chosen:
        out = str(root / f"{track.name}-{name.replace(' ', '')}-{seed}")
        if run is None:
            char = prepared(root, args.split, 257, "gpt4", cache)
            config = dataclasses.replace(nanogpt_recipe(round(20 * track.budget)), data=str(char / "data"), out=out, seed=seed)
        else:
            folder = prepared(root, args.split, run.tokenizer.vocab_size, run.tokenizer.pattern, cache)
            config = dataclasses.replace(run.train, data=str(folder / "data"), tokenizer=str(folder / "tokenizer"), out=out,
                                         seed=seed, time_limit=budget, model=dataclasses.replace(
                                             run.train.model, vocab_size=run.tokenizer.vocab_size))
        bpb, seconds, steps = train_and_score(dataclasses.replace(config, log_every=10**6, sample_tokens=0))
        if run is None:
            budget = seconds
        scores[name] = bpb
        parts.append(f"{name} {bpb:.4f} ({steps} steps, {seconds:.0f} s)")
    print(f"  seed {seed}: " + "   ".join(parts), flush=True)
    return scores


def show(values: list[float]) -> str:
    spread = f" +- {statistics.stdev(values):.4f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.4f}{spread}"


def summary(track, names: list[str], scores: list[dict[str, float]]) -> None:
    """Each side's mean and spread, its ratio to the recipe, and Welch's test against the side before it."""
    values = {name: [seed[name] for seed in scores] for name in names}
    print(f"{track.name} ({track.budget:g} s), bits per byte over {len(scores)} seed{'s' * (len(scores) > 1)}:")
    for index, name in enumerate(names):
        line = f"  {name:<10} {show(values[name])}"
        if "recipe" in values and name != "recipe":
            line += f"   {statistics.mean(values[name]) / statistics.mean(values['recipe']):.3f} x recipe"
        if index:  # `gptlab runs compare --group`'s statistics
            before = names[index - 1]
            test = welch_difference(name, before, "bpb", values[name], values[before])
            line += f"   {test.difference:+.4f} vs {before}"
            if test.p is not None:
                line += f" (95% interval {test.low:+.4f} to {test.high:+.4f}, Welch p = {test.p:.2g})"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracks", nargs="+", default=["cpu-100s", "cpu-600s"], help="record tracks (default cpu-100s cpu-600s)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per side and track (default 3)")
    parser.add_argument("--split", choices=("test", "validation"), default="test",
                        help="test: scored on the held-out works (records); validation: on a carve-out of the training works")
    parser.add_argument("--record", type=int, help="the last record measured (default the latest)")
    parser.add_argument("--candidate", default="", metavar="FLAGS", help="also the record with these `gptlab run` flags on top")
    parser.add_argument("--no-recipe", dest="recipe", action="store_false", help="leave nanoGPT's recipe out")
    parser.add_argument("--latest-only", nargs="*", metavar="TRACK",
                        help="measure only the last record, not the ones before it (of these tracks only, when named)")
    args = parser.parse_args()
    tracks = [get_track(name) for name in args.tracks]
    print(header("Record tracks on CPU: gptlab's records vs nanoGPT's CPU recipe, equal wall-clock", ["gptlab", "torch"]))
    print(f"# split: {args.split} ({'the 4 held-out works' if args.split == 'test' else 'a carve-out of the training works'}), "
          "scored in bits per byte over the whole split")
    with tempfile.TemporaryDirectory() as tmp:
        root, cache = Path(tmp), {}
        for track in tracks:
            chosen = sides(track, args)
            for name, run in chosen:
                if run is not None:
                    flags = track.flags(None if name == "candidate" else int(name.split()[1]))
                    extra = shlex.split(args.candidate) if name == "candidate" else []
                    print(f"# {track.name} {name}: {shlex.join(flags + extra) or 'the base recipe (shakespeare-cpu)'}")
            scores = [one_seed(root, track, chosen, seed, args, cache) for seed in range(args.seeds)]
            summary(track, [name for name, _ in chosen], scores)


if __name__ == "__main__":
    main()
