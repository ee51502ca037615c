"""The process the code sandbox starts: it fences itself in, then runs the program. Standard library only.

gptlab.eval.sandbox runs it as a script, never imports it:

    python -I -S -B sandbox_launcher.py FOLDER PROGRAM STATUS_FD MEMORY_MB CPU_SECONDS FILE_MB

In order: resource limits (memory, CPU seconds, file size, no core dumps), a network namespace of its own when
the kernel allows one, then an audit hook (PEP 578; it cannot be removed) that refuses writes outside FOLDER,
sockets, new processes, native code and signals to other processes. Only then does the program run, as
`__main__`. The layers and what they miss are explained in gptlab.eval.sandbox.

Status lines go to STATUS_FD, a file the parent opened outside FOLDER (the program's own output is
stdout/stderr, which the parent keeps apart):

    started             the fences are up and the program begins
    blocked <event>     the audit hook refused a call (the first refusal only; it raises PermissionError)
    memory              the program raised MemoryError
    exception <name>    the program raised anything else, SystemExit included: it did not reach its end
    completed           the program ran to its last line
"""

import builtins
import os
import resource
import sys
import traceback
import types

# open(2) flags that change a file: a read-only open anywhere is allowed.
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# Events refused whatever their arguments (names from the audit events table of the Python docs).
REFUSED_EVENTS = frozenset(
    {
        "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "subprocess.Popen", "pty.spawn",  # new processes
        "os.killpg", "resource.setrlimit", "resource.prlimit",  # other processes; limits root could raise again
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",  # ways to reach this hook's state
        "cpython.PyInterpreterState_New",  # a sub-interpreter starts without this hook
        "sqlite3.enable_load_extension", "webbrowser.open",
        "_posixsubprocess.fork_exec", "os.pidfd_open",  # raised by the launcher's stand-ins (disarm_unaudited_calls)
    }
)  # fmt: skip
# Whole families: sockets (and so every network client), ctypes (native calls), syslog (a host socket).
REFUSED_PREFIXES = ("socket.", "ctypes.", "syslog.")

# Events that change a path: event -> (argument index of a path, index of its dir_fd or None), per path.
WRITTEN_PATHS = {
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.link": ((0, 2), (1, 3)),  # a hard link to an outside file would let writes reach it
    "os.mkdir": ((0, 2),),
    "os.remove": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)),
    "os.rmdir": ((0, 1),),
    "os.truncate": ((0, None),),
    "os.utime": ((0, 3),),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, None),),
    "sqlite3.connect": ((0, None),),  # sqlite opens its file in C, without an "open" event
}


def limit_resources(memory_mb: int, cpu_seconds: int, file_mb: int) -> None:
    """Soft and hard limits alike, so the program cannot raise them again (and the hook stops root doing so)."""
    for limit, value in (
        (resource.RLIMIT_AS, memory_mb * 2**20),  # address space: allocation past it is MemoryError
        (resource.RLIMIT_CPU, cpu_seconds),  # SIGXCPU: a backstop should the parent's wall clock fail
        (resource.RLIMIT_FSIZE, file_mb * 2**20),  # no file grows past it, the output files included
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))


