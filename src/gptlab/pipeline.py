"""The `gptlab run` job: the whole pipeline as a sequence of API calls.

Today: get the corpus -> train the tokenizer -> measure it on held-out text ->
tokenize the corpus into shuffled train/val shards. Later stages (training,
evaluation, sampling) join as they land. Every artefact goes under `out/`:
the resolved config, the tokenizer, the shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.data.corpus import corpus_files
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.config import config_to_json
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer.show import render_tokens, token_stats


@dataclass(frozen=True, kw_only=True)
class TokenizerStageConfig:
    vocab_size: int = 4096
    pattern: str = "gpt4"
    special_tokens: tuple[str, ...] = ("<|endoftext|>",)


@dataclass(frozen=True, kw_only=True)
class DataStageConfig:
    val: float = 0.1  # fraction of documents in the val split
    shard_tokens: int = 1_000_000
    seed: int = 1337


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    corpus: str = "shakespeare"
    out: str = "runs/shakespeare"
    val_every: int = 10  # every val_every-th document is held out for measuring
    tokenizer: TokenizerStageConfig = field(default_factory=TokenizerStageConfig)
    data: DataStageConfig = field(default_factory=DataStageConfig)

    def __post_init__(self) -> None:
        if self.val_every < 2:
            raise GptlabError(f"val_every must be at least 2 (one document in val_every is held out), got {self.val_every}")


@dataclass
class RunResult:
    tokenizer_dir: Path
    val_bytes_per_token: float
    train_seconds: float
    data_dir: Path


def run_pipeline(config: RunConfig, log: Callable[[str], None] = print, color: bool = False) -> RunResult:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.json", config_to_json(config))

    log(f"[1/4] corpus: {config.corpus}")
    files = corpus_files(config.corpus)
    held_out = files[config.val_every - 1 :: config.val_every]
    train_files = [path for path in files if path not in held_out]
    size = sum(path.stat().st_size for path in train_files)
    log(f"      {len(train_files)} training documents ({size / 1e6:.1f} MB), {len(held_out)} held out, from {files[0].parent}")

    log(f"[2/4] tokenizer: byte-level BPE, vocab {config.tokenizer.vocab_size}, pattern {config.tokenizer.pattern}")
    start = time.perf_counter()
    tokenizer = Tokenizer.train(
        files=train_files,
        vocab_size=config.tokenizer.vocab_size,
        pattern=config.tokenizer.pattern,
        special_tokens=config.tokenizer.special_tokens,
    )
    train_seconds = time.perf_counter() - start
    tokenizer_dir = out / "tokenizer"
    tokenizer.save(tokenizer_dir)
    log(f"      trained in {train_seconds:.1f} s -> {tokenizer_dir / 'tokenizer.json'}")

    log("[3/4] held-out text")
    texts = [path.read_text(encoding="utf-8") for path in held_out]
    start = time.perf_counter()
    encoded = [tokenizer.encode(text) for text in texts]
    encode_seconds = time.perf_counter() - start
    if [tokenizer.decode(ids) for ids in encoded] != texts:
        raise AssertionError("decode(encode(text)) != text on held-out documents")
    stats = token_stats("".join(texts), [i for ids in encoded for i in ids])
    rate = stats.bytes / 1e6 / max(encode_seconds, 1e-9)
    log(f"      {stats}; encoded at {rate:.1f} MB/s; decode(encode(text)) == text")
    excerpt = texts[0][:400].rsplit("\n", 1)[0]
    log(render_tokens(tokenizer, tokenizer.encode(excerpt), color=color))

    log(f"[4/4] data: {config.corpus} into shuffled shards, val {config.data.val:g} of the documents")
    data_dir = out / "data"
    prepare_config = PrepareConfig(val=config.data.val, shard_tokens=config.data.shard_tokens, seed=config.data.seed, progress=False)
    prepared = prepare_shards(config.corpus, tokenizer, data_dir, prepare_config, force=True)
    splits = prepared.manifest["splits"]
    described = ", ".join(f"{name} {entry['tokens']:,} tokens ({entry['documents']} documents, {len(entry['shards'])} shards)" for name, entry in splits.items())
    log(f"      {prepared.status} in {prepared.seconds:.1f} s: {described} -> {data_dir}")
    log(f"done: artefacts in {out}/")
    return RunResult(
        tokenizer_dir=tokenizer_dir, val_bytes_per_token=stats.bytes_per_token, train_seconds=train_seconds, data_dir=data_dir
    )
