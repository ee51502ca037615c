"""A test that kills its process (a native crash) fails alone: under `make test`'s `-n 2 --dist loadgroup` the run
still runs every other test, groups included, and ends with pytest's summary (tests/xdist_crash.py)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CRASHING = textwrap.dedent('''
    import os, signal
    import pytest

    @pytest.mark.parametrize("i", range(4))
    def test_before(i):
        pass

    @pytest.mark.xdist_group("shared")
    @pytest.mark.parametrize("i", range(3))
    def test_grouped_before(i):
        pass

    @pytest.mark.xdist_group("shared")
    def test_grouped_crash():
        os.kill(os.getpid(), signal.SIGSEGV)

    @pytest.mark.xdist_group("shared")
    @pytest.mark.parametrize("i", range(3))
    def test_grouped_after(i):
        pass

    def test_alone_crash():
        os.abort()

    @pytest.mark.parametrize("side", ["left", "right"])
    def test_crash_together(side):
        """Two workers die at once where they can: each waits (a few seconds at most) for the other to arrive."""
        import pathlib, time
        meeting = pathlib.Path(os.environ["CRASH_MEETING"])
        (meeting / side).touch()
        deadline = time.monotonic() + 5
        while len(list(meeting.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGSEGV)

    @pytest.mark.parametrize("i", range(4))
    def test_after(i):
        pass
''')


def test_a_crashing_test_fails_alone_and_the_run_reaches_its_summary(tmp_path):
    (tmp_path / "test_native.py").write_text(CRASHING)
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_xdist_make_scheduler  # the suite's scheduler\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider",
                          "-p", "no:randomly", "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HYPOTHESIS_PROFILE": "default",
                              "CRASH_MEETING": str(meeting)})
    output = run.stdout + run.stderr
    assert "INTERNALERROR" not in output, output[-4000:]
    assert run.returncode == 1, output[-4000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert "4 failed, 14 passed" in summary, output[-4000:]
    assert "worker 'gw" in output and "crashed while running" in output and "test_grouped_crash" in output
