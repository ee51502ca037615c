"""`gptlab tokenizer view` and /tokenizer/ inside `gptlab serve`, run as a user runs them: the default list, one-line
errors before any server starts (a bad tokenizer, a port in use), Ctrl-C ending it cleanly."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys

from gptlab.cli.main import main
from gptlab.serve.token_view import DEFAULT_NAMES
from gptlab.tokenizer.pretrained import available_offline
from tests.conftest import with_ctrl_c
from tests.plain_install import plain_environment


def start(*args: str) -> tuple[subprocess.Popen, str, int]:
    """A `gptlab ...` child, seeing only the plain install, and the host and port it prints once it listens."""
    env = plain_environment(dict(os.environ))  # the default tokenizers' files come with the plain install
    child = subprocess.Popen([sys.executable, "-m", "gptlab.cli.main", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, preexec_fn=with_ctrl_c)
    lines = []
    while True:
        line = child.stderr.readline()
        assert line, f"exited before listening: {''.join(lines)}"
        lines.append(line)
        found = re.search(r"http://([\d.]+):(\d+)/tokenizer/", line)
        if found:
            return child, found.group(1), int(found.group(2))


def request(host: str, port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(host, port, timeout=60)
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def ctrl_c(child: subprocess.Popen) -> str:
    child.send_signal(signal.SIGINT)
    try:
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode in (0, 130) and "Traceback" not in stderr, stderr
    return stderr


def test_tokenizer_view_serves_the_default_tokenizers_on_loopback_and_stops_on_ctrl_c():
    child, host, port = start("tokenizer", "view", "--port", "0")
    try:
        assert host == "127.0.0.1"
        status, body = request(host, port, "GET", "/tokenizer/api/tokenizers")
        assert status == 200 and body["tokenizers"] == [name for name in DEFAULT_NAMES if available_offline(name)]
        assert body["tokenizers"][:2] == ["gpt2", "cl100k_base"]
        status, body = request(host, port, "POST", "/tokenizer/api/encode", {"text": "Hello world", "tokenizers": ["cl100k_base"]})
        assert status == 200 and body["results"][0]["ids"] == [9906, 1917]  # tiktoken's cl100k_base ids
    finally:
        ctrl_c(child)


def test_tokenizer_view_refuses_a_bad_tokenizer_in_one_line_before_serving(capsys, tmp_path):
    assert main(["tokenizer", "view", "gpt2", str(tmp_path / "nothing-here"), "--port", "0"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("gptlab: error: no tokenizer at") and "nothing-here" in error
    assert "open http" not in error and list(tmp_path.iterdir()) == []


def test_tokenizer_view_says_in_one_line_that_the_port_is_taken(capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        assert main(["tokenizer", "view", "gpt2", "--port", str(port)]) == 1
    finally:
        taken.close()
    error = capsys.readouterr().err
    assert error == f"gptlab: error: port {port} on 127.0.0.1 is already in use; pick another with --port\n"


def test_serve_shows_the_token_viewer_with_the_models_tokenizer_first_and_a_larger_body_limit(chat_model):
    child, host, port = start("serve", str(chat_model), "--port", "0", "--device", "cpu", "--name", "tiny-chat",
                              "--max-request-bytes", "10000")
    try:
        status, body = request(host, port, "GET", "/tokenizer/api/tokenizers")
        assert status == 200 and body["tokenizers"][0] == "tiny-chat"
        text = "user: Good morrow.\nassistant: " + "Well met. " * 2000  # 20 kB: over the API's limit, not the viewer's
        status, body = request(host, port, "POST", "/tokenizer/api/encode", {"text": text, "tokenizers": ["tiny-chat"], "mode": "chat"})
        assert status == 200 and body["results"][0]["note"] is None  # the model's tokenizer has the chat tokens
        status, _ = request(host, port, "GET", "/health")
        assert status == 200
    finally:
        ctrl_c(child)
