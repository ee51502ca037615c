"""The architecture switches, each against a float64 model spelled out by hand from the same weights,
and each alone: relu2, rotary / RMSNorm / QK-norm on gpt2, softcap, zero init, sliding windows."""

import math

import pytest
import torch
import torch.nn.functional as F

from gptlab.model import GPT, KVCache, ModelConfig, preset
from gptlab.model.gpt import causal_mask, sliding_window_mask
from gptlab.model.io import load_model, save_model
from gptlab.model.mlp import MLP
from gptlab.runtime import GptlabError

EVERY_SWITCH = dict(position="rotary", norm="rms", activation="relu2", qk_norm=True, tie_embeddings=False,
                    logit_softcap=15.0, zero_init=True, attn_window=4, window_pattern="SSL", n_layer=4)

CONFIGS = {
    "gpt2-relu2": lambda: preset("gpt2-tiny", activation="relu2"),
    "gpt2-rotary-rms": lambda: preset("gpt2-tiny", position="rotary", norm="rms"),
    "gpt2-qk-norm-untied": lambda: preset("gpt2-tiny", qk_norm=True, tie_embeddings=False),
    "gpt2-softcap": lambda: preset("gpt2-tiny", logit_softcap=2.0),
    "gpt2-window": lambda: preset("gpt2-tiny", n_layer=3, attn_window=5, window_pattern="SL"),
    "gpt2-window-sssl": lambda: preset("gpt2-tiny", n_layer=5, attn_window=3, window_pattern="SSSL"),
    "llama-window-gelu-learned": lambda: preset("llama-tiny", attn_window=4, window_pattern="S", activation="gelu",
                                                position="learned", norm="layer"),
    "gpt2-every-switch": lambda: preset("gpt2-tiny", **{**EVERY_SWITCH, "zero_init": False}),
    "llama-every-switch": lambda: preset("llama-tiny", **{**EVERY_SWITCH, "zero_init": False, "activation": "swiglu"}),
}


