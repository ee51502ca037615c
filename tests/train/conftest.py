"""A small prepared dataset (Shakespeare, 512-token BPE) and tiny training configs, shared by the training tests."""

import dataclasses

import pytest

from gptlab.model import preset
from gptlab.train import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.data.prepare import PrepareConfig, prepare_shards
    from gptlab.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("prepared")
    documents = shakespeare_documents()[:6]
    tokenizer = Tokenizer.train(documents, vocab_size=512)
    tokenizer.save(root / "tokenizer")
    prepare_shards("shakespeare", tokenizer, root / "data", PrepareConfig(val=0.1, shard_tokens=200_000, progress=False))
    return root


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
