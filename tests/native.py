"""Run a native library's calls in a child process, so that a crash in it fails one test and nothing else.

A segfault or an illegal instruction inside a C library (llama.cpp's CPU kernels, for one) kills the process it runs
in. In a pytest-xdist worker that is the worker, and with it every test still queued there; `in_child` moves the call
into a fresh Python process instead, and turns its death into an AssertionError that names the signal.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import importlib, pickle, sys
module, name, args, kwargs = pickle.loads(sys.stdin.buffer.read())
try:
    outcome = (True, getattr(importlib.import_module(module), name)(*args, **kwargs))
except BaseException as error:  # handed back whole: an assertion inside the child fails the test as itself
    outcome = (False, error)
with open(sys.argv[1], "wb") as out:
    pickle.dump(outcome, out)
"""


def in_child(function, *args, timeout: float = 300, **kwargs):
    """`function(*args, **kwargs)` in a fresh interpreter; `function` must live at the top of an importable module.

    The result comes back through a file named on the child's command line, not its stdout, which the library may
    write to."""
    request = pickle.dumps((function.__module__, function.__qualname__, args, kwargs))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.pickle"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-c", CHILD, str(out)], input=request, capture_output=True,
                              timeout=timeout, cwd=ROOT, env=env)
        name = f"{function.__module__}.{function.__qualname__}"
        if done.returncode < 0:
            raise AssertionError(f"{name} died of {signal.Signals(-done.returncode).name} in its child process:\n"
                                 f"{done.stderr.decode(errors='replace')[-3000:]}")
        if done.returncode != 0 or not out.exists():
            raise AssertionError(f"{name} exited {done.returncode}:\n{done.stderr.decode(errors='replace')[-3000:]}")
        ok, value = pickle.loads(out.read_bytes())
    if not ok:
        raise value
    return value
