"""Worker processes for CPU-parallel stages (pre-tokenization, batch encoding), and BLAS threads for small fits.

"fork" where the OS has it: workers start fast and user scripts need no
`if __name__ == "__main__"` guard (which "spawn" requires). Elsewhere "spawn".

Ctrl-C: `worker_pool` gives a pool whose workers ignore SIGINT (a terminal sends it to the whole process group),
so the parent alone turns it into KeyboardInterrupt and ends the workers; a Ctrl-C that lands while the pool
starts or ends is held until it has, then raised. So every command with workers exits with `gptlab: interrupted`.
"""

import contextlib
import multiprocessing
import os
import signal
import threading


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


def _ignore_ctrl_c(initializer, initargs: tuple) -> None:
    """A worker's first act: leave Ctrl-C to the parent. A worker that died of it holding the pool's queue lock
    would hang the parent's terminate(), and each would print its own KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def ctrl_c_deferred(half_done: list | None = None, *, second_stops: bool = False):
    """Hold a Ctrl-C that arrives inside the block and raise it as KeyboardInterrupt once the block is done: a pool is
    never left half started or half ended, a training step finishes whole (weights, optimizer, loader and step count
    agree, so the checkpoint saved then resumes exactly). `second_stops`: a second Ctrl-C raises at once (a step
    that takes too long), and `half_done` gets True appended: the block was left half done.
    Only the main thread receives signals; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught = []

    def held(number, frame):
        caught.append(number)
        if second_stops and len(caught) > 1:
            if half_done is not None:
                half_done.append(True)
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, held)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


@contextlib.contextmanager
def worker_pool(workers: int, initializer=None, initargs: tuple = ()):
    """A multiprocessing Pool of `workers` processes that ignore Ctrl-C, ended (terminated and joined) on leaving
    the block whatever happens, with a Ctrl-C during its start or its end raised after them.

        with worker_pool(4, initializer=load, initargs=(tokenizer,)) as pool:
            results = pool.map(encode, chunks)
    """
    pool = None
    try:
        with ctrl_c_deferred():
            pool = process_context().Pool(workers, initializer=_ignore_ctrl_c, initargs=(initializer, initargs))
        yield pool
    finally:
        if pool is not None:
            with ctrl_c_deferred():
                pool.terminate()
                pool.join()
