"""The token viewer's JSON API (gptlab.serve.token_view) through FastAPI's TestClient: counts and ids equal tiktoken's
and gptlab's `encode`, the compact answer decodes back to the text, chat mode renders as gptlab.chat does, and bad
requests get one clear JSON error while the server keeps serving."""

import json
import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.runtime import GptlabError
from gptlab.serve.limits import BodyLimit
from gptlab.serve.token_view import TokenizerSet, build_token_view, load_tokenizers, parse_conversation, with_token_view
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer.pretrained import tiktoken_reference

ENCODE = "/tokenizer/api/encode"
TEXT = "Hello, world!\n\tIndented  twice 😀 ünïcödé 世界 <b>not bold</b> <|endoftext|> end"
TRAINING_TEXT = "The quick brown fox jumps over the lazy dog.\nNo, the dog was not lazy; it slept.\n" * 30


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    Tokenizer.train([TRAINING_TEXT], vocab_size=300).save(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizers(trained) -> TokenizerSet:
    return load_tokenizers(["gpt2", str(trained), "gpt2"])  # a repeat is dropped


@pytest.fixture(scope="module")
def client(tokenizers):
    return TestClient(build_token_view(tokenizers))


def decoded(result: dict) -> bytes:
    return b"".join(bytes.fromhex(result["table"][str(i)]) for i in result["ids"])


def test_token_view_lists_the_tokenizers_in_the_order_given(client, trained):
    assert client.get("/tokenizer/api/tokenizers").json() == {"tokenizers": ["gpt2", str(trained)]}
    page = client.get("/tokenizer/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/tokenizer", follow_redirects=False).headers["location"] == "/tokenizer/"
    assert client.get("/tokenizer/tokenizer.js").status_code == 200
    assert client.get("/tokenizer/secrets.py").status_code == 404


def test_token_view_counts_and_ids_equal_encode_for_gpt2_and_a_trained_tokenizer(client, trained):
    answer = client.post(ENCODE, json={"text": TEXT, "tokenizers": ["gpt2", str(trained)]})
    assert answer.status_code == 200
    gpt2, own = answer.json()["results"]
    references = [tiktoken_reference("gpt2").encode(TEXT, allowed_special="all"),
                  Tokenizer.load(trained).encode(TEXT, allowed_special="all")]
    for result, reference in zip((gpt2, own), references):
        assert result["ids"] == reference
        assert (result["tokens"], result["bytes"], result["characters"]) == (len(reference), len(TEXT.encode()), len(TEXT))
        assert result["error"] is None and result["note"] is None
    assert gpt2["special"] == [50256]  # <|endoftext|> typed in the text shows as the special token


def test_token_view_compact_answer_decodes_back_to_the_text(client, trained):
    for name in ("gpt2", str(trained)):
        result = client.post(ENCODE, json={"text": TEXT * 3, "tokenizers": [name]}).json()["results"][0]
        assert decoded(result).decode("utf-8") == TEXT * 3
        assert sorted(map(int, result["table"])) == sorted(set(result["ids"]))  # one entry per distinct id, not per token
    partial = [bytes.fromhex(h) for h in client.post(ENCODE, json={"text": "😀", "tokenizers": ["gpt2"]}).json()["results"][0]["table"].values()]
    assert len(partial) == 2 and b"".join(partial) == "😀".encode()  # halves of one character, each sent as bytes


def test_token_view_chat_mode_renders_as_chat_format_and_says_when_it_added_the_chat_tokens(client, tokenizers, trained):
    conversation = "system: Be brief.\nuser: What is\n2+2?\nassistant: 4"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is\n2+2?"},
                {"role": "assistant", "content": "4"}]
    assert parse_conversation(conversation) == messages
    result = client.post(ENCODE, json={"text": conversation, "tokenizers": ["gpt2"], "mode": "chat"}).json()["results"][0]
    chat_tokenizer = add_chat_tokens(tokenizers.get("gpt2"))
    assert result["ids"] == ChatFormat(chat_tokenizer).render(messages).ids
    assert "lacks the chat tokens" in result["note"]
    assert {chat_tokenizer.token_bytes(i).decode() for i in result["special"]} == {
        "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"}
    assert decoded(result) == chat_tokenizer.decode_bytes(result["ids"]) and result["bytes"] == len(decoded(result))
    prompt = client.post(ENCODE, json={"text": "user: hi", "tokenizers": [str(trained)], "mode": "chat"}).json()["results"][0]
    assert prompt["ids"] == ChatFormat(add_chat_tokens(Tokenizer.load(trained))).prompt([{"role": "user", "content": "hi"}])


def test_token_view_chat_mode_reports_a_tokenizer_that_cannot_chat_in_its_own_panel():
    no_eot = Tokenizer.train([TRAINING_TEXT], vocab_size=270, special_tokens=[])
    client = TestClient(build_token_view(TokenizerSet({"plain": no_eot, "gpt2": load_gpt2})))
    plain, gpt2 = client.post(ENCODE, json={"text": "user: hi", "tokenizers": ["plain", "gpt2"], "mode": "chat"}).json()["results"]
    assert "end-of-text" in plain["error"] and plain["ids"] == []
    assert gpt2["error"] is None and gpt2["tokens"] == 5  # <|endoftext|> <|user|> hi <|end|> <|assistant|>: "hi" is one token
    bad = client.post(ENCODE, json={"text": "hello\nuser: hi", "tokenizers": ["gpt2"], "mode": "chat"})
    assert bad.status_code == 400 and "line 1" in bad.json()["error"]["message"]
    with pytest.raises(GptlabError, match="no conversation"):
        parse_conversation("\n")


