"""Tools by spec: the built-ins by name, and a user's functions from a .py file, made into one Toolbox.

    load_tools("calculator")                           the built-in calculator
    load_tools("calculator,python")                    both built-ins
    load_tools("calculator,my_tools.py")               and every public function of my_tools.py
    load_tools("my_tools.py:word_count")               only that function of the file
    task_toolbox("auto", Arithmetic(tools=1))          the tools a task offers (here the calculator); None if none

A spec is comma-separated parts, each a built-in's name (BUILTIN_TOOLS: calculator, python), a file
`path/to/tools.py` (every public function defined in it: not imported ones, not names starting with "_") or
`path/to/tools.py:function`. The file is run as a module without installing anything (gptlab.runtime.user_code).

Writing your own tool file. A function's name is the tool's name, the first paragraph of its docstring the
description the model reads, and its parameters the arguments: annotated int, float, str, bool, list or dict
(or `X | None`), a default making one optional; a parameter without one of these annotations is a string. It
returns a str, a number, a bool, None, a list or a dict; what it prints is dropped. It runs in a forked process
that is killed at the call's time limit, so a slow or stuck function costs the model only an error result:

    # my_tools.py                         use: load_tools("calculator,my_tools.py")
    def word_count(text: str) -> int:
        \"\"\"Count the words in a text (split on whitespace).\"\"\"
        return len(text.split())

    def repeat(word: str, times: int = 2, separator: str = " ") -> str:
        \"\"\"Repeat a word a number of times.\"\"\"
        return separator.join([word] * times)

Not here: running a call (gptlab.tools.base); the built-ins themselves (gptlab.tools.calculator, .python_tool).
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path

from gptlab.runtime import GptlabError
from gptlab.runtime.user_code import load_module_from_file, public_functions
from gptlab.tools.base import DEFAULT_LIMITS, NAME, Tool, Toolbox, ToolLimits
from gptlab.tools.calculator import calculator_tool
from gptlab.tools.python_tool import python_tool

BUILTIN_TOOLS: dict[str, Callable[[ToolLimits], Tool]] = {"calculator": calculator_tool, "python": python_tool}
JSON_TYPE_OF = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
FORMS = "a built-in (calculator, python), path/to/tools.py or path/to/tools.py:function"


def load_tools(spec: str, limits: ToolLimits = DEFAULT_LIMITS) -> Toolbox:
    """The Toolbox a spec names (module docstring), every error a one-line GptlabError naming the part and the fix."""
    if not isinstance(spec, str) or not spec.strip():
        raise GptlabError(f"tool spec {spec!r} names no tools; write {FORMS}, separated by commas")
    tools: list[Tool] = []
    origins: dict[str, str] = {}
    for part in (piece.strip() for piece in spec.split(",")):
        if not part:
            raise GptlabError(f"tool spec {spec!r} has an empty part; write {FORMS}, separated by commas")
        for tool in _load_part(part, limits):
            if tool.name in origins:
                raise GptlabError(f"two tools are named {tool.name!r} (from {origins[tool.name]} and from {part}); "
                                  "rename one function or name only one of them")  # fmt: skip
            origins[tool.name] = part
            tools.append(tool)
    return Toolbox(tools, limits)


def task_toolbox(spec: str | None, task=None, limits: ToolLimits = DEFAULT_LIMITS) -> Toolbox | None:
    """The toolbox a run's `tools` setting names: "auto" the built-ins a task offers (gptlab.chat.tasks: its
    `offered_tools`; None when it offers none), None or "none" no tools, anything else a spec for load_tools."""
    if spec is None or spec == "none":
        return None
    if spec == "auto":
        offered = getattr(task, "offered_tools", ()) if task is not None else ()
        if not offered:
            return None
        spec = ",".join(declaration["function"]["name"] for declaration in offered)
    return load_tools(spec, limits)


def _load_part(part: str, limits: ToolLimits) -> list[Tool]:
    """The tools one part of a spec names."""
    if part in BUILTIN_TOOLS:
        return [BUILTIN_TOOLS[part](limits)]
    if part.endswith(".py"):
        path, name = part, ""
    else:
        where, colon, name = part.rpartition(":")
        path, name = where.strip(), name.strip()
        if not (colon and path.endswith(".py") and name):
            raise GptlabError(f"tool {part!r} is not a built-in ({', '.join(BUILTIN_TOOLS)}) nor a .py file; write {FORMS}")
    module = load_module_from_file(Path(path), f"tool {part!r}")
    functions = public_functions(module)
    if not name:
        if not functions:
            raise GptlabError(f"tool {part!r}: {path} defines no public functions; define one (a name not starting with _)")
        return [tool_from_function(function, part) for function in functions.values()]
    if not hasattr(module, name):
        raise GptlabError(f"tool {part!r}: {path} has no {name!r} (its public functions: {', '.join(functions) or 'none'})")
    function = getattr(module, name)
    if not callable(function):
        raise GptlabError(f"tool {part!r}: {name} is a {type(function).__name__}, not a function; name a function there")
    return [tool_from_function(function, part, name=name)]


def tool_from_function(function: Callable, origin: str = "", *, name: str | None = None) -> Tool:
    """A Tool from a Python function: its name, its docstring's first paragraph, a parameter schema from its
    signature (module docstring). `origin` is named in errors (the spec's part)."""
    name = name or getattr(function, "__name__", "")
    where = f"tool {origin!r}" if origin else f"tool {name!r}"
    if not NAME.fullmatch(name):
        raise GptlabError(f"{where}: {name!r} cannot be a tool's name; use letters, digits, _ and - (up to 64)")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins and C callables have no signature to read
        raise GptlabError(f"{where}: the parameters of {name} cannot be read; wrap it in a def with named parameters") from None
    try:
        signature = inspect.signature(function, eval_str=True)  # annotations written as text (from __future__ ...)
    except Exception:  # one naming something undefined: keep them as written, read by name below
        pass
    properties, required = {}, []
    for parameter in signature.parameters.values():
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise GptlabError(f"{where}: parameter {parameter} of {name} cannot be given by name; "
                              "a tool is called with keyword arguments only, so give it a plain parameter")  # fmt: skip
        properties[parameter.name] = _property(parameter)
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    description = inspect.getdoc(function) or ""
    description = " ".join(description.split("\n\n")[0].split())
    return Tool(name, description, {"type": "object", "properties": properties, "required": required}, function)


def _property(parameter: inspect.Parameter) -> dict:
    """A parameter's JSON schema: its type from the annotation (string when it has none gptlab knows), its default."""
    schema: dict = {}
    names = [_json_type(annotation) for annotation in _union_members(parameter.annotation)]
    if names and all(names):
        schema["type"] = names[0] if len(names) == 1 else names
    else:
        schema["type"] = "string"
    if parameter.default is not parameter.empty:
        try:
            json.dumps(parameter.default)
            schema["default"] = parameter.default
        except (TypeError, ValueError):  # a default JSON cannot show is still the function's own
            pass
    return schema


def _union_members(annotation: object) -> list:
    """The types an annotation allows: [int] for int, [int, None] for int | None or Optional[int], [] for none."""
    if annotation is inspect.Parameter.empty:
        return []
    if isinstance(annotation, str):  # as written, when it could not be evaluated
        return [member.strip() for member in annotation.split("|")]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def _json_type(annotation: object) -> str | None:
    """The JSON type of one annotation (int, list[str], "float", None...), or None when it has no JSON type."""
    if annotation is None or annotation is type(None) or annotation == "None":
        return "null"
    annotation = typing.get_origin(annotation) or annotation  # list[str] -> list
    if isinstance(annotation, str):
        annotation = {kind.__name__: kind for kind in JSON_TYPE_OF}.get(annotation.partition("[")[0], annotation)
    return JSON_TYPE_OF.get(annotation) if isinstance(annotation, type) else None
