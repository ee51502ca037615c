"""load_tools: built-ins by name, a user's functions from a file with their schema, one-line errors naming the part."""

import textwrap

import pytest

from gptlab.chat.tool_specs import BUILTIN
from gptlab.runtime import GptlabError
from gptlab.tools import BUILTIN_TOOLS, ToolLimits, load_tools, tool_from_function

TOOLS_FILE = '''
    import math
    from math import sqrt

    LIMIT = 3


    def word_count(text: str) -> int:
        """Count the words in a text
        (split on whitespace).

        A second paragraph the model does not read."""
        return len(text.split())


    def repeat(word: str, times: int = 2, separator: str | None = " ", scale: float = 1.0, loud: bool = False,
               tags: list[str] | None = None, extra: dict = {}, anything=None) -> str:
        """Repeat a word."""
        return (separator or "").join([word.upper() if loud else word] * times)


    def _helper():
        return 1
'''


@pytest.fixture
def tools_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(textwrap.dedent(TOOLS_FILE))
    return path


def test_load_tools_reads_public_functions_and_schema_from_file(tools_file):
    box = load_tools(str(tools_file))
    assert box.names == ("word_count", "repeat")  # not sqrt (imported), not _helper, not LIMIT
    word_count, repeat = (spec["function"] for spec in box.specs())
    assert word_count == {"name": "word_count", "description": "Count the words in a text (split on whitespace).",
                          "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}  # fmt: skip
    assert repeat["parameters"] == {"type": "object", "required": ["word"], "properties": {
        "word": {"type": "string"}, "times": {"type": "integer", "default": 2}, "separator": {"type": ["string", "null"], "default": " "},
        "scale": {"type": "number", "default": 1.0}, "loud": {"type": "boolean", "default": False},
        "tags": {"type": ["array", "null"], "default": None}, "extra": {"type": "object", "default": {}},
        "anything": {"type": "string", "default": None}}}  # fmt: skip
    assert box.run("repeat", '{"word": "hi", "times": 3, "loud": true}').text == "HI HI HI"
    assert box.run("word_count", {"text": "one two"}).text == "2"


def test_load_tools_takes_one_function_of_a_file_and_the_built_ins(tools_file):
    box = load_tools(f"calculator, {tools_file}:repeat ,python", ToolLimits(memory_mb=256))
    assert box.names == ("calculator", "repeat", "python") and box.limits.memory_mb == 256
    assert [box.get(name).spec() for name in ("calculator", "python")] == [BUILTIN["calculator"], BUILTIN["python"]]
    assert set(BUILTIN_TOOLS) == set(BUILTIN)


def test_load_tools_reads_annotations_written_as_text(tmp_path):
    path = tmp_path / "later.py"
    path.write_text("from __future__ import annotations\n\n\ndef scale(x: float, unit: Missing | None = None, n: int = 1) -> float:\n"
                    '    """Scale x."""\n    return x * n\n')  # fmt: skip
    properties = load_tools(str(path)).get("scale").parameters["properties"]
    assert properties == {"x": {"type": "number"}, "unit": {"type": "string", "default": None}, "n": {"type": "integer", "default": 1}}


@pytest.mark.parametrize("spec, message", [
    ("calculater", "tool 'calculater' is not a built-in (calculator, python) nor a .py file; write a built-in"),
    ("calculator,,python", "has an empty part"),
    ("", "names no tools"),
    ("{folder}/missing.py", "file {folder}/missing.py not found; give the path of a .py file"),
    ("{folder}/my_tools.py:shout", "has no 'shout' (its public functions: word_count, repeat)"),
    ("{folder}/my_tools.py:LIMIT", "LIMIT is a int, not a function; name a function there"),
    ("{folder}/my_tools.py:", "is not a built-in"),
    ("{folder}/my_tools.py,{folder}/my_tools.py:repeat",
     "two tools are named 'repeat' (from {folder}/my_tools.py and from {folder}/my_tools.py:repeat); rename one function"),
    ("calculator,calculator", "two tools are named 'calculator' (from calculator and from calculator)"),
])  # fmt: skip
def test_load_tools_errors_name_the_part_and_the_fix(tools_file, spec, message):
    spec, message = spec.format(folder=tools_file.parent), message.format(folder=tools_file.parent)
    with pytest.raises(GptlabError) as raised:
        load_tools(spec)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("source, message", [
    ("import no_such_module\n", "running {path} raised ModuleNotFoundError: No module named 'no_such_module'; fix the file"),
    ("def f(:\n", "raised SyntaxError: "),
    ("from math import sqrt\n_x = 1\n", "defines no public functions; define one"),
    ("def total(*numbers: int) -> int:\n    return sum(numbers)\n", "parameter *numbers: int of total cannot be given by name"),
])  # fmt: skip
def test_load_tools_errors_name_what_is_wrong_with_the_file(tmp_path, source, message):
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(GptlabError) as raised:
        load_tools(str(path))
    assert str(raised.value).startswith(f"tool {str(path)!r}: ") and message.format(path=path) in str(raised.value)


def test_tool_from_function_takes_a_lambda_only_with_a_name():
    assert tool_from_function(lambda a, b=1: a, name="first").parameters["required"] == ["a"]
    with pytest.raises(GptlabError, match="'<lambda>' cannot be a tool's name"):
        tool_from_function(lambda a: a)
