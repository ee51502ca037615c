"""Expert parallelism on 2 gloo processes against one process: the dispatch of one sparse layer (outputs and gradients)
and a few AdamW steps of a tiny MoE model; the refusals; the step's cost arithmetic against a hand computation.

One spawned process group runs both distributed cases (tests/parallel/expert_workers.py); the tests read what it saved.
"""

from __future__ import annotations

import pytest
import torch

from gptlab.model.config import MoEConfig, preset
from gptlab.model.gpt import GPT
from gptlab.parallel.expert import expert_parallel_costs
from gptlab.parallel.wrap import ParallelConfig, check_config
from gptlab.runtime import GptlabError
from gptlab.train import Trainer
from tests.parallel.common import spawn_ranks
from tests.parallel.expert_workers import CLIP, LR, ROWS, layer_inputs, make_layer, make_model, token_batches
from tests.train.conftest import tiny_config
from tests.train.test_trainer import assert_same_weights, final_weights, run_on_two_ranks

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    from tests.parallel.expert_workers import run_cases

    folder = tmp_path_factory.mktemp("expert")
    return spawn_ranks(run_cases, folder, WORLD)


def close(actual, expected, name="", atol=1e-6) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=atol, msg=lambda message: f"{name}: {message}")


def test_expert_dispatch_equals_one_process_layer(ranks):
    """Each rank's outputs and input gradients are the single layer's on all tokens; a rank's expert gradients are
    its slice of the single layer's (summed over every rank's loss) divided by the world (data parallel's mean)."""
    layer = make_layer()
    x, upstream = layer_inputs(WORLD)
    x.requires_grad_(True)
    y = layer(x)
    (y * upstream).sum().backward()
    local = layer.experts_fc.shape[0] // WORLD
    for rank, result in enumerate(ranks):
        rows, experts = slice(rank * ROWS, (rank + 1) * ROWS), slice(rank * local, (rank + 1) * local)
        got = result["dispatch"]
        close(got["y"], y.detach()[rows], "y")
        close(got["x grad"], x.grad[rows], "x grad")
        close(got["fc grad"], layer.experts_fc.grad[experts] / WORLD, "fc grad")
        close(got["proj grad"], layer.experts_proj.grad[experts] / WORLD, "proj grad")
    # the replicated router's gradient is each rank's own (DDP averages it in training): together, the whole
    close(ranks[0]["dispatch"]["router grad"] + ranks[1]["dispatch"]["router grad"], layer.router.weight.grad)


def test_expert_parallel_training_equals_one_process(ranks):
    """3 AdamW steps, gradients clipped, aux and z losses on, dropless: 2 ranks with 2 experts each (DDP for the rest) == one process
    taking each rank's rows as a micro-batch (loss / 2 each, as DDP's mean; the balance losses are per micro-batch).
    atol 5e-6 (lr 1e-2): AdamW turns rounding-sized gradients (another summation order) into lr-sized steps on a few
    elements; a wrong dispatch moves every weight by ~lr. AdamW ignores the gradients' scale, so the 1 / world
    scaling of expert gradients is proven by the dispatch test (and here by the clipped global norm). The saved
    optimizer state holds the experts' moments whole (a checkpoint resumes without expert parallelism)."""
    model = make_model()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    norms = []
    for step in token_batches(WORLD):
        for rank in range(WORLD):
            rows = step[rank * ROWS:(rank + 1) * ROWS]
            _, loss = model(rows[:, :-1], rows[:, 1:])
            (loss / WORLD).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    reference, moments = model.state_dict(), optimizer.state_dict()
    for result in ranks:
        assert result["trained"].keys() == reference.keys()
        for name, tensor in reference.items():
            close(result["trained"][name], tensor, name, atol=5e-6)
        assert result["norms"] == pytest.approx(norms, rel=1e-5) and min(norms) > CLIP  # the global norm, clipped
        assert result["optimizer"]["state"].keys() == moments["state"].keys()
        for index, state in moments["state"].items():  # the experts' moments gathered whole, as one process holds them
            for key in ("exp_avg", "exp_avg_sq"):
                close(result["optimizer"]["state"][index][key], state[key], f"{index} {key}", atol=1e-6)
    assert not torch.equal(ranks[0]["shard"], ranks[1]["shard"])  # each rank trained its own experts
    assert ranks[0]["ddp ignores"] == [f"transformer.h.{i}.mlp.{name}" for i in range(2) for name in ("experts_fc", "experts_proj")]


