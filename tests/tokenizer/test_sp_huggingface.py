"""SentencePiece BPE models exported for Hugging Face: `tokenizers` and `transformers.AutoTokenizer` give the
`sentencepiece` library's ids and decodings on text in many scripts, emoji, rare characters and runs of spaces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece as spm
from tokenizers import Tokenizer as HFTokenizer
from transformers import AutoTokenizer

from gptlab.runtime import GptlabError
from gptlab.tokenizer.sp_huggingface import merges_of, save_huggingface_dir, to_huggingface_json
from gptlab.tokenizer.sp_model import Piece, SentencePieceModel, write_model
from gptlab.tokenizer.sp_train import train_sentencepiece

from .test_sp_train import HELD_OUT, LINES, corpus_text

TEXTS = [
    *HELD_OUT,
    *LINES,
    " ",
    "  two leading spaces",
    "▁already escaped",
    "trailing spaces   ",
    "ｆｕｌｌ　ｗｉｄｔｈ ① ﬁ",
    "🦜🦜🦜 and 𝔘",
]


@pytest.fixture(scope="module", params=[
    {"vocab_size": 450},
    {"vocab_size": 300, "byte_fallback": False, "character_coverage": 0.98},
    {"vocab_size": 450, "normalizer": "nmt_nfkc", "remove_extra_whitespaces": True},
], ids=["bytes", "no-bytes", "nmt_nfkc"])
def exported(request, tmp_path_factory) -> tuple[SentencePieceModel, spm.SentencePieceProcessor, Path]:
    folder = tmp_path_factory.mktemp("sp")
    model = train_sentencepiece([corpus_text()], **request.param)
    path = write_model(model, folder / "tokenizer.model")
    return model, spm.SentencePieceProcessor(model_file=str(path)), save_huggingface_dir(model, folder / "hf")


def test_tokenizers_json_gives_the_librarys_ids_and_text(exported):
    model, processor, _ = exported
    tokenizer = HFTokenizer.from_str(to_huggingface_json(model))
    for text in TEXTS:
        ids = processor.encode(text)
        assert tokenizer.encode(text, add_special_tokens=False).ids == ids, text
        assert tokenizer.decode(ids) == processor.decode(ids), text


def test_auto_tokenizer_gives_the_librarys_ids_without_bos(exported):
    _, processor, folder = exported
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        ids = processor.encode(text)
        assert tokenizer(text)["input_ids"] == ids, text
        assert tokenizer.decode(ids) == processor.decode(ids), text
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == ("<s>", "</s>", "<unk>")
    assert tokenizer.convert_tokens_to_ids(["<s>", "</s>"]) == [1, 2]


def test_merges_rank_joins_by_the_joined_pieces_score():
    pieces = [Piece("<unk>", 0, 2), Piece("▁t", 0), Piece("he", -1), Piece("▁the", -2), Piece("▁", -3), Piece("t", -4), Piece("h", -5), Piece("e", -6)]
    assert merges_of(SentencePieceModel(pieces=tuple(pieces))) == [("▁", "t"), ("h", "e"), ("▁t", "he")]


def test_save_huggingface_dir_keeps_other_files_and_refuses_gptlabs_own(tmp_path):
    model = train_sentencepiece(["hello world"], vocab_size=300)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    save_huggingface_dir(model, folder, model_max_length=128, chat_template="{{ messages }}")
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["add_bos_token"], config["model_max_length"], config["chat_template"]) == (False, 128, "{{ messages }}")
    assert (folder / "config.json").read_text(encoding="utf-8") == "{}"
    gptlab_own = tmp_path / "own"
    gptlab_own.mkdir()
    (gptlab_own / "tokenizer.json").write_text(json.dumps({"format": "gptlab-bpe", "version": 1}), encoding="utf-8")
    with pytest.raises(GptlabError, match="is gptlab's own tokenizer file"):
        save_huggingface_dir(model, gptlab_own)
    with pytest.raises(GptlabError, match="model_max_length must be a positive number"):
        save_huggingface_dir(model, tmp_path / "new", model_max_length=0)
    assert not (tmp_path / "new").exists()
    with pytest.raises(GptlabError, match="is a file"):
        save_huggingface_dir(model, folder / "config.json")
