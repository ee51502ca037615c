"""Tools a chat model may call, and running one call safely: a Tool (a function and its OpenAI-style declaration),
the limits of one request (ToolLimits), the text the model reads back (ToolResult), a Toolbox that runs calls
and a ToolBudget that counts one request's calls and seconds.

    box = Toolbox([calculator_tool()])
    box.run("calculator", '{"expression": "1234 * 5678"}')   -> ToolResult(text="7006652", ok=True, seconds=0.0001)
    box.run("calculator", '{"expression": "1 / 0"}')         -> ToolResult(text="error: division by zero", ok=False, ...)
    box.run("weather", "{}")                                 -> ToolResult(text="error: no tool named 'weather'; ...", ...)

`Toolbox.run` never raises for anything the model wrote or a tool did: an unknown tool, arguments that are not a
JSON object or do not fit the declared parameters, a function that raises, hangs past its time or returns too much
or something that is not text each become a one-line result "error: ..." that the model reads and can act on.

How a call runs. A tool's function runs in a forked worker process (gptlab.tools.worker), killed when its time is
up, so a user's function that loops forever, crashes the interpreter or prints costs that worker only: this
process stays usable and its output clean. A tool marked `in_process` is called here instead, with the seconds it
has as `timeout=`: for functions that keep their own time (the built-ins: the calculator caps its work before
doing it, and the python tool's sandbox kills its program at the timeout).

A result is text: a str as it is; a number, bool, None, list or dict as JSON (gptlab.tools.results).

Not here: the built-in tools (gptlab.tools.calculator, gptlab.tools.python_tool), loading tools from a spec or a
user's file (gptlab.tools.registry), rendering calls and results into a chat (gptlab.chat).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gptlab.eval.sandbox import MIN_MEMORY_MB
from gptlab.runtime import GptlabError
from gptlab.tools.results import ToolResult, describe_exception, error_result, result_text
from gptlab.tools.worker import call_in_worker

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
              "object": (dict,), "null": (type(None),)}  # fmt: skip


@dataclass(frozen=True)
class Tool:
    """A function the model may call by name, with its declaration: what it does and its parameters as a JSON-schema
    object ({"type": "object", "properties": {...}, "required": [...]}). The function is called with the arguments
    as keywords; `in_process`: see the module docstring."""

    name: str
    description: str
    parameters: dict
    function: Callable[..., object]
    in_process: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise GptlabError(f"tool name {self.name!r} must be a letter or _ then up to 63 letters, digits, _ or -, e.g. word_count")
        if not isinstance(self.description, str):
            raise GptlabError(f"tool {self.name}: description must be text, got {type(self.description).__name__}")
        _check_parameters(self.name, self.parameters)
        if not callable(self.function):
            raise GptlabError(f"tool {self.name}: function is a {type(self.function).__name__}, not something to call")

    def spec(self) -> dict:
        """The declaration in the OpenAI shape: {"type": "function", "function": {"name", "description", "parameters"}}."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def _check_parameters(name: str, parameters: object) -> None:
    """A GptlabError unless `parameters` is a JSON-schema object whose properties are schemas and hold the required."""
    properties = parameters.get("properties", {}) if isinstance(parameters, Mapping) else None
    if not isinstance(properties, Mapping) or parameters.get("type") != "object" or not all(isinstance(item, Mapping) for item in properties.values()):
        raise GptlabError(f"tool {name}: parameters must be a JSON-schema object, "
                          f'{{"type": "object", "properties": {{NAME: {{"type": ...}}}}, "required": [...]}}; got {parameters!r:.120}')
    missing = [item for item in parameters.get("required", []) if item not in properties]
    if missing:
        raise GptlabError(f"tool {name}: required parameter {missing[0]!r} is not among its properties; declare it there")


