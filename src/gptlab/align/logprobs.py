"""The pieces every preference and policy-gradient loss is built from, public for researchers to reuse.

    logp = token_logprobs(model, x, y)               (B, T) log p(y[b, t] | x[b, :t+1]); 0 where y is ignored (-100)
    logp, entropy = token_logprobs(model, x, y, entropy=True)
    logp.sum(-1)                                     a response's log-probability (DPO)
    token_entropy(logits)                            (B, T) H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_t,v
    masked_mean(v, mask, dim)                        sum(v * mask, dim) / sum(mask, dim)
    masked_normalize(v, mask, constant, dim)         sum(v * mask, dim) / constant   (Dr. GRPO's fixed divisor)
    whiten(v, mask)                                  (v - mean) / sqrt(var + eps) over the masked entries (PPO)
    policy_gradient_loss(adv, logp, old_logp, clip)  per-token -min(ρ A, clip(ρ, 1-ε_lo, 1+ε_hi) A), ρ = exp(logp - old)

The log-probabilities are the negative cross-entropy with reduction="none": no second (B, T, vocab) tensor of
log-softmax values is made. The entropy is computed a few rows at a time, so only a slice of float32
probabilities exists at once, and without gradients (it is logged, not trained on).
Not here: the losses that use them (gptlab.align.preference.dpo, grpo_loss, ppo_loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # a target that does not count (the model's ignore_index)
ENTROPY_ROWS = 8192  # positions whose float32 probabilities exist at once while computing the entropy


def logits_logprobs(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, T) log-probabilities of the targets y under logits (B, T, V), in float32; 0 at ignored targets."""
    B, T, V = logits.shape
    nll = F.cross_entropy(logits.float().reshape(B * T, V), y.reshape(B * T), ignore_index=IGNORE, reduction="none")
    return -nll.view(B, T)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, rows: int = ENTROPY_ROWS) -> torch.Tensor:
    """(..., V) logits -> (...) entropy of each position's next-token distribution, in nats (float32).

    H = logsumexp(z) - Σ_v softmax(z)_v z_v, which needs no log-softmax copy; computed `rows` positions at a time.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, flat.shape[0], rows):
        z = flat[start : start + rows].float()
        out[start : start + rows] = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
    return out.view(logits.shape[:-1])


def token_logprobs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, entropy: bool = False,
                   **kwargs) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probabilities of the targets y under the model given x; 0 at ignored targets.

    Works with any module whose forward returns (logits, ...) or logits. kwargs go to the model (positions and mask
    of packed rows). In float32 whatever the autocast, since the losses difference and exponentiate these. With
    entropy=True, also the (B, T) entropy of each position's distribution (no gradient), from the same logits.
    """
    out = model(x, **kwargs)
    logits = out[0] if isinstance(out, (tuple, list)) else out
    logp = logits_logprobs(logits, y)
    return (logp, token_entropy(logits)) if entropy else logp


def sequence_logprobs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs) -> torch.Tensor:
    """(B,) the summed log-probability of each row's counted targets."""
    return token_logprobs(model, x, y, **kwargs).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of values where mask is true, over dim (all entries when None); 0 where nothing counts."""
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def masked_normalize(values: torch.Tensor, mask: torch.Tensor, constant: float, dim: int | None = None) -> torch.Tensor:
    """Sum of values where mask is true, over dim (all entries when None), divided by a fixed constant: a loss whose
    scale does not depend on how many tokens each response has (Dr. GRPO divides by the longest allowed length)."""
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    return total / constant


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (Bessel-corrected unless unbiased=False)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    count = mask.sum()
    return var * count / (count - 1) if unbiased and count > 1 else var


def whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Values scaled to unit variance over the masked entries (and centred unless shift_mean=False), 0 elsewhere.
    PPO whitens advantages so the policy step's size does not follow the reward's scale (Huang et al. 2024, detail 7)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(values.dtype)


def policy_gradient_loss(advantages: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor | None = None,
                         clip_low: float | None = None, clip_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unreduced per-token policy-gradient loss and which tokens were clipped (both shaped like logp).

    No old_logp: REINFORCE, -A · log π. With old_logp: the importance ratio ρ = exp(log π - log π_old), and with clip
    bounds PPO's clipped surrogate -min(ρ A, clip(ρ, 1 - clip_low, 1 + clip_high) A) (one bound alone: symmetric). `advantages` broadcasts
    against logp: (B, 1) for one advantage per response (GRPO), (B, T) for one per token (PPO).
    """
    if old_logp is None:
        loss = -advantages * logp
        return loss, torch.zeros_like(loss, dtype=torch.bool)
    ratio = torch.exp(logp - old_logp)
    if clip_low is None and clip_high is None:
        loss = -ratio * advantages
        return loss, torch.zeros_like(loss, dtype=torch.bool)
    # one bound given: both sides use it (a missing clip_low is not 0, which would pin ρ at 1 from below)
    low = 1 - (clip_low if clip_low is not None else clip_high)
    high = 1 + (clip_high if clip_high is not None else clip_low)
    unclipped, clipped = ratio * advantages, ratio.clamp(low, high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped
