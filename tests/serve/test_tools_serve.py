"""Tools in the OpenAI-compatible server, through the official openai client, checked against the Python API's tool
loop (generate with a ToolTurn, greedy) on the tiny model trained to call the calculator: client tools end the reply
with tool_calls (streamed in pieces, adding up to the whole reply's), server tools run during generation and are
reported in tool_runs, tool_choice none/required/named shape the turn, bad requests are 400s and the server goes on."""

import json
import shutil

import openai
import pytest

from gptlab.chat import CHAT_TOKENS, ChatFormat
from gptlab.chat.tasks import Arithmetic
from gptlab.chat.tool_specs import CALCULATOR
from gptlab.cli.main import main
from gptlab.infer import SamplingConfig, generate
from gptlab.model.hf import load_pretrained_directory
from gptlab.tokenizer import Tokenizer
from gptlab.tools import ToolLimits, load_tools
from gptlab.tools.turn import ToolTurn
from tests.serve.conftest import start_server

MAX_TOKENS = 60
EXAMPLE = Arithmetic(digits=2, ops="*", tools=1, work=0).examples("train", 1)[0]  # one the tool model learned
QUESTION = [{"role": "user", "content": EXAMPLE.question}]
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tool_served(tool_model):
    tokenizer = Tokenizer.load(tool_model / "tokenizer")
    return load_pretrained_directory(tool_model).eval(), tokenizer, ChatFormat(tokenizer)


@pytest.fixture(scope="module")
def plain(tool_served):
    """The tool model served with no tools of its own: every tool is the client's."""
    live = start_server(tool_served)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def calculating(tool_served):
    """The tool model served with `--tools calculator`."""
    live = start_server(tool_served, toolbox=load_tools("calculator"))
    yield live
    live.stop()


def reference(served, messages, *, tools=(), toolbox=None, client=(), prefix=(), suppress=()) -> tuple[list[dict], ToolTurn]:
    """The reply's messages (ChatFormat.parse_reply) and its ToolTurn from the Python API's tool loop, greedy."""
    model, tokenizer, chat = served
    specs = [*(toolbox.specs() if toolbox else ()), *tools]
    turn = ToolTurn(chat, toolbox, client=client, prefix=prefix)
    config = SamplingConfig(max_new_tokens=MAX_TOKENS, temperature=0, stop_tokens=chat.stop_tokens,
                            vocab_size=tokenizer.vocab_size, suppress_tokens=suppress)
    tokens = generate(model, [chat.prompt(messages, tools=specs) + list(prefix)], config, tools=[turn])[0]
    return chat.parse_reply([*prefix, *tokens]), turn


def calls_of(message) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in message.tool_calls or ()]


def content(messages: list[dict]) -> str:
    return "".join(message["content"] for message in messages if message["role"] == "assistant")


def accumulate(chunks) -> tuple[str, dict[int, dict], str | None, list[dict]]:
    """What a client adds up from a stream: the content, the calls by index, the last finish_reason, the tool_runs."""
    text, calls, finish, runs = "", {}, None, []
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for piece in choice.delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"id": piece.id, "name": piece.function.name or "", "arguments": ""})
                call["arguments"] += piece.function.arguments or ""
            runs += (choice.delta.model_extra or {}).get("tool_runs") or []
            finish = choice.finish_reason or finish
    return text, calls, finish, runs


def multiply(expression: str) -> str:
    """The client's own tool: 'a * b' worked out in Python."""
    a, b = expression.split("*")
    return str(int(a) * int(b))


