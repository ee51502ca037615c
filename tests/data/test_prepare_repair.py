"""Prepare on a finished folder checks every shard and rewrites only the missing or damaged ones,
byte-identical to an untouched run."""

import json
import os

import pytest

from gptlab.cli.main import main
from gptlab.data import prepare as prepare_module
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.data.shards import HEADER_BYTES
from gptlab.runtime import GptlabError
from tests.data.conftest import QUIET, documents_as_jsonl, folder_bytes, make_documents

CONFIG = PrepareConfig(val=0.1, shard_tokens=2000, workers=1, **QUIET)


@pytest.fixture
def prepared(tmp_path, tokenizer):
    """(source, an untouched reference folder, a second identical folder to damage)."""
    source = documents_as_jsonl(tmp_path, make_documents(100))
    prepare_shards([source], tokenizer, tmp_path / "reference", CONFIG)
    prepare_shards([source], tokenizer, tmp_path / "out", CONFIG)
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "reference")
    return source, tmp_path / "reference", tmp_path / "out"


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGES = {
    "a flipped token byte": lambda path: flip(path, HEADER_BYTES + 101),
    "a flipped header byte (document count)": lambda path: flip(path, 24),
    "a flipped header byte (CRC-32)": lambda path: flip(path, 48),
    "a deleted shard": lambda path: path.unlink(),
    "a truncated shard": lambda path: os.truncate(path, 100),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
@pytest.mark.parametrize("name", ["train_000001.bin", "val_000000.bin"])
def test_prepare_rewrites_only_a_damaged_shard_byte_identical_to_an_untouched_run(prepared, tokenizer, damage, name):
    source, reference, out = prepared
    untouched = {path.name: path.stat().st_ino for path in out.glob("*.bin") if path.name != name}
    DAMAGES[damage](out / name)
    result = prepare_shards([source], tokenizer, out, CONFIG)
    assert result.status == "repaired" and len(result.rewritten) == 1 and result.rewritten[0].startswith(name)
    assert folder_bytes(out) == folder_bytes(reference)
    assert {path.name: path.stat().st_ino for path in out.glob("*.bin") if path.name != name} == untouched  # not rewritten
    assert prepare_shards([source], tokenizer, out, CONFIG).status == "already prepared"


def test_prepare_rewrites_several_damaged_shards_in_one_rerun(prepared, tokenizer):
    source, reference, out = prepared
    flip(out / "train_000000.bin", HEADER_BYTES)
    (out / "train_000003.bin").unlink()
    result = prepare_shards([source], tokenizer, out, CONFIG)
    assert [problem.split()[0] for problem in result.rewritten] == ["train_000000.bin", "train_000003.bin"]
    assert result.rewritten[1].endswith("is missing")
    assert folder_bytes(out) == folder_bytes(reference)


@pytest.mark.parametrize("name", ["token_bytes.npy", "tokenizer.json"])
def test_prepare_rewrites_damaged_tokenizer_files_without_reading_the_source(prepared, tokenizer, monkeypatch, name):
    source, reference, out = prepared
    (out / name).write_bytes(b"damaged")
    monkeypatch.setattr(prepare_module, "tokenize_blocks", lambda *args, **kwargs: pytest.fail("the source was read again"))
    result = prepare_shards([source], tokenizer, out, CONFIG)
    assert result.status == "repaired" and result.rewritten == [f"{name} was missing or damaged"]
    assert folder_bytes(out) == folder_bytes(reference)


def test_prepared_data_carries_the_tokenizer_that_made_it(prepared, tokenizer):
    from gptlab.data.match import data_tokenizer
    from gptlab.tokenizer.pretrained import load_any

    _, _, out = prepared
    assert load_any(str(out)).fingerprint() == tokenizer.fingerprint() == data_tokenizer(out).fingerprint()
    assert load_any(str(out)).encode("hello world") == tokenizer.encode("hello world")


def test_prepare_resume_rewrites_a_shard_whose_header_matches_but_tokens_do_not(prepared, tokenizer):
    source, reference, out = prepared
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").unlink()  # as if killed during the sharding pass
    (out / ".prepare").mkdir()
    (out / ".prepare" / "job.json").write_text(json.dumps(manifest["job"]))
    flip(out / "train_000002.bin", HEADER_BYTES + 7)
    assert prepare_shards([source], tokenizer, out, CONFIG).status == "resumed"
    assert folder_bytes(out) == folder_bytes(reference)


def test_cli_prepare_says_what_it_rewrote(prepared, tokenizer, capsys, tmp_path):
    source, reference, out = prepared
    tokenizer.save(tmp_path / "tok")
    flip(out / "val_000000.bin", HEADER_BYTES + 3)
    args = ["data", "prepare", source, "-t", str(tmp_path / "tok"), "--out", str(out), "--val", "0.1", "--shard-tokens", "2000", "--workers", "1", "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"repaired {out}") and "rewrote what was wrong: val_000000.bin is damaged" in printed
    assert folder_bytes(out) == folder_bytes(reference)


def test_prepare_refuses_a_damaged_manifest_unless_forced(prepared, tokenizer):
    source, reference, out = prepared
    (out / "manifest.json").write_text('{"format": "gptlab-sha')
    with pytest.raises(GptlabError, match="manifest.json is damaged.*pass --force"):
        prepare_shards([source], tokenizer, out, CONFIG)
    prepare_shards([source], tokenizer, out, CONFIG, force=True)
    assert folder_bytes(out) == folder_bytes(reference)
