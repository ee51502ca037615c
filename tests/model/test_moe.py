"""The mixture-of-experts layer (gptlab.model.moe) against references: a brute-force per-token computation, the
per-expert loop, hand-computed balance losses, first-come-first-served capacity, and the dense model's own paths
(eager vs checkpointed vs compiled, cache vs no cache, fp32 vs bf16). Everything runs in float32 unless it says."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from gptlab.model import GPT, KVCache, preset
from gptlab.model import moe as moe_module
from gptlab.model.config import ModelConfig, MoEConfig
from gptlab.model.io import load_model, save_model
from gptlab.model.moe import MoE
from gptlab.runtime import GptlabError
from gptlab.runtime.config import apply_overrides
from gptlab.train.config import TrainConfig


def moe_config(arch: str = "llama", **moe) -> ModelConfig:
    """A one-to-two layer tiny model config with the given MoE settings (llama: swiglu; gpt2: gelu)."""
    settings = {"n_experts": 4, "top_k": 2, "expert_hidden": 16} | moe
    base = preset("llama-tiny" if arch == "llama" else "gpt2-tiny")
    return dataclasses.replace(base, moe=MoEConfig(**settings))


def build_layer(config: ModelConfig, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    layer = MoE(config)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0, 0.3)
    return layer


def tokens(n: int = 24, width: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


def activation(h: torch.Tensor, kind: str) -> torch.Tensor:
    """The activations spelled out from their definitions, not from torch's helpers."""
    if kind == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return gate * torch.sigmoid(gate) * up
    if kind == "relu2":
        return torch.clamp(h, min=0) ** 2
    return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))