def test_client_tool_loop_streamed_and_whole_give_the_same_calls_then_the_answer(plain, tool_served):
    api = client(plain)
    asked = dict(model="tiny-chat", messages=QUESTION, tools=[CALCULATOR], temperature=0, max_tokens=MAX_TOKENS)
    whole = api.chat.completions.create(**asked)
    expected, _ = reference(tool_served, QUESTION, tools=[CALCULATOR], client={"calculator"})
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert calls_of(choice.message) == [(c["function"]["name"], c["function"]["arguments"]) for c in expected[-1]["tool_calls"]]
    assert calls_of(choice.message)[0][0] == "calculator" and all(call.id.startswith("call_") for call in choice.message.tool_calls)

    pieces = list(api.chat.completions.create(**asked, stream=True))
    text, calls, finish, runs = accumulate(pieces)
    assert (text, finish, runs) == ("", "tool_calls", [])
    assert [(call["name"], call["arguments"]) for call in calls.values()] == calls_of(choice.message)
    assert sum(bool(c.choices and c.choices[0].delta.tool_calls) for c in pieces) > 2  # the arguments came in pieces

    call = choice.message.tool_calls[0]
    result = multiply(json.loads(call.function.arguments)["expression"])
    assert result == EXAMPLE.answer
    history = [*QUESTION, choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": result}]
    final = api.chat.completions.create(**{**asked, "messages": history})
    sent = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": result}]
    expected, _ = reference(tool_served, sent, tools=[CALCULATOR], client={"calculator"})
    assert final.choices[0].message.content == content(expected) and final.choices[0].finish_reason == "stop"
    assert EXAMPLE.answer in final.choices[0].message.content


def test_server_calculator_runs_during_generation_and_reports_its_runs(calculating, tool_served):
    api = client(calculating)
    asked = dict(model="tiny-chat", messages=QUESTION, temperature=0, max_tokens=MAX_TOKENS)
    whole = api.chat.completions.create(**asked)
    expected, turn = reference(tool_served, QUESTION, toolbox=load_tools("calculator"))
    message = whole.choices[0].message
    runs = [{"name": run.name, "arguments": run.arguments, "result": run.result.text} for run in turn.runs]
    assert message.model_extra["tool_runs"] == runs and runs[0]["result"] == EXAMPLE.answer
    assert message.content == content(expected) and EXAMPLE.answer in message.content and "<|" not in message.content
    assert not message.tool_calls and whole.choices[0].finish_reason == "stop"
    text, calls, finish, streamed_runs = accumulate(api.chat.completions.create(**asked, stream=True))
    assert (text, calls, finish, streamed_runs) == (message.content, {}, "stop", runs)


def test_tool_choice_none_never_calls(plain, tool_served):
    api = client(plain)
    asked = dict(model="tiny-chat", messages=QUESTION, tools=[CALCULATOR], temperature=0, max_tokens=20)
    assert api.chat.completions.create(**asked).choices[0].message.tool_calls  # left alone, the model calls
    answer = api.chat.completions.create(**asked, tool_choice="none").choices[0]
    expected, _ = reference(tool_served, QUESTION, tools=[CALCULATOR], client={"calculator"}, suppress=(tool_served[2].call,))
    assert not answer.message.tool_calls and answer.finish_reason != "tool_calls"
    assert answer.message.content == content(expected)[: len(answer.message.content)] and expected[0].get("tool_calls") is None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "calculator"}}], ids=["required", "named"])
def test_tool_choice_required_or_named_starts_the_turn_with_a_call(plain, tool_served, choice):
    chat = tool_served[2]
    hello = [{"role": "user", "content": "Hello, how are you?"}]
    answer = client(plain).chat.completions.create(model="tiny-chat", messages=hello, tools=[CALCULATOR, LOOKUP],
                                                   tool_choice=choice, temperature=0, max_tokens=MAX_TOKENS)
    prefix = (chat.call,) if choice == "required" else (chat.call, *chat.encode("calculator"))
    expected, turn = reference(tool_served, hello, tools=[CALCULATOR, LOOKUP], client={"calculator", "lookup"}, prefix=prefix)
    message = answer.choices[0].message
    assert expected[0]["tool_calls"]  # the turn opened with a call
    assert calls_of(message) == [(c["function"]["name"], c["function"]["arguments"]) for c in expected[-1].get("tool_calls", ())]
    if choice != "required":
        assert calls_of(message)[0][0] == "calculator" and answer.choices[0].finish_reason == "tool_calls"


