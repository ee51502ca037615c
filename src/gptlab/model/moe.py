"""Mixture of experts: a sparse feed-forward layer that sends each token to top_k of n_experts small MLPs.

    x (N tokens, C) -> router: scores (N, E) = softmax or sigmoid(x W_router)
                    -> each token picks its top_k experts by score (+ a balancing bias, selection only)
                    -> weights = the picked scores, renormalised to sum to 1 (optional)
                    -> y = sum over picked e of weight_e * expert_e(x)  [+ shared experts(x), every token]

Parameters grow with n_experts; the compute per token grows only with top_k (Shazeer et al., 2017; Switch,
Fedus et al., 2021; GShard, Lepikhin et al., 2020). What keeps the router from sending everything to a few
experts (collapse):

    aux_loss     Switch: n_experts * sum_i f_i P_i, f_i the share of assignments expert i got and P_i its mean
                 score; 1.0 when balanced, n_experts / top_k when every token picks the same experts.
    z_loss       ST-MoE (Zoph et al., 2022): mean logsumexp(router logits)^2 keeps the logits small.
    bias_update  DeepSeek-V3 (2024): no loss; after each optimizer step an overloaded expert's routing bias
                 goes down and an underloaded one's up by a fixed rate. The bias changes which experts are
                 picked, never the weights. `update_routing_bias` applies it; the trainer calls it.

Capacity (Switch): with capacity_factor > 0 an expert processes at most ceil(factor * N * top_k / E)
assignments, first come first served in token order; the rest are dropped (the token's residual stream
carries on without that expert) and counted. capacity_factor 0 is dropless (MegaBlocks, Gale et al., 2022).
The cut applies in training only: evaluation and generation are dropless, so a token's output never depends on
the rest of its batch.

Two ways to compute the experts, the same numbers (tests/model/test_moe.py): `impl="loop"` is the reference,
a loop over experts each taking its tokens; `impl="grouped"` sorts the assignments by expert and runs each
projection as one grouped matmul over all experts (F.grouped_mm), which is what GPUs (and torchtitan) do.

Expert weights are stored as (n_experts, out, in), transformers' own layout for Qwen3-MoE and Mixtral:
`experts_fc` holds [gate | up] rows for SwiGLU (the dense MLP's c_fc, per expert), `experts_proj` the down
projection. Experts have no biases (none of the MoE families has them).

Statistics for a user to see a collapsing router (tokens per expert, dropped assignments, the balance loss)
are summed in training forwards and read with `pop_stats`. Single device: expert parallelism
(gptlab.parallel.expert) replaces `expert_forward` from outside.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from gptlab.model.config import ModelConfig
from gptlab.model.mlp import MLP  # the dense MLP: shared experts, as wide as they are together

STAT_NAMES = ("dropped", "assignments", "balance", "z", "forwards")  # pop_stats' scalars, after tokens (E,)
_recomputing = False  # set while activation checkpointing runs a block again: its statistics were counted once


@contextlib.contextmanager
def recomputing():
    """The context activation checkpointing gives its recompute pass (gptlab.model.gpt), so nothing counts twice."""
    global _recomputing
    previous, _recomputing = _recomputing, True
    try:
        yield
    finally:
        _recomputing = previous


class Routing:
    """Where each token goes: the top_k experts of each token and their weights, sorted by expert.

    token (A,), weight (A,): for each kept assignment in expert order, the token it reads and its weight;
    counts (E,): assignments per expert after the capacity cut; dropped: assignments cut; probs (N, E) and
    logits (N, E): the scores, for the balance losses. A = N * top_k - dropped."""

    def __init__(self, token, weight, counts, dropped, probs, logits, chosen_counts):
        self.token, self.weight, self.counts, self.dropped = token, weight, counts, dropped
        self.probs, self.logits, self.chosen_counts = probs, logits, chosen_counts


class MoE(nn.Module):
    """The sparse feed-forward layer: router, routed experts, optional shared experts."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        moe, hidden = config.moe, config.expert_hidden
        self.config, self.moe = config, moe
        self.gated = config.gated
        self.activation = config.activation_kind
        self.router = nn.Linear(config.n_embd, moe.n_experts, bias=False)
        rows = 2 * hidden if self.gated else hidden
        self.experts_fc = nn.Parameter(torch.empty(moe.n_experts, rows, config.n_embd))
        self.experts_proj = nn.Parameter(torch.empty(moe.n_experts, config.n_embd, hidden))
        self.experts_proj.residual = True
        self.shared = None
        if moe.n_shared:
            self.shared = MLP(replace(config, mlp_hidden=moe.n_shared * hidden, bias=False))
        self.register_buffer("route_bias", torch.zeros(moe.n_experts))  # DeepSeek-V3's balancing bias (saved)
        self.register_buffer("step_load", torch.zeros(moe.n_experts), persistent=False)  # since the last bias update
        self.aux_loss: torch.Tensor | None = None  # the weighted balance losses of the last training forward
        self._stats: torch.Tensor | None = None  # summed statistics since pop_stats (_record)

    # ------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        with record_function("moe.router"):  # ranges `gptlab profile` reports the router's share of the step by
            routing = self.route(flat)
        with record_function("moe.dispatch"):
            xs = flat[routing.token]
        with record_function("moe.experts"):
            routed = self.expert_forward(xs, routing.counts)
        with record_function("moe.dispatch"):
            y = torch.zeros_like(flat).index_add_(0, routing.token, (routed * routing.weight[:, None]).to(flat.dtype))
        if self.shared is not None:
            y = y + self.shared(flat)
        if self.training:
            self._record(routing, flat.shape[0])
        return y.view(shape)

    def route(self, flat: torch.Tensor) -> Routing:
        """Scores, the top_k choice per token (the bias moves the choice only), weights, the capacity cut."""
        moe, n_tokens = self.moe, flat.shape[0]
        logits = self.router(flat).float()  # (N, E), in float32 as every MoE family computes it
        probs = logits.softmax(-1) if moe.score == "softmax" else logits.sigmoid()
        chosen = (probs + self.route_bias).topk(moe.top_k, dim=-1).indices  # (N, k)
        weight = probs.gather(-1, chosen)
        if moe.normalize:
            weight = weight / weight.sum(-1, keepdim=True)
        expert = chosen.reshape(-1)  # assignment a = token * k + slot
        order = torch.sort(expert, stable=True).indices  # by expert, tokens in order within each
        chosen_counts = torch.bincount(expert, minlength=moe.n_experts)
        keep = self._capacity_keep(chosen_counts, expert[order], n_tokens)
        order = order if keep is None else order[keep]
        counts = chosen_counts if keep is None else torch.bincount(expert[order], minlength=moe.n_experts)
        dropped = expert.numel() - order.numel()
        return Routing(order // moe.top_k, weight.reshape(-1)[order], counts, dropped, probs, logits, chosen_counts)

    def _capacity_keep(self, counts: torch.Tensor, sorted_expert: torch.Tensor, n_tokens: int) -> torch.Tensor | None:
        """Which sorted assignments fit their expert's capacity (the first ones in token order); None: all.
        Training only: in eval a token's output must not depend on the other rows of its batch or on how
        generation splits prefill and decode (a cut would make cached decoding differ from a full forward)."""
        if not self.moe.capacity_factor or not self.training:
            return None
        capacity = math.ceil(self.moe.capacity_factor * n_tokens * self.moe.top_k / self.moe.n_experts)
        starts = torch.cumsum(counts, 0) - counts  # where each expert's run begins in the sorted list
        rank = torch.arange(sorted_expert.numel(), device=counts.device) - starts[sorted_expert]
        return rank < capacity

    def expert_forward(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """xs (A, C): the assignments' inputs sorted by expert, counts (E,) per expert -> each expert's MLP (A, C)."""
        if self.moe.impl == "loop":
            return self.loop_experts(xs, counts)
        return self.grouped_experts(xs, counts)

    def loop_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The reference: expert e's MLP on its own tokens, one expert at a time."""
        outputs = []
        for e, chunk in enumerate(xs.split(counts.tolist())):
            outputs.append(self._act(chunk @ self.experts_fc[e].t()) @ self.experts_proj[e].t())
        return torch.cat(outputs) if outputs else xs

    def grouped_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """All experts at once: each projection is one grouped matmul over the expert-sorted rows."""
        offsets = torch.cumsum(counts, 0).to(torch.int32)
        kind = xs.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else xs.dtype  # as a matmul would
        fc, proj = self.experts_fc.to(dtype).transpose(1, 2), self.experts_proj.to(dtype).transpose(1, 2)
        hidden = self._act(grouped_matmul(xs.to(dtype), fc, offsets))
        return grouped_matmul(hidden, proj, offsets)

    def _act(self, h: torch.Tensor) -> torch.Tensor:
        """The dense MLP's activation (gptlab.model.mlp.MLP): SwiGLU on [gate | up], GELU (tanh) or relu^2."""
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        if self.activation == "relu2":
            return F.relu(h).square()
        return F.gelu(h, approximate="tanh")

    # ------------------------------------------------------------ balancing and statistics

    def balance_losses(self, routing: Routing, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(Switch load-balance loss, router z-loss), unweighted. f_i counts assignments before the capacity cut."""
        share = routing.chosen_counts.float() / (n_tokens * self.moe.top_k)  # f_i: no gradient (a count)
        probs = routing.probs if self.moe.score == "softmax" else routing.probs / routing.probs.sum(-1, keepdim=True)
        balance = self.moe.n_experts * (share * probs.mean(0)).sum()
        z = torch.logsumexp(routing.logits, dim=-1).square().mean()
        return balance, z

    def _record(self, routing: Routing, n_tokens: int) -> None:
        """The weighted losses for this forward (aux_loss); counts for the bias update and the metrics, summed
        as one vector (tokens (E,), then STAT_NAMES): one small tensor per forward rather than six."""
        balance, z = self.balance_losses(routing, n_tokens)
        self.aux_loss = self.moe.aux_loss * balance + self.moe.z_loss * z
        if _recomputing:
            return
        with torch.no_grad():
            self.step_load += routing.chosen_counts
            counts = balance.new_tensor([routing.dropped, n_tokens * self.moe.top_k, 1.0])  # dropped, assignments, forwards
            row = torch.cat([routing.counts.float(), counts[:2], balance[None], z[None], counts[2:]])
            self._stats = row if self._stats is None else self._stats + row

    def pop_stats(self) -> dict[str, torch.Tensor]:
        """The statistics summed since the last call: tokens (E,) and STAT_NAMES; {} without a training forward."""
        stats, self._stats = self._stats, None
        if stats is None:
            return {}
        E = self.moe.n_experts
        return {"tokens": stats[:E], **{name: stats[E + i] for i, name in enumerate(STAT_NAMES)}}

    @torch.no_grad()
    def update_routing_bias(self, load: torch.Tensor | None = None) -> None:
        """DeepSeek-V3: bias_i += rate * sign(mean load - load_i), from the assignments since the last update
        (`load`: the same summed over data-parallel ranks, so every rank moves its bias alike)."""
        load = self.step_load if load is None else load
        if self.moe.bias_update and load.sum() > 0:
            self.route_bias += self.moe.bias_update * torch.sign(load.mean() - load)
        self.step_load.zero_()


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x (A, in) sorted by group, w (G, in, out), offsets (G,) int32 cumulative row ends -> (A, out): rows of group g
    times w[g]. F.grouped_mm where its strides allow (rows of a multiple of 16 bytes), else a padded batched matmul."""
    if _grouped_mm_fits(x, w):
        return F.grouped_mm(x, w, offs=offsets)
    counts = torch.diff(offsets, prepend=offsets.new_zeros(1)).long()
    width = int(counts.max()) if counts.numel() else 0
    starts = offsets.long() - counts
    group = torch.repeat_interleave(torch.arange(w.shape[0], device=x.device), counts)
    slot = torch.arange(x.shape[0], device=x.device) - starts[group]
    padded = x.new_zeros(w.shape[0], width, x.shape[1])
    padded[group, slot] = x
    return torch.bmm(padded, w)[group, slot]


def _grouped_mm_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Eager F.grouped_mm takes float32 and bfloat16; torch.compile's shape function (torch 2.10-2.13) only
    bfloat16, so a compiled float32 model takes the padded matmul (tests/model/test_moe.py compiles one)."""
    aligned = 16 // x.element_size()
    dtypes = (torch.bfloat16,) if torch.compiler.is_compiling() else (torch.float32, torch.bfloat16)
    return (hasattr(F, "grouped_mm") and x.dtype == w.dtype and x.dtype in dtypes
            and x.shape[1] % aligned == 0 and w.shape[2] % aligned == 0 and x.shape[0] > 0)
