"""What a chat request's tools mean for its prompt and its sampling (OpenAI's Chat Completions semantics).

    {"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {...}}}], "tool_choice": "auto"}

The tools offered are the server's own (`gptlab serve --tools`, run here while the model generates), then the
request's (run by the client: a call to one ends the reply with finish_reason "tool_calls"); both go in the prompt's
tools block. `tool_choice` says how the assistant's turn may start:

    "auto" (or absent)   the model decides
    "none"               the call token is never sampled (SamplingConfig.suppress_tokens)
    "required"           the turn starts with the call token: the model writes a call's name and arguments
    {"type": "function", "function": {"name": N}}   the turn starts with the call token and N

A tool message answers a call of the assistant message before it by `tool_call_id`; results may come in any order
and are put in the calls' order, which is how the format pairs them. Every problem is an APIError (400) that names
the field. Not here: reading the reply's calls back out of its tokens (gptlab.serve.tool_replies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gptlab.chat import ChatFormat
from gptlab.chat.messages import check_tools
from gptlab.runtime import GptlabError
from gptlab.serve.protocol import ChatRequest
from gptlab.serve.replies import APIError
from gptlab.tools import Toolbox
from gptlab.tools.turn import ToolTurn


@dataclass(frozen=True)
class ToolOffer:
    """One request's tools: what the prompt declares, who runs what, and how the turn may start."""

    specs: tuple[dict, ...]  # the tools block: the server's tools, then the request's
    client: frozenset[str]  # names of the tools the client runs
    prefix: tuple[int, ...] = ()  # ids the assistant's turn starts with, appended to the prompt
    suppress: tuple[int, ...] = ()  # ids never sampled

    def turn(self, chat: ChatFormat, toolbox: Toolbox | None) -> ToolTurn:
        """A fresh tool loop for one choice (its own calls and seconds against the toolbox's limits)."""
        return ToolTurn(chat, toolbox, client=self.client, prefix=self.prefix)


def offer_tools(chat: ChatFormat, body: ChatRequest, toolbox: Toolbox | None) -> ToolOffer | None:
    """The request's ToolOffer, or None when neither it nor the server offers a tool."""
    requested = [tool.model_dump(exclude_none=True) for tool in body.tools or ()]
    if not requested and toolbox is None:
        if body.tool_choice is not None:
            raise APIError(400, "tool_choice needs tools: give the request a `tools` list", param="tool_choice")
        return None
    if not chat.supports_tools:
        raise APIError(400, "this model's tokenizer lacks the tool tokens (a chat model made before tool use), so it "
                       "cannot be offered tools: fine-tune it again with `gptlab sft`, which adds them",
                       param="tools", code="tools_not_supported")
    ours = toolbox.names if toolbox is not None else ()
    try:
        functions = check_tools(requested)
    except GptlabError as error:
        raise APIError(400, f"tools: {error}", param="tools") from None
    names = [function["name"] for function in functions]
    for k, name in enumerate(names):
        if name in ours:
            raise APIError(400, f"tools.{k}: this server runs a tool named {name!r} itself (its tools: {', '.join(ours)}); "
                           "give yours another name", param=f"tools.{k}")
    specs = (*(toolbox.specs() if toolbox is not None else ()), *requested)
    prefix, suppress = choice_ids(chat, body.tool_choice, [*ours, *names])
    return ToolOffer(specs, frozenset(names), prefix, suppress)


def choice_ids(chat: ChatFormat, choice, offered: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suppressed ids) for a tool_choice (module docstring)."""
    if choice is None or choice == "auto":
        return (), ()
    if choice == "none":
        return (), (chat.call,)
    if choice == "required":
        return (chat.call,), ()
    name = choice.function.name
    if name not in offered:
        raise APIError(400, f"tool_choice names the function {name!r}, which is not among the tools offered "
                       f"({', '.join(offered)})", param="tool_choice")
    return (chat.call, *chat.encode(name)), ()


def order_tool_results(messages: list[dict]) -> list[dict]:
    """The messages with each run of tool results in the order of the calls they answer (by tool_call_id); a
    result that answers no call of the assistant message before it, or one answered twice, is an APIError."""
    ordered: list[dict] = []
    calls: list[str] = []  # ids of the calls the latest assistant message made
    results: dict[str, dict] = {}
    for n, message in enumerate(messages):
        if message["role"] != "tool":
            ordered += sorted(results.values(), key=lambda result: calls.index(result["tool_call_id"]))
            results = {}
            calls = [call["id"] for call in message.get("tool_calls") or ()] if message["role"] == "assistant" else []
            ordered.append(message)
            continue
        answers = message.get("tool_call_id")
        if answers not in calls or answers in results:
            what = "answers it a second time" if answers in results else "answers no tool call of the assistant message before it"
            known = f" (its calls: {', '.join(calls)})" if calls else ""
            raise APIError(400, f"messages.{n}: the tool result for tool_call_id {answers!r} {what}{known}",
                           param=f"messages.{n}.tool_call_id")
        results[answers] = message
    return ordered + sorted(results.values(), key=lambda result: calls.index(result["tool_call_id"]))
