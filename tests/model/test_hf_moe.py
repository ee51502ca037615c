"""Qwen3-MoE and Mixtral both ways, checked against transformers itself: the same logits, the same greedy ids through
the KV cache, round trips, and a clear refusal of what neither class computes."""

import json
from dataclasses import replace

import pytest
import torch
import transformers  # a dev extra: make test installs it

from gptlab.infer import SamplingConfig, generate
from gptlab.model import GPT, preset
from gptlab.model.hf import export_hf, load_pretrained_directory, native_architecture
from gptlab.runtime import GptlabError

SHAPES = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, max_position_embeddings=64)


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Every weight random and large enough that routing differs by token (transformers inits the router at zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))


def hf_qwen3_moe(tmp_path, **changes):
    config = transformers.Qwen3MoeConfig(**{**SHAPES, "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 4,
                                            "num_experts_per_tok": 2, **changes})
    return _saved(transformers.Qwen3MoeForCausalLM(config), tmp_path / "qwen3_moe")


def hf_mixtral(tmp_path, **changes):
    config = transformers.MixtralConfig(**{**SHAPES, "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                           **changes})
    return _saved(transformers.MixtralForCausalLM(config), tmp_path / "mixtral")


def _saved(model, path):
    randomize(model.float())
    model.eval().save_pretrained(path)
    return model, path


def ids(T: int = 12) -> torch.Tensor:
    return torch.randint(0, 96, (2, T), generator=torch.Generator().manual_seed(1))


def assert_same_logits(ours: GPT, reference, idx: torch.Tensor) -> None:
    with torch.no_grad():
        logits, _ = ours.eval()(idx)
        expected = reference.eval()(idx).logits
    assert expected.std() > 0.1  # not a degenerate model
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                         eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_load_hf_moe_matches_transformers_logits_and_greedy_generation(tmp_path, family):
    reference, path = (hf_qwen3_moe if family == "qwen3_moe" else hf_mixtral)(tmp_path)
    model = load_pretrained_directory(path)
    assert model.config.is_moe and all(model.config.sparse_layers)
    assert model.config.moe.normalize is (family == "mixtral")  # Qwen3-MoE's norm_topk_prob defaults to False
    assert_same_logits(model, reference, ids())
    prompt = [3, 14, 15, 92, 65]
    greedy = SamplingConfig(max_new_tokens=8, temperature=0)
    assert generate(model, [prompt], greedy) == [hf_greedy(reference, prompt, 8)]


@pytest.mark.parametrize("changes, sparse, first_dense, every", [
    (dict(mlp_only_layers=[0]), (False, True, True), 1, 1),
    (dict(decoder_sparse_step=2), (False, True, False), 0, 2),
])
def test_load_hf_qwen3_moe_dense_layers_map_to_first_dense_and_every(tmp_path, changes, sparse, first_dense, every):
    reference, path = hf_qwen3_moe(tmp_path, num_hidden_layers=3, norm_topk_prob=True, **changes)
    model = load_pretrained_directory(path)
    assert model.config.sparse_layers == sparse
    assert (model.config.moe.first_dense, model.config.moe.every, model.config.hidden_dim) == (first_dense, every, 48)
    assert_same_logits(model, reference, ids())


def test_load_hf_moe_reads_transformers_fused_expert_names(tmp_path):
    """The in-memory names (experts.gate_up_proj, Mixtral's mlp.gate), as a state_dict saved by hand holds them."""
    from safetensors.torch import save_file

    reference, path = hf_mixtral(tmp_path)
    state = {name: tensor.contiguous() for name, tensor in reference.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, path / "model.safetensors")
    assert_same_logits(load_pretrained_directory(path), reference, ids())


@pytest.mark.parametrize("changes, key", [
    (dict(mlp_only_layers=[1], num_hidden_layers=3), "mlp_only_layers"),
    (dict(use_sliding_window=True, sliding_window=4), "use_sliding_window"),
])
def test_load_hf_qwen3_moe_refuses_what_gptlab_cannot_compute(tmp_path, changes, key):
    _, path = hf_qwen3_moe(tmp_path, **changes)
    with pytest.raises(GptlabError, match=key):
        load_pretrained_directory(path)


def test_load_hf_mixtral_refuses_router_jitter(tmp_path):
    _, path = hf_mixtral(tmp_path, router_jitter_noise=0.1)
    with pytest.raises(GptlabError, match="router_jitter_noise"):
        load_pretrained_directory(path)


def moe_model(seed: int = 0, qk_norm: bool = True, **moe) -> GPT:
    config = preset("moe-tiny", vocab_size=96, qk_norm=qk_norm)
    model = GPT(replace(config, moe=replace(config.moe, **moe)))
    randomize(model, seed)
    for layer in model.moe_layers():
        layer.route_bias.zero_()  # a buffer randomize leaves alone; zero: no routing bias in use
    return model.eval()


@pytest.mark.parametrize("qk_norm, first_dense, architecture", [
    (True, 0, "Qwen3MoeForCausalLM"), (True, 1, "Qwen3MoeForCausalLM"), (False, 0, "MixtralForCausalLM")])
def test_export_hf_moe_loads_in_transformers_with_equal_logits_and_round_trips(tmp_path, qk_norm, first_dense, architecture):
    # Qwen3-MoE also takes unnormalised weights and dense layers (mlp_only_layers); Mixtral neither
    model = moe_model(qk_norm=qk_norm, normalize=not qk_norm, first_dense=first_dense)
    assert native_architecture(model.config) == architecture
    export_hf(model, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [architecture]
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert type(reference).__name__ == architecture
    assert_same_logits(model, reference, ids())
    prompt = [5, 8, 13, 21]
    assert generate(model, [prompt], SamplingConfig(max_new_tokens=6, temperature=0)) == [hf_greedy(reference, prompt, 6)]
    back = load_pretrained_directory(tmp_path / "hf")
    assert back.config == model.config
    assert_same_weights(model, back)


def assert_same_weights(model: GPT, back: GPT) -> None:
    """Every tensor equal, the embedding tables up to vocab_size (their pad rows are never used and load as zeros)."""
    rows = model.config.vocab_size
    for (name, ours), (_, theirs) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        if name in ("transformer.wte.weight", "lm_head.weight"):
            ours, theirs = ours[:rows], theirs[:rows]
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("moe, option", [(dict(score="sigmoid"), "moe.score"), (dict(n_shared=1), "moe.n_shared"),
                                         (dict(capacity_factor=1.0), "moe.capacity_factor")])
def test_export_hf_moe_refuses_what_no_class_computes_before_writing(tmp_path, moe, option):
    model = moe_model(**moe)
    with pytest.raises(GptlabError, match=option):
        export_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_hf_moe_refuses_a_routing_bias_in_use(tmp_path):
    model = moe_model()
    model.moe_layers()[0].route_bias[1] = 0.5
    with pytest.raises(GptlabError, match="routing bias"):
        export_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
