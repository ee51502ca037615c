"""The OpenAI-compatible API, through the official openai client against a live server, checked against gptlab generate."""

import http.client
import json
import threading

import openai
import pytest

from gptlab.infer import SamplingConfig, generate
from gptlab.serve.stops import StopMatcher
from tests.serve.conftest import MAX_REQUEST_BYTES, MAX_TOKENS_LIMIT, start_server

USER = [{"role": "user", "content": "Who goes there?"}]


def client(server, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def reference(served, ids: list[int], max_tokens: int, stop_tokens, **sampling) -> tuple[str, int]:
    """(text, completion tokens) that gptlab generate gives for the prompt alone."""
    model, tokenizer, _ = served
    config = SamplingConfig(max_new_tokens=max_tokens, stop_tokens=stop_tokens, vocab_size=tokenizer.vocab_size,
                            **{"temperature": 0, **sampling})
    tokens = generate(model, [ids], config)[0]
    return tokenizer.decode(tokens), len(tokens)


def chat_reference(served, messages, max_tokens: int, **sampling) -> tuple[str, int]:
    chat = served[2]
    return reference(served, chat.prompt(messages), max_tokens, chat.stop_tokens, **sampling)


def text_reference(served, prompt: str, max_tokens: int, **sampling) -> tuple[str, int]:
    tokenizer = served[1]
    return reference(served, tokenizer.encode_ordinary(prompt), max_tokens, (tokenizer.eot_id,), **sampling)


# ---------------------------------------------------------------- chat and completions


def test_chat_completion_equals_generate_and_counts_usage(server, served):
    answer = client(server).chat.completions.create(model="tiny-chat", messages=USER, temperature=0, max_tokens=30)
    text, tokens = chat_reference(served, USER, 30)
    assert answer.choices[0].message.content == text
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason == ("length" if tokens == 30 else "stop")
    prompt_tokens = len(served[2].prompt(USER))
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
        prompt_tokens, tokens, prompt_tokens + tokens)


