"""The decoder-only Transformer: GPT-2 exactly, and a Llama-style variant, in one readable file.

    idx (B, T) -> token embedding (+ learned positions for GPT-2)
               -> n_layer x Block: x = x + attn(norm(x)); x = x + mlp(norm(x))
               -> final norm -> lm_head -> logits (B, T, vocab_size)

GPT-2 (Radford et al., 2019): LayerNorm with bias, GELU (tanh approximation),
fused qkv, tied embeddings. Llama-style (Touvron et al., 2023): RMSNorm,
rotary position embeddings (Su et al., 2021) in the rotate-half layout that
Hugging Face uses, SwiGLU MLP, no biases, grouped-query attention
(Ainslie et al., 2023), optional QK-norm, untied embeddings.

Each part can also be switched alone (ModelConfig), as modded-nanogpt and nanochat do:

    position        learned | rotary                  which positions, on either arch
    norm            layer | rms                       LayerNorm or RMSNorm (Zhang & Sennrich, 2019)
    activation      gelu | swiglu | relu2             relu2 = relu(x)^2, not gated (Primer, So et al., 2021)
    qk_norm         RMSNorm on each head's q and k     (Dehghani et al., 2023)
    logit_softcap   cap * tanh(logits / cap)          (Gemma 2, 2024)
    zero_init       output projections start at 0     every block starts as the identity
    attn_window     sliding-window attention in the S layers of window_pattern (nanochat's SSSL)

Activation checkpointing (`set_activation_checkpointing`) keeps only each block's input in training and
recomputes the block in backward: less memory for one more block forward per block.

Attention runs through `F.scaled_dot_product_attention` (flash attention on
CUDA) or, for reference, the explicit softmax(QK^T / sqrt(d)) V; tests prove
them equal. `attention` "flash" and "triton" run FlashAttention-2 from
gptlab.kernels (PyTorch, Triton) on the causal calls without a mask: training,
scoring, a prefill into an empty cache, sliding-window layers included (the
kernels cut the window themselves). Calls with a mask (decoding from a cache,
padded batches) go to SDPA: the kernels know the causal mask and the window only.
"triton" (attention and norm_impl) runs its kernels where they can run, on CUDA
or in Triton's interpreter, and the PyTorch path elsewhere, so a model trained
with them on a GPU still runs on a CPU.
For SDPA a sliding-window layer passes a banded mask instead of `is_causal`,
so SDPA uses its masked (memory-efficient) kernel there. `norm_impl` "triton"
runs every RMSNorm through the fused kernel. Embedding and logit
rows are padded to a multiple of 64; the padded logits are cut off before
anyone sees them.

Generation state (the KV cache) lives in gptlab.model.cache; this module
only reads and appends to it. Single device, no optimizer, no tokenizer.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gptlab.kernels import flash_attention, triton_flash_attention, triton_rms_norm, triton_runs_on
from gptlab.model.config import ATTENTIONS, ModelConfig
from gptlab.model.loss import linear_cross_entropy
from gptlab.model.mlp import MLP
from gptlab.model.moe import MoE, recomputing
from gptlab.runtime import GptlabError


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 (as Hugging Face Llama does).

    impl "triton": the fused kernel (gptlab.kernels.triton_rmsnorm), proven equal to the lines below, where it can run
    (triton_runs_on: a model trained with it on a GPU still runs on a CPU)."""

    def __init__(self, dim: int, eps: float, impl: str = "torch") -> None:
        super().__init__()
        self.eps, self.impl = eps, impl
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "triton" and triton_runs_on(x.device):
            return triton_rms_norm(x, self.weight, self.eps)
        # F.rms_norm computes x * rsqrt(mean(x^2) + eps) in one kernel: 7x faster than the three ops on a CPU
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    dim = dim or config.n_embd
    if config.norm_kind == "layer":
        return nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)
    return RMSNorm(dim, config.norm_eps, config.norm_impl)


