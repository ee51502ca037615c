"""Tiny training configs over the suite's small prepared dataset (the `prepared` fixture of tests/conftest.py)."""

import dataclasses

from gptlab.model import preset
from gptlab.train import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig


def tiny_config(prepared, out, **changes) -> TrainConfig:
    config = TrainConfig(
        data=str(prepared / "data"),
        tokenizer=str(prepared / "tokenizer"),
        out=str(out),
        model=preset("gpt2-tiny", vocab_size=512, block_size=32),
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=2),
        batch_tokens=4 * 32,
        micro_batch=4,
        seq_len=32,
        max_steps=6,
        precision="fp32",
        device="cpu",
        eval_every=3,
        eval_batches=2,
        checkpoint_every=3,
        log_every=1,
    )
    return dataclasses.replace(config, **changes)


def masked_batches(x, y):
    """Targets ignored (-100) where the input id is even, and every target of rows starting with an id under 100:
    micro-batches (and ranks) then hold different numbers of targets, some none at all."""
    y = y.masked_fill(x % 2 == 0, -100)
    return x, y.masked_fill((x[:, :1] < 100).expand_as(y), -100)


def mask_some_targets(patch=None):
    """Make ShardLoader serve masked_batches (with pytest's monkeypatch, or for good in a subprocess)."""
    from gptlab.data.loader import ShardLoader

    original = ShardLoader.next_batch

    def next_batch(self):
        return masked_batches(*original(self))

    if patch is not None:
        patch.setattr(ShardLoader, "next_batch", next_batch)
    else:
        ShardLoader.next_batch = next_batch
