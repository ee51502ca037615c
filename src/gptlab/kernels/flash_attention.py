"""FlashAttention-2 in plain PyTorch: the readable reference for the Triton kernel.

Attention softmax(q k^T * scale) v without the (T, S) matrix of probabilities in memory
(Dao, "FlashAttention-2", 2023, Algorithms 1 and 2):

    forward   for each block of queries, walk the blocks of keys keeping a running row maximum m,
              a running row sum l of exp(scores - m) and an unnormalised output; rescale all three
              whenever m grows (the online softmax). Save only the output O and the log-sum-exp
              L = m + log(l) of each row.
    backward  D = rowsum(dO * O); for each block of keys walk the blocks of queries, recompute the
              probabilities P = exp(scores - L) from L, then dV += P^T dO, dP = dO V^T,
              dS = P * (dP - D), dQ += dS K * scale, dK += dS^T Q * scale.

Causal attention skips the key blocks that lie wholly after a query block (and, backward, the query
blocks wholly before a key block): about half the work. A sliding window (`window` w > 0, causal) lets
query i see keys i - w + 1 .. i only, and skips the key blocks wholly before that too. Shapes are (B, H, T, D) for queries and
(B, H, S, D) for keys and values; T and S need not be multiples of the block sizes. Arithmetic runs
in float32 (float64 for float64 inputs), results come back in the input dtype.

Not here: the Triton kernels (gptlab.kernels.triton_attention), masks other than causal or windowed, dropout.
"""

from __future__ import annotations

import math

import torch

from gptlab.runtime import GptlabError

