"""Kernels: attention and normalisation, a readable PyTorch reference beside each fast kernel, proven equal.

    flash_attention         FlashAttention-2 in PyTorch, tiled, with its own backward (gptlab.kernels.flash_attention)

Not here: choosing a kernel for a model (gptlab.model.config).
"""

from gptlab.kernels.flash_attention import flash_attention

__all__ = ["flash_attention"]
