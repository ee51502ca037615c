"""Where the Triton kernels run in the tests: compiled on a CUDA GPU, or in Triton's interpreter on CPU tensors.

Triton decides between compiling and interpreting as each `@triton.jit` function is defined, its own library
(tl.zeros, tl.sum, ...) included, so TRITON_INTERPRET=1 must be set before anything imports triton: it is set
here, as pytest collects this folder, and only on a machine without CUDA. There Triton can do nothing but
interpret, so the variable changes nothing else, in this process or in the ones the other tests start (torch
reads it only on its GPU paths). On a GPU it is left alone and the same tests run compiled, on CUDA tensors.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def qkv(T: int, S: int | None = None, *, B: int = 2, H: int = 2, D: int = 16, dtype=torch.float32, seed: int = 0,
        device="cpu"):
    """Random q (B, H, T, D), k and v (B, H, S, D) that require gradients."""
    generator = torch.Generator().manual_seed(seed)
    S = T if S is None else S
    shapes = [(B, H, T, D), (B, H, S, D), (B, H, S, D)]
    return [torch.randn(shape, generator=generator, dtype=torch.float64).to(device, dtype).requires_grad_() for shape in shapes]


def output_and_grads(attention, q, k, v, seed: int = 1):
    """attention(q, k, v) and the gradients of q, k, v for a fixed random upstream gradient."""
    out = attention(q, k, v)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.device, out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    return [out.detach(), *grads]


@pytest.fixture
def triton_device() -> torch.device:
    """cuda where the Triton kernels are compiled, cpu where they are interpreted; a skip where neither can run."""
    pytest.importorskip("triton")
    from gptlab.kernels.triton_support import is_interpreted, load_triton_module

    if is_interpreted(load_triton_module("triton_attention")._attention_forward):
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set, and there is no GPU to compile for")


def window_mask(T: int, window: int, device="cpu") -> torch.Tensor:
    """(T, T) bool: query i sees keys i - window + 1 .. i (gptlab.model.gpt.sliding_window_mask of a causal mask)."""
    rows, cols = torch.arange(T, device=device)[:, None], torch.arange(T, device=device)[None, :]
    return (cols <= rows) & (cols > rows - window)
