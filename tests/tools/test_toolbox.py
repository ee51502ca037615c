"""Toolbox.run turns every failure of a call into an error result, and ToolBudget holds a request to its limits."""

import os

import pytest

from gptlab.runtime import GptlabError
from gptlab.tools import Tool, Toolbox, ToolBudget, ToolLimits, ToolResult, load_tools


def schema(**types: str) -> dict:
    return {"type": "object", "properties": {name: {"type": kind} for name, kind in types.items()}, "required": list(types)}


def word_count(text):
    print("counting, loudly")  # the caller's output must not show this
    return len(text.split())


def divide(a, b):
    return a / b


def lookup(key):
    return {"key": key, "values": [1, 2.5, None, True], "city": "Zürich"}


def returns_object():
    return object()


def exits():
    os._exit(3)


def echo(**keywords):
    return keywords


TOOLS = [
    Tool("word_count", "Count the words in a text.", schema(text="string"), word_count),
    Tool("divide", "Divide a by b.", schema(a="number", b="number"), divide),
    Tool("lookup", "Look a key up.", schema(key="string"), lookup),
    Tool("returns_object", "Return an object.", schema(), returns_object),
    Tool("exits", "Exit the process.", schema(), exits),
    Tool("echo", "Echo the arguments.", schema(flag="boolean", count="integer", items="array", optional=["string", "null"]), echo),
]


@pytest.fixture
def box() -> Toolbox:
    return Toolbox(TOOLS, ToolLimits(max_result_chars=100))


def _error(result: ToolResult) -> str:
    assert not result.ok and result.text.startswith("error: ") and "\n" not in result.text, result
    return result.text


def test_toolbox_run_returns_the_value_as_text(box, capfd):
    result = box.run("word_count", '{"text": "a b c"}')
    assert (result.text, result.ok) == ("3", True) and result.seconds > 0 and box.run("word_count", {"text": "a b"}).text == "2"
    assert box.run("lookup", {"key": "k"}).text == '{"key": "k", "values": [1, 2.5, null, true], "city": "Zürich"}'
    assert box.run("divide", {"a": 1, "b": 4}).text == "0.25"
    assert capfd.readouterr() == ("", "")  # what a tool prints goes nowhere


def test_toolbox_run_returns_error_result_when_tool_raises(box):
    assert _error(box.run("divide", {"a": 1, "b": 0})) == "error: ZeroDivisionError: division by zero"


def test_toolbox_run_returns_error_result_when_tool_hangs(tmp_path):
    (tmp_path / "slow.py").write_text("def spin() -> int:\n    while True:\n        pass\n\n\ndef quick() -> int:\n    return 1\n")
    box = load_tools(str(tmp_path / "slow.py"), ToolLimits(call_seconds=1))
    assert _error(box.run("spin", "{}")) == "error: tool spin ran past 1 s and was stopped"
    assert box.run("quick", "{}").text == "1"  # the process still works: the worker was killed, nothing else


def test_toolbox_run_returns_error_result_when_result_too_long():
    same = Toolbox([Tool("same", "Return the text.", schema(text="string"), lambda text: text)], ToolLimits(max_result_chars=100))
    assert same.run("same", {"text": "x" * 100}).ok
    assert _error(same.run("same", {"text": "x" * 52311})) == "error: tool same returned 52,311 characters; the limit is 100"


def test_toolbox_run_returns_error_result_when_arguments_not_json(box):
    assert _error(box.run("word_count", '{"text": "a b"')).startswith("error: the arguments to word_count are not JSON (")
    assert _error(box.run("word_count", "[1, 2]")) == 'error: the arguments to word_count must be a JSON object, got array; e.g. {"text": "..."}'


def test_toolbox_run_returns_error_result_when_argument_is_unknown_missing_or_of_the_wrong_type(box):
    assert _error(box.run("word_count", {"text": "a", "words": 2})) == "error: word_count has no argument 'words'; its arguments: text"
    assert _error(box.run("word_count", {})) == "error: word_count needs the argument 'text'; e.g. {\"text\": \"...\"}"
    assert _error(box.run("word_count", {"text": 3})) == "error: argument 'text' of word_count must be string, got integer 3"
    assert _error(box.run("echo", {"flag": 1, "count": 1, "items": [], "optional": None})).endswith("must be boolean, got integer 1")
    assert _error(box.run("echo", {"flag": True, "count": True, "items": [], "optional": None})).endswith("must be integer, got boolean true")
    assert _error(box.run("echo", {"flag": True, "count": 1.5, "items": [], "optional": None})).endswith("got number 1.5")
    assert box.run("echo", {"flag": True, "count": 1, "items": [], "optional": None}).ok
    assert box.run("divide", {"a": 3, "b": 1.5}).text == "2.0"  # an integer is a number


