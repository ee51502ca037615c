"""Any text file is a document, told from binary by its content; binary files in a folder are skipped and counted,
the same way by `data prepare` and `tokenizer train --input` (one reader: gptlab.data.sources.scan_inputs)."""

import json
from pathlib import Path

import pytest

from gptlab.cli.main import main
from gptlab.data.sources import ScannedInputs, is_text_file, scan_inputs
from gptlab.runtime import GptlabError

from .conftest import decode_split

TEXTS = {"notes.md": "# Notes\nThe fox jumps.\n", "tool.py": "def add(a, b):\n    return a + b\n",
         "sub/README": "no suffix at all, still text: café\n", "data.csv": "a,b\n1,2\n"}
BINARY = {"logo.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "blob.bin": bytes(range(256)), "latin.txt": "café".encode("latin-1")}


def write_folder(root, texts=TEXTS, binary=BINARY):
    root.mkdir(exist_ok=True)
    for name, text in texts.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    for name, data in binary.items():
        (root / name).write_bytes(data)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # hidden: not the user's documents
    return root


def test_is_text_file_decides_by_content_not_by_name(tmp_path):
    write_folder(tmp_path)
    assert all(is_text_file(tmp_path / name) for name in TEXTS)
    assert not any(is_text_file(tmp_path / name) for name in BINARY)
    # a multi-byte character cut by the probe's end is still text
    (tmp_path / "long.txt").write_text("é" * 5000, encoding="utf-8")
    assert is_text_file(tmp_path / "long.txt")


def test_scan_inputs_takes_every_text_file_and_lists_the_binary_ones(tmp_path):
    write_folder(tmp_path)
    scanned = scan_inputs([str(tmp_path)])
    assert scanned.files == sorted(tmp_path / name for name in TEXTS)
    assert sorted(path.name for path in scanned.binary) == sorted(BINARY)
    assert scanned.skipped_line() == "skipped 3 binary files: blob.bin, latin.txt, logo.png"
    assert scan_inputs([str(tmp_path / "tool.py")]).files == [tmp_path / "tool.py"]  # named directly: any suffix
    assert ScannedInputs([], [Path(f"b{i}") for i in range(4)]).skipped_line() == "skipped 4 binary files: b0, b1, b2, ..."


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: root / "missing", "input not found"),
    (lambda root: root, "holds no files"),
    (lambda root: write_folder(root, texts={}), "holds only binary files (skipped 3 binary files: blob.bin, latin.txt, logo.png)"),
    (lambda root: write_folder(root) / "logo.png", "logo.png is not text"),
])
def test_scan_inputs_refuses_input_without_text_in_one_line(tmp_path, make, message):
    with pytest.raises(GptlabError) as raised:
        scan_inputs([str(make(tmp_path))])
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_data_prepare_reads_any_text_file_and_says_which_binary_files_it_skipped(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    folder = write_folder(tmp_path / "corpus")
    out = tmp_path / "out"
    assert main(["data", "prepare", str(folder), "-t", str(tmp_path / "tok"), "--out", str(out), "--val", "0",
                 "--no-shuffle", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == "skipped 3 binary files: blob.bin, latin.txt, logo.png"
    documents = decode_split(out, "train", tokenizer)
    assert documents == [(folder / name).read_text(encoding="utf-8") for name in sorted(TEXTS)]
    assert json.loads((out / "manifest.json").read_text())["documents"]["read"] == len(TEXTS)


def test_tokenizer_train_reads_the_same_files_as_data_prepare(tmp_path, capsys):
    from gptlab.tokenizer import Tokenizer

    folder = write_folder(tmp_path / "corpus")
    assert main(["tokenizer", "train", "--input", str(folder), "--vocab-size", "270", "--out", str(tmp_path / "tok")]) == 0
    printed = capsys.readouterr().out
    assert "skipped 3 binary files: blob.bin, latin.txt, logo.png" in printed and f"on {len(TEXTS)} files" in printed
    # the same merges as training on exactly the text files' contents
    reference = Tokenizer.train([(folder / name).read_text(encoding="utf-8") for name in sorted(TEXTS)], vocab_size=270)
    assert Tokenizer.load(tmp_path / "tok").merges == reference.merges


def test_a_folder_of_binary_files_only_is_refused_by_both_commands_leaving_nothing(tmp_path, tokenizer, capsys):
    tokenizer.save(tmp_path / "tok")
    folder = write_folder(tmp_path / "corpus", texts={})
    for args in (["data", "prepare", str(folder), "-t", str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "--quiet"],
                 ["tokenizer", "train", "--input", str(folder), "--vocab-size", "270", "--out", str(tmp_path / "out")]):
        assert main(args) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "holds only binary files" in err
        assert not (tmp_path / "out").exists()


def test_tokenizer_train_reads_records_files_as_data_prepare_does(tmp_path, capsys):
    from gptlab.tokenizer import Tokenizer

    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.txt").write_text("plain text that is one document\n" * 10)
    records = ["the first record's text", "and the second one, longer than the first"] * 5
    (folder / "b.jsonl").write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(records)))
    assert main(["tokenizer", "train", "--input", str(folder), "--vocab-size", "280", "--out", str(tmp_path / "tok")]) == 0
    # the .jsonl's text fields are its documents, not its raw lines (no "id" or braces learned)
    reference = Tokenizer.train([(folder / "a.txt").read_text(), *records], vocab_size=280)
    assert Tokenizer.load(tmp_path / "tok").merges == reference.merges
