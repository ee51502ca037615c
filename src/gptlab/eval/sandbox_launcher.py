"""The process the code sandbox starts: it fences itself in, then runs the program. Standard library only.

gptlab.eval.sandbox runs it as a script, never imports it:

    python -I -S -B sandbox_launcher.py FOLDER PROGRAM STATUS_FD NONCE_FD MEMORY_MB CPU_SECONDS FILE_MB

In order: resource limits (memory, CPU seconds, file size, no core dumps), a network namespace of its own when
the kernel allows one, then an audit hook (PEP 578; it cannot be removed) that refuses writes outside FOLDER,
sockets, new processes, native code, tracing and signals to other processes. Only then does the program run, as
`__main__`. The layers and what they miss are explained in gptlab.eval.sandbox.

Status lines go to STATUS_FD, a file the parent opened outside FOLDER (the program's own output is
stdout/stderr, which the parent keeps apart):

    started             the launcher is up and the program begins
    blocked <event>     the audit hook refused a call (the first refusal only; it raises PermissionError)
    memory              the program raised MemoryError
    exception <name>    the program raised anything else, SystemExit included: it did not reach its end
    completed <nonce>   the program ran to its last line and the hook refused nothing: the verdict

The program can write to STATUS_FD too (a descriptor number is easy to guess), so it could write any line but
the verdict's: the nonce is read from NONCE_FD (a pipe, closed before the program starts) into the constants of
a two-line code object that runs after the program, chained to it in C (`itertools.starmap(exec, ...)`). No
frame, local or global the program can reach holds that code, nothing can run it early, and the hook refuses
what could read it (tracing, another audit hook, other threads' frames, /proc/PID/mem).
"""

import builtins
import itertools
import os
import posix
import resource
import sys
import traceback
import types

# open(2) flags that change a file: a read-only open anywhere is allowed.
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
FILE_TYPE, DIRECTORY, SYMLINK = 0o170000, 0o040000, 0o120000  # st_mode bits (<sys/stat.h>)

# Events refused whatever their arguments (names from the audit events table of the Python docs).
REFUSED_EVENTS = frozenset(
    {
        "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "subprocess.Popen", "pty.spawn",  # new processes
        "os.killpg", "resource.setrlimit", "resource.prlimit",  # other processes; limits root could raise again
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",  # ways to reach this hook's state
        "sys._current_frames", "sys._current_exceptions",  # other threads' frames (the verdict's, as it runs)
        "sys.settrace", "sys.setprofile",  # a tracer can jump over a test's lines and sees every frame
        "sys._settraceallthreads", "sys._setprofileallthreads", "sys.monitoring.register_callback",  # the same (3.12+)
        "sys.addaudithook",  # a hook of the program's would see every event's arguments (the verdict's code)
        "cpython.PyInterpreterState_New",  # a sub-interpreter starts without this hook
        "sqlite3.enable_load_extension", "webbrowser.open",
        # raised by the launcher's stand-ins (disarm_unaudited_calls)
        "_posixsubprocess.fork_exec", "os.pidfd_open", "os.mkfifo", "os.mknod", "os.chroot", "_imp.create_builtin",
    }
)  # fmt: skip
# Whole families: sockets (and so every network client), ctypes (native calls), syslog (a host socket).
REFUSED_PREFIXES = ("socket.", "ctypes.", "syslog.")
# Modules refused on a fresh import: a second copy would carry the real functions the stand-ins replaced.
REFUSED_IMPORTS = frozenset({"_posixsubprocess", "posix", "_testcapi", "_testinternalcapi"})