def build(config: ModelConfig, seed: int = 0, perturb: bool = True) -> GPT:
    """A model whose norms and biases are perturbed too, so a swapped or dropped one shows in the logits."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    if perturb:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
    return model


def ids(config: ModelConfig, B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the reference: the model by hand, in float64


def norm(x, w, name, config):
    if config.norm_kind == "rms":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + config.norm_eps) * w[f"{name}.weight"]
    centred = x - x.mean(-1, keepdim=True)
    y = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + config.norm_eps) * w[f"{name}.weight"]
    return y + w[f"{name}.bias"] if f"{name}.bias" in w else y


def linear(x, w, name):
    y = x @ w[f"{name}.weight"].T
    return y + w[f"{name}.bias"] if f"{name}.bias" in w else y


def rotate(x, config):
    """Pair i with i + D/2 as the complex number x_i + j x_{i+D/2}; rotate by position * theta^(-2i/D)."""
    T, D = x.shape[-2], x.shape[-1]
    angles = torch.arange(T, dtype=torch.float64)[:, None] * config.rope_theta ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    pairs = torch.complex(x[..., : D // 2], x[..., D // 2 :]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([pairs.real, pairs.imag], dim=-1)


def attention(x, w, p, config, window):
    B, T, _ = x.shape
    H, K, D = config.n_head, config.kv_heads, config.head_dim
    q, k, v = linear(x, w, p + "attn.c_attn").split([H * D, K * D, K * D], dim=-1)
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
    if config.qk_norm:
        q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + config.norm_eps) * w[p + "attn.q_norm.weight"]
        k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + config.norm_eps) * w[p + "attn.k_norm.weight"]
    if config.position_kind == "rotary":
        q, k = rotate(q, config), rotate(k, config)
    k, v = k[:, [h * K // H for h in range(H)]], v[:, [h * K // H for h in range(H)]]  # query head h uses kv head h // (H/K)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & (j > i - window if window else True)  # the banded-causal mask, written out
    scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~allowed, float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
    return linear(y, w, p + "attn.c_proj")


def mlp(x, w, p, config):
    h = linear(x, w, p + "mlp.c_fc")
    if config.activation_kind == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        h = gate * torch.sigmoid(gate) * up
    elif config.activation_kind == "relu2":
        h = torch.clamp(h, min=0) ** 2
    else:
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    return linear(h, w, p + "mlp.c_proj")


def reference_logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    config = model.config
    w = {name: tensor.double() for name, tensor in model.state_dict().items()}
    x = w["transformer.wte.weight"][idx]
    if config.position_kind == "learned":
        x = x + w["transformer.wpe.weight"][: idx.shape[1]]
    for layer, window in enumerate(config.layer_windows):
        p = f"transformer.h.{layer}."
        x = x + attention(norm(x, w, p + "ln_1", config), w, p, config, window)
        x = x + mlp(norm(x, w, p + "ln_2", config), w, p, config)
    logits = (norm(x, w, "transformer.ln_f", config) @ w["lm_head.weight"].T)[..., : config.vocab_size]
    cap = config.logit_softcap
    return cap * torch.tanh(logits / cap) if cap else logits


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_gpt_with_switches_equals_float64_model_written_out(name, impl):
    config = CONFIGS[name]()
    model = build(config).set_attention(impl)
    idx = ids(config)
    with torch.no_grad():
        logits, _ = model(idx)
    expected = reference_logits(model, idx)
    assert expected.std() > 0.1  # not a degenerate model
    torch.testing.assert_close(logits.double(), expected, atol=2e-5, rtol=0)


# ---------------------------------------------------------------- each switch alone


def test_relu2_mlp_is_relu_squared_between_two_matrices():
    config = preset("gpt2-tiny", activation="relu2", bias=False)
    mlp_module = build(config).transformer["h"][0].mlp
    assert isinstance(mlp_module, MLP) and mlp_module.c_fc.weight.shape == (4 * 32, 32)  # not gated: hidden 4 n_embd
    x = torch.randn(3, 5, 32)
    W1, W2 = mlp_module.c_fc.weight, mlp_module.c_proj.weight
    torch.testing.assert_close(mlp_module(x), torch.relu(x @ W1.T).pow(2) @ W2.T)


def test_logit_softcap_is_cap_tanh_of_the_uncapped_logits():
    plain = build(preset("gpt2-tiny"))
    capped = GPT(preset("gpt2-tiny", logit_softcap=0.5)).eval()
    capped.load_state_dict(plain.state_dict())
    idx = ids(plain.config)
    with torch.no_grad():
        raw, _ = plain(idx)
        logits, loss = capped(idx, idx)
        last, _ = capped(idx, last_only=True)
    assert raw.abs().max() > 1.0  # the cap bites
    torch.testing.assert_close(logits, 0.5 * torch.tanh(raw / 0.5))
    assert logits.abs().max() < 0.5
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 512), idx.reshape(-1)))
    torch.testing.assert_close(last, logits[:, -1:])  # generation sees the capped logits too


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_zero_init_zeroes_output_projections_and_blocks_start_as_identity(name):
    model = build(preset(name, zero_init=True), perturb=False)
    default = build(preset(name), perturb=False)
    for (key, tensor), (_, expected) in zip(model.state_dict().items(), default.state_dict().items(), strict=True):
        if key.endswith("c_proj.weight"):
            assert torch.count_nonzero(tensor) == 0, key
        else:  # the rest is the same draw as without zero_init
            assert torch.equal(tensor, expected), key
    idx = ids(model.config)
    with torch.no_grad():
        logits, _ = model(idx)
        x = model.transformer["wte"](idx)
        if "wpe" in model.transformer:
            x = x + model.transformer["wpe"](torch.arange(idx.shape[1]))
        embedding_only = model.lm_head(model.transformer["ln_f"](x))[..., : model.config.vocab_size]
    torch.testing.assert_close(logits, embedding_only, atol=0, rtol=0)


def test_rotary_and_rms_on_gpt2_have_the_expected_parameters():
    model = GPT(preset("gpt2-tiny", position="rotary", norm="rms"))
    names = {name for name, _ in model.named_parameters()}
    assert "transformer.wpe.weight" not in names
    assert not any(name.endswith("ln_1.bias") or name.endswith("ln_f.bias") for name in names)  # RMSNorm: weight only
    assert model.rope_cos.shape == (64, 16)
    assert "transformer.h.0.attn.c_attn.bias" in names  # the rest stays gpt2: biases, tied head, GELU width
    assert model.lm_head.weight is model.transformer["wte"].weight and model.config.hidden_dim == 128
    learned = GPT(preset("llama-tiny", position="learned"))
    assert learned.transformer["wpe"].weight.shape == (64, 32) and not hasattr(learned, "rope_cos")


def test_switch_defaults_are_the_arch_own():
    for name, expected in [("gpt2-tiny", ("learned", "layer", "gelu", 128)), ("llama-tiny", ("rotary", "rms", "swiglu", 128))]:
        config = preset(name)
        assert (config.position_kind, config.norm_kind, config.activation_kind, config.hidden_dim) == expected
        assert config.layer_windows == (0, 0)
    assert preset("llama-tiny", activation="relu2").hidden_dim == 128  # 4 n_embd, not SwiGLU's 8/3
    assert preset("gpt2-tiny", n_embd=96, n_head=2, activation="swiglu").hidden_dim == 256  # 8/3 x 96, rounded up to 64


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"position": "alibi"}, "unknown position 'alibi'; use one of learned, rotary"),
        ({"norm": "batch"}, "unknown norm 'batch'"),
        ({"activation": "relu"}, "unknown activation 'relu'; use one of gelu, swiglu, relu2"),
        ({"position": "rotary", "n_head": 32}, "rotary embeddings need an even head_dim, got 1"),
        ({"logit_softcap": -1.0}, "logit_softcap must be 0 \\(off\\) or a positive number"),
        ({"attn_window": -2}, "attn_window must be 0"),
        ({"window_pattern": "SSXL"}, "window_pattern must be a string of S .* and L"),
        ({"window_pattern": ""}, "window_pattern must be"),
        ({"window_pattern": "SSSL"}, "has sliding-window \\(S\\) layers but attn_window is 0"),
    ],
)
def test_model_config_rejects_bad_switches(overrides, message):
    with pytest.raises(GptlabError, match=message):
        preset("gpt2-tiny", **overrides)


# ---------------------------------------------------------------- sliding windows


def test_layer_windows_cycle_the_pattern_and_end_full():
    assert preset("gpt2-tiny", n_layer=6, attn_window=8, window_pattern="SSL").layer_windows == (8, 8, 0, 8, 8, 0)
    assert preset("gpt2-tiny", n_layer=5, attn_window=8, window_pattern="SSSL").layer_windows == (8, 8, 8, 0, 0)
    assert preset("gpt2-tiny", n_layer=3, attn_window=8, window_pattern="S").layer_windows == (8, 8, 0)
    assert preset("gpt2-tiny", n_layer=3, attn_window=8).layer_windows == (0, 0, 0)  # pattern L: no S layer


def test_sliding_window_mask_keeps_the_last_window_allowed_keys():
    T, window = 7, 3
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    banded = (j <= i) & (j > i - window)
    assert torch.equal(sliding_window_mask(causal_mask(T, T), window)[0, 0], banded)
    # queries 5, 6 of a cache holding 7 keys, the first two of them padding: positions count from the first real key
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    expected = torch.tensor([[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(mask, window), expected)


def windowed_and_full_logits(window: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a model whose every layer has a sliding window, and of the same weights attending fully."""
    full = build(preset("gpt2-tiny", n_layer=3))
    windowed = GPT(preset("gpt2-tiny", n_layer=3, attn_window=window, window_pattern="S")).eval()
    windowed.load_state_dict(full.state_dict())
    idx = ids(full.config, T=T)
    with torch.no_grad():
        return windowed(idx)[0], full(idx)[0]


