"""SFT batches: rendered conversations as (x, y) rows for the Trainer, padded or packed, with resumable state.

Every conversation is rendered by ChatFormat.render into ids and a loss mask and takes at most
seq_len + 1 tokens of a row (x is the row's first T tokens, y the T after). y is -100 (the model's
ignore_index) wherever the next token is not an assistant token, across a boundary between
conversations, and on padding.

- "pad": a conversation per row, padded at the end; batches are (x, y), and plain causal attention
  is right because real tokens never look forward at the padding.
- "pack": several conversations per row, chosen best-fit from a buffer of `buffer_size`
  (the largest that fits what is left of the row, first in stream order among equals), the rest
  padded. Batches are (x, y, {"positions", "mask"}): positions restart at 0 for each conversation
  and mask (B, 1, T, T) is block-diagonal causal, so each conversation sees only itself and its
  loss equals its loss alone. The padding is one more block that sees itself, since a query row
  with no key allowed makes SDPA return NaN.

Conversation i of a mixture epoch belongs to rank i mod world_size: rank r reads positions r, r + W,
r + 2W, ... of each epoch's order and packs its own rows, so ranks never share a conversation. The stream cycles
through epochs (each reshuffled by gptlab.chat.data.Mixture); with cycle=False it stops after one
epoch, the last batch holding the rows that are left (for validation).

A conversation longer than seq_len + 1 tokens is cut after its last whole assistant message that
fits, or dropped when even the first assistant message does not; `stats` counts, on this rank,
conversations served, truncated and dropped, their tokens and their target tokens (y != -100). The state (epoch, position, the
buffer's conversations as (epoch, position) pairs, stats) is plain JSON: a fresh loader given it
serves exactly the batches the saved one would have.

Not here: reading and mixing sources (gptlab.chat.data), the chat format (gptlab.chat.format).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from gptlab.chat.data import Mixture
from gptlab.chat.format import ChatFormat, Rendered
from gptlab.runtime import GptlabError

MODES = ("pad", "pack")
IGNORE = -100  # cross_entropy's ignore_index in GPT.forward
STATS = ("conversations", "truncated", "dropped", "tokens", "target_tokens")


@dataclass(frozen=True, kw_only=True)
class ConversationLoaderConfig:
    batch_size: int  # B: rows per batch on each rank
    seq_len: int  # T: tokens per row; a conversation takes up to T + 1 (the last is only a target)
    mode: str = "pack"  # "pack" (several conversations per row, block-diagonal mask) or "pad" (one per row)
    buffer_size: int = 64  # pack: conversations the best-fit choice looks at
    cycle: bool = True  # False: one epoch, then StopIteration (validation)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 1:
            raise GptlabError(f"batch_size and seq_len must be at least 1, got batch_size={self.batch_size} seq_len={self.seq_len}")
        if self.mode not in MODES:
            raise GptlabError(f"unknown conversation loader mode {self.mode!r}; use one of: {', '.join(MODES)}")
        if self.buffer_size < 1:
            raise GptlabError(f"buffer_size must be at least 1, got {self.buffer_size}")


@dataclass
class _Item:
    key: tuple[int, int]  # (epoch, position) in the mixture's order
    ids: list[int]
    mask: list[int]
    truncated: bool


def fit_conversation(rendered: Rendered, roles: list[str], limit: int, end: int) -> tuple[Rendered | None, bool]:
    """The rendering cut to at most `limit` tokens at a message boundary after an assistant message, and whether it
    was cut; None when no such prefix fits. Message k ends just after the k-th `end` id (gptlab.chat.format)."""
    if len(rendered.ids) <= limit:
        return rendered, False
    ends = [i + 1 for i, token in enumerate(rendered.ids) if token == end]
    assert len(ends) == len(roles), "every message closes with <|end|>"
    fitting = [stop for stop, role in zip(ends, roles) if role == "assistant" and stop <= limit]
    if not fitting:
        return None, False
    stop = fitting[-1]
    return Rendered(rendered.ids[:stop], rendered.mask[:stop]), True


class ConversationLoader:
    """Batches of rendered conversations from a Mixture for one rank of `world_size` (see the module docstring)."""

    def __init__(
        self,
        mixture: Mixture,
        chat_format: ChatFormat,
        *,
        config: ConversationLoaderConfig,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise GptlabError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
        if len(mixture) < world_size:
            raise GptlabError(f"the mixture holds {len(mixture)} conversations per epoch, fewer than the {world_size} ranks; add data")
        self.mixture, self.format, self.config = mixture, chat_format, config
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self._pin = self.device.type == "cuda"
        self.reset()

    # ------------------------------------------------------------ the stream of conversations

    def reset(self) -> None:
        """Back to the first batch of the first epoch, stats cleared."""
        self._epoch, self._position, self._step = 0, self.rank, 0
        self._buffer: list[_Item] = []
        self.stats = dict.fromkeys(STATS, 0)

    @property
    def epoch(self) -> int:
        """The mixture epoch the next conversation is read from."""
        return self._epoch

    @property
    def step(self) -> int:
        """Batches served, counting those before a restored state."""
        return self._step

    def _render(self, key: tuple[int, int]) -> _Item | None:
        part, index = self.mixture.order(key[0])[key[1]]
        messages = self.mixture.get(int(part), int(index))
        rendered = self.format.render(messages)
        roles = ["tools"] * bool(getattr(messages, "tools", ())) + [m["role"] for m in messages]  # a tools block ends with <|end|> too
        fitted, truncated = fit_conversation(rendered, roles, self.config.seq_len + 1, self.format.end)
        if fitted is None:
            return None
        return _Item(key, fitted.ids, fitted.mask, truncated)

    def _pull(self) -> _Item | None:
        """The next conversation of this rank that fits (counting drops), or None at the end of a non-cycling epoch."""
        per_epoch = len(range(self.rank, len(self.mixture), self.world_size))
        for _ in range(per_epoch + 1):
            if self._position >= len(self.mixture):
                if not self.config.cycle:
                    return None
                self._epoch, self._position = self._epoch + 1, self.rank
            key = (self._epoch, self._position)
            self._position += self.world_size
            item = self._render(key)
            if item is not None:
                return item
            self.stats["dropped"] += 1
        raise GptlabError(
            f"no conversation of rank {self.rank} fits seq_len {self.config.seq_len} + 1 tokens up to its first assistant "
            "message; raise seq_len or shorten the prompts"
        )

    def _served(self, item: _Item) -> None:
        self.stats["conversations"] += 1
        self.stats["truncated"] += int(item.truncated)
        self.stats["tokens"] += len(item.ids)
        self.stats["target_tokens"] += sum(item.mask[1:])

    # ------------------------------------------------------------ batches

    def next_batch(self) -> tuple:
        """pad: (x, y); pack: (x, y, {"positions": (B, T) int64, "mask": (B, 1, T, T) bool}); x, y int64 (B, T).
        With cycle=False the last batch may have fewer rows, and StopIteration follows it."""
        rows = self._pad_rows() if self.config.mode == "pad" else self._pack_rows()
        if not rows:
            raise StopIteration
        for row in rows:
            for item in row:
                self._served(item)
        self._step += 1
        x, y, positions, blocks = self._tensors(rows)
        if self.config.mode == "pad":
            return self._to_device(x), self._to_device(y)
        T = self.config.seq_len
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        mask = (blocks[:, :, None] == blocks[:, None, :]) & causal  # (B, T, T): same conversation, not later
        extras = {"positions": self._to_device(positions), "mask": self._to_device(mask[:, None])}
        return self._to_device(x), self._to_device(y), extras

    def __iter__(self) -> Iterator[tuple]:
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def _pad_rows(self) -> list[list[_Item]]:
        rows = []
        while len(rows) < self.config.batch_size and (item := self._pull()) is not None:
            rows.append([item])
        return rows

    def _pack_rows(self) -> list[list[_Item]]:
        rows = []
        for _ in range(self.config.batch_size):
            row, room = [], self.config.seq_len + 1
            while True:
                self._fill_buffer()
                best = None  # the longest conversation that fits; the earliest among equals
                for number, item in enumerate(self._buffer):
                    if len(item.ids) <= room and (best is None or len(item.ids) > len(self._buffer[best].ids)):
                        best = number
                if best is None:
                    break
                item = self._buffer.pop(best)
                row.append(item)
                room -= len(item.ids)
            if not row:
                break
            rows.append(row)
        return rows

    def _fill_buffer(self) -> None:
        while len(self._buffer) < self.config.buffer_size and (item := self._pull()) is not None:
            self._buffer.append(item)

    def _tensors(self, rows: list[list[_Item]]) -> tuple[torch.Tensor, ...]:
        """x, y, positions and block numbers (B, T); the padding after a row's conversations is its own block."""
        B, T = len(rows), self.config.seq_len
        x = np.full((B, T + 1), self.format.bos, dtype=np.int64)  # one more column: the last target
        y = np.full((B, T + 1), IGNORE, dtype=np.int64)
        positions = np.zeros((B, T + 1), dtype=np.int64)
        blocks = np.zeros((B, T + 1), dtype=np.int64)
        for b, row in enumerate(rows):
            start = 0
            for number, item in enumerate(row):
                length = len(item.ids)
                ids, mask = np.asarray(item.ids), np.asarray(item.mask, dtype=bool)
                x[b, start : start + length] = ids
                # token t predicts token t + 1 of the same conversation; its last token predicts nothing
                y[b, start : start + length - 1] = np.where(mask[1:], ids[1:], IGNORE)
                positions[b, start : start + length] = np.arange(length)
                blocks[b, start : start + length] = number
                start += length
            positions[b, start:] = np.arange(T + 1 - start)
            blocks[b, start:] = len(row)
        return tuple(torch.from_numpy(array[:, :T].copy()) for array in (x, y, positions, blocks))

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return tensor
        if self._pin:
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=self._pin)

    # ------------------------------------------------------------ resume

    def state_dict(self) -> dict:
        """Where the stream stands, as plain JSON (goes into trainer_state.json)."""
        return {
            "kind": "conversations",
            "mode": self.config.mode,
            "batch_size": self.config.batch_size,
            "seq_len": self.config.seq_len,
            "buffer_size": self.config.buffer_size,
            "seed": self.mixture.seed,
            "epoch_size": len(self.mixture),
            "rank": self.rank,
            "world_size": self.world_size,
            "step": self._step,
            "epoch": self._epoch,
            "position": self._position,
            "buffer": [list(item.key) for item in self._buffer],
            "stats": dict(self.stats),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`: the next batches are those the saved loader would have served next."""
        if not isinstance(state, dict) or state.get("kind") != "conversations":
            raise GptlabError("loader state was not made by ConversationLoader.state_dict; resume with the same loader kind")
        ours = self.state_dict()
        missing = [key for key in ours if key not in state]
        if missing:
            raise GptlabError(f"loader state lacks {', '.join(missing)}; it was not made by ConversationLoader.state_dict")
        fixed = ("mode", "batch_size", "seq_len", "buffer_size", "seed", "epoch_size", "rank", "world_size")
        different = [f"{key} {state[key]!r} (this loader: {ours[key]!r})" for key in fixed if state[key] != ours[key]]
        if different:
            raise GptlabError(
                f"loader state was saved by a different loader: {', '.join(different)}; "
                "resume with the same data mixture, config, rank and world size"
            )
        buffer = []
        for epoch, position in state["buffer"]:
            item = self._render((int(epoch), int(position)))
            if item is None:
                raise GptlabError(f"the conversation at epoch {epoch}, position {position} no longer fits; the data changed since the state was saved")
            buffer.append(item)
        self._step, self._epoch, self._position = int(state["step"]), int(state["epoch"]), int(state["position"])
        self._buffer = buffer
        self.stats = {key: int(state["stats"][key]) for key in STATS}