def test_chat_stream_text_equals_the_whole_answer(server):
    api = client(server)
    whole = api.chat.completions.create(model="tiny-chat", messages=USER, temperature=0, max_tokens=40)
    chunks = list(api.chat.completions.create(model="tiny-chat", messages=USER, temperature=0, max_tokens=40, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason] == [
        whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_completions_of_text_texts_and_token_ids_equal_generate(server, served):
    api, tokenizer = client(server), served[1]
    prompts = ["ROMEO:", "To be, or not"]
    one = api.completions.create(model="tiny-chat", prompt=prompts[0], temperature=0, max_tokens=25)
    assert one.choices[0].text == text_reference(served, prompts[0], 25)[0]
    both = api.completions.create(model="tiny-chat", prompt=prompts, temperature=0, max_tokens=25)
    assert [choice.text for choice in both.choices] == [text_reference(served, prompt, 25)[0] for prompt in prompts]
    assert both.usage.prompt_tokens == sum(len(tokenizer.encode_ordinary(prompt)) for prompt in prompts)
    ids = api.completions.create(model="tiny-chat", prompt=tokenizer.encode_ordinary(prompts[1]), temperature=0, max_tokens=25)
    assert ids.choices[0].text == both.choices[1].text


def test_completions_stream_equals_the_whole_text(server):
    api = client(server)
    whole = api.completions.create(model="tiny-chat", prompt="ROMEO:", temperature=0, max_tokens=30)
    pieces = [chunk.choices[0].text for chunk in api.completions.create(
        model="tiny-chat", prompt="ROMEO:", temperature=0, max_tokens=30, stream=True)]
    assert "".join(pieces) == whole.choices[0].text


def test_n_gives_n_choices_each_seeded_apart(server, served):
    api = client(server)
    greedy = api.chat.completions.create(model="tiny-chat", messages=USER, temperature=0, max_tokens=20, n=2)
    assert [choice.index for choice in greedy.choices] == [0, 1]
    assert {choice.message.content for choice in greedy.choices} == {chat_reference(served, USER, 20)[0]}
    sampled = api.chat.completions.create(model="tiny-chat", messages=USER, max_tokens=20, n=2, seed=5)
    assert [choice.message.content for choice in sampled.choices] == [
        chat_reference(served, USER, 20, temperature=1.0, seed=seed)[0] for seed in (5, 6)]
    assert sampled.usage.completion_tokens == sum(chat_reference(served, USER, 20, temperature=1.0, seed=s)[1] for s in (5, 6))


def test_seed_reproduces_a_sample_and_equals_generate(server, served):
    api = client(server)
    options = {"model": "tiny-chat", "prompt": "ROMEO:", "max_tokens": 30, "temperature": 0.8, "top_p": 0.9, "seed": 11,
               "extra_body": {"top_k": 40}}
    first, second = api.completions.create(**options), api.completions.create(**options)
    assert first.choices[0].text == second.choices[0].text
    assert first.choices[0].text == text_reference(served, "ROMEO:", 30, temperature=0.8, top_p=0.9, top_k=40, seed=11)[0]


def test_stop_strings_cut_the_text_stream_or_not(server, served):
    api = client(server)
    text, _ = text_reference(served, "ROMEO:", 40)
    stop = text[6:9]
    cut = text[: text.index(stop)]
    whole = api.completions.create(model="tiny-chat", prompt="ROMEO:", temperature=0, max_tokens=40, stop=[stop, "\x00never"])
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (cut, "stop")
    chunks = list(api.completions.create(model="tiny-chat", prompt="ROMEO:", temperature=0, max_tokens=40, stop=stop, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("pieces, expected", [
    (["Hello\nUs", "er: hi"], ["Hello", ""]),
    (["ab", "c"], ["ab", "c"]),
    (["xEN", "Dy"], ["x", ""]),
    (["EN", "Z"], ["", "ENZ"]),
])
def test_stop_matcher_holds_back_only_possible_stop_prefixes(pieces, expected):
    matcher = StopMatcher(["\nUser:", "END"])
    assert [matcher.push(piece) for piece in pieces] == expected


def test_models_lists_the_served_model(server):
    assert [model.id for model in client(server).models.list().data] == ["tiny-chat"]


# ---------------------------------------------------------------- concurrency and disconnects


def test_concurrent_streams_each_equal_generate_alone(server, served):
    questions = [[{"role": "user", "content": f"Question {k}: {'why ' * k}?"}] for k in range(7)]  # 7 streams, 4 slots
    results: dict[int, str] = {}

    def ask(k: int) -> None:
        stream = client(server).chat.completions.create(model="tiny-chat", messages=questions[k], temperature=0, max_tokens=30,
                                                        stream=True)
        results[k] = "".join(chunk.choices[0].delta.content or "" for chunk in stream)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(questions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [results.get(k) for k in range(len(questions))] == [chat_reference(served, q, 30)[0] for q in questions]


@pytest.mark.parametrize("stream", [True, False], ids=["mid-stream", "whole-answer"])
def test_disconnect_cancels_the_request_and_frees_its_slot(server, served, hold, stream):
    """The client leaves while the engine holds its request (streaming: after the first event; not streaming:
    while it decodes); the server notices, cancels it, and goes on serving."""
    before = server.engine.stats.finished.get("cancelled", 0)
    hold.holding.clear()
    hold.active = True  # the engine waits after each step until the disconnect has cancelled the request
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {"prompt": "ROMEO:", "max_tokens": MAX_TOKENS_LIMIT, "temperature": 0, "stream": stream}
        connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        if stream:
            response = connection.getresponse()
            assert response.status == 200
            assert response.readline().startswith(b"data: {")
        else:
            assert hold.holding.wait(60)  # the request is decoding
        connection.close()
        assert server.engine.wait_idle(60)
    finally:
        hold.active = False
    assert server.engine.stats.finished.get("cancelled", 0) == before + 1
    assert client(server).models.list().data  # and the server goes on


# ---------------------------------------------------------------- safety: keys and bad requests


def test_api_key_is_required_on_v1_but_not_on_health(served):
    live = start_server(served, api_key="sesame")
    try:
        with pytest.raises(openai.AuthenticationError):
            client(live, "wrong").models.list()
        status, body = live.request("GET", "/v1/models")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert client(live, "sesame").models.list().data[0].id == "tiny-chat"
        assert live.request("GET", "/health")[0] == 200
    finally:
        live.stop()


BAD_CHATS = {
    "temperature is text": ({"messages": USER, "temperature": "hot"}, "temperature"),
    "max_tokens over the limit": ({"messages": USER, "max_tokens": MAX_TOKENS_LIMIT + 1}, "max_tokens"),
    "max_tokens past the context": ({"messages": [{"role": "user", "content": "x " * 120}], "max_tokens": MAX_TOKENS_LIMIT},
                                    "max_tokens"),
    "unknown role": ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    "empty messages": ({"messages": []}, "messages"),
    "messages not a list": ({"messages": "hi"}, "messages"),
    "max_tokens a bool": ({"messages": USER, "max_tokens": True}, "max_tokens"),
    "n too large": ({"messages": USER, "n": 100}, "n"),
    "missing messages": ({"model": "x"}, "messages"),
}


@pytest.mark.parametrize("body, param", BAD_CHATS.values(), ids=BAD_CHATS.keys())
def test_bad_chat_requests_are_400_with_an_error_body(server, body, param):
    status, answer = server.request("POST", "/v1/chat/completions", body)
    assert status == 400
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["message"]
    assert answer["error"]["param"].startswith(param)
    assert server.request("GET", "/health")[0] == 200


def test_malformed_json_too_large_and_unknown_paths_are_4xx_and_the_server_goes_on(server, served):
    assert server.request("POST", "/v1/chat/completions", b'{"messages": [')[0] == 400
    assert server.request("POST", "/v1/completions", b"[1, 2]")[0] == 400
    status, body = server.request("POST", "/v1/completions", {"prompt": "x" * MAX_REQUEST_BYTES})
    assert status == 413 and "limit" in body["error"]["message"]
    status, body = server.request("GET", "/v2/nothing")
    assert status == 404 and body["error"]["message"]
    assert server.request("POST", "/v1/completions", {"prompt": [10**9]})[0] == 400
    answer = client(server).completions.create(model="tiny-chat", prompt="ROMEO:", temperature=0, max_tokens=5)
    assert answer.choices[0].text == text_reference(served, "ROMEO:", 5)[0]


def test_chat_on_a_model_without_chat_tokens_is_400_saying_why(served, prepared):
    from gptlab.tokenizer import Tokenizer

    model, _, _ = served
    live = start_server((model, Tokenizer.load(prepared / "tokenizer"), None), chat=False)
    try:
        with pytest.raises(openai.BadRequestError, match="chat tokens"):
            client(live).chat.completions.create(model="tiny-chat", messages=USER)
        assert client(live).completions.create(model="tiny-chat", prompt="ROMEO:", max_tokens=3).choices
    finally:
        live.stop()


def test_index_serves_the_web_chat_page(served, tmp_path):
    (tmp_path / "index.html").write_text("<!doctype html><title>gptlab chat</title>")
    live = start_server(served, static_dir=tmp_path)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
        connection.request("GET", "/")
        response = connection.getresponse()
        assert response.status == 200 and b"gptlab chat" in response.read()
        assert response.getheader("content-type").startswith("text/html")
        connection.close()
    finally:
        live.stop()


def test_ignore_eos_generates_exactly_max_tokens(server, served):
    tokenizer = served[1]
    answer = client(server).completions.create(model="tiny-chat", prompt="ROMEO:", temperature=0, max_tokens=60,
                                               extra_body={"ignore_eos": True})
    expected, count = reference(served, tokenizer.encode_ordinary("ROMEO:"), 60, ())
    assert (answer.choices[0].text, answer.usage.completion_tokens, count) == (expected, 60, 60)


# ---------------------------------------------------------------- model names, empty keys, the access log


def test_an_unknown_model_is_404_model_not_found_as_openai_answers(server):
    api = client(server)
    with pytest.raises(openai.NotFoundError) as chat:
        api.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=3)
    with pytest.raises(openai.NotFoundError) as stream:
        list(api.completions.create(model="tiny-chat-2", prompt="ROMEO:", max_tokens=3, stream=True))
    for error, name in ((chat.value, "gpt-4o"), (stream.value, "tiny-chat-2")):
        assert error.status_code == 404 and error.code == "model_not_found" and error.param == "model"
        assert error.body["type"] == "invalid_request_error" and f"the model '{name}' does not exist" in error.body["message"]
        assert "'tiny-chat'" in error.body["message"]  # and which one it serves
    status, body = server.request("POST", "/v1/completions", {"model": "", "prompt": "ROMEO:", "max_tokens": 2})
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}
    served_id = api.models.list().data[0].id
    assert api.completions.create(model=served_id, prompt="ROMEO:", max_tokens=2).choices  # the id /v1/models lists
    status, body = server.request("POST", "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2})
    assert status == 200 and body["model"] == served_id  # no model field: the one served, as a single-model server


@pytest.mark.parametrize("key, message", [("", "--api-key is empty"), ("  ", "--api-key is empty"),
                                          (" sesame", "--api-key has spaces around it")])
def test_an_empty_or_padded_api_key_is_refused_when_the_app_is_built(served, key, message):
    from gptlab.infer import Engine, EngineConfig
    from gptlab.runtime import GptlabError
    from gptlab.serve.app import build_app

    model, tokenizer, chat_format = served
    with Engine(model, EngineConfig(slots=1)) as engine, pytest.raises(GptlabError, match=message):
        build_app(engine, tokenizer, chat_format, "tiny-chat", api_key=key)


class Lines:
    """The access log's lines, written from the server's thread; `wait_for` waits (not times) until n have come."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()

    def __call__(self, line: str) -> None:
        with self.changed:
            self.lines.append(line)
            self.changed.notify_all()

    def wait_for(self, count: int) -> list[str]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.lines) >= count, timeout=60), self.lines
            return list(self.lines)


ACCESS_LINE = r'127\.0\.0\.1:\d+ "(?P<request>[A-Z]+ \S+)" (?P<status>\d{3}) (?P<seconds>\d+\.\d{3})s(?: tokens (?P<tokens>\d+\+\d+))?$'


def test_access_log_has_one_line_per_request_with_status_duration_and_tokens(served):
    import re

    log = Lines()
    live = start_server(served, access_log=log, api_key="sesame")
    try:
        api = client(live, "sesame")
        answer = api.chat.completions.create(model="tiny-chat", messages=USER, temperature=0, max_tokens=7)
        log.wait_for(1)  # each line is written once its response has ended: waited for, so the order is the requests'
        chunks = list(api.completions.create(model="tiny-chat", prompt="ROMEO:", max_tokens=5, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
        log.wait_for(2)
        with pytest.raises(openai.AuthenticationError):
            client(live, "wrong").models.list()
        log.wait_for(3)
        with pytest.raises(openai.NotFoundError):
            api.chat.completions.create(model="other", messages=USER)
        log.wait_for(4)
        live.request("POST", "/v1/completions", {"prompt": "x" * MAX_REQUEST_BYTES})
        log.wait_for(5)
        live.request("GET", "/health?probe=1")
        lines = log.wait_for(6)
    finally:
        live.stop()
    matches = [re.match(ACCESS_LINE, line) for line in lines]
    assert all(matches), lines
    usage = [answer.usage, chunks[-1].usage]
    assert [(m["request"], m["status"], m["tokens"]) for m in matches] == [
        ("POST /v1/chat/completions", "200", f"{usage[0].prompt_tokens}+{usage[0].completion_tokens}"),
        ("POST /v1/completions", "200", f"{usage[1].prompt_tokens}+{usage[1].completion_tokens}"),  # a stream's, once it ended
        ("GET /v1/models", "401", None), ("POST /v1/chat/completions", "404", None),
        ("POST /v1/completions", "413", None), ("GET /health?probe=1", "200", None)]
    assert usage[0].completion_tokens > 0 and usage[1].completion_tokens == 5


def test_access_line_escapes_control_characters_a_client_sends():
    from gptlab.serve.access import access_line

    scope = {"client": ("10.0.0.1", 5), "method": "GET", "path": "/a\nb", "query_string": b"q=\x1b[31m"}
    assert access_line(scope, 404, 0.25, {}) == '10.0.0.1:5 "GET /a\\nb?q=\\x1b[31m" 404 0.250s'
