"""FSDP2 (`torch.distributed.fsdp.fully_shard`): each rank keeps 1/world of every parameter, gradient and
optimizer state; a block's parameters are all-gathered just before its forward (and backward) and freed after.

Sharding each transformer block on its own, then the root (embeddings, head, final norm), is what lets one
block's all-gather overlap the previous block's compute, and caps the unsharded memory at about one block.
Gradients are reduce-scattered: each rank receives the mean gradient of its own shard only.

Mixed precision (bf16 or fp16 training): FSDP2's MixedPrecisionPolicy gathers each block's weights in that
dtype (half the traffic and the unsharded memory of fp32) and reduces the gradients in fp32, into the fp32
shards the optimizer steps, so the mean over ranks is not summed in 16 bits (micro-steps without sync
accumulate in fp32 too). The embedding's weights are 16-bit then, so its output and the residual stream are
(as in torchtitan); the Trainer's autocast still keeps norms, softmax and the loss in fp32. The blocks'
inputs are not cast (cast_forward_inputs=False): the rotary tables passed to each block stay fp32.

Checkpoints: `full_model_state` / `full_optimizer_state` gather everything on rank 0 (torch.distributed.checkpoint's
full_state_dict options, every rank must call them). The weights are then the plain model's, loadable anywhere;
the optimizer state is renumbered from parameter names (torch's format for FSDP) to positions, the unsharded
optimizer's format, so a checkpoint of an FSDP run resumes without FSDP too.
Not here: the hand-written data parallel variants (gptlab.parallel.data_parallel).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def shard_model(model: nn.Module, blocks: Iterable[nn.Module], *, param_dtype: torch.dtype | None = None) -> nn.Module:
    """fully_shard each block, then the root (which then holds only what no block holds); in place.
    `param_dtype` (bf16, fp16): gather the weights in it and reduce the gradients in fp32 (the module docstring)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if param_dtype is not None and param_dtype != torch.float32:
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on rank 0 ({} elsewhere); a collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The unsharded optimizer state on rank 0 in the unsharded optimizer's format ({} elsewhere); a collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options())
    if not by_name:
        return {}
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    position = {name: i for i, name in enumerate(order)}
    groups = [{**saved, "params": [position[names[id(p)]] for p in group["params"]]}
              for saved, group in zip(by_name["param_groups"], optimizer.param_groups)]
    return {"state": {position[name]: value for name, value in by_name["state"].items()}, "param_groups": groups}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                    optimizer_state: dict) -> None:
    """Shard whole weights and a whole optimizer state (the unsharded optimizer's format) into this rank's part.

    Every rank passes the whole state (read from the same checkpoint); each keeps its own shards.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = [{**saved, "params": [order[i] for i in saved["params"]]} for saved in optimizer_state["param_groups"]]
    state = {order[i]: value for i, value in optimizer_state["state"].items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=options)
