"""The web chat in a real browser against `gptlab serve --tools calculator`: the model's call and the calculator's
result are shown in the conversation as the terminal chat shows them (ToolRun.describe), then the answer, exactly
what the Python API's tool loop gives."""

import pytest
import torch

from gptlab.chat import ChatFormat
from gptlab.chat.tasks import Arithmetic
from gptlab.infer import SamplingConfig, generate
from gptlab.load.decoding import load_for_decoding
from gptlab.tools import load_tools
from gptlab.tools.turn import ToolTurn
from tests.serve.browser import headless_chromium
from tests.serve.test_web_chat import Page, serving

pytestmark = pytest.mark.xdist_group("web_chat")
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def server(tool_model):
    yield from serving(tool_model, "--tools", "calculator")


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium("web chat", "1000,800")


def reference(folder, question: str) -> tuple[list[str], str]:
    """(each run described, the reply's words) from the Python API: the calculator offered and run by a ToolTurn."""
    model, tokenizer, _ = load_for_decoding(str(folder), torch.device("cpu"))
    chat, toolbox = ChatFormat(tokenizer), load_tools("calculator")
    config = SamplingConfig(max_new_tokens=MAX_TOKENS, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=tokenizer.vocab_size)
    turn = ToolTurn(chat, toolbox)
    messages = [{"role": "user", "content": question}]
    tokens = generate(model, [chat.prompt(messages, tools=toolbox.specs())], config, tools=[turn])[0]
    words = "".join(message["content"] for message in chat.parse_reply(tokens) if message["role"] == "assistant")
    return [run.describe() for run in turn.runs], words


def test_web_chat_shows_the_servers_tool_call_its_result_and_the_answer(server, browser, tool_model):
    example = Arithmetic(digits=2, ops="*", tools=1, work=0).examples("train", 1)[0]  # one the tool model learned
    page = Page(browser, server)
    page.settings(temperature=0, max_tokens=MAX_TOKENS)
    page.send(example.question)
    page.wait_idle()
    runs, words = reference(tool_model, example.question)
    a, b = example.question.removeprefix("What is ").removesuffix("?").split(" * ")
    assert runs == [f"calculator({a} * {b}) -> {example.answer}"]
    assert [line.text for line in page.find_all("#messages .assistant .tool-run")] == runs
    assert page.replies() == [words] and example.answer in words and "<|" not in words
