"""Ctrl-C on `gptlab data curate` with worker processes: at every moment (the pool starting, mid-work, the pool
ending, deduplication) it exits 130 with `gptlab: interrupted` and no traceback, and the same command then finishes
with the output of an uninterrupted run.

The Ctrl-C is sent to the whole process group (as a terminal does) from inside the run at a chosen moment, so the
test does not depend on how fast the machine is."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gptlab
from gptlab.cli.main import main
from gptlab.curate.example import write_example_warc
from tests.conftest import with_ctrl_c

pytestmark = pytest.mark.xdist_group("curate_interrupt")  # one worker builds the module fixtures once, not each worker

# Runs the CLI with one internal function wrapped to send Ctrl-C to the process group when it is called.
CTRL_C_AT = """
import multiprocessing.pool, os, signal, sys
from gptlab.cli.main import main
from gptlab.curate import pipeline

def ctrl_c():
    os.killpg(os.getpgid(0), signal.SIGINT)

def wrap(owner, name, after=False):
    real = getattr(owner, name)
    def wrapped(*args, **kwargs):
        if not after:
            ctrl_c()
        result = real(*args, **kwargs)
        if after:
            ctrl_c()
        return result
    setattr(owner, name, wrapped)

moment = sys.argv[1]
if moment == "pool starting":  # workers forked, the pool's threads not yet started
    wrap(multiprocessing.pool.Pool, "_repopulate_pool", after=True)
elif moment == "mid-work":  # from inside a worker, filtering its input
    real_filter = pipeline._filter_file
    def filter_then_ctrl_c(job):
        if job[0] == 1:
            ctrl_c()
        return real_filter(job)
    pipeline._filter_file = filter_then_ctrl_c
elif moment == "pool ending":
    wrap(multiprocessing.pool.Pool, "terminate")
elif moment == "deduplication":
    wrap(pipeline, "_run_phase_two")
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("crawl")
    return [str(write_example_warc(folder / f"part{number}.warc.gz", pages=12, seed=number)) for number in range(3)]


@pytest.fixture(scope="module")
def reference(crawl, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "out"
    assert main(["data", "curate", *crawl, "--out", str(out), "--workers", "1"]) == 0
    return out


def _shards(out: Path) -> dict:
    return {path.name: path.read_bytes() for path in sorted((out / "shards").iterdir())}


@pytest.mark.parametrize("moment", ["pool starting", "mid-work", "pool ending", "deduplication"])
def test_curate_ctrl_c_with_workers_exits_130_cleanly_and_the_same_command_finishes(crawl, reference, tmp_path, moment):
    args = ["data", "curate", *crawl, "--out", str(tmp_path / "out"), "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(gptlab.__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    # its own process group, so the Ctrl-C reaches it and its workers, not pytest; a hang fails on the timeout
    result = subprocess.run([sys.executable, "-c", CTRL_C_AT, moment, *args], capture_output=True, text=True, env=env,
                            timeout=300, start_new_session=True, preexec_fn=with_ctrl_c)
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines()[-1] == "gptlab: interrupted" and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "out" / "report.json").exists()
    assert main(args) == 0
    assert _shards(tmp_path / "out") == _shards(reference)
    assert (tmp_path / "out" / "report.txt").read_text() == (reference / "report.txt").read_text()
