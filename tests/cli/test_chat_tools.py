"""`gptlab chat --tools` and `gptlab sample --tools`: a model's call runs the real calculator, the terminal shows the
call and its result and then the answer, exactly the tokens the Python API's tool loop gives; bad tools are one line."""

import io
import shutil
import sys

import torch

from gptlab.chat import CHAT_TOKENS, ChatFormat
from gptlab.chat.tasks import Arithmetic
from gptlab.cli.main import main
from gptlab.infer import SamplingConfig, generate
from gptlab.load.decoding import load_for_decoding
from gptlab.tokenizer import Tokenizer
from gptlab.tools import load_tools
from gptlab.tools.results import ToolResult
from gptlab.tools.turn import ToolRun, ToolTurn, reply_messages

TASK = Arithmetic(digits=2, ops="*", tools=1, work=0)  # what the tool model was trained on (tests/conftest.py)


def reference(folder, question: str | list[dict], max_tokens: int = 60) -> list[int]:
    """The reply's tokens from the Python API: ChatFormat.prompt with the calculator offered, generate with a ToolTurn."""
    model, tokenizer, _ = load_for_decoding(str(folder), torch.device("cpu"))
    chat, toolbox = ChatFormat(tokenizer), load_tools("calculator")
    config = SamplingConfig(max_new_tokens=max_tokens, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=tokenizer.vocab_size)
    messages = [{"role": "user", "content": question}] if isinstance(question, str) else question
    prompt = chat.prompt(messages, tools=toolbox.specs())
    return generate(model, [prompt], config, tools=[ToolTurn(chat, toolbox)])[0]


def shown(chat, tokens: list[int]) -> str:
    """What the terminal shows for a reply: each assistant message's words, each call on its line with its result."""
    messages = chat.parse_reply(tokens)
    results = iter(m["content"] for m in messages if m["role"] == "tool")
    text = ""
    for message in (m for m in messages if m["role"] == "assistant"):
        text += message["content"]
        for call in message.get("tool_calls", ()):
            run = ToolRun(call["function"]["name"], call["function"]["arguments"], ToolResult(next(results), True, 0.0))
            text += f"[{run.describe()}]\n"
    return text + "\n"


def test_chat_with_tools_shows_the_call_its_result_and_the_answer(tool_model, monkeypatch, capsys):
    example = TASK.examples("train", 1)[0]
    a, b = example.question.removeprefix("What is ").removesuffix("?").split(" * ")
    monkeypatch.setattr(sys, "stdin", io.StringIO(example.question + "\n" + example.question + "\n"))
    assert main(["chat", str(tool_model), "--tools", "calculator", "--temperature", "0", "--max-tokens", "60", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    chat = ChatFormat(Tokenizer.load(tool_model / "tokenizer"))
    reply = reply_messages(chat, reference(tool_model, example.question))
    assert reply[0]["tool_calls"][0]["function"]["name"] == "calculator" and reply[1]["content"] == str(int(a) * int(b))
    first = f"[calculator({a} * {b}) -> {int(a) * int(b)}]\n{reply[-1]['content']}\n"
    assert shown(chat, reference(tool_model, example.question)) == first  # the call, the calculator's result, the answer
    history = [{"role": "user", "content": example.question}, *reply, {"role": "user", "content": example.question}]
    assert out == first + shown(chat, reference(tool_model, history))  # the second turn saw the first's calls and results


def test_sample_with_tools_prints_the_whole_transcript(tool_model, capsys):
    assert main(["sample", "--checkpoint", str(tool_model), "--task", "arithmetic[digits=2,ops=*,tools=1,work=0]",
                 "--tools", "calculator", "--temperature", "0", "--max-new-tokens", "60", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    question = TASK.examples("test", 1)[0].question
    tokenizer = Tokenizer.load(tool_model / "tokenizer")
    assert out == question + "\n" + tokenizer.decode(reference(tool_model, question)) + "\n"


def test_chat_unknown_tool_is_one_error_line_before_loading(tmp_path, capsys):
    assert main(["chat", str(tmp_path / "missing"), "--tools", "abacus"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "abacus" in err and "calculator" in err


def test_chat_tools_for_a_model_without_the_tool_tokens_is_one_error_line(prepared, chat_model, tmp_path, capsys):
    from gptlab.model import GPT, preset
    from gptlab.model.io import save_model

    older = tmp_path / "older"
    tokenizer = Tokenizer.load(prepared / "tokenizer").with_special_tokens(list(CHAT_TOKENS))  # a chat model made before tools
    save_model(GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=128)), older)
    tokenizer.save(older / "tokenizer")
    assert main(["chat", str(older), "--tools", "calculator", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tool tokens" in err and "gptlab sft" in err
    shutil.rmtree(older)
