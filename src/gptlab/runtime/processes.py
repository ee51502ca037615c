"""Worker processes for CPU-parallel stages (pre-tokenization, batch encoding), and BLAS threads for small fits.

"fork" where the OS has it: workers start fast and user scripts need no
`if __name__ == "__main__"` guard (which "spawn" requires). Elsewhere "spawn".
"""

import contextlib
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


def one_blas_thread():
    """A context that keeps BLAS to one thread while scipy's L-BFGS runs, where threadpoolctl is installed (else nothing).

    scipy >= 1.15's L-BFGS-B calls LAPACK on matrices a few rows wide at every iteration; a multi-threaded
    OpenBLAS then wakes its threads each time, which on a busy machine costs milliseconds per iteration, 30-50x
    a whole small fit (scipy issue #22438). One thread loses nothing on problems this small.
    """
    import scipy.optimize  # noqa: F401  (loads scipy's own OpenBLAS: a limit applies to the libraries loaded when set)

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
