"""The dense feed-forward layer of a block: GPT-2's GELU MLP, Llama's SwiGLU, Primer's relu^2.

Its own file because both feed-forward layers build it: every dense block (gptlab.model.gpt) and a mixture of
experts' shared experts (gptlab.model.moe). Not here: the sparse layer (gptlab.model.moe).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptlab.model.config import ModelConfig


class MLP(nn.Module):
    """gelu: GELU(x W_fc) W_proj (GPT-2). swiglu: (SiLU(x W_gate) * x W_up) W_proj, gate and up fused in c_fc
    (Llama). relu2: relu(x W_fc)^2 W_proj (Primer; modded-nanogpt, nanochat)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.activation = config.activation_kind
        hidden = config.hidden_dim
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if config.gated else hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.c_proj.residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "swiglu":
            gate, up = self.c_fc(x).chunk(2, dim=-1)
            return self.c_proj(F.silu(gate) * up)
        if self.activation == "relu2":
            return self.c_proj(F.relu(self.c_fc(x)).square())
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
