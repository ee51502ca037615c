"""FlashAttention-2 forward and backward as Triton kernels: gptlab.kernels.flash_attention, one tile per program.

Four kernels, each a loop of gptlab.kernels.flash_attention written for one program (one tile):

    _attention_forward   grid (query blocks, B * H): online softmax over the key blocks; writes O and L (OUT, LSE)
    _attention_delta     grid (query blocks, B * H): D = rowsum(dO * O)
    _attention_dkdv      grid (key blocks, B * H):   dK, dV of a key block, walking the query blocks
    _attention_dq        grid (query blocks, B * H): dQ of a query block, walking the key blocks

Causal attention skips the tiles wholly above the diagonal, and with a sliding window (query i sees keys
i - window + 1 .. i) the tiles wholly below the band as well. dQ gets its own pass instead of atomic adds from the dK/dV pass: one more recomputation of the
scores, but no atomics, so the GPU and Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) agree
bit for bit in their order of summation. Tensors are made contiguous and seen as (B * H, T, D):
program (block, bh) reads rows block * BLOCK_M.. of head bh through plain pointers and masks
(rows past T, columns past D). Matrix products accumulate in float32; float32 inputs use exact
("ieee") products, not TF32, so they match the float32 reference.

Importing this module imports triton; gptlab.kernels loads it only when a Triton kernel is asked for.
Whether kernels run compiled or interpreted is fixed when this module is imported (triton.jit reads
TRITON_INTERPRET then).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gptlab.kernels.flash_attention import check_attention_inputs, same_dtype
from gptlab.kernels.triton_support import check_launchable, is_interpreted
from gptlab.runtime import GptlabError

BLOCK_M = 64  # queries per tile
BLOCK_N = 64  # keys per tile


@triton.jit
def _attention_forward(Q, K, V, OUT, LSE, T, S, D, scale, WINDOW, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    block, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # int64: bh * T * D passes 2^31 on big batches
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions of this tile
    dims = tl.arange(0, BLOCK_D)
    row_ok = (rows[:, None] < T) & (dims[None, :] < D)
    q = tl.load(Q + bh * T * D + rows[:, None] * D + dims[None, :], mask=row_ok, other=0.0)  # (BLOCK_M, BLOCK_D)
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    first, stop = 0, S
    if CAUSAL:  # key blocks wholly after the last query of this tile, or wholly before its first one's window, are skipped
        first = tl.maximum(block * BLOCK_M - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
        stop = tl.minimum((block + 1) * BLOCK_M, S)
    for start in range(first, stop, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = (keys[:, None] < S) & (dims[None, :] < D)
        k = tl.load(K + bh * S * D + keys[:, None] * D + dims[None, :], mask=key_ok, other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load(V + bh * S * D + keys[:, None] * D + dims[None, :], mask=key_ok, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N) float32
        visible = keys[None, :] < S
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - WINDOW)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row that has seen only hidden keys so far
        p = tl.exp(scores - shift[:, None])
        correction = tl.exp(row_max - shift)  # rescales what was summed under the old maximum
        row_sum = row_sum * correction + tl.sum(p, 1)
        acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        row_max = new_max
    row_sum = tl.where(row_sum == 0.0, 1.0, row_sum)  # rows past T (never stored) may see no key under a window
    out = acc / row_sum[:, None]
    tl.store(OUT + bh * T * D + rows[:, None] * D + dims[None, :], out.to(OUT.dtype.element_ty), mask=row_ok)
    tl.store(LSE + bh * T + rows, row_max + tl.log(row_sum), mask=rows < T)


@triton.jit
def _attention_delta(OUT, DO, DELTA, T, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    block, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = (rows[:, None] < T) & (dims[None, :] < D)
    offsets = bh * T * D + rows[:, None] * D + dims[None, :]
    out = tl.load(OUT + offsets, mask=row_ok, other=0.0).to(tl.float32)
    grad_out = tl.load(DO + offsets, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * T + rows, tl.sum(out * grad_out, 1), mask=rows < T)


@triton.jit
def _attention_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, T, S, D, scale, WINDOW, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    block, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)  # key positions of this tile
    dims = tl.arange(0, BLOCK_D)
    key_ok = (keys[:, None] < S) & (dims[None, :] < D)
    k = tl.load(K + bh * S * D + keys[:, None] * D + dims[None, :], mask=key_ok, other=0.0)  # (BLOCK_N, BLOCK_D)
    v = tl.load(V + bh * S * D + keys[:, None] * D + dims[None, :], mask=key_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    start, stop = 0, T
    if CAUSAL:  # query blocks wholly before this tile, or wholly past its last key's window, never see it
        start = (block * BLOCK_N // BLOCK_M) * BLOCK_M
        stop = tl.minimum((block + 1) * BLOCK_N + WINDOW - 1, T)
    for q_start in range(start, stop, BLOCK_M):
        rows = q_start + tl.arange(0, BLOCK_M)
        row_ok = (rows[:, None] < T) & (dims[None, :] < D)
        q = tl.load(Q + bh * T * D + rows[:, None] * D + dims[None, :], mask=row_ok, other=0.0)  # (BLOCK_M, BLOCK_D)
        grad_out = tl.load(DO + bh * T * D + rows[:, None] * D + dims[None, :], mask=row_ok, other=0.0)
        lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)
        delta = tl.load(DELTA + bh * T + rows, mask=rows < T, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N)
        visible = (rows[:, None] < T) & (keys[None, :] < S)
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - WINDOW)
        p = tl.where(visible, tl.exp(scores - lse[:, None]), 0.0)  # the forward's probabilities, recomputed
        dv += tl.dot(tl.trans(p.to(grad_out.dtype)), grad_out, input_precision=PRECISION)
        dp = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    offsets = bh * S * D + keys[:, None] * D + dims[None, :]
    tl.store(DK + offsets, (dk * scale).to(DK.dtype.element_ty), mask=key_ok)
    tl.store(DV + offsets, dv.to(DV.dtype.element_ty), mask=key_ok)


@triton.jit
def _attention_dq(Q, K, V, DO, LSE, DELTA, DQ, T, S, D, scale, WINDOW, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    block, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = (rows[:, None] < T) & (dims[None, :] < D)
    q = tl.load(Q + bh * T * D + rows[:, None] * D + dims[None, :], mask=row_ok, other=0.0)  # (BLOCK_M, BLOCK_D)
    grad_out = tl.load(DO + bh * T * D + rows[:, None] * D + dims[None, :], mask=row_ok, other=0.0)
    lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)
    delta = tl.load(DELTA + bh * T + rows, mask=rows < T, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    first, stop = 0, S
    if CAUSAL:
        first = tl.maximum(block * BLOCK_M - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
        stop = tl.minimum((block + 1) * BLOCK_M, S)
    for start in range(first, stop, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = (keys[:, None] < S) & (dims[None, :] < D)
        k = tl.load(K + bh * S * D + keys[:, None] * D + dims[None, :], mask=key_ok, other=0.0)
        v = tl.load(V + bh * S * D + keys[:, None] * D + dims[None, :], mask=key_ok, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = (rows[:, None] < T) & (keys[None, :] < S)
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - WINDOW)
        p = tl.where(visible, tl.exp(scores - lse[:, None]), 0.0)
        dp = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + bh * T * D + rows[:, None] * D + dims[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=row_ok)


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, window: int = 0,
                           scale: float | None = None, block_m: int = BLOCK_M, block_n: int = BLOCK_N) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v by the Triton kernels. q (B, H, T, D), k and v (B, H, S, D) -> (B, H, T, D).

    window > 0 (causal only): each query sees itself and the window - 1 keys before it (0: every earlier key)."""
    check_attention_inputs(q, k, v, causal, window)
    check_launchable(q, _attention_forward)
    q, k, v = same_dtype(q, k, v)
    if q.dtype == torch.bfloat16 and is_interpreted(_attention_forward):
        raise GptlabError("Triton's interpreter multiplies bfloat16 matrices wrongly (tl.dot, triton 3.9): "
                          "run the Triton attention in float32 or float16 on CPU, or in bfloat16 on a CUDA device")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return TritonFlashAttention.apply(q, k, v, causal, window, scale, block_m, block_n)


