"""A prepare rejected for bad input leaves nothing behind, so the corrected command runs without --force;
--out must be a folder of prepare's own files. Also `gptlab data get --out`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gptlab.cli.main import main
from gptlab.data import blocks as blocks_module
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.runtime import GptlabError
from tests.conftest import with_ctrl_c
from tests.data.conftest import QUIET, documents_as_jsonl, folder_bytes, make_documents


def lines_of(text):
    return [line for line in text.splitlines() if line.strip()]


# Each case writes bad input under `root` and returns (sources, extra arguments, expected error,
# a function that corrects the input and returns the corrected sources and arguments).


def empty_file(root):
    path = root / "empty.txt"
    path.write_text("")

    def fix():
        path.write_text("Some text at last.")
        return [str(path)], []

    return [str(path)], [], "the source has no documents with text", fix


def utf16_jsonl(root):
    path = root / "docs.jsonl"
    path.write_bytes('{"text": "hello"}\n{"text": "world"}\n'.encode("utf-16"))

    def fix():
        path.write_text('{"text": "hello"}\n{"text": "world"}\n', encoding="utf-8")
        return [str(path)], []

    return [str(path)], [], "docs.jsonl is not UTF-8 text (it looks like UTF-16)", fix


def malformed_jsonl_near_its_end(root):
    documents = make_documents(200)
    path = documents_as_jsonl(root, documents)
    good = open(path).read()
    open(path, "a").write("{oops\n")

    def fix():
        open(path, "w").write(good)
        return [path], []

    return [path], [], "docs.jsonl, line 201: not valid JSON", fix


def missing_field(root):
    path = root / "docs.jsonl"
    path.write_text("".join(json.dumps({"body": text}) + "\n" for text in make_documents(5)))
    return [str(path)], [], "line 1: no 'text' field (choose one with --text-field)", lambda: ([str(path)], ["--text-field", "body"])


def missing_column(root):
    pq.write_table(pa.table({"content": make_documents(5)}), root / "docs.parquet")
    path = str(root / "docs.parquet")
    return [path], [], "no 'text' column (it has: content", lambda: ([path], ["--text-field", "content"])


def fake_parquet_after_a_good_file(root):
    good = documents_as_jsonl(root, make_documents(50))
    fake = root / "more.parquet"
    fake.write_text("text\nnot really parquet\n")

    def fix():
        pq.write_table(pa.table({"text": make_documents(5, seed=1)}), fake)
        return [good, str(fake)], []

    return [good, str(fake)], [], "more.parquet is not a readable parquet file", fix


def val_taking_every_document(root):
    path = documents_as_jsonl(root, make_documents(3))
    return [path], ["--val", "1B"], "takes all 3 documents", lambda: ([path], ["--val", "0.3"])


CASES = [empty_file, utf16_jsonl, malformed_jsonl_near_its_end, missing_field, missing_column, fake_parquet_after_a_good_file, val_taking_every_document]
FOUND_BY_THE_PROBE = {utf16_jsonl, missing_field, missing_column, fake_parquet_after_a_good_file}


def interrupt_at_block(monkeypatch, index):
    """Ctrl-C as block `index` is about to be written; returns the real writer, to put back."""
    real = blocks_module._write_block

    def interrupted(*args, **kwargs):
        if args[2] == index:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(blocks_module, "_write_block", interrupted)
    return real


@pytest.fixture
def count_blocks(monkeypatch):
    """Small blocks, so a long input is written in several; counts the blocks written."""
    monkeypatch.setattr(blocks_module, "BLOCK_CHARS", 2000)
    written = []
    real = blocks_module._write_block

    def counting(*args, **kwargs):
        written.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(blocks_module, "_write_block", counting)
    return written


@pytest.mark.parametrize("out_before", ["absent", "empty"])
@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
def test_prepare_rejected_input_leaves_nothing_and_the_fix_needs_no_force(tmp_path, tokenizer, capsys, count_blocks, case, out_before):
    tokenizer.save(tmp_path / "tok")
    sources, extra, message, fix = case(tmp_path)
    out = tmp_path / "new" / "out" if out_before == "absent" else tmp_path / "out"
    if out_before == "empty":
        out.mkdir()
    common = ["-t", str(tmp_path / "tok"), "--out", str(out), "--quiet", "--workers", "1"]
    assert main(["data", "prepare", *sources, *common, *extra]) == 1
    errors = lines_of(capsys.readouterr().err)
    assert len(errors) == 1 and errors[0].startswith("gptlab: error:") and message in errors[0], errors
    if out_before == "absent":
        assert not (tmp_path / "new").exists()  # the folders this run made are gone, parents included
    else:
        assert out.is_dir() and not any(out.iterdir())
    if case in FOUND_BY_THE_PROBE:
        assert count_blocks == []  # refused before tokenizing anything
    if case is malformed_jsonl_near_its_end:
        assert len(count_blocks) > 1  # found while reading, after blocks were written: those were removed
    corrected_sources, corrected_extra = fix()
    assert main(["data", "prepare", *corrected_sources, *common, *corrected_extra]) == 0
    assert capsys.readouterr().out.startswith(f"prepared {out}")


def test_prepare_rejected_input_leaves_an_interrupted_runs_work_as_it_was(tmp_path, tokenizer, monkeypatch, count_blocks):
    source = documents_as_jsonl(tmp_path, make_documents(200))
    with open(source, "a") as handle:
        handle.write("{oops\n")  # found only when reading reaches it
    config = PrepareConfig(shard_tokens=3000, workers=1, **QUIET)
    real = interrupt_at_block(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards([source], tokenizer, tmp_path / "out", config)
    before = folder_bytes(tmp_path / "out")
    assert {".prepare/job.json", ".prepare/block_000002.json"} <= set(before)
    monkeypatch.setattr(blocks_module, "_write_block", real)
    with pytest.raises(GptlabError, match="line 201: not valid JSON"):
        prepare_shards([source], tokenizer, tmp_path / "out", config)
    assert folder_bytes(tmp_path / "out") == before


def test_prepare_forced_over_other_data_keeps_it_when_the_input_is_rejected(tmp_path, tokenizer):
    good = documents_as_jsonl(tmp_path, make_documents(30))
    prepare_shards([good], tokenizer, tmp_path / "out", PrepareConfig(**QUIET))
    before = folder_bytes(tmp_path / "out")
    bad = documents_as_jsonl(tmp_path, make_documents(30, seed=1), name="bad.jsonl")
    with open(bad, "a") as handle:
        handle.write("{oops\n")
    with pytest.raises(GptlabError, match="line 31: not valid JSON"):
        prepare_shards([bad], tokenizer, tmp_path / "out", PrepareConfig(**QUIET), force=True)
    assert folder_bytes(tmp_path / "out") == before  # replaced only once the new input has been read through
    prepare_shards([bad.replace("bad", "docs")], tokenizer, tmp_path / "out", PrepareConfig(**QUIET))
    assert folder_bytes(tmp_path / "out") == before


# ---------------------------------------------------------------- --out


def test_cli_prepare_refuses_a_file_as_out(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    (tmp_path / "out").write_text("my notes")
    assert main(["data", "prepare", documents_as_jsonl(tmp_path, make_documents(5)), "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out")]) == 1
    errors = lines_of(capsys.readouterr().err)
    assert errors == [f"gptlab: error: --out {tmp_path / 'out'} is a file, not a folder; pass a folder path"]
    assert (tmp_path / "out").read_text() == "my notes"


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_cli_prepare_refuses_an_out_holding_other_things(tmp_path, tokenizer, capsys, force):
    tokenizer.save(tmp_path / "tok")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train_notes.txt").write_text("mine")
    args = ["data", "prepare", documents_as_jsonl(tmp_path, make_documents(5)), "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out")]
    assert main([*args, *force]) == 1
    errors = lines_of(capsys.readouterr().err)
    assert len(errors) == 1 and "holds things this command did not make (train_notes.txt)" in errors[0]
    assert folder_bytes(tmp_path / "out") == {"train_notes.txt": b"mine"}


def test_prepare_finishes_an_interrupted_run_and_clears_its_temporary_files(tmp_path, tokenizer, monkeypatch):
    source = documents_as_jsonl(tmp_path, make_documents(100))
    config = PrepareConfig(shard_tokens=2000, workers=1, **QUIET)
    reference = prepare_shards([source], tokenizer, tmp_path / "reference", config)
    monkeypatch.setattr(blocks_module, "BLOCK_CHARS", 2000)
    real = interrupt_at_block(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards([source], tokenizer, tmp_path / "out", config)
    monkeypatch.setattr(blocks_module, "_write_block", real)
    (tmp_path / "out" / ".train_000000.bin.k3j2.tmp").write_bytes(b"cut short by kill -9")
    (tmp_path / "out" / ".prepare" / ".block_000002.npy.x8.tmp").write_bytes(b"cut short")
    result = prepare_shards([source], tokenizer, tmp_path / "out", config)
    assert result.status == "resumed"
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "reference")
    assert result.manifest == reference.manifest
    assert prepare_shards([source], tokenizer, tmp_path / "out", config).status == "already prepared"


def test_cli_get_refuses_a_file_or_a_folder_of_other_things_as_out_before_downloading(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))  # an empty cache and no registry: a download would fail
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    (tmp_path / "file").write_text("mine")
    assert main(["data", "get", "shakespeare", "--out", str(tmp_path / "file")]) == 1
    assert lines_of(capsys.readouterr().err) == [f"gptlab: error: --out {tmp_path / 'file'} is a file, not a folder; pass a folder path"]
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.md").write_text("mine")
    assert main(["data", "get", "shakespeare", "--out", str(tmp_path / "folder")]) == 1
    errors = lines_of(capsys.readouterr().err)
    assert len(errors) == 1 and "holds things this command did not make (notes.md)" in errors[0]
    assert folder_bytes(tmp_path / "folder") == {"notes.md": b"mine"} and (tmp_path / "file").read_text() == "mine"


def test_cli_get_copies_the_corpus_keeps_identical_copies_and_refuses_edited_ones(tmp_path, capsys):
    from gptlab.data.corpus import shakespeare_files

    out = tmp_path / "works"
    assert main(["data", "get", "shakespeare", "--out", str(out)]) == 0
    assert "copied 42 files" in capsys.readouterr().out
    assert folder_bytes(out) == {path.name: path.read_bytes() for path in shakespeare_files()}
    (out / "hamlet.txt").unlink()
    assert main(["data", "get", "shakespeare", "--out", str(out)]) == 0
    assert "copied 1 files" in capsys.readouterr().out and (out / "hamlet.txt").is_file()
    (out / "macbeth.txt").write_text("my edit")
    assert main(["data", "get", "shakespeare", "--out", str(out)]) == 1
    errors = lines_of(capsys.readouterr().err)
    assert len(errors) == 1 and "holds macbeth.txt, which differs from the corpus" in errors[0]
    assert (out / "macbeth.txt").read_text() == "my edit"


CTRL_C_SCRIPT = """
import os, signal, sys
from gptlab.cli.main import main
from gptlab.data import blocks
blocks.BLOCK_CHARS = 2000
real = blocks._write_block
def write(*args):
    if args[2] == 5:
        os.killpg(os.getpgid(0), signal.SIGINT)  # Ctrl-C in a terminal: the parent and its workers
    return real(*args)
