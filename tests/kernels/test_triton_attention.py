"""The Triton FlashAttention-2 kernels equal SDPA and the PyTorch FlashAttention-2 in values and gradients.

On CPU they run in Triton's interpreter, on a GPU compiled (conftest.py): the same tests, tiny shapes;
the cuda test adds realistic ones.
"""

import pytest
import torch
import torch.nn.functional as F

from gptlab.kernels import flash_attention, triton_flash_attention
from gptlab.kernels.triton_support import check_launchable
from gptlab.runtime import GptlabError
from tests.kernels.conftest import output_and_grads, qkv, window_mask


def assert_all_close(ours, reference, **tolerance):
    for name, a, b in zip(["out", "dq", "dk", "dv"], ours, reference):
        torch.testing.assert_close(a, b, **tolerance, msg=lambda m, name=name: f"{name}: {m}")


def float32_tolerance(device: torch.device) -> dict:
    """Interpreted, the kernels sum as the references do, up to order; a GPU's SDPA picks its own kernels."""
    return dict(atol=2e-6, rtol=1e-5) if device.type == "cpu" else dict(atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("T", [16, 33])
def test_triton_attention_equals_sdpa_and_flash_attention(triton_device, causal, T):
    q, k, v = qkv(T, device=triton_device)
    ours = output_and_grads(lambda *x: triton_flash_attention(*x, causal=causal, block_m=16, block_n=16), q, k, v)
    sdpa = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal), q, k, v)
    flash = output_and_grads(lambda *x: flash_attention(*x, causal=causal, block_q=16, block_k=16), q, k, v)
    assert_all_close(ours, sdpa, **float32_tolerance(triton_device))
    assert_all_close(ours, flash, **float32_tolerance(triton_device))


def test_triton_attention_handles_unequal_tiles_a_narrow_head_and_more_keys(triton_device):
    """Query tiles of 16 and key tiles of 32 (causal), head_dim 8 (padded to 16 columns), S > T (not causal)."""
    q, k, v = qkv(33, D=8, B=1, device=triton_device)
    ours = output_and_grads(lambda *x: triton_flash_attention(*x, causal=True, block_m=16, block_n=32), q, k, v)
    sdpa = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True), q, k, v)
    assert_all_close(ours, sdpa, **float32_tolerance(triton_device))
    q, k, v = qkv(17, 40, B=1, H=1, device=triton_device)
    ours = output_and_grads(lambda *x: triton_flash_attention(*x, causal=False, block_m=16, block_n=16), q, k, v)
    sdpa = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x), q, k, v)
    assert_all_close(ours, sdpa, **float32_tolerance(triton_device))


@pytest.mark.parametrize(("window", "block_n"), [(5, 16), (20, 32)])
def test_triton_attention_with_a_sliding_window_equals_sdpa_and_flash_attention(triton_device, window, block_n):
    q, k, v = qkv(33, B=1, device=triton_device)
    ours = output_and_grads(lambda *x: triton_flash_attention(*x, window=window, block_m=16, block_n=block_n), q, k, v)
    mask = window_mask(33, window, triton_device)
    sdpa = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, attn_mask=mask), q, k, v)
    flash = output_and_grads(lambda *x: flash_attention(*x, window=window, block_q=16, block_k=block_n), q, k, v)
    assert_all_close(ours, sdpa, **float32_tolerance(triton_device))
    assert_all_close(ours, flash, **float32_tolerance(triton_device))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_triton_attention_in_half_precision_keeps_the_dtype_and_matches_float32(triton_device, dtype):
    if triton_device.type == "cpu" and dtype == torch.bfloat16:
        with pytest.raises(GptlabError, match="interpreter multiplies bfloat16 matrices wrongly"):
            triton_flash_attention(*qkv(16, dtype=dtype))
        return
    exact = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True), *qkv(33, B=1, device=triton_device))
    q, k, v = qkv(33, B=1, dtype=dtype, device=triton_device)
    ours = output_and_grads(lambda *x: triton_flash_attention(*x, causal=True, block_m=16, block_n=16), q, k, v)
    assert all(tensor.dtype == dtype for tensor in ours)
    assert_all_close([tensor.float() for tensor in ours], exact, atol=3e-2, rtol=3e-2)


def test_triton_kernels_compiled_refuse_cpu_tensors_and_say_what_to_do():
    """A compiled kernel (here any function the interpreter did not build) cannot take a CPU tensor."""
    with pytest.raises(GptlabError, match="use a CUDA device, or set TRITON_INTERPRET=1"):
        check_launchable(torch.zeros(2), lambda: None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("causal", "window"), [(True, 0), (False, 0), (True, 100)], ids=["causal", "full", "window"])
def test_triton_attention_compiled_on_cuda_equals_sdpa_at_realistic_sizes(triton_device, dtype, causal, window):
    """T 300 (not a multiple of the default 64-row tiles), head_dim 64, default tiles; against a float64 SDPA."""
    q, k, v = qkv(300, B=2, H=3, D=64, dtype=dtype, device="cuda")
    ours = output_and_grads(lambda *x: triton_flash_attention(*x, causal=causal, window=window), q, k, v)
    mask = window_mask(300, window, "cuda") if window else None
    exact = output_and_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal and not window, attn_mask=mask),
                             *[tensor.detach().double().requires_grad_() for tensor in (q, k, v)])
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    assert_all_close([tensor.double() for tensor in ours], exact, **tolerance)