def test_a_tool_that_raises_or_hangs_reaches_the_model_as_an_error_and_the_server_goes_on(tool_served, tmp_path):
    tools = tmp_path / "broken.py"
    tools.write_text("import time\n\ndef calculator(expression: str) -> str:\n    \"\"\"Arithmetic.\"\"\"\n"
                     "    if '*' in expression:\n        time.sleep(60)\n    raise ValueError('no arithmetic today')\n")
    toolbox = load_tools(str(tools), ToolLimits(call_seconds=1.0, seconds=3.0))
    live = start_server(tool_served, toolbox=toolbox)
    try:
        answer = client(live).chat.completions.create(model="tiny-chat", messages=QUESTION, temperature=0, max_tokens=MAX_TOKENS)
        runs = answer.choices[0].message.model_extra["tool_runs"]
        assert runs[0]["name"] == "calculator" and runs[0]["result"].startswith("error:") and "1" in runs[0]["result"]
        _, turn = reference(tool_served, QUESTION, toolbox=toolbox)
        assert [run["result"] for run in runs] == [run.result.text for run in turn.runs]
        assert live.request("GET", "/health")[0] == 200
        assert client(live).chat.completions.create(model="tiny-chat", messages=QUESTION, temperature=0, max_tokens=8).choices
    finally:
        live.stop()


BAD = {
    "tool without a name": ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools.0.function.name", "name"),
    "tool name with spaces": ({"tools": [{"type": "function", "function": {"name": "two words"}}]}, "tools", "letters"),
    "tool declared twice": ({"tools": [CALCULATOR, CALCULATOR]}, "tools", "twice"),
    "tools not a list": ({"tools": "calculator"}, "tools", "list"),
    "tool_choice names no tool": ({"tools": [CALCULATOR], "tool_choice": {"type": "function", "function": {"name": "abacus"}}},
                                  "tool_choice", "abacus"),
    "tool_choice unknown": ({"tools": [CALCULATOR], "tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
    "tool_choice without tools": ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    "orphan tool message": ({"messages": [*QUESTION, {"role": "tool", "tool_call_id": "call_9", "content": "5"}]},
                            "messages.1.tool_call_id", "call_9"),
    "result for another call": ({"messages": [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"}]}, "messages.2.tool_call_id", "call_1"),
    "call without its result": ({"messages": [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]}]}, "messages", "no results"),
}


@pytest.mark.parametrize("body, param, words", BAD.values(), ids=BAD.keys())
def test_bad_tool_requests_are_400_naming_the_field_then_a_good_one_works(plain, body, param, words):
    status, answer = plain.request("POST", "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 4, **body})
    assert status == 400, answer
    assert answer["error"]["param"].startswith(param) and words in answer["error"]["message"]
    assert client(plain).chat.completions.create(model="tiny-chat", messages=QUESTION, max_tokens=4).choices


def test_request_tool_named_like_a_server_tool_is_400(calculating):
    status, answer = calculating.request("POST", "/v1/chat/completions", {"messages": QUESTION, "tools": [CALCULATOR]})
    assert status == 400 and answer["error"]["param"] == "tools.0" and "runs a tool named 'calculator'" in answer["error"]["message"]


def test_tools_on_a_model_without_the_tool_tokens_is_400_saying_so(prepared, tmp_path):
    from gptlab.model import GPT, preset

    tokenizer = Tokenizer.load(prepared / "tokenizer").with_special_tokens(list(CHAT_TOKENS))  # a chat model made before tools
    model = GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=128)).eval()
    live = start_server((model, tokenizer, ChatFormat(tokenizer)))
    try:
        with pytest.raises(openai.BadRequestError, match="lacks the tool tokens"):
            client(live).chat.completions.create(model="tiny-chat", messages=QUESTION, tools=[CALCULATOR])
        assert client(live).chat.completions.create(model="tiny-chat", messages=QUESTION, max_tokens=3).choices
    finally:
        live.stop()


def test_serve_unknown_tool_is_one_error_line_before_loading(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing"), "--tools", "nosuchtool", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuchtool" in err and "calculator" in err


def test_serve_tools_on_a_model_without_the_tool_tokens_is_one_error_line(prepared, tmp_path, capsys):
    from gptlab.model import GPT, preset
    from gptlab.model.io import save_model

    older = tmp_path / "older"
    tokenizer = Tokenizer.load(prepared / "tokenizer").with_special_tokens(list(CHAT_TOKENS))
    save_model(GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=128)), older)
    tokenizer.save(older / "tokenizer")
    assert main(["serve", str(older), "--tools", "calculator", "--port", "0", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tool tokens" in err
    shutil.rmtree(older)
