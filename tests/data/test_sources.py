"""Sources refuse input that cannot work before any tokenizing, and an unreachable hub in one line."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import gptlab
from gptlab.data.sources import SourceOptions, open_source
from gptlab.runtime import GptlabError


def closed_port() -> int:
    """A local port nothing listens on: connecting is refused at once, like a hub that cannot be reached."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_cli(args, env_changes, cwd):
    """`gptlab ARGS` in a fresh process (Hugging Face settings are read at import), this checkout's gptlab first.
    The tests pass the suite's small tokenizer: loading GPT-2's 50K vocabulary would cost a second of each run."""
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT")}
    env.update(env_changes, PYTHONPATH=str(Path(gptlab.__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-m", "gptlab.cli.main", *args], capture_output=True, text=True, env=env, timeout=120, cwd=cwd)


def test_hf_source_reports_an_unreachable_hub_in_one_line_without_retries(prepared, tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    hf_home = str(tmp_path / "hf")
    args = ["data", "prepare", "hf:nobody/nothing", "-t", str(prepared / "tokenizer"), "--out", str(tmp_path / "out"), "--quiet"]
    result = run_cli(args, {"HF_ENDPOINT": endpoint, "HF_HOME": hf_home}, tmp_path)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # huggingface_hub alone prints 11 retry lines over ~25 s
    assert lines[0].startswith(f"gptlab: error: cannot reach the Hugging Face hub at {endpoint} to load dataset 'nobody/nothing'")
    assert "HF_ENDPOINT" in lines[0] and "hf:/path/to/a/dataset/directory" in lines[0]
    assert not (tmp_path / "out").exists()


def test_hf_source_reads_a_local_dataset_directory_when_the_hub_is_unreachable(prepared, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "dataset").mkdir()
    pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(5)]}), tmp_path / "dataset" / "part-0.parquet")
    endpoint = f"http://127.0.0.1:{closed_port()}"
    args = ["data", "prepare", f"hf:{tmp_path / 'dataset'}", "-t", str(prepared / "tokenizer"), "--out", str(tmp_path / "out"), "--quiet"]
    result = run_cli(args, {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"prepared {tmp_path / 'out'}")
    assert "documents: 5 read, 5 kept" in result.stdout


def test_hf_source_in_offline_mode_fails_in_one_line(prepared, tmp_path):
    args = ["data", "prepare", "hf:nobody/nothing:cfg", "-t", str(prepared / "tokenizer"), "--out", str(tmp_path / "out"), "--quiet"]
    result = run_cli(args, {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}, tmp_path)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot load dataset 'nobody/nothing' config 'cfg'" in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- probing files before any work


@pytest.mark.parametrize(
    ("name", "data", "encoding"),
    [
        ("utf16.jsonl", '{"text": "hello"}\n'.encode("utf-16"), "UTF-16"),  # with a byte-order mark
        ("utf16be.txt", "hello world\n".encode("utf-16-be"), "without a byte-order mark"),
        ("utf32.txt", "hello\n".encode("utf-32"), "UTF-32"),
    ],
)
def test_file_source_check_refuses_utf16_and_utf32_text(tmp_path, name, data, encoding):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(GptlabError, match=f"{name} is not UTF-8 text .*{encoding}.*iconv"):
        open_source(str(tmp_path / name)).check()


def test_file_source_check_reads_only_the_first_record_of_a_jsonl(tmp_path):
    (tmp_path / "late.jsonl").write_text('{"text": "fine"}\n{broken\n')
    open_source(str(tmp_path / "late.jsonl")).check()  # the broken line is found while reading, not by the probe
    (tmp_path / "early.jsonl").write_text('\n{"body": "no text field"}\n')
    with pytest.raises(GptlabError, match="early.jsonl, line 2: no 'text' field"):
        open_source(str(tmp_path / "early.jsonl")).check()


def test_file_source_check_refuses_a_fake_parquet_and_a_missing_or_numeric_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "fake.parquet").write_text("text,not parquet\n")
    with pytest.raises(GptlabError, match="fake.parquet is not a readable parquet file"):
        open_source(str(tmp_path / "fake.parquet")).check()
    pq.write_table(pa.table({"content": ["a"], "count": [1]}), tmp_path / "real.parquet")
    with pytest.raises(GptlabError, match="no 'text' column .*content, count"):
        open_source(str(tmp_path / "real.parquet")).check()
    with pytest.raises(GptlabError, match="column 'count' holds int64, not text"):
        open_source(str(tmp_path / "real.parquet"), SourceOptions(text_field="count")).check()


def test_jsonl_with_a_utf8_byte_order_mark_reads_its_first_record(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": "first"}).encode() + b"\n" + json.dumps({"text": "second"}).encode() + b"\n")
    source = open_source(str(path))
    source.check()
    assert list(source) == ["first", "second"]


def test_parquet_binary_column_is_decoded_as_utf8(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([b"caf\xc3\xa9", b"bad \xff"], type=pa.binary())}), tmp_path / "b.parquet")
    source = open_source(str(tmp_path / "b.parquet"))
    source.check()
    assert list(source) == ["café", "bad \ufffd"] and source.utf8_replaced == 1
