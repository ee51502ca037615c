"""Qwen2 (Qwen2ForCausalLM: Llama with biases on q, k, v alone) both ways, checked against transformers itself:
the same logits, the same greedy ids through the KV cache, and a clear refusal of what we cannot compute."""

import dataclasses
import json

import pytest
import torch
import transformers  # a dev extra: make test installs it

from gptlab.export import export_hf as export_any
from gptlab.infer import SamplingConfig, generate
from gptlab.model import GPT, ModelConfig, preset
from gptlab.model.accounting import param_counts
from gptlab.model.hf import export_hf, load_hf_llama, load_pretrained_directory, read_pretrained_config
from gptlab.model.io import load_model, save_model
from gptlab.runtime import GptlabError

pytestmark = pytest.mark.usefixtures("hf_modules_cache")  # transformers' copy of remote code under tmp (tests/conftest.py)

ATOL = 1e-4
VOCAB = 1000


def hf_qwen2(seed: int = 0, **changes) -> transformers.Qwen2ForCausalLM:
    """A random tiny Qwen2ForCausalLM in fp32; every parameter perturbed, so a dropped bias or norm shows in the logits."""
    settings = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1e6,
                    tie_word_embeddings=True, use_sliding_window=False, bos_token_id=0, eos_token_id=0)
    settings.update(changes)
    config = transformers.Qwen2Config(**settings)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).to(torch.float32).eval()
    perturb(model)
    return model


def perturb(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))


def random_ids(vocab_size: int = VOCAB, T: int = 40) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, T), generator=torch.Generator().manual_seed(1))


def assert_same_logits(model: GPT, reference, idx: torch.Tensor) -> None:
    with torch.no_grad():
        logits, _ = model(idx)
        expected = reference(idx).logits
    assert expected.std() > 0.1  # not a degenerate model that any code matches
    torch.testing.assert_close(logits, expected, rtol=0, atol=ATOL)


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                         eos_token_id=None, min_new_tokens=max_new_tokens)
    return out[0, len(prompt):].tolist()


# ---------------------------------------------------------------- loading Qwen2ForCausalLM


@pytest.mark.parametrize("changes", [
    {},  # tied embeddings, grouped-query attention (2 key/value heads for 4 query heads), rope_theta 1e6
    {"tie_word_embeddings": False},
    {"num_key_value_heads": 4, "rope_theta": 10000.0},  # plain multi-head attention
    {"num_key_value_heads": 1, "tie_word_embeddings": False, "rms_norm_eps": 1e-5},
], ids=["tied-gqa", "untied-gqa", "mha", "mqa-untied"])
def test_load_qwen2_matches_transformers_logits(tmp_path, changes):
    reference = hf_qwen2(**changes)
    reference.save_pretrained(tmp_path)
    model = load_pretrained_directory(tmp_path)
    config = model.config
    assert (config.arch, config.qkv_bias, config.bias, config.qk_norm) == ("llama", True, False, False)
    assert config.tie_embeddings == reference.config.tie_word_embeddings
    assert config.kv_heads == reference.config.num_key_value_heads and config.rope_theta == reference.config.rope_parameters["rope_theta"]
    assert model.transformer.h[0].attn.c_attn.bias is not None and model.transformer.h[0].attn.c_proj.bias is None
    assert model.transformer.h[0].mlp.c_fc.bias is None
    assert read_pretrained_config(tmp_path) == config
    assert_same_logits(model, reference, random_ids())


def test_load_qwen2_kv_cache_generation_equals_transformers_greedy(tmp_path):
    reference = hf_qwen2(seed=3)
    reference.save_pretrained(tmp_path)
    model = load_hf_llama(tmp_path)
    prompt = [5, 9, 2, 7, 300, 11]
    expected = hf_greedy(reference, prompt, 10)
    greedy = SamplingConfig(max_new_tokens=10, temperature=0)
    assert generate(model, [prompt], greedy) == [expected]
    assert generate(model, [prompt], greedy, use_cache=False) == [expected]  # the cache computes what no cache does


@pytest.mark.parametrize("changes, setting", [
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}, "use_sliding_window=True"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_load_qwen2_refuses_settings_it_cannot_compute(tmp_path, changes, setting):
    hf_qwen2(**changes).save_pretrained(tmp_path)
    with pytest.raises(GptlabError, match="unsupported qwen2 config") as error:
        load_pretrained_directory(tmp_path)
    assert setting in str(error.value) and "\n" not in str(error.value)


def test_load_qwen2_refuses_sliding_layer_types(tmp_path):
    hf_qwen2().save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["layer_types"] = ["full_attention", "sliding_attention"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(GptlabError, match=r"layer_types=\['full_attention', 'sliding_attention'\]"):
        read_pretrained_config(tmp_path)


# ---------------------------------------------------------------- the qkv_bias switch and export


def ours(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(preset("llama-tiny", **overrides)).eval()
    perturb(model)
    return model


@pytest.mark.parametrize("overrides", [{"qkv_bias": True}, {"qkv_bias": True, "tie_embeddings": True, "n_kv_head": 1}])
def test_export_qwen2_loads_in_transformers_and_back_with_equal_logits(tmp_path, overrides):
    model = ours(**overrides)
    export_hf(model, tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (saved["architectures"], saved["model_type"]) == (["Qwen2ForCausalLM"], "qwen2")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__ == "Qwen2ForCausalLM"
    idx = random_ids(model.config.vocab_size)
    assert_same_logits(model, theirs, idx)
    back = load_pretrained_directory(tmp_path / "hf")
    assert back.config == model.config
    with torch.no_grad():
        assert torch.equal(back(idx)[0], model(idx)[0])


@pytest.mark.parametrize("name, overrides, architecture", [
    ("llama-tiny", {"qkv_bias": True, "qk_norm": True}, "GptlabForCausalLM"),  # Qwen3 biases o_proj too
    ("llama-tiny", {"qkv_bias": True, "bias": True}, "LlamaForCausalLM"),  # every projection biased anyway
    ("gpt2-tiny", {"qkv_bias": True, "bias": False}, "GPT2LMHeadModel"),  # the other biases exported as zeros
])
def test_export_qkv_bias_elsewhere_gives_transformers_the_same_logits(tmp_path, name, overrides, architecture):
    torch.manual_seed(0)
    model = GPT(preset(name, **overrides)).eval()
    perturb(model)
    written = export_any(model, tmp_path / "hf")
    assert written.architecture == architecture
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    assert_same_logits(model, theirs, random_ids(model.config.vocab_size))


def test_qkv_bias_biases_only_the_fused_qkv_projection_and_counts_its_parameters():
    config = preset("llama-tiny", qkv_bias=True)
    model = GPT(config)
    biased = sorted(name for name, _ in model.named_parameters() if name.endswith(".bias"))
    assert biased == [f"transformer.h.{layer}.attn.c_attn.bias" for layer in range(config.n_layer)]
    assert param_counts(config)["total"] == model.num_params()
    assert param_counts(config)["total"] == param_counts(dataclasses.replace(config, qkv_bias=False))["total"] + 2 * 64


def test_old_model_config_without_qkv_bias_loads_with_it_off(tmp_path):
    """config.json files written before the field existed have no qkv_bias key: they load as they were."""
    model = ours()
    save_model(model, tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    del data["qkv_bias"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    loaded = load_model(tmp_path)
    assert loaded.config.qkv_bias is False and loaded.config == model.config
    assert ModelConfig().qkv_bias is False
