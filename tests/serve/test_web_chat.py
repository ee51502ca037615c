"""The web chat page in a real browser (headless Chromium driven by selenium) against `gptlab serve`:
streamed replies equal the Python API's, the conversation and system prompt are sent, Stop aborts,
server errors are shown, and model output is text, never HTML."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chat import reference as chat_reference
from tests.serve.browser import headless_chromium

pytestmark = pytest.mark.xdist_group("web_chat")  # one worker builds the module fixtures once, not each worker
MAX_TOKENS = 16
ROOT = Path(__file__).resolve().parents[2]


def reference_reply(folder, messages, max_tokens=MAX_TOKENS) -> str:
    return chat_reference.reference_reply(folder, messages, max_tokens)


def start_server(model: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """`gptlab serve MODEL --port 0 OPTIONS` and the page's address, read from the line the server prints when it listens."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "gptlab", "serve", str(model), "--port", "0", "--device", "cpu", *options]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in process.stdout:  # the socket listens before this line is printed: no polling for readiness
        output.append(line)
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if found:
            return process, found.group(0)
    process.wait()
    raise AssertionError("gptlab serve exited before listening:\n" + "".join(output))


def serving(folder, *flags: str):
    """A module fixture's body: `gptlab serve FOLDER FLAGS...` running while the module's tests use its URL."""
    process, url = start_server(folder, *flags)
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(chat_model):
    yield from serving(chat_model)


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium("web chat", "1000,800")


class Page:
    """The chat page as a user sees it: settings, the message box, the buttons, the messages shown."""

    def __init__(self, driver, url: str) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver = driver
        driver.get(url)
        self.wait = WebDriverWait(driver, 30)
        self.wait.until(lambda _: self.find("#model").text not in ("", "connecting…"))

    def find(self, selector):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def find_all(self, selector):
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def settings(self, **fields) -> None:
        """Fill the settings panel: temperature=0, max_tokens=16, system="..."."""
        if not self.find("#settings").get_property("open"):
            self.find("#settings summary").click()
        for name, value in fields.items():
            field = self.find("#" + name.replace("_", "-"))
            field.clear()
            field.send_keys(str(value))

    def send(self, text: str, *, enter: bool = False) -> None:
        from selenium.webdriver.common.keys import Keys

        self.find("#input").send_keys(text + (Keys.ENTER if enter else ""))
        if not enter:
            self.find("#send").click()

    def wait_idle(self) -> None:
        self.wait.until(lambda _: self.find("#composer").get_attribute("aria-busy") == "false")

    def replies(self) -> list[str]:
        """The assistant messages' exact text (textContent: whitespace as sent)."""
        return [item.get_property("textContent") for item in self.find_all("#messages .assistant .content")]

    def stub_fetch(self, script: str) -> None:
        """Replace the page's fetch for /v1/chat/completions by `script`'s Response (arguments url, options)."""
        self.driver.execute_script(
            "const real = window.fetch; window.requests = [];"
            "window.fetch = (url, options) => { window.requests.push(options);"
            "  if (!String(url).endsWith('/v1/chat/completions')) return real(url, options);"
            "  return (async () => { " + script + " })(); };"
        )


SSE_STREAM = """
  const encoder = new TextEncoder();
  const body = new ReadableStream({start(controller) {
    for (const piece of PIECES)
      controller.enqueue(encoder.encode('data: ' + JSON.stringify({choices: [{index: 0, delta: {content: piece}}]}) + '\\n\\n'));
    if (DONE) { controller.enqueue(encoder.encode('data: [DONE]\\n\\n')); controller.close(); }
    else options.signal.addEventListener('abort', () => controller.error(new DOMException('aborted', 'AbortError')));
  }});
  return new Response(body, {headers: {'Content-Type': 'text/event-stream'}});
"""


def sse_stub(pieces: list[str], *, done: bool) -> str:
    return SSE_STREAM.replace("PIECES", json.dumps(pieces)).replace("DONE", "true" if done else "false")


