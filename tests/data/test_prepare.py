"""`prepare_shards` and `gptlab data prepare`: shards decode back to exactly the documents."""

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

from gptlab.cli.main import main
from gptlab.data import blocks as blocks_module
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.data.shards import open_shard, read_header, read_manifest, split_shards
from gptlab.data.sources import SourceOptions
from gptlab.runtime import GptlabError
from tests.data.conftest import QUIET, decode_split, documents_as_jsonl, make_documents


def test_prepare_shakespeare_round_trips_every_document(tmp_path):
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.tokenizer.pretrained import load_pretrained

    gpt2 = load_pretrained("gpt2")
    result = prepare_shards("shakespeare", gpt2, tmp_path, PrepareConfig(val=0.1, shard_tokens=300_000, **QUIET))
    train, val = decode_split(tmp_path, "train", gpt2), decode_split(tmp_path, "val", gpt2)
    assert Counter(train + val) == Counter(shakespeare_documents())
    assert not set(train) & set(val)
    assert len(val) == 4 and result.manifest["splits"]["val"]["documents"] == 4
    manifest = read_manifest(tmp_path)
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["fingerprint"] == gpt2.fingerprint()
    shards = manifest["splits"]["train"]["shards"]
    assert all(entry["tokens"] == 300_000 for entry in shards[:-1]) and len(shards) > 3
    for entry in shards:
        header = read_header(tmp_path / entry["file"])
        assert (header.n_tokens, header.n_documents, header.fingerprint) == (entry["tokens"], entry["documents"], gpt2.fingerprint())
    assert sum(entry["documents"] for entry in shards) == 38
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".bin")) == ["manifest.json", "token_bytes.npy", "tokenizer.json"]
    token_bytes = np.load(tmp_path / "token_bytes.npy")
    ids = gpt2.encode(shakespeare_documents()[0])
    assert int(token_bytes[ids].sum()) == len(shakespeare_documents()[0].encode()) and token_bytes[gpt2.eot_id] == 0


def test_ids_equal_the_tokenizer_on_each_document(tmp_path, tokenizer):
    documents = make_documents(10)
    prepare_shards(documents_as_jsonl(tmp_path, documents), tokenizer, tmp_path / "out", PrepareConfig(val=0, shuffle=False, **QUIET))
    stream = np.concatenate([np.asarray(open_shard(p)[1]) for p, _ in split_shards(tmp_path / "out", "train")])
    expected = [i for d in documents for i in [tokenizer.eot_id, *tokenizer.encode_ordinary(d)]]
    assert stream.tolist() == expected  # unshuffled: source order, separators where they belong


