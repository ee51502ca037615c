"""Training a mixture-of-experts model (preset moe-tiny) against its references: an uninterrupted run, one process,
the plain fp32 run; and the load metrics against what a forced router must show."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from gptlab.load.checkpoints import list_checkpoints
from gptlab.model import preset
from gptlab.model.config import MoEConfig
from gptlab.model.moe import MoE

from .conftest import mask_some_targets, tiny_config
from .test_trainer import assert_same_weights, final_weights, quiet, run_on_two_ranks


def moe_config(prepared, out, **moe_changes):
    """moe-tiny at the tiny config's context, with every balancing on (aux and z losses, the DeepSeek-V3 bias)."""
    moe = MoEConfig(n_experts=4, top_k=2, expert_hidden=64, aux_loss=0.01, z_loss=0.001, bias_update=0.01)
    model = preset("moe-tiny", block_size=32, moe=dataclasses.replace(moe, **moe_changes))
    return tiny_config(prepared, out, model=model, precision="fp32")


def train_records(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def without_clock(record: dict) -> dict:
    return {key: value for key, value in record.items() if key not in ("tokens_per_s", "mfu", "elapsed")}


def test_moe_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(prepared, tmp_path):
    """6 steps straight == restarted from step 3: weights (route_bias included), losses and every MoE figure."""
    config = moe_config(prepared, tmp_path / "straight")
    straight = quiet(config).fit()
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000006")
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "resumed" / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")  # as if killed after step 3
    resumed = quiet(dataclasses.replace(config, out=str(tmp_path / "resumed"))).fit()
    assert resumed.losses == straight.losses[3:]
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    bias = final_weights(tmp_path / "resumed")["transformer.h.1.mlp.route_bias"]
    assert bias.abs().sum() > 0  # the bias did move: the test covers its update and its saving
    a, b = train_records(tmp_path / "straight"), train_records(tmp_path / "resumed")
    assert [without_clock(r) for r in a] == [without_clock(r) for r in b]
    assert all(r["moe_aux_loss"] > 0 and len(r["moe_layers"]) == 2 for r in a)


@pytest.mark.parametrize("masked", [False, True], ids=["all-targets", "some-ignored"])
def test_moe_logged_loss_is_the_cross_entropy_and_the_aux_part_is_logged_beside_it(prepared, tmp_path, monkeypatch, masked):
    """The same run with the balance losses' coefficients at 0: the same first loss; with them on, moe_aux_loss is
    their weighted value. With ignored targets the model adds them per counted token (the "sum" path)."""
    if masked:
        mask_some_targets(monkeypatch)
    on = quiet(moe_config(prepared, tmp_path / "on", bias_update=0.0)).fit()
    off = quiet(moe_config(prepared, tmp_path / "off", aux_loss=0.0, z_loss=0.0, bias_update=0.0)).fit()
    assert on.losses[0] == pytest.approx(off.losses[0], abs=1e-5)  # step 1's forward: the same weights
    first = train_records(tmp_path / "on")[0]
    layers = first["moe_layers"]
    expected = sum(0.01 * layer["balance"] + 0.001 * layer["z"] for layer in layers)
    assert first["moe_aux_loss"] == pytest.approx(expected, rel=1e-4)
    assert train_records(tmp_path / "off")[0]["moe_aux_loss"] == 0.0


DDP_SCRIPT = """
import sys
from pathlib import Path
from gptlab.train import Trainer
from tests.train.test_moe_training import moe_config
import dataclasses
config = dataclasses.replace(moe_config(Path(sys.argv[1]), Path(sys.argv[2])), micro_batch=2, batch_tokens=8 * 32, max_steps=3)
Trainer(config, log=lambda *_: None).fit()
"""


def test_moe_ddp_on_two_gloo_processes_equals_one_process_with_the_bias_update(prepared, tmp_path):
    """2 ranks x 2 micro-steps == 1 process x 4: the same weights and route_bias (so each rank's bias moved by the
    load of both ranks), and the same loss and expert loads (summed over the ranks)."""
    single = dataclasses.replace(moe_config(prepared, tmp_path / "single"), micro_batch=2, batch_tokens=8 * 32, max_steps=3)
    quiet(single).fit()
    run_on_two_ranks(DDP_SCRIPT, prepared, tmp_path)
    wa, wb = final_weights(tmp_path / "single"), final_weights(tmp_path / "ddp")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-5)
    assert wa["transformer.h.0.mlp.route_bias"].abs().sum() > 0
    for a, b in zip(train_records(tmp_path / "single"), train_records(tmp_path / "ddp")):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        for layer_a, layer_b in zip(a["moe_layers"], b["moe_layers"]):
            assert layer_b["tokens"] == pytest.approx(layer_a["tokens"], abs=1e-6)