def leave_network() -> None:
    """A new, empty network namespace (no interfaces up, not even loopback), so native code has no network either.
    Python 3.11 has no os.unshare, hence ctypes, loaded before the hook forbids it. Root may unshare the network
    alone; others need a user namespace too. Where neither is allowed (containers often refuse), nothing changes."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return
    clone_newnet, clone_newuser = 0x40000000, 0x10000000  # <linux/sched.h>
    if libc.unshare(clone_newnet) != 0:
        libc.unshare(clone_newuser | clone_newnet)


def resolve(path, dir_fd) -> str | None:
    """The real absolute path a call would touch (symlinks followed), or None when it cannot be told."""
    try:
        path = os.fsdecode(os.fspath(path))
        if dir_fd is not None and dir_fd >= 0 and not os.path.isabs(path):  # audit events give -1 for no dir_fd
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.realpath(path)
    except (OSError, TypeError, ValueError):
        return None


def make_hook(folder: str, status_fd: int):
    """The audit hook: refuse what the program may not do, and tell the parent once that it tried."""
    root = os.path.realpath(folder)
    refusals = []

    def inside(path) -> bool:
        return path is not None and (path == root or path.startswith(root + os.sep))

    def refuse(event: str):
        if not refusals:
            refusals.append(event)
            try:
                os.write(status_fd, f"blocked {event}\n".encode())
            except OSError:  # the program closed the status file: its result is a failure anyway
                pass
        raise PermissionError(f"sandbox: {event} is not allowed in this sandbox")

    def written(event: str, args: tuple) -> bool:
        """Whether a path-changing event stays inside the folder."""
        if event == "sqlite3.connect" and str(args[0]) in (":memory:", ""):
            return True
        if event == "sqlite3.connect" and str(args[0]).startswith("file:"):
            return False  # a URI names its file after options this hook does not parse
        for path_at, dir_fd_at in WRITTEN_PATHS[event]:
            if isinstance(args[path_at], int):
                continue  # a descriptor: it was opened through this hook
            dir_fd = args[dir_fd_at] if dir_fd_at is not None and dir_fd_at < len(args) else None
            if not inside(resolve(args[path_at], dir_fd)):
                return False
        return True

    def hook(event: str, args: tuple) -> None:
        if event in REFUSED_EVENTS or event.startswith(REFUSED_PREFIXES):
            refuse(event)
        elif event == "open":
            path, _mode, flags = args
            if isinstance(path, int):
                return  # a descriptor it already holds
            real = resolve(path, None)
            if inside(real) or real == os.devnull:
                return
            # A directory opened outside would serve as dir_fd for os.open, and "open" does not carry dir_fd.
            if flags & WRITE_FLAGS or real is None or os.path.isdir(real):
                refuse(f"open {real or repr(path)}")
        elif event == "os.symlink":
            source, target, dir_fd = args
            link = resolve(target, dir_fd)
            if not inside(link) or not inside(resolve(os.path.join(os.path.dirname(link), os.fsdecode(source)), None)):
                refuse("os.symlink")
        elif event in WRITTEN_PATHS:
            if not written(event, args):
                refuse(event)
        elif event == "os.kill" and args[0] != os.getpid():
            refuse("os.kill")
        elif event == "import" and args[0] == "_posixsubprocess":
            refuse("import _posixsubprocess")  # a second copy (importlib.util.module_from_spec) has the real fork_exec

    return hook


def disarm_unaudited_calls() -> None:
    """Two calls reach other processes without an audit event: `_posixsubprocess.fork_exec` (what subprocess uses
    to start one) and `os.pidfd_open` (whose descriptor signal.pidfd_send_signal can kill with). Load them now,
    while imports are free, and put refusals in their place; subprocess itself still imports, and Popen is
    refused by its own event."""
    import _posixsubprocess
    import posix

    def refusal(name: str):
        def refused(*args, **kwargs):
            sys.audit(name)  # refused by the hook, which records the attempt
            raise PermissionError(f"sandbox: {name} is not allowed in this sandbox")

        return refused

    _posixsubprocess.fork_exec = refusal("_posixsubprocess.fork_exec")
    posix.pidfd_open = os.pidfd_open = refusal("os.pidfd_open")


def run_program(path: str) -> None:
    """Run the file as `python PROGRAM` would, in a fresh __main__ (not this launcher's module)."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    exec(compile(source, path, "exec"), module.__dict__)


def print_program_traceback(error: BaseException) -> None:
    """The traceback from the program's frames on (the launcher's own frames say nothing to the reader)."""
    try:
        frames = error.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
            frames = frames.tb_next
        traceback.print_exception(type(error), error, frames)
    except BaseException:  # noqa: BLE001 (out of memory or past the file size while printing: the status says enough)
        pass


def main() -> None:
    folder, program, status_fd, memory_mb, cpu_seconds, file_mb = sys.argv[1:7]
    status_fd = int(status_fd)

    def status(line: str) -> None:
        try:
            os.write(status_fd, f"{line}\n".encode())
        except OSError:
            pass

    limit_resources(int(memory_mb), int(cpu_seconds), int(file_mb))
    leave_network()
    disarm_unaudited_calls()
    sys.dont_write_bytecode = True  # importing must not try to write __pycache__ outside the folder
    sys.path.insert(0, folder)
    sys.addaudithook(make_hook(folder, status_fd))
    status("started")
    code = 0
    try:
        run_program(program)
        status("completed")
    except BaseException as error:  # noqa: BLE001 (SystemExit too: a program that exits early did not pass)
        status("memory" if isinstance(error, MemoryError) else f"exception {type(error).__name__}")
        code = 1
        print_program_traceback(error)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)  # not waiting for threads or atexit handlers the program left behind


if __name__ == "__main__":
    main()
