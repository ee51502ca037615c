"""The HTTP server: OpenAI-compatible endpoints over a continuous-batching engine, and the web chat page.

    GET  /                      the web chat (static/index.html)
    GET  /health                {"status": "ok", "running": 2, "waiting": 0, "prefix_cache": {"hits": 480, ...}}
                                (never needs the API key; prefix_cache: gptlab.infer.prefix_cache's counters, null when off)
    GET  /v1/models             the one model served
    POST /v1/chat/completions   messages -> the assistant's reply (needs a tokenizer with the chat tokens); with
                                tools (the request's, and the server's own toolbox) the reply may hold tool_calls
                                for the client and tool_runs the server made (gptlab.serve.tool_requests, .tool_replies)
    POST /v1/completions        prompt text (or texts, or token ids) -> its continuation
                                (both take best_of: the n best of that many candidates by the server's reward,
                                gptlab.serve.best_of)

A request's `model` must be the id /v1/models lists (or absent): another name is 404 `model_not_found`, as
OpenAI and vLLM answer it, so a client pointed at the wrong server or model hears so instead of being
answered by a model it did not ask for.

Streaming answers are server-sent events, `data: {chunk}\\n\\n` in OpenAI's chunk
format, ending with `data: [DONE]\\n\\n`. Every error is OpenAI's body
`{"error": {"message", "type", "param", "code"}}` with a 4xx status: bad JSON,
wrong types and out-of-range values are 400 (as OpenAI, not FastAPI's 422), a
missing or wrong API key 401, an unknown model 404, a body over the size limit 413. A client that
disconnects mid-stream cancels its generation, which frees its engine slot.

Not here: the pieces of the request bodies (gptlab.serve.protocol), the answers' objects (gptlab.serve.replies), stop
strings (gptlab.serve.stops), the access log (gptlab.serve.access), batching and sampling (gptlab.infer.engine), the
command line and uvicorn (gptlab.cli.serve).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import anyio
from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from gptlab.chat import ChatFormat
from gptlab.infer import Engine, SamplingConfig
from gptlab.infer.best_of import check_best_of
from gptlab.runtime import GptlabError
from gptlab.serve.access import AccessLog, usage_slot
from gptlab.serve.best_of import candidates_wanted, respond_best_of
from gptlab.serve.generation import Generation, sse
from gptlab.serve.limits import BodyLimit
from gptlab.serve.protocol import ChatRequest, CompletionRequest, Sampling
from gptlab.serve.replies import APIError, Reply, until_disconnected
from gptlab.serve.tool_replies import ToolGeneration
from gptlab.serve.tool_requests import ToolOffer, offer_tools, order_tool_results
from gptlab.tokenizer import Tokenizer
from gptlab.tools import Toolbox

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
DEFAULT_MAX_REQUEST_BYTES = 1_000_000
DEFAULT_MAX_TOKENS_LIMIT = 4096


def build_app(
    engine: Engine,
    tokenizer: Tokenizer,
    chat_format: ChatFormat | None,
    model_name: str,
    *,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT,
    static_dir: Path = STATIC,
    access_log: Callable[[str], None] | None = None,
    best_of: int = 1,
    reward: Callable[[object, list[str]], list[float]] | None = None,
    toolbox: Toolbox | None = None,
) -> FastAPI:
    """The FastAPI app serving `engine` (its model) with `tokenizer`; chat needs `chat_format`. `access_log`,
    when given, receives one line per request (gptlab.serve.access). `reward(prompt, texts)` scores candidates
    for best-of-n, `best_of` is the default candidates per request (gptlab.serve.best_of). `toolbox`: tools
    offered to every chat request and run here while the model generates (gptlab.serve.tool_requests)."""
    check_api_key(api_key)
    check_best_of(best_of, "best_of")
    if best_of > 1 and reward is None:
        raise GptlabError(f"best_of={best_of} needs a reward to choose by (--reward SPEC)")
    if toolbox is not None and (chat_format is None or not chat_format.supports_tools):
        raise GptlabError("server tools need a chat model with the tool tokens: fine-tune it with `gptlab sft`, which adds them")
    if toolbox is not None and best_of > 1:
        raise GptlabError("server tools run with plain sampling: leave out --best-of")
    app = FastAPI(title="gptlab", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    if access_log is not None:
        app.add_middleware(AccessLog, write=access_log)  # added last, so outermost: a refused body is logged too
    add_error_handlers(app)
    created = int(time.time())
    block_size = engine.model.config.block_size
    runner = Runner(engine, tokenizer, model_name, max_tokens_limit, best_of=best_of, reward=reward, toolbox=toolbox)

    check_key = key_checker(api_key)

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(404, f"the model {name!r} does not exist: this server serves {model_name!r} (see GET /v1/models)",
                           param="model", code="model_not_found")

    @app.get("/", include_in_schema=False)
    async def index():
        page = static_dir / "index.html"
        if not page.is_file():
            raise APIError(404, f"the web chat page is not installed ({page}); the API is at /v1", code="not_found")
        return FileResponse(page, media_type="text/html")

    @app.get("/health")
    async def health() -> dict:
        prefix = engine.prefix_cache.stats.as_dict() if engine.prefix_cache is not None else None  # hits: prompt tokens reused
        return {"status": "ok", "running": engine.running(), "waiting": engine.waiting(), "prefix_cache": prefix}

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def models() -> dict:
        model = {"id": model_name, "object": "model", "created": created, "owned_by": "gptlab", "max_model_len": block_size}
        return {"object": "list", "data": [model]}

    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def chat_completions(body: ChatRequest, http: Request):
        check_model(body.model)
        chat = chat_format
        if chat is None:
            try:
                chat = ChatFormat(tokenizer)
            except GptlabError as error:
                raise APIError(400, f"{model_name} is not a chat model: {error}; use /v1/completions", param="messages",
                               code="not_a_chat_model") from None
        messages = order_tool_results([message.as_dict() for message in body.messages])
        offer = offer_tools(chat, body, toolbox)
        try:
            prompt = chat.prompt(messages, tools=offer.specs if offer is not None else None)
        except GptlabError as error:
            raise APIError(400, str(error), param="messages") from None
        if offer is None:
            return await runner.respond(body, [prompt], chat.stop_tokens, chat=True, http=http, reward_prompts=[messages])
        return await runner.respond(body, [prompt + list(offer.prefix)], chat.stop_tokens, chat=True, http=http,
                                    tools=(chat, offer))

    @app.post("/v1/completions", dependencies=[Depends(check_key)])
    async def completions(body: CompletionRequest, http: Request):
        check_model(body.model)
        eot, vocab = tokenizer.eot_id, tokenizer.vocab_size  # vocab_size is computed (max id + 1): once, not per prompt token
        prompts = []
        for prompt in body.prompts():
            ids = tokenizer.encode_ordinary(prompt) if isinstance(prompt, str) else prompt
            if not ids:
                if eot is None:
                    raise APIError(400, "the prompt is empty and the tokenizer has no end-of-text token to start from", param="prompt")
                ids = [eot]
            bad = [token for token in ids if not 0 <= token < vocab]
            if bad:
                raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt")
            prompts.append(ids)
        texts = [prompt if isinstance(prompt, str) else tokenizer.decode(prompt) for prompt in body.prompts()]
        return await runner.respond(body, prompts, () if eot is None else (eot,), chat=False, http=http, reward_prompts=texts)

    return app


def key_checker(api_key: str | None, hint: str = ""):
    """A FastAPI dependency refusing (401) a request without `Authorization: Bearer API_KEY`; none when no key is set."""

    def check_key(authorization: str | None = Header(default=None)) -> None:
        if api_key is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise APIError(401, f"missing or wrong API key: send the header `Authorization: Bearer KEY`{hint}", code="invalid_api_key")

    return check_key


def check_api_key(api_key: str | None) -> None:
    """None serves without a key; an empty key (an unset $KEY) would let an empty bearer token in."""
    if api_key is None:
        return
    if not api_key.strip():
        raise GptlabError("--api-key is empty (an unset $VARIABLE?): pass a non-empty key, or leave --api-key out to serve "
                          "without one")
    if api_key != api_key.strip():
        raise GptlabError("--api-key has spaces around it, which no client can send in `Authorization: Bearer KEY`; "
                          "pass the key without them")


class Runner:
    """Turns a validated request into engine requests, and their tokens into OpenAI's response or chunks."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, model_name: str, max_tokens_limit: int, *, best_of: int = 1,
                 reward: Callable | None = None, toolbox: Toolbox | None = None) -> None:
        self.engine, self.tokenizer, self.model_name, self.limit = engine, tokenizer, model_name, max_tokens_limit
        self.best_of, self.reward = best_of, reward  # best-of-n: default candidates, and the reward that picks
        self.toolbox = toolbox  # the server's tools (gptlab serve --tools)

    def configs(self, body: Sampling, prompt: list[int], stop_tokens: tuple[int, ...]) -> list[SamplingConfig]:
        block = self.engine.model.config.block_size
        if body.max_tokens is not None and body.max_tokens > self.limit:
            raise APIError(400, f"max_tokens={body.max_tokens} is over this server's limit of {self.limit}", param="max_tokens")
        room = block - len(prompt)
        if room < 1:
            raise APIError(400, f"the prompt is {len(prompt)} tokens, which fills the model's context ({block})",
                           param="messages", code="context_length_exceeded")
        new = body.max_tokens if body.max_tokens is not None else min(self.limit, room)
        if new > room:
            raise APIError(400, f"the prompt ({len(prompt)} tokens) + max_tokens ({new}) = {len(prompt) + new} is more than the "
                           f"model's context ({block}); use max_tokens <= {room}", param="max_tokens", code="context_length_exceeded")
        stops = () if body.ignore_eos else stop_tokens
        return [
            SamplingConfig(max_new_tokens=new, temperature=body.temperature, top_k=body.top_k,
                           top_p=None if body.top_p >= 1 else body.top_p, stop_tokens=stops,
                           seed=None if body.seed is None else body.seed + i, vocab_size=self.tokenizer.vocab_size)
            for i in range(body.n)
        ]

    async def respond(self, body: Sampling, prompts: list[list[int]], stop_tokens: tuple[int, ...], *, chat: bool,
                      http: Request | None = None, reward_prompts: list | None = None,
                      tools: tuple[ChatFormat, ToolOffer] | None = None):
        """`tools`: a chat request's format and ToolOffer; each choice then runs its own tool loop."""
        if tools is not None and body.best_of not in (None, 1):
            raise APIError(400, "best_of does not run with tools; leave it out of a request that offers tools", param="best_of")
        if tools is None and (body.best_of is not None or self.best_of > 1):
            count = candidates_wanted(body, self.best_of, self.reward)
            if count > 1:
                return await respond_best_of(self, body, prompts, reward_prompts or [], stop_tokens, count, self.reward,
                                             chat=chat, http=http)
        configs = [(prompt, config) for prompt in prompts for config in self.configs(body, prompt, stop_tokens)]
        generations: list[Generation] = []
        try:
            for prompt, config in configs:
                generations.append(self.start(prompt, config, body, chat, tools))
        except GptlabError as error:
            for generation in generations:
                generation.cancel()
            raise APIError(400, str(error)) from None
        reply = Reply(chat, self.model_name, sum(len(prompt) for prompt in prompts))
        if http is not None and (slot := usage_slot(http.scope)) is not None:
            slot["usage"] = lambda: reply.usage(generations)  # read when the response has ended: a stream's tokens too
        if body.stream:
            return EventStream(stream_events(reply, generations, body.include_usage()), generations)
        try:
            texts = await until_disconnected(asyncio.gather(*(generation.text() for generation in generations)), http)
        finally:
            for generation in generations:
                generation.cancel()
        if texts is None:  # the client left: its slots are free (above); nobody reads an answer
            return Response(status_code=499)
        if any(generation.finish_reason == "error" for generation in generations):
            raise APIError(500, "generation failed on the server", type="server_error")
        return reply.whole(texts, generations)


    def start(self, prompt: list[int], config: SamplingConfig, body: Sampling, chat: bool,
              tools: tuple[ChatFormat, ToolOffer] | None) -> Generation:
        """One choice submitted to the engine: a plain Generation, or with `tools` its own ToolTurn."""
        loop = asyncio.get_running_loop()
        if tools is None:
            request = self.engine.submit(prompt, config, loop=loop)
            return Generation(self.engine, request, self.tokenizer, body.stop_strings(), context=() if chat else prompt)
        chat_format, offer = tools
        turn = offer.turn(chat_format, self.toolbox)
        config = replace(config, suppress_tokens=offer.suppress)
        request = self.engine.submit(prompt, config, loop=loop, tools=turn)
        return ToolGeneration(self.engine, request, chat_format, body.stop_strings(), turn, offer.prefix)