BLOCK = 64  # rows of queries and of keys per tile (FA2 uses 64-128 on a GPU)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, window: int = 0,
                    scale: float | None = None, block_q: int = BLOCK, block_k: int = BLOCK) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v, tiled: equal to F.scaled_dot_product_attention in values and gradients.

    q (B, H, T, D), k and v (B, H, S, D) -> (B, H, T, D). scale defaults to 1 / sqrt(D). causal needs T == S.
    window > 0 (causal only): each query sees itself and the window - 1 keys before it (0: every earlier key).
    """
    check_attention_inputs(q, k, v, causal, window)
    q, k, v = same_dtype(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return FlashAttention.apply(q, k, v, causal, window, scale, block_q, block_k)


def same_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
    """q, k, v in autocast's dtype when it is on (as SDPA gets them), else in their common dtype.

    Under bf16 autocast QK-norm hands over float32 q and k (RMSNorm's float32 weight) beside a bf16 v.
    """
    if torch.is_autocast_enabled(q.device.type):
        dtype = torch.get_autocast_dtype(q.device.type)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return [tensor.to(dtype) for tensor in (q, k, v)]


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int = 0) -> None:
    """One clear error for shapes the kernels do not take (shared with gptlab.kernels.triton_attention)."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise GptlabError(f"attention takes q (B, H, T, D) and k, v (B, H, S, D); got q {tuple(q.shape)}, "
                          f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise GptlabError(f"causal flash attention needs as many queries as keys (T == S), got T={q.shape[-2]}, "
                          f"S={k.shape[-2]}; pass a mask to F.scaled_dot_product_attention instead")
    if window < 0 or (window and not causal):
        raise GptlabError(f"window must be 0 (none) or a number of positions, and needs causal attention; "
                          f"got window={window}, causal={causal}")


class FlashAttention(torch.autograd.Function):
    """Saves q, k, v, O and L (B, H, T): O(T) extra memory where plain attention keeps O(T * S) probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, window: int, scale: float, block_q: int, block_k: int):
        out, lse = flash_forward(q, k, v, causal, window, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = (causal, window, scale, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, out, lse, grad_out, *ctx.settings)
        return dq, dk, dv, None, None, None, None, None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precisions and float32, float64 for float64 (so gradcheck can check us)."""
    return torch.promote_types(dtype, torch.float32)


def causal_scores(scores: torch.Tensor, q_start: int, k_start: int, window: int) -> torch.Tensor:
    """Scores (..., bq, bk) of the tile at (q_start, k_start) with keys after their query, or (window > 0) window
    or more positions before it, set to -inf."""
    rows = torch.arange(q_start, q_start + scores.shape[-2], device=scores.device)[:, None]
    cols = torch.arange(k_start, k_start + scores.shape[-1], device=scores.device)[None, :]
    hidden = (cols > rows) | (cols <= rows - window) if window else cols > rows
    return scores.masked_fill(hidden, float("-inf"))


def key_blocks(q_start: int, q_end: int, S: int, causal: bool, window: int, block_k: int) -> range:
    """Starts of the key blocks that queries q_start .. q_end - 1 see some key of: causal, none after q_end - 1;
    with a window, none wholly before q_start - window + 1."""
    if not causal:
        return range(0, S, block_k)
    first = max(0, q_start - window + 1) // block_k * block_k if window else 0
    return range(first, q_end, block_k)


def query_blocks(k_start: int, k_end: int, T: int, causal: bool, window: int, block_q: int) -> range:
    """Starts of the query blocks that see some key of k_start .. k_end - 1: causal, none wholly before k_start;
    with a window, none after k_end - 1 + window - 1."""
    if not causal:
        return range(0, T, block_q)
    stop = min(T, k_end + window - 1) if window else T
    return range(k_start // block_q * block_q, stop, block_q)


def flash_forward(q, k, v, causal: bool, window: int, scale: float, block_q: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1: O (B, H, T, D) in q's dtype and the log-sum-exp L (B, H, T) of each row of scores."""
    B, H, T, D = q.shape
    S = k.shape[-2]
    dtype = compute_dtype(q.dtype)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=dtype, device=q.device)
    for q_start in range(0, T, block_q):
        q_end = min(q_start + block_q, T)
        q_block = q[:, :, q_start:q_end].to(dtype)  # (B, H, bq, D)
        row_max = torch.full((B, H, q_end - q_start), float("-inf"), dtype=dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros_like(q_block)  # sum of exp(scores - row_max) v, normalised at the end
        for k_start in key_blocks(q_start, q_end, S, causal, window, block_k):
            k_end = min(k_start + block_k, q_end if causal else S)
            k_block, v_block = k[:, :, k_start:k_end].to(dtype), v[:, :, k_start:k_end].to(dtype)  # (B, H, bk, D)
            scores = (q_block @ k_block.transpose(-2, -1)) * scale  # (B, H, bq, bk)
            if causal:
                scores = causal_scores(scores, q_start, k_start, window)
            new_max = torch.maximum(row_max, scores.amax(dim=-1))
            # a row that has seen only hidden keys so far (a window's first tile) keeps max -inf: shift by 0 there
            shift = torch.where(new_max == float("-inf"), 0.0, new_max)
            p = torch.exp(scores - shift[..., None])  # (B, H, bq, bk)
            correction = torch.exp(row_max - shift)  # rescales what was summed under the old maximum
            row_sum = row_sum * correction + p.sum(dim=-1)
            acc = acc * correction[..., None] + p @ v_block
            row_max = new_max
        out[:, :, q_start:q_end] = (acc / row_sum[..., None]).to(q.dtype)
        lse[:, :, q_start:q_end] = row_max + torch.log(row_sum)
    return out, lse


def flash_backward(q, k, v, out, lse, grad_out, causal: bool, window: int, scale: float, block_q: int,
                   block_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 2: dq, dk, dv from the saved O and L, recomputing the probabilities tile by tile."""
    T, S = q.shape[-2], k.shape[-2]
    dtype = compute_dtype(q.dtype)
    delta = (grad_out.to(dtype) * out.to(dtype)).sum(dim=-1)  # D = rowsum(dO * O): (B, H, T)
    dq = torch.zeros_like(q, dtype=dtype)
    dk = torch.zeros_like(k, dtype=dtype)
    dv = torch.zeros_like(v, dtype=dtype)
    for k_start in range(0, S, block_k):
        k_end = min(k_start + block_k, S)
        k_block, v_block = k[:, :, k_start:k_end].to(dtype), v[:, :, k_start:k_end].to(dtype)  # (B, H, bk, D)
        for q_start in query_blocks(k_start, k_end, T, causal, window, block_q):
            q_end = min(q_start + block_q, T)
            q_block = q[:, :, q_start:q_end].to(dtype)  # (B, H, bq, D)
            do_block = grad_out[:, :, q_start:q_end].to(dtype)
            scores = (q_block @ k_block.transpose(-2, -1)) * scale  # (B, H, bq, bk)
            if causal:
                scores = causal_scores(scores, q_start, k_start, window)
            p = torch.exp(scores - lse[:, :, q_start:q_end, None])  # the forward's probabilities, recomputed
            dv[:, :, k_start:k_end] += p.transpose(-2, -1) @ do_block
            dp = do_block @ v_block.transpose(-2, -1)  # (B, H, bq, bk)
            ds = p * (dp - delta[:, :, q_start:q_end, None])  # softmax backward, with D for rowsum(P * dP)
            dq[:, :, q_start:q_end] += (ds @ k_block) * scale
            dk[:, :, k_start:k_end] += (ds.transpose(-2, -1) @ q_block) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
