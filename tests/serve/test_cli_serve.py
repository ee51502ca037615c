"""`gptlab serve` as a user runs it: a child process on 127.0.0.1, /health, Ctrl-C, a port in use."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys

from tests.conftest import with_ctrl_c

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def serve(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    return subprocess.Popen([sys.executable, "-m", "gptlab.cli.main", "serve", *args, "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=with_ctrl_c)


def health_then_ctrl_c(*args: str) -> str:
    """Start `gptlab serve`, GET /health once, Ctrl-C: its stderr after the banner."""
    child = serve(*args)
    try:
        lines = []
        while not (lines and lines[-1].lstrip().startswith("API")):  # the banner is printed once the port is bound
            line = child.stderr.readline()
            assert line, f"server exited: {''.join(lines)}"
            lines.append(line)
        host, port = re.search(r"http://([\d.]+):(\d+)/v1", lines[-1]).groups()
        assert host == "127.0.0.1"
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("GET", "/health")
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        connection.close()
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode in (0, 130)
    assert "Traceback" not in stderr
    return stderr


def test_serve_binds_loopback_answers_health_logs_it_and_exits_on_ctrl_c(chat_model):
    stderr = health_then_ctrl_c(str(chat_model), "--port", "0", "--slots", "2")
    assert re.search(r'^127\.0\.0\.1:\d+ "GET /health" 200 \d+\.\d{3}s$', stderr, re.MULTILINE), stderr  # the access log


def test_serve_no_access_log_logs_no_requests(chat_model):
    stderr = health_then_ctrl_c(str(chat_model), "--port", "0", "--slots", "1", "--no-access-log")
    assert "/health" not in stderr


def test_serve_refuses_an_empty_api_key_before_loading_anything(chat_model):
    child = serve(str(chat_model), "--port", "0", "--api-key", "")  # what `--api-key "$KEY"` passes when KEY is unset
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 1
    assert stderr.strip().splitlines() == ["gptlab: error: --api-key is empty (an unset $VARIABLE?): pass a non-empty key, "
                                           "or leave --api-key out to serve without one"]


def test_serve_on_a_port_in_use_is_one_error_line(chat_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        child = serve(str(chat_model), "--port", str(port))
        _, stderr = child.communicate(timeout=120)
    assert child.returncode == 1
    assert stderr.strip().splitlines() == [f"gptlab: error: port {port} on 127.0.0.1 is already in use; pick another with --port"]