blocks._write_block = write
sys.exit(main(sys.argv[1:]))
"""


def test_cli_prepare_ctrl_c_with_workers_exits_and_the_same_command_resumes(tmp_path, tokenizer):
    import gptlab

    tokenizer.save(tmp_path / "tok")
    source = documents_as_jsonl(tmp_path, make_documents(400))
    args = ["data", "prepare", source, "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--shard-tokens", "5000", "--workers", "2", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(Path(gptlab.__file__).resolve().parents[1])}
    # its own process group, so the Ctrl-C reaches it and its workers, not pytest; a hang fails on the timeout
    result = subprocess.run([sys.executable, "-c", CTRL_C_SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120,
                            start_new_session=True, preexec_fn=with_ctrl_c)
    assert result.returncode == 130, result.stderr
    assert lines_of(result.stderr) == [f"gptlab: the work so far is kept in {tmp_path / 'out' / '.prepare'}; the same command resumes it", "gptlab: interrupted"]
    assert main(args) == 0
    reference = prepare_shards([source], tokenizer, tmp_path / "reference", PrepareConfig(shard_tokens=5000, **QUIET))
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "reference") and reference.status == "prepared"


CTRL_C_AT_POOL = """
import multiprocessing.pool, os, signal, sys
from gptlab.cli.main import main
from gptlab.data import blocks
blocks.BLOCK_CHARS = 2000
name, after = {"pool starting": ("_repopulate_pool", True), "pool ending": ("terminate", False)}[sys.argv[1]]
real = getattr(multiprocessing.pool.Pool, name)
def wrapped(*args, **kwargs):
    if not after:
        os.killpg(os.getpgid(0), signal.SIGINT)
    result = real(*args, **kwargs)
    if after:
        os.killpg(os.getpgid(0), signal.SIGINT)
    return result
setattr(multiprocessing.pool.Pool, name, wrapped)
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("moment", ["pool starting", "pool ending"])
def test_cli_prepare_ctrl_c_as_the_worker_pool_starts_or_ends_exits_130_without_a_traceback(tmp_path, tokenizer, moment):
    import gptlab

    tokenizer.save(tmp_path / "tok")
    source = documents_as_jsonl(tmp_path, make_documents(200))
    args = ["data", "prepare", source, "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--shard-tokens", "5000", "--workers", "2", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(Path(gptlab.__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-c", CTRL_C_AT_POOL, moment, *args], capture_output=True, text=True, env=env, timeout=120,
                            start_new_session=True, preexec_fn=with_ctrl_c)
    assert result.returncode == 130, result.stderr
    assert lines_of(result.stderr)[-1] == "gptlab: interrupted" and "Traceback" not in result.stderr, result.stderr
    assert main(args) == 0
    prepare_shards([source], tokenizer, tmp_path / "reference", PrepareConfig(shard_tokens=5000, **QUIET))
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "reference")


def test_prepare_refuses_workers_below_one():
    with pytest.raises(GptlabError, match=r"--workers 0: give at least 1 process"):
        PrepareConfig(workers=0)