def reference_moe(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """One token at a time: scores, its top-k (bias moves the choice only), weights, the picked experts' MLPs."""
    moe, kind = layer.moe, layer.activation
    outputs = []
    for token in x:
        logits = layer.router.weight @ token
        probs = logits.softmax(-1) if moe.score == "softmax" else logits.sigmoid()
        chosen = sorted(range(moe.n_experts), key=lambda e: -(probs[e] + layer.route_bias[e]).item())[: moe.top_k]
        weights = probs[chosen]
        if moe.normalize:
            weights = weights / weights.sum()
        y = sum(w * (layer.experts_proj[e] @ activation(layer.experts_fc[e] @ token, kind)) for w, e in zip(weights, chosen))
        if layer.shared is not None:
            y = y + layer.shared(token[None])[0]
        outputs.append(y)
    return torch.stack(outputs)


CASES = {
    "softmax-top2-swiglu": ("llama", {}),
    "softmax-top1-unnormalized": ("llama", {"top_k": 1, "normalize": False}),
    "sigmoid-top2-normalized": ("llama", {"score": "sigmoid"}),
    "sigmoid-top2-unnormalized": ("llama", {"score": "sigmoid", "normalize": False}),
    "shared-experts": ("llama", {"n_shared": 2}),
    "gelu-gpt2": ("gpt2", {}),
    "relu2-gpt2": ("gpt2", {"top_k": 1}),
    "odd-hidden-swiglu": ("llama", {"expert_hidden": 9}),
    "odd-hidden-gelu": ("gpt2", {"expert_hidden": 9, "n_shared": 1}),
}


@pytest.mark.parametrize("name", CASES)
def test_moe_equals_brute_force_per_token_reference(name):
    arch, changes = CASES[name]
    config = moe_config(arch, **changes)
    if name == "relu2-gpt2":
        config = dataclasses.replace(config, activation="relu2")
    layer = build_layer(config).eval()
    layer.route_bias.copy_(torch.tensor([0.0, 0.3, -0.2, 0.1]))  # moves choices; must not move weights
    x = tokens()
    fits = moe_module._grouped_mm_fits(x, layer.experts_fc.transpose(1, 2)) and moe_module._grouped_mm_fits(
        torch.zeros(1, config.expert_hidden), layer.experts_proj.transpose(1, 2))
    assert fits == (config.expert_hidden % 4 == 0)  # odd widths take the padded-bmm fallback
    with torch.no_grad():
        torch.testing.assert_close(layer(x[None])[0], reference_moe(layer, x), atol=1e-5, rtol=1e-5)


def test_grouped_matmul_calls_grouped_mm_where_strides_allow(monkeypatch):
    calls = []
    real = F.grouped_mm
    monkeypatch.setattr(F, "grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    layer = build_layer(moe_config()).eval()
    with torch.no_grad():
        layer(tokens()[None])
    assert len(calls) == 2  # fc and proj


def paired_layers(seed: int = 0, **changes) -> tuple[MoE, MoE]:
    grouped = build_layer(moe_config(**changes, impl="grouped"), seed).train()
    loop = build_layer(moe_config(**changes, impl="loop"), seed).train()
    loop.load_state_dict(grouped.state_dict())
    return grouped, loop


@pytest.mark.parametrize("changes", [{}, {"capacity_factor": 0.75}, {"n_shared": 1, "expert_hidden": 9}], ids=["dropless", "capacity", "odd-shared"])
def test_moe_grouped_equals_loop_forward_and_backward_with_an_idle_expert(changes):
    grouped, loop = paired_layers(**changes)
    for layer in (grouped, loop):
        layer.route_bias[3] = -100.0  # expert 3 is never picked: an empty group
    x = tokens()
    outputs, grads = [], []
    for layer in (grouped, loop):
        y = layer(x[None])
        (y.square().sum() + layer.aux_loss).backward()
        outputs.append(y)
        grads.append({name: p.grad for name, p in layer.named_parameters()})
    stats = grouped.pop_stats()
    assert stats["tokens"][3] == 0 and (stats["dropped"] > 0) == ("capacity_factor" in changes)
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-5, msg=name)
    assert not grads[0]["experts_fc"][3].any()


def test_moe_capacity_drops_the_assignments_a_first_come_first_served_count_drops():
    layer = build_layer(moe_config(capacity_factor=0.6)).train()
    x = tokens(n=30)
    routing = layer.route(x)
    chosen = (routing.probs + layer.route_bias).topk(2, dim=-1).indices
    capacity = math.ceil(0.6 * 30 * 2 / 4)
    taken, kept, dropped = [0] * 4, set(), 0
    for token in range(30):
        for expert in chosen[token].tolist():
            if taken[expert] < capacity:
                taken[expert] += 1
                kept.add((token, expert))
            else:
                dropped += 1
    assert dropped > 0 and routing.dropped == dropped
    experts = torch.repeat_interleave(torch.arange(4), routing.counts)
    assert set(zip(routing.token.tolist(), experts.tolist())) == kept
    assert routing.counts.tolist() == taken
    layer(x[None])
    stats = layer.pop_stats()
    assert stats["dropped"].item() == dropped and stats["assignments"].item() == 60


def forced_router(layer: MoE, rows: dict[int, torch.Tensor]) -> None:
    with torch.no_grad():
        layer.router.weight.zero_()
        for expert, row in rows.items():
            layer.router.weight[expert] = row


def test_balance_loss_is_one_when_balanced_and_n_experts_over_top_k_when_collapsed():
    layer = build_layer(moe_config(n_experts=4, top_k=2))
    basis = torch.eye(32)
    forced_router(layer, {e: 10 * basis[e] for e in range(4)})
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]  # every pair once: each expert picked 3 times of 12
    balanced = torch.stack([basis[a] + basis[b] for a, b in pairs])
    routing = layer.route(balanced)
    assert routing.counts.tolist() == [3, 3, 3, 3]
    torch.testing.assert_close(layer.balance_losses(routing, len(pairs))[0], torch.tensor(1.0))
    forced_router(layer, {0: 50 * basis[0], 1: 50 * basis[0]})
    collapsed = basis[0].repeat(8, 1)  # every token picks experts 0 and 1 with score 1/2 each
    routing = layer.route(collapsed)
    assert routing.counts.tolist() == [8, 8, 0, 0]
    torch.testing.assert_close(layer.balance_losses(routing, 8)[0], torch.tensor(4 / 2))


