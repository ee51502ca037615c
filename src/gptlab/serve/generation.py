"""One choice of a response: an engine request's tokens as text, cut at stop strings, with its finish reason.

    tokens -> TextStream (whole characters) -> StopMatcher (hold back a possible stop prefix) -> text deltas

finish_reason is OpenAI's: "stop" (a stop token or stop string) or "length"
(max_tokens reached); "error" only if the engine failed. completion_tokens
counts the tokens the model produced for the text, the stop token excluded.

Not here: the HTTP response (gptlab.serve.app), the engine (gptlab.infer.engine).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

from gptlab.chat.text import TextStream
from gptlab.infer import Engine, Request
from gptlab.serve.stops import StopMatcher
from gptlab.tokenizer import Tokenizer

Delta = str | dict  # a text piece, or a chunk delta's other fields ({"tool_calls": [...]})


def sse(payload: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Generation:
    def __init__(self, engine: Engine, request: Request, tokenizer: Tokenizer, stops: list[str], context: Sequence[int] = ()) -> None:
        """`context`: ids the text continues (a completion's prompt), read first so that a SentencePiece
        continuation keeps its leading space, as decode(prompt + tokens) does; a chat reply starts a text."""
        self.engine, self.request = engine, request
        self.text_stream = TextStream(tokenizer)
        for token in context:
            self.text_stream.add(token)
        self.matcher = StopMatcher(stops)
        self.finish_reason: str | None = None
        self.completion_tokens = 0

    def read(self, token: int) -> list[Delta]:
        """What one token adds: text, or a delta's other fields (gptlab.serve.tool_replies)."""
        return [self.text_stream.add(token)]

    def read_end(self) -> list[Delta]:
        """What is left when the request has finished (its finish_reason is set)."""
        return [self.text_stream.flush()]

    def message(self, text: str) -> dict:
        """The whole reply's message, given its text."""
        return {"role": "assistant", "content": text}

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text pieces (str) as they become safe to send, and other delta fields (dict); sets finish_reason at the end."""
        try:
            async for token in self.request:
                self.completion_tokens += 1
                for delta in self.read(token):
                    delta = self.matcher.push(delta) if isinstance(delta, str) else delta
                    if delta:
                        yield delta
                    if self.matcher.stopped:
                        self.finish_reason = "stop"
                        return
            end = self.read_end()
            tail = "".join(self.matcher.push(delta) for delta in end if isinstance(delta, str)) + self.matcher.flush()
            for delta in [tail, *(delta for delta in end if not isinstance(delta, str))]:
                if delta:
                    yield delta
            reason = self.request.finish_reason
            self.finish_reason = "stop" if self.matcher.stopped else ("error" if reason in ("error", "cancelled") else reason)
        finally:
            self.cancel()

    async def text(self) -> str:
        return "".join([piece async for piece in self.deltas() if isinstance(piece, str)])

    def cancel(self) -> None:
        """Free the engine slot if the request still runs (a stop string, a client gone)."""
        if self.request.finish_reason is None and not self.request.cancel_requested:
            self.engine.cancel(self.request)
