"""Hugging Face interop, checked against transformers itself: same logits, same loss, clear errors."""

import json

import pytest
import torch
import transformers  # a dev extra: make test installs it
from safetensors.torch import load_file, save_file

from gptlab.model import GPT, preset
from gptlab.model.hf import export_hf, from_pretrained, load_hf_gpt2, load_hf_llama
from gptlab.runtime import GptlabError

ATOL = 1e-5


def hf_gpt2(seed: int = 0, **changes):
    """A random GPT2LMHeadModel; norms and biases perturbed too, so a swapped or dropped one shows in the logits."""
    torch.manual_seed(seed)
    settings = dict(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=1000, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**settings, **changes})).eval()
    perturb(model)
    return model


def ours(name: str, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(preset(name, **overrides)).eval()
    perturb(model)
    return model


def perturb(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))


def random_ids(vocab_size: int, T: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, T), generator=torch.Generator().manual_seed(seed))


def max_logit_difference(model: GPT, reference, idx: torch.Tensor) -> float:
    with torch.no_grad():
        logits, _ = model(idx)
        expected = reference(idx).logits
    assert logits.shape == expected.shape
    assert expected.std() > 0.1  # not a degenerate model where everything matches trivially
    return (logits - expected).abs().max().item()


# ---------------------------------------------------------------- loading Hugging Face GPT-2


def test_load_hf_gpt2_matches_transformers_logits(tmp_path):
    reference = hf_gpt2()
    reference.save_pretrained(tmp_path)
    model = load_hf_gpt2(tmp_path)
    assert model.config.padded_vocab_size == 1024 and model.transformer.wte.weight.shape == (1024, 64)
    assert not model.transformer.wte.weight[1000:].any()  # pad rows are zero
    idx = random_ids(1000)
    assert max_logit_difference(model, reference, idx) < ATOL
    assert model(idx)[0].shape == (2, 48, 1000)


def test_load_hf_gpt2_reads_unprefixed_pytorch_bin_with_mask_buffers(tmp_path):
    """The hub's original gpt2 checkpoint: no `transformer.` prefix, attn.bias / masked_bias buffers, a .bin."""
    reference = hf_gpt2(seed=2)
    reference.config.save_pretrained(tmp_path)
    state = {name.removeprefix("transformer."): tensor for name, tensor in reference.state_dict().items()}
    del state["lm_head.weight"]  # tied: old checkpoints store the table once
    for layer in range(2):
        state[f"h.{layer}.attn.bias"] = torch.ones(1, 1, 64, 64).tril()
        state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    assert max_logit_difference(load_hf_gpt2(tmp_path), reference, random_ids(1000)) < ATOL


def test_load_hf_gpt2_loss_matches_transformers_labels(tmp_path):
    reference = hf_gpt2(seed=3)
    reference.save_pretrained(tmp_path)
    model = load_hf_gpt2(tmp_path)
    idx = random_ids(1000)
    with torch.no_grad():
        expected = reference(idx, labels=idx).loss  # transformers shifts labels inside
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
    assert abs(loss.item() - expected.item()) < ATOL


def test_load_hf_gpt2_names_a_missing_key(tmp_path):
    hf_gpt2().save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["transformer.h.1.mlp.c_fc.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(GptlabError, match=r"missing keys: transformer\.h\.1\.mlp\.c_fc\.weight"):
        load_hf_gpt2(tmp_path)


@pytest.mark.parametrize(
    "setting", [{"scale_attn_by_inverse_layer_idx": True}, {"reorder_and_upcast_attn": True}, {"activation_function": "relu"}]
)
def test_load_hf_gpt2_refuses_configs_it_cannot_compute(tmp_path, setting):
    hf_gpt2().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **setting}))
    with pytest.raises(GptlabError, match=next(iter(setting))):
        load_hf_gpt2(tmp_path)


