"""Prefix caching: keys/values of prompt blocks already computed, kept for later requests that start the same way.

    prompt   [t0 .. t15] [t16 .. t31] [t32 .. t39]       blocks of 16 tokens; a partial last block is never stored
    key(block i) = hash(key(block i - 1), tokens of block i)   so a block's key names its whole prefix, and equal
                                                               prefixes (a shared system prompt, a chat's earlier turns)
                                                               share their blocks whatever follows them
    admit    walk the prompt's blocks while the store has them: n cached tokens, at most len(prompt) - 1 (the last
             prompt token is always computed: its logits give the first new token); copy their K/V into the
             request's slot rows, then prefill only prompt[n:] at positions n..
    store    after a prefill, and when a request finishes (prompt + reply, so the next turn of a chat reuses it), the
             slot's full blocks not yet held are copied in

Blocks are copies (as vLLM's automatic prefix caching and SGLang's radix cache share blocks, but simpler): the
engine's SlotCache rows own their memory, so a block is copied into a row on admit and out of it on store, and no
block is ever in use by a running request. A block holds (2, n_layer, n_kv_head, 16, head_dim) keys and values in the
model's dtype. The store stays within its byte budget by dropping the least recently used leaf block (one no
other held block continues), so every held block stays reachable from its first block. A lookup checks each block's
tokens and parent, so a hash collision is a miss, never a wrong prefix.

Rotary or learned positions are baked into the keys at their absolute positions; a block is only ever reused at
the same positions (block i of a prompt), so reused keys are exactly those a full prefill would compute, up to float
rounding of a differently shaped matmul (which can only matter at a near tie, as for the engine's batching).

A store belongs to one Engine and the weights its model has: gptlab.align.rl.rollout builds an engine per rollout, so
weights updated between rollouts never meet old blocks; whoever changes a served model's weights in place calls
`engine.prefix_cache.clear()`.

Not here: the slots and the forward passes (gptlab.infer.engine), the budget's flag (`gptlab serve --prefix-cache-mb`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

import torch

BLOCK_TOKENS = 16  # tokens per block (vLLM's default block size)


@dataclass
class PrefixCacheStats:
    budget_bytes: int  # the most the blocks may hold
    hits: int = 0  # prompt tokens whose keys/values came from the store
    misses: int = 0  # prompt tokens a prefill computed
    evictions: int = 0  # blocks dropped to stay within the budget
    bytes: int = 0  # held now, never above budget_bytes
    blocks: int = 0  # held now

    @property
    def hit_rate(self) -> float:
        return self.hits / (self.hits + self.misses) if self.hits + self.misses else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "hit_rate": round(self.hit_rate, 4)}


@dataclass
class _Block:
    parent: int | None  # the previous block's key (None for a prompt's first block)
    tokens: tuple[int, ...]
    kv: torch.Tensor  # (2, n_layer, n_kv_head, block_tokens, head_dim): keys, then values
    children: int = 0  # held blocks that continue this one: a block with children is never evicted


class PrefixCache:
    """Block-hashed K/V of prefixes seen before, under `budget_bytes`. Used only on the engine's thread."""

    def __init__(self, budget_bytes: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self.stats = PrefixCacheStats(budget_bytes=budget_bytes)
        self._blocks: OrderedDict[int, _Block] = OrderedDict()  # least recently used first

    def _chain(self, tokens: list[int], limit: int) -> list[tuple[int, int | None, tuple[int, ...]]]:
        """(key, parent key, tokens) of the first `limit` full blocks of `tokens`.

        [0..31] with 16-token blocks -> [(k0, None, (0..15)), (k1, k0, (16..31))], k1 = hash((k0, (16..31)))
        """
        chain, parent = [], None
        for i in range(min(limit, len(tokens) // self.block_tokens)):
            block = tuple(tokens[i * self.block_tokens : (i + 1) * self.block_tokens])
            key = hash((parent, block))
            chain.append((key, parent, block))
            parent = key
        return chain

    def _held(self, key: int, parent: int | None, tokens: tuple[int, ...]) -> _Block | None:
        block = self._blocks.get(key)
        if block is None or block.parent != parent or block.tokens != tokens:  # absent, or a hash collision
            return None
        return block

    def _touch(self, keys: list[int]) -> None:
        """Mark a chain as just used, parents last: they are then evicted after their children (a leaf first)."""
        for key in reversed(keys):
            self._blocks.move_to_end(key)

    @torch.inference_mode()
    def restore(self, keys: torch.Tensor, values: torch.Tensor, row: int, prompt: list[int]) -> int:
        """Copy the longest held prefix of `prompt` into slot `row` of keys/values (n_layer, slots, n_kv_head, S, head_dim);
        the number of tokens copied, a whole number of blocks below len(prompt) (the last token is left to compute)."""
        found = []
        for key, parent, tokens in self._chain(prompt, (len(prompt) - 1) // self.block_tokens):
            block = self._held(key, parent, tokens)
            if block is None:
                break
            start = len(found) * self.block_tokens
            keys[:, row, :, start : start + self.block_tokens] = block.kv[0]
            values[:, row, :, start : start + self.block_tokens] = block.kv[1]
            found.append(key)
        self._touch(found)
        cached = len(found) * self.block_tokens
        self.stats.hits += cached
        self.stats.misses += len(prompt) - cached
        return cached

    @torch.inference_mode()
    def store(self, keys: torch.Tensor, values: torch.Tensor, row: int, tokens: list[int]) -> None:
        """Hold the full blocks of `tokens`, whose keys/values slot `row` has at positions 0..len(tokens)-1."""
        held = []
        for key, parent, block_tokens in self._chain(tokens, len(tokens)):
            if self._held(key, parent, block_tokens) is None:
                if key in self._blocks:  # another prefix under this hash: it keeps the key, this chain ends here
                    break
                start = len(held) * self.block_tokens
                kv = torch.stack([keys[:, row, :, start : start + self.block_tokens],
                                  values[:, row, :, start : start + self.block_tokens]])
                size = kv.numel() * kv.element_size()
                if not self._make_room(size, protect=set(held)):
                    break
                self._blocks[key] = _Block(parent, block_tokens, kv)
                if parent is not None:
                    self._blocks[parent].children += 1
                self.stats.bytes += size
                self.stats.blocks += 1
            held.append(key)
        self._touch(held)

    def _make_room(self, size: int, protect: set[int]) -> bool:
        """Evict least recently used leaves (not in `protect`: the chain being stored) until `size` more bytes fit."""
        while self.stats.bytes + size > self.stats.budget_bytes:
            victim = next((key for key, block in self._blocks.items() if block.children == 0 and key not in protect), None)
            if victim is None:
                return False
            block = self._blocks.pop(victim)
            if block.parent is not None:
                self._blocks[block.parent].children -= 1
            self.stats.bytes -= block.kv.numel() * block.kv.element_size()
            self.stats.blocks -= 1
            self.stats.evictions += 1
        return True

    def clear(self) -> None:
        """Drop every block (the counters of hits and misses stay)."""
        self._blocks.clear()
        self.stats.bytes = self.stats.blocks = 0
