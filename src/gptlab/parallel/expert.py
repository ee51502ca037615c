"""Expert parallelism: each rank holds n_experts / world of every sparse layer's experts; tokens travel to them.

The layer (gptlab.model.moe.MoE) stays single-device code. `shard_experts` applies parallelism from outside
(as torchtitan does): it keeps this rank's slice of `experts_fc` / `experts_proj` and replaces the layer's
`expert_forward(xs, counts)` hook with a dispatch over torch.distributed:

    counts (E,) per expert, all_to_all   -> how many rows every rank will send me, per local expert
    xs (A, C) sorted by expert, all_to_all (dispatch)  -> the rows for my experts, grouped by source rank
    regroup by local expert, run my experts (the layer's own loop / grouped code on its shard)
    all_to_all back (combine)            -> every row returns to its token's rank, in the order it left

Both all_to_alls carry gradients (`AllToAll`: backward is the reverse exchange). A rank's experts see the
tokens of every rank, so their gradient is the sum over ranks of d loss_r / dW; data parallel wants the mean
over ranks (each rank's loss is its own batch's mean), hence each expert gradient is divided by world.
Non-expert parameters are replicated and averaged by torch DDP, told to ignore the expert shards.

The cost of a step (`expert_parallel_costs`): bytes each rank sends through all_to_all vs its share of
DDP's gradient all-reduce, and memory per rank. Not here: the layer (gptlab.model.moe), choosing it
(gptlab.parallel.wrap).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from gptlab.runtime import GptlabError

EXPERT_WEIGHTS = ("experts_fc", "experts_proj")  # the (n_experts, out, in) parameters sharded by expert


def moe_layers(model: nn.Module) -> list[nn.Module]:
    """The sparse layers, found by their expert weights (parallel does not import gptlab.model)."""
    return [module for _, module in named_moe_layers(model)]


def named_moe_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, layer) of each sparse layer, for the parameter names DDP ignores and a checkpoint holds."""
    return [(name, module) for name, module in model.named_modules() if all(hasattr(module, w) for w in EXPERT_WEIGHTS)]


class AllToAll(torch.autograd.Function):
    """dist.all_to_all_single with a gradient: rows split `send` per rank go out, `receive` per rank come in;
    backward sends the gradients back the same way reversed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], receive: list[int], group=None) -> torch.Tensor:
        ctx.send, ctx.receive, ctx.group = send, receive, group
        out = x.new_empty((sum(receive), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.receive,
                               group=ctx.group)
        return back, None, None, None


def shard_experts(model: nn.Module, group=None) -> list[str]:
    """Keep this rank's experts of every sparse layer and route tokens to the others' over all_to_all.
    Every rank must start from the same full weights (the same seed). Returns the sharded parameters' names
    (for DDP to ignore)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    names = []
    for prefix, layer in named_moe_layers(model):
        n_experts = layer.experts_fc.shape[0]
        if n_experts % world:
            raise GptlabError(f"expert parallelism needs n_experts ({n_experts}) divisible by the world size ({world}); "
                              "change --model.moe.n-experts or the number of processes")
        local = n_experts // world
        for name in EXPERT_WEIGHTS:
            full = getattr(layer, name)
            shard = nn.Parameter(full.detach()[rank * local:(rank + 1) * local].clone())
            shard.__dict__.update({k: v for k, v in full.__dict__.items()})  # keep markers such as `residual`
            shard.register_hook(lambda grad, world=world: grad / world)  # summed over ranks' tokens -> their mean
            setattr(layer, name, shard)
            names.append(f"{prefix}.{name}" if prefix else name)
        layer.expert_world, layer.expert_group = world, group
        layer.expert_forward = types.MethodType(dispatch_expert_forward, layer)
    return names