def load_gpt2():
    """A loader the set calls on first use (as `gptlab serve` adds gpt2)."""
    from gptlab.tokenizer.pretrained import load_any

    return load_any("gpt2")


def test_token_view_bad_requests_get_one_clear_json_error_and_the_server_keeps_serving(client):
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps({"text": "x", "tokenizers": ["nope"]}).encode(), 400, "unknown tokenizer 'nope'"),
        (json.dumps({"text": "x", "tokenizers": []}).encode(), 400, "tokenizers"),
        (json.dumps({"text": 3, "tokenizers": ["gpt2"]}).encode(), 400, "text"),
        (json.dumps({"text": "x", "tokenizers": ["gpt2"], "mode": "poem"}).encode(), 400, "mode"),
        (b'{"text": "\\ud800", "tokenizers": ["gpt2"]}', 400, "lone surrogate"),
    ]
    for body, status, words in cases:
        answer = client.post(ENCODE, content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == status, body
        assert words in answer.json()["error"]["message"], answer.json()
    assert client.post(ENCODE, json={"text": "still here", "tokenizers": ["gpt2"]}).status_code == 200


def test_token_view_refuses_a_body_over_its_limit_with_413_and_takes_a_megabyte(tokenizers):
    client = TestClient(build_token_view(tokenizers))  # the default limit: 8 MB
    megabyte = "All the world's a stage. 世界\n" * 32_000
    answer = client.post(ENCODE, json={"text": megabyte, "tokenizers": ["gpt2"]})
    assert answer.status_code == 200 and answer.json()["results"][0]["tokens"] == len(tiktoken_reference("gpt2").encode(megabyte))
    refused = client.post(ENCODE, json={"text": "x" * 8_100_000, "tokenizers": ["gpt2"]})
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large"
    assert client.post(ENCODE, json={"text": "ok", "tokenizers": ["gpt2"]}).status_code == 200


def test_token_view_beside_another_app_gets_the_tokenizer_paths_and_its_own_limit(tokenizers):
    chat = FastAPI()
    chat.add_middleware(BodyLimit, max_bytes=1000)  # as `gptlab serve` limits its API

    @chat.post("/v1/echo")
    async def echo() -> dict:
        return {"ok": True}

    client = TestClient(with_token_view(chat, build_token_view(tokenizers)))
    assert client.post(ENCODE, json={"text": "x" * 5000, "tokenizers": ["gpt2"]}).status_code == 200
    assert client.post("/v1/echo", content=b"x" * 5000).status_code == 413
    assert client.post("/v1/echo").json() == {"ok": True}


def test_token_view_shows_a_sentencepiece_model_with_the_librarys_ids_pieces_and_byte_pieces(tmp_path):
    from tests.tokenizer.sp_fixtures import reference, train_model

    path = train_model(tmp_path, vocab_size=1000, byte_fallback=True)
    client = TestClient(build_token_view(load_tokenizers([str(path)])))
    text = "Hello world ꙮ"  # U+A66E is in no training text: byte fallback, three pieces <0xEA> <0x99> <0xAE>
    result = client.post(ENCODE, json={"text": text, "tokenizers": [str(path)]}).json()["results"][0]
    library = reference(path)
    assert result["ids"] == library.encode(text)
    assert (result["tokens"], result["bytes"], result["characters"]) == (len(library.encode(text)), len(text.encode()), len(text))
    assert result["pieces"] == {str(i): library.id_to_piece(i) for i in set(result["ids"])}
    byte_pieces = {i: piece for i, piece in result["pieces"].items() if re.fullmatch(r"<0x[0-9A-F]{2}>", piece)}
    assert all(result["table"][i] == piece[3:5].lower() for i, piece in byte_pieces.items())  # each piece's one byte
    assert b"".join(bytes.fromhex(result["table"][str(i)]) for i in result["ids"][-3:]) == "ꙮ".encode()


def test_token_view_behind_an_api_key_encodes_only_with_it():
    """`gptlab serve --api-key`: the viewer's encoding needs the key as the model's API does; the page itself loads."""
    from fastapi.testclient import TestClient

    from gptlab.serve.token_view import TokenizerSet, build_token_view
    from gptlab.tokenizer import Tokenizer

    tok = Tokenizer.train(["hello world"], vocab_size=260)
    client = TestClient(build_token_view(TokenizerSet({"tiny": tok}), api_key="s3cret"))
    body = {"text": "hello", "tokenizers": ["tiny"]}
    refused = client.post("/tokenizer/api/encode", json=body)
    assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
    assert client.post("/tokenizer/api/encode", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    answer = client.post("/tokenizer/api/encode", json=body, headers={"Authorization": "Bearer s3cret"})
    assert answer.status_code == 200 and answer.json()["results"][0]["ids"] == tok.encode("hello")
    assert client.get("/tokenizer/").status_code == 200
