"""The val split: 1% of the documents by default (none, said so, for a single document), or exactly the
documents of an explicit val source (`val_source=`, `--val-from`)."""

from collections import Counter

import numpy as np
import pytest

from gptlab.cli.main import main
from gptlab.data import blocks as blocks_module
from gptlab.data.prepare import DEFAULT_VAL, PrepareConfig, prepare_shards
from gptlab.data.shards import read_manifest
from gptlab.runtime import GptlabError
from tests.data.conftest import QUIET, decode_split, documents_as_jsonl, folder_bytes, make_documents


def lines_of(text):
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(("n_documents", "n_val"), [(300, 3), (20, 1), (2, 1)])
def test_prepare_holds_out_one_percent_of_documents_by_default_at_least_one(tmp_path, tokenizer, n_documents, n_val):
    documents = make_documents(n_documents)
    result = prepare_shards(documents_as_jsonl(tmp_path, documents), tokenizer, tmp_path / "out", PrepareConfig(**QUIET))
    val, train = decode_split(tmp_path / "out", "val", tokenizer), decode_split(tmp_path / "out", "train", tokenizer)
    assert len(val) == n_val and Counter(train + val) == Counter(documents)
    assert result.manifest["val"] == DEFAULT_VAL == 0.01


def test_prepare_default_val_is_the_same_from_the_cli_and_from_python(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    source = documents_as_jsonl(tmp_path, make_documents(150))
    assert main(["data", "prepare", source, "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    assert "documents, 1 shards" in capsys.readouterr().out.split("  val: ")[1]  # a val split by default
    prepare_shards([source], tokenizer, tmp_path / "python", PrepareConfig(**QUIET))
    assert folder_bytes(tmp_path / "cli") == folder_bytes(tmp_path / "python")


def test_cli_prepare_single_document_gets_no_val_split_and_says_so(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    (tmp_path / "one.txt").write_text("The only document there is.")
    args = ["data", "prepare", str(tmp_path / "one.txt"), "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "  val: none (the source has a single document, which train needs)" in printed
    manifest = read_manifest(tmp_path / "out")
    assert list(manifest["splits"]) == ["train"] and manifest["val_skipped"] == "the source has a single document, which train needs"
    assert main(args) == 0
    assert "val: none (the source has a single document" in capsys.readouterr().out  # said again when already prepared


def test_cli_prepare_val_zero_turns_the_split_off(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    source = documents_as_jsonl(tmp_path, make_documents(30))
    assert main(["data", "prepare", source, "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--val", "0", "--quiet"]) == 0
    assert "  val: none (--val 0)" in capsys.readouterr().out
    assert list(read_manifest(tmp_path / "out")["splits"]) == ["train"]


# ---------------------------------------------------------------- an explicit val source


def test_prepare_val_source_is_exactly_the_held_out_shakespeare_works(tmp_path):
    from gptlab.data.corpus import shakespeare_files
    from gptlab.tokenizer.pretrained import load_pretrained

    gpt2 = load_pretrained("gpt2")
    files = shakespeare_files()
    held_out = files[9::10]  # as `gptlab run` holds works out of the tokenizer
    kept = [path for path in files if path not in held_out]
    config = PrepareConfig(shard_tokens=400_000, **QUIET)
    result = prepare_shards([str(p) for p in kept], gpt2, tmp_path / "out", config, val_source=[str(p) for p in held_out])
    val, train = decode_split(tmp_path / "out", "val", gpt2), decode_split(tmp_path / "out", "train", gpt2)
    assert Counter(val) == Counter(path.read_text(encoding="utf-8") for path in held_out)
    assert Counter(train) == Counter(path.read_text(encoding="utf-8") for path in kept)
    manifest = result.manifest
    assert manifest["val"] == 0 and manifest["val_source"]["files"] == [str(p) for p in held_out]
    assert manifest["splits"]["val"]["documents"] == 4 and manifest["documents"]["kept"] == 42


def test_prepare_val_source_is_shuffled_with_the_seed_or_kept_in_order(tmp_path, tokenizer):
    train_documents, val_documents = make_documents(30), make_documents(12, seed=1)
    source, val_source = documents_as_jsonl(tmp_path, train_documents), documents_as_jsonl(tmp_path, val_documents, name="val.jsonl")
    orders = {}
    for name, settings in {"a": {"seed": 3}, "b": {"seed": 3}, "c": {"seed": 4}, "none": {"shuffle": False}}.items():
        prepare_shards([source], tokenizer, tmp_path / name, PrepareConfig(**settings, **QUIET), val_source=[val_source])
        orders[name] = decode_split(tmp_path / name, "val", tokenizer)
    assert orders["a"] == orders["b"] != orders["c"] and Counter(orders["a"]) == Counter(val_documents)
    assert orders["none"] == val_documents and decode_split(tmp_path / "none", "train", tokenizer) == train_documents
    permutation = np.random.default_rng(3)
    permutation.permutation(30)  # the train split draws first
    assert orders["a"] == [val_documents[i] for i in permutation.permutation(12)]


def test_cli_prepare_val_from_with_val_is_one_line_and_leaves_nothing(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    source, val_source = documents_as_jsonl(tmp_path, make_documents(10)), documents_as_jsonl(tmp_path, make_documents(3, seed=1), name="v.jsonl")
    common = [source, "--val-from", val_source, "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--quiet"]
    assert main(["data", "prepare", *common, "--val", "0.1"]) == 1
    assert lines_of(capsys.readouterr().err) == ["gptlab: error: --val-from gives the val split, so --val must be 0 or unset, not 0.1"]
    assert not (tmp_path / "out").exists()
    assert main(["data", "prepare", *common, "--val", "0"]) == 0
    assert ", 3 documents, 1 shards" in capsys.readouterr().out.split("  val: ")[1]
    assert read_manifest(tmp_path / "out")["splits"]["val"]["documents"] == 3


def test_prepare_val_source_belongs_to_the_job(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(10))
    first, second = (documents_as_jsonl(tmp_path, make_documents(3, seed=s), name=f"v{s}.jsonl") for s in (1, 2))
    prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(**QUIET), val_source=[first])
    assert prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(**QUIET), val_source=[first]).status == "already prepared"
    for other in ({"val_source": [second]}, {}):
        with pytest.raises(GptlabError, match="made with other arguments"):
            prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(**QUIET), **other)


def test_prepare_val_source_refuses_a_file_in_both_splits(tmp_path, tokenizer):
    source, shared = documents_as_jsonl(tmp_path, make_documents(10)), documents_as_jsonl(tmp_path, make_documents(3, seed=1), name="v.jsonl")
    with pytest.raises(GptlabError, match="1 file.* in both the source and --val-from .*v.jsonl"):
        prepare_shards([source, shared], tokenizer, tmp_path / "out", PrepareConfig(**QUIET), val_source=[shared])
    assert not (tmp_path / "out").exists()


def test_prepare_val_source_without_text_is_an_error_that_leaves_nothing(tmp_path, tokenizer):
    source = documents_as_jsonl(tmp_path, make_documents(10))
    (tmp_path / "blank.txt").write_text("  \n")
    with pytest.raises(GptlabError, match=r"the val source \(--val-from\) has no documents with text \(1 empty"):
        prepare_shards([source], tokenizer, tmp_path / "out", PrepareConfig(**QUIET), val_source=[str(tmp_path / "blank.txt")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("interrupted_at", ["block", "val_block"])
def test_prepare_val_source_resumes_after_an_interruption(tmp_path, tokenizer, monkeypatch, interrupted_at):
    source = documents_as_jsonl(tmp_path, make_documents(150))
    val_source = documents_as_jsonl(tmp_path, make_documents(60, seed=1), name="val.jsonl")
    config = PrepareConfig(shard_tokens=3000, workers=1, **QUIET)
    monkeypatch.setattr(blocks_module, "BLOCK_CHARS", 2000)
    prepare_shards([source], tokenizer, tmp_path / "reference", config, val_source=[val_source])
    real = blocks_module._write_block

    def interrupted(work, prefix, index, *args):
        if (prefix, index) == (interrupted_at, 2):
            raise KeyboardInterrupt
        return real(work, prefix, index, *args)

    monkeypatch.setattr(blocks_module, "_write_block", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards([source], tokenizer, tmp_path / "out", config, val_source=[val_source])
    monkeypatch.setattr(blocks_module, "_write_block", real)
    read_again = []
    real_blocks = blocks_module._blocks

    def reading(source, *args):
        read_again.append(source.files[0].name)
        return real_blocks(source, *args)

    monkeypatch.setattr(blocks_module, "_blocks", reading)
    assert prepare_shards([source], tokenizer, tmp_path / "out", config, val_source=[val_source]).status == "resumed"
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "reference")
    # a source read to its end before the interruption is not read again
    assert read_again == (["docs.jsonl", "val.jsonl"] if interrupted_at == "block" else ["val.jsonl"])
