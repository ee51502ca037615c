"""Batch-1 decoding in bfloat16 on a CPU: route the matrix-vector products to PyTorch's own kernel, not oneDNN's.

A decode step of one row multiplies every weight matrix by one vector, so its time is the time to read the
weights. For bfloat16 on a CPU, PyTorch sends F.linear to oneDNN, whose kernel for one row reads them at about
half the speed of PyTorch's own matrix-vector kernel (float32 accumulation, one rounding at the end).
Measured on the GPT-2 (124M) shape, AMD EPYC (Zen 4, AVX-512 BF16), 1 thread, 48 matrices 3072 x 768:

    rows (M)          1        2        4        8        32
    oneDNN          29 ms    25 ms    37 ms    37 ms    58 ms
    PyTorch's own   12 ms    23 ms    44 ms   100 ms   398 ms

so only a single row (M = 1) gains. The engine decoding one GPT-2 (124M) request in bf16 went from 29 to 57 tokens/s
on 1 thread (2.0x; 10 -> 20 on 1 thread and 12 -> 24 on 2 threads on a busier machine, alternating rounds); the
comparison with llama.cpp is bench/llamacpp_decode.py.
Both kernels are float32 accumulations rounded once to bfloat16, so the logits are the same up to that rounding;
PyTorch's own was the correctly rounded one on every one of 50304 outputs tested (oneDNN on all but a few).

oneDNN has no per-call switch, so the context turns `torch.backends.mkldnn.enabled` off for the call and back on
after: a process-wide flag. The engine thread is the one thread that runs the model, so nothing else runs
meanwhile; were another thread to run a bfloat16 matmul at that moment, it would only take the slower path.

Not here: the decode loops (gptlab.infer.generate, gptlab.infer.engine), quantised weights (gptlab.infer.quantize).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def single_row_matmuls(device: torch.device, dtype: torch.dtype, rows: int) -> Iterator[None]:
    """Run the block with oneDNN off when it computes one row (B * T == 1) of a bfloat16 model on a CPU."""
    if rows != 1 or dtype != torch.bfloat16 or device.type != "cpu" or not torch.backends.mkldnn.enabled:
        yield
        return
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = True
