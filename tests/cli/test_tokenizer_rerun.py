"""`tokenizer train` reruns as `data prepare` does: the same inputs and settings into the folder it made earlier keep
its tokenizer; anything else there is refused in one line naming what is there and what to pass."""

import json

import pytest

from gptlab.cli.main import main
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer.train_record import RECORD_FILE


def snapshot(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    (folder / "b.md").write_text("# pack my box with five dozen liquor jugs\n" * 20)
    return folder


def train(corpus, out, *extra):
    return main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "280", "--out", str(out), *extra])


def test_a_rerun_with_the_same_inputs_keeps_the_tokenizer_it_made(corpus, tmp_path, capsys):
    out = tmp_path / "tok"
    assert train(corpus, out) == 0
    before = snapshot(out)
    assert sorted(before) == ["tokenizer.json", RECORD_FILE]
    record = json.loads(before[RECORD_FILE])
    assert [entry["path"] for entry in record["inputs"]] == [str(corpus / "a.txt"), str(corpus / "b.md")]
    capsys.readouterr()
    assert train(corpus, out) == 0
    assert capsys.readouterr().out.startswith(f"kept {out / 'tokenizer.json'}: trained earlier from the same inputs")
    assert snapshot(out) == before
    # what it kept is what training gives: the same merges as a fresh folder's
    assert train(corpus, tmp_path / "fresh") == 0
    assert Tokenizer.load(tmp_path / "fresh").merges == Tokenizer.load(out).merges


@pytest.mark.parametrize(("change", "named"), [
    (lambda corpus: (corpus / "a.txt").write_text("edited\n"), "inputs: 2 -> 2 files, other contents"),
    (lambda corpus: (corpus / "c.txt").write_text("one more\n"), "inputs: 2 -> 3 files"),
    (lambda corpus: None, "vocab_size 280 -> 290"),
])
def test_other_inputs_or_settings_are_refused_until_force(corpus, tmp_path, capsys, change, named):
    out = tmp_path / "tok"
    assert train(corpus, out) == 0
    before = snapshot(out)
    change(corpus)
    extra = ["--vocab-size", "290"] if "vocab" in named else []
    capsys.readouterr()
    assert train(corpus, out, *extra) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "pass --force to replace it, or another --out" in err
    assert snapshot(out) == before
    assert train(corpus, out, *extra, "--force") == 0 and snapshot(out) != before


def test_a_folder_holding_something_else_is_refused_and_untouched(corpus, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert train(corpus, mine) == 1
    assert "holds things this command did not make (notes.txt)" in capsys.readouterr().err
    hand = tmp_path / "hand"
    hand.mkdir()
    (hand / "tokenizer.json").write_text("{}")
    assert train(corpus, hand) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no {RECORD_FILE} beside it" in err and "--force" in err
    assert snapshot(hand) == {"tokenizer.json": b"{}"} and snapshot(mine) == {"notes.txt": b"mine"}


def test_a_sentencepiece_rerun_keeps_its_model_too(corpus, tmp_path, capsys):
    out = tmp_path / "sp"
    args = ["--style", "sentencepiece", "--vocab-size", "300"]
    assert main(["tokenizer", "train", "--input", str(corpus), *args, "--out", str(out)]) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert main(["tokenizer", "train", "--input", str(corpus), *args, "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"kept {out / 'tokenizer.model'}") and snapshot(out) == before