def test_toolbox_run_returns_error_result_when_tool_is_unknown_or_gives_no_text(box):
    assert _error(box.run("weather", "{}")).startswith("error: no tool named 'weather'; the tools: word_count, divide, lookup")
    assert _error(box.run("returns_object", "{}")).startswith("error: tool returns_object returned a value of type object, which is not text")
    assert _error(box.run("exits", "{}")) == "error: tool exits ended without an answer (exit code 3)"
    assert box.run("word_count", {"text": "still here"}).text == "2"


def test_toolbox_run_gives_an_in_process_tool_the_smaller_of_the_timeouts():
    seen = []
    tool = Tool("clock", "Report the time given.", schema(), lambda timeout: seen.append(timeout) or "done", in_process=True)
    box = Toolbox([tool], ToolLimits(call_seconds=5))
    assert box.run("clock", "").text == "done" and box.run("clock", "{}", timeout=2).ok and box.run("clock", "{}", timeout=9).ok
    assert seen == [5, 2, 5]


def test_toolbox_specs_are_the_openai_declarations_in_order(box):
    specs = box.specs()
    assert [spec["function"]["name"] for spec in specs] == list(box.names) == [tool.name for tool in TOOLS]
    assert specs[0] == {"type": "function", "function": {"name": "word_count", "description": "Count the words in a text.",
                                                         "parameters": schema(text="string")}}  # fmt: skip
    assert box.get("divide") is TOOLS[1] and box.get("nothing") is None


def test_toolbox_refuses_two_tools_of_one_name():
    with pytest.raises(GptlabError, match="two tools are named 'word_count'"):
        Toolbox([TOOLS[0], TOOLS[0]])


@pytest.mark.parametrize("field, value", [("max_calls", 0), ("seconds", 0), ("call_seconds", float("inf")), ("max_result_chars", 1.5),
                                          ("memory_mb", 32), ("max_calls", True)])  # fmt: skip
def test_tool_limits_refuse_values_that_cannot_limit(field, value):
    with pytest.raises(GptlabError, match=f"{field}={value!r}"):
        ToolLimits(**{field: value})


@pytest.mark.parametrize("name, parameters, message", [
    ("2fast", schema(), "must be a letter or _"), ("has space", schema(), "must be a letter or _"), ("a" * 65, schema(), "must be"),
    ("ok", {"type": "array"}, "parameters must be a JSON-schema object"),
    ("ok", "text", "parameters must be"), ("ok", {"type": "object", "properties": {"x": "string"}}, "parameters must be"),
    ("ok", {"type": "object", "properties": {}, "required": ["x"]}, "required parameter 'x' is not among its properties"),
])  # fmt: skip
def test_tool_refuses_a_bad_name_or_schema(name, parameters, message):
    with pytest.raises(GptlabError, match=message):
        Tool(name, "", parameters, print)


# ---------------------------------------------------------------- one request's budget


def test_budget_refuses_calls_past_max_calls(box):
    budget = Toolbox(TOOLS, ToolLimits(max_calls=2)).session()
    assert isinstance(budget, ToolBudget)
    assert budget.run("word_count", {"text": "a"}).ok and not budget.run("divide", {"a": 1, "b": 0}).ok  # an error counts
    refused = budget.run("word_count", {"text": "a"})
    assert refused.text == "error: call limit of 2 reached; answer without tools" and budget.calls == 2
    assert box.session().run("word_count", {"text": "a"}).ok  # each request starts afresh


def test_budget_gives_a_call_the_seconds_left_and_refuses_when_none_are():
    seen = []
    tool = Tool("clock", "Report the time given.", schema(), lambda timeout: seen.append(timeout) or "done", in_process=True)
    budget = Toolbox([tool], ToolLimits(seconds=20, call_seconds=10)).session()
    assert budget.run("clock", "{}").ok and seen == [10]
    budget.seconds = 17.5  # as if earlier calls had taken that long
    assert budget.run("clock", "{}").ok and seen[-1] == pytest.approx(2.5, abs=0.01)
    budget.seconds = 20.0
    assert budget.run("clock", "{}").text == "error: time limit of 20 s for tools reached; answer without tools"
    assert budget.calls == 2
