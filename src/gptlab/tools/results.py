"""What the model reads back from a tool call: a ToolResult, the value made text, or one line "error: ...".

    result_text(7006652, "calculator", 2000)   -> "7006652"
    result_text({"a": [1, 2]}, "lookup", 2000) -> '{"a": [1, 2]}'
    error_result("division by zero")           -> ToolResult(text="error: division by zero", ok=False, seconds=0.0)

A str is the text as it is; a number, bool, None, list or dict is JSON (ensure_ascii=False, so "é" stays "é");
anything else, or text over the length limit, is an error. An exception is described by its message alone when it
is a GptlabError (a tool's own words for what went wrong), else as "ValueError: its first line".

Not here: running the call (gptlab.tools.base, gptlab.tools.worker).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gptlab.runtime import GptlabError
from gptlab.runtime.user_code import first_line

ERROR = "error: "


@dataclass(frozen=True)
class ToolResult:
    """What the model reads back: the value as text, or one line "error: ..." (then ok is False)."""

    text: str
    ok: bool
    seconds: float


def error_result(message: str, seconds: float = 0.0, limit: int | None = None) -> ToolResult:
    """An error result: "error: MESSAGE" on one line, cut to `limit` characters."""
    text = ERROR + " ".join(message.split())
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, len(ERROR))] + "..."
    return ToolResult(text, False, seconds)


def describe_exception(error: BaseException) -> str:
    """What an error result says of an exception (module docstring)."""
    if isinstance(error, GptlabError):
        return first_line(error)
    return f"{type(error).__name__}: {first_line(error)}"


def result_text(value: object, tool: str, limit: int) -> str:
    """A function's return value as the text the model reads; a GptlabError if it cannot be text or is too long."""
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, (bool, int, float, list, tuple, dict)):
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError) as error:
            raise GptlabError(f"tool {tool} returned a {type(value).__name__} that JSON cannot hold ({first_line(error)}); "
                              "return text, numbers, lists or dicts of them") from None
    else:
        raise GptlabError(f"tool {tool} returned a value of type {type(value).__name__}, which is not text; "
                          "return a str, a number, a bool, None, a list or a dict")
    if len(text) > limit:
        raise GptlabError(f"tool {tool} returned {len(text):,} characters; the limit is {limit:,}")
    return text
