"""The `gptlab` command as a user runs it: outputs checked against the Python API, errors in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptlab.cli.main import main
from gptlab.tokenizer import Tokenizer

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


@pytest.fixture()
def corpus(tmp_path: Path) -> list[Path]:
    files = []
    for i in range(3):
        path = tmp_path / "corpus" / f"doc{i}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(TEXT + f"document {i} ünïcödé 世界\n", encoding="utf-8")
        files.append(path)
    return files


@pytest.fixture()
def trained(tmp_path: Path, corpus: list[Path]) -> Path:
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", "--input", str(corpus[0].parent), "--vocab-size", "300", "--out", str(out)]) == 0
    return out


def test_cli_train_matches_the_python_api(tmp_path, corpus, trained):
    reference = Tokenizer.train(files=corpus, vocab_size=300, pattern="gpt4", special_tokens=["<|endoftext|>"])
    loaded = Tokenizer.load(trained)
    assert loaded.merges == reference.merges
    assert loaded.special_tokens == {"<|endoftext|>": 299}


def test_cli_encode_decode_round_trip_through_files(tmp_path, corpus, trained, capsys):
    ids_file = tmp_path / "ids.txt"
    assert main(["tokenizer", "encode", "-t", str(trained), str(corpus[1]), "--out", str(ids_file)]) == 0
    ids = [int(word) for word in ids_file.read_text().split()]
    assert ids == Tokenizer.load(trained).encode(corpus[1].read_text(encoding="utf-8"))
    assert main(["tokenizer", "decode", "-t", str(trained), str(ids_file)]) == 0
    assert capsys.readouterr().out == corpus[1].read_text(encoding="utf-8")


def test_cli_encode_special_tokens_follow_tiktoken_rules(tmp_path, trained, capsys):
    reference = Tokenizer.load(trained).to_tiktoken()
    text = "a<|endoftext|>b"
    text_file = tmp_path / "special.txt"
    text_file.write_text(text, encoding="utf-8")
    assert main(["tokenizer", "encode", "-t", str(trained), str(text_file)]) == 1
    assert "special token '<|endoftext|>'" in capsys.readouterr().err
    assert main(["tokenizer", "encode", "-t", str(trained), "--allow-special", str(text_file)]) == 0
    assert capsys.readouterr().out == " ".join(map(str, reference.encode(text, allowed_special="all"))) + "\n"
    assert main(["tokenizer", "encode", "-t", str(trained), "--special-as-text", str(text_file)]) == 0
    assert capsys.readouterr().out == " ".join(map(str, reference.encode(text, disallowed_special=()))) + "\n"


def test_cli_show_prints_boundaries_and_stats(trained, capsys):
    assert main(["tokenizer", "show", "-t", str(trained), "Speak, speak.", "--color", "never", "--ids"]) == 0
    lines = capsys.readouterr().out.splitlines()
    reference = Tokenizer.load(trained).to_tiktoken()
    ids = reference.encode("Speak, speak.")
    assert lines[0] == "|".join(reference.decode([i]) for i in ids)
    assert lines[1] == " ".join(map(str, ids))
    assert lines[-1] == f"-- {len(ids)} tokens, 13 characters, 13 bytes, {13 / len(ids):.2f} bytes/token"


def test_cli_show_colours_tokens_when_asked(trained, capsys):
    """Each token gets its own background colour; without the escape codes the text reads as given."""
    import re

    assert main(["tokenizer", "show", "-t", str(trained), "Speak, speak.", "--color", "always"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    pieces = re.findall(r"\x1b\[([0-9;]+)m(.*?)\x1b\[0m", first)
    reference = Tokenizer.load(trained).to_tiktoken()
    assert [text for _, text in pieces] == [reference.decode([i]) for i in reference.encode("Speak, speak.")]
    assert all(colour != next_colour for (colour, _), (next_colour, _) in zip(pieces, pieces[1:]))


def test_cli_train_refuses_to_overwrite_without_force(tmp_path, corpus, trained, capsys):
    before = (trained / "tokenizer.json").read_bytes()
    args = ["tokenizer", "train", "--input", str(corpus[0]), "--vocab-size", "280", "--out", str(trained)]
    assert main(args) == 1
    assert "--force" in capsys.readouterr().err
    assert (trained / "tokenizer.json").read_bytes() == before
    assert main(args + ["--force"]) == 0
    assert Tokenizer.load(trained).vocab_size == 280


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tokenizer", "train", "--input", "missing.txt", "--vocab-size", "300", "--out", "x"], "input not found: missing.txt"),
        (["tokenizer", "train", "--input", "{corpus}", "--vocab-size", "100", "--out", "{out}"], "vocab_size 100 is too small"),
        (["tokenizer", "decode", "-t", "{tok}", "{ids}"], "unknown token id 99999"),
        (["tokenizer", "encode", "-t", "{bad}", "{corpus}"], "is truncated or not JSON"),
        (["tokenizer", "encode", "-t", "{tok}", "{binary}"], "not valid UTF-8"),
        (["tokenizer", "train", "--input", "{empty}", "--vocab-size", "300", "--out", "{out}"], "corpus is empty"),
    ],
)
def test_cli_bad_input_gives_one_line_and_no_output(tmp_path, corpus, trained, capsys, args, message):
    (tmp_path / "ids.txt").write_text("1 2 99999")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text('{"format": "gptlab-bpe", "version": 1, "vocab": [')
    (tmp_path / "binary.txt").write_bytes(b"ok \xff\xfe not utf-8")
    (tmp_path / "empty.txt").write_text("")
    names = {"corpus": corpus[0], "out": tmp_path / "new", "tok": trained, "ids": tmp_path / "ids.txt",
             "bad": tmp_path / "bad", "binary": tmp_path / "binary.txt", "empty": tmp_path / "empty.txt"}
    assert main([arg.format(**names) for arg in args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "new").exists()


def test_cli_usage_errors_exit_2_in_one_line():
    result = subprocess.run([sys.executable, "-m", "gptlab.cli.main", "tokenizer", "train", "--vocab-size", "x"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "invalid int value" in result.stderr


def test_cli_console_script_is_installed():
    script = Path(sys.executable).parent / ("gptlab.exe" if os.name == "nt" else "gptlab")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("gptlab ")


def test_cli_train_regex_trains_like_the_python_api(tmp_path, corpus):
    out = tmp_path / "tok"
    args = ["tokenizer", "train", "--input", str(corpus[0]), "--vocab-size", "290", "--regex", r"\w+|\s+|[^\w\s]+", "--out", str(out)]
    assert main(args) == 0
    reference = Tokenizer.train(files=[corpus[0]], vocab_size=290, pattern=r"\w+|\s+|[^\w\s]+", special_tokens=["<|endoftext|>"])
    assert Tokenizer.load(out).fingerprint() == reference.fingerprint()
    literal = tmp_path / "literal"
    assert main(["tokenizer", "train", "--input", str(corpus[0]), "--vocab-size", "290", "--regex", "speak", "--out", str(literal)]) == 0
    assert Tokenizer.load(literal).pattern == "speak"  # --regex takes even a name-like string as a regex


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--pattern", "gpt9"], "argument --pattern: invalid choice: 'gpt9'"),
        (["--pattern", "gpt2", "--regex", "a+"], "argument --regex: not allowed with argument --pattern"),
    ],
)
def test_cli_train_pattern_takes_only_names(tmp_path, corpus, options, message):
    args = ["tokenizer", "train", "--input", str(corpus[0]), "--vocab-size", "290", *options, "--out", str(tmp_path / "new")]
    result = subprocess.run([sys.executable, "-m", "gptlab.cli.main", *args], capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "new").exists()


def test_cli_train_bad_regex_fails_before_reading_any_input(tmp_path, capsys):
    args = ["tokenizer", "train", "--input", str(tmp_path / "missing.txt"), "--vocab-size", "290", "--regex", "(", "--out", str(tmp_path / "new")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err == "gptlab: error: split regex '(' does not compile: missing ) at position 1\n"
    assert not (tmp_path / "new").exists()


def snapshot(root: Path) -> list:
    """Every path under `root` with its bytes: to prove a refused command left the disk as it was."""
    return sorted((str(path.relative_to(root)), path.read_bytes() if path.is_file() else None) for path in root.rglob("*"))


def test_cli_decode_takes_ids_inline(trained, capsys):
    from gptlab.tokenizer.pretrained import tiktoken_reference

    assert main(["tokenizer", "decode", "-t", "gpt2", "15496", "11", "995"]) == 0
    assert capsys.readouterr().out == tiktoken_reference("gpt2").decode([15496, 11, 995]) == "Hello, world"
    assert main(["tokenizer", "decode", "-t", "gpt2", "15496 11", "995"]) == 0  # one quoted argument holds several
    assert capsys.readouterr().out == "Hello, world"
    ids = Tokenizer.load(trained).encode("Speak, speak. 世界")
    assert main(["tokenizer", "decode", "-t", str(trained), *map(str, ids)]) == 0
    assert capsys.readouterr().out == "Speak, speak. 世界"


def test_cli_decode_reads_files_and_stdin(tmp_path, monkeypatch, capsys):
    import io

    (tmp_path / "ids.txt").write_text("15496 11\n995\n")
    assert main(["tokenizer", "decode", "-t", "gpt2", str(tmp_path / "ids.txt")]) == 0
    assert capsys.readouterr().out == "Hello, world"
    monkeypatch.setattr(sys, "stdin", io.StringIO("15496 11 995"))
    assert main(["tokenizer", "decode", "-t", "gpt2"]) == 0
    assert capsys.readouterr().out == "Hello, world"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (["15496", "{ids}"], "decode got ids (15496) and a file name"),
        (["{words}"], "'x3' is not a token id; ids are whitespace-separated integers"),
        (["15496", "99999"], "unknown token id 99999"),
        (["{missing}"], "input file not found: {missing} (decode reads arguments that are all integers as ids, others as files"),
        (["1.5"], "input file not found: 1.5 (decode reads arguments that are all integers as ids"),
    ],
)
def test_cli_decode_bad_ids_give_one_line_and_no_output(tmp_path, capsys, inputs, message):
    (tmp_path / "ids.txt").write_text("1 2 3")
    (tmp_path / "words.txt").write_text("1 2 x3")
    names = {"ids": tmp_path / "ids.txt", "words": tmp_path / "words.txt", "missing": tmp_path / "missing.txt"}
    before = snapshot(tmp_path)
    args = ["tokenizer", "decode", "-t", "gpt2", *[arg.format(**names) for arg in inputs], "--out", str(tmp_path / "out.txt")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert message.format(**names) in err and err.count("\n") == 1
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("a_file", "--out {root}/a_file is a file, not a folder; pass a folder path"),
        ("a_file/tok", "{root}/a_file is a file, not a folder"),
        ("others", "holds things this command did not make (notes.txt)"),
        ("tok", "tok holds a tokenizer trained with other inputs or settings ("),
    ],
)
def test_cli_train_out_is_checked_before_training(tmp_path, corpus, trained, capsys, out, message):
    (tmp_path / "a_file").write_text("mine")
    (tmp_path / "others").mkdir()
    (tmp_path / "others" / "notes.txt").write_text("mine too")
    before = snapshot(tmp_path)
    assert main(["tokenizer", "train", "--input", str(corpus[0]), "--vocab-size", "280", "--out", str(tmp_path / out)]) == 1
    err = capsys.readouterr().err
    assert message.format(root=tmp_path) in err and err.count("\n") == 1
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("verb, inputs", [("encode", ["{text}"]), ("decode", ["1", "2"])])
@pytest.mark.parametrize("out", ["a_folder", "a_file/out.txt"])
def test_cli_encode_decode_out_must_be_a_file_path(tmp_path, capsys, verb, inputs, out):
    (tmp_path / "text.txt").write_text("hello")
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("mine")
    before = snapshot(tmp_path)
    args = ["tokenizer", verb, "-t", "gpt2", *[arg.format(text=tmp_path / "text.txt") for arg in inputs], "--out", str(tmp_path / out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert ("is a folder; pass a file path" in err or "is a file, not a folder" in err) and err.count("\n") == 1
    assert snapshot(tmp_path) == before


def test_ctrl_c_while_starting_up_is_one_line_and_exit_130(monkeypatch, capsys):
    import gptlab.cli.main as cli_main

    def interrupted(stage=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "build_parser", interrupted)
    assert cli_main.main(["train", "--help"]) == 130
    assert capsys.readouterr().err == "gptlab: interrupted\n"
