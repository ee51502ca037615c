"""Choosing how a model trains on several processes: the `ParallelConfig` and the one entry that applies it.

    data_parallel   torch      torch's DistributedDataParallel (the default)
                    allreduce  | overlap | bucketed: gptlab.parallel.data_parallel, by hand
    shard_optimizer none       every rank keeps the whole optimizer state
                    zero1      gptlab.parallel.zero.ShardedOptimizer, by hand
                    torch      torch.distributed.optim.ZeroRedundancyOptimizer
    fsdp            FSDP2 (`fully_shard`, gptlab.parallel.fsdp): parameters, gradients and optimizer state sharded
    expert_parallel each rank holds n_experts / world experts per sparse layer (gptlab.parallel.expert), under torch DDP

`parallelize` takes the plain model and a recipe for its optimizer (a function returning the optimizer class, its
parameter groups and options: FSDP must shard the model before the optimizer sees its parameters) and returns
the module to run the step through and the optimizer. The step then uses `no_sync` on every micro-step but the
last, and `finish_gradient_synchronization` before clipping and stepping; both are no-ops where torch does the work.
Checkpoints go through `full_optimizer_state`: sharded states are gathered, in the unsharded optimizer's format.
A single process ignores all of this. Not here: the training loop (gptlab.train.trainer).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from gptlab.parallel.data_parallel import VARIANTS, DataParallel
from gptlab.parallel.expert import clip_gradients as clip_expert_gradients
from gptlab.parallel.expert import gather_expert_optimizer_state, is_expert_parallel, shard_experts
from gptlab.parallel.zero import ShardedOptimizer
from gptlab.runtime import GptlabError

DATA_PARALLEL = ("torch", *VARIANTS)
SHARD_OPTIMIZER = ("none", "zero1", "torch")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    data_parallel: str = "torch"  # torch (DistributedDataParallel) | allreduce | overlap | bucketed (by hand, gptlab.parallel)
    bucket_mb: float = 25.0  # bucketed: MiB of gradients per all-reduce
    shard_optimizer: str = "none"  # none | zero1 (ZeRO-1 by hand) | torch (ZeroRedundancyOptimizer)
    fsdp: bool = False  # FSDP2: fully_shard each transformer block, then the root (data_parallel torch, shard_optimizer none)
    expert_parallel: bool = False  # MoE: experts sharded over the ranks, tokens sent to them by all_to_all; the rest DDP

    def __post_init__(self) -> None:
        if self.data_parallel not in DATA_PARALLEL:
            raise GptlabError(f"unknown data_parallel {self.data_parallel!r}; use one of {', '.join(DATA_PARALLEL)}")
        if self.shard_optimizer not in SHARD_OPTIMIZER:
            raise GptlabError(f"unknown shard_optimizer {self.shard_optimizer!r}; use one of {', '.join(SHARD_OPTIMIZER)}")
        if not self.bucket_mb > 0:
            raise GptlabError(f"bucket_mb must be above 0, got {self.bucket_mb}")
        if self.fsdp and self.data_parallel != "torch":
            raise GptlabError(f"fsdp shards the model itself; it does not combine with data_parallel {self.data_parallel} "
                              "(leave --parallel.data-parallel torch)")
        if self.fsdp and self.shard_optimizer != "none":
            raise GptlabError(f"fsdp already shards the optimizer state; leave out --parallel.shard-optimizer {self.shard_optimizer}")
        if self.expert_parallel and (self.fsdp or self.data_parallel != "torch" or self.shard_optimizer != "none"):
            raise GptlabError("expert_parallel runs under torch DDP only; leave out --parallel.fsdp, --parallel.data-parallel "
                              "and --parallel.shard-optimizer")


class OptimizerRecipe(NamedTuple):
    """What builds an optimizer: `optimizer_class(groups, **options)`."""

    optimizer_class: type[torch.optim.Optimizer]
    groups: list[dict]
    options: dict


PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # FSDP's gathered weights under that autocast precision


def parallelize(model: nn.Module, recipe: Callable[[], OptimizerRecipe], config: ParallelConfig, *, distributed: bool,
                device_ids: list[int] | None = None, blocks: Iterable[nn.Module] = (),
                precision: str = "fp32") -> tuple[nn.Module, torch.optim.Optimizer]:
    """(the module for the training step, the optimizer). `blocks`: what FSDP shards one by one (transformer blocks);
    `precision` (the step's autocast, resolved): FSDP computes in bf16 or fp16 and reduces in fp32 (gptlab.parallel.fsdp)."""
    if not distributed:
        return model, build_optimizer(recipe(), "none")
    if config.fsdp:
        from gptlab.parallel.fsdp import shard_model

        shard_model(model, blocks, param_dtype=PARAM_DTYPES.get(precision))
        return model, build_optimizer(recipe(), "none")
    ignored = shard_experts(model) if config.expert_parallel else []  # before the optimizer: it steps the shards
    optimizer = build_optimizer(recipe(), config.shard_optimizer)
    if config.data_parallel == "torch":
        from torch.nn.parallel import DistributedDataParallel

        if ignored:  # each rank's own experts: not broadcast from rank 0, not averaged
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
        return DistributedDataParallel(model, device_ids=device_ids), optimizer
    return DataParallel(model, variant=config.data_parallel, bucket_mb=config.bucket_mb), optimizer


def build_optimizer(recipe: OptimizerRecipe, shard: str) -> torch.optim.Optimizer:
    """The recipe's optimizer, whole or with its state sharded over the ranks."""
    optimizer_class, groups, options = recipe
    if shard == "zero1":
        return ShardedOptimizer(groups, optimizer_class, **options)
    if shard == "torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_class, **options)
    return optimizer_class(groups, **options)


def no_sync(wrapped: nn.Module):
    """The context for a micro-step before the last: gradients accumulate locally, nothing is sent."""
    if hasattr(wrapped, "no_sync"):  # torch DDP and DataParallel
        return wrapped.no_sync()
    if hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2: gradients stay unsharded until the last micro-step
        return _fsdp_no_sync(wrapped)
    return nullcontext()


@contextmanager
def _fsdp_no_sync(module) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def finish_gradient_synchronization(wrapped: nn.Module) -> None:
    """After the step's last backward: wait for (or do) the hand variants' all-reduces. torch's wrappers need nothing."""
    if isinstance(wrapped, DataParallel):
        wrapped.finish_gradient_synchronization()


def full_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module | None = None) -> dict | None:
    """The whole optimizer state for a checkpoint, on rank 0 (None elsewhere when sharded). Every rank must call it."""
    zero = sys.modules.get("torch.distributed.optim")  # not imported unless used: its import jit-compiles optimizers
    if zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if torch.distributed.get_rank() == 0 else None
    if model is not None and is_expert_parallel(model):
        return gather_expert_optimizer_state(model, optimizer)
    if model is not None and is_fsdp(model):
        from gptlab.parallel.fsdp import full_optimizer_state as fsdp_optimizer_state

        return fsdp_optimizer_state(model, optimizer)
    return optimizer.state_dict()


