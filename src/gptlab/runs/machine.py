"""The machine a run trained on, written once at its start as OUT/machine.json:

    {"cpu": "AMD EPYC 7B13", "cores": 2, "logical_cpus": 4, "ram_gib": 7.8, "gpu": null, "gpu_count": 0,
     "gpu_memory_gib": null, "device": "cpu", "precision": "fp32", "world_size": 1, "compile": false,
     "threads": 2, "python": "3.11.7", "torch": "2.13.0", "cuda": null, "gptlab": "0.1.0",
     "platform": "Linux 6.1.0", "started": "2026-11-23 20:15:00 UTC", "start_step": 0}

A resumed run rewrites it: it describes the process that trained last (`start_step` says from where).
The benchmarks (bench/machine.py) print the same CPU model and core count.
Not here: what the run measured (OUT/metrics.jsonl, gptlab.train.metrics).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

MACHINE_FILE = "machine.json"
GIB = 2**30


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), which is what a container or taskset gives it."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def ram_gib() -> float | None:
    """Physical memory in GiB (None where sysconf cannot tell)."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1)
    except (AttributeError, ValueError, OSError):
        return None


def _gpu(device) -> dict:
    """The accelerator's name, count and memory: CUDA through torch, Apple's by its backend's name."""
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        properties = torch.cuda.get_device_properties(index)
        return {"gpu": properties.name, "gpu_count": torch.cuda.device_count(),
                "gpu_memory_gib": round(properties.total_memory / GIB, 1)}
    if device.type == "mps":
        return {"gpu": "Apple silicon (MPS)", "gpu_count": 1, "gpu_memory_gib": None}
    return {"gpu": None, "gpu_count": 0, "gpu_memory_gib": None}


def describe_machine(device, *, precision: str, world_size: int = 1, compile: bool = False, start_step: int = 0) -> dict:
    """What a reader of the run needs to judge its speed: hardware, software versions, and how it ran."""
    import torch

    from gptlab import __version__

    return {
        "cpu": cpu_model(), "cores": usable_cores(), "logical_cpus": os.cpu_count(), "ram_gib": ram_gib(),
        **_gpu(device),
        "device": str(device), "precision": precision, "world_size": world_size, "compile": compile,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda, "gptlab": __version__,
        "platform": f"{platform.system()} {platform.release()}",
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "start_step": start_step,
    }


def write_machine(out: str | os.PathLike, description: dict) -> Path:
    from gptlab.runtime import atomic_write_text

    path = Path(out) / MACHINE_FILE
    atomic_write_text(path, json.dumps(description, indent=1) + "\n")
    return path
