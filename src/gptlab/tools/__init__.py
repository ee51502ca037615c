"""Tools: functions a chat model calls by name (OpenAI-style function calling), run with limits so that no call
can raise, hang or flood the model. The built-ins are `calculator` (exact arithmetic) and `python` (a program in
gptlab's code sandbox); a user's own come from a .py file (gptlab.tools.registry says how to write one).

    toolbox = load_tools("calculator,python,my_tools.py")
    budget = toolbox.session()                       # one request's calls and seconds
    budget.run("calculator", '{"expression": "1234 * 5678"}').text  -> "7006652"

Importing this package imports no torch.
Not here: rendering calls and results into a conversation (gptlab.chat), the engine hook that calls Toolbox.run.
"""

from gptlab.tools.base import Tool, Toolbox, ToolBudget, ToolLimits, reply_limits
from gptlab.tools.registry import BUILTIN_TOOLS, load_tools, task_toolbox, tool_from_function
from gptlab.tools.results import ToolResult

__all__ = ["BUILTIN_TOOLS", "Tool", "ToolBudget", "ToolLimits", "ToolResult", "Toolbox", "load_tools", "reply_limits",
           "task_toolbox", "tool_from_function"]
