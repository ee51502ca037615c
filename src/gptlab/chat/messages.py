"""Checking conversations in the OpenAI message shape before they are rendered, tool calls and tool results included.

    {"role": "user", "content": "What is 1234 * 5678?"}
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "calculator", "arguments": "{\\"expression\\": \\"1234 * 5678\\"}"}}]}
    {"role": "tool", "tool_call_id": "call_1", "content": "7006652"}
    {"role": "assistant", "content": "1234 * 5678 = 7006652"}

A tool call's `arguments` is the JSON text the model wrote (as the OpenAI API sends it) or an object (as
transformers' chat templates take it). Tool results follow the assistant message that made the calls, one per call,
in order. Tools offered are declared in the same shape as the API's `tools`: {"type": "function", "function":
{"name", "description", "parameters"}}.

Not here: rendering (gptlab.chat.format), running tools (gptlab.tools).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gptlab.runtime import GptlabError

ROLES = ("system", "user", "assistant", "tool")
TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")  # the OpenAI API's rule for function names, less the length

Message = Mapping[str, object]


def check_messages(messages: Sequence[Message], *, for_generation: bool = False) -> None:
    """Raise GptlabError naming the first problem: not a list, unknown role, empty or non-text content, a system
    message after the first, a malformed tool call, a tool result without its call, or (for training) no assistant
    message or calls without results; for generation the last message must be a user's or a tool's."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence) or not messages:
        raise GptlabError("a conversation is a non-empty list of messages like {\"role\": \"user\", \"content\": \"...\"}")
    pending = 0  # calls of the last assistant message still waiting for their results
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise GptlabError(f"message {n} is not an object with role and content: {message!r:.60}")
        role = message.get("role")
        if role not in ROLES:
            raise GptlabError(f"message {n} has unknown role {role!r}; use one of {', '.join(ROLES)}")
        if role == "system" and n > 0:
            raise GptlabError(f"message {n} is a system message; only the first message may be one")
        calls = _check_calls(n, message) if role == "assistant" else 0
        _check_content(n, message, empty_allowed=role == "tool" or calls > 0)
        if role == "tool":
            if pending == 0:
                raise GptlabError(f"message {n} is a tool result with no tool call before it to answer")
            pending -= 1
            continue
        if pending:
            raise GptlabError(f"message {n - 1} made tool calls that have no results: follow it with one tool message per call")
        pending = calls
    _check_ending(messages, pending, for_generation)


def _check_ending(messages: Sequence[Message], pending: int, for_generation: bool) -> None:
    roles = [message["role"] for message in messages]
    if pending:
        raise GptlabError(f"message {len(messages) - 1} made tool calls that have no results: "
                          "follow it with one tool message per call")
    if for_generation:
        if roles[-1] == "assistant":
            raise GptlabError("the last message is the assistant's: end with a user message to generate a reply")
    elif "assistant" not in roles:
        raise GptlabError("the conversation has no assistant message: nothing to train on")


def _check_content(n: int, message: Message, *, empty_allowed: bool) -> None:
    role, content = message["role"], message.get("content")
    if content is None and empty_allowed:
        return
    if not isinstance(content, str):
        raise GptlabError(f"message {n} ({role}) content must be text, got {type(content).__name__}")
    if not empty_allowed and not content.strip():
        raise GptlabError(f"message {n} ({role}) has empty content")


def _check_calls(n: int, message: Message) -> int:
    """How many tool calls an assistant message makes (0 without `tool_calls`); a malformed one raises."""
    calls = message.get("tool_calls")
    if calls is None:
        return 0
    if isinstance(calls, (str, Mapping)) or not isinstance(calls, Sequence):
        raise GptlabError(f"message {n} (assistant) tool_calls must be a list of calls, got {type(calls).__name__}")
    for k, call in enumerate(calls):
        function = call_function(call)
        where = f"message {n} (assistant) tool call {k}"
        if function is None:
            raise GptlabError(f"{where} is not {{\"type\": \"function\", \"function\": {{\"name\": ..., \"arguments\": ...}}}}")
        name, arguments = function.get("name"), function.get("arguments", {})
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise GptlabError(f"{where} has function name {name!r}; a name is letters, digits, _ or -, not starting with a digit")
        if not isinstance(arguments, (str, Mapping)):
            raise GptlabError(f"{where} ({name}) arguments must be JSON text or an object, got {type(arguments).__name__}")
    return len(calls)


def call_function(call: object) -> Mapping | None:
    """The {"name", "arguments"} part of a tool call ({"type": "function", "function": {...}}, or that part alone)."""
    if not isinstance(call, Mapping):
        return None
    if call.get("type", "function") != "function":
        return None
    function = call.get("function", call)
    return function if isinstance(function, Mapping) and "name" in function else None


def check_tools(tools: Sequence[Mapping]) -> list[Mapping]:
    """The `function` part of each declared tool; GptlabError names the first malformed one or a repeated name."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise GptlabError(f"tools must be a list of {{\"type\": \"function\", \"function\": {{...}}}}, got {type(tools).__name__}")
    functions, seen = [], set()
    for k, tool in enumerate(tools):
        function = call_function(tool)
        name = function.get("name") if function is not None else None
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise GptlabError(f"tool {k} is not {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}} "
                              f"with a name of letters, digits, _ or -: {tool!r:.80}")
        if name in seen:
            raise GptlabError(f"tool {k}: the name {name!r} is declared twice; give each tool its own name")
        parameters = function.get("parameters", {})
        if not isinstance(parameters, Mapping) or not isinstance(parameters.get("properties", {}), Mapping):
            raise GptlabError(f"tool {name!r}: parameters must be a JSON schema object with `properties`, got {parameters!r:.80}")
        seen.add(name)
        functions.append(function)
    return functions
