"""`worker_pool` and Ctrl-C: the workers leave it to the parent, which ends them; a Ctrl-C while the pool starts or
ends is raised once it has. Every command with worker processes (curate, sharded prepare, tokenizer training,
batch encoding) goes through it; their own tests send Ctrl-C to the whole command."""

import os
import subprocess
import sys
from pathlib import Path

import gptlab
from tests.conftest import with_ctrl_c

SCRIPT = """
import multiprocessing, os, signal, sys, time
from gptlab.runtime.processes import ctrl_c_deferred, worker_pool

def ctrl_c():
    os.killpg(os.getpgid(0), signal.SIGINT)  # as a terminal does: this process and its workers

def square(number):
    if number == 3:
        ctrl_c()
        time.sleep(0.5)  # the workers outlive the Ctrl-C: they ignore it
    return number * number

try:
    with ctrl_c_deferred():
        ctrl_c()
        print("held", flush=True)
except KeyboardInterrupt:
    print("raised after the block", flush=True)
try:
    with worker_pool(2) as pool:
        pool.map(square, range(8), chunksize=1)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
print("children left", len(multiprocessing.active_children()), flush=True)
"""


def test_worker_pool_turns_ctrl_c_into_one_keyboard_interrupt_in_the_parent_and_ends_its_workers():
    env = {**os.environ, "PYTHONPATH": str(Path(gptlab.__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120,
                            start_new_session=True, preexec_fn=with_ctrl_c)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["held", "raised after the block", "interrupted", "children left 0"]
    assert result.stderr == ""  # no worker printed a KeyboardInterrupt traceback
