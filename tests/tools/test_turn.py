"""The tool loop of one request against its references: the chat format's own rendering of the same conversation
(what a fed result looks like must be what training showed), the client's calls handed back, limits as results."""

import json

import pytest
import torch

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.chat.tool_specs import CALCULATOR
from gptlab.infer import SamplingConfig, generate
from gptlab.infer.engine import Engine, EngineConfig
from gptlab.model import GPT, preset
from gptlab.tokenizer import Tokenizer
from gptlab.tools import ToolLimits, load_tools
from gptlab.tools.turn import ToolTurn, reply_messages

END_NUDGE = 3.0  # added to <|end|>'s logit: an untrained model then ends its calls now and then
QUESTION = [{"role": "user", "content": "What is 1234 * 5678?"}]


@pytest.fixture(scope="module")
def chat(prepared):
    return ChatFormat(add_chat_tokens(Tokenizer.load(prepared / "tokenizer")))


def call_ids(chat, expression="1234 * 5678", name="calculator"):
    return [chat.call, *chat.encode(f"{name} {json.dumps({'expression': expression})}"), chat.end]


def test_turn_runs_a_completed_call_and_feeds_what_rendering_would_hold(chat):
    turn = ToolTurn(chat, load_tools("calculator"))
    steps = [turn.after(token) for token in call_ids(chat)]
    assert steps[:-1] == [None] * (len(steps) - 1)
    messages = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": "1234 * 5678"})}}]},
        {"role": "tool", "content": "7006652"}]
    rendered = chat.prompt(messages, tools=[CALCULATOR])
    prompt = chat.prompt(QUESTION, tools=[CALCULATOR])
    assert [*prompt, *call_ids(chat), *steps[-1].feed] == rendered  # the loop's transcript is the rendered conversation
    assert [run.result.text for run in turn.runs] == ["7006652"]
    assert turn.runs[0].describe() == "calculator(1234 * 5678) -> 7006652"


def test_turn_without_calls_lets_the_reply_end(chat):
    turn = ToolTurn(chat, load_tools("calculator"))
    assert [turn.after(token) for token in [*chat.encode("It is 7."), chat.end]] == [None] * (len(chat.encode("It is 7.")) + 1)
    assert turn.runs == []


def test_turn_hands_a_client_tool_call_back_with_finish_tool_calls(chat):
    turn = ToolTurn(chat, load_tools("calculator"), client={"lookup"})
    steps = [turn.after(token) for token in call_ids(chat, "x", name="lookup")]
    assert steps[-1].finish == "tool_calls" and turn.finish == "tool_calls"
    assert turn.runs[0].name == "lookup" and turn.runs[0].result is None


def test_turn_errors_reach_the_model_as_results(chat):
    turn = ToolTurn(chat, load_tools("calculator", ToolLimits(max_calls=1)))
    for token in call_ids(chat, "1 / 0")[:-1]:
        turn.after(token)
    fed = chat.tokenizer.decode(list(turn.after(chat.end).feed))
    assert fed.startswith("<|tool|>error: ") and fed.endswith("<|end|><|assistant|>")
    for token in call_ids(chat, "2 + 2"):
        step = turn.after(token)
    assert "call limit" in chat.tokenizer.decode(list(step.feed))
    for token in call_ids(chat, "2", name="nowhere")[:-1]:
        turn.after(token)
    assert chat.tokenizer.decode(list(turn.after(chat.end).feed)).startswith("<|tool|>error: ")


def test_reply_messages_number_the_calls_and_tag_their_results(chat):
    reply = [*call_ids(chat)[:-1], chat.end, *chat.result_ids(["7006652"]), *chat.encode("7006652")]
    messages = reply_messages(chat, reply)
    assert messages[0]["tool_calls"][0]["id"] == "call_1" and messages[1] == {"role": "tool", "content": "7006652", "tool_call_id": "call_1"}
    assert messages[2] == {"role": "assistant", "content": "7006652"}


def test_generation_with_real_tools_batched_equals_one_at_a_time(chat):
    """A tiny model trained on nothing, prompted to call the calculator (the call's opening in the prompt) and nudged
    towards <|end|>: whatever it writes goes to the real calculator; a batch and the engine give each row what it gets
    alone."""
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=chat.tokenizer.vocab_size, block_size=128)).eval()
    model.lm_head.register_forward_hook(lambda module, inputs, logits: logits.index_add(
        -1, torch.tensor([chat.end]), torch.full((*logits.shape[:-1], 1), END_NUDGE)))
    prompts = [[*chat.prompt([{"role": "user", "content": f"What is {n} + {n}?"}], tools=[CALCULATOR]), chat.call,
                *chat.encode("calculator")] for n in (3, 45, 678)]
    config = SamplingConfig(max_new_tokens=40, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=chat.tokenizer.vocab_size)
    toolbox = load_tools("calculator")
    def turn():
        return ToolTurn(chat, toolbox, prefix=[chat.call, *chat.encode("calculator")])
    turns = [turn() for _ in prompts]
    alone = [generate(model, [prompt], config, tools=[one])[0] for prompt, one in zip(prompts, turns)]
    assert sum(len(one.runs) for one in turns) >= 2  # the nudge made calls happen: the loop ran the calculator
    assert generate(model, prompts, config, tools=[turn() for _ in prompts]) == alone
    with Engine(model, EngineConfig(slots=2)) as engine:
        requests = [engine.submit(prompt, config, tools=turn()) for prompt in prompts]
        assert [list(request) for request in requests] == alone