def test_web_chat_streams_the_reference_reply_and_sends_the_conversation(server, browser, chat_model):
    page = Page(browser, server)
    assert page.find("#model").text == str(chat_model)
    page.settings(temperature=0, max_tokens=MAX_TOKENS)
    page.send("Good morrow, sir.")
    page.wait_idle()
    first = reference_reply(chat_model, [{"role": "user", "content": "Good morrow, sir."}])
    assert page.replies() == [first]
    assert int(page.find("#messages .assistant").get_attribute("data-chunks")) > 1  # streamed in pieces

    from selenium.webdriver.common.keys import Keys

    page.find("#input").send_keys("What", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "news?")  # Shift+Enter: a new line
    assert page.find("#input").get_property("value") == "What\nnews?"
    page.send("", enter=True)  # Enter sends
    page.wait_idle()
    history = [{"role": "user", "content": "Good morrow, sir."}, {"role": "assistant", "content": first},
               {"role": "user", "content": "What\nnews?"}]
    assert page.replies() == [first, reference_reply(chat_model, history)]


def test_web_chat_new_chat_forgets_and_the_system_prompt_is_sent(server, browser, chat_model):
    page = Page(browser, server)
    page.settings(temperature=0, max_tokens=MAX_TOKENS)
    page.send("Good morrow, sir.")
    page.wait_idle()
    page.find("#new-chat").click()
    assert page.find_all("#messages li") == []
    page.settings(system="Speak in verse.")
    page.send("What news?")
    page.wait_idle()
    expected = reference_reply(chat_model, [{"role": "system", "content": "Speak in verse."},
                                            {"role": "user", "content": "What news?"}])
    assert page.replies() == [expected]


def test_web_chat_shows_the_servers_error_message(server, browser):
    page = Page(browser, server)
    page.settings(temperature=7)  # the server accepts 0..2
    page.send("What news?")
    page.wait_idle()
    alert = page.find("#messages .error[role=alert]")
    assert "temperature" in alert.text
    assert page.find("#input").get_property("value") == "What news?"  # given back to retry
    assert page.replies() == []


def test_web_chat_shows_model_output_as_text_not_html(server, browser):
    page = Page(browser, server)
    html = ['<b>bold</b> and ', '<img src=x onerror="window.injected = 1">', '<script>window.injected = 2</script>']
    page.stub_fetch(sse_stub(html, done=True))
    page.send("<i>not italic</i>")
    page.wait_idle()
    assert page.replies() == ["".join(html)]
    assert page.find("#messages .user .content").get_property("textContent") == "<i>not italic</i>"
    assert page.find_all("#messages b, #messages img, #messages i, #messages script") == []
    assert browser.execute_script("return window.injected") is None


def test_web_chat_stop_aborts_the_answer_and_keeps_what_arrived(server, browser):
    page = Page(browser, server)
    page.stub_fetch(sse_stub(["Once upon", " a time"], done=False))  # then nothing, until aborted
    page.send("Tell me a long story.")
    page.wait.until(lambda _: page.replies() == ["Once upon a time"])
    assert page.find("#stop").is_displayed() and not page.find("#send").is_enabled()
    page.find("#stop").click()
    page.wait_idle()
    assert "(stopped)" in page.find("#messages .assistant .note").text
    assert page.replies() == ["Once upon a time"] and page.find("#send").is_enabled()


def test_web_chat_keeps_the_api_key_and_sends_it(server, browser):
    page = Page(browser, server)
    page.settings(api_key="sk-test-123")
    page = Page(browser, server)  # a reload: the key comes back from localStorage
    assert page.find("#api-key").get_property("value") == "sk-test-123"
    page.stub_fetch(sse_stub(["ok"], done=True))
    page.send("hello")
    page.wait_idle()
    assert browser.execute_script("return window.requests[0].headers['Authorization']") == "Bearer sk-test-123"
    page.settings(api_key="")
