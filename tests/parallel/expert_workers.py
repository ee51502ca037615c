"""What each of 2 spawned gloo processes runs for expert parallelism; results saved for tests/parallel/test_expert_parallel.py.

Two cases on one process group: the dispatch alone (a sparse layer on random tokens) and a few AdamW steps of a
tiny MoE model wrapped as the Trainer wraps it (parallelize with expert_parallel: shards, DDP ignoring them).
"""

from __future__ import annotations

import torch

from gptlab.model.config import MoEConfig, preset
from gptlab.model.gpt import GPT
from gptlab.model.moe import MoE
from gptlab.parallel.expert import gather_expert_weights, shard_experts
from gptlab.parallel.wrap import OptimizerRecipe, ParallelConfig, clip_gradients, full_optimizer_state, parallelize
from tests.parallel.common import run_on_gloo

ROWS, T, STEPS, LR = 2, 8, 3, 1e-2  # rows per rank
CLIP = 0.5  # below the tiny model's gradient norm (~1-3): clipping acts every step


def tiny_config():
    """moe-tiny, dropless, aux and z losses on, in fp32; 4 experts: 2 per rank."""
    return preset("moe-tiny", moe=MoEConfig(n_experts=4, top_k=2, expert_hidden=64, aux_loss=0.01, z_loss=0.001))


def make_layer() -> MoE:
    torch.manual_seed(0)
    layer = MoE(tiny_config())
    for parameter in layer.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    return layer


def layer_inputs(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, upstream gradient), both (world * ROWS, T, C); rank r takes rows [r * ROWS, ...)."""
    generator = torch.Generator().manual_seed(1)
    width = tiny_config().n_embd
    return torch.randn(world * ROWS, T, width, generator=generator), torch.randn(world * ROWS, T, width, generator=generator)


def make_model() -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_config())


def token_batches(world: int) -> torch.Tensor:
    """(STEPS, world * ROWS, T + 1) token ids."""
    generator = torch.Generator().manual_seed(2)
    return torch.randint(0, tiny_config().vocab_size, (STEPS, world * ROWS, T + 1), generator=generator)


def _dispatch(rank: int, world: int, results: dict) -> None:
    layer = make_layer()
    shard_experts(layer)
    x, upstream = (t[rank * ROWS:(rank + 1) * ROWS] for t in layer_inputs(world))
    x.requires_grad_(True)
    y = layer(x)
    (y * upstream).sum().backward()
    results["dispatch"] = {"y": y.detach(), "x grad": x.grad, "fc grad": layer.experts_fc.grad,
                           "proj grad": layer.experts_proj.grad, "router grad": layer.router.weight.grad}


def _training(rank: int, world: int, results: dict) -> None:
    model = make_model()

    def recipe() -> OptimizerRecipe:
        return OptimizerRecipe(torch.optim.AdamW, [{"params": list(model.parameters())}], {"lr": LR})

    wrapped, optimizer = parallelize(model, recipe, ParallelConfig(expert_parallel=True), distributed=True)
    results["ddp ignores"] = sorted(getattr(model, "_ddp_params_and_buffers_to_ignore", []))
    for rows in token_batches(world)[:, rank * ROWS:(rank + 1) * ROWS]:
        _, loss = wrapped(rows[:, :-1], rows[:, 1:])
        loss.backward()
        results.setdefault("norms", []).append(clip_gradients(model, CLIP))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    results["shard"] = model.transformer["h"][0].mlp.experts_fc.detach().clone()
    results["trained"] = gather_expert_weights(model)
    results["optimizer"] = full_optimizer_state(optimizer, model)


def _cases(rank: int, world: int, results: dict) -> None:
    _dispatch(rank, world, results)
    _training(rank, world, results)


def run_cases(rank: int, world: int, init_file: str, out: str) -> None:
    """Entry point for torch.multiprocessing.spawn; writes OUT/rank{rank}.pt."""
    run_on_gloo(_cases, rank, world, init_file, out)
