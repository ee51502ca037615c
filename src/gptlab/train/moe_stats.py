"""The Trainer's side of mixture-of-experts layers (gptlab.model.moe): the routing-bias step and the load metrics.

After each optimizer step, `update_routing_biases` moves every layer's DeepSeek-V3 bias from the step's load,
summed over the data-parallel ranks first so every rank's bias moves alike (and the replicas stay equal).
At each metrics line, `moe_metrics` turns the layers' statistics into figures, summed over the ranks:

    moe_aux_loss   the balance losses the model added to the step's loss (the logged `loss` is the cross-entropy)
    moe_max_load   the largest max/mean load of any layer (1: balanced; n_experts / top_k: collapsed)
    moe_layers     per sparse layer: {"layer", "tokens": fraction of the kept assignments per expert (sums to 1),
                   "max_load": max / mean of those, "dropped": fraction of assignments over capacity,
                   "balance": mean Switch balance loss, "z": mean router z-loss}

The figures are the logged step's own, as its loss is: statistics are cleared at each step's start
(`clear_statistics`), so a resumed run logs what an uninterrupted one does.
Not here: the layer and its statistics (gptlab.model.moe), drawing them (gptlab.runs.report).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gptlab.model.moe import STAT_NAMES, MoE  # STAT_NAMES: pop_stats' scalars, after its `tokens` (E,)


def sparse_layers(model: torch.nn.Module) -> tuple[list[MoE], list[int]]:
    """Every sparse layer the run trains, with its number for the metrics: a GPT's block number, found inside a
    reward model's trunk or PPO's policy and value model too. A second trunk's layers (PPO's value model) are
    numbered on after the first's, so no two layers share a number."""
    layers, numbers, offsets = [], [], {}
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            trunk, _, block = name.rpartition(".h.")
            if trunk not in offsets:
                offsets[trunk] = max(numbers, default=-1) + 1
            layers.append(module)
            numbers.append(offsets[trunk] + int(block.split(".")[0]))
    return layers, numbers


def balance_loss(layers: list[MoE]) -> torch.Tensor | None:
    """The sparse layers' weighted balance losses from their last training forward (None if none ran)."""
    losses = [layer.aux_loss for layer in layers if layer.aux_loss is not None]
    return sum(losses) if losses else None


def clear_statistics(layers: list[MoE]) -> None:
    """Forget loads and statistics counted outside this step (a pass retried after running out of memory)."""
    for layer in layers:
        layer.step_load.zero_()
        layer.pop_stats()


def _all_reduce_sum(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Summed over the ranks of `group` (all ranks by default) when torch.distributed is initialised."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def update_routing_biases(layers: list[MoE], group=None) -> None:
    """Every layer's bias update from the step's load, the loads of all layers summed over ranks in one all-reduce."""
    if not layers:
        return
    if not any(layer.moe.bias_update for layer in layers):  # nothing moves: no communication, only the reset
        for layer in layers:
            layer.update_routing_bias()
        return
    loads = _all_reduce_sum(torch.cat([layer.step_load for layer in layers]), group)
    for layer, load in zip(layers, loads.split([layer.step_load.numel() for layer in layers])):
        layer.update_routing_bias(load)


def moe_metrics(layers: list[MoE], numbers: list[int], aux_loss: float, group=None) -> dict:
    """The step's figures (module docstring), every layer's statistics summed over ranks in one all-reduce.
    `numbers`: each layer's block number, for the record (config.sparse_layers' True places)."""
    if not layers:
        return {}
    experts = [layer.moe.n_experts for layer in layers]
    flat = torch.cat([_flat_stats(layer) for layer in layers])
    sizes = [count + len(STAT_NAMES) for count in experts]
    per_layer = [_layer_figures(index, stats, count) for (index, stats), count
                 in zip(zip(numbers, _all_reduce_sum(flat, group).split(sizes)), experts)]
    return {"moe_aux_loss": aux_loss, "moe_max_load": max(figures["max_load"] for figures in per_layer),
            "moe_layers": per_layer}


def _flat_stats(layer: MoE) -> torch.Tensor:
    """pop_stats as one float64 vector: tokens (E,) then STAT_NAMES (zeros when the layer saw no training forward)."""
    stats = layer.pop_stats()
    device = layer.route_bias.device
    tokens = stats.get("tokens", torch.zeros(layer.moe.n_experts, device=device))
    scalars = [stats.get(name, torch.zeros((), device=device)).reshape(1) for name in STAT_NAMES]
    return torch.cat([tokens.reshape(-1), *scalars]).to(torch.float64)


def _layer_figures(index: int, stats: torch.Tensor, n_experts: int) -> dict:
    """Summed statistics -> the logged figures: shares of the kept assignments, and means per forward."""
    tokens, (dropped, assignments, balance, z, forwards) = stats[:n_experts], stats[n_experts:].tolist()
    kept = float(tokens.sum())
    fractions = (tokens / kept).tolist() if kept else [0.0] * n_experts
    mean = kept / n_experts
    return {"layer": index, "tokens": fractions, "max_load": float(tokens.max()) / mean if mean else 0.0,
            "dropped": dropped / assignments if assignments else 0.0,
            "balance": balance / forwards if forwards else 0.0, "z": z / forwards if forwards else 0.0}
