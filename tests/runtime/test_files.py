"""Atomic writes leave the old file whole when writing fails."""

import stat

import pytest

from gptlab.runtime import GptlabError, atomic_path, atomic_write, atomic_write_text, check_out_dir


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


def test_atomic_files_get_the_users_usual_permissions(tmp_path):
    """A plain open() gives 0666 minus the umask; atomic writes must give the same, not mkstemp's 0600."""
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic = tmp_path / "atomic.txt"
    atomic_write_text(atomic, "x")
    with atomic_path(tmp_path / "by_path.bin") as tmp:
        tmp.write_bytes(b"x")
    for path in (atomic, tmp_path / "by_path.bin"):
        assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_check_out_dir_refuses_a_file_and_a_folder_holding_other_things(tmp_path):
    (tmp_path / "a_file").write_text("mine")
    with pytest.raises(GptlabError, match="is a file, not a folder"):
        check_out_dir(tmp_path / "a_file")
    folder = tmp_path / "folder"
    folder.mkdir()
    assert check_out_dir(folder, ["tokenizer.json"]) == []
    assert check_out_dir(tmp_path / "missing", ["tokenizer.json"]) == []
    (folder / "tokenizer.json").write_text("{}")
    assert check_out_dir(folder, ["tokenizer.json"]) == ["tokenizer.json"]
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(GptlabError, match=r"holds things this command did not make \(notes.txt\); pass a new or empty --out"):
        check_out_dir(folder, ["tokenizer.json"])
    assert not (tmp_path / "missing").exists()
