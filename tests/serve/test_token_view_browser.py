"""The token viewer in a real browser (headless Chromium driven by selenium) against `gptlab tokenizer view`:
typing redraws the tokens with the counts `encode` gives, the link restores the text and tokenizers, text is never
HTML, chat mode shows special tokens as badges, and a 1 MB paste is counted exactly while only a few chunks are drawn."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer.pretrained import load_any
from tests.serve.browser import headless_chromium

pytestmark = pytest.mark.xdist_group("token_view_browser")  # one worker builds the module fixtures once, not each worker
ROOT = Path(__file__).resolve().parents[2]
TRAINING_TEXT = "The quick brown fox jumps over the lazy dog.\nNo, the dog was not lazy; it slept.\n" * 30
PARAGRAPH = "First Citizen:\nBefore we proceed any further, hear me speak. ünïcödé 世界 😀\tend\n\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    Tokenizer.train([TRAINING_TEXT], vocab_size=300).save(folder)
    return folder


@pytest.fixture(scope="module")
def server(trained):
    """`gptlab tokenizer view gpt2 TRAINED --port 0` and the page's address, read from the line it prints once listening."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "gptlab", "tokenizer", "view", "gpt2", str(trained), "--port", "0"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in process.stdout:
        output.append(line)
        found = re.search(r"http://127\.0\.0\.1:\d+/tokenizer/", line)
        if found:
            break
    else:
        process.wait()
        raise AssertionError("gptlab tokenizer view exited before listening:\n" + "".join(output))
    yield found.group(0)
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium("token viewer", "1200,900")


@pytest.fixture(scope="module")
def tokenizers(trained):
    return {"gpt2": load_any("gpt2"), str(trained): load_any(trained)}


class Page:
    """The viewer as a user sees it: the text box, the choices, one panel per tokenizer."""

    def __init__(self, driver, url: str) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver = driver
        driver.get("about:blank")  # a fresh page even when only the fragment differs
        driver.get(url)
        self.wait = WebDriverWait(driver, 120)
        self.wait_drawn(len(self.find("#input").get_property("value")))

    def find(self, selector):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def find_all(self, selector, within=None):
        from selenium.webdriver.common.by import By

        return (within or self.driver).find_elements(By.CSS_SELECTOR, selector)

    def wait_drawn(self, text_length: int) -> None:
        """Until the panels show the answer for text of this length (no request pending)."""
        panels = self.find("#panels")
        self.wait.until(lambda _: panels.get_attribute("aria-busy") == "false"
                        and panels.get_attribute("data-text-length") == str(text_length))

    def paste(self, text: str) -> None:
        """Set the box's text as a paste does (one input event); send_keys cannot type emoji or a megabyte."""
        self.driver.execute_script(
            "const box = document.querySelector('#input'); box.value = arguments[0];"
            "box.dispatchEvent(new Event('input', {bubbles: true}));", text)
        self.wait_drawn(len(text))

    def panel(self, name: str):
        return next(panel for panel in self.find_all("#panels .panel") if panel.get_attribute("data-name") == name)

    def counts(self, name: str) -> dict[str, int]:
        panel = self.panel(name)
        return {key: int(self.find_all(f".count-{key}", panel)[0].text.replace(",", "")) for key in ("tokens", "bytes", "characters")}

    def ids(self, name: str) -> list[int]:
        return [int(span.get_attribute("data-id")) for span in self.find_all(".tok", self.panel(name))]

    def names(self) -> list[str]:
        return [panel.get_attribute("data-name") for panel in self.find_all("#panels .panel")]


def expected_counts(tokenizer, text: str) -> dict[str, int]:
    return {"tokens": len(tokenizer.encode(text, allowed_special="all")), "bytes": len(text.encode()), "characters": len(text)}