def test_z_loss_is_mean_squared_logsumexp_of_the_router_logits():
    layer = build_layer(moe_config())
    x = tokens()
    logits = x @ layer.router.weight.t()
    by_hand = torch.stack([torch.log(torch.exp(row).sum()) ** 2 for row in logits]).mean()
    torch.testing.assert_close(layer.balance_losses(layer.route(x), len(x))[1], by_hand)


def test_update_routing_bias_follows_the_sign_rule_and_zeroes_the_load():
    layer = build_layer(moe_config(bias_update=0.1))
    layer.step_load.copy_(torch.tensor([4.0, 1.0, 3.0, 0.0]))  # mean 2
    layer.update_routing_bias()
    torch.testing.assert_close(layer.route_bias, torch.tensor([-0.1, 0.1, -0.1, 0.1]))
    assert not layer.step_load.any()
    layer.update_routing_bias(load=torch.tensor([2.0, 2.0, 2.0, 2.0]))  # balanced: sign 0
    torch.testing.assert_close(layer.route_bias, torch.tensor([-0.1, 0.1, -0.1, 0.1]))
    off = build_layer(moe_config(bias_update=0.0))
    off.step_load.fill_(3.0)
    off.update_routing_bias()
    assert not off.route_bias.any() and not off.step_load.any()


def test_training_forward_accumulates_step_load_of_chosen_assignments():
    layer = build_layer(moe_config(capacity_factor=0.5)).train()
    x = tokens()
    layer(x[None])
    torch.testing.assert_close(layer.step_load, layer.route(x).chosen_counts.float())  # before the capacity cut


def test_routing_bias_changes_the_choice_but_not_the_weights():
    layer = build_layer(moe_config(top_k=1, normalize=False))
    x = tokens(n=8)
    before = layer.route(x)
    probs = before.probs
    unpicked = int(probs[0].argmin())
    layer.route_bias[unpicked] = 10.0
    after = layer.route(x)
    assert set(after.token[after.counts[:unpicked].sum():][: after.counts[unpicked]].tolist()) == set(range(8))
    weights = torch.zeros(8)
    weights[after.token] = after.weight
    torch.testing.assert_close(weights, probs[:, unpicked])  # the unbiased score of the expert the bias forced


def moe_model(seed: int = 0, n_layer: int = 2, **moe) -> GPT:
    config = preset("moe-tiny", n_layer=n_layer)
    config = dataclasses.replace(config, moe=dataclasses.replace(config.moe, **moe))
    torch.manual_seed(seed)
    return GPT(config)


def batch(B: int = 2, T: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 512, (B, T + 1), generator=generator)
    return idx[:, :-1].clone(), idx[:, 1:].clone()


def test_gpt_training_loss_is_cross_entropy_plus_the_layers_aux_losses():
    model = moe_model(aux_loss=0.01, z_loss=0.001).train()
    idx, targets = batch()
    targets[0, :5] = -100
    logits, loss = model(idx, targets)
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
    layers = model.moe_layers()
    stats = [layer.pop_stats() for layer in layers]
    aux = sum(0.01 * s["balance"] + 0.001 * s["z"] for s in stats)
    torch.testing.assert_close(loss, ce + aux)
    torch.testing.assert_close(model.last_aux_loss, aux)
    _, summed = model(idx, targets, loss_reduction="sum")
    ce_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(summed, ce_sum + aux * 27)  # 32 targets, 5 ignored
    (loss - ce).backward()
    assert all(layer.router.weight.grad.abs().sum() > 0 for layer in layers)  # the aux loss reaches every router


