"""The code sandbox: each test runs a small program and checks both the status and that the fence held
(no child ran, the outside file is untouched, the server saw no connection, the process group is gone)."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from gptlab.eval.sandbox import SandboxResult, run_program, run_programs
from gptlab.runtime import GptlabError


def run(source: str, **options) -> SandboxResult:
    options.setdefault("timeout", 10.0)
    return run_program(textwrap.dedent(source), **options)


def test_run_program_passes_a_program_that_runs_to_its_end():
    result = run(
        """
        import collections, math
        assert math.sqrt(16) == 4
        print(collections.Counter("abca").most_common(1))
        """
    )
    assert (result.status, result.passed) == ("passed", True)
    assert result.output == "[('a', 2)]\n"


def test_run_program_fails_a_failing_assert_and_keeps_its_traceback():
    result = run("def add(a, b):\n    return a - b\nassert add(1, 2) == 3, 'wrong sum'\n")
    assert (result.status, result.passed) == ("failed", False)
    assert "AssertionError: wrong sum" in result.output
    assert "sandbox_launcher" not in result.output  # the traceback starts at the program


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)", "exit()"])
def test_run_program_fails_a_program_that_exits_before_its_tests(exit_call):
    result = run(f"{exit_call}\nassert False, 'the tests'\n")
    assert (result.status, result.passed) == ("failed", False)


def test_run_program_stops_an_endless_loop_and_its_process_group():
    result = run("import os\nprint(os.getpid(), flush=True)\nwhile True:\n    pass\n", timeout=1.0)
    assert (result.status, result.passed) == ("timeout", False)
    pid = int(result.output.split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # it led its own group: nothing of it is left


def test_run_program_reports_memory_when_allocation_is_unbounded():
    result = run("blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))\n", memory_mb=200)
    assert (result.status, result.passed) == ("memory", False)
    assert "MemoryError" in result.output


@pytest.mark.parametrize(
    "spawn",
    [
        "import os\npid = os.fork()\nif pid == 0:\n    open(MARKER, 'w').close()\n    print('CHILD RAN', flush=True)\n    os._exit(0)\n",
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', f'open({MARKER!r}, \"w\").close()'])\n",
        "import os\nos.system(f'touch {MARKER}')\n",
        "import os, sys\nos.execv(sys.executable, [sys.executable, '-c', f'open({MARKER!r}, \"w\").close()'])\n",
        "import ctypes\nctypes.CDLL(None).system(f'touch {MARKER}'.encode())\n",
        # a second copy of _posixsubprocess would carry the real fork_exec
        "import importlib.util\nspec = importlib.util.find_spec('_posixsubprocess')\nimportlib.util.module_from_spec(spec)\n",
    ],
    ids=["fork", "subprocess", "system", "exec", "ctypes", "posixsubprocess"],
)
def test_run_program_blocks_new_processes(tmp_path, spawn):
    marker = tmp_path / "child_ran"
    # The refusal is caught, as a sloppy completion might: the attempt still makes the result "blocked".
    body = textwrap.indent(spawn, "    ")
    result = run(f"MARKER = {str(marker)!r}\ntry:\n{body}except PermissionError:\n    pass\n")
    assert (result.status, result.passed) == ("blocked", False)
    assert not marker.exists()
    assert "CHILD RAN" not in result.output


@pytest.mark.parametrize(
    "attempt",
    [
        "open(NEW, 'w').write('x')",
        "open(KEEP, 'a').write('x')",
        "import pathlib; pathlib.Path(KEEP).write_text('x')",
        "import os; os.remove(KEEP)",
        "import os; os.rename(KEEP, 'moved.txt')",
        "import shutil; shutil.rmtree(os.path.dirname(KEEP))",
        "import os; os.symlink(os.path.dirname(KEEP), 'link'); open('link/new.txt', 'w').write('x')",
        "import os; os.link(KEEP, 'hard.txt'); open('hard.txt', 'w').write('x')",
        "import os; os.chdir(os.path.dirname(KEEP)); open('new.txt', 'w').write('x')",
        "import os; fd = os.open(os.path.dirname(KEEP), os.O_RDONLY); os.open('new.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        "import sqlite3; sqlite3.connect(NEW).execute('create table t (x)')",
    ],
    ids=["create", "append", "pathlib", "remove", "rename", "rmtree", "symlink", "hardlink", "chdir", "dir-fd", "sqlite"],
)
def test_run_program_blocks_changes_outside_its_folder(tmp_path, attempt):
    outside = tmp_path / "outside"
    outside.mkdir()
    keep, new = outside / "keep.txt", outside / "new.txt"
    keep.write_text("keep")
    result = run(f"import os\nKEEP, NEW = {str(keep)!r}, {str(new)!r}\n{attempt}\n")
    assert (result.status, result.passed) == ("blocked", False)
    assert sorted(path.name for path in outside.iterdir()) == ["keep.txt"]
    assert keep.read_text() == "keep"


# A str subclass whose methods run inside the audit hook, walk its frames and closures, and point the folder the
# hook guards at the whole filesystem; then a plain write outside.
ROOT_REWRITTEN = """
import sys
def rewrite(value, depth=0):
    for cell in (getattr(value, "__closure__", None) or ()) if depth < 4 else ():
        try:
            if cell.cell_contents == os.path.realpath(os.getcwd()):
                cell.cell_contents = ""  # every real path starts with "" + "/"
            rewrite(cell.cell_contents, depth + 1)
        except ValueError:
            pass