# ---------------------------------------------------------------- exporting


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False}, {"bias": False}])
def test_export_hf_gpt2_loads_in_transformers_with_equal_logits(tmp_path, overrides):
    model = ours("gpt2-tiny", **overrides)
    export_hf(model, tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert max_logit_difference(model, reference, random_ids(512)) < ATOL
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary files left behind


@pytest.mark.parametrize(
    "overrides",
    [{"rope_theta": 500000.0}, {"rope_theta": 500000.0, "bias": True, "tie_embeddings": True}, {"qk_norm": True}],
    ids=["gqa", "bias-tied", "qk-norm"],
)
def test_export_hf_llama_loads_in_transformers_with_equal_logits(tmp_path, overrides):
    model = ours("llama-tiny", **overrides)  # 4 query heads share 2 key/value heads
    assert model.config.kv_heads < model.config.n_head
    export_hf(model, tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    expected_class = "Qwen3ForCausalLM" if model.config.qk_norm else "LlamaForCausalLM"
    assert type(reference).__name__ == expected_class
    assert max_logit_difference(model, reference, random_ids(512)) < ATOL


def test_export_hf_refuses_qk_norm_with_biases(tmp_path):
    with pytest.raises(GptlabError, match="qk_norm=True and bias=True"):
        export_hf(ours("llama-tiny", qk_norm=True, bias=True), tmp_path)


def test_export_hf_gpt2_relu2_is_transformers_relu2_and_loads_back(tmp_path):
    model = ours("gpt2-tiny", activation="relu2", tie_embeddings=False)
    export_hf(model, tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert reference.config.activation_function == "relu2"
    assert max_logit_difference(model, reference, random_ids(512)) < ATOL
    assert load_hf_gpt2(tmp_path).config == model.config


@pytest.mark.parametrize(
    ("name", "overrides", "field"),
    [
        ("gpt2-tiny", {"position": "rotary"}, "position='rotary'"),
        ("gpt2-tiny", {"norm": "rms"}, "norm='rms'"),
        ("gpt2-tiny", {"activation": "swiglu"}, "activation='swiglu'"),
        ("gpt2-tiny", {"qk_norm": True}, "qk_norm=True"),
        ("gpt2-tiny", {"n_kv_head": 1}, "n_kv_head=1"),
        ("gpt2-tiny", {"logit_softcap": 15.0}, "logit_softcap=15.0"),
        ("gpt2-tiny", {"attn_window": 8, "window_pattern": "SL"}, "attn_window=8 \\(window_pattern 'SL'\\)"),
        ("llama-tiny", {"position": "learned"}, "position='learned'"),
        ("llama-tiny", {"norm": "layer"}, "norm='layer'"),
        ("llama-tiny", {"activation": "gelu"}, "activation='gelu'"),
        ("llama-tiny", {"activation": "relu2"}, "activation='relu2'"),
        ("llama-tiny", {"logit_softcap": 30.0}, "logit_softcap=30.0"),
        ("llama-tiny", {"qk_norm": True, "attn_window": 8, "window_pattern": "S"}, "attn_window=8 \\(window_pattern 'S'\\)"),
    ],
)
def test_export_hf_refuses_a_switch_without_hugging_face_equivalent_before_writing(tmp_path, name, overrides, field):
    """gptlab.model.hf writes transformers' own classes only; gptlab.export writes these with custom code (tests/export)."""
    with pytest.raises(GptlabError, match=f"{field} has no Hugging Face equivalent.*gptlab export hf") as error:
        export_hf(ours(name, **overrides), tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_export_hf_exports_switches_that_change_nothing_it_must_compute(tmp_path):
    """zero_init is only an initialisation; a window pattern whose one layer is the (always full) last one is no window."""
    model = ours("gpt2-tiny", zero_init=True, n_layer=1, attn_window=8, window_pattern="S")
    export_hf(model, tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert max_logit_difference(model, reference, random_ids(512)) < ATOL


@pytest.mark.parametrize(
    ("name", "overrides", "load"),
    [("gpt2-tiny", {}, load_hf_gpt2), ("llama-tiny", {"rope_theta": 20000.0}, load_hf_llama),
     ("llama-tiny", {"qk_norm": True, "mlp_hidden": 96, "norm_eps": 1e-6}, load_hf_llama)],
)
def test_export_hf_round_trips_through_load(tmp_path, name, overrides, load):
    model = ours(name, **overrides)
    loaded = load(export_hf(model, tmp_path))
    assert loaded.config == model.config
    expected = model.state_dict()
    for key, tensor in loaded.state_dict().items():
        rows = model.config.vocab_size  # pad rows are not exported
        assert torch.equal(tensor[:rows], expected[key][:rows]), key


# ---------------------------------------------------------------- from_pretrained


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hub"


def test_from_pretrained_explains_how_to_get_an_uncached_hub_model(empty_hub_cache):
    with pytest.raises(GptlabError, match=r"no such model in the local Hugging Face cache.*huggingface-cli download gpt2"):
        from_pretrained("gpt2")


def test_from_pretrained_reads_a_cached_hub_snapshot(empty_hub_cache):
    """The cache layout huggingface_hub writes: models--NAME/refs/main names the snapshot folder."""
    reference = hf_gpt2()
    repo = empty_hub_cache / "models--gpt2"
    reference.save_pretrained(repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    assert max_logit_difference(from_pretrained("gpt2"), reference, random_ids(1000)) < ATOL


def test_from_pretrained_loads_local_hf_and_gptlab_directories(tmp_path):
    from gptlab.model.io import save_model

    model = ours("llama-tiny")
    export_hf(model, tmp_path / "hf")
    save_model(model, tmp_path / "gptlab")
    idx = random_ids(512)
    with torch.no_grad():
        expected = model(idx)[0]
        for directory in ("hf", "gptlab"):
            assert torch.allclose(from_pretrained(tmp_path / directory)(idx)[0], expected, atol=ATOL, rtol=0)


def test_from_pretrained_refuses_a_missing_path(tmp_path):
    with pytest.raises(GptlabError, match="no model at .*: no such folder"):
        from_pretrained(str(tmp_path / "absent"))