def test_window_as_long_as_the_context_gives_the_full_attention_logits():
    ours, theirs = windowed_and_full_logits(window=64, T=64)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)


def test_window_changes_only_positions_past_the_window():
    ours, theirs = windowed_and_full_logits(window=6, T=20)
    torch.testing.assert_close(ours[:, :6], theirs[:, :6], atol=1e-6, rtol=0)  # positions 0..5 see the same keys
    assert (ours[:, 6:] - theirs[:, 6:]).abs().amax(dim=-1).min() > 1e-4  # every later position differs


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("window", [1, 3, 10])
def test_window_kv_cache_prefill_and_decode_equal_full_forward(impl, window):
    """Prefill 12 tokens (longer than windows 1 and 3), then decode one at a time: the full forward's logits."""
    config = preset("llama-tiny", n_layer=3, attn_window=window, window_pattern="SL")
    model = build(config).set_attention(impl)
    idx = ids(config, T=24)
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(config, batch_size=2)
        steps = [model(idx[:, :12], cache=cache)[0]]
        steps += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(12, 24)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(full.double(), reference_logits(model, idx), atol=2e-5, rtol=0)


# ---------------------------------------------------------------- training and saving


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_training_steps_with_every_switch_lower_the_loss(arch):
    config = preset(f"{arch}-tiny", **EVERY_SWITCH, dropout=0.1)
    model = build(config, perturb=False).train()
    assert model.lm_head.weight is not model.transformer["wte"].weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = ids(config, T=32)
    losses = []
    for _ in range(5):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        for name, parameter in model.named_parameters():
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        if not losses:  # zero-init projections learn from the first step (their inputs are not zero)
            assert all(model.get_parameter(f"transformer.h.{i}.{part}.c_proj.weight").grad.any()
                       for i in range(config.n_layer) for part in ("attn", "mlp"))
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_every_switch_round_trips_through_save_and_load(tmp_path):
    model = build(preset("gpt2-tiny", **EVERY_SWITCH))
    save_model(model, tmp_path / "model")
    loaded = load_model(tmp_path / "model").eval()
    assert loaded.config == model.config and loaded.config.layer_windows == (4, 4, 0, 0)
    idx = ids(model.config)
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx)[0], model(idx)[0], atol=0, rtol=0)