def test_gpt_adds_no_aux_loss_in_eval_or_without_targets_or_gradients():
    model = moe_model().eval()
    idx, targets = batch()
    logits, loss = model(idx, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)))
    assert model.last_aux_loss is None
    model.train()
    assert model(idx)[1] is None and model.last_aux_loss is None
    with torch.no_grad():
        logits, loss = model(idx, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)))


def loss_and_grads(model: GPT, forward=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    idx, targets = batch()
    _, loss = (model if forward is None else forward)(idx, targets)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def assert_same_run(a, b, atol=1e-5):
    torch.testing.assert_close(a[0], b[0], atol=atol, rtol=atol)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], atol=atol, rtol=atol, msg=name)


def test_activation_checkpointing_gives_the_same_loss_grads_and_counts_statistics_once():
    plain, checkpointed = moe_model(z_loss=0.001).train(), moe_model(z_loss=0.001).train()
    checkpointed.set_activation_checkpointing(True)
    assert_same_run(loss_and_grads(plain), loss_and_grads(checkpointed))
    for a, b in zip(plain.moe_layers(), checkpointed.moe_layers()):
        torch.testing.assert_close(a.step_load, b.step_load)
        sa, sb = a.pop_stats(), b.pop_stats()
        assert sb["forwards"].item() == 1.0
        for name in sa:
            torch.testing.assert_close(sa[name], sb[name])


def test_compiled_moe_model_gives_the_eager_loss_and_grads():
    """aot_eager traces what inductor traces (dynamo, AOT autograd, the ops' shape functions: where a float32
    F.grouped_mm failed) in 6 s instead of 50 on 2 cores; inductor's code runs in tests/train/test_moe_training.py."""
    torch._dynamo.reset()
    eager, compiled = moe_model(n_layer=1, z_loss=0.001).train(), moe_model(n_layer=1, z_loss=0.001).train()
    assert_same_run(loss_and_grads(eager), loss_and_grads(compiled, torch.compile(compiled, backend="aot_eager")), atol=1e-4)


