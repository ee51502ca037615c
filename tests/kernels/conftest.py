"""Shared inputs of the kernel tests: random q, k, v and the gradients of an attention function."""

import torch


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
