"""CPU threads for torch's kernels: how many, how they wait, and noticing when other work takes the cores.

torch's CPU kernels run on an OpenMP pool (libgomp in the PyPI wheels), one thread per core by default.
Every kernel ends at a barrier, so a step of a small model is thousands of barriers. When another process
holds one of the cores, the thread parked on it is descheduled, and its siblings wait at each barrier for
the scheduler to run it again: a 2-thread pool on 2 busy cores then goes slower than one thread would
(bench/threads_busy.py measures it). libgomp's threads also spin at a barrier before they sleep, taking
cycles from the competitor that holds the core they wait for.

What gptlab does about it:
- `--threads N` on every command that computes; `auto` (the default) takes the cores this process may use
  (CPU affinity) less those that other work keeps busy, sampled for 0.2 s at start;
- OMP_WAIT_POLICY=passive unless the user set it: threads sleep at a barrier instead of spinning, so a
  busy machine costs a share of the cores, not a collapse (measured in bench/threads_busy.py);
- `BusyWatch` notices when steps slow down after they were fast, and says once what to do.

Environment variables are set before torch loads (libgomp reads them once) and are inherited by child
processes (sweep grid points, data workers), so a whole command keeps to its threads.
Imports torch only where it is already loaded; not here: worker processes (gptlab.runtime.processes).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from gptlab.runtime.errors import GptlabError
from gptlab.runtime.processes import default_workers

AUTO = "auto"
WAIT_POLICY = "OMP_WAIT_POLICY"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def parse_threads(text: str) -> str | int:
    """argparse type of --threads: "auto" or a whole number of at least 1."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise GptlabError(f"threads must be a whole number of at least 1 or 'auto', got {text!r}")
    return value


def _read_stat() -> str:
    with open("/proc/stat") as handle:
        return handle.read()


def _cpu_times(cpus: set[int]) -> tuple[int, int]:
    """(busy, total) jiffies summed over `cpus`, from /proc/stat's per-CPU lines (Linux)."""
    busy = total = 0
    for line in _read_stat().splitlines():
        if line.startswith("cpu"):
            name, *fields = line.split()
            if name == "cpu" or int(name[3:]) not in cpus:
                continue
            values = [int(field) for field in fields[:8]]
            idle = values[3] + values[4]  # idle + iowait
            busy, total = busy + sum(values) - idle, total + sum(values)
    return busy, total


def busy_cores(seconds: float = 0.2) -> float:
    """How many of this process's cores other work keeps busy now, sampled over `seconds` while we wait.

    /proc/stat over the cores in our affinity set, so a container on a large host counts its own cores; where
    there is no /proc/stat, the 1-minute load average (which lags: it still counts work that just ended).
    """
    try:
        cpus = os.sched_getaffinity(0)
        before, own = _cpu_times(cpus), time.process_time()
        time.sleep(seconds)
        after, own = _cpu_times(cpus), time.process_time() - own  # this process's threads are not "other work"
    except (AttributeError, OSError, ValueError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return 0.0
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return 0.0
    wall = total / len(cpus) / os.sysconf("SC_CLK_TCK")  # the window's seconds, as the kernel counted them
    return max(0.0, len(cpus) * busy / total - own / wall)


def auto_threads(cores: int | None = None, load: float | None = None) -> int:
    """The cores this process may use, less the whole cores others use: 2 cores at load 0.3 -> 2; at load 1.6 -> 1.

    A busy core is left to its owner (rounded, so a passing blip does not cost a thread); at least one thread.
    """
    cores = default_workers() if cores is None else cores
    load = busy_cores() if load is None else load
    return max(1, min(cores, cores - round(max(0.0, load))))


def prepare_wait_policy() -> None:
    """Threads sleep at a barrier instead of spinning (unless the user chose): call before torch is imported."""
    os.environ.setdefault(WAIT_POLICY, "passive")


def set_threads(requested: str | int | None) -> int:
    """Use `requested` threads (None or "auto": `auto_threads`) for torch here and in child processes; returns the count.

    An explicit OMP_NUM_THREADS in the environment is the user's choice too, and wins over auto.
    """
    if requested in (None, AUTO):
        preset = os.environ.get("OMP_NUM_THREADS", "")
        count = int(preset) if preset.isdigit() and int(preset) > 0 else auto_threads()
    else:
        count = int(requested)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(count)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


class BusyWatch:
    """Step times in, one warning out when steps run `factor` times slower than before while other work takes the cores.

    The reference is the lowest median of `window` consecutive steps seen (the machine at its quietest). When
    the latest `window` steps' median is `factor` times that, the cores are sampled: a slowdown with the cores
    free (a longer GRPO rollout, a page-in) is no warning, and is looked at again `window` steps later.
    A pause the run makes itself (an eval, a checkpoint) is not a step and never passes through here.
    """

    def __init__(self, threads: int, window: int = 8, factor: float = 2.0, busy: float = 0.5) -> None:
        self.threads, self.window, self.factor, self.busy = threads, window, factor, busy
        self.recent: list[float] = []
        self.best: float | None = None
        self.warned = False

    def step(self, seconds: float) -> str | None:
        """Record one step's time; the warning text the first time the machine looks busy, else None."""
        if self.warned:
            return None
        self.recent = [*self.recent[-(self.window - 1):], seconds]
        if len(self.recent) < self.window:
            return None
        median = statistics.median(self.recent)
        self.best = median if self.best is None else min(self.best, median)
        if median < self.factor * self.best:
            return None
        self.recent = []  # look again a window later, whatever the cores say now
        others = busy_cores()
        if others < self.busy:
            return None
        self.warned = True
        return self.message(median / self.best, others)

    def message(self, slowdown: float, others: float) -> str:
        advice = (f"pass --threads {max(1, self.threads - 1)} to leave a core to it, or stop the other work"
                  if self.threads > 1 else "stop the other work, or expect this pace")
        return (f"warning: steps are {slowdown:.1f}x slower than earlier in this run: other work keeps {others:.1f} of "
                f"{default_workers()} cores busy (this run: {self.threads} threads); {advice}")
