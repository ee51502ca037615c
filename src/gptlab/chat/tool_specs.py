"""The built-in tools' declarations, in the OpenAI shape: what a conversation offers the model, and what the chat
format renders in its tools block. The tools that answer them run in gptlab.tools; these are only their names,
descriptions and parameters, kept here so that built-in tasks (gptlab.chat.tasks) can offer them in SFT data.

    {"type": "function", "function": {"name": "calculator", "description": "...", "parameters": {...}}}
"""

from __future__ import annotations


def function_spec(name: str, description: str, properties: dict[str, dict], required: list[str]) -> dict:
    """A tool's declaration as the OpenAI API's `tools` list holds it."""
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


CALCULATOR = function_spec(
    "calculator",
    "Exact arithmetic on integers and decimals: + - * / // % ** and parentheses, e.g. 1234 * 5678.",
    {"expression": {"type": "string", "description": "the arithmetic expression"}},
    ["expression"],
)
PYTHON = function_spec(
    "python",
    "Run a Python program in a sandbox (no network, no files outside its folder) and return what it prints.",
    {"code": {"type": "string", "description": "the program; print the result"}},
    ["code"],
)
BUILTIN = {"calculator": CALCULATOR, "python": PYTHON}
