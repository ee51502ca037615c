"""The code sandbox: run a model-written Python program in a subprocess with time and memory limits, no network and
a temporary folder of its own, and say whether it passed.

    run_program("def add(a, b):\\n    return a + b\\nassert add(1, 2) == 3\\n")
      -> SandboxResult(passed=True, status="passed", output="", seconds=0.04)

Statuses: "passed" (ran to its last line, exit code 0, nothing refused: a verdict the program cannot forge,
see below), "failed" (an exception, a failed assert, a syntax error, a crash, or an early sys.exit()/os._exit():
a completion that exits before the tests run must not pass, as in OpenAI's human-eval), "timeout" (wall clock or CPU limit), "memory" (MemoryError),
"blocked" (the audit hook refused a call, even if the program caught the error and went on), "error" (the
sandbox could not start the program). Only "passed" counts as passed.

This is a fence against the accidents of model-written code (an endless loop, a runaway list, a stray
`rm`, a `pip install`), not a security boundary against a determined attacker: run untrusted code from
people inside a container or VM. The layers, each with what it does not cover:

1. A fresh folder per program, removed afterwards: the program file, the working directory, HOME and
   TMPDIR are there. The interpreter runs as `python -I -S -B` (no user or site packages, no PYTHON*
   variables, no bytecode written) in a minimal environment, with stdin empty, and all its descriptors
   closed but stdout/stderr (a file outside the folder), the launcher's status file and the verdict's
   nonce pipe (closed by the launcher before the program starts).
   Not covered: reading. The program can read any file the user can (the stdlib must stay readable).
2. Resource limits the launcher (gptlab.eval.sandbox_launcher) sets on itself before the program runs,
   soft and hard alike: address space (`memory_mb`), CPU seconds (timeout + 1), file size (16 MB, stdout
   included), no core dumps. The child leads a new session, and its whole process group is killed when
   the wall clock runs out, and again when it ends (anything it left behind goes with it).
   Not covered: RLIMIT_NPROC is not set: it counts every process and thread of the user across the
   machine (so no value fits a busy desktop, and a program's threads would fail), and root ignores it.
   A process that left the group with setsid() would outlive it; only a fork can make one, see 3.
3. A Python audit hook (PEP 578), installed before the program runs and impossible to remove, refuses:
   opening for writing, creating, removing, renaming, linking or changing attributes of anything outside
   the folder, by name or through a descriptor (fchmod, fchown, futimens, ftruncate, fsetxattr, locks and
   ioctls work on a read-only one: each is checked by the file the descriptor holds, as /proc/self/fd
   names it; where there is no /proc, every such change is refused), mkfifo, mknod and
   chroot (no audit event: replaced by a refusal), opening a directory outside (os.open's dir_fd could
   write through it) and reading any process's /proc entries (its memory); tracing (a tracer can jump over
   the tests' lines), audit hooks of the program's own and other threads' frames; sockets of
   any kind (so every network client: urllib, http, smtp); new processes (subprocess, os.system, os.exec*,
   os.fork, os.posix_spawn, pty, and `_posixsubprocess.fork_exec`, replaced by a refusal); ctypes and
   sqlite extensions (native code); os.kill of other processes, os.killpg, os.pidfd_open (replaced
   by a refusal, as signal.pidfd_send_signal has no event of its own); raising resource limits;
   gc's object walks (a path to the hook's state); sub-interpreters (they start without the hook).
   A refused call raises PermissionError in the program and marks the result "blocked". The hook's own
   checks call only functions bound when it was made, so patching os, os.path or builtins cannot fool it,
   and read arguments as exact str, bytes or int, so no code of the program's (a str subclass's methods)
   runs inside it, where its frames and closures could be reached and changed.
   Not covered: this is Python-level. Native extension code calls the OS directly (only the stdlib is
   importable here, and its native paths that skip audit events, e.g. dbm.gnu opening its file, are not
   covered); a program that digs through frames to the launcher's objects can undo Python-level state;
   a path checked and then swapped by another thread (a symlink race) is not caught; os.open(path, dir_fd=fd)
   is checked as if path were relative to the working directory, as its audit event does not carry fd
   (directories outside cannot be opened, so fd lies inside, but a `..` climbing out of it is missed).
   asyncio cannot run (its event loop makes a socket pair).
4. A network namespace of its own (unshare(CLONE_NEWNET), with a user namespace when not root), so even
   native code finds no network, not even loopback. Skipped quietly where the kernel or container forbids it.

The verdict. A program shares its process with the launcher, so anything the launcher writes it can write too
(its descriptors are easy to guess), and a policy trained on code rewards would learn to print "completed" and
exit. So only one line means a pass, "completed <nonce>", with a fresh random nonce per run that the program
never sees: the parent hands it over a pipe that the launcher reads and closes before the program starts, into
the constants of a small code object that itertools.starmap runs after the program (only if it raised nothing and
the hook refused nothing), chained in C so that no frame, local or global the program can reach holds it. The
hook refuses the ways left to read it (tracing, audit hooks, other threads' frames, gc's walks, /proc/PID/mem,
ctypes). Not covered: the tests themselves run in the program's module, so a completion can still weaken them
from inside (define a name the tests use, return an object equal to everything).

Not here: building the programs from tasks and replies (gptlab.eval.code_tasks), pass@k (gptlab.eval.stats).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gptlab.runtime import GptlabError, default_workers

STATUSES = ("passed", "failed", "timeout", "memory", "blocked", "error")
LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
FILE_MB = 16  # the largest file a program may write, its output included
OUTPUT_CHARS = 4000  # the tail of stdout + stderr kept in a result
MIN_MEMORY_MB = 64  # below this the interpreter itself cannot import the standard library it needs


@dataclass(frozen=True)
class SandboxResult:
    """What became of one program: `status` is one of STATUSES, `output` the tail of its stdout and stderr."""

    passed: bool
    status: str
    output: str
    seconds: float


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 512, python: str = sys.executable) -> SandboxResult:
    """Run `source` as a Python script in the sandbox (see the module docstring) and report how it ended."""
    interpreter = _check_options(timeout, memory_mb, python)
    with tempfile.TemporaryDirectory(prefix="gptlab-sandbox-") as root:
        folder = os.path.join(root, "work")  # the program's own; the output and status files sit beside it
        os.mkdir(folder, 0o700)
        program = os.path.join(folder, "program.py")
        Path(program).write_text(source, encoding="utf-8")
        nonce = secrets.token_hex(16)  # the verdict's proof: the program never sees it (see sandbox_launcher)
        with open(os.path.join(root, "output"), "w+b") as output, open(os.path.join(root, "status"), "w+b") as status:
            nonce_fd = _nonce_pipe(nonce)
            try:
                command = [interpreter, "-I", "-S", "-B", str(LAUNCHER), folder, program, str(status.fileno()), str(nonce_fd),
                           str(memory_mb), str(math.ceil(timeout) + 1), str(FILE_MB)]  # fmt: skip
                started = time.monotonic()
                returncode, timed_out = _run_contained(command, folder, (status.fileno(), nonce_fd), output, timeout)
                seconds = time.monotonic() - started
            finally:
                os.close(nonce_fd)
            lines = _read_back(status, 64 * 1024).splitlines()
            text = _read_back(output, 4 * OUTPUT_CHARS)[-OUTPUT_CHARS:]
    state = _classify(lines, returncode, timed_out, text, nonce)
    return SandboxResult(passed=state == "passed", status=state, output=text, seconds=seconds)


def run_programs(
    sources: Sequence[str],
    *,
    workers: int | None = None,
    timeout: float = 10.0,
    memory_mb: int = 512,
    python: str = sys.executable,
) -> list[SandboxResult]:
    """Run several programs at once, each in its own sandboxed subprocess, `workers` at a time (default: the cores
    this process may use); results in the order of `sources`."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise GptlabError(f"sandbox workers={workers!r} must be a whole number of at least 1")
    _check_options(timeout, memory_mb, python)  # once, before any program starts
    sources = list(sources)
    if not sources:
        return []
    workers = min(workers or default_workers(), len(sources))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gptlab-sandbox") as pool:
        return list(pool.map(lambda source: run_program(source, timeout=timeout, memory_mb=memory_mb, python=python), sources))


