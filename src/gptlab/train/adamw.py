"""AdamW (Loshchilov & Hutter, 2019), written out: the readable reference both of gptlab's optimizers step with.

For each parameter, step t, gradient g, learning rate lr, decay wd:

    p <- p * (1 - lr * wd)                       decoupled weight decay
    m <- b1 * m + (1 - b1) * g                   first moment
    v <- b2 * v + (1 - b2) * g^2                 second moment
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

in the same order of operations as `torch.optim.AdamW`, so the two agree
update for update (tests check it). Muon (gptlab.train.muon) subclasses AdamW
and gives the hidden matrices another update; the rest keep `adamw_update`.
Not here: which parameters decay and which optimizer a run builds (gptlab.train.optim).
"""

from __future__ import annotations

import math

import torch

from gptlab.runtime import GptlabError


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or weight_decay < 0:
            raise GptlabError(f"bad AdamW settings: lr={lr} betas={betas} eps={eps} weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict) -> None:
        """One parameter's step (MuonAdamW gives the hidden matrices another)."""
        adamw_update(p, self.state[p], group)


def adamw_update(p: torch.Tensor, state: dict, group: dict) -> None:
    """One AdamW step of parameter p (its state dict and its group's lr, betas, eps, weight_decay), in place."""
    lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    if not state:
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["step"] += 1
    t = state["step"].item()
    m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
    p.mul_(1 - lr * decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1**t)
    denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)
