"""Files: atomic writes, and output folders that never swallow a user's work.

Atomic writes go to a temporary name in the same directory, are fsynced, then
renamed: a crash or an error mid-write leaves the previous file (or nothing)
in place, never a truncated one. Files get the user's usual permissions
(0666 minus the umask), not the 0600 of a bare temporary file.

Output folders: `check_out_dir` refuses a path that is a file, or a folder
holding anything a command did not make (named by glob patterns), with one
line that says what is there and what to pass. Reading back: `read_json`
turns a damaged file into one clear error, `read_text` a file that is not UTF-8.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from gptlab.runtime.errors import GptlabError


@functools.cache
def _file_mode() -> int:
    """0666 minus the process umask: what open() would have given the file."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` for a writer that wants a file name (safetensors, torch.save);
    on clean exit it is fsynced, given the usual permissions and renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside `path`; on clean exit fsync and rename it over `path`."""
    binary = "b" in mode
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=None if binary else encoding, newline=None if binary else "") as handle:
            yield handle


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def read_json(path: Path) -> Any:
    """The JSON in `path`; a truncated or non-JSON file is a GptlabError naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GptlabError(f"{path} is truncated or not JSON: {error}") from None


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of `path`. Other bytes (a binary or latin-1 file) are one GptlabError naming the file and
    line, since Python's own message ("'utf-8' codec can't decode byte 0xe9 in position 12") names neither."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise GptlabError(f"{path} line {line} is not UTF-8 text (byte {data[error.start]:#04x}); {what}") from None


def describe_entries(names: Iterable[str], limit: int = 5) -> str:
    """"a.txt, b/, c.json and 3 more": what a folder holds, for an error message."""
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_out_dir(path: str | os.PathLike, ours: Iterable[str] = (), *, flag: str = "--out") -> list[str]:
    """Refuse an output path that is a file, or a folder holding anything but the `ours` glob patterns.

    Returns the names of the folder's entries (all of them match `ours`); [] for a new or empty folder.
    Creates nothing: a command that is refused leaves the disk as it was.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise GptlabError(f"{flag} {path} is a file, not a folder; pass a folder path")
    if not path.is_dir():
        return []
    entries = [entry.name + ("/" if entry.is_dir() else "") for entry in path.iterdir()]
    patterns = list(ours)
    foreign = [name for name in entries if not any(fnmatch.fnmatch(name.rstrip("/"), pattern) for pattern in patterns)]
    if foreign:
        raise GptlabError(
            f"{flag} {path} is not empty and holds things this command did not make ({describe_entries(foreign)}); "
            f"pass a new or empty {flag}"
        )
    return [name.rstrip("/") for name in entries]


def check_parents(path: Path, flag: str = "--out") -> None:
    """Refuse an output path below a file (the folders to create there could not be made)."""
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise GptlabError(f"{flag} {path}: {parent} is a file, not a folder; pass a path in a folder")
            return


def check_out_file(out: str | None, flag: str = "--out") -> None:
    """An --out FILE must be a file path, not a folder; checked before any work."""
    if out is None:
        return
    path = Path(out)
    if path.is_dir():
        raise GptlabError(f"{flag} {out} is a folder; pass a file path (e.g. {path / 'out.txt'})")
    check_parents(path, flag)


def read_inputs(files: list[str]) -> list[str]:
    """The text of each file (UTF-8), or of stdin when there are none; one clear error for a missing or other file."""
    if not files:
        return [sys.stdin.read()]
    texts = []
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise GptlabError(f"input file not found: {name}")
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise GptlabError(f"{name} is not valid UTF-8 (byte {error.start})") from None
    return texts