def _settings(q: torch.Tensor, block_m: int, block_n: int) -> dict:
    """The constexprs every kernel takes: tiles are powers of two of at least 16 (tl.arange and tl.dot need that),
    and float32 products are exact ("ieee"; the default, TF32, keeps 10 bits of mantissa)."""
    def tile(size: int) -> int:
        return max(16, triton.next_power_of_2(size))

    return dict(PRECISION="ieee" if q.dtype == torch.float32 else "tf32", BLOCK_M=tile(block_m), BLOCK_N=tile(block_n),
                BLOCK_D=tile(q.shape[-1]))


class TritonFlashAttention(torch.autograd.Function):
    """Saves q, k, v, O and L, as gptlab.kernels.flash_attention.FlashAttention does."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, window: int, scale: float, block_m: int, block_n: int):
        B, H, T, D = q.shape
        S = k.shape[-2]
        window = window or S  # no window: one that reaches past key 0 from every query
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        settings = _settings(q, block_m, block_n)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
        grid = (triton.cdiv(T, settings["BLOCK_M"]), B * H)
        _attention_forward[grid](q, k, v, out, lse, T, S, D, scale, window, CAUSAL=causal, **settings)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.window, ctx.scale, ctx.settings = causal, window, scale, settings
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        B, H, T, D = q.shape
        S = k.shape[-2]
        settings = ctx.settings
        grad_out = grad_out.contiguous()
        delta = torch.empty_like(lse)
        query_grid = (triton.cdiv(T, settings["BLOCK_M"]), B * H)
        _attention_delta[query_grid](out, grad_out, delta, T, D, BLOCK_M=settings["BLOCK_M"], BLOCK_D=settings["BLOCK_D"])
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        key_grid = (triton.cdiv(S, settings["BLOCK_N"]), B * H)
        kernel_args = (T, S, D, ctx.scale, ctx.window)
        _attention_dkdv[key_grid](q, k, v, grad_out, lse, delta, dk, dv, *kernel_args, CAUSAL=ctx.causal, **settings)
        _attention_dq[query_grid](q, k, v, grad_out, lse, delta, dq, *kernel_args, CAUSAL=ctx.causal, **settings)
        return dq, dk, dv, None, None, None, None, None
