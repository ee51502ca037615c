"""RMSNorm forward and backward as fused Triton kernels, equal to gptlab.model.gpt.RMSNorm.

    y = weight * (x * rstd).to(x.dtype),   rstd = 1 / sqrt(mean(x^2) + eps), in float32 (Zhang & Sennrich, 2019)

The PyTorch module reads x twice and writes the normalised copy before the weight multiplies it; here
one program reads a row once and writes y. Forward: one program per row, saving rstd (N,) for the
backward. Backward, with n = x * rstd and g = dy * weight:

    dx = rstd * (g - n * mean(g * n))        dweight = sum over rows of dy * n

Each of P programs walks the rows P apart and keeps its own partial dweight (P, C): no atomics, so the
GPU and the interpreter sum in the same order; torch adds the P partials. x is seen as (N, C) rows.

Importing this module imports triton; gptlab.kernels loads it only when asked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gptlab.kernels.triton_support import check_launchable

PARTIALS = 256  # backward programs, each summing its rows' dweight (enough to fill a GPU)


@triton.jit
def _rms_norm_forward(X, W, Y, RSTD, C, eps, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: row * C passes 2^31 on big batches
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    x = tl.load(X + row * C + cols, mask=ok, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x.to(tl.float32) * x.to(tl.float32), 0) / C + eps)
    normed = (x.to(tl.float32) * rstd).to(X.dtype.element_ty)  # rounded to x's dtype, as the module does
    weight = tl.load(W + cols, mask=ok, other=0.0)
    tl.store(Y + row * C + cols, (normed.to(tl.float32) * weight.to(tl.float32)).to(Y.dtype.element_ty), mask=ok)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rms_norm_backward(X, W, DY, RSTD, DX, DW_PARTIAL, N, C, BLOCK_C: tl.constexpr):
    first, step = tl.program_id(0).to(tl.int64), tl.num_programs(0)
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    weight = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    dweight = tl.zeros([BLOCK_C], tl.float32)
    for row in range(first, N, step):
        x = tl.load(X + row * C + cols, mask=ok, other=0.0)
        grad_out = tl.load(DY + row * C + cols, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        normed = x.to(tl.float32) * rstd
        dweight += grad_out * normed.to(X.dtype.element_ty).to(tl.float32)
        g = (grad_out * weight).to(X.dtype.element_ty).to(tl.float32)  # rounded to x's dtype, as autograd does
        dx = rstd * (g - normed * (tl.sum(g * normed, 0) / C))
        tl.store(DX + row * C + cols, dx.to(DX.dtype.element_ty), mask=ok)
    tl.store(DW_PARTIAL + first * C + cols, dweight, mask=ok)


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rms_norm(x) over the last dimension; x (..., C), weight (C,) -> (..., C) in their promoted dtype."""
    check_launchable(x, _rms_norm_forward)
    return TritonRMSNorm.apply(x, weight, eps)


class TritonRMSNorm(torch.autograd.Function):
    """Saves x, weight and rstd (one float per row)."""

    @staticmethod
    def forward(ctx, x, weight, eps: float):
        C = x.shape[-1]
        rows = x.reshape(-1, C).contiguous()  # (N, C)
        out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
        rstd = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        block_c = triton.next_power_of_2(C)
        _rms_norm_forward[(rows.shape[0],)](rows, weight, out, rstd, C, eps, BLOCK_C=block_c)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.shape = x.shape
        return out.view(*x.shape[:-1], C)

    @staticmethod
    def backward(ctx, grad_out):
        rows, weight, rstd = ctx.saved_tensors
        N, C = rows.shape
        grad_out = grad_out.reshape(N, C).contiguous()
        dx = torch.empty_like(rows)
        programs = max(1, min(N, PARTIALS))
        partial = torch.empty(programs, C, dtype=torch.float32, device=rows.device)
        _rms_norm_backward[(programs,)](rows, weight, grad_out, rstd, dx, partial, N, C,
                                        BLOCK_C=triton.next_power_of_2(C))
        return dx.view(ctx.shape), partial.sum(dim=0).to(weight.dtype), None