def _check_options(timeout: float, memory_mb: int, python: str) -> str:
    """The interpreter's full path, once the limits are known to be usable."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise GptlabError(f"sandbox timeout={timeout!r} must be a positive number of seconds, e.g. 10")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < MIN_MEMORY_MB:
        raise GptlabError(f"sandbox memory_mb={memory_mb!r} must be a whole number of at least {MIN_MEMORY_MB}, e.g. 512")
    interpreter = shutil.which(python)
    if interpreter is None:
        raise GptlabError(f"sandbox python={python!r} is not an interpreter found on this machine: pass a path to python3.11 or newer")
    if not hasattr(os, "killpg") or not LAUNCHER.is_file():
        raise GptlabError("the code sandbox needs a POSIX system (Linux or macOS) and gptlab's sandbox_launcher.py beside sandbox.py")
    return interpreter


def _nonce_pipe(nonce: str) -> int:
    """The read end of a pipe that holds the nonce (32 bytes fit any pipe's buffer, so writing cannot block)."""
    reader, writer = os.pipe()
    try:
        os.write(writer, nonce.encode("ascii"))
    finally:
        os.close(writer)
    return reader


def _run_contained(command: list[str], folder: str, inherited: tuple[int, ...], output, timeout: float) -> tuple[int, bool]:
    """Start the launcher in a new session, wait up to `timeout` seconds, then kill its whole process group.
    Returns (exit code, whether the wall clock ran out)."""
    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": folder,
        "TMPDIR": folder,
        "LC_ALL": "C.UTF-8",
        "LANG": "C.UTF-8",
        "MALLOC_ARENA_MAX": "2",  # glibc reserves 64 MB of address space per thread's arena: keeps memory_mb meaningful
    }
    process = subprocess.Popen(
        command, cwd=folder, env=environment, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
        pass_fds=inherited, start_new_session=True,
    )  # fmt: skip
    timed_out = True
    try:
        timed_out = not _wait_unreaped(process, timeout)
    finally:
        # The group is killed while its leader is still an unreaped zombie, so its id cannot have been reused.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return process.returncode, timed_out


def _wait_unreaped(process: subprocess.Popen, timeout: float) -> bool:
    """Whether the process ended within `timeout` seconds, leaving it unreaped (a pidfd where Linux has one)."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: wait and reap (the group's id could in theory be reused)
        try:
            process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(pidfd)


def _read_back(handle, limit: int) -> str:
    """The last `limit` bytes of a file the child wrote, as text."""
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - limit))
    return handle.read().decode("utf-8", errors="replace")


def _classify(lines: list[str], returncode: int, timed_out: bool, output: str, nonce: str) -> str:
    """One status from the launcher's status lines, the exit code and the clock (see the module docstring). The
    program can write any line but the verdict, so only "completed <nonce>" makes a pass; the others say why not."""
    if any(line.startswith("blocked") for line in lines):
        return "blocked"
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout"
    if "memory" in lines:
        return "memory"
    if "started" not in lines:
        return "error"
    if f"completed {nonce}" in lines and returncode == 0:
        return "passed"
    if returncode < 0 and "MemoryError" in output:  # a native allocation failed where Python could not raise
        return "memory"
    return "failed"