def dispatch_expert_forward(layer: nn.Module, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The layer's expert_forward under expert parallelism: xs (A, C) sorted by global expert, counts (E,) ->
    (A, C), each row computed by the rank that owns its expert."""
    world, group = layer.expert_world, layer.expert_group
    local = counts.numel() // world
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)  # (world * local,): [source rank, local expert]
    send = counts.view(world, local).sum(1).tolist()
    receive_grid = received.view(world, local)
    receive = receive_grid.sum(1).tolist()
    arrived = AllToAll.apply(xs, send, receive, group)  # grouped by source rank, then by expert
    expert_of_row = torch.arange(local, device=xs.device).repeat(world).repeat_interleave(received)
    order = torch.sort(expert_of_row, stable=True).indices  # grouped by local expert, then by source rank
    computed = layer.__class__.expert_forward(layer, arrived[order], receive_grid.sum(0))
    back = torch.empty_like(computed).index_copy(0, order, computed)  # undo the regrouping
    return AllToAll.apply(back, receive, send, group)


def gather_expert_weights(model: nn.Module, group=None) -> dict[str, torch.Tensor]:
    """The full model's state dict on every rank: each sparse layer's expert shards all-gathered in rank order
    (for a checkpoint or an export). A collective: every rank calls it."""
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    world = dist.get_world_size(group)
    for prefix, layer in named_moe_layers(model):
        for name in EXPERT_WEIGHTS:
            shard = getattr(layer, name).detach().contiguous()
            pieces = [torch.empty_like(shard) for _ in range(world)]
            dist.all_gather(pieces, shard, group=group)
            state[f"{prefix}.{name}" if prefix else name] = torch.cat(pieces)
    return state


def gather_expert_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, group=None) -> dict:
    """optimizer.state_dict() with each expert shard's per-parameter tensors (AdamW's moments) all-gathered whole, as
    one process would hold them: a checkpoint written under expert parallelism resumes without it. A collective."""
    state = optimizer.state_dict()
    shards = {id(getattr(layer, name)) for layer in moe_layers(model) for name in EXPERT_WEIGHTS}
    parameters = [p for group_ in optimizer.param_groups for p in group_["params"]]
    world = dist.get_world_size(group)
    for index, parameter in enumerate(parameters):  # state_dict numbers parameters in param-group order
        if id(parameter) not in shards:
            continue
        entry = state["state"][index] = dict(state["state"].get(index, {}))  # state_dict() hands out the live dicts
        for key, value in sorted(entry.items()):
            if torch.is_tensor(value) and value.shape == parameter.shape:
                pieces = [torch.empty_like(value) for _ in range(world)]
                dist.all_gather(pieces, value.contiguous(), group=group)
                entry[key] = torch.cat(pieces)
    return state


def load_whole_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                     optimizer_state: dict, group=None) -> None:
    """The inverse of the two gathers above, to resume: from a whole model's state dict and optimizer state (a
    checkpoint, written with or without expert parallelism), keep this rank's slice of every expert tensor."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    weights = dict(weights)
    for prefix, layer in named_moe_layers(model):
        local = layer.experts_fc.shape[0]
        for name in EXPERT_WEIGHTS:
            key = f"{prefix}.{name}" if prefix else name
            weights[key] = weights[key][rank * local:(rank + 1) * local]
    model.load_state_dict(weights)
    shards = {id(getattr(layer, name)) for layer in moe_layers(model) for name in EXPERT_WEIGHTS}
    parameters = [p for group_ in optimizer.param_groups for p in group_["params"]]
    state = {**optimizer_state, "state": {index: dict(entry) for index, entry in optimizer_state["state"].items()}}
    for index, parameter in enumerate(parameters):  # numbered in param-group order, as the gather saved them
        entry = state["state"].get(index, {})
        local = parameter.shape[0]
        for key, value in entry.items():
            if torch.is_tensor(value) and value.shape == (local * world, *parameter.shape[1:]) and id(parameter) in shards:
                entry[key] = value[rank * local:(rank + 1) * local]
    optimizer.load_state_dict(state)


def is_expert_parallel(model: nn.Module) -> bool:
    return any(hasattr(layer, "expert_world") for layer in moe_layers(model))


