"""A screenshot of the web chat mid-conversation, for the README: docs/web-chat.png.

    python bench/screenshot_web_chat.py [MODEL] [--out docs/web-chat.png]
    python bench/screenshot_web_chat.py runs/tools-rl --tools calculator --out docs/img/web-chat-tools.png

With --tools SPEC the server runs those tools (gptlab serve --tools) and the question is a product.

MODEL is any chat model `gptlab serve` reads (after `gptlab sft`); without one, a tiny
untrained chat model is made in a temporary folder (its replies are noise). Needs
Chromium and its driver (apt-get install chromium chromium-driver) and selenium.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from browser import open_browser

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["What is 3 + 4?", "Spell the word \"crown\" letter by letter."]  # the demo's fine-tuning tasks
TOOL_QUESTIONS = ["What is 4821 * 3907?"]  # the tool-use recipe's model learned one-question conversations only


def make_random_chat_model(folder: Path) -> Path:
    """An untrained gpt2-tiny with a 512-token BPE trained on a little Shakespeare, plus the chat tokens."""
    import torch

    from gptlab.chat import add_chat_tokens
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.model import GPT, preset
    from gptlab.model.io import save_model
    from gptlab.tokenizer import Tokenizer

    tokenizer = add_chat_tokens(Tokenizer.train(shakespeare_documents()[:6], vocab_size=512))
    torch.manual_seed(0)
    save_model(GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=256)), folder)
    tokenizer.save(folder / "tokenizer")
    return folder


def start_server(model: Path, tools: str | None = None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "gptlab", "serve", str(model), "--port", "0", "--name", model.name,
               *(["--tools", tools] if tools else [])]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if found:
            return process, found.group(0)
    raise SystemExit(f"gptlab serve exited ({process.wait()}) before listening")


def converse(driver, url: str, out: Path, questions: list[str], max_tokens: int = 48) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def find(selector):
        return driver.find_element(By.CSS_SELECTOR, selector)

    wait = WebDriverWait(driver, 60)
    driver.get(url)
    wait.until(lambda _: find("#model").text not in ("", "connecting…"))
    find("#settings summary").click()
    # no system prompt: the demo's model was fine-tuned on conversations without one
    for field, value in (("#temperature", "0"), ("#max-tokens", str(max_tokens))):
        find(field).clear()
        find(field).send_keys(value)
    find("#settings summary").click()  # folded again: the conversation fills the picture
    for question in questions:
        find("#input").send_keys(question)
        find("#send").click()
        wait.until(lambda _: find("#composer").get_attribute("aria-busy") == "false")
    find("#input").send_keys("Tell me more")  # mid-conversation: the next message half typed
    out.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, help="a chat model folder (default: a tiny random one)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "web-chat.png")
    parser.add_argument("--tools", help="tools the server runs (gptlab serve --tools SPEC), e.g. calculator")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        model = args.model or make_random_chat_model(Path(temporary) / "random-chat-model")
        process, url = start_server(model, args.tools)
        driver = open_browser("960,720")
        try:
            # with tools, an answer holds the results fed back too (about 35 tokens of its own and 8 fed)
            converse(driver, url, args.out, *((TOOL_QUESTIONS, 64) if args.tools else (QUESTIONS, 48)))
        finally:
            driver.quit()
            process.terminate()
            process.wait(timeout=30)
    print(f"wrote {args.out}  (python bench/screenshot_web_chat.py {' '.join(sys.argv[1:])})")


if __name__ == "__main__":
    main()
