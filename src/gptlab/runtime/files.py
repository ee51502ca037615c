"""Atomic file writes: a temporary name in the same directory, fsync, then rename.

A crash or an error mid-write leaves the previous file (or nothing) in place,
never a truncated one. Reading back: `read_json` turns a damaged file into one clear error.
"""

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gptlab.runtime.errors import GptlabError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside `path`; on clean exit fsync and rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        binary = "b" in mode
        with os.fdopen(fd, mode, encoding=None if binary else encoding, newline=None if binary else "") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def read_json(path: Path) -> Any:
    """The JSON in `path`; a truncated or non-JSON file is a GptlabError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GptlabError(f"{path} is truncated or not JSON: {error}") from None
