"""The python tool: the model writes a program, gptlab's code sandbox runs it, and the model reads what it printed.

    run_python("print(2 ** 100)", timeout=10, memory_mb=512, max_chars=2000) -> "1267650600228229401496703205376"
    run_python("1 / 0", ...)            -> GptlabError("ZeroDivisionError: division by zero")
    run_python("while True: pass", timeout=1, ...) -> GptlabError("the program ran past 1 s")

A program that runs to its end gives its output (stdout and stderr together, as the sandbox keeps them, trailing
whitespace stripped); one that prints nothing gives a reminder to print. Any other ending is an error result
(the Toolbox writes "error: " before the message): a failure gives the line of its traceback that names the
exception; a timeout, running out of memory and a call the sandbox refused each say so; output over the result
limit says how much there was, as the model should print less rather than read a cut-off tail.

The sandbox (gptlab.eval.sandbox) is what makes this safe to offer: a fresh folder, no network, no new processes,
no writing outside the folder, and a memory and time limit. It keeps its own time, so this tool runs in the
calling process (Tool.in_process) and is handed the seconds it has.

Not here: the sandbox itself (gptlab.eval.sandbox); the tool's declaration (gptlab.chat.tool_specs).
"""

from __future__ import annotations

from gptlab.chat.tool_specs import PYTHON
from gptlab.eval.sandbox import OUTPUT_CHARS, run_program
from gptlab.runtime import GptlabError
from gptlab.tools.base import DEFAULT_LIMITS, Tool, ToolLimits

NOTHING_PRINTED = "(the program printed nothing; print the result to see it)"


def run_python(code: str, *, timeout: float, memory_mb: int, max_chars: int) -> str:
    """What the program printed, or a GptlabError saying how it ended otherwise (module docstring)."""
    result = run_program(code, timeout=timeout, memory_mb=memory_mb)
    output = result.output.rstrip()
    if result.status == "passed":
        if len(output) > max_chars:
            printed = f"at least {len(result.output):,}" if len(result.output) >= OUTPUT_CHARS else f"{len(output):,}"
            raise GptlabError(f"the program printed {printed} characters; the limit is {max_chars:,}: print less, e.g. a summary")
        return output or NOTHING_PRINTED
    last_line = _exception_line(output)
    if result.status == "timeout":
        raise GptlabError(f"the program ran past {timeout:.3g} s")
    if result.status == "memory":
        raise GptlabError(f"the program ran out of memory (the limit is {memory_mb:,} MB)")
    if result.status == "blocked":
        raise GptlabError(f"the sandbox refused what the program did: {last_line or 'no message'}")
    if result.status == "error":
        raise GptlabError(f"the sandbox could not start the program: {last_line or 'no message'}")
    raise GptlabError(last_line or "the program failed without a message")


def _exception_line(output: str) -> str:
    """The line naming the exception ("ZeroDivisionError: division by zero"): the first unindented line after the last
    traceback's frames (stdout is flushed after stderr, so what the program printed may come after it), else the
    last line."""
    lines = output.splitlines()
    headers = [index for index, line in enumerate(lines) if line.startswith(("Traceback (most recent call last):", '  File "'))]
    if headers:
        after = [line for line in lines[headers[-1] + 1 :] if line and not line[0].isspace()]
        if after:
            return after[0].strip()
    return lines[-1].strip() if lines else ""


def python_tool(limits: ToolLimits = DEFAULT_LIMITS) -> Tool:
    """The built-in python tool as a Tool: programs get `limits.memory_mb` and the call's seconds."""
    declaration = PYTHON["function"]

    def python(code: str, timeout: float) -> str:
        return run_python(code, timeout=timeout, memory_mb=limits.memory_mb, max_chars=limits.max_result_chars)

    return Tool(declaration["name"], declaration["description"], declaration["parameters"], python, in_process=True)
