"""A SentencePiece tokenizer through the stages that take any tokenizer: the chat tokens, the chat format,
streamed replies, and data preparation."""

import json

import pytest

from gptlab.chat.format import CHAT_TOKENS, ChatFormat, add_chat_tokens
from gptlab.chat.text import TextStream
from gptlab.data.match import data_tokenizer
from gptlab.tokenizer.pretrained import load_any
from gptlab.tokenizer.sentencepiece import SentencePieceTokenizer
from tests.tokenizer.sp_fixtures import model_maker, reference


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    return model_maker(tmp_path_factory)(vocab_size=600, byte_fallback=True, remove_extra_whitespaces=False)


def test_streamed_text_equals_the_librarys_decode(sp_model):
    tok, library = SentencePieceTokenizer.from_file(sp_model), reference(sp_model)
    for text in ["Hello world, and  two spaces", " leading space", "naïve 東京 😀 end", "<s> plain"]:
        ids = library.encode(text)
        stream = TextStream(tok)
        streamed = "".join(stream.add(i) for i in ids) + stream.flush()
        assert streamed == library.decode(ids) == tok.decode(ids)


def test_chat_tokens_are_added_as_control_pieces_and_rendered(sp_model, tmp_path):
    tok = add_chat_tokens(SentencePieceTokenizer.from_file(sp_model))
    assert set(CHAT_TOKENS) <= set(tok.special_tokens)
    ids = ChatFormat(tok).render([{"role": "user", "content": "hi <|end|>"}, {"role": "assistant", "content": "yo"}]).ids
    assert ids[0] == tok.eot_id and ids[1] == tok.special_tokens["<|user|>"]
    assert ids.count(tok.special_tokens["<|end|>"]) == 2  # the one in the content stays text
    saved = load_any(tok.save(tmp_path / "tok").parent)
    assert saved.fingerprint() == tok.fingerprint()
    assert reference(tmp_path / "tok" / "tokenizer.model").encode("hi there") == saved.encode("hi there")


def test_data_prepare_keeps_the_sentencepiece_model_beside_the_shards(sp_model, tmp_path):
    from gptlab.data.prepare import prepare_shards

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"document {i}: naïve 東京 text"}) + "\n" for i in range(40)))
    out = tmp_path / "data"
    prepare_shards(str(source), load_any(sp_model), out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["file"] == "tokenizer.model" and not (out / "tokenizer.json").exists()
    assert data_tokenizer(out).fingerprint() == load_any(sp_model).fingerprint()
