"""What each of 2 spawned gloo processes runs: every variant on the tiny model, results saved for the tests to check.

One process group serves every case (starting processes costs more than the cases themselves).
"""

from __future__ import annotations

import torch

from gptlab.parallel.data_parallel import DataParallel
from gptlab.parallel.fsdp import full_model_state, shard_model
from gptlab.parallel.wrap import OptimizerRecipe, ParallelConfig, no_sync, parallelize
from gptlab.parallel.zero import ShardedOptimizer
from tests.parallel.common import LR, autocast_to, batches, make_model, rank_rows, run_on_gloo, train

BUCKET_MB = 300 / 2**20  # 300 bytes: the tiny model's gradients fill 4 buckets
HAND = ("allreduce", "overlap", "bucketed")


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _data_parallel(rank: int, world: int, accum: int, variant: str, results: dict) -> None:
    model = make_model()
    wrapped = DataParallel(model, variant=variant, bucket_mb=BUCKET_MB)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    train(wrapped, optimizer, rank_rows(batches(world, accum), rank), no_sync=wrapped.no_sync,
          finish=wrapped.finish_gradient_synchronization)
    results[(variant, accum)] = _weights(model)
    if variant == "bucketed":
        names = {id(p): name for name, p in model.named_parameters()}
        results["buckets"] = [[names[id(p)] for p in bucket.parameters] for bucket in wrapped.buckets]
    results[("unused grad", variant, accum)] = model.blocks[1].unused.grad


def _torch_ddp(rank: int, world: int, accum: int, results: dict) -> None:
    from torch.nn.parallel import DistributedDataParallel

    model = make_model()
    wrapped = DistributedDataParallel(model, find_unused_parameters=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    train(wrapped, optimizer, rank_rows(batches(world, accum), rank), no_sync=wrapped.no_sync)
    results[("torch", accum)] = _weights(model)
    results[("torch state", accum)] = optimizer.state_dict()


def _sharded(rank: int, world: int, kind: str, results: dict) -> None:
    """ZeRO-1 by hand or torch's ZeroRedundancyOptimizer, around AdamW, gradients averaged by hand."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = make_model()
    wrapped = DataParallel(model, variant="allreduce")
    if kind == "zero1":
        optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=LR)
    else:
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LR)
    train(wrapped, optimizer, rank_rows(batches(world, 2), rank), no_sync=wrapped.no_sync,
          finish=wrapped.finish_gradient_synchronization)
    results[(kind, 2)] = _weights(model)
    if kind == "zero1":
        names = {id(p): name for name, p in model.named_parameters()}
        results["owned"] = sorted(names[id(p)] for p in optimizer.owned())
        results["state held"] = sorted(names[id(p)] for p in optimizer.inner.state)
        results["zero1 state"] = gathered = optimizer.state_dict()  # a collective: every rank calls it
        fresh = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=LR)
        fresh.load_state_dict(gathered)  # a resume: each rank keeps its own share of the whole state
        results["zero1 reloaded"] = [(names[id(p)], key, torch.equal(value, fresh.inner.state[p][key]))
                                     for p, state in optimizer.inner.state.items() for key, value in state.items()]


def _fsdp(rank: int, world: int, results: dict) -> None:
    model = make_model()
    shard_model(model, model.blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    train(model, optimizer, rank_rows(batches(world, 2), rank), no_sync=lambda: no_sync(model))
    results[("fsdp", 2)] = full_model_state(model)  # whole tensors on rank 0


def _fsdp_mixed(rank: int, world: int, precision: str, results: dict) -> None:
    """--parallel.fsdp with bf16 or fp16, as the Trainer builds it (parallelize), under the step's autocast: what dtype
    the gathered weights, the reduced gradients and the shards the optimizer steps have, and the weights trained.
    fp16 runs on the CPU too (no GradScaler needed: the tiny model's gradients stay far from fp16's underflow)."""
    model = make_model()
    seen = results[f"fsdp {precision} dtypes"] = {}

    def recipe() -> OptimizerRecipe:
        return OptimizerRecipe(torch.optim.AdamW, [{"params": list(model.parameters())}], {"lr": LR})

    def before_forward(module, args) -> None:
        seen.setdefault("gathered", module.weight.dtype)

    def finish() -> None:
        seen.setdefault("gradients", {p.grad.dtype for p in model.parameters() if p.grad is not None})

    wrapped, optimizer = parallelize(model, recipe, ParallelConfig(fsdp=True), distributed=True, blocks=model.blocks,
                                     precision=precision)
    model.blocks[0][0].register_forward_pre_hook(before_forward)
    train(wrapped, optimizer, rank_rows(batches(world, 2), rank), no_sync=lambda: no_sync(model), finish=finish,
          cast=autocast_to(precision))
    seen["shards"] = {p.dtype for p in model.parameters()}
    results[(f"fsdp {precision}", 2)] = full_model_state(model)


def _cases(rank: int, world: int, results: dict) -> None:
    for accum in (1, 2):
        _torch_ddp(rank, world, accum, results)
        for variant in HAND:
            _data_parallel(rank, world, accum, variant, results)
    for kind in ("zero1", "zero torch"):
        _sharded(rank, world, kind, results)
    _fsdp(rank, world, results)
    for precision in ("bf16", "fp16"):
        _fsdp_mixed(rank, world, precision, results)


def run_cases(rank: int, world: int, init_file: str, out: str) -> None:
    """Entry point for torch.multiprocessing.spawn; writes OUT/rank{rank}.pt."""
    run_on_gloo(_cases, rank, world, init_file, out)