class Evil(str):
    def startswith(self, *args):
        frame = sys._getframe(1)
        while frame is not None:
            for value in list(frame.f_locals.values()):
                rewrite(value)
            frame = frame.f_back
        return str.startswith(self, *args)
    __hash__, __eq__ = str.__hash__, str.__eq__
try:
    open(Evil(NEW), "w")
except PermissionError:
    pass
open(NEW, "w").write("x")
"""


@pytest.mark.parametrize(
    "attempt",
    [
        "os.mkfifo(NEW)",
        "os.mknod(NEW)",
        "os.fchmod(os.open(KEEP, os.O_RDONLY), 0o777)",
        "os.chmod(os.open(KEEP, os.O_RDONLY), 0o777)",
        "os.utime(os.open(KEEP, os.O_RDONLY), (0, 0))",
        "os.utime(KEEP, (0, 0))",
        "os.fchown(os.open(KEEP, os.O_RDONLY), os.getuid(), os.getgid())",
        "os.setxattr(os.open(KEEP, os.O_RDONLY), 'user.gptlab', b'x')",
        "os.truncate(KEEP, 0)",
        "import fcntl; fcntl.flock(os.open(KEEP, os.O_RDONLY), fcntl.LOCK_EX)",
        "os.lockf(os.open(KEEP, os.O_RDONLY), os.F_TEST, 0)",
        "import fcntl; fcntl.ioctl(os.open(KEEP, os.O_RDONLY), 0x40086602, b'\\0' * 8)",  # FS_IOC_SETFLAGS
        "os.chmod(os.path.dirname(KEEP), 0o700)",
        "os.link(KEEP, 'hard.txt', follow_symlinks=False)",
        "os.path.realpath = lambda path, **_: os.getcwd() + '/x'; os.lstat = None; open(NEW, 'w')",  # patching the hook's helpers
        # a fresh posix module from its saved copy would hold the real mkfifo
        "import _imp, importlib.machinery; _imp.create_builtin(importlib.machinery.ModuleSpec('posix', None)).mkfifo(NEW)",
        ROOT_REWRITTEN,
        # os.stat_result's attributes are patchable: a directory outside reported as a file would serve as dir_fd
        "os.stat_result.st_mode = property(lambda status: 0o100644)\nfd = os.open(os.path.dirname(KEEP), os.O_RDONLY)\n"
        "os.open('new.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
    ],
    ids=["mkfifo", "mknod", "fchmod", "chmod-fd", "utime-fd", "utime", "fchown", "fsetxattr", "truncate", "flock", "lockf",
         "ioctl", "chmod-dir", "link-nofollow", "patched-realpath", "posix-copy", "str-subclass-in-the-hook",
         "patched-stat-result"],
)  # fmt: skip
def test_run_program_blocks_changes_outside_its_folder_by_name_or_descriptor(tmp_path, attempt):
    outside = tmp_path / "outside"
    outside.mkdir()
    keep, new = outside / "keep.txt", outside / "new.txt"
    keep.write_text("keep")
    os.chmod(keep, 0o640)
    os.utime(keep, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))

    def state() -> tuple:
        return os.stat(outside).st_mode, os.stat(keep).st_mode, os.stat(keep).st_mtime_ns, os.stat(keep).st_uid, os.stat(keep).st_gid

    before = state()
    result = run(f"import os\nKEEP, NEW = {str(keep)!r}, {str(new)!r}\n{attempt}\n")
    assert (result.status, result.passed) == ("blocked", False)
    assert sorted(path.name for path in outside.iterdir()) == ["keep.txt"]
    assert keep.read_text() == "keep"
    assert state() == before
    assert os.listxattr(keep) == []


def test_run_program_blocks_truncating_its_own_output_through_the_inherited_descriptor():
    result = run("import os\nprint('kept', flush=True)\nos.ftruncate(1, 0)\n")
    assert (result.status, result.passed) == ("blocked", False)
    assert result.output.startswith("kept\n")


def test_run_program_still_changes_its_own_files_by_descriptor():
    result = run(
        """
        import fcntl, os
        fd = os.open("mine.txt", os.O_CREAT | os.O_RDWR)
        os.write(fd, b"abc")
        os.ftruncate(fd, 1)
        os.fchmod(fd, 0o600)
        os.utime(fd, (0, 0))
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert os.pread(fd, 8, 0) == b"a" and os.stat("mine.txt").st_mtime == 0
        """
    )
    assert (result.status, result.passed) == ("passed", True)


# Each forgery tries to score a pass without its tests passing: the last line, a failing assert, is the tests.
FORGERIES = {
    "status-fd-then-exit": "for fd in range(64):\n    try:\n        os.write(fd, b'started\\ncompleted\\n')\n    except OSError:\n"
                           "        pass\nos._exit(0)\n",
    "marker-on-stdout-stderr": "print('completed', flush=True)\nprint('completed', file=sys.stderr, flush=True)\nos._exit(0)\n",
    "exit-0-early": "sys.exit(0)\n",
    "system-exit-in-tests": "def add(a, b):\n    raise SystemExit(0)\nassert add(1, 2) == 3\n",
    "swallowed-system-exit": "import atexit\natexit.register(os._exit, 0)\nraise SystemExit(0)\n",
    # every hex string reachable from the program's frames, the launcher's globals and closures, as a verdict
    "frames-hunted-for-the-nonce": textwrap.dedent(
        """
        import re
        seen, found = set(), set()
        def scan(value, depth=0):
            if id(value) in seen or depth > 4:
                return
            seen.add(id(value))
            if isinstance(value, (str, bytes)):
                found.update(re.findall(r"[0-9a-f]{32}", value.decode("latin-1") if isinstance(value, bytes) else value))
            for child in (value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()):
                scan(child, depth + 1)
            for name in ("co_consts", "__closure__", "__globals__", "__code__", "__defaults__", "f_locals", "f_globals", "f_code"):
                scan(getattr(value, name, None) or (), depth + 1)
            for cell in getattr(value, "__closure__", None) or ():
                scan(cell.cell_contents, depth + 1)
        frame = sys._getframe()
        while frame is not None:
            scan(frame)
            frame = frame.f_back
        scan(os.pidfd_open)
        for nonce in found:
            for fd in range(64):
                try:
                    os.write(fd, f"completed {nonce}\\n".encode())
                except OSError:
                    pass
        os._exit(0)
        """
    ),
    # the launcher's own functions, reached through its frames, asked to report a completion
    "launcher-status-called": "frame = sys._getframe()\nwhile 'status' not in frame.f_locals:\n    frame = frame.f_back\n"
                              "frame.f_locals['status']('completed')\nos._exit(0)\n",
    "launcher-write-patched": "real = os.write\nos.write = lambda fd, data: real(fd, b'completed\\n')\nposix = __import__('posix')\n"
                              "posix.write = os.write\nos._exit = lambda code: None\n",
    "tracer-skips-the-tests": "import linecache\ndef skip(frame, event, arg):\n"
                              "    if event == 'line' and linecache.getline(frame.f_code.co_filename, frame.f_lineno).startswith('assert'):\n"
                              "        frame.f_lineno += 1\n    return skip\ntry:\n    sys.settrace(skip)\n"
                              "    sys._getframe().f_trace = skip\nexcept PermissionError:\n    pass\n",
    "own-audit-hook": "sys.addaudithook(lambda event, args: print(event, args, flush=True))\n",
}  # fmt: skip


@pytest.mark.parametrize("forgery", list(FORGERIES.values()), ids=list(FORGERIES))
def test_run_program_fails_a_program_that_forges_a_pass(forgery):
    result = run(f"import os, sys\n{forgery}\nassert os.getpid() < 0, 'the tests'\nended = True\n")  # not folded away
    assert result.passed is False
    assert result.status in ("failed", "blocked")


def test_run_program_still_passes_a_program_whose_library_reads_frames():
    # namedtuple, Enum and typing read their caller's frame (sys._getframe): that stays allowed
    result = run(
        """
        import collections, enum, sys, typing
        Point = collections.namedtuple("Point", "x y")
        Colour = enum.Enum("Colour", "RED GREEN")
        T = typing.TypeVar("T")
        assert Point(1, 2).x == 1 and Colour.RED.value == 1 and sys._getframe().f_back is not None
        """
    )
    assert (result.status, result.passed) == ("passed", True)


def test_run_program_blocks_the_network_and_the_server_sees_no_connection():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = run(f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))\n")
        assert (result.status, result.passed) == ("blocked", False)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()


@pytest.mark.parametrize(
    "kill",
    ["os.kill(VICTIM, signal.SIGKILL)", "signal.pidfd_send_signal(os.pidfd_open(VICTIM), signal.SIGKILL)"],
    ids=["kill", "pidfd"],
)
def test_run_program_blocks_killing_another_process(kill):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = run(f"import os, signal\nVICTIM = {victim.pid}\n{kill}\n")
        assert (result.status, result.passed) == ("blocked", False)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_run_program_works_in_its_own_folder_and_removes_it():
    result = run(
        """
        import os, tempfile
        with open("notes.txt", "w") as handle:
            handle.write("hi")
        os.mkdir("sub")
        os.rename("notes.txt", "sub/notes.txt")
        descriptor, path = tempfile.mkstemp()
        os.close(descriptor)
        os.remove(path)
        assert open("sub/notes.txt").read() == "hi"
        print(os.getcwd(), os.environ["HOME"], tempfile.gettempdir())
        """
    )
    assert (result.status, result.passed) == ("passed", True)
    folder, home, temporary = result.output.split()
    assert folder == home == temporary
    assert not os.path.exists(folder)


def test_run_program_reports_error_when_the_interpreter_cannot_run_the_launcher():
    result = run("print('hi')\n", python="true")  # exits 0 without running anything
    assert (result.status, result.passed) == ("error", False)


def test_run_programs_returns_results_in_input_order():
    sources = ["import time\ntime.sleep(0.3)\nprint('first')\n", "print('second')\n", "assert False\n", "print('fourth')\n"]
    results = run_programs(sources, workers=2, timeout=10.0)
    assert [result.status for result in results] == ["passed", "passed", "failed", "passed"]
    assert [result.output for result in results[:2]] + [results[3].output] == ["first\n", "second\n", "fourth\n"]


@pytest.mark.parametrize(
    "options, named",
    [
        ({"timeout": 0}, "timeout=0"),
        ({"memory_mb": 8}, "memory_mb=8"),
        ({"python": "/no/such/python"}, "/no/such/python"),
    ],
)
def test_run_program_rejects_unusable_options_in_one_line(options, named):
    with pytest.raises(GptlabError, match=named):
        run_program("pass\n", **options)


def test_run_programs_rejects_zero_workers():
    with pytest.raises(GptlabError, match="workers=0"):
        run_programs(["pass\n"], workers=0)