def test_bf16_autocast_runs_grouped_experts_and_matches_fp32(monkeypatch):
    layer = build_layer(moe_config()).eval()
    x = tokens()
    with torch.no_grad():
        reference = layer(x[None])
        seen = []
        real = F.grouped_mm
        monkeypatch.setattr(F, "grouped_mm", lambda a, w, **k: seen.append(a.dtype) or real(a, w, **k))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = layer(x[None])
    assert seen == [torch.bfloat16, torch.bfloat16]
    torch.testing.assert_close(low.float(), reference, atol=0.05 * reference.abs().max().item(), rtol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 F.grouped_mm on a GPU needs CUDA")
def test_bf16_grouped_mm_on_cuda_matches_the_fp32_loop():
    grouped, loop = paired_layers(expert_hidden=64)
    grouped, loop = grouped.cuda().eval(), loop.cuda().eval()
    x = tokens(n=256).cuda()
    with torch.no_grad():
        reference = loop(x[None])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = grouped(x[None])
    torch.testing.assert_close(low.float(), reference, atol=0.05 * reference.abs().max().item(), rtol=0.05)


def test_moe_kv_cache_prefill_and_decode_equal_the_full_forward():
    model = moe_model().eval()
    idx, _ = batch(T=20)
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(model.config, batch_size=2)
        steps = [model(idx[:, :12], cache=cache)[0]]
        steps += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_moe_capacity_cuts_in_training_only_so_generation_is_independent_of_the_batch():
    model = moe_model(capacity_factor=0.5).eval()
    idx, _ = batch(T=20)
    with torch.no_grad():
        full, _ = model(idx)
        alone, _ = model(idx[:1])
        cache = KVCache(model.config, batch_size=2)
        steps = [model(idx[:, :12], cache=cache)[0]] + [model(idx[:, t : t + 1], cache=cache)[0] for t in range(12, 20)]
    torch.testing.assert_close(alone, full[:1], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    model.train()
    model(idx)
    assert sum(layer.pop_stats()["dropped"].item() for layer in model.moe_layers()) > 0  # the same batch drops in training


@pytest.mark.parametrize("changes, message", [
    ({"top_k": 5}, "moe.top_k must be between 1 and moe.n_experts (4), got 5"),
    ({"score": "relu"}, "unknown moe.score 'relu'"),
    ({"impl": "fast"}, "unknown moe.impl 'fast'"),
    ({"aux_loss": -0.1}, "moe.aux_loss must be 0 (off) or a positive number, got -0.1"),
    ({"capacity_factor": -1.0}, "moe.capacity_factor must be 0 (off) or a positive number, got -1.0"),
    ({"first_dense": 2}, "moe.first_dense=2 leaves no sparse layer in 2"),
    ({"n_shared": -1}, "moe.n_shared must be 0 or more, got -1"),
    ({"z_loss": -1e-3}, "moe.z_loss must be 0 (off) or a positive number, got -0.001"),
    ({"bias_update": float("nan")}, "moe.bias_update must be 0 (off) or a positive number, got nan"),
    ({"every": 0}, "moe.every must be at least 1"),
])
def test_moe_config_rejects_bad_values_in_one_line(changes, message):
    with pytest.raises(GptlabError) as error:
        moe_config(**changes)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_apply_overrides_builds_the_moe_config():
    config = apply_overrides(TrainConfig(model=preset("llama-tiny"), seq_len=64), ["--model.moe.n-experts", "4", "--model.moe.top-k", "1"])
    assert config.model.moe.n_experts == 4 and config.model.moe.top_k == 1 and config.model.is_moe
    with pytest.raises(GptlabError):
        apply_overrides(TrainConfig(model=preset("llama-tiny"), seq_len=64), ["--model.moe.n-experts", "2", "--model.moe.top-k", "3"])


def test_save_and_load_round_trip_the_moe_config_and_routing_bias(tmp_path):
    model = moe_model(bias_update=0.01, capacity_factor=1.5).eval()
    for layer in model.moe_layers():
        layer.route_bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m").eval()
    assert loaded.config.moe == model.config.moe
    for layer in loaded.moe_layers():
        torch.testing.assert_close(layer.route_bias, torch.tensor([0.1, -0.2, 0.3, 0.0]))
    idx, _ = batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx)[0], model(idx)[0])


@pytest.mark.parametrize("n_layer, first_dense, every, expected", [
    (6, 1, 2, "FFTFTF"), (4, 0, 1, "TTTT"), (4, 3, 1, "FFFT"), (6, 0, 3, "FFTFFT"),
])
def test_sparse_layers_rule_by_example(n_layer, first_dense, every, expected):
    config = dataclasses.replace(preset("llama-tiny"), n_layer=n_layer, moe=MoEConfig(n_experts=4, first_dense=first_dense, every=every))
    assert "".join("T" if s else "F" for s in config.sparse_layers) == expected
    assert not any(preset("llama-tiny").sparse_layers)
    model = GPT(config)
    assert len(model.moe_layers()) == expected.count("T")


@pytest.mark.parametrize("changes, flag", [({"top_k": 5}, "--model.moe.top-k"), ({"expert_hidden": 64}, "--model.moe.expert-hidden"),
                                           ({"score": "sigmoid"}, "--model.moe.score"), ({"aux_loss": 0.0}, "--model.moe.aux-loss")])
def test_moe_settings_of_a_dense_model_are_refused_naming_the_flag(changes, flag):
    with pytest.raises(GptlabError) as error:
        MoEConfig(**changes)
    name = next(iter(changes))
    assert str(error.value) == (f"moe.{name} {changes[name]} does nothing in a dense model (moe.n_experts 0): set "
                                f"--model.moe.n-experts N for a mixture of experts, or leave out {flag}")
    assert MoEConfig(n_experts=8, **changes).n_experts == 8  # with experts they are settings
