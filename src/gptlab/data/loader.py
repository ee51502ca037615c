"""The training loader: (x, y) batches of token ids from a prepared shard directory, with resumable state.

Owns: batching a split's shards into int64 tensors of shape (B, T), the split
between ranks, and a small JSON-able state so a resumed run sees exactly the
batches an uninterrupted run would have seen.

Two modes:

- "sequential" (build-nanogpt's DataLoaderLite): the split's shards in order.
  In shard s, round k covers tokens [k·W·B·T, (k+1)·W·B·T + 1) and rank r reads
  the window starting at (k·W + r)·B·T, so W ranks together read the stream
  once. A round that would pass the end of the shard starts the next shard
  (wrapping to the first, one epoch more); batches never cross shards.
- "random" (nanoGPT's get_batch): B windows of T+1 tokens at uniformly random
  places in the split. Batch n of rank r draws from
  SeedSequence([seed, r, n]), so the stream is a function of the batch index
  and resuming needs no generator state.

Shards are numpy memmaps (gptlab.data.shards.open_shard); only the windows a
batch needs are read. Opening a split checks every shard's CRC-32 (one read,
under 0.1 s per 100M uint16 tokens), so a damaged shard is an error that
names it and says how to repair it, never wrong tokens or an IndexError
mid-training. Not here: the shard and manifest format
(gptlab.data.shards), tokenizing (gptlab.data.prepare), distributed set-up
(the caller passes rank and world_size).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from gptlab.data.shards import REPAIR, open_shard, read_manifest, split_shards
from gptlab.runtime import GptlabError

MODES = ("sequential", "random")


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    batch_size: int  # B: sequences per batch on each rank
    seq_len: int  # T: tokens per sequence
    mode: str = "sequential"  # "sequential" (stream the shards in order) or "random" (nanoGPT get_batch)
    seed: int = 0  # random mode: with rank and batch index, picks the windows

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 1:
            raise GptlabError(
                f"batch_size and seq_len must be at least 1, got batch_size={self.batch_size} seq_len={self.seq_len}"
            )
        if self.mode not in MODES:
            raise GptlabError(f"unknown loader mode {self.mode!r}; use one of: {', '.join(MODES)}")
        if self.seed < 0:
            raise GptlabError(f"seed must be 0 or more (it seeds numpy's SeedSequence), got {self.seed}")


class ShardLoader:
    """Batches (x, y) of shape (B, T) from one split of a prepared directory, for one rank of `world_size`."""

    def __init__(
        self,
        directory: str | os.PathLike,
        split: str = "train",
        *,
        config: LoaderConfig,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        fingerprint: str | None = None,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise GptlabError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
        self.directory = Path(directory)
        self.split = split
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        # pinned host memory lets the host-to-GPU copy run asynchronously with the step
        self._pin = self.device.type == "cuda"
        self._paths, self._shards = self._open_shards(fingerprint)
        self._lengths = np.array([len(tokens) for tokens in self._shards], dtype=np.int64)
        self._check_enough_tokens()
        # random mode: window starts numbered across the split; a shard shorter than T+1 has none
        windows = np.maximum(self._lengths - config.seq_len, 0)
        self._window_starts = np.concatenate([[0], np.cumsum(windows)])
        self.reset()

    # ------------------------------------------------------------ opening

    def _open_shards(self, fingerprint: str | None) -> tuple[list[Path], list[np.ndarray]]:
        """Map every shard of the split and check it: intact (CRC-32), same tokenizer, the length the manifest says."""
        listed = split_shards(self.directory, self.split)
        manifest_fingerprint = read_manifest(self.directory).get("tokenizer", {}).get("fingerprint")
        if fingerprint is not None and fingerprint != manifest_fingerprint:
            raise GptlabError(
                f"{self.directory} was tokenized with tokenizer {manifest_fingerprint}, not the expected {fingerprint}; "
                "prepare the data again with this tokenizer, or load the matching one"
            )
        expected = fingerprint if fingerprint is not None else manifest_fingerprint
        paths, shards = [], []
        for path, n_tokens in listed:
            header, tokens = open_shard(path, verify=True)
            if expected is not None and header.fingerprint != expected:
                raise GptlabError(
                    f"{path} was tokenized with tokenizer {header.fingerprint}, not {expected} like the rest of "
                    f"{self.directory}; {REPAIR}"
                )
            if header.n_tokens != n_tokens:
                raise GptlabError(
                    f"{path} holds {header.n_tokens:,} tokens but {self.directory / 'manifest.json'} says {n_tokens:,}; {REPAIR}"
                )
            paths.append(path)
            shards.append(tokens)
        return paths, shards

    def _check_enough_tokens(self) -> None:
        """Fail at construction, with the numbers, rather than loop forever in next_batch."""
        B, T, W = self.config.batch_size, self.config.seq_len, self.world_size
        where = f"the {self.split!r} split of {self.directory}"
        largest = int(self._lengths.max())
        # random windows may overlap, so any split with one window of T + 1 tokens serves batches (checked below)
        total = int(self._lengths.sum())
        if self.config.mode == "sequential" and total < B * T + 1:
            raise GptlabError(
                f"{where} holds {total:,} tokens; one batch needs batch_size {B} × seq_len {T} + 1 = {B * T + 1:,}; "
                "lower batch_size or seq_len, use mode='random', or prepare more data"
            )
        if self.config.mode == "sequential" and largest < W * B * T + 1:
            raise GptlabError(
                f"sequential batches come from one shard, and a round of {W} rank(s) needs "
                f"{W} × {B} × {T} + 1 = {W * B * T + 1:,} tokens, but the largest shard of {where} holds {largest:,}; "
                "lower batch_size or seq_len, use mode='random', or prepare larger shards"
            )
        if self.config.mode == "random" and largest < T + 1:
            raise GptlabError(
                f"a window needs seq_len {T} + 1 = {T + 1:,} tokens from one shard, but the largest shard of {where} "
                f"holds {largest:,}; lower seq_len or prepare larger shards"
            )

    # ------------------------------------------------------------ batches

    @property
    def tokens_per_batch(self) -> int:
        """Tokens in one batch on this rank: B × T."""
        return self.config.batch_size * self.config.seq_len

    @property
    def step(self) -> int:
        """Batches this loader has served (counting those before a restored state)."""
        return self._step

    @property
    def epoch(self) -> int:
        """Sequential: full passes over the split; random: tokens served by all ranks ÷ split tokens."""
        if self.config.mode == "sequential":
            return self._epoch
        return self._step * self.tokens_per_batch * self.world_size // int(self._lengths.sum())

    def reset(self) -> None:
        """Back to the first batch of the first epoch."""
        self._step = 0
        self._epoch = 0
        self._shard = 0
        self._position = 0
        if self.config.mode == "sequential":
            self._shard = -1
            self._next_shard()  # the first shard that holds a round
            self._position = self._round_offset()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: int64 (B, T) on the loader's device; y[b, t] is the token after x[b, t]."""
        B, T = self.config.batch_size, self.config.seq_len
        host = torch.empty((2, B, T), dtype=torch.int64, pin_memory=self._pin)
        rows = host.numpy()  # (2, B, T): x then y, filled in place (uint → int64 on assignment)
        if self.config.mode == "sequential":
            self._fill_sequential(rows)
        else:
            self._fill_random(rows)
        self._step += 1
        if self._pin:
            host = host.to(self.device, non_blocking=True)
        return host[0], host[1]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def _round_offset(self) -> int:
        """Where this rank's window starts inside a round of world_size windows."""
        return self.tokens_per_batch * self.rank

    def _rounds(self, shard: int) -> int:
        """Whole rounds (one window per rank) that fit in a shard; the +1 is y's last target."""
        return int(self._lengths[shard] - 1) // (self.tokens_per_batch * self.world_size)

    def _next_shard(self) -> None:
        """Move to the next shard that holds at least one round, wrapping (an epoch) after the last."""
        while True:
            self._shard += 1
            if self._shard == len(self._shards):
                self._shard = 0
                self._epoch += 1
            if self._rounds(self._shard) > 0:
                return

    def _fill_sequential(self, rows: np.ndarray) -> None:
        B, T = self.config.batch_size, self.config.seq_len
        window = self._shards[self._shard][self._position : self._position + B * T + 1]
        rows[0] = window[:-1].reshape(B, T)
        rows[1] = window[1:].reshape(B, T)
        stride = self.tokens_per_batch * self.world_size
        self._position += stride
        # decide on the round's start, not this rank's window, so every rank changes shard at the same
        # step (DataLoaderLite tests its own position, which lets ranks drift apart at a shard's end)
        round_start = self._position - self._round_offset()
        if round_start + stride + 1 > self._lengths[self._shard]:
            self._next_shard()
            self._position = self._round_offset()

    def _fill_random(self, rows: np.ndarray) -> None:
        B, T = self.config.batch_size, self.config.seq_len
        generator = np.random.default_rng(np.random.SeedSequence([self.config.seed, self.rank, self._step]))
        # uniform over every window start in the split = shard weighted by its windows, then uniform inside it
        starts = generator.integers(0, self._window_starts[-1], size=B, dtype=np.int64)
        shards = np.searchsorted(self._window_starts[1:], starts, side="right")
        for row, (shard, start) in enumerate(zip(shards, starts)):
            offset = int(start - self._window_starts[shard])
            window = self._shards[shard][offset : offset + T + 1]
            rows[0, row] = window[:-1]
            rows[1, row] = window[1:]

    def rebatch(self, batch_size: int) -> None:
        """Serve the stream from here in smaller batches (the Trainer's out-of-memory backoff).

        `batch_size` must divide the current B: with k = B / batch_size, batch n becomes batch n·k.
        Sequential: the round in progress keeps its first token, and this rank's window moves to
        rank × batch_size × T inside it; random: the windows are those batch n·k draws. Either way
        the loader stands where one that always served `batch_size` would stand after the same
        sequences, so the rest of the stream is its stream (sequential: as long as no shard end lay
        behind, where a smaller round can fit in the tail a larger one skipped).
        """
        old = self.config.batch_size
        if batch_size < 1 or old % batch_size:
            raise GptlabError(f"batches of {old} can be split into batches of a divisor of {old}, not {batch_size}")
        round_start = self._position - self._round_offset()
        self.config = replace(self.config, batch_size=batch_size)
        self._step *= old // batch_size
        if self.config.mode == "sequential":
            self._position = round_start + self._round_offset()

    # ------------------------------------------------------------ resume

    def state_dict(self) -> dict:
        """Where the stream stands, as plain ints and strings (goes into trainer_state.json)."""
        return {
            "mode": self.config.mode,
            "split": self.split,
            "batch_size": self.config.batch_size,
            "seq_len": self.config.seq_len,
            "seed": self.config.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "step": self._step,
            "epoch": self.epoch,
            "shard": self._shard,
            "position": self._position,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`: the next batches are those the saved loader would have served next."""
        if not isinstance(state, dict):
            raise GptlabError(f"loader state must be a dict from ShardLoader.state_dict, got {type(state).__name__}")
        ours = self.state_dict()
        missing = [key for key in ours if key not in state]
        if missing:
            raise GptlabError(f"loader state lacks {', '.join(missing)}; it was not made by ShardLoader.state_dict")
        fixed = ("mode", "split", "batch_size", "seq_len", "seed", "rank", "world_size")
        different = [f"{key} {state[key]!r} (this loader: {ours[key]!r})" for key in fixed if state[key] != ours[key]]
        if different:
            raise GptlabError(
                f"loader state was saved by a different loader: {', '.join(different)}; "
                "resume with the same data, config, rank and world size"
            )
        step, epoch, shard, position = (int(state[key]) for key in ("step", "epoch", "shard", "position"))
        if step < 0 or epoch < 0:
            raise GptlabError(f"loader state has a negative step ({step}) or epoch ({epoch})")
        if self.config.mode == "sequential":
            self._check_sequential_place(shard, position)
        self._step, self._epoch, self._shard, self._position = step, epoch, shard, position

    def _check_sequential_place(self, shard: int, position: int) -> None:
        """A saved place must be a round start of this rank in a shard that still holds that round."""
        stride = self.tokens_per_batch * self.world_size
        round_start = position - self._round_offset()
        valid = (
            0 <= shard < len(self._shards)
            and round_start >= 0
            and round_start % stride == 0
            and round_start // stride < self._rounds(shard)
        )
        if not valid:
            raise GptlabError(
                f"loader state points at shard {shard}, position {position:,}, which is not a batch start of rank "
                f"{self.rank} in {self.directory} ({self.split!r}); the data changed since the state was saved"
            )
