"""Kernels: attention and normalisation, a readable PyTorch reference beside each Triton kernel, proven equal.

    flash_attention         FlashAttention-2 in PyTorch, tiled, with its own backward (gptlab.kernels.flash_attention)
    triton_flash_attention  the same as Triton kernels (gptlab.kernels.triton_attention)
    triton_rms_norm         fused RMSNorm forward and backward (gptlab.kernels.triton_rmsnorm)
    triton_runs_on          whether the Triton kernels can run on a device (CUDA, or Triton's interpreter)

Triton is optional: the Triton modules are imported on first use, and a missing triton is one GptlabError.
Not here: choosing a kernel for a model (gptlab.model.config `attention`, `norm_impl`).
"""

from __future__ import annotations

import torch

from gptlab.kernels.flash_attention import flash_attention
from gptlab.kernels.triton_support import load_triton_module, triton_runs_on


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """gptlab.kernels.triton_attention.triton_flash_attention, importing triton on first use."""
    return load_triton_module("triton_attention").triton_flash_attention(q, k, v, **options)


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """gptlab.kernels.triton_rmsnorm.triton_rms_norm, importing triton on first use."""
    return load_triton_module("triton_rmsnorm").triton_rms_norm(x, weight, eps)


__all__ = ["flash_attention", "triton_flash_attention", "triton_rms_norm", "triton_runs_on"]
