"""The KV cache: each layer's keys and values so far, so decoding a token costs one position, not the prefix.

Tensors are preallocated as (B, n_kv_head, max_len, head_dim) per layer. During a
forward pass every layer appends its new keys/values at [length, length + T) and
reads [0, length + T); `advance(T)` moves `length` once the pass is done.

Not here: sampling and the decode loop (gptlab.infer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptlab.model.config import ModelConfig
from gptlab.runtime import GptlabError


class KVCache:
    def __init__(self, config: ModelConfig, batch_size: int, max_len: int | None = None, *, device=None, dtype=torch.float32) -> None:
        self.max_len = max_len or config.block_size
        if self.max_len > config.block_size:
            raise GptlabError(f"cache of {self.max_len} positions is longer than the context ({config.block_size})")
        self.shape = (config.n_layer, batch_size, config.kv_heads, self.max_len, config.head_dim)
        self.keys = torch.zeros(self.shape, device=device, dtype=dtype)
        self.values = torch.zeros(self.shape, device=device, dtype=dtype)
        self.ids = torch.full((batch_size, self.max_len), -1, dtype=torch.long, device=device)  # for a bigram table
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, n_kv_head, T, head_dim) keys/values after the cached ones; return all of them."""
        if self.keys.dtype != k.dtype or self.keys.device != k.device:
            if self.length:
                raise GptlabError(f"KV cache holds {self.keys.dtype} on {self.keys.device}; new keys are {k.dtype} on {k.device}")
            # Follow the model: a bf16 model (or autocast) gets a bf16 cache.
            self.keys = torch.zeros(self.shape, device=k.device, dtype=k.dtype)
            self.values = torch.zeros(self.shape, device=k.device, dtype=k.dtype)
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise GptlabError(f"KV cache full: {end} positions needed, {self.max_len} allocated")
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def previous_ids(self, idx: torch.Tensor) -> torch.Tensor:
        """Record the new (B, T) ids at [length, length + T); return each one's predecessor (-1 at position 0)."""
        if self.ids.device != idx.device:
            self.ids = self.ids.to(idx.device)
        start, end = self.length, self.length + idx.shape[1]
        if end > self.max_len:
            raise GptlabError(f"KV cache full: {end} positions needed, {self.max_len} allocated")
        self.ids[:, start:end] = idx
        before = self.ids[:, max(start - 1, 0) : end - 1]
        return before if start else F.pad(before, (1, 0), value=-1)

    def advance(self, n: int) -> None:
        self.length += n

    def reset(self) -> None:
        self.length = 0
