"""Muon (Keller Jordan, 2024) for the hidden matrices, AdamW for the rest: one optimizer, as modded-nanogpt and nanochat use it.

For a hidden weight matrix W (attention and MLP projections), gradient G, momentum mu:

    B <- mu * B + (1 - mu) * G                     momentum buffer
    U <- G + mu * (B - G)   (nesterov)  or  B      the direction
    O <- NewtonSchulz(U)                           U with its singular values pushed towards 1
    W <- W * (1 - lr * wd)                         decoupled weight decay
    W <- W - lr * sqrt(max(1, rows / cols)) * O    Keller's shape scaling

NewtonSchulz runs five steps of X <- a X + (b A + c A^2) X with A = X X^T, from X = U / ||U||
(on the wide orientation, in bfloat16 or, with muon_precision fp32, float32), the quintic whose coefficients (3.4445, -4.775, 2.0315)
maximise the slope at zero. This follows `torch.optim.Muon` operation for operation, so the two
agree update for update (tests check it). Embeddings, the output head, biases and norm gains are
not hidden matrices: they take AdamW's update (gptlab.train.adamw.adamw_update) in the same
optimizer, so the Trainer, the schedule and checkpoints see one optimizer.
Not here: which parameters are hidden matrices (gptlab.train.optim.muon_groups).
"""

from __future__ import annotations

import math

import torch

from gptlab.train.adamw import AdamW, adamw_update

NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
NS_STEPS = 5


def newton_schulz(update: torch.Tensor, steps: int = NS_STEPS, coefficients=NS_COEFFICIENTS, eps: float = 1e-7,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An approximately orthogonal matrix with the singular vectors of `update` (2-D), computed in `dtype`
    (bfloat16 as torch and modded-nanogpt on GPUs; float32 is the faster on a CPU without bf16 matmuls)."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        polynomial = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.addmm(x, polynomial, x, beta=a)  # a X + (b A + c A^2) X
    return x.T if tall else x


class MuonAdamW(AdamW):
    """Groups with `muon=True` take Muon's update (lr, momentum, weight_decay); the others AdamW's (lr, betas, eps,
    weight_decay). Each group's lr is set by the schedule times its `lr_ratio` (gptlab.train.trainer)."""

    def __init__(self, groups: list[dict], *, momentum: float = 0.95, nesterov: bool = True, betas=(0.9, 0.95),
                 eps: float = 1e-8, ns_dtype: torch.dtype = torch.bfloat16) -> None:
        torch.optim.Optimizer.__init__(self, groups, {"lr": 1e-3, "weight_decay": 0.0, "momentum": momentum,
                                                      "nesterov": nesterov, "betas": tuple(betas), "eps": eps, "muon": False})
        self.ns_dtype = ns_dtype

    def _update(self, p: torch.Tensor, group: dict) -> None:
        if group["muon"]:
            self._muon(p, group)
        else:
            adamw_update(p, self.state[p], group)

    def _muon(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        buffer, grad, momentum = state["momentum_buffer"], p.grad, group["momentum"]
        buffer.lerp_(grad, 1 - momentum)
        direction = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
        orthogonal = newton_schulz(direction, dtype=self.ns_dtype)
        rows, cols = p.shape[:2]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(orthogonal, alpha=-group["lr"] * math.sqrt(max(1, rows / cols)))
