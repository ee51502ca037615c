"""The fused Triton RMSNorm equals gptlab's RMSNorm module: output, dx and the weight's gradient."""

import pytest
import torch

from gptlab.kernels import triton_rms_norm
from gptlab.model.gpt import RMSNorm


def norm_outputs_and_grads(norm, x: torch.Tensor, weight: torch.Tensor, seed: int = 2):
    """norm(x, weight) and the gradients of x and weight for a fixed random upstream gradient."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    out = norm(x, weight)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device, out.dtype)
    return [out.detach(), *torch.autograd.grad(out, (x, weight), grad_out)]


def inputs(shape, x_dtype=torch.float32, weight_dtype=torch.float32, device="cpu"):
    generator = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(shape, generator=generator)).to(device, x_dtype)
    weight = (1 + 0.5 * torch.randn(shape[-1], generator=generator)).to(device, weight_dtype)
    return x, weight


def reference_outputs_and_grads(x, weight):
    """gptlab.model.gpt.RMSNorm's forward with `weight` as its weight, and autograd's gradients through it."""
    def norm(x, weight):
        module = RMSNorm(x.shape[-1], 1e-5)
        del module.weight  # the parameter, replaced by the tensor whose gradient we want
        module.weight = weight
        return module(x)

    return norm_outputs_and_grads(norm, x, weight)


@pytest.mark.parametrize("shape", [(3, 5, 24), (7, 64)], ids=["rows-of-24", "rows-of-64"])
def test_triton_rms_norm_equals_the_module_in_float32(triton_device, shape):
    x, weight = inputs(shape, device=triton_device)
    ours = norm_outputs_and_grads(lambda x, w: triton_rms_norm(x, w, 1e-5), x, weight)
    for name, a, b in zip(["out", "dx", "dweight"], ours, reference_outputs_and_grads(x, weight)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_triton_rms_norm_backward_with_fewer_programs_than_rows_sums_their_partial_weight_gradients(triton_device, monkeypatch):
    """3 programs for 15 rows: each walks every third row and keeps its own partial dweight."""
    from gptlab.kernels import triton_rmsnorm

    monkeypatch.setattr(triton_rmsnorm, "PARTIALS", 3)
    x, weight = inputs((15, 24), device=triton_device)
    ours = norm_outputs_and_grads(lambda x, w: triton_rms_norm(x, w, 1e-5), x, weight)
    for a, b in zip(ours, reference_outputs_and_grads(x, weight)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["fp32-weight", "bf16-weight"])
def test_triton_rms_norm_of_bfloat16_rounds_as_the_module_does(triton_device, weight_dtype):
    """bf16 activations (autocast) with a float32 or bf16 weight: the same output dtype, the same rounded values."""
    x, weight = inputs((4, 40), torch.bfloat16, weight_dtype, device=triton_device)
    ours = norm_outputs_and_grads(lambda x, w: triton_rms_norm(x, w, 1e-5), x, weight)
    reference = reference_outputs_and_grads(x, weight)
    assert [t.dtype for t in ours] == [t.dtype for t in reference]
    # the output within a bfloat16 rounding step (2^-7 relative), or two in the interpreter, which rounds float32 to
    # bfloat16 by cutting bits off where a GPU rounds to nearest (triton 3.9), once for the normalised x, once for y
    steps = 2 if x.device.type == "cpu" else 1
    torch.testing.assert_close(ours[0], reference[0], atol=0, rtol=steps * 2**-7)
    for a, b in zip(ours[1:], reference[1:]):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_rms_norm_compiled_on_cuda_equals_the_module_at_realistic_sizes(triton_device, x_dtype):
    x, weight = inputs((1000, 768), x_dtype, torch.float32, device="cuda")
    ours = norm_outputs_and_grads(lambda x, w: triton_rms_norm(x, w, 1e-5), x, weight)
    tolerance = dict(atol=1e-4, rtol=1e-4) if x_dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for a, b in zip(ours, reference_outputs_and_grads(x, weight)):
        torch.testing.assert_close(a.float(), b.float(), **tolerance)
