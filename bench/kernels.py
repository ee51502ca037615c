"""gptlab.kernels against their references, side by side: FlashAttention-2 (PyTorch and Triton) vs SDPA, fused RMSNorm vs torch.

    .venv/bin/python bench/kernels.py                 # no GPU: the PyTorch FlashAttention-2 vs SDPA, small sizes, fp32
    .venv/bin/python bench/kernels.py --device cuda   # a GPU: every kernel in bf16, sequences up to 8192

Each line times the forward alone and the forward + backward (the fastest of --rounds after a warm-up
call, taken round robin, torch.cuda.synchronize around each on a GPU), and divides by SDPA's time (by torch's RMSNorm for the
norm): a ratio above 1 is slower than the reference. Without a GPU, the Triton kernels can only run in
Triton's interpreter, a NumPy emulation that says nothing about their speed, so they are left out.
The PyTorch FlashAttention-2 is a readable reference with a Python loop over tiles: it is slow by design.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from machine import header

from gptlab.kernels import flash_attention, triton_flash_attention, triton_rms_norm
from gptlab.model.gpt import RMSNorm

CPU_SIZES = [(128, 32), (256, 32), (256, 64), (512, 64)]  # (T, head_dim)
GPU_SIZES = [(512, 64), (1024, 64), (2048, 64), (4096, 64), (8192, 64), (1024, 128), (4096, 128)]
TORCH_FLASH_MAX_T = 1024  # the PyTorch reference launches ~(T / 64)^2 small products per call: past this, seconds per line


def fastest_seconds(calls: dict, device: torch.device, rounds: int) -> dict[str, float]:
    """The fastest wall time of each call (the one least disturbed by other work on a shared machine), taken
    round robin after a warm-up round (compiles the Triton kernels, fills caches)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(rounds + 1):
        for name, fn in calls.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def forward_and_backward(fn, inputs: tuple, grad_out: torch.Tensor):
    """The two timed calls for one function: forward, and forward + backward (the gradients of all `inputs`)."""
    def forward():
        with torch.no_grad():
            fn(*inputs)

    def both():
        torch.autograd.grad(fn(*inputs), inputs, grad_out)

    return forward, both


def attention_lines(device: torch.device, dtype: torch.dtype, sizes, tokens: int, heads: int, rounds: int) -> list[str]:
    """One line per (T, head_dim), causal: ms forward and forward + backward per implementation, ratio to SDPA."""
    implementations = {"sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                       "flash-torch": lambda q, k, v: flash_attention(q, k, v, causal=True)}
    if device.type == "cuda":
        implementations["triton"] = lambda q, k, v: triton_flash_attention(q, k, v, causal=True)
    lines = []
    for T, D in sizes:
        B = max(1, tokens // T)  # the same tokens per call at every length
        generator = torch.Generator(device=device).manual_seed(0)
        q, k, v, grad_out = [torch.randn(B, heads, T, D, device=device, dtype=dtype, generator=generator) for _ in range(4)]
        q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        calls = {}
        for name, attention in implementations.items():
            if name == "flash-torch" and device.type == "cuda" and T > TORCH_FLASH_MAX_T:
                continue
            calls[name], calls[name + " both"] = forward_and_backward(attention, (q, k, v), grad_out)
        times = fastest_seconds(calls, device, rounds)
        cells = []
        for name in implementations:
            if name in times:
                fwd, both = times[name], times[name + " both"]
                cells.append(f"{name} {fwd * 1e3:8.2f} / {both * 1e3:8.2f} ms "
                             f"(x{fwd / times['sdpa']:5.2f} / x{both / times['sdpa both']:5.2f})")
        lines.append(f"attention B {B:<3} H {heads} T {T:<5} D {D:<4} causal  " + "   ".join(cells))
    return lines


def norm_lines(device: torch.device, dtype: torch.dtype, rows: int, widths, rounds: int) -> list[str]:
    """One line per width: torch's RMSNorm (gptlab.model.gpt) vs the fused Triton kernel, forward and forward + backward."""
    lines = []
    for C in widths:
        generator = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(rows, C, device=device, dtype=dtype, generator=generator).requires_grad_()
        grad_out = torch.randn(rows, C, device=device, dtype=torch.float32, generator=generator)
        module = RMSNorm(C, 1e-5).to(device)
        implementations = {"torch": lambda x, weight, module=module: module(x),
                           "triton": lambda x, weight: triton_rms_norm(x, weight, 1e-5)}
        calls = {}
        for name, norm in implementations.items():
            calls[name], calls[name + " both"] = forward_and_backward(norm, (x, module.weight), grad_out)
        times = fastest_seconds(calls, device, rounds)
        torch_fwd, torch_both, triton_fwd, triton_both = (times[name] for name in ("torch", "torch both", "triton", "triton both"))
        lines.append(f"rmsnorm   rows {rows} C {C:<5}  torch {torch_fwd * 1e3:7.3f} / {torch_both * 1e3:7.3f} ms   "
                     f"triton {triton_fwd * 1e3:7.3f} / {triton_both * 1e3:7.3f} ms (x{triton_fwd / torch_fwd:5.2f} / "
                     f"x{triton_both / torch_both:5.2f})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--rounds", type=int, default=None, help="timed calls per line (default 20 on cuda, 15 on cpu)")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    rounds = args.rounds or (20 if cuda else 15)
    dtype = torch.bfloat16 if cuda else torch.float32
    print(header(f"kernels: FlashAttention-2 and RMSNorm vs their references, {device}, {str(dtype).removeprefix('torch.')}",
                 ["torch", "triton"]))
    if not cuda:
        print("# no CUDA GPU: PyTorch FlashAttention-2 vs SDPA only, at small sizes; Triton's interpreter (TRITON_INTERPRET=1) "
              "runs the Triton kernels on CPU for the tests, but is no measure of their speed")
        print(f"# load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: other work adds noise; "
              "each figure is the fastest of its rounds")
    print("# each cell: forward / forward+backward ms, fastest of rounds (x ratio to sdpa, or to torch's RMSNorm); above 1 is slower")
    sizes, tokens = (GPU_SIZES, 16384) if cuda else (CPU_SIZES, 512)
    for line in attention_lines(device, dtype, sizes, tokens, heads=16 if cuda else 4, rounds=rounds):
        print(line, flush=True)
    if cuda:
        for line in norm_lines(device, dtype, rows=16384, widths=[768, 2048, 4096], rounds=rounds):
            print(line, flush=True)


if __name__ == "__main__":
    main()