def rotary_tables(config: ModelConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (block_size, head_dim): angle = position * theta^(-2i/head_dim), halves repeated."""
    inverse = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32, device=device) / config.head_dim))
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float32, device=device), inverse)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position: the rotate-half form x*cos + (-x2, x1)*sin. cos/sin: (B or 1, 1, T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        qkv_out = (self.n_head + 2 * self.n_kv_head) * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, qkv_out, bias=config.bias or config.qkv_bias)  # fused q, k, v (Qwen2: biased)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.residual = True  # init scaled by 1/sqrt(2 n_layer)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.norm_eps, config.norm_impl)
            self.k_norm = RMSNorm(self.head_dim, config.norm_eps, config.norm_impl)
        self.impl = config.attention  # GPT.set_attention changes it

    def forward(self, x: torch.Tensor, rotary=None, cache=None, layer: int = 0, mask=None, window: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(
            [self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.n_kv_head * self.head_dim], dim=-1
        )
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, n_head, T, head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, n_kv_head, T, head_dim)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # all keys/values so far: (B, n_kv_head, S, head_dim)
        if self.n_kv_head != self.n_head:  # grouped-query: each kv head serves n_head / n_kv_head query heads
            repeat = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = self.attend(q, k, v, mask, window)  # (B, n_head, T, head_dim)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def attend(self, q, k, v, mask: torch.Tensor | None, window: int = 0) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + mask) v by `self.impl`. flash and triton take the causal mask cut to `window`
        (> 0, given only to them: GPT._layer_masks), so a call with a mask (cache, padding) goes to SDPA, and so
        does triton where its kernels cannot run (triton_runs_on). q (B, n_head, T, d), k and v (B, n_head, S, d)."""
        dropout = self.config.dropout if self.training else 0.0
        if self.impl == "math":
            return reference_attention(q, k, v, mask, dropout)
        if mask is None and self.impl == "flash":
            return flash_attention(q, k, v, causal=True, window=window)
        if mask is None and self.impl == "triton" and triton_runs_on(q.device):
            return triton_flash_attention(q, k, v, causal=True, window=window)
        if mask is None and window:  # triton's window, on SDPA
            mask = sliding_window_mask(causal_mask(q.shape[-2], k.shape[-2], q.device), window)
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)


def _recompute_contexts():
    """(the first forward's context, the recompute's): a sparse layer counts its statistics once."""
    return contextlib.nullcontext(), recomputing()