async def stream_events(reply: Reply, generations: list[Generation], include_usage: bool) -> AsyncIterator[str]:
    """Chunks of every choice as their text arrives (choices interleaved), then usage if asked, then [DONE]."""
    events: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        async for text in generation.deltas():
            await events.put((index, text, None))
        await events.put((index, None, generation.finish_reason))

    def with_usage(chunk: dict) -> dict:
        return {**chunk, "usage": None} if include_usage else chunk

    tasks = [asyncio.create_task(pump(index, generation)) for index, generation in enumerate(generations)]
    try:
        if reply.chat:
            for index in range(len(generations)):
                yield sse(with_usage(reply.chunk(index, None, None, role=True)))
        remaining = len(generations)
        while remaining:
            index, text, finish_reason = await events.get()
            remaining -= finish_reason is not None
            yield sse(with_usage(reply.chunk(index, text, finish_reason)))
        if include_usage:
            yield sse(reply.usage_chunk(generations))
        yield "data: [DONE]\n\n"
    finally:
        for task in tasks:
            task.cancel()
        for generation in generations:
            generation.cancel()


class EventStream(StreamingResponse):
    """Server-sent events that cancel their generations when the stream ends, however it ends.

    Listens for the client's disconnect while streaming (whatever ASGI version the server speaks),
    so a client that goes away frees its slots even between tokens.
    """

    def __init__(self, content: AsyncIterator[str], generations: list[Generation]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.generations = generations

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away while we wrote
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            for generation in self.generations:
                generation.cancel()


def add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body; validation errors as 400, never a traceback to the client."""

    @app.exception_handler(APIError)
    async def api_error(request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request, error: RequestValidationError) -> JSONResponse:
        return validation_error(error.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException) -> JSONResponse:
        kind = "not_found" if error.status_code == 404 else None
        return APIError(error.status_code, str(error.detail), code=kind).response()

    @app.exception_handler(Exception)
    async def unexpected(request, error: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s", request.url.path)
        return APIError(500, "internal server error", type="server_error").response()


def validation_error(errors) -> APIError:
    """The first of pydantic's errors, said plainly: which field, what is wrong."""
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}")
    if first.get("type") == "missing" and param is None:
        return APIError(400, "the request needs a JSON body")
    message = first.get("msg", "invalid value")
    return APIError(400, f"{param}: {message}" if param else message, param=param)
