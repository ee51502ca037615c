"""A tiny model and fixed data for the parallel tests, and the single-process reference they are checked against.

The model has what data parallel must get right: a tied weight (the head reuses the embedding), a parameter
that never gets a gradient, and blocks for FSDP to shard one by one.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, T = 16, 8, 6
ROWS_PER_RANK, STEPS, LR = 2, 3, 1e-2


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(2))
        # never in the graph (Sequential runs its modules only): its grad stays None; it shares a bucket with used ones
        self.blocks[1].register_parameter("unused", nn.Parameter(torch.zeros(4)))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, used twice

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)  # (B, T, WIDTH)
        for block in self.blocks:
            h = h + block(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def make_model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def batches(world: int, accum: int) -> torch.Tensor:
    """(STEPS, accum, world * ROWS_PER_RANK, T + 1) token ids; rank r trains on rows [r * ROWS_PER_RANK, ...)."""
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (STEPS, accum, world * ROWS_PER_RANK, T + 1), generator=generator)


def rank_rows(data: torch.Tensor, rank: int) -> torch.Tensor:
    return data[..., rank * ROWS_PER_RANK:(rank + 1) * ROWS_PER_RANK, :]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, *, no_sync=None, finish=None,
          cast=None) -> None:
    """STEPS optimizer steps of data's micro-batches; `no_sync()` around all but the last, `finish()` before the step;
    `cast()` (autocast) around each forward and backward."""
    for step in data:
        for micro, rows in enumerate(step):
            last = micro == len(step) - 1
            context = no_sync() if no_sync is not None and not last else nullcontext()
            with context, (cast() if cast is not None else nullcontext()):
                loss = model(rows[:, :-1], rows[:, 1:]) / len(step)
                loss.backward()
        if finish is not None:
            finish()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_to(precision: str):
    """A factory of CPU autocast contexts at bf16 or fp16 (train's `cast`)."""
    return lambda: torch.autocast("cpu", dtype=DTYPES[precision])


def single_process_weights(world: int, accum: int, optimizer_class=torch.optim.AdamW, cast=None) -> dict[str, torch.Tensor]:
    """The reference: one process trains on every rank's rows at once (under `cast()`, e.g. bf16_autocast)."""
    model = make_model()
    train(model, optimizer_class(model.parameters(), lr=LR), batches(world, accum), cast=cast)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def run_on_gloo(cases: Callable[[int, int, dict], None], rank: int, world: int, init_file: str, out: str) -> None:
    """A spawned rank: join the gloo group, run `cases(rank, world, results)`, write OUT/rank{rank}.pt (even on failure)."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results: dict = {}
    try:
        cases(rank, world, results)
    finally:
        torch.save(results, Path(out) / f"rank{rank}.pt")
        dist.destroy_process_group()


def spawn_ranks(run_cases: Callable, folder: Path, world: int) -> list[dict]:
    """Every rank's results dict, from `run_cases(rank, world, init_file, out)` spawned on `world` processes."""
    mp.spawn(run_cases, args=(world, str(folder / "init"), str(folder)), nprocs=world, join=True)
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