@pytest.fixture(scope="module")
def plain_two_steps(prepared, tmp_path_factory):
    """The plain fp32 two-step run the variants below are compared with: trained once for the module."""
    out = tmp_path_factory.mktemp("moe_plain") / "plain"
    return quiet(dataclasses.replace(moe_config(prepared, out), max_steps=2)).fit(), train_records(out)


@pytest.mark.parametrize("changes", [{"activation_checkpointing": True}, {"compile": True}], ids=["checkpointing", "compile"])
def test_moe_training_with_checkpointing_or_compile_equals_the_plain_run(prepared, tmp_path, plain_two_steps, changes):
    """Two steps of each equal the plain fp32 run: losses, expert loads and balance losses."""
    plain, a = plain_two_steps
    other = quiet(dataclasses.replace(moe_config(prepared, tmp_path / "other"), max_steps=2, **changes)).fit()
    assert other.losses == pytest.approx(plain.losses, rel=1e-4)
    b = train_records(tmp_path / "other")
    layers_a, layers_b = [layer for r in a for layer in r["moe_layers"]], [layer for r in b for layer in r["moe_layers"]]
    assert [layer["tokens"] for layer in layers_b] == [layer["tokens"] for layer in layers_a]  # the same routing
    for key in ("balance", "z", "max_load", "dropped"):
        assert [layer[key] for layer in layers_b] == pytest.approx([layer[key] for layer in layers_a], rel=1e-4), key
    assert [r["moe_aux_loss"] for r in b] == pytest.approx([r["moe_aux_loss"] for r in a], rel=1e-4)


def test_moe_training_in_bf16_takes_finite_steps_near_the_fp32_run(prepared, tmp_path, plain_two_steps):
    plain = plain_two_steps[0]
    bf16 = quiet(dataclasses.replace(moe_config(prepared, tmp_path / "bf16"), max_steps=2, precision="bf16")).fit()
    assert bf16.status == "finished" and all(torch.isfinite(torch.tensor(bf16.losses)))
    assert bf16.losses == pytest.approx(plain.losses, rel=2e-2)


@pytest.mark.parametrize("capacity, dropped", [(0.0, False), (0.5, True)], ids=["dropless", "capacity"])
def test_moe_metrics_fractions_sum_to_one_and_dropped_follows_the_capacity(prepared, tmp_path, capacity, dropped):
    quiet(dataclasses.replace(moe_config(prepared, tmp_path / "run", capacity_factor=capacity), max_steps=2)).fit()
    for record in train_records(tmp_path / "run"):
        for layer in record["moe_layers"]:
            assert sum(layer["tokens"]) == pytest.approx(1.0, abs=1e-9) and len(layer["tokens"]) == 4
            assert (layer["dropped"] > 0) == dropped
            assert 1.0 <= layer["max_load"] <= 2.0 and layer["balance"] > 0 and layer["z"] > 0
        assert record["moe_max_load"] == max(layer["max_load"] for layer in record["moe_layers"])


def test_moe_metrics_show_a_collapsed_router_at_n_experts_over_top_k(prepared, tmp_path, monkeypatch):
    """A router forced to pick experts 0 and 1 for every token: max/mean load 4 / 2 = 2, fractions [.5, .5, 0, 0]."""
    original = MoE.route

    def collapsed(self, flat):
        with torch.no_grad():
            self.route_bias.copy_(torch.tensor([10.0, 10.0, 0.0, 0.0]))  # the bias decides the choice, not the weights
        return original(self, flat)

    monkeypatch.setattr(MoE, "route", collapsed)
    quiet(dataclasses.replace(moe_config(prepared, tmp_path / "run", bias_update=0.0), max_steps=2)).fit()
    for record in train_records(tmp_path / "run"):
        for layer in record["moe_layers"]:
            assert layer["tokens"] == [0.5, 0.5, 0.0, 0.0] and layer["max_load"] == 2.0 and layer["dropped"] == 0.0
        assert record["moe_max_load"] == 2.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: bf16 F.grouped_mm on a GPU")
def test_moe_training_on_cuda_in_bf16_takes_finite_steps_near_the_fp32_run(prepared, tmp_path):
    config = dataclasses.replace(moe_config(prepared, tmp_path / "fp32"), max_steps=2, device="cuda")
    plain = quiet(config).fit()
    bf16 = quiet(dataclasses.replace(config, out=str(tmp_path / "bf16"), precision="bf16")).fit()
    assert all(torch.isfinite(torch.tensor(bf16.losses))) and bf16.losses == pytest.approx(plain.losses, rel=2e-2)
    assert sum(train_records(tmp_path / "bf16")[-1]["moe_layers"][0]["tokens"]) == pytest.approx(1.0)


def test_dense_run_logs_no_moe_figures(prepared, tmp_path):
    quiet(dataclasses.replace(tiny_config(prepared, tmp_path / "dense"), max_steps=1)).fit()
    assert not any(key.startswith("moe") for r in train_records(tmp_path / "dense") for key in r)
    assert list_checkpoints(tmp_path / "dense")
