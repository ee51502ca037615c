"""Atomic writes leave the old file whole when writing fails."""

import pytest

from gptlab.runtime import atomic_write, atomic_write_text


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_write(path) as handle:
            handle.write("half of the new")
            raise RuntimeError("crash mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary left behind


def test_atomic_write_replaces_on_success(tmp_path):
    path = tmp_path / "sub" / "out.txt"
    atomic_write_text(path, "new\r\nline")
    assert path.read_bytes() == b"new\r\nline"
