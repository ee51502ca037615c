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

    async def deltas(self) -> AsyncIterator[str]:
        """Text pieces as they become safe to send; sets finish_reason at the end."""
        try:
            async for token in self.request:
                self.completion_tokens += 1
                text = self.matcher.push(self.text_stream.add(token))
                if text:
                    yield text
                if self.matcher.stopped:
                    self.finish_reason = "stop"
                    return
            tail = self.matcher.push(self.text_stream.flush())
            tail += self.matcher.flush()
            if tail:
                yield tail
            reason = self.request.finish_reason
            self.finish_reason = "stop" if self.matcher.stopped else ("error" if reason in ("error", "cancelled") else reason)
        finally:
            self.cancel()

    async def text(self) -> str:
        return "".join([piece async for piece in self.deltas()])

    def cancel(self) -> None:
        """Free the engine slot if the request still runs (a stop string, a client gone)."""
        if self.request.finish_reason is None and not self.request.cancel_requested:
            self.engine.cancel(self.request)