# Events that change a path or a descriptor's file: event -> (argument index of a path, index of its dir_fd or
# None), per path. A descriptor (fchmod, fchown, futimens, ftruncate, fsetxattr) is checked by the file it holds.
WRITTEN_PATHS = {
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.chflags": ((0, None),),
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
    # locks and ioctls work through a read-only descriptor: a lock or lease on an outside file holds up other
    # programs, an ioctl can set its attributes (FS_IOC_SETFLAGS)
    "os.lockf": ((0, None),),
    "fcntl.flock": ((0, None),),
    "fcntl.lockf": ((0, None),),
    "fcntl.fcntl": ((0, None),),
    "fcntl.ioctl": ((0, None),),
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


def make_real_path():
    """os.path.realpath built from C functions bound now: a program that patches os.lstat or os.readlink (which
    posixpath calls through the os module) must not change what the hook believes a path names."""
    lstat, readlink, getcwd, kinds = posix.lstat, posix.readlink, posix.getcwd, (FILE_TYPE, SYMLINK)
    item = tuple.__getitem__  # st_mode is item 0: os.stat_result's attributes can be patched, tuple's C method cannot

    def real_path(path: str, follow_last: bool = True) -> str:
        """The absolute path with `.`, `..` and symlinks resolved (the last one only if follow_last); a missing
        part is kept as written, as realpath does."""
        pending = (path if path.startswith("/") else getcwd() + "/" + path).split("/")[::-1]  # a stack: next part last
        parts, links = [], 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                parts = parts[:-1]
                continue
            here = "/" + "/".join(parts + [part])
            try:
                is_link = (item(lstat(here), 0) & kinds[0]) == kinds[1] and (follow_last or pending)
            except OSError:
                is_link = False
            if not is_link:
                parts.append(part)
                continue
            links += 1
            if links > 40:  # the kernel's own limit (ELOOP)
                raise OSError(f"too many symlinks in {path}")
            target = readlink(here)
            parts = [] if target.startswith("/") else parts
            pending.extend(target.split("/")[::-1])
        return "/" + "/".join(parts)

    return real_path


def make_hook(folder: str, status_fd: int, refusals: list):
    """The audit hook: refuse what the program may not do, tell the parent once that it tried, and keep the
    refusal in `refusals` (the verdict reads it).

    No code of the program's may run inside it: it calls only functions bound here (C functions, methods of
    immutable types), so patching os, os.path, builtins or this module's globals changes nothing, and it reads
    arguments as exact str, bytes or int (a subclass's methods, even isinstance's look-up of __class__, could run
    the program's code with this hook's frame below it). One closure on purpose: methods of a class the program
    can reach through this module could be replaced."""
    real_path, readlink, stat, write, getpid = make_real_path(), posix.readlink, posix.stat, posix.write, posix.getpid
    refused_events, refused_prefixes, refused_imports, written_paths = REFUSED_EVENTS, REFUSED_PREFIXES, REFUSED_IMPORTS, WRITTEN_PATHS
    write_flags, file_type, directory, encoding = WRITE_FLAGS, FILE_TYPE, DIRECTORY, sys.getfilesystemencoding()
    type_of, subclass, as_str, as_bytes, as_int, item = type, issubclass, str.__str__, bytes.__bytes__, int.__int__, tuple.__getitem__
    denied, errors = PermissionError, (OSError, TypeError, ValueError, AttributeError, IndexError)
    root = real_path(folder)

    def plain(value):
        """The argument as an exact str, bytes or int (a subclass copied by its base type's own C method)."""
        kind = type_of(value)
        if kind is str or kind is bytes or kind is int:
            return value
        for base, copy in ((str, as_str), (bytes, as_bytes), (int, as_int)):
            if subclass(kind, base):
                return copy(value)
        raise TypeError("not a path or a descriptor")  # a path-like object is converted before its event: refused

    def inside(path) -> bool:
        return path is not None and (path == root or path.startswith(root + "/"))

    def text_path(path) -> str:
        path = plain(path)
        return path.decode(encoding, "surrogateescape") if type_of(path) is bytes else path

    def resolve(path, dir_fd=None, follow_last=True) -> str | None:
        """The real absolute path a call would touch (a descriptor: the file it holds), or None when it cannot be told."""
        try:
            path, dir_fd = plain(path), None if dir_fd is None else plain(dir_fd)
            if type_of(path) is int:
                return readlink(f"/proc/self/fd/{path}")  # the kernel's own path of the open file (Linux)
            path = text_path(path)
            if dir_fd is not None and dir_fd >= 0 and not path.startswith("/"):  # audit events give -1 for no dir_fd
                path = readlink(f"/proc/self/fd/{dir_fd}") + "/" + path
            return real_path(path, follow_last)
        except errors:
            return None

    def changes_inside(path, dir_fd=None) -> bool:
        """Whether a change to `path` stays inside: both the name itself (a symlink's own entry) and what it leads to."""
        descriptor = subclass(type_of(path), int)
        return inside(resolve(path, dir_fd)) and (descriptor or inside(resolve(path, dir_fd, follow_last=False)))

    def refuse(event: str):
        if not refusals:
            try:
                write(status_fd, f"blocked {event}\n".encode())
            except errors:  # the program closed the status file: its result is a failure anyway
                pass
        refusals.append(event)
        raise denied(f"sandbox: {event} is not allowed in this sandbox")

    def written(event: str, args: tuple) -> bool:
        """Whether a path-changing event stays inside the folder."""
        if event == "sqlite3.connect":
            database = text_path(args[0])
            if database in (":memory:", ""):
                return True
            if database.startswith("file:"):
                return False  # a URI names its file after options this hook does not parse
        for path_at, dir_fd_at in written_paths[event]:
            if not changes_inside(args[path_at], args[dir_fd_at] if dir_fd_at is not None and dir_fd_at < len(args) else None):
                return False
        return True

    def opened(args: tuple) -> bool:
        """Whether an open is allowed: anything inside; outside, a read-only open of a file (a directory would serve
        as dir_fd for os.open, which "open" does not carry), never a process's /proc entries (its memory)."""
        path, _mode, flags = args
        if subclass(type_of(path), int):
            return True  # a descriptor it already holds
        real = resolve(path)
        if changes_inside(path) or real == "/dev/null":
            return True
        if real is None or plain(flags) & write_flags or (real.startswith("/proc/") and real.split("/")[2].isdigit()):
            return False
        try:
            return (item(stat(real), 0) & file_type) != directory  # st_mode, as in make_real_path
        except errors:
            return True  # a missing file: the open fails on its own

    def refusal(event: str, args: tuple) -> str | None:
        """What to call the event if it is refused, else None."""
        if event in refused_events or event.startswith(refused_prefixes):
            return event
        if event == "open":
            return None if opened(args) else f"open {resolve(args[0]) or 'of a path it cannot read'}"
        if event == "os.symlink":
            source, target, dir_fd = args
            link, named = resolve(target, dir_fd, follow_last=False), text_path(source)
            leads_to = named if named.startswith("/") or link is None else link.rsplit("/", 1)[0] + "/" + named
            return None if inside(link) and inside(resolve(leads_to)) else event
        if event == "shutil.rmtree" and not subclass(type_of(args[0]), (str, bytes)):
            return None  # a path-like object: each removal it makes is an event of its own
        if event in written_paths:
            return None if written(event, args) else event
        if event == "os.kill" and plain(args[0]) != getpid():
            return event
        if event == "import" and plain(args[0]) in refused_imports:
            return f"import {plain(args[0])}"
        return None

    def hook(event: str, args: tuple) -> None:
        try:
            refused = refusal(event, args)
        except errors:  # arguments it cannot read: refused
            refused = event
        if refused:
            refuse(refused)

    return hook


def disarm_unaudited_calls() -> None:
    """Some calls reach other processes or the filesystem without an audit event: `_posixsubprocess.fork_exec`
    (what subprocess uses to start one), `os.pidfd_open` (whose descriptor signal.pidfd_send_signal can kill with),
    `os.mkfifo`, `os.mknod`, `os.chroot`, and `_imp.create_builtin` (a second posix). Load them now, while
    imports are free, and put refusals in their place (holding no reference to the real ones); subprocess itself
    still imports, and Popen is refused by its own event."""
    import _imp
    import _posixsubprocess

    def refusal(name: str):
        def refused(*args, **kwargs):
            sys.audit(name)  # refused by the hook, which records the attempt
            raise PermissionError(f"sandbox: {name} is not allowed in this sandbox")

        return refused

    _posixsubprocess.fork_exec = refusal("_posixsubprocess.fork_exec")
    # _imp.create_builtin("posix") would make a fresh posix from its saved copy, the real functions in it: import
    # every built-in module now, so that no import needs it again, and refuse it.
    for name in sys.builtin_module_names:
        try:
            __import__(name)
        except ImportError:
            pass
    _imp.create_builtin = refusal("_imp.create_builtin")
    for name in ("pidfd_open", "mkfifo", "mknod", "chroot"):
        if hasattr(posix, name):
            setattr(posix, name, refusal(f"os.{name}"))
            setattr(os, name, getattr(posix, name))


def arm(folder: str, status_fd: int, nonce_fd: int) -> tuple:
    """Install the hook, and return the verdict as exec's arguments: code that writes "completed <nonce>" if the hook
    refused nothing. The caller chains it after the program in C; once this returns, only that code holds the nonce."""
    nonce = os.read(nonce_fd, 256).decode("ascii")
    os.close(nonce_fd)
    assert len(nonce) >= 32 and nonce.isalnum(), "the parent passes a hex nonce"
    refusals = []
    verdict = compile(f"if not refusals:\n    write(fd, {f'completed {nonce}'.encode() + bytes([10])!r})\n", "<verdict>", "exec")
    sys.addaudithook(make_hook(folder, status_fd, refusals))
    return verdict, {"__builtins__": {}, "refusals": refusals, "write": posix.write, "fd": status_fd}


def load_program(path: str) -> tuple:
    """The program's code and a fresh __main__ to run it in, as `python PROGRAM` would (not this launcher's module)."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    return compile(source, path, "exec"), module.__dict__


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
    folder, program, status_fd, nonce_fd, memory_mb, cpu_seconds, file_mb = sys.argv[1:8]
    status_fd, nonce_fd, write, exit_now = int(status_fd), int(nonce_fd), posix.write, posix._exit

    def status(line: str) -> None:
        try:
            write(status_fd, f"{line}\n".encode())
        except OSError:
            pass

    limit_resources(int(memory_mb), int(cpu_seconds), int(file_mb))
    leave_network()
    disarm_unaudited_calls()
    sys.dont_write_bytecode = True  # importing must not try to write __pycache__ outside the folder
    sys.path.insert(0, folder)
    status("started")
    code = 0
    try:
        # The program, then the verdict, which runs only if the program raised nothing. Chained in C with no name
        # bound here: a program that walks its frames back to this one finds neither the verdict nor the chain.
        list(itertools.starmap(exec, (load_program(program), arm(folder, status_fd, nonce_fd))))
    except BaseException as error:  # noqa: BLE001 (SystemExit too: a program that exits early did not pass)
        status("memory" if isinstance(error, MemoryError) else f"exception {type(error).__name__}")
        code = 1
        print_program_traceback(error)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    exit_now(code)  # not waiting for threads or atexit handlers the program left behind


if __name__ == "__main__":
    main()
