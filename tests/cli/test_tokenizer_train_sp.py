"""`gptlab tokenizer train --style sentencepiece`: a tokenizer.model the library reads, wrong input in one line."""

from pathlib import Path

import pytest
import sentencepiece as spm

from gptlab.cli.main import main
from gptlab.tokenizer.sp_model import read_model
from gptlab.tokenizer.sp_train import train_sentencepiece

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nДа, говори. 说吧 😀\n" * 20


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_cli_train_sentencepiece_writes_the_python_apis_model(tmp_path, corpus, capsys):
    out = tmp_path / "sp"
    assert main(["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "340", "--out", str(out)]) == 0
    assert "saved" in capsys.readouterr().out
    assert read_model(out / "tokenizer.model").pieces == train_sentencepiece(files=[corpus], vocab_size=340).pieces
    processor = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    assert processor.decode(processor.encode(TEXT)) == TEXT
    assert main(["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "80", "--no-byte-fallback",
                 "--character-coverage", "0.99", "--normalizer", "nmt_nfkc", "--out", str(out), "--force"]) == 0
    model = read_model(out / "tokenizer.model")
    assert (len(model.pieces), model.byte_fallback, model.normalizer.name) == (80, False, "nmt_nfkc")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--character-coverage", "0"], "character_coverage must be in (0, 1], got 0.0"),
        (["--character-coverage", "1.5"], "character_coverage must be in (0, 1], got 1.5"),
        (["--vocab-size", "270"], "vocab_size 270 is too small: this model needs at least"),
        (["--pattern", "gpt2"], "--pattern does not apply to --style sentencepiece"),
    ],
)
def test_cli_train_sentencepiece_refuses_wrong_input_in_one_line(tmp_path, corpus, capsys, flags, message):
    out = tmp_path / "sp"
    arguments = ["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "340", "--out", str(out), *flags]
    assert main(arguments) == 1
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and "Traceback" not in error
    assert not out.exists()  # nothing left behind


def test_cli_train_refuses_an_unknown_style_and_sentencepiece_flags_for_bytelevel(tmp_path, corpus, capsys):
    base = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as stopped:  # a usage mistake: argparse's one line, exit 2 as for every gptlab flag
        main([*base, "--style", "wordpiece"])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "invalid choice: 'wordpiece'" in error and error.count("\n") == 1
    assert main([*base, "--normalizer", "nfkc"]) == 1
    assert "--normalizer does not apply to --style bytelevel" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_train_sentencepiece_refuses_a_folder_holding_other_things(tmp_path, corpus, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep", encoding="utf-8")
    assert main(["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "340", "--out", str(out)]) == 1
    assert "is not empty and holds things this command did not make (notes.txt)" in capsys.readouterr().err
    assert sorted(path.name for path in out.iterdir()) == ["notes.txt"]
    again = tmp_path / "again"
    assert main(["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "340", "--out", str(again)]) == 0
    assert main(["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "340", "--out", str(again)]) == 0
    assert "kept" in capsys.readouterr().out  # the same inputs and settings: its own model, kept
    assert main(["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "350", "--out", str(again)]) == 1
    assert "other inputs or settings (vocab_size 340 -> 350); pass --force to replace it" in capsys.readouterr().err
