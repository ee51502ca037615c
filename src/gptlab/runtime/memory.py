"""Keep freed memory in the process on Linux: glibc's default makes a CPU training step page-fault its activations.

glibc's malloc serves every block above its mmap threshold (128 KiB to start) with a fresh `mmap` and hands it
back with `munmap` when freed, and trims the heap's top back to the OS above 128 KiB. A CPU training step frees
and reallocates the same megabytes of activations and logits every step, so each step the kernel maps new
pages, zeroes them and takes a page fault on every 4 KiB of them. Raising both thresholds keeps freed blocks
in malloc's free lists for the next step: the demo model's step went from 0.37 s to 0.30 s here
(bench/train_throughput.py). The cost: the process keeps its peak memory instead of returning it between steps.

jemalloc and tcmalloc (LD_PRELOAD), which Intel's and PyTorch's CPU tuning guides recommend, do the same; this
needs no install. A user's own MALLOC_* or GLIBC_TUNABLES settings are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed on 64-bit: blocks above it are still mapped
TRIM_THRESHOLD = 2**30

_applied: bool | None = None


def user_set_malloc() -> bool:
    """The user tuned malloc themselves: MALLOC_*_ variables, glibc.malloc tunables, or a preloaded allocator."""
    return (any(name.startswith("MALLOC_") for name in os.environ) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")
            or "malloc" in os.environ.get("LD_PRELOAD", ""))


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True when they are set (False off glibc)."""
    global _applied
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux") and not user_set_malloc():
            try:
                mallopt = ctypes.CDLL("libc.so.6").mallopt
            except (OSError, AttributeError):
                return False
            mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            _applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _applied
