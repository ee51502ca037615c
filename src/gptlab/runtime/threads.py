"""CPU threads for torch's kernels: how many, and what to do when other work takes the cores.

torch's CPU kernels run on an OpenMP pool (libgomp in the PyPI wheels), one thread per core by default.
Every kernel ends at a barrier, so a step of a small model is thousands of barriers. When another process
holds one of the cores, the thread parked on it is descheduled and its siblings wait at each barrier for
the scheduler to run it again: on 2 cores beside one other busy process, 2 threads train at a third of
their speed alone, while 1 thread keeps 60% of it (bench/threads_busy.py, the demo's model).

What gptlab does about it:
- `--threads N` on every command that computes with torch; `auto` (the default) takes the cores this
  process may use (CPU affinity) less those that other work keeps busy, sampled for 0.2 s at start;
- during training, `BusyWatch` notices steps that run `factor` times slower than before while other work
  holds the cores: with `auto` it moves to the cores left free and back once they are free again, saying
  so in the progress output; with a count the user chose, it says once what to do.
Sleeping at barriers instead (OMP_WAIT_POLICY=passive) also avoids the stall, but costs 14% on an idle
machine, where most runs are; it is left to the user (bench/threads_busy.py measures both).

Counts are set in the environment too (OMP_NUM_THREADS), so child processes keep to them.
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
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_chosen = {"automatic": False}  # whether set_threads chose the count itself (auto, nothing set by the user)


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


class CoreSampler:
    """How many of this process's cores other work kept busy between two reads, without waiting in between.

    /proc/stat over the cores in our affinity set (a container on a large host counts its own cores), less
    this process's own CPU time over the same interval. None where there is no /proc/stat.
    """

    def __init__(self) -> None:
        self.last = self._read()

    def _read(self) -> tuple | None:
        try:
            cpus = os.sched_getaffinity(0)
            return cpus, _cpu_times(cpus), time.process_time()
        except (AttributeError, OSError, ValueError):
            return None

    def others(self) -> float | None:
        """Busy cores not ours since the last call (or since this sampler was made)."""
        before, now = self.last, self._read()
        self.last = now
        if before is None or now is None:
            return None
        cpus, (busy, total), own = now
        busy, total, own = busy - before[1][0], total - before[1][1], own - before[2]
        if total <= 0:
            return None
        wall = total / len(cpus) / os.sysconf("SC_CLK_TCK")  # the interval's seconds, as the kernel counted them
        return max(0.0, len(cpus) * busy / total - own / wall)


def busy_cores(seconds: float = 0.2) -> float:
    """Cores other work keeps busy now, sampled over `seconds`; the 1-minute load average where /proc/stat is
    missing (it lags: it still counts work that just ended)."""
    sampler = CoreSampler()
    time.sleep(seconds)
    others = sampler.others()
    if others is not None:
        return others
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def free_cores(cores: int, others: float) -> int:
    """The cores left when others keep `others` busy, at least one: 2 at 0.3 -> 2; 2 at 0.6 or 7.0 -> 1; 8 at 2.2 -> 6."""
    return max(1, min(cores, cores - int(max(0.0, others) + 0.5)))


def auto_threads(cores: int | None = None, load: float | None = None) -> int:
    """`--threads auto`: the cores this process may use less those other work keeps busy (sampled now)."""
    cores = default_workers() if cores is None else cores
    return free_cores(cores, busy_cores() if load is None else load)


def set_threads(requested: str | int | None) -> int:
    """Use `requested` threads (None or "auto": `auto_threads`) for torch here and in child processes; returns the count.

    An explicit OMP_NUM_THREADS in the environment is the user's choice too, and wins over auto.
    """
    preset = os.environ.get("OMP_NUM_THREADS", "")
    automatic = requested in (None, AUTO) and not (preset.isdigit() and int(preset) > 0)
    if requested in (None, AUTO):
        count = auto_threads() if automatic else int(preset)
    else:
        count = int(requested)
    _chosen["automatic"] = automatic
    _apply(count)
    return count


def _apply(count: int) -> None:
    for name in THREAD_VARIABLES:
        os.environ[name] = str(count)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)


def threads_are_automatic() -> bool:
    """True when the last set_threads chose the count itself: then a BusyWatch may change it."""
    return _chosen["automatic"]


class BusyWatch:
    """Step times in; fewer threads while other work holds the cores (adapt), or one warning (a count the user chose).

    Looked at every `window` steps: the median of those steps against the lowest such median seen (the
    machine at its quietest). `factor` times slower while others keep at least `busy` cores busy over those
    steps is a busy machine; a slowdown with the cores free (a longer GRPO rollout) is not. Once moved to
    fewer threads, it moves back when the cores are free again, and starts its reference afresh.
    Returns the line to print, or None; each kind of line is said once a run.
    """

    def __init__(self, threads: int, adapt: bool = False, window: int = 4, factor: float = 2.0, busy: float = 0.5,
                 set_count=_apply) -> None:
        self.threads, self.current, self.adapt = threads, threads, adapt and threads > 1
        self.window, self.factor, self.busy, self.set_count = window, factor, busy, set_count
        self.recent: list[float] = []
        self.best: float | None = None
        self.said: set[str] = set()
        self.sampler = CoreSampler()

    def step(self, seconds: float) -> str | None:
        """Record one step's time; a line to print when the threads change or the machine first looks busy."""
        self.recent.append(seconds)
        if len(self.recent) < self.window:
            return None
        median, self.recent = statistics.median(self.recent), []
        others = self.sampler.others()  # over exactly these steps
        if others is None:
            return None
        if self.current < self.threads:
            return self._restore() if others < self.busy else None
        self.best = median if self.best is None else min(self.best, median)
        if median < self.factor * self.best or others < self.busy:
            return None
        return self._busy(median / self.best, others)

    def _busy(self, slowdown: float, others: float) -> str | None:
        cores = default_workers()
        where = (f"steps are {slowdown:.1f}x slower than earlier in this run: other work keeps {others:.1f} of "
                 f"{cores} cores busy")
        if self.adapt and free_cores(self.threads, others) < self.threads:
            self.current = free_cores(self.threads, others)
            self.set_count(self.current)
            return self._once("fewer", f"note: {where}; going on with {self.current} thread{'s' * (self.current > 1)} "
                                       f"while it does (a thread waiting for a busy core stalls every step; --threads "
                                       f"{self.threads} keeps {self.threads})")
        advice = (f"pass --threads {free_cores(self.threads, others)} to leave the busy cores to it, or stop the other work"
                  if self.threads > 1 else "stop the other work, or expect this pace")
        return self._once("warn", f"warning: {where} (this run: {self.threads} threads); {advice}")

    def _restore(self) -> str | None:
        self.current, self.best = self.threads, None
        self.set_count(self.threads)
        return self._once("back", f"note: the cores are free again: back to {self.threads} threads")

    def _once(self, kind: str, text: str) -> str | None:
        if kind in self.said:
            return None
        self.said.add(kind)
        return text
