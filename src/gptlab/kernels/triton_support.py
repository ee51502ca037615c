"""Triton is optional: load a Triton kernel module with a clear error when triton is missing, and refuse tensors
that the loaded kernels cannot run on. Imports no triton itself, so `import gptlab.kernels` works without it.

Triton compiles kernels for CUDA tensors. Its interpreter runs them on CPU tensors (slowly, in NumPy) when
TRITON_INTERPRET=1 is set as the kernel module is imported: `triton.jit` reads it there, not at launch.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from gptlab.runtime import GptlabError
from gptlab.runtime.optional import require

TRITON_PURPOSE = "gptlab's Triton kernels (or use attention 'sdpa' and norm_impl 'torch')"


def load_triton_module(name: str) -> ModuleType:
    """gptlab.kernels.<name>, which imports triton; GptlabError when triton is not installed."""
    return require(f"gptlab.kernels.{name}", extra="kernels", purpose=TRITON_PURPOSE, needs="triton")


def is_interpreted(kernel) -> bool:
    """The kernel was built by Triton's interpreter (TRITON_INTERPRET=1 at import), not its compiler."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def check_launchable(tensor: torch.Tensor, kernel) -> None:
    """A compiled kernel needs a CUDA tensor; say what to do instead of failing inside Triton."""
    if tensor.device.type != "cuda" and not is_interpreted(kernel):
        raise GptlabError(f"Triton kernels run on CUDA tensors, got a {tensor.device.type} tensor: use a CUDA device, "
                          f"or set TRITON_INTERPRET=1 before Python starts to run them (slowly) in Triton's interpreter")


def triton_runs_on(device: torch.device) -> bool:
    """Whether gptlab's Triton kernels can run on tensors of `device`: always on CUDA, elsewhere only where triton
    is installed and was imported with TRITON_INTERPRET=1. gptlab.model falls back to PyTorch where they cannot."""
    return device.type == "cuda" or _interpreted_here()


@functools.cache
def _interpreted_here() -> bool:
    """Triton is installed and interprets (fixed for the process once triton is imported)."""
    try:
        return is_interpreted(load_triton_module("triton_attention")._attention_forward)
    except GptlabError:
        return False
