"""A mixture-of-experts policy under the fine-tuning losses that read logits or scalars without targets (DPO; the
reward model, whose trunk sits inside a wrapper): the sparse layers' balance loss still joins the backward and is
logged beside the loss, as in pretraining. The same run with the balance coefficient at 0 is the reference."""

import json

import pytest
import torch
from safetensors.torch import load_file

from gptlab.load.checkpoints import list_checkpoints
from gptlab.model.config import MoEConfig

from .test_dpo import dpo_config
from .test_dpo import quiet as quiet_dpo
from .test_rm import quiet as quiet_rm
from .test_rm import rm_config

AUX = 0.05


@pytest.fixture(scope="module")
def moe_chat_models(prepared, tmp_path_factory) -> dict[float, object]:
    """Two tiny MoE chat models with the same weights, balance coefficient AUX and 0 (a coefficient changes no output)."""
    from gptlab.chat import add_chat_tokens
    from gptlab.model import GPT, preset
    from gptlab.model.io import save_model
    from gptlab.tokenizer import Tokenizer

    tokenizer = add_chat_tokens(Tokenizer.load(prepared / "tokenizer"))
    folders = {}
    for aux in (AUX, 0.0):
        moe = MoEConfig(n_experts=4, top_k=2, expert_hidden=64, aux_loss=aux, z_loss=0.0)
        torch.manual_seed(0)
        model = GPT(preset("moe-tiny", vocab_size=tokenizer.vocab_size, block_size=256, moe=moe))
        folders[aux] = tmp_path_factory.mktemp("moe_chat_model")
        save_model(model, folders[aux])
        tokenizer.save(folders[aux] / "tokenizer")
    return folders


def first_record(out) -> dict:
    return next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r)


def last_weights(out) -> dict[str, torch.Tensor]:
    return load_file(list_checkpoints(out)[-1] / "model.safetensors")


@pytest.mark.parametrize("stage", ["dpo", "rm"])
def test_balance_loss_trains_the_router_under_dpo_and_the_reward_model(moe_chat_models, tmp_path, stage):
    """One step each way. The balance loss reaches the backward: the routers move differently, while the top
    layer's experts, which it has no path through (the lower layers' feed the routers above them), end equal. It is logged as moe_aux_loss (AUX x each layer's balance figure) and
    left out of the logged loss, which equals the run without it."""
    make, run = (dpo_config, quiet_dpo) if stage == "dpo" else (rm_config, quiet_rm)
    for aux, folder in moe_chat_models.items():
        run(make(folder, tmp_path / str(aux), max_steps=1, eval_every=0, checkpoint_every=1, grad_clip=0.0))
    on, off = first_record(tmp_path / str(AUX)), first_record(tmp_path / "0.0")
    assert on["loss"] == pytest.approx(off["loss"], rel=1e-6)
    assert on["moe_aux_loss"] == pytest.approx(AUX * sum(layer["balance"] for layer in on["moe_layers"]), rel=1e-4)
    assert on["moe_aux_loss"] > 0 and off["moe_aux_loss"] == 0.0 and len(on["moe_layers"]) == 2
    a, b = last_weights(tmp_path / str(AUX)), last_weights(tmp_path / "0.0")
    routers = [name for name in a if name.endswith("router.weight")]
    experts = [name for name in a if "experts_" in name]
    assert len(routers) == 2 and len(experts) == 4
    assert all(not torch.allclose(a[name], b[name]) for name in routers)
    last = [name for name in experts if ".h.1." in name]  # the top layer's: the loss has no path through them
    assert len(last) == 2 and all(torch.equal(a[name], b[name]) for name in last)


def test_sparse_layers_are_numbered_by_block_and_a_second_trunk_after_the_first():
    """PPO's policy and a separate value model, both MoE: every sparse layer found, no number used twice."""
    from gptlab.align.rl.ppo import PolicyAndValue
    from gptlab.align.rl.scalar import ScalarModel
    from gptlab.model import GPT, preset
    from gptlab.train.moe_stats import sparse_layers

    config = preset("moe-tiny", moe=MoEConfig(n_experts=4, top_k=2, first_dense=1))  # block 0 dense, block 1 sparse
    policy, value = GPT(config), GPT(config)
    assert sparse_layers(policy)[1] == [1]
    layers, numbers = sparse_layers(PolicyAndValue(policy, ScalarModel(value)))
    assert layers == policy.moe_layers() + value.moe_layers() and numbers == [1, 3]
