"""The model core: attention paths proven equal, the KV cache, padded vocab and loss, init, GQA, RoPE, save/load."""

import math

import pytest
import torch
import torch.nn.functional as F

from gptlab.model import GPT, KVCache, ModelConfig, preset
from gptlab.model.gpt import apply_rotary, rotary_tables
from gptlab.model.io import WEIGHTS_NAME, load_model, save_model
from gptlab.runtime import GptlabError

CONFIGS = {
    "gpt2": lambda **changes: preset("gpt2-tiny", **changes),
    "llama-gqa-qknorm": lambda **changes: preset("llama-tiny", qk_norm=True, **changes),  # 4 query heads, 2 kv heads
}


def build(config: ModelConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def ids(config: ModelConfig, B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (B, T), generator=generator)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_gpt_sdpa_equals_math_reference(name, training):
    config = CONFIGS[name]()
    model = build(config).train(training)
    idx = ids(config, T=config.block_size)
    sdpa, sdpa_loss = model.set_attention("sdpa")(idx, idx)
    math_logits, math_loss = model.set_attention("math")(idx, idx)
    torch.testing.assert_close(sdpa, math_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(sdpa_loss, math_loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_gpt_kv_cache_prefill_and_decode_equal_full_forward(name, impl):
    config = CONFIGS[name]()
    model = build(config).eval().set_attention(impl)
    idx = ids(config, T=20)
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(config, batch_size=2)
        steps = [model(idx[:, :12], cache=cache)[0]]  # prefill 12 tokens, then decode one at a time
        steps += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert cache.length == 20


def test_gpt_padded_vocab_logits_and_loss_cover_only_the_real_vocab():
    config = preset("gpt2-tiny", vocab_size=500)  # padded to 512 rows
    model = build(config)
    assert model.lm_head.weight.shape[0] == config.padded_vocab_size == 512
    idx = ids(config)
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 16, 500)
    flat = logits.reshape(-1, 500)
    by_hand = (torch.logsumexp(flat, dim=-1) - flat.gather(1, idx.reshape(-1, 1)).squeeze(1)).mean()
    torch.testing.assert_close(loss, by_hand)
    torch.testing.assert_close(loss, F.cross_entropy(flat, idx.reshape(-1)))


@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_gpt_loss_excludes_ignored_targets(ignore_index):
    config = preset("gpt2-tiny")
    model = build(config)
    idx = ids(config)
    targets = idx.clone()
    targets[0, :5] = ignore_index
    targets[1, 10:] = ignore_index
    logits, loss = model(idx, targets, ignore_index=ignore_index)
    keep = targets != ignore_index  # 11 + 10 positions
    kept_logits, kept_targets = logits[keep], targets[keep]
    per_token = torch.logsumexp(kept_logits, dim=-1) - kept_logits.gather(1, kept_targets[:, None]).squeeze(1)
    assert per_token.numel() == 21
    torch.testing.assert_close(loss, per_token.sum() / 21)


def test_gpt_embeddings_tied_for_gpt2_and_separate_for_llama():
    gpt2 = build(preset("gpt2-tiny"))
    assert gpt2.lm_head.weight is gpt2.transformer["wte"].weight
    assert gpt2.lm_head.weight.data_ptr() == gpt2.transformer["wte"].weight.data_ptr()
    llama = build(preset("llama-tiny"))
    assert llama.lm_head.weight.data_ptr() != llama.transformer["wte"].weight.data_ptr()
    assert not torch.equal(llama.lm_head.weight, llama.transformer["wte"].weight)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gpt_init_statistics(arch):
    n_layer = 8
    config = ModelConfig(arch=arch, n_layer=n_layer, n_head=4, n_embd=256, vocab_size=2048, block_size=128,
                         bias=arch == "gpt2", tie_embeddings=arch == "gpt2")
    model = build(config)
    residual_std = 0.02 / math.sqrt(2 * n_layer)  # 0.005: two residual adds per block
    for name, parameter in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert parameter.std().item() == pytest.approx(residual_std, rel=0.05), name
        elif parameter.dim() == 2:
            assert parameter.std().item() == pytest.approx(0.02, rel=0.05), name
        elif name.endswith("bias"):
            assert torch.count_nonzero(parameter) == 0, name
        else:  # norm weights
            assert torch.all(parameter == 1), name
        if parameter.dim() == 2:
            assert abs(parameter.mean().item()) < 1e-3, name


def test_gpt_gqa_with_as_many_kv_heads_as_query_heads_is_standard_attention():
    grouped = build(preset("llama-tiny", n_kv_head=4))
    standard = GPT(preset("llama-tiny", n_kv_head=None))
    standard.load_state_dict(grouped.state_dict())
    idx = ids(grouped.config)
    torch.testing.assert_close(grouped(idx)[0], standard(idx)[0], atol=0, rtol=0)


def test_gpt_gqa_equals_multi_head_attention_with_repeated_kv_weights():
    grouped = build(preset("llama-tiny", qk_norm=True))  # n_head 4, n_kv_head 2, head_dim 8
    standard = GPT(preset("llama-tiny", qk_norm=True, n_kv_head=None))
    H, K, D = 4, 2, 8
    state = grouped.state_dict()
    for layer in range(grouped.config.n_layer):
        key = f"transformer.h.{layer}.attn.c_attn.weight"
        q, k, v = state[key].split([H * D, K * D, K * D])
        # kv head j serves query heads j*(H/K) .. (j+1)*(H/K)-1: repeat each head's D rows H/K times
        k, v = (w.view(K, D, -1).repeat_interleave(H // K, dim=0).reshape(H * D, -1) for w in (k, v))
        state[key] = torch.cat([q, k, v])
    standard.load_state_dict(state)
    idx = ids(grouped.config)
    torch.testing.assert_close(grouped(idx)[0], standard(idx)[0], atol=1e-5, rtol=0)


def test_rotary_score_depends_only_on_relative_position():
    config = preset("llama-tiny")  # head_dim 8, block 64
    cos, sin = rotary_tables(config)
    torch.manual_seed(0)
    q, k = torch.randn(config.head_dim), torch.randn(config.head_dim)
    T = config.block_size
    rotated_q = apply_rotary(q.expand(1, 1, T, -1), cos[None, None], sin[None, None])[0, 0]  # q at every position
    rotated_k = apply_rotary(k.expand(1, 1, T, -1), cos[None, None], sin[None, None])[0, 0]
    scores = rotated_q @ rotated_k.T  # scores[m, n] = <R_m q, R_n k>
    for offset in (-7, 0, 3, 20):
        diagonal = torch.diagonal(scores, offset=offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, 3)[0])
    torch.testing.assert_close(rotated_q[0], q)  # position 0 is the identity
    torch.testing.assert_close(rotated_q.norm(dim=-1), q.norm().expand(T))  # a rotation keeps lengths


def test_rotary_matches_complex_rotation_in_rotate_half_layout():
    config = preset("llama-tiny", rope_theta=500.0)
    cos, sin = rotary_tables(config)
    D, half = config.head_dim, config.head_dim // 2
    torch.manual_seed(0)
    x = torch.randn(1, 1, config.block_size, D)
    # Pair i with i + D/2 as the complex number x_i + j x_{i+D/2}, rotated by position * theta^(-2i/D).
    positions = torch.arange(config.block_size, dtype=torch.float64)[:, None]
    angles = positions * 500.0 ** (-2 * torch.arange(half, dtype=torch.float64) / D)
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(torch.ones_like(angles), angles)
    expected = torch.cat([pairs.real, pairs.imag], dim=-1).float()
    torch.testing.assert_close(apply_rotary(x, cos[None, None], sin[None, None]), expected, atol=1e-4, rtol=1e-4)


def test_gpt_rejects_a_sequence_longer_than_the_context():
    config = preset("gpt2-tiny")
    model = build(config)
    with pytest.raises(GptlabError, match="sequence of 65 tokens is longer than the context \\(64\\)"):
        model(ids(config, T=65))
    cache = KVCache(config, batch_size=2)
    model(ids(config, T=60), cache=cache)
    with pytest.raises(GptlabError, match="sequence of 65 tokens"):
        model(ids(config, T=5), cache=cache)


def test_gpt_check_ids_rejects_ids_outside_the_vocabulary():
    model = build(preset("gpt2-tiny", vocab_size=500))
    model.check_ids(torch.tensor([[0, 499]]))
    with pytest.raises(GptlabError, match="token id 500 is outside the vocabulary \\(0..499\\)"):
        model.check_ids(torch.tensor([[3, 500]]))  # a padded row: the embedding lookup would not fail
    with pytest.raises(GptlabError, match="token id -1"):
        model.check_ids(torch.tensor([[-1, 3]]))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: preset("gpt5"), "unknown model preset 'gpt5'"),
        (lambda: preset("gpt2-tiny", n_head=3), "n_embd=32 is not divisible by n_head=3"),
        (lambda: preset("llama-tiny", n_kv_head=3), "n_head=4 is not divisible by n_kv_head=3"),
        (lambda: preset("gpt2-tiny", arch="mamba"), "unknown arch 'mamba'"),
        (lambda: preset("llama-tiny", n_head=32, n_kv_head=None), "even head_dim"),
        (lambda: preset("gpt2-tiny", dropout=1.0), "dropout must be in"),
        (lambda: preset("gpt2-tiny", n_layers=2), "bad override"),
    ],
)
def test_model_config_rejects_bad_settings(make, message):
    with pytest.raises(GptlabError, match=message):
        make()


@pytest.mark.parametrize("name", CONFIGS)
def test_save_and_load_model_round_trip_gives_equal_logits(name, tmp_path):
    model = build(CONFIGS[name]()).eval()
    save_model(model, tmp_path / "model")
    loaded = load_model(tmp_path / "model").eval()
    assert loaded.config == model.config
    idx = ids(model.config)
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], atol=0, rtol=0)
    if model.config.tie_embeddings:
        assert loaded.lm_head.weight.data_ptr() == loaded.transformer["wte"].weight.data_ptr()


def test_load_model_names_a_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    save_model(build(preset("gpt2-tiny")), tmp_path)
    state = load_file(tmp_path / WEIGHTS_NAME)
    del state["transformer.h.1.mlp.c_fc.weight"]
    save_file(state, tmp_path / WEIGHTS_NAME)
    with pytest.raises(GptlabError, match="missing keys: transformer.h.1.mlp.c_fc.weight"):
        load_model(tmp_path)