def causal_mask(T: int, S: int, device=None) -> torch.Tensor:
    """(1, 1, T, S) bool: the T queries are the last T of S positions, each sees itself and the keys before it."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)[None, None]


def sliding_window_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """Keep, for each query, only the last `window` keys its mask allows (itself included).

    The keys a query may see are its own position and the ones before it, so the last `window` of
    them are the positions within the window. Counting allowed keys rather than comparing column
    numbers also holds for left-padded rows and for cache rows of different lengths (gptlab.infer).
    With window 2: [1 1 1 0] -> [0 1 1 0]; a left-padded row [0 0 1 1 1] -> [0 0 0 1 1].
    """
    allowed_from_here = mask.flip(-1).cumsum(-1).flip(-1)  # allowed keys at this column or after it
    return mask & (allowed_from_here <= window)


def reference_attention(q, k, v, mask: torch.Tensor | None, dropout: float = 0.0) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal/padding mask) v, spelled out. mask: bool (B or 1, 1, T, S), True = may attend."""
    T, S = q.shape[-2], k.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is None:
        mask = causal_mask(T, S, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = F.dropout(F.softmax(scores.float(), dim=-1).to(q.dtype), p=dropout)
    return weights @ v


def previous_ids(idx: torch.Tensor, cache=None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's predecessor in its sequence, -1 where it has none: (B, T) ids -> (B, T).

    Without a cache: idx shifted right by one, [[5, 6, 7]] -> [[-1, 5, 6]]. With one, the cache keeps the ids it
    has seen (`previous_ids(idx)` records them), so a decoded token finds the one before it. A token at position 0
    (the first of a left-padded prompt) has none either, whatever sits before it.
    """
    if cache is not None:
        before = cache.previous_ids(idx)
    else:
        before = F.pad(idx[:, :-1], (1, 0), value=-1)
    if positions is not None:
        before = before.masked_fill(positions.expand_as(before) == 0, -1)
    return before


def bigram_buckets(before: torch.Tensor, idx: torch.Tensor, rows: int) -> torch.Tensor:
    """The bigram table's row for each (previous token, token) pair: a hash into rows 1..rows-1; row 0 for
    no previous token. Collisions share a row, as in modded-nanogpt's bigram hash embedding."""
    hashed = (before * 36313 + idx * 27191) % (rows - 1) + 1
    return torch.where(before < 0, torch.zeros_like(hashed), hashed)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MoE(config) if config.sparse_layers[layer] else MLP(config)  # sparse: gptlab.model.moe
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, rotary=None, cache=None, layer: int = 0, mask=None, window: int = 0):
        if self.training and self.dropout.p > 0:
            x = x + self.dropout(self.attn(self.ln_1(x), rotary, cache, layer, mask, window))
            return x + self.dropout(self.mlp(self.ln_2(x)))
        # no dropout: skip its module calls, a visible cost when decoding one token at a time
        x = x + self.attn(self.ln_1(x), rotary, cache, layer, mask, window)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The language model. `forward(idx, targets)` -> (logits, loss)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.padded_vocab_size, config.n_embd),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList(Block(config, layer) for layer in range(config.n_layer)),
                "ln_f": make_norm(config),
            }
        )
        if config.position_kind == "learned":
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        if config.bigram_vocab:
            # zeros, drawing nothing (here or in _init_weights): it adds nothing at first and the rest stays the seed's
            self.transformer["bigram"] = nn.Embedding(config.bigram_vocab, config.n_embd, _weight=torch.zeros(config.bigram_vocab, config.n_embd))
            self.transformer["bigram"].zero_start = True
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer["wte"].weight
        if config.position_kind == "rotary":
            cos, sin = rotary_tables(config)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.checkpoint_blocks = False  # set_activation_checkpointing
        self.last_aux_loss: torch.Tensor | None = None  # the balance losses added to the last training loss (MoE)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """N(0, 0.02); residual projections N(0, 0.02 / sqrt(2 n_layer)); biases 0; norms 1 (GPT-2 paper, sec. 2.3).

        zero_init: residual projections start at 0 instead (modded-nanogpt, nanochat), so every block adds
        nothing at first; their gradients are not zero, so they grow from the first step.
        """
        if isinstance(module, nn.Linear):
            residual = getattr(module, "residual", False)
            std = 0.02 / math.sqrt(2 * self.config.n_layer) if residual else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if residual and self.config.zero_init:  # drawn first all the same: the other weights stay the seed's
                nn.init.zeros_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding) and getattr(module, "zero_start", False):
            nn.init.zeros_(module.weight)  # drawing nothing: the other weights stay the seed's
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, MoE):  # the experts' weights, as the dense MLP's (the router is a Linear above)
            nn.init.normal_(module.experts_fc, mean=0.0, std=0.02)
            nn.init.normal_(module.experts_proj, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
            if self.config.zero_init:
                nn.init.zeros_(module.experts_proj)

    def set_attention(self, impl: str) -> GPT:
        """"sdpa" (F.scaled_dot_product_attention: flash on CUDA), "math" (the explicit reference), "flash"
        (FlashAttention-2 in PyTorch) or "triton" (its Triton kernels); the config's `attention` is the default."""
        if impl not in ATTENTIONS:
            raise GptlabError(f"unknown attention implementation {impl!r}; use one of {', '.join(ATTENTIONS)}")
        if impl in ("flash", "triton") and self.config.dropout > 0:
            raise GptlabError(f"attention {impl!r} has no attention dropout, and this model has dropout {self.config.dropout}")
        for block in self.transformer["h"]:
            block.attn.impl = impl
        return self

    def set_activation_checkpointing(self, on: bool = True) -> GPT:
        """Keep only each block's input for backward and run the block again there (Chen et al. 2016, "Training
        Deep Nets with Sublinear Memory Cost"): a block's activations are alive for one block at a time instead of
        all n_layer, for about one more forward (a third more compute). Training only: evaluation, generation
        and no_grad passes keep nothing to save. A setting of the run, not of the model: it is not saved."""
        self.checkpoint_blocks = on
        return self

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        ignore_index: int = -100,
        loss_reduction: str = "mean",
        cache=None,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
        fused_loss: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx (B, T) ids -> logits (B, T, vocab_size) and, with targets (B, T), the mean cross-entropy.

        Targets equal to `ignore_index` do not count; `loss_reduction="sum"` gives their sum instead of
        the mean (0, not NaN, when none counts: fine-tuning normalises over a whole step). For generation, `cache`
        (gptlab.model.cache.KVCache) holds past keys/values, `positions` (B, T)
        the position of each token (left-padded prompts start later), and
        `mask` (B, 1, T, S) bool which cached keys each query may attend to.
        `last_only` computes logits for the last position only (B, 1, vocab_size):
        all that sampling needs, and the output layer is the costly part.
        `fused_loss` (training: targets given, gradients on) returns no logits and the loss from the head,
        cap and cross-entropy fused in chunks (gptlab.model.loss): less memory, and faster.
        """
        x = self.hidden_states(idx, cache=cache, positions=positions, mask=mask)
        if fused_loss and targets is not None and torch.is_grad_enabled():
            loss = linear_cross_entropy(x, self.lm_head.weight, targets, self.config.vocab_size, self.config.logit_softcap,
                                        ignore_index, loss_reduction)
            return None, self._with_aux_loss(loss, targets, ignore_index, loss_reduction)
        if last_only and targets is None:
            x = x[:, -1:]
        logits = self.head_logits(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=ignore_index,
                                   reduction=loss_reduction)
        return logits, self._with_aux_loss(loss, targets, ignore_index, loss_reduction)

    def moe_layers(self) -> list[MoE]:
        """The sparse feed-forward layers, in order ([] for a dense model)."""
        return [block.mlp for block in self.transformer["h"] if isinstance(block.mlp, MoE)]

    def _with_aux_loss(self, loss, targets, ignore_index: int, reduction: str):
        """Training with targets: the loss plus the sparse layers' balance losses (gptlab.model.moe), per counted
        token under "sum" so a step's normalisation leaves their mean. `last_aux_loss` keeps the part added."""
        self.last_aux_loss = None
        if loss is None or not (self.training and self.config.is_moe and torch.is_grad_enabled()):
            return loss
        aux = sum(layer.aux_loss for layer in self.moe_layers())
        self.last_aux_loss = aux.detach()
        if reduction == "sum":
            aux = aux * (targets != ignore_index).sum()
        return loss + aux

    def hidden_states(self, idx: torch.Tensor, *, cache=None, positions: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> the final normalised hidden states (B, T, n_embd): what the output layer reads, and what a
        scalar head (a reward model's, a value function's) reads instead. Arguments as forward's."""
        T = idx.shape[1]
        start = cache.length if cache is not None else 0
        if start + T > self.config.block_size:
            raise GptlabError(f"sequence of {start + T} tokens is longer than the context ({self.config.block_size})")
        if positions is None:
            positions = torch.arange(start, start + T, device=idx.device).unsqueeze(0)  # (1, T)
        x, rotary = self._embed(idx, positions)
        if self.config.bigram_vocab:
            x = x + self.transformer["bigram"](bigram_buckets(previous_ids(idx, cache, positions), idx, self.config.bigram_vocab))
        if mask is None and cache is not None and start > 0:
            mask = causal_mask(T, start + T, idx.device)
        masks = self._layer_masks(mask, T, start + T, idx.device)
        recompute = self.checkpoint_blocks and self.training and cache is None and torch.is_grad_enabled()
        for layer, block in enumerate(self.transformer["h"]):
            if recompute:  # non-reentrant: any inputs, and the RNG replayed so dropout draws the same masks again
                x = checkpoint(block, x, rotary, None, layer, *masks[layer], use_reentrant=False, context_fn=_recompute_contexts)
            else:
                x = block(x, rotary, cache, layer, *masks[layer])
        if cache is not None:
            cache.advance(T)
        return self.transformer["ln_f"](x)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., n_embd) -> logits (..., vocab_size): the output layer, its padding cut, the softcap."""
        logits = self.lm_head(x)[..., : self.config.vocab_size]  # padded rows are never seen
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)  # smoothly bounded to (-cap, cap) (Gemma 2)
        return logits

    def _embed(self, idx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
        """Token embeddings (+ learned positions), and the rotary (cos, sin) of each position, (B|1, 1, T, D)."""
        x = self.transformer["wte"](idx)
        rotary = None
        if self.config.position_kind == "learned":
            x = x + self.transformer["wpe"](positions)
        else:
            rotary = (self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1))
        if self.training and self.config.dropout > 0:
            x = self.transformer["drop"](x)
        return x, rotary

    def _layer_masks(self, mask: torch.Tensor | None, T: int, S: int, device) -> list[tuple[torch.Tensor | None, int]]:
        """Each layer's attention mask and window: `mask` (None: plain causal) for full layers; for sliding-window
        layers the same cut to the last attn_window keys, built once. A window covering all S keys is no cut: skipped.
        The flash and triton kernels cut a window themselves: a plain causal call keeps mask None and gets the window."""
        window = self.config.attn_window
        short = [0 < layer_window < S for layer_window in self.config.layer_windows]
        if not any(short):
            return [(mask, 0)] * len(short)
        if mask is None and all(block.attn.impl in ("flash", "triton") for block in self.transformer["h"]):
            return [(None, window if is_short else 0) for is_short in short]
        windowed = sliding_window_mask(mask if mask is not None else causal_mask(T, S, device), window)
        return [(windowed if is_short else mask, 0) for is_short in short]

    def num_params(self, embeddings: bool = True) -> int:
        """Parameters (tied weights once); without embeddings: minus token and position tables (as in nanoGPT)."""
        total = sum(p.numel() for p in self.parameters())
        if not embeddings:
            total -= self.transformer["wte"].weight.numel()
            for table in ("wpe", "bigram"):
                if table in self.transformer:
                    total -= self.transformer[table].weight.numel()
            if not self.config.tie_embeddings:
                total -= self.lm_head.weight.numel()
        return total

    def check_ids(self, idx: torch.Tensor) -> None:
        """A clear error for ids outside the vocabulary (an embedding lookup would fail obscurely)."""
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            bad = int(idx.max()) if int(idx.max()) >= self.config.vocab_size else int(idx.min())
            raise GptlabError(f"token id {bad} is outside the vocabulary (0..{self.config.vocab_size - 1})")