TRAINER_SCRIPT = """
import dataclasses, shutil, sys
from pathlib import Path
import torch.distributed as dist
from gptlab.model.config import preset
from gptlab.runtime.config import apply_overrides
from gptlab.train import Trainer
from tests.train.conftest import tiny_config
out = Path(sys.argv[2])
base = tiny_config(Path(sys.argv[1]), out, micro_batch=2, batch_tokens=4 * 32, max_steps=4, checkpoint_every=2,
                   model=preset("moe-tiny", block_size=32))
config = apply_overrides(base, ["--parallel.expert-parallel", "true"])
lines = []
Trainer(config, log=lines.append).fit()
if dist.get_rank() == 0:  # the same run, cut back to its step-2 checkpoint
    shutil.copytree(out, out.parent / "resumed")
    shutil.rmtree(out.parent / "resumed" / "checkpoints" / "step_000004")
    (out.parent / "announced.txt").write_text(next(line for line in lines if line.startswith("training ")))
dist.barrier()
Trainer(dataclasses.replace(config, out=str(out.parent / "resumed")), log=lambda *_: None).fit()
"""


def test_trainer_under_torchrun_with_expert_parallel_equals_one_process_and_resumes(prepared, tmp_path):
    """torchrun, 2 gloo ranks, `--parallel.expert-parallel true`, moe-tiny: the saved model (experts gathered whole)
    equals one process's after 4 steps; the same run resumed from its step-2 checkpoint under expert parallelism
    (each rank slicing its experts' weights and AdamW moments from the whole checkpoint) ends with the same weights;
    the announcement counts every rank's experts."""
    single = tiny_config(prepared, tmp_path / "single", micro_batch=2, batch_tokens=4 * 32, max_steps=4, checkpoint_every=2,
                         model=preset("moe-tiny", block_size=32))
    Trainer(single, log=lambda *_: None).fit()
    run_on_two_ranks(TRAINER_SCRIPT, prepared, tmp_path)
    reference, weights = final_weights(tmp_path / "single"), final_weights(tmp_path / "ddp")
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():  # a mid-run checkpoint must leave the run as it was (it once swapped moments)
        torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    assert_same_weights(tmp_path / "ddp", tmp_path / "resumed")
    total = GPT(single.model).num_params()
    assert (tmp_path / "announced.txt").read_text().startswith(f"training {total:,} parameters")


def test_expert_parallel_refuses_other_sharding_and_compile():
    with pytest.raises(GptlabError, match="torch DDP only"):
        ParallelConfig(expert_parallel=True, fsdp=True)
    with pytest.raises(GptlabError, match="torch DDP only"):
        ParallelConfig(expert_parallel=True, shard_optimizer="zero1")
    with pytest.raises(GptlabError, match="drop --compile"):
        check_config(ParallelConfig(expert_parallel=True), compile=True)
    with pytest.raises(GptlabError, match="this model is dense .*leave out --parallel.expert-parallel"):
        check_config(ParallelConfig(expert_parallel=True), compile=False, moe=False)
    check_config(ParallelConfig(expert_parallel=True), compile=False, moe=True)


def test_expert_parallel_costs_match_hand_arithmetic():
    """GPT-2-124M-shaped, 8 experts top-2 (each the dense MLP's width) in every layer, bf16, 8 x 64 x 1024 tokens, 8 ranks."""
    config = preset("gpt2", moe=MoEConfig(n_experts=8, top_k=2))
    with torch.device("meta"):
        model = GPT(config)
    costs = expert_parallel_costs(model, 8, 8 * 64 * 1024)
    d, layers, hidden = 768, 12, 4 * 768
    experts = layers * 8 * 2 * d * hidden  # fc (E, H, C) and proj (E, C, H), no biases
    # the rest, by hand: embeddings (vocab padded to 50,304, head tied), per layer attention (with biases), 2 layer
    # norms and the router (8 x 768, no bias), then the final norm
    replicated = 50304 * d + 1024 * d + layers * (d * 3 * d + 3 * d + d * d + d + 4 * d + 8 * d) + 2 * d
    total = replicated + experts
    assert (costs.expert_parameters, costs.replicated_parameters) == (experts, replicated) == (452_984_832, 67_880_448)
    rows = 64 * 1024 * 2  # a rank's tokens times top_k
    assert costs.all_to_all_bytes == 4 * rows * d * 2 * 7 // 8 * layers
    assert costs.ddp_all_reduce_bytes == 2 * 7 * (total - experts) * 4 // 8
    assert costs.parameters_per_rank == experts // 8 + total - experts
    assert costs.memory_per_rank == 16 * (experts // 8 + total - experts)
    assert costs.memory_without_ep == 16 * total
    assert costs.ddp_all_reduce_bytes_without_ep == 2 * 7 * total * 4 // 8


def test_expert_parallel_costs_refuse_a_dense_model():
    with torch.device("meta"):
        model = GPT(preset("gpt2-tiny"))
    with pytest.raises(GptlabError, match="divisible"):
        expert_parallel_costs(model, 2, 1024)
