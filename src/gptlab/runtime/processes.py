"""Worker processes for CPU-parallel stages (pre-tokenization, batch encoding).

"fork" where the OS has it: workers start fast and user scripts need no
`if __name__ == "__main__"` guard (which "spawn" requires). Elsewhere "spawn".
"""

import multiprocessing
import os


def process_context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def default_workers() -> int:
    """Cores this process may use (respects CPU affinity, e.g. under taskset or a container)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1
