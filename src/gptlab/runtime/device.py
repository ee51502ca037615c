"""Devices, precision, seeds and the distributed process group: the runtime a training run builds once.

Imports torch, so it is not imported by `gptlab.runtime` itself (the tokenizer
never needs torch); callers import `gptlab.runtime.device`.

Distributed runs are launched by `torchrun`, which sets RANK, LOCAL_RANK and
WORLD_SIZE; we join its process group (NCCL on CUDA, gloo on CPU).
"""

from __future__ import annotations

import os
import random
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from gptlab.runtime.errors import GptlabError
from gptlab.runtime.memory import keep_freed_memory

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def detect_device(requested: str = "auto") -> torch.device:
    """cuda, then mps, then cpu; or exactly what was asked for, if available."""
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise GptlabError(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GptlabError(f"device {requested!r} asked for, but CUDA is not available here (use --device cpu or auto)")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise GptlabError(f"device {requested!r} asked for, but MPS is not available here")
    return device


def cpu_has_fast_bf16() -> bool:
    """True when the CPU multiplies bf16 natively (AVX512-BF16 or AMX), where bf16 autocast pays off."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto": bf16 on CUDA with bf16 support, bf16 on CPUs with native bf16, else fp32."""
    if precision not in PRECISIONS:
        raise GptlabError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        if precision == "fp16" and device.type == "cpu":
            raise GptlabError("fp16 training needs a GPU; on CPU use bf16 or fp32")
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type == "cpu" and cpu_has_fast_bf16():
        return "bf16"
    return "fp32"


def autocast(device: torch.device, precision: str):
    """The autocast context for a forward pass (a no-op for fp32)."""
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every generator a run draws from (torch CPU and CUDA, numpy, Python's `random`), as tensors,
    so it saves without pickling code and loads with `torch.load(weights_only=True)`."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    version, python_state, _ = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "numpy_extra": torch.tensor([position, has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([gauss], dtype=torch.float64),
        "python": torch.tensor([version, *python_state], dtype=torch.int64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # this process's device
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` saved (states saved before numpy and Python were included restore torch only)."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        position, has_gauss = (int(v) for v in state["numpy_extra"])
        keys = state["numpy"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, position, has_gauss, float(state["numpy_gauss"][0])))
    if "python" in state:
        values = [int(v) for v in state["python"]]
        random.setstate((values[0], tuple(values[1:]), None))


def init_runtime(device: str = "auto") -> Runtime:
    """Join torchrun's process group when launched by it; pick this process's device; keep freed memory (CPU)."""
    keep_freed_memory()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        chosen = detect_device(device)
        if chosen.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        return Runtime(chosen)
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    chosen = detect_device(device)
    if chosen.type == "cuda":
        chosen = torch.device("cuda", local_rank)
        torch.cuda.set_device(chosen)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
    return Runtime(chosen, rank, local_rank, world_size)


def shutdown_runtime(runtime: Runtime) -> None:
    if runtime.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
