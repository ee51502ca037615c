"""Data parallel by hand, ZeRO-1, torch's ZeroRedundancyOptimizer and FSDP2 (fp32 and bf16) on 2 gloo processes, each against a
single process training on both ranks' rows at once, and the hand variants against torch's DDP.

One spawned process group runs every case (tests/parallel/workers.py); the tests below read what it saved.
"""

from __future__ import annotations

import pytest
import torch

from gptlab.parallel.data_parallel import MIB, make_buckets
from tests.parallel.common import DTYPES, LR, autocast_to, make_model, single_process_weights, spawn_ranks
from tests.parallel.workers import BUCKET_MB, HAND, run_cases

WORLD = 2
pytestmark = pytest.mark.xdist_group("data_parallel_ranks")  # one worker spawns the ranks once, not each worker


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Every case's results, one dict per rank."""
    folder = tmp_path_factory.mktemp("parallel")
    return spawn_ranks(run_cases, folder, WORLD)


def assert_same(weights: dict, reference: dict, exact: bool = False) -> None:
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        if exact:
            assert torch.equal(weights[name], tensor), name
        else:
            torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("variant", HAND)
def test_data_parallel_variants_equal_one_process_and_torch_ddp(ranks, variant, accum):
    """2 ranks x 2 rows == 1 process x 4 rows, with and without accumulation (no_sync); every rank holds the
    same weights; and bit for bit torch DDP's, which also divides by the world size before summing."""
    weights = ranks[0][(variant, accum)]
    assert_same(weights, single_process_weights(WORLD, accum))
    assert_same(ranks[1][(variant, accum)], weights, exact=True)
    assert_same(weights, ranks[0][("torch", accum)], exact=True)


@pytest.mark.parametrize("variant", HAND)
def test_data_parallel_leaves_a_parameter_without_gradient_alone(ranks, variant):
    """The parameter outside the graph keeps grad None (and so stays untouched by AdamW: checked by the weights)."""
    assert ranks[0][("unused grad", variant, 2)] is None


def test_bucketed_makes_buckets_in_backward_order_under_the_cap(ranks):
    """300-byte buckets over the tiny model: 4 buckets, the last-registered parameters first, the tied weight once;
    the second holds the parameter without gradient (sent at the end, zeros in its place)."""
    assert ranks[0]["buckets"] == [["blocks.1.0.bias", "blocks.1.0.weight"], ["blocks.1.unused", "blocks.0.0.bias"],
                                   ["blocks.0.0.weight"], ["embed.weight"]]
    sizes = [sum(p.numel() * p.element_size() for p in bucket.parameters) for bucket in make_buckets(list(make_model().parameters()), BUCKET_MB)]
    assert all(size <= BUCKET_MB * MIB for size in sizes[:-1]) and sizes[-1] > BUCKET_MB * MIB  # the embedding alone


def test_zero1_equals_unsharded_adamw_and_keeps_state_for_its_shard_only(ranks):
    """ZeRO-1 around AdamW: the weights of one process with plain AdamW; each rank holds state only for the
    parameters it owns, the two shares are disjoint, cover the model and are balanced by size."""
    assert_same(ranks[0][("zero1", 2)], single_process_weights(WORLD, 2))
    assert_same(ranks[1][("zero1", 2)], ranks[0][("zero1", 2)], exact=True)
    owned = [set(rank["owned"]) for rank in ranks]
    assert owned[0].isdisjoint(owned[1]) and owned[0] | owned[1] == {name for name, _ in make_model().named_parameters()}
    for rank in ranks:
        assert set(rank["state held"]) <= set(rank["owned"]) and rank["state held"]
    sizes = dict((name, p.numel()) for name, p in make_model().named_parameters())
    loads = [sum(sizes[name] for name in share) for share in owned]
    assert abs(loads[0] - loads[1]) <= max(sizes.values())


def test_zero1_state_dict_gathers_the_unsharded_optimizers_state(ranks):
    """What a checkpoint saves: the same numbering, groups and moments as torch DDP's run with plain AdamW."""
    gathered, plain = ranks[0]["zero1 state"], ranks[0][("torch state", 2)]
    assert gathered["state"].keys() == plain["state"].keys()
    assert [group["params"] for group in gathered["param_groups"]] == [group["params"] for group in plain["param_groups"]]
    for index, state in plain["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(gathered["state"][index][key], value, rtol=1e-5, atol=1e-7)


def test_zero1_load_state_dict_gives_each_rank_its_share_back(ranks):
    """A fresh ShardedOptimizer loading the gathered state holds exactly the state each rank had (a resume)."""
    for rank in ranks:
        reloaded = rank["zero1 reloaded"]
        assert reloaded and all(same for _, _, same in reloaded), reloaded
        assert {name for name, _, _ in reloaded} == set(rank["state held"])


def test_zero_redundancy_optimizer_equals_one_process(ranks):
    assert_same(ranks[0][("zero torch", 2)], single_process_weights(WORLD, 2))


def test_fsdp2_on_gloo_equals_one_process(ranks):
    """fully_shard per block and at the root, accumulation through set_requires_gradient_sync; gathered whole."""
    assert_same(ranks[0][("fsdp", 2)], single_process_weights(WORLD, 2))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fsdp2_in_16_bits_gathers_them_reduces_in_fp32_and_equals_one_autocast_process(ranks, precision):
    """--parallel.fsdp with precision bf16 or fp16 (parallelize, as the Trainer calls it): the weights a block computes
    with are 16-bit, the reduced gradients and the shards AdamW steps fp32. The weights trained equal one process under
    that autocast within a 16-bit tolerance: a tenth of what 3 AdamW steps can move a weight (3 x lr), against 0.02
    between bf16 and fp32 here; and they are not the fp32 run's."""
    dtypes = {"gathered": DTYPES[precision], "gradients": {torch.float32}, "shards": {torch.float32}}
    assert ranks[0][f"fsdp {precision} dtypes"] == dtypes
    weights = ranks[0][(f"fsdp {precision}", 2)]
    reference = single_process_weights(WORLD, 2, cast=autocast_to(precision))
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=0.1 * 3 * LR, msg=name)
    fp32 = ranks[0][("fsdp", 2)]
    assert any(not torch.equal(weights[name], fp32[name]) for name in fp32)
