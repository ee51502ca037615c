"""The default recipe's levers, one at a time: each switched back, at equal wall-clock, against the default.

    .venv/bin/python bench/recipe_ablation.py                       # 100 s a run, 1 seed (about 20 minutes)
    .venv/bin/python bench/recipe_ablation.py --budget 300 --seeds 2

Every row trains `shakespeare-cpu` (time-budgeted, so each run ends annealed) with one lever reverted to
what it replaced, on the data of bench/shakespeare_cpu.py (the BPE tokenizer and the model never see the
held-out works), and scores bits per byte on those works. A positive delta: the lever helps.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

from machine import header
from shakespeare_cpu import prepare, train_and_score

from gptlab.train import train_preset

# lever -> (what the default does, the overrides that revert it)
LEVERS = {
    "default": ("", {}),
    "AdamW": ("Muon (0.015) for the blocks' matrices", {"optimizer.kind": "muon", "optimizer.muon_lr": 0.015}),
    "embedding/head lr": ("one AdamW lr (3e-3)", {"optimizer.embedding_lr": 0.0, "optimizer.head_lr": 0.0}),
    "fused loss": ("head, cap, F.cross_entropy", {"fused_loss": False}),
    "rotary": ("learned positions", {"model.position": "learned"}),
    "RMSNorm": ("LayerNorm", {"model.norm": "layer"}),
    "ReLU^2": ("GELU", {"model.activation": "gelu"}),
    "QK-norm": ("no QK-norm", {"model.qk_norm": False}),
    "untied head": ("tied head", {"model.tie_embeddings": True}),
    "no softcap": ("softcap 15", {"model.logit_softcap": 15.0}),
    "zero init": ("N(0, 0.02/sqrt(2L)) projections", {"model.zero_init": False}),
    "4 x 128": ("4 x 192 (heads of 48)", {"model.n_embd": 192, "model.n_head": 4}),
    "2,048 tokens a step": ("4,096", {"batch_tokens": 4096, "micro_batch": 32}),
}


def reverted(config, changes: dict):
    """The config with dotted fields replaced (model.* and optimizer.* nest)."""
    nested: dict[str, dict] = {}
    top = {}
    for key, value in changes.items():
        if "." in key:
            part, field = key.split(".")
            nested.setdefault(part, {})[field] = value
        else:
            top[key] = value
    for part, fields in nested.items():
        top[part] = dataclasses.replace(getattr(config, part), **fields)
    return dataclasses.replace(config, **top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=100, help="seconds of training per run (default 100)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), help=f"rows to run (default all: {', '.join(LEVERS)})")
    args = parser.parse_args()
    print(header(f"The default recipe's levers, one at a time, {args.budget:g} s each", ["gptlab", "torch"]))
    base = train_preset("shakespeare-cpu")
    with tempfile.TemporaryDirectory() as tmp:
        data, _ = prepare(Path(tmp), base.model.vocab_size)
        base = dataclasses.replace(base, data=str(data), tokenizer=str(Path(tmp) / "tokenizer"), max_steps=10**9,
                                   time_limit=args.budget, eval_every=0, checkpoint_every=0, log_every=500)
        scores = {}
        print(f"{'lever':<22}{'reverted to':<34}{'bpb':>8}{'steps':>7}{'delta':>8}")
        for lever in args.levers:
            what, changes = LEVERS[lever]
            runs = [train_and_score(dataclasses.replace(reverted(base, changes), seed=seed, out=str(Path(tmp) / f"{lever}-{seed}")))
                    for seed in range(args.seeds)]
            scores[lever] = statistics.mean(bpb for bpb, _, _ in runs)
            delta = f"{scores[lever] - scores['default']:+.4f}" if "default" in scores and lever != "default" else ""
            print(f"{lever:<22}{what:<34}{scores[lever]:>8.4f}{round(statistics.mean(s for _, _, s in runs)):>7}{delta:>8}", flush=True)


if __name__ == "__main__":
    main()
