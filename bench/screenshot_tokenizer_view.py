"""A screenshot of the token viewer comparing tokenizers, for the README: docs/img/tokenizer-view.png.

    python bench/screenshot_tokenizer_view.py [TOKENIZER ...] [--out docs/img/tokenizer-view.png]

Without TOKENIZERs it shows a 512-id byte-level BPE and a 1,000-piece SentencePiece BPE (Llama 2 style), both trained
here on a little Shakespeare, beside gpt2 and cl100k_base (and o200k_base when its file is available offline). Needs Chromium and its driver (apt-get install chromium chromium-driver) and selenium.
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
TEXT = ("First Citizen:\n  Before we proceed any further, hear me speak.\n\n"
        "def tokens(text):\n\treturn len(text.encode())  # 2 + 2 = 4\n"
        "Ünïcödé, 世界 and emoji 🙂: a byte-level BPE may split them.")


def make_shakespeare_tokenizers(folder: Path) -> list[str]:
    """A byte-level BPE folder and a SentencePiece .model, trained by gptlab on six works."""
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.tokenizer import Tokenizer
    from gptlab.tokenizer.sp_model import write_model
    from gptlab.tokenizer.sp_train import train_sentencepiece

    works = shakespeare_documents()[:6]
    Tokenizer.train(works, vocab_size=512).save(folder / "shakespeare-512")
    model = write_model(train_sentencepiece(works, vocab_size=1000), folder / "shakespeare-sp-1000.model")
    return [str(folder / "shakespeare-512"), str(model)]


def start_viewer(tokenizers: list[str]) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "gptlab", "tokenizer", "view", *tokenizers, "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        found = re.search(r"http://127\.0\.0\.1:\d+/tokenizer/", line)
        if found:
            return process, found.group(0)
    raise SystemExit(f"gptlab tokenizer view exited ({process.wait()}) before listening")


def capture(driver, url: str, out: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    panels = driver.find_element(By.CSS_SELECTOR, "#panels")
    WebDriverWait(driver, 60).until(lambda _: panels.get_attribute("aria-busy") == "false")
    driver.execute_script("const box = document.querySelector('#input'); box.value = arguments[0];"
                          "box.dispatchEvent(new Event('input', {bubbles: true}));", TEXT)
    WebDriverWait(driver, 60).until(lambda _: panels.get_attribute("data-text-length") == str(len(TEXT))
                                    and panels.get_attribute("aria-busy") == "false")
    out.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizers", nargs="*", help="what `gptlab tokenizer view` takes (default: see above)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "tokenizer-view.png")
    args = parser.parse_args()
    from gptlab.tokenizer.pretrained import available_offline

    with tempfile.TemporaryDirectory() as temporary:
        tokenizers = args.tokenizers or make_shakespeare_tokenizers(Path(temporary)) + [
            name for name in ("gpt2", "cl100k_base", "o200k_base") if available_offline(name)]
        process, url = start_viewer(tokenizers)
        driver = open_browser("1600,820")
        try:
            capture(driver, url, args.out)
        finally:
            driver.quit()
            process.terminate()
            process.wait(timeout=30)
    print(f"wrote {args.out}  (python bench/screenshot_tokenizer_view.py {' '.join(args.tokenizers)})")


if __name__ == "__main__":
    main()
