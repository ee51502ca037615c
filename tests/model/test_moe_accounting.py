"""MoE accounting against the built model: stored parameters (sum of numel), active parameters (what one token's
backward touches), training FLOPs (FlopCounterMode over the per-expert loop), memory per parameter."""

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gptlab.model import GPT, preset
from gptlab.model.accounting import flops_per_token, param_counts, parameter_memory, scaling_params, training_memory
from gptlab.model.config import MoEConfig

CONFIGS = {
    "moe-tiny": lambda: preset("moe-tiny"),
    "shared": lambda: preset("moe-tiny", moe=MoEConfig(n_experts=4, top_k=1, expert_hidden=32, n_shared=2)),
    "first-dense": lambda: preset("moe-tiny", moe=MoEConfig(n_experts=3, top_k=2, expert_hidden=48, first_dense=1)),
    "every-2": lambda: preset("moe-tiny", moe=MoEConfig(n_experts=4, top_k=2, every=2, score="sigmoid")),
    "gpt2-tied": lambda: preset("gpt2-tiny", vocab_size=512, moe=MoEConfig(n_experts=4, top_k=2, n_shared=1)),
}


def stored(model: GPT) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def active_by_backward(model: GPT) -> int:
    """Brute force: one token's loss backward, then every stored parameter except the experts it left without a gradient."""
    x = torch.tensor([[3]])
    model.zero_grad()
    model(x, x)[1].backward()
    idle = 0
    for layer in model.moe_layers():
        for weight in (layer.experts_fc, layer.experts_proj):
            untouched = weight.grad.flatten(1).abs().sum(1) == 0  # (E,): experts this token did not visit
            idle += int(untouched.sum()) * weight[0].numel()
    return stored(model) - idle


@pytest.mark.parametrize("name", CONFIGS)
def test_param_counts_moe_total_and_active_equal_the_built_model(name):
    config = CONFIGS[name]()
    torch.manual_seed(0)
    model = GPT(config).float().train()
    counts = param_counts(config)
    assert counts["total"] == stored(model)
    assert counts["active"] == active_by_backward(model)
    experts = sum(layer.experts_fc.numel() + layer.experts_proj.numel() for layer in model.moe_layers())
    assert counts["experts"] == experts
    assert counts["routers"] == sum(layer.router.weight.numel() for layer in model.moe_layers())
    assert counts["active"] < counts["total"]


def test_param_counts_dense_model_is_its_own_active_count():
    counts = param_counts(preset("llama-tiny"))
    assert counts["active"] == counts["total"] and counts["experts"] == counts["routers"] == 0
    params = scaling_params(preset("gpt2-tiny"))
    assert params["active"] == params["matmul"] == flops_per_token(preset("gpt2-tiny"))["matmul_params"]


def test_scaling_params_moe_matmul_counts_every_expert_and_active_top_k():
    config = preset("moe-tiny")  # 2 sparse layers of 4 experts, top 2; SwiGLU experts 32 x 128 + 64 x 32
    params = scaling_params(config)
    assert params["matmul"] - params["active"] == 2 * (4 - 2) * (32 * 128 + 64 * 32)


B, T = 2, 16


@pytest.mark.parametrize("name", CONFIGS)
def test_flops_per_token_moe_equal_the_flop_counter_over_the_expert_loop(name):
    """The per-expert loop (impl "loop") multiplies each expert's weights by exactly its tokens, so the counted
    expert FLOPs are 6 x top_k x expert size per token whatever the balance; the grouped fallback on CPU pads
    every expert to the largest one and would count the padding. As for dense (tests/train/test_profile.py) the
    one gap is the vector parameters (norm gains, biases) that N counts and no matmul multiplies."""
    config = CONFIGS[name]()
    config = replace(config, moe=replace(config.moe, impl="loop"))
    torch.manual_seed(0)
    model = GPT(config).float().train().set_attention("math")
    x = torch.randint(0, config.vocab_size, (2, B, T), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(x[0], x[1])[1].backward()
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert counter.get_total_flops() == (flops_per_token(config, T)["training"] - 6 * vectors) * B * T


def test_parameter_memory_counts_every_expert_with_adamw_state():
    config = preset("moe-tiny")
    counts, memory = param_counts(config), parameter_memory(config)
    assert memory["per_param"] == 16 and memory["optimizer_per_param"] == 8  # fp32: weight, gradient, AdamW m and v
    assert memory["experts"] == 16 * counts["experts"]
    assert memory["experts"] + memory["rest"] == 16 * counts["total"]
    step = training_memory(config, 2, 16)
    assert step["optimizer"] == memory["optimizer"] == 8 * counts["total"]  # all experts stored, all have state
    assert parameter_memory(config, param_dtype="bf16", optimizer="sgd")["per_param"] == 6


def test_activation_bytes_moe_layer_match_autograd_saved_tensors_in_fp32():
    from gptlab.model.accounting import activation_bytes_per_layer
    from tests.model.test_accounting import _saved_bytes_of_one_block

    config = preset("moe-tiny", block_size=64)
    torch.manual_seed(0)
    model = GPT(config).float().train()
    measured = _saved_bytes_of_one_block(model, 2, 64)
    estimate = activation_bytes_per_layer(config, 2, 64, param_dtype="fp32", amp="fp32", sparse=True)
    assert measured == pytest.approx(estimate, rel=0.05)


def test_cli_model_info_prints_active_and_total_for_moe_and_keeps_dense_output(capsys):
    from gptlab.cli.main import main

    config = preset("moe-tiny")
    counts, flops, memory = param_counts(config), flops_per_token(config), parameter_memory(config)
    assert main(["model", "info", "--preset", "moe-tiny"]) == 0
    out = capsys.readouterr().out
    for text in (f"active      {counts['active']:,}", f"of {counts['total']:,} (", f"routed experts {counts['experts']:,}",
                 f"training {flops['training']:,}", f"N = {flops['matmul_params']:,} active matmul params",
                 "16 bytes for every stored parameter", f"experts {memory['experts'] / 2**20:,.2f} MiB"):
        assert text in out
    assert main(["model", "info", "--preset", "llama-tiny"]) == 0
    dense = capsys.readouterr().out
    assert "active" not in dense and "experts" not in dense and "per param" not in dense