def test_view_typing_updates_the_tokens_and_counts_equal_encode(server, browser, tokenizers):
    page = Page(browser, server)
    assert page.names() == list(tokenizers)  # every tokenizer the server has, side by side
    page.find("#input").send_keys("Hello, world!  The dog sleeps.")
    text = "Hello, world!  The dog sleeps."
    page.wait_drawn(len(text))
    for name, tokenizer in tokenizers.items():
        assert page.counts(name) == expected_counts(tokenizer, text)
        assert page.ids(name) == tokenizer.encode(text)  # a short text: every token drawn, in order
    gpt2 = page.panel("gpt2")
    assert float(page.find_all(".bytes-per-token", gpt2)[0].text) == pytest.approx(len(text) / len(tokenizers["gpt2"].encode(text)), abs=0.01)
    page.find("#show-ids").click()  # redraws the panels at once, from the answer already here
    assert [span.text for span in page.find_all(".tok", page.panel("gpt2"))] == [str(i) for i in tokenizers["gpt2"].encode(text)]


def test_view_link_restores_the_text_mode_and_tokenizers_and_marks_whitespace_and_bytes(server, browser, tokenizers, trained):
    page = Page(browser, server)
    page.paste(PARAGRAPH)
    page.find(f"#choices input[value='{trained}']").click()  # leaves only gpt2
    page.wait_drawn(len(PARAGRAPH))
    link = browser.current_url
    page = Page(browser, link)  # a fresh page from the link alone
    assert page.find("#input").get_property("value") == PARAGRAPH
    assert page.names() == ["gpt2"]
    assert page.counts("gpt2") == expected_counts(tokenizers["gpt2"], PARAGRAPH)
    gpt2 = page.panel("gpt2")
    marks = [span.text for span in page.find_all(".ws", gpt2)]
    assert marks.count("↵") == PARAGRAPH.count("\n") and marks.count("→") == 1 and "·" in marks
    assert len(page.find_all("br", gpt2)) == PARAGRAPH.count("\n")  # a newline is also a real line break
    halves = [span.text for span in page.find_all(".tok.bytes", gpt2)]  # gpt2 splits the emoji's 4 bytes
    assert "😀".encode() in bytes.fromhex("".join(halves))


def test_view_shows_html_in_the_text_as_text(server, browser):
    page = Page(browser, server)
    text = '<img src=x onerror="window.injected = 1"><b>bold</b><script>window.injected = 2</script>'
    page.paste(text)
    for name in page.names():
        panel = page.panel(name)
        shown = "".join(span.get_property("textContent") for span in page.find_all(".tok", panel))
        assert shown == text.replace(" ", "·")
    assert page.find_all("#panels img, #panels b, #panels script") == []
    assert browser.execute_script("return window.injected") is None


def test_view_chat_mode_shows_the_rendered_conversation_with_special_badges(server, browser, tokenizers):
    page = Page(browser, server)
    page.find("input[name=mode][value=chat]").click()
    conversation = "user: What is 2+2?\nassistant: 4"
    page.paste(conversation)
    chat_tokenizer = add_chat_tokens(tokenizers["gpt2"])
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    expected = ChatFormat(chat_tokenizer).render(messages).ids
    assert page.ids("gpt2") == expected
    gpt2 = page.panel("gpt2")
    badges = [span.text for span in page.find_all(".tok.special", gpt2)]
    assert badges == ["<|endoftext|>", "<|user|>", "<|end|>", "<|assistant|>", "<|end|>"]
    assert "lacks the chat tokens" in page.find_all(".note", gpt2)[0].text
    assert "mode=chat" in browser.current_url


def test_view_a_megabyte_paste_is_counted_exactly_and_drawn_in_part(server, browser, tokenizers):
    page = Page(browser, server)
    text = PARAGRAPH * (1_000_000 // len(PARAGRAPH.encode()))
    page.paste(text)
    for name, tokenizer in tokenizers.items():
        counts = page.counts(name)
        assert counts == expected_counts(tokenizer, text)
        spans = len(page.find_all(".tok", page.panel(name)))
        assert 0 < spans < counts["tokens"] // 50  # only the chunks near the view hold spans
    assert "text=" not in browser.current_url  # too long for a link: left out, the rest kept