def test_jsonl_parquet_txt_and_local_dataset_give_the_same_documents(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    documents = make_documents(30)
    jsonl = documents_as_jsonl(tmp_path, documents)
    dataset_dir = tmp_path / "dataset"
    dataset_dir.mkdir()
    pq.write_table(pa.table({"content": documents[:15]}), dataset_dir / "part-0.parquet")
    pq.write_table(pa.table({"content": documents[15:]}), dataset_dir / "part-1.parquet")
    (tmp_path / "joined.txt").write_text("\n=====\n".join(documents), encoding="utf-8")
    runs = {
        "jsonl": ([jsonl], SourceOptions()),
        "parquet": ([str(dataset_dir / "*.parquet")], SourceOptions(text_field="content")),
        "txt": ([str(tmp_path / "joined.txt")], SourceOptions(separator="\n=====\n")),
        "datasets": ([f"hf:{dataset_dir}"], SourceOptions(text_field="content")),
    }
    for name, (specs, options) in runs.items():
        out = tmp_path / name
        prepare_shards(specs, tokenizer, out, PrepareConfig(val=0.2, **QUIET), options=options)
        train, val = decode_split(out, "train", tokenizer), decode_split(out, "val", tokenizer)
        assert Counter(train + val) == Counter(documents), name
        assert len(val) == 6 and not set(train) & set(val), name
        # Same documents in the same order and the same seed: the same shards, whatever the file format.
        assert (out / "train_000000.bin").read_bytes() == (tmp_path / "jsonl" / "train_000000.bin").read_bytes(), name


def test_shuffle_is_seeded_and_reproducible(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(50))
    outs = {}
    configs = {"a": {"seed": 1}, "b": {"seed": 1}, "c": {"seed": 2}, "none": {"shuffle": False}}
    for name, settings in configs.items():
        prepare_shards(source, tokenizer, tmp_path / name, PrepareConfig(val=0, **settings, **QUIET))
        outs[name] = decode_split(tmp_path / name, "train", tokenizer)
    assert outs["a"] == outs["b"]
    assert outs["a"] != outs["c"] and Counter(outs["a"]) == Counter(outs["c"])
    assert outs["none"] == make_documents(50)


def test_val_as_token_count_takes_whole_documents(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(40))
    result = prepare_shards(source, tokenizer, tmp_path / "out", PrepareConfig(val=1000, **QUIET))
    val = result.manifest["splits"]["val"]
    lengths = [len(tokenizer.encode_ordinary(d)) + 1 for d in decode_split(tmp_path / "out", "val", tokenizer)]
    assert val["tokens"] == sum(lengths) >= 1000
    assert sum(lengths[:-1]) < 1000  # no more documents than needed


def test_empty_and_non_utf8_documents_are_counted(tmp_path, tokenizer):
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": "good one"}), json.dumps({"text": ""}), json.dumps({"text": "   \n"}), "", json.dumps({"text": "fine"})]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"text": "bad \xff\xfe bytes"}\n')
    result = prepare_shards([str(path)], tokenizer, tmp_path / "out", PrepareConfig(val=0, shuffle=False, **QUIET))
    assert result.manifest["documents"] == {"read": 5, "kept": 3, "empty_skipped": 2, "utf8_replaced": 1}
    assert decode_split(tmp_path / "out", "train", tokenizer) == ["good one", "fine", "bad \ufffd\ufffd bytes"]


RESUME_SCRIPT = """
import sys, time
from gptlab.data import blocks
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.tokenizer import Tokenizer
blocks.BLOCK_CHARS = 2000
real = blocks._write_block
def slow(*args, **kwargs):
    time.sleep(0.02)  # widen the window the test kills in
    return real(*args, **kwargs)
blocks._write_block = slow
prepare_shards([sys.argv[1]], Tokenizer.load(sys.argv[2]), sys.argv[3], PrepareConfig(val=0.1, shard_tokens=5000, workers=int(sys.argv[4]), progress=False))
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_resumes_after_kill_9_without_losing_or_duplicating(tmp_path, tokenizer, monkeypatch, workers):
    source = documents_as_jsonl(tmp_path, make_documents(400))
    tokenizer.save(tmp_path / "tok")
    reference = tmp_path / "reference"
    monkeypatch.setattr(blocks_module, "BLOCK_CHARS", 2000)
    prepare_shards([source], tokenizer, reference, PrepareConfig(val=0.1, shard_tokens=5000, workers=workers, progress=False))

    out = tmp_path / "out"
    command = [sys.executable, "-c", RESUME_SCRIPT, source, str(tmp_path / "tok"), str(out), str(workers)]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 60
    while not (out / ".prepare" / "block_000010.json").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "manifest.json").exists(), "the run finished before it was killed"
    assert (out / ".prepare" / "block_000010.json").exists()

    result = prepare_shards([source], tokenizer, out, PrepareConfig(val=0.1, shard_tokens=5000, workers=workers, progress=False))
    assert result.status == "resumed"
    assert result.manifest["splits"] == read_manifest(reference)["splits"]
    for entry in [*result.manifest["splits"]["train"]["shards"], *result.manifest["splits"]["val"]["shards"]]:
        assert (out / entry["file"]).read_bytes() == (reference / entry["file"]).read_bytes()
    assert not (out / ".prepare").exists()


def test_prepare_rewrites_missing_or_damaged_shards_on_rerun(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(100))
    config = PrepareConfig(shard_tokens=2000, **QUIET)
    first = prepare_shards([source], tokenizer, tmp_path / "out", config)
    originals = {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.bin")}
    # A crash in the sharding pass: no manifest yet, one shard missing, one cut short.
    (tmp_path / "out" / "manifest.json").unlink()
    (tmp_path / "out" / "train_000001.bin").unlink()
    with open(tmp_path / "out" / "train_000002.bin", "r+b") as handle:
        handle.truncate(100)
    (tmp_path / "out" / ".prepare").mkdir()
    (tmp_path / "out" / ".prepare" / "job.json").write_text(json.dumps(first.manifest["job"]))
    with pytest.raises(GptlabError, match="truncated"):
        read_header(tmp_path / "out" / "train_000002.bin")
    prepare_shards([source], tokenizer, tmp_path / "out", config)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.bin")} == originals


def test_rerun_with_other_arguments_is_refused_unless_forced(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(20))
    prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(seed=1, **QUIET))
    before = (tmp_path / "out" / "train_000000.bin").read_bytes()
    with pytest.raises(GptlabError, match="other arguments"):
        prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(seed=2, **QUIET))
    assert (tmp_path / "out" / "train_000000.bin").read_bytes() == before  # nothing the user had is lost
    prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(seed=2, **QUIET), force=True)
    assert read_manifest(tmp_path / "out")["seed"] == 2


@pytest.mark.parametrize(
    "lines, options, message",
    [
        (['{"text": "a"}', "{not json"], SourceOptions(), "line 2: not valid JSON"),
        (['{"body": "a"}'], SourceOptions(), "line 1: no 'text' field"),
        (['{"text": 5}'], SourceOptions(), "not text"),
        (['{"text": ""}'], SourceOptions(), "no documents with text"),
    ],
)
def test_bad_jsonl_is_a_clear_error_and_leaves_no_manifest(tmp_path, tokenizer, lines, options, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(GptlabError, match=message):
        prepare_shards([str(path)], tokenizer, tmp_path / "out", PrepareConfig(**QUIET), options=options)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_val_taking_everything_is_an_error(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(3))
    with pytest.raises(GptlabError, match="leaving none to train on"):
        prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(val=10**9, **QUIET))


def test_prepare_refuses_missing_and_unsupported_inputs(tmp_path, tokenizer):
    with pytest.raises(GptlabError, match="input not found"):
        prepare_shards([str(tmp_path / "nope.jsonl")], tokenizer, tmp_path / "out")
    with pytest.raises(GptlabError, match="x.png is not text"):
        (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
        prepare_shards([str(tmp_path / "x.png")], tokenizer, tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_cli_prepare_prints_a_summary_and_is_idempotent(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    source = documents_as_jsonl(tmp_path, make_documents(30))
    args = ["data", "prepare", source, "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--val", "0.1", "--shard-tokens", "2K", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "prepared" in out and "train:" in out and "val:" in out
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("already prepared")
    assert main([*args[:-2], "3K", "--quiet"]) == 1
    assert "other arguments" in capsys.readouterr().err
    assert main(["data", "prepare", source, "-t", str(tmp_path / "nope"), "--out", str(tmp_path / "o2")]) == 1
    with pytest.raises(SystemExit) as usage:
        main(["data", "prepare", source, "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "o3"), "--val", "-1"])
    assert usage.value.code == 2 and not (tmp_path / "o3").exists()


def test_prepare_forced_replacement_leaves_none_of_the_old_jobs_shards(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(60))
    prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(val=0.1, shard_tokens=500, **QUIET))
    assert len(list((tmp_path / "out").glob("train_*.bin"))) > 3
    prepare_shards([source], tokenizer, tmp_path / "reference", PrepareConfig(shard_tokens=100_000, **QUIET))
    prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(shard_tokens=100_000, **QUIET), force=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in (tmp_path / "reference").iterdir())
