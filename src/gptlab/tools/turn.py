"""One request's tool loop: the ids of the assistant's turn so far; when the turn closes with calls, the calls run
and their results are fed back for the model to read (gptlab.infer.tool_loop), or the turn ends the reply for the
client to run them.

    turn = ToolTurn(chat, load_tools("calculator"))
    generate(model, [chat.prompt(messages, tools=turn.specs)], config, tools=[turn])
    turn.runs   -> [ToolRun(name="calculator", arguments='{"expression": "1234 * 5678"}', result=ToolResult("7006652", ...))]

A call to a tool the client runs (`client=`, the OpenAI API's `tools` of a request) ends the reply with the reason
"tool_calls", and every call of that turn goes back to the client; a call to a tool of the toolbox runs here,
under the toolbox's per-request limits (calls, seconds), and whatever happens reaches the model as a result text.

Evaluation and RL rollouts take `chat_tools(chat, toolbox)`: the toolbox's declarations for each prompt's tools
block and a fresh ToolTurn per reply (gptlab.eval.chat.ChatTools).

Not here: the tools (gptlab.tools.base, gptlab.tools.registry), the format (gptlab.chat.format).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gptlab.chat.format import ChatFormat
from gptlab.eval.chat import ChatTools
from gptlab.infer.tool_loop import ToolStep
from gptlab.runtime import GptlabError
from gptlab.tools.base import Toolbox
from gptlab.tools.registry import task_toolbox
from gptlab.tools.results import ToolResult

NOT_HERE = "error: no tool called {name!r} runs here"


@dataclass(frozen=True)
class ToolRun:
    """One call a request made: the tool's name, its arguments as the model wrote them, and its result (None: the
    client runs it)."""

    name: str
    arguments: str
    result: ToolResult | None

    def describe(self) -> str:
        """One line for a person: 'calculator(1234 * 5678) -> 7006652' (a lone argument shown bare)."""
        try:
            values = json.loads(self.arguments)
        except ValueError:
            values = None
        shown = next(iter(values.values())) if isinstance(values, dict) and len(values) == 1 else self.arguments
        shown = shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False)
        result = "(the client runs it)" if self.result is None else self.result.text
        return f"{self.name}({shown}) -> {result}"


class ToolTurn:
    """A request's tool loop over `toolbox` (tools that run here) and `client` (names of tools the client runs).
    `prefix`: ids of the assistant's turn already in the prompt (e.g. <|call|> to require a call);
    `on_run(run)` is called after each call runs (the chat command prints it)."""

    def __init__(self, chat: ChatFormat, toolbox: Toolbox | None = None, *, client: Collection[str] = (),
                 prefix: Sequence[int] = (), on_run: Callable[[ToolRun], None] | None = None) -> None:
        if not chat.supports_tools:
            raise GptlabError("this model's tokenizer lacks the tool tokens (a chat model made before tool use): "
                              "fine-tune it again with `gptlab sft`, which adds them")
        self.chat = chat
        self.budget = toolbox.session() if toolbox is not None else None
        self.client = frozenset(client)
        self.turn = list(prefix)
        self.runs: list[ToolRun] = []
        self.finish: str | None = None  # "tool_calls" once a turn went back to the client
        self.on_run = on_run

    def after(self, token: int) -> ToolStep | None:
        if token != self.chat.end:
            self.turn.append(token)
            return None
        message = self.chat.parse_reply(self.turn)[0]
        self.turn = []
        calls = [(call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls", ())]
        if not calls:
            return None  # the reply's end
        if any(name in self.client for name, _ in calls):
            self.runs += [ToolRun(name, arguments, None) for name, arguments in calls]
            self.finish = "tool_calls"
            return ToolStep(finish="tool_calls")
        results = [self._run(name, arguments) for name, arguments in calls]
        return ToolStep(feed=tuple(self.chat.result_ids([result.text for result in results])))

    def _run(self, name: str, arguments: str) -> ToolResult:
        if self.budget is None:
            result = ToolResult(NOT_HERE.format(name=name), False, 0.0)
        else:
            result = self.budget.run(name, arguments)
        run = ToolRun(name, arguments, result)
        self.runs.append(run)
        if self.on_run is not None:
            self.on_run(run)
        return result


def chat_tools(chat: ChatFormat, toolbox: Toolbox | None) -> ChatTools | None:
    """What gptlab.eval.chat and the RL rollouts answer with: the toolbox's declarations and a fresh ToolTurn per
    reply; None without a toolbox. A model without the tool tokens is refused here, before any compute."""
    if toolbox is None:
        return None
    ToolTurn(chat, toolbox)  # raises for a chat model made before tool use
    return ChatTools(tuple(toolbox.specs()), lambda: ToolTurn(chat, toolbox))


def tasks_own_tools(chat: ChatFormat) -> Callable[[object], ChatTools | None]:
    """For gptlab.eval.chat.task_accuracy_fn: a task that offers tools is answered with them (its own built-ins),
    others without; a model without the tool tokens answers everything without."""
    return lambda task: chat_tools(chat, task_toolbox("auto", task)) if chat.supports_tools else None


def reply_messages(chat: ChatFormat, tokens: Sequence[int], make_id: Callable[[int], str] = lambda k: f"call_{k + 1}") -> list[dict]:
    """A generated reply's messages for the conversation's history (ChatFormat.parse_reply): each call given an id
    (`make_id(k)` for the k-th), each tool result the id of the call it answers."""
    messages, waiting, k = chat.parse_reply(tokens), [], 0
    for message in messages:
        for call in message.get("tool_calls", ()):
            call["id"] = make_id(k)
            waiting.append(call["id"])
            k += 1
        if message["role"] == "tool" and waiting:
            message["tool_call_id"] = waiting.pop(0)
    return messages
