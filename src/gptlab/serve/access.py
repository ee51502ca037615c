"""The access log as ASGI middleware: one line per request once its response has ended, as uvicorn and
llama-server print them, so a user sees who asked what and how long it took:

    127.0.0.1:53412 "POST /v1/chat/completions" 200 1.284s tokens 18+64
    127.0.0.1:53418 "GET /v1/models" 401 0.001s

client, "method path", status, seconds from the request's arrival to its response's last byte (a stream's whole
length), then prompt+completion tokens where the request generated. A status of 499 means the client left before
any answer was sent (nginx's code); 500, that the app raised. Handlers report tokens through `usage_slot`.
Not here: the app and its errors (gptlab.serve.app), the command's flag (gptlab.cli.serve).
"""

from __future__ import annotations

import time
from collections.abc import Callable

SLOT = "gptlab.access"  # the scope key of the dict a handler fills in: {"usage": a callable returning OpenAI's usage}


class AccessLog:
    def __init__(self, app, write: Callable[[str], None]) -> None:
        self.app, self.write = app, write

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, slot = time.perf_counter(), None, {}
        scope[SLOT] = slot

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        failed = True
        try:
            await self.app(scope, receive, sending)
            failed = False
        finally:  # however it ended: a stream the client left, an error, a cancelled task
            self.write(access_line(scope, status if status is not None else 500 if failed else 499,
                                   time.perf_counter() - start, slot))


def access_line(scope, status: int, seconds: float, slot: dict) -> str:
    """One request as the log shows it (see the module's docstring)."""
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    target = scope.get("raw_path") or scope.get("path", "").encode()  # as sent: still %-encoded, so one line
    query = scope.get("query_string", b"")
    if query:
        target += b"?" + query
    line = f'{who} "{_printable(scope.get("method", "?"))} {_printable(target.decode("latin-1"))}" {status} {seconds:.3f}s'
    usage = slot.get("usage")
    if usage is not None:
        counts = usage()
        line += f" tokens {counts['prompt_tokens']}+{counts['completion_tokens']}"
    return line


def _printable(text: str) -> str:
    """Control characters escaped (\\n, \\x1b): a request cannot write lines or terminal codes into the log."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


def usage_slot(scope) -> dict | None:
    """The access log's slot of this request (None when the app runs without the log)."""
    return scope.get(SLOT)
