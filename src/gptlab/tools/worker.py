"""One tool call in a forked worker process, stopped at its timeout: the way a user's function can hang, crash or
print without harm to the process that called it (gptlab.tools.base decides which calls come here).

    call_in_worker("word_count", word_count, {"text": "a b c"}, seconds=10.0, limit=2000)
    -> "3"   (or a GptlabError saying why not)

Why fork: the child starts at once with the function and its module already loaded (a function read from a user's
file needs no import by name, as spawn would), and when the time is up it is killed, so nothing of it lingers.
A thread cannot be killed: one left looping would hold a core and the interpreter for good. The child leads a
process group of its own, and the whole group is killed after every call, so processes the function started go
with it. Its stdin, stdout and stderr are /dev/null (what it prints is dropped; the model reads what it returns),
and it sends back one JSON message over a pipe: {"ok": true, "text": RESULT} or {"ok": false, "text": WHY}. The
result is made text and checked against the length limit in the child, so nothing larger ever crosses the pipe.

Caveats of fork: the child is a copy of this process, so a function must not use what a fork does not carry over
(CUDA, threads of this process, locks another thread held at the fork); the tools a user writes for a model are
plain functions, and the child touches none of these (Python 3.12 and later warn, with a DeprecationWarning, when a
process with threads forks: this is the caveat it means). POSIX only: on Windows the call is an error result.

Not here: checking the arguments (gptlab.tools.base), making a value text (gptlab.tools.results).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from gptlab.runtime import GptlabError
from gptlab.tools.results import describe_exception, result_text

CHUNK = 64 * 1024


def call_in_worker(name: str, function: Callable[..., object], keywords: dict, seconds: float, limit: int) -> str:
    """The function's result as text, from a forked child given `seconds`; a GptlabError for a raise, a hang
    past the time, a crash, or a result that cannot be text or is over `limit` characters."""
    if not hasattr(os, "fork"):
        raise GptlabError(f"tool {name} runs in a forked process, which this system cannot make; use Linux or macOS")
    for stream in (sys.stdout, sys.stderr):  # else text buffered here could be written twice, once by the child
        with contextlib.suppress(Exception):
            stream.flush()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        _serve(name, function, keywords, limit, writer)  # never returns
    try:
        os.close(writer)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # set by both parent and child: whichever runs first, the group exists before killpg
        data = _read_all(reader, time.monotonic() + seconds, 12 * limit + 4096)  # ascii JSON: <= 12 bytes a character
    finally:
        os.close(reader)
        status = _end(pid)
    if data is None:
        raise GptlabError(f"tool {name} ran past {seconds:.3g} s and was stopped")
    if not data:
        number = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        how = f"killed by signal {signal.Signals(number).name}" if number else f"exit code {os.waitstatus_to_exitcode(status)}"
        raise GptlabError(f"tool {name} ended without an answer ({how})")
    message = json.loads(data)
    if not message["ok"]:
        raise GptlabError(message["text"])
    return message["text"]


def _serve(name: str, function: Callable[..., object], keywords: dict, limit: int, writer: int) -> None:
    """The child: call the function, send one message, exit without running anything of the parent's (no atexit,
    no finally blocks of the caller's frames, no flushing of buffers it copied)."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills this group
        os.setpgid(0, 0)
        _silence()
        try:
            message = {"ok": True, "text": result_text(function(**keywords), name, limit)}
        except BaseException as error:  # SystemExit and KeyboardInterrupt too: the function's to report, not ours
            message = {"ok": False, "text": describe_exception(error)}
        data = json.dumps(message).encode("ascii")  # ascii: a lone surrogate in the text still crosses
        while data:
            data = data[os.write(writer, data):]
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _silence() -> None:
    """Point the child's stdin, stdout and stderr at /dev/null, at the descriptor and in sys (fresh objects: one
    copied from the parent may hold a lock another thread of the parent had at the fork)."""
    null = os.open(os.devnull, os.O_RDWR)
    for descriptor in (0, 1, 2):
        os.dup2(null, descriptor)
    os.close(null)
    sys.stdin, sys.stdout, sys.stderr = open(os.devnull), open(os.devnull, "w"), open(os.devnull, "w")


def _read_all(reader: int, deadline: float, most: int) -> bytes | None:
    """Everything the child writes until it closes the pipe, or None if the deadline comes first."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([reader], [], [], left)[0]:
            return None
        chunk = os.read(reader, CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > most:  # only a function writing into the pipe itself gets here
            raise GptlabError(f"the worker sent more than {most:,} bytes for a result of at most {most // 12:,} characters")
        chunks.append(chunk)


def _end(pid: int) -> int:
    """Kill the child's process group (and the child, should it not have made one yet), reap it, give its status."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]
