"""`gptlab tokenizer encode/decode/show --tokenizer X.model` on SentencePiece models, against the library."""

import pytest

from gptlab.cli.main import main
from gptlab.tokenizer.formats import token_to_text
from tests.tokenizer.sp_fixtures import SCRIPT_SAMPLES, model_maker, reference


@pytest.fixture(scope="session")
def sp_models(tmp_path_factory):
    return model_maker(tmp_path_factory)

TEXT = "Hello  world, Привет мир 你好 ☃ <s> and </s>"


@pytest.fixture()
def model(sp_models):
    return sp_models(vocab_size=1100, byte_fallback=True)


def test_sp_cli_encode_gives_the_library_ids(model, tmp_path, capsys):
    text_file = tmp_path / "in.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    assert main(["tokenizer", "encode", "--tokenizer", str(model), str(text_file)]) == 0
    assert capsys.readouterr().out.split() == [str(i) for i in reference(model).encode(TEXT)]


def test_sp_cli_decode_gives_the_library_text(model, capsys):
    ids = reference(model).encode(SCRIPT_SAMPLES["cyrillic"])
    assert main(["tokenizer", "decode", "--tokenizer", str(model), *map(str, ids)]) == 0
    assert capsys.readouterr().out == reference(model).decode(ids)


def test_sp_cli_show_prints_pieces_and_ids(model, tmp_path, capsys):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(model.read_bytes())
    assert main(["tokenizer", "show", "--tokenizer", str(folder), "Hello world ☃</s>", "--color", "never", "--ids"]) == 0
    lines = capsys.readouterr().out.splitlines()
    library = reference(model)
    ids = library.encode("Hello world ☃") + [library.eos_id()]  # show allows special tokens
    assert lines[1].split() == [str(i) for i in ids]
    piece_bytes = [bytes([int(library.id_to_piece(i)[3:5], 16)]) if library.is_byte(i) else library.id_to_piece(i).replace("▁", " ").encode() for i in ids]
    pieces = [token_to_text(data) for data in piece_bytes]  # the viewer shows stray bytes as \\xNN
    assert lines[0] == "|".join(pieces) and lines[0].endswith("|\\xe2|\\x98|\\x83|</s>")
    assert lines[2].startswith(f"-- {len(ids)} tokens")


def test_sp_cli_unigram_model_is_refused_in_one_line(sp_models, capsys):
    path = sp_models(vocab_size=400, model_type="unigram")
    assert main(["tokenizer", "encode", "--tokenizer", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("gptlab: error: ")
    assert "unigram" in captured.err and "Traceback" not in captured.err
