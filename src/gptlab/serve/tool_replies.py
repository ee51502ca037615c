"""A reply with tools, read token by token into OpenAI's deltas: the words as content, the calls the client runs as
`tool_calls`, the calls the server ran as `tool_runs` (an extension), never the format's raw call syntax.

    tokens   <|call|>lookup {"city": "Oslo"}            (lookup: a tool of the request; the reply ends here)
    deltas   {"tool_calls": [{"index": 0, "id": "call_…", "type": "function", "function": {"name": "lookup", "arguments": ""}}]}
             {"tool_calls": [{"index": 0, "function": {"arguments": "{\\"city\\": "}}]}   ... the arguments in pieces
    tokens   <|call|>calculator {"expression": "6*7"}<|end|><|tool|>42<|end|><|assistant|>6*7 = 42
    deltas   {"tool_runs": [{"name": "calculator", "arguments": "{\\"expression\\": \\"6*7\\"}", "result": "42"}]}
             "6*7 = 42"

A call is streamed once its name is written (the text up to the first space) and names a tool of the client; a call
to any other name waits: the server runs it (its ToolRun, read from the request's ToolTurn, is reported when the
turn's <|end|> comes), unless the same turn also calls a client's tool, when the whole turn goes to the client and
the waiting calls are sent at the end. Names and arguments come out exactly as ChatFormat.parse_reply reads them
(stripped; no arguments is "{}"), so the streamed calls add up to the whole reply's.

Not here: what the request offers (gptlab.serve.tool_requests), running tools (gptlab.tools.turn).
"""

from __future__ import annotations

import uuid

from gptlab.chat import ChatFormat
from gptlab.chat.text import TextStream
from gptlab.infer import Engine, Request
from gptlab.serve.generation import Delta, Generation
from gptlab.tools.turn import ToolTurn


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ReplyReader:
    """Tokens of one reply (after the prompt and the turn's prefix) in, deltas out (module docstring)."""

    def __init__(self, chat: ChatFormat, turn: ToolTurn, prefix: tuple[int, ...] = ()) -> None:
        self.chat, self.turn = chat, turn
        self.text = TextStream(chat.tokenizer)
        self.state = "content"  # "content", "call" (after <|call|>), "fed" (the tools' results, up to <|assistant|>)
        self.call_stream, self.call_text = TextStream(chat.tokenizer), ""
        self.open: dict | None = None  # the client's call being streamed: its entry in `calls`
        self.sent = 0  # characters of the open call's arguments sent
        self.waiting: list[tuple[str, str]] = []  # (name, arguments) of this turn's calls not sent
        self.calls: list[dict] = []  # the tool_calls sent so far, whole
        self.runs: list[dict] = []  # the calls the server ran, with their results
        self.reported = 0  # the turn's runs already in `runs`
        for token in prefix:
            self.add(token)  # a prefix ends inside a call's name: nothing to send yet

    def add(self, token: int) -> list[Delta]:
        if self.state == "fed":
            if token == self.chat.role_ids["assistant"]:
                self.state, self.text = "content", TextStream(self.chat.tokenizer)  # a new message's text
            return []
        if token == self.chat.call:
            deltas = self._close_call() if self.state == "call" else [self.text.flush()]
            self.state, self.call_stream, self.call_text, self.open, self.sent = "call", TextStream(self.chat.tokenizer), "", None, 0
            return deltas
        if self.state == "content":
            return [self.text.add(token)]
        if token == self.chat.end:  # the turn's calls ran here (a turn for the client ends the request before its end)
            deltas = [*self._close_call(), *self._new_runs()]
            self.state = "fed"
            return deltas
        self.call_text += self.call_stream.add(token)
        return self._progress()

    def end(self, reason: str | None) -> list[Delta]:
        """What is left when the request finished with `reason`: a turn that went to the client sends its waiting calls."""
        deltas = [self.text.flush()] if self.state == "content" else self._close_call() if self.state == "call" else []
        if reason == "tool_calls":
            deltas += [self._send(name, arguments) for name, arguments in self.waiting]
            self.reported = len(self.turn.runs)  # the turn recorded the client's calls as runs without results
        self.waiting = []
        return deltas

    def _progress(self) -> list[Delta]:
        """Deltas of the open call's text so far: its opening once the name is written, then its new arguments."""
        name, space, rest = self.call_text.lstrip().partition(" ")
        if not space:
            return []
        deltas = []
        if self.open is None:
            if name not in self.turn.client:
                return []
            deltas.append(self._send(name, ""))
            self.open = self.calls[-1]
        arguments = rest.strip()  # trailing spaces wait: the last of them are stripped, as parse_reply does
        if len(arguments) > self.sent:
            deltas.append(self._more(arguments[self.sent :]))
        return deltas

    def _close_call(self) -> list[Delta]:
        """The call's end: the rest of an open call's arguments; any other call waits (module docstring)."""
        self.call_text += self.call_stream.flush()
        name, _, rest = self.call_text.strip().partition(" ")
        arguments = rest.strip() or "{}"
        self.state = "content"
        if self.open is not None:
            return [self._more(arguments[self.sent :])] if len(arguments) > self.sent else []
        if name in self.turn.client:
            return [self._send(name, arguments)]
        self.waiting.append((name, arguments))
        return []

    def _send(self, name: str, arguments: str) -> dict:
        call = {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
        self.calls.append(call)
        self.sent = len(arguments)
        return {"tool_calls": [{"index": len(self.calls) - 1, **call, "function": dict(call["function"])}]}

    def _more(self, piece: str) -> dict:
        self.open["function"]["arguments"] += piece
        self.sent += len(piece)
        return {"tool_calls": [{"index": self.calls.index(self.open), "function": {"arguments": piece}}]}

    def _new_runs(self) -> list[Delta]:
        runs = [{"name": run.name, "arguments": run.arguments, "result": run.result.text}
                for run in self.turn.runs[self.reported :] if run.result is not None]
        self.reported, self.waiting = len(self.turn.runs), []
        self.runs += runs
        return [{"tool_runs": runs}] if runs else []


class ToolGeneration(Generation):
    """A chat choice with tools: its deltas and its whole message hold tool_calls and tool_runs."""

    def __init__(self, engine: Engine, request: Request, chat: ChatFormat, stops: list[str], turn: ToolTurn,
                 prefix: tuple[int, ...] = ()) -> None:
        super().__init__(engine, request, chat.tokenizer, stops)
        self.reader = ReplyReader(chat, turn, prefix)

    def read(self, token: int) -> list[Delta]:
        return self.reader.add(token)

    def read_end(self) -> list[Delta]:
        return self.reader.end(self.request.finish_reason)

    def message(self, text: str) -> dict:
        """content None when the reply only calls tools (as OpenAI sends it), the calls, and what the server ran."""
        calls, runs = self.reader.calls, self.reader.runs
        message: dict = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = calls
        if runs:
            message["tool_runs"] = runs
        return message