@dataclass(frozen=True, kw_only=True)
class ToolLimits:
    """What one request may spend on tools."""

    max_calls: int = 8  # calls one request may make; the next one gets an error result
    seconds: float = 20.0  # all calls of one request together
    call_seconds: float = 10.0  # one call
    max_result_chars: int = 2000  # a longer result is an error result
    memory_mb: int = 512  # the python tool's sandbox

    def __post_init__(self) -> None:
        for field, low in (("max_calls", 1), ("max_result_chars", 1), ("memory_mb", MIN_MEMORY_MB)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise GptlabError(f"tool limit {field}={value!r} must be a whole number of at least {low}")
        for field in ("seconds", "call_seconds"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise GptlabError(f"tool limit {field}={value!r} must be a positive number of seconds, e.g. 10")


def parse_arguments(tool: Tool, arguments: str | Mapping) -> dict:
    """The call's arguments as keywords, checked against the tool's parameters; a GptlabError says what is wrong."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise GptlabError(f"the arguments to {tool.name} are not JSON ({error}); write a JSON object, "
                              f"e.g. {_example(tool)}") from None
    if not isinstance(arguments, Mapping):
        raise GptlabError(f"the arguments to {tool.name} must be a JSON object, got {_json_type(arguments)}; e.g. {_example(tool)}")
    properties = tool.parameters.get("properties", {})
    for name, value in arguments.items():
        if name not in properties:
            raise GptlabError(f"{tool.name} has no argument {name!r}; its arguments: {', '.join(properties) or 'none'}")
        expected = properties[name].get("type") if isinstance(properties[name], Mapping) else None
        names = [expected] if isinstance(expected, str) else list(expected or [])
        kinds = tuple(kind for type_name in names for kind in JSON_TYPES.get(type_name, (object,)))
        if kinds and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise GptlabError(f"argument {name!r} of {tool.name} must be {' or '.join(names)}, got {_json_type(value)} {json.dumps(value)[:60]}")
    missing = [name for name in tool.parameters.get("required", []) if name not in arguments]
    if missing:
        raise GptlabError(f"{tool.name} needs the argument {missing[0]!r}; e.g. {_example(tool)}")
    return dict(arguments)


def _json_type(value: object) -> str:
    """The JSON name of a parsed value's type: "string", "integer", "array"..."""
    if isinstance(value, bool):
        return "boolean"
    return next((name for name, kinds in JSON_TYPES.items() if isinstance(value, kinds)), type(value).__name__)


def _example(tool: Tool) -> str:
    """A call's arguments as the model should write them: {"expression": "..."}."""
    properties = tool.parameters.get("properties", {})
    required = tool.parameters.get("required", []) or list(properties)
    samples = {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    return json.dumps({name: samples.get(properties[name].get("type"), "...") for name in required})


DEFAULT_LIMITS = ToolLimits()


def reply_limits(calls: int, seconds: float) -> ToolLimits:
    """The limits of one reply as the commands' --tool-calls and --tool-seconds give them: each call at most half
    the reply's seconds, so one stuck call leaves time to answer."""
    return ToolLimits(max_calls=calls, seconds=seconds, call_seconds=seconds / 2)


class Toolbox:
    """Tools by name, and running a call of one (module docstring)."""

    def __init__(self, tools: Sequence[Tool], limits: ToolLimits = DEFAULT_LIMITS) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if not isinstance(tool, Tool):
                raise GptlabError(f"a toolbox holds Tool objects, got {type(tool).__name__}; wrap the function in Tool(...)")
            if tool.name in self.tools:
                raise GptlabError(f"two tools are named {tool.name!r}; give each tool its own name")
            self.tools[tool.name] = tool
        if not isinstance(limits, ToolLimits):
            raise GptlabError(f"toolbox limits must be a ToolLimits, got {type(limits).__name__}")
        self.limits = limits

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tools)

    def specs(self) -> list[dict]:
        """Every tool's declaration, in order: the `tools` list of an OpenAI request."""
        return [tool.spec() for tool in self.tools.values()]

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def session(self) -> ToolBudget:
        """A fresh count of one request's calls and seconds against these limits."""
        return ToolBudget(self)

    def run(self, name: str, arguments: str | Mapping, *, timeout: float | None = None) -> ToolResult:
        """One call's result, never an exception (module docstring): the function gets min(timeout, call_seconds)."""
        started = time.monotonic()
        limit = self.limits.max_result_chars
        try:
            tool = self.tools.get(name) if isinstance(name, str) else None
            if tool is None:
                return error_result(f"no tool named {str(name)[:64]!r}; the tools: {', '.join(self.names) or 'none'}", limit=limit)
            seconds = self.limits.call_seconds if timeout is None else min(timeout, self.limits.call_seconds)
            keywords = parse_arguments(tool, arguments)
            if tool.in_process:
                text = result_text(tool.function(**keywords, timeout=seconds), tool.name, limit)
            else:
                text = call_in_worker(tool.name, tool.function, keywords, seconds, limit)
            return ToolResult(text, True, time.monotonic() - started)
        except Exception as error:  # anything a tool or the model did is the model's to read, not ours to raise
            return error_result(describe_exception(error), time.monotonic() - started, limit)


class ToolBudget:
    """One request's use of a toolbox: its calls and seconds so far, each call checked against the limits."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.toolbox = toolbox
        self.calls = 0
        self.seconds = 0.0

    def run(self, name: str, arguments: str | Mapping) -> ToolResult:
        """The call's result, or an error result once the request has used its calls or its seconds."""
        limits = self.toolbox.limits
        if self.calls >= limits.max_calls:
            return error_result(f"call limit of {limits.max_calls} reached; answer without tools")
        left = limits.seconds - self.seconds
        if left <= 0:
            return error_result(f"time limit of {limits.seconds:g} s for tools reached; answer without tools")
        result = self.toolbox.run(name, arguments, timeout=min(limits.call_seconds, left))
        self.calls += 1
        self.seconds += result.seconds
        return result
