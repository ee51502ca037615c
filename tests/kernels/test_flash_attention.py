"""FlashAttention-2 in PyTorch (gptlab.kernels.flash_attention) equals F.scaled_dot_product_attention: outputs and
the gradients of q, k and v, causal and not, T not a multiple of the block, in float32, bfloat16 and float64."""

import pytest
import torch
import torch.nn.functional as F

from gptlab.kernels import flash_attention
from gptlab.runtime import GptlabError
from tests.kernels.conftest import output_and_grads, qkv, window_mask


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("T", [16, 33])
@pytest.mark.parametrize(("block_q", "block_k"), [(16, 16), (8, 16), (16, 4), (64, 64)])
def test_flash_attention_equals_sdpa_in_values_and_gradients(causal, T, block_q, block_k):
    q, k, v = qkv(T)
    ours = output_and_grads(lambda *x: flash_attention(*x, causal=causal, block_q=block_q, block_k=block_k), q, k, v)
    reference = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal), q, k, v)
    for name, a, b in zip(["out", "dq", "dk", "dv"], ours, reference):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_flash_attention_equals_sdpa_with_more_keys_than_queries_when_not_causal():
    q, k, v = qkv(20, 33)
    ours = output_and_grads(lambda *x: flash_attention(*x, causal=False, block_q=8, block_k=16), q, k, v)
    reference = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x), q, k, v)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(("window", "block_q", "block_k"), [(1, 8, 8), (5, 8, 8), (12, 16, 4), (20, 8, 16), (40, 16, 16)])
def test_flash_attention_with_a_sliding_window_equals_sdpa_with_the_windowed_mask(window, block_q, block_k):
    """Windows shorter than a tile, across tiles, and longer than the sequence (= plain causal)."""
    q, k, v = qkv(33)
    ours = output_and_grads(lambda *x: flash_attention(*x, window=window, block_q=block_q, block_k=block_k), q, k, v)
    reference = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, attn_mask=window_mask(33, window)), q, k, v)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


def test_flash_attention_scale_is_passed_through():
    q, k, v = qkv(16)
    ours = output_and_grads(lambda *x: flash_attention(*x, scale=0.3, block_q=8, block_k=8), q, k, v)
    reference = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True, scale=0.3), q, k, v)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_attention_bfloat16_is_as_close_to_float32_as_sdpa_in_bfloat16(causal):
    """In bfloat16 neither is exact: ours must be no further from the float32 answer than SDPA's own bfloat16 result."""
    exact = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal), *qkv(33))
    q, k, v = qkv(33, dtype=torch.bfloat16)
    ours = output_and_grads(lambda *x: flash_attention(*x, causal=causal, block_q=16, block_k=16), q, k, v)
    sdpa = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal), q, k, v)
    for a, b, c in zip(ours, sdpa, exact):
        assert a.dtype == torch.bfloat16
        ours_error, sdpa_error = (a.double() - c.double()).abs().max(), (b.double() - c.double()).abs().max()
        assert ours_error <= 1.5 * sdpa_error + 1e-3, (ours_error, sdpa_error)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_attention_passes_gradcheck_in_float64(causal):
    q, k, v = qkv(5, B=1, H=2, D=4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *x: flash_attention(*x, causal=causal, block_q=2, block_k=3), (q, k, v))
    if causal:
        assert torch.autograd.gradcheck(lambda *x: flash_attention(*x, window=2, block_q=2, block_k=3), (q, k, v))


def test_flash_attention_saves_the_output_and_log_sum_exp_not_the_probabilities():
    q, k, v = qkv(33)
    out = flash_attention(q, k, v, block_q=16, block_k=16)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(2, 2, 33, 16)] * 4 + [(2, 2, 33)]  # q, k, v, O and L: no (T, S) matrix
    lse = torch.logsumexp((q @ k.transpose(-2, -1) / 4.0).masked_fill(torch.ones(33, 33).triu(1).bool(), float("-inf")), -1)
    torch.testing.assert_close(saved[-1], lse.detach())


def test_flash_attention_refuses_causal_with_unequal_query_and_key_lengths_and_a_window_without_causal():
    q, k, v = qkv(8, 12)
    with pytest.raises(GptlabError, match="T == S"):
        flash_attention(q, k, v, causal=True)
    with pytest.raises(GptlabError, match="needs causal attention"):
        flash_attention(q, k, v, causal=False, window=4)


def test_flash_attention_under_autocast_takes_mixed_dtypes_as_sdpa_does():
    """QK-norm under bf16 autocast gives float32 q and k beside a bf16 v: both attentions compute in bf16."""
    q, k, v = qkv(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = flash_attention(q, k, v.bfloat16(), block_q=8, block_k=8)
        sdpa = F.scaled_dot_product_attention(q, k, v.bfloat16(), is_causal=True)
    assert ours.dtype == sdpa.dtype == torch.bfloat16
    torch.testing.assert_close(ours, sdpa, atol=2e-2, rtol=2e-2)
