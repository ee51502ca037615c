"""Prefix caching behind the server: answers equal `generate`'s, /health counts the reused tokens, and the flag."""

import http.client
import json
import re

import openai
import pytest

from gptlab.infer import Engine, EngineConfig
from gptlab.infer.engine import DEFAULT_PREFIX_CACHE_MB
from gptlab.serve.app import build_app
from tests.serve.conftest import LiveServer
from tests.serve.test_api import chat_reference
from tests.serve.test_cli_serve import serve

SYSTEM = {"role": "system", "content": "You are a careful assistant in a play. Answer in the voice of the watchman on the "
          "castle wall at midnight, briefly, and never leave the stage."}


@pytest.fixture(scope="module")
def cached_server(served):
    model, tokenizer, chat_format = served
    engine = Engine(model, EngineConfig(slots=2, prefix_cache_mb=1))
    live = LiveServer(build_app(engine, tokenizer, chat_format, "tiny-chat", max_tokens_limit=200), engine)
    yield live
    live.stop()


def ask(server, messages, **sampling) -> str:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    answer = api.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=20, **{"temperature": 0, **sampling})
    return answer.choices[0].message.content


def prefix_stats(server) -> dict:
    status, body = server.request("GET", "/health")
    assert status == 200
    return body["prefix_cache"]


def test_serve_prefix_cache_shared_system_prompt_and_next_turn_equal_generate(cached_server, served):
    before = prefix_stats(cached_server)["hits"]
    questions = ["Who goes there?", "What hour is it?", "Is the ghost near?"]
    for question in questions:  # greedy and seeded: the same answers as generate on each prompt alone
        messages = [SYSTEM, {"role": "user", "content": question}]
        assert ask(cached_server, messages) == chat_reference(served, messages, 20)[0]
        assert ask(cached_server, messages, temperature=1.0, seed=7) == chat_reference(served, messages, 20, temperature=1.0, seed=7)[0]
    first = [SYSTEM, {"role": "user", "content": questions[0]}]
    turn = [*first, {"role": "assistant", "content": ask(cached_server, first)}, {"role": "user", "content": "Speak again."}]
    assert ask(cached_server, turn) == chat_reference(served, turn, 20)[0]
    stats = prefix_stats(cached_server)
    system_blocks = len(served[2].prompt([SYSTEM])) // 16 * 16
    assert system_blocks >= 16 and stats["hits"] - before >= 6 * system_blocks  # every request after the first reused it
    assert 0 < stats["bytes"] <= stats["budget_bytes"] == 2**20


def test_serve_health_reports_no_prefix_cache_when_off(served):
    model, tokenizer, chat_format = served
    engine = Engine(model, EngineConfig(slots=1, prefix_cache_mb=0))
    live = LiveServer(build_app(engine, tokenizer, chat_format, "tiny-chat"), engine)
    try:
        assert prefix_stats(live) is None
    finally:
        live.stop()


def test_serve_prefix_cache_flag_sets_the_budget_shown_in_the_banner_and_on_health(chat_model):
    child = serve(str(chat_model), "--port", "0", "--slots", "1", "--prefix-cache-mb", "0.5", "--no-access-log")
    try:
        lines = []
        while not (lines and lines[-1].lstrip().startswith("API")):
            line = child.stderr.readline()
            assert line, f"server exited: {''.join(lines)}"
            lines.append(line)
        assert any("prefix cache: 0.5 MB" in line for line in lines), lines
        port = int(re.search(r"http://[\d.]+:(\d+)/v1", lines[-1]).group(1))
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("GET", "/health")
        assert json.loads(connection.getresponse().read())["prefix_cache"]["budget_bytes"] == 2**19
        connection.close()
    finally:
        child.kill()
        child.communicate(timeout=60)


def test_serve_refuses_a_negative_prefix_cache_budget_in_one_line(chat_model):
    """inf, nan and non-numbers: tests/infer/test_prefix_cache.py (EngineConfig) and argparse's float."""
    child = serve(str(chat_model), "--port", "0", "--prefix-cache-mb", "-1")
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 1 and "Traceback" not in stderr
    assert stderr.strip() == ("gptlab: error: prefix_cache_mb (--prefix-cache-mb) must be 0 (off) or a positive number of MB, "
                              "got -1.0"), stderr


def test_serve_help_states_the_engines_default_prefix_budget():
    from gptlab.cli.main import build_parser

    parser = build_parser()
    text = parser._subparsers._group_actions[0].choices["serve"].format_help()
    assert f"(default {DEFAULT_PREFIX_CACHE_MB})" in " ".join(text.split())
