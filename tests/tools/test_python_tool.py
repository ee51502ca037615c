"""The python tool runs real programs in the code sandbox and reports how each ended in one line."""

import pytest

from gptlab.tools import Toolbox, ToolLimits
from gptlab.tools.python_tool import NOTHING_PRINTED, python_tool


@pytest.fixture(scope="module")
def box() -> Toolbox:
    limits = ToolLimits(call_seconds=1, max_result_chars=500)
    return Toolbox([python_tool(limits)], limits)


def test_python_tool_returns_what_the_program_printed(box):
    result = box.run("python", {"code": "print(2 ** 100)\nprint('done')  \n\n"})
    assert result.ok and result.text == "1267650600228229401496703205376\ndone"
    assert box.run("python", {"code": "x = 1"}).text == NOTHING_PRINTED


def test_python_tool_returns_the_exception_of_a_failing_program(box):
    result = box.run("python", {"code": "print('before')\n1 / 0\n"})
    assert not result.ok and result.text == "error: ZeroDivisionError: division by zero"
    assert box.run("python", {"code": "def f(:\n"}).text.startswith("error: SyntaxError: ")


def test_python_tool_stops_an_endless_loop_at_the_call_timeout(box):
    assert box.run("python", {"code": "while True:\n    pass\n"}).text == "error: the program ran past 1 s"
    assert box.run("python", {"code": "print(1)"}).text == "1"


def test_python_tool_refuses_output_over_the_result_limit(box):
    assert box.run("python", {"code": "print('x' * 499)"}).ok
    text = box.run("python", {"code": "print('x' * 600)"}).text
    assert text == "error: the program printed 600 characters; the limit is 500: print less, e.g. a summary"
    assert box.run("python", {"code": "print('x' * 10 ** 6)"}).text.startswith("error: the program printed at least 4,000 characters")


def test_python_tool_reports_what_the_sandbox_refused(box):
    text = box.run("python", {"code": "import socket\nsocket.socket()\n"}).text
    assert text.startswith("error: the sandbox refused what the program did: PermissionError")
