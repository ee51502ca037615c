"""A scalar head on a GPT trunk: the shape of a reward model (one score per text) and of PPO's value function
(one value per token).

    scalar = ScalarModel(gpt)                 the trunk's final hidden states -> Linear(n_embd, 1)
    values = scalar(x)                        (B, T) float32: a scalar at every position
    scores = last_scores(values, lengths)     (B,) the scalar at each row's last real token

The head reads the same hidden states the language-model head reads (GPT.hidden_states), so a trunk from any
gptlab model (an SFT model, a pretrained one) carries over; the head starts near zero (std 1/sqrt(n_embd + 1), as
TRL's reward and value heads), so the first scores do not swamp the loss.
Not here: training a reward model (gptlab.align.rl.rm), PPO (gptlab.align.rl.ppo).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gptlab.model import GPT


class ScalarModel(nn.Module):
    """A GPT trunk (its language-model head unused) and a linear head giving one scalar per position."""

    def __init__(self, trunk: GPT) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.config.n_embd, 1)
        nn.init.normal_(self.head.weight, std=1 / math.sqrt(trunk.config.n_embd + 1))
        nn.init.zeros_(self.head.bias)

    @property
    def config(self):
        return self.trunk.config

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        """x (B, T) ids -> (B, T) float32 scalars; kwargs (positions, mask) go to the trunk."""
        hidden = self.trunk.hidden_states(x, **kwargs)
        return self.head(hidden).squeeze(-1).float()


def last_scores(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T) per-position scalars and (B,) row lengths (>= 1) -> (B,) the scalar at each row's last real token."""
    index = (lengths.to(values.device).long() - 1).clamp(min=0)
    return values.gather(1, index[:, None]).squeeze(1)