def experts_elsewhere(model: nn.Module) -> int:
    """Expert parameters the other ranks hold (0 without expert parallelism): with the rank's own, the whole model."""
    return sum(getattr(layer, name).numel() * (getattr(layer, "expert_world", 1) - 1)
               for layer in moe_layers(model) for name in EXPERT_WEIGHTS)


@torch.no_grad()
def clip_gradients(model: nn.Module, max_norm: float, group=None) -> float:
    """clip_grad_norm_ over the whole model when each rank holds other experts: the replicated gradients' squared
    norm is the same everywhere (DDP averaged them), the shards' is summed over ranks; every rank then scales
    by the same factor (as torch's: max_norm / (norm + 1e-6), at most 1) and returns the global norm."""
    shards = {id(getattr(layer, name)) for layer in moe_layers(model) for name in EXPERT_WEIGHTS}
    grads = [(id(p) in shards, p.grad) for p in model.parameters() if p.grad is not None]
    squares = torch.zeros(2, dtype=torch.float64, device=grads[0][1].device if grads else None)
    for sharded, grad in grads:
        squares[int(sharded)] += grad.double().square().sum()
    dist.all_reduce(squares[1:], group=group)
    norm = float(squares.sum().sqrt())
    scale = min(1.0, max_norm / (norm + 1e-6))
    if scale < 1.0:
        for _, grad in grads:
            grad.mul_(scale)
    return norm


@dataclass(frozen=True)
class ExpertParallelCosts:
    """Per rank and optimizer step (bytes): what expert parallelism moves and holds, against plain DDP."""

    sparse_layers: int  # layers whose experts are sharded
    all_to_all_bytes: int  # sent by one rank: dispatch + combine, forward and backward, every sparse layer
    ddp_all_reduce_bytes: int  # sent by one rank in the ring all-reduce of the replicated (non-expert) gradients
    ddp_all_reduce_bytes_without_ep: int  # the same if every parameter (experts too) were replicated
    expert_parameters: int  # all ranks together
    replicated_parameters: int
    parameters_per_rank: int  # experts / world + replicated
    memory_per_rank: int  # parameters_per_rank * bytes_per_parameter (weights, gradients, AdamW moments)
    memory_without_ep: int  # every parameter on every rank


def expert_parallel_costs(model: nn.Module, world: int, tokens: int, *, activation_bytes: int = 2, gradient_bytes: int = 4,
                          bytes_per_parameter: int = 16) -> ExpertParallelCosts:
    """Costs of one step of `tokens` (all ranks together) for `model` (a meta-device model will do) on `world` ranks.

    all_to_all per sparse layer and rank: 4 exchanges (dispatch, combine; forward, backward) of the rank's
    tokens / world * top_k rows of d_model values, of which (world - 1) / world leave the rank (even routing).
    Ring all-reduce: each rank sends 2 * (world - 1) / world of the gradient bytes. Memory: fp32 weights (4),
    fp32 gradients (4) and AdamW's two moments (8) = 16 bytes per parameter."""
    layers = moe_layers(model)
    if not layers or layers[0].experts_fc.shape[0] % world:
        raise GptlabError(f"expert_parallel_costs needs a mixture-of-experts model with n_experts divisible by {world}")
    experts = sum(getattr(layer, name).numel() for layer in layers for name in EXPERT_WEIGHTS)
    total = sum(p.numel() for p in model.parameters())
    replicated = total - experts
    d_model, top_k = layers[0].experts_fc.shape[-1], layers[0].moe.top_k
    rows = tokens // world * top_k
    all_to_all = 4 * rows * d_model * activation_bytes * (world - 1) // world * len(layers)
    per_rank = experts // world + replicated
    return ExpertParallelCosts(
        sparse_layers=len(layers), all_to_all_bytes=all_to_all,
        ddp_all_reduce_bytes=2 * (world - 1) * replicated * gradient_bytes // world,
        ddp_all_reduce_bytes_without_ep=2 * (world - 1) * total * gradient_bytes // world,
        expert_parameters=experts, replicated_parameters=replicated, parameters_per_rank=per_rank,
        memory_per_rank=per_rank * bytes_per_parameter, memory_without_ep=total * bytes_per_parameter)
