"""OpenAI's answers, shared by the plain and the best-of-n paths: the error body (APIError), the response objects
whole or chunk by chunk (Reply), and waiting on work only while the client is connected (until_disconnected).

Not here: the endpoints and the runner that fills these (gptlab.serve.app), best-of-n (gptlab.serve.best_of).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse

from gptlab.serve.generation import Generation


class APIError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(body, status_code=self.status, headers=headers)


async def until_disconnected(work, http: Request | None):
    """The result of `work`, or None as soon as the client disconnects (the body is read: the next ASGI
    message can only be http.disconnect). Without this a non-streaming request runs on to max_tokens."""
    task = asyncio.ensure_future(work)
    if http is None:
        return await task
    watch = asyncio.ensure_future(_disconnect(http))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return None


async def _disconnect(http: Request) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


class Reply:
    """OpenAI's response objects for one request: whole, or chunk by chunk."""

    def __init__(self, chat: bool, model_name: str, prompt_tokens: int) -> None:
        self.chat, self.model_name, self.prompt_tokens = chat, model_name, prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def usage(self, generations: list[Generation]) -> dict:
        completion = sum(generation.completion_tokens for generation in generations)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion, "total_tokens": self.prompt_tokens + completion}

    def _object(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_name, "choices": choices}

    def whole(self, texts: list[str], generations: list[Generation]) -> dict:
        choices = []
        for index, (text, generation) in enumerate(zip(texts, generations)):
            choice = {"index": index, "finish_reason": generation.finish_reason, "logprobs": None}
            if self.chat:
                choice["message"] = generation.message(text)
            else:
                choice["text"] = text
            choices.append(choice)
        body = self._object("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = self.usage(generations)
        return body

    def chunk(self, index: int, text: str | dict | None, finish_reason: str | None, *, role: bool = False) -> dict:
        """One choice's chunk: `text` a piece of content, or (chat) a delta's other fields, e.g. {"tool_calls": [...]}."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            delta = text if isinstance(text, dict) else delta
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._object("chat.completion.chunk", [choice])
        return self._object("text_completion", [{"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}])

    def usage_chunk(self, generations: list[Generation]) -> dict:
        body = self._object("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = self.usage(generations)
        return body