def is_fsdp(model: nn.Module) -> bool:
    return hasattr(model, "set_requires_gradient_sync") and hasattr(model, "reshard")


def sharded_forward(model: nn.Module) -> bool:
    """A forward needs every rank (FSDP's gathers, expert parallelism's all_to_all): rank 0 alone would wait forever."""
    return is_fsdp(model) or is_expert_parallel(model)


def describe(config: ParallelConfig) -> str:
    """A few words for the run's announcement: "bucketed data parallel (25 MiB buckets), ZeRO-1"."""
    if config.fsdp:
        return "FSDP2"  # its mixed precision follows the run's, announced beside it
    if config.expert_parallel:
        return "expert parallel (all_to_all), torch DDP for the rest"
    words = {"torch": "torch DDP", "allreduce": "all-reduce after backward", "overlap": "all-reduce overlapped with backward",
             "bucketed": f"bucketed data parallel ({config.bucket_mb:g} MiB buckets)"}[config.data_parallel]
    shard = {"none": "", "zero1": ", ZeRO-1", "torch": ", ZeroRedundancyOptimizer"}[config.shard_optimizer]
    return words + shard


def check_config(config: ParallelConfig, *, compile: bool, moe: bool = True) -> None:
    """What the Trainer cannot combine (one line each), refused in one process as under torchrun, so a command tried
    on one machine fails there and not later on many. `moe`: the model has sparse layers, whose experts expert_parallel shards."""
    if config.expert_parallel and not moe:
        raise GptlabError("--parallel.expert-parallel shards the experts of a mixture of experts, and this model is dense "
                          "(moe.n_experts 0): set --model.moe.n-experts N, or leave out --parallel.expert-parallel")
    if config.fsdp and compile:
        raise GptlabError("fsdp with compile is not supported here (compile would have to wrap each block before "
                          "sharding); drop --compile or --parallel.fsdp")
    if config.expert_parallel and compile:
        raise GptlabError("expert_parallel with compile is not supported here (its all_to_all dispatch is not traced); "
                          "drop --compile or --parallel.expert-parallel")


def clip_gradients(model: nn.Module, max_norm: float) -> float:
    """Clip the plain model's gradients to `max_norm` in total; the norm before clipping, the same on every rank."""
    if is_expert_parallel(model):
        return clip_expert_gradients(model, max_norm)
    return gradient_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))


def gradient_norm(norm: torch.Tensor) -> float:
    """clip_grad_norm_'s result as a number (under FSDP2 it is a DTensor: its full value)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
