"""A live server on a free port, in a thread: the chat model behind the real uvicorn, for the official openai client."""

import http.client
import json
import socket
import threading

import pytest
import uvicorn

from gptlab.chat import ChatFormat
from gptlab.infer import Engine, EngineConfig
from gptlab.model.hf import load_pretrained_directory
from gptlab.serve.app import build_app
from gptlab.tokenizer import Tokenizer

MAX_TOKENS_LIMIT = 200
MAX_REQUEST_BYTES = 20_000


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1:<free port>. The socket listens before the thread starts,
    so a client may connect at once (the connection waits in the backlog): no polling for readiness."""

    def __init__(self, app, engine: Engine) -> None:
        self.engine = engine
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    def request(self, method: str, path: str, body: bytes | str | dict | None = None, headers: dict | None = None):
        """(status, parsed JSON body) of one raw HTTP request."""
        if isinstance(body, dict):
            body = json.dumps(body)
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        return response.status, json.loads(data) if data else None

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.close()
        self.sock.close()


class Hold:
    """An engine on_step hook: while `active`, the engine waits after each step until some running request
    has been cancelled, so a test can disconnect before the request could finish on its own."""

    def __init__(self) -> None:
        self.active = False
        self.holding = threading.Event()  # set once the engine waits: a request is running

    def __call__(self, engine: Engine) -> None:
        if not self.active:
            return
        self.holding.set()
        with engine._condition:  # the engine's own lock: cancel() notifies it
            engine._condition.wait_for(
                lambda: any(slot is not None and slot.request.cancel_requested for slot in engine._slots), timeout=30
            )


@pytest.fixture(scope="session")
def served(chat_model):
    """(model, tokenizer, chat format) of the chat model folder."""
    model = load_pretrained_directory(chat_model).eval()
    tokenizer = Tokenizer.load(chat_model / "tokenizer")
    return model, tokenizer, ChatFormat(tokenizer)


def start_server(served, *, slots: int = 4, on_step=None, chat: bool = True, **options) -> LiveServer:
    model, tokenizer, chat_format = served
    engine = Engine(model, EngineConfig(slots=slots), on_step=on_step)
    options = {"max_tokens_limit": MAX_TOKENS_LIMIT, "max_request_bytes": MAX_REQUEST_BYTES, **options}
    app = build_app(engine, tokenizer, chat_format if chat else None, "tiny-chat", **options)
    return LiveServer(app, engine)


@pytest.fixture(scope="module")
def hold():
    return Hold()


@pytest.fixture(scope="module")
def server(served, hold):
    live = start_server(served, on_step=hold)
    yield live
    live.stop()
