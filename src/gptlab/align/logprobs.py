"""Log-probabilities of chosen tokens: what every preference and policy-gradient loss is built from.

    logp = token_logprobs(model, x, y)        (B, T): log p(y[b, t] | x[b, :t+1]), 0 where y is ignored (-100)
    logp.sum(-1)                              a response's log-probability (DPO)

The cross-entropy with reduction="none" is the negative log-probability of each
target, computed without materialising a second (B, T, vocab) tensor of
log-softmax values. Not here: the losses (gptlab.align.dpo, gptlab.align.grpo).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # a target that does not count (the model's ignore_index)


def token_logprobs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs) -> torch.Tensor:
    """(B, T) log-probabilities of the targets y under the model given x; 0 at ignored targets.

    kwargs go to the model (positions and mask of packed rows). Computed in float32 whatever the
    autocast, since these are differenced and exponentiated by the losses.
    """
    logits, _ = model(x, **kwargs)
    B, T, V = logits.shape
    nll = F.cross_entropy(logits.float().reshape(B * T, V), y.reshape(B * T), ignore_index=IGNORE, reduction="none")
    return -nll.view(B, T)


def sequence_logprobs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs) -> torch.Tensor:
    """(B,) the summed log-probability of each row's counted targets."""
    return token_logprobs(model, x, y, **kwargs).sum(-1)
