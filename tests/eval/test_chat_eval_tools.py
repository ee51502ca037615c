"""Chat evaluation with tools: the tool model answers its questions through the real calculator, which it cannot do
without it; the costs reported are the ones its generated ids show; the CLI prints what the Python API computes."""

import pytest

from gptlab.chat import ChatFormat
from gptlab.chat.tasks import Arithmetic
from gptlab.cli.main import main
from gptlab.eval.chat import evaluate_task, final_answer, replies
from gptlab.infer import SamplingConfig, generate
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer
from gptlab.tools import load_tools
from gptlab.tools.turn import ToolTurn, chat_tools

from ..conftest import TOOL_QUESTIONS

TASK = Arithmetic(digits=2, ops="*", tools=1, work=0)  # what the tool model was trained on (tests/conftest.py)


@pytest.fixture(scope="module")
def tool_chat(tool_model):
    return load_model(tool_model), ChatFormat(Tokenizer.load(tool_model / "tokenizer"))


def test_eval_with_tools_answers_through_the_calculator_and_better_than_without(tool_chat):
    model, chat = tool_chat
    tools = chat_tools(chat, load_tools("calculator"))
    with_tools = evaluate_task(model, chat, TASK, n=TOOL_QUESTIONS, split="train", tools=tools, batch_size=3)
    without = evaluate_task(model, chat, TASK, n=TOOL_QUESTIONS, split="train", costs=True, batch_size=3)
    assert with_tools["accuracy"] > without["accuracy"]
    assert with_tools["correct"] >= TOOL_QUESTIONS - 1 and with_tools["tool_calls"] >= 1
    assert without["fed_tokens"] == without["tool_calls"] == 0  # nothing runs without tools


def test_eval_with_tools_costs_are_those_of_the_generated_ids(tool_chat):
    """Each reply is the Python API's tool loop for that prompt alone; the counts are read off its ids by hand."""
    model, chat = tool_chat
    toolbox = load_tools("calculator")
    examples = TASK.examples("train", TOOL_QUESTIONS)
    config = SamplingConfig(max_new_tokens=48, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=chat.tokenizer.vocab_size)
    generated = fed = calls = right = 0
    for example in examples:
        prompt = chat.prompt([{"role": "user", "content": example.question}], tools=toolbox.specs())
        turn = ToolTurn(chat, toolbox)
        ids = generate(model, [prompt], config, tools=[turn], use_cache=False)[0]
        results = [run.result.text for run in turn.runs]
        fed_ids = [token for token, own in zip(ids, chat.generated_mask(ids)) if not own]
        assert fed_ids == [token for text in results for token in chat.result_ids([text])]  # one call per turn
        calls, fed, generated = calls + len(results), fed + len(fed_ids), generated + len(ids) - len(fed_ids)
        messages = chat.parse_reply(ids)
        answer = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
        right += TASK.verify(example, answer)
    tools = chat_tools(chat, toolbox)
    answers = replies(model, chat, [e.question for e in examples], tools=tools, batch_size=4)
    result = evaluate_task(model, chat, TASK, n=TOOL_QUESTIONS, split="train", tools=tools, batch_size=4)
    assert result == {"accuracy": right / TOOL_QUESTIONS, "correct": right, "total": TOOL_QUESTIONS,
                      "generated_tokens": generated / TOOL_QUESTIONS, "fed_tokens": fed / TOOL_QUESTIONS,
                      "tool_calls": calls / TOOL_QUESTIONS}
    assert sum(a.generated for a in answers) == generated and sum(a.calls for a in answers) == calls
    assert all(a.text == final_answer(chat, a.ids) for a in answers)


def test_final_answer_is_the_text_after_the_last_tool_result(tool_chat):
    _, chat = tool_chat
    call = chat.encode('calculator {"expression": "2 * 3"}')
    ids = [chat.call, *call, chat.end, *chat.result_ids(["6"]), *chat.encode("the answer is 6")]
    assert final_answer(chat, ids) == "the answer is 6"
    assert final_answer(chat, ids[: len(call) + 2]) == ""  # cut off after the call: no answer
    assert final_answer(chat, chat.encode("7")) == "7"  # no call: the reply itself
    assert final_answer(chat, [*chat.encode("7"), chat.end]) == "7"  # a rollout's stop token kept


def test_cli_eval_chat_task_prints_what_evaluate_task_gives_with_and_without_tools(tool_model, tool_chat, capsys):
    model, chat = tool_chat
    spec = "arithmetic[digits=2,ops=*,tools=1,work=0]"
    common = [str(tool_model), "--chat-task", spec, "--split", "train", "--limit", str(TOOL_QUESTIONS), "--device", "cpu"]
    assert main(["eval", *common]) == 0
    shown = capsys.readouterr().out
    expected = evaluate_task(model, chat, TASK, n=TOOL_QUESTIONS, split="train", tools=chat_tools(chat, load_tools("calculator")))
    assert f"accuracy {expected['correct']}/{TOOL_QUESTIONS} = {expected['accuracy']:.3f}" in shown
    assert "95% CI" in shown and "tools calculator" in shown and f"{expected['tool_calls']:.2f} tool calls" in shown
    assert main(["eval", *common, "--tools", "none"]) == 0
    plain = capsys.readouterr().out
    without = evaluate_task(model, chat, TASK, n=TOOL_QUESTIONS, split="train")
    assert f"accuracy {without['correct']}/{TOOL_QUESTIONS}" in plain and "tools none" in plain and "0.0 fed by tools" in plain


def test_cli_eval_unknown_tool_is_one_error_line_before_the_model_loads(tool_model, capsys, monkeypatch):
    import gptlab.load.model_folders as folders

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(folders, "load_model", no_loading)
    assert main(["eval", str(tool_model), "--chat-task", "arithmetic[tools=1]", "--tools", "nosuchtool", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuchtool" in err and "calculator" in err
    with pytest.raises(SystemExit) as usage:  # --tools needs --chat-task: a usage error, as argparse's own
        main(["eval", str(tool_model), "--tools", "calculator", "--data", str(tool_model)])
    assert usage.value.code == 2 and "--chat-task" in capsys.readouterr().err


def test_tool_model_without_its_tools_block_gets_no_tools(tool_chat):
    """--tools none renders the question alone: no tools block, so nothing is fed (and the same questions asked)."""
    model, chat = tool_chat
    answers = replies(model, chat, [TASK.examples("train", 1)[0].question], max_new_tokens=8)
    assert answers[0].fed == answers[0].calls == 0 and answers[0].generated == len(answers[0].ids)


def test_task_accuracy_answers_a_task_that_offers_tools_with_its_own_tools(tool_chat):
    """What SFT and DPO report before and after: a tool task answered with its tools, as `gptlab eval` would."""
    from gptlab.eval.chat import task_accuracy_fn
    from gptlab.tools.turn import tasks_own_tools

    model, chat = tool_chat
    with_tools = task_accuracy_fn(chat, [TASK], TOOL_QUESTIONS, split="train", tools=tasks_own_tools(chat))(model)
    without = task_accuracy_fn(chat, [TASK], TOOL_QUESTIONS, split="train")(model)
    assert with_tools["arithmetic_tools_accuracy"] >= (TOOL_QUESTIONS - 1) / TOOL_QUESTIONS > without["arithmetic_accuracy"]


def test_a_reply_with_tools_has_room_for_the_results_fed_back(tool_chat):
    """The tool model's replies take about 34 tokens of its own and 6 fed: a budget of 30 alone would cut every one,
    so with tools the fed results get room beyond it (the context permitting)."""
    model, chat = tool_chat
    tools = chat_tools(chat, load_tools("calculator"))
    tight = evaluate_task(model, chat, TASK, n=TOOL_QUESTIONS, split="train", tools=tools, max_new_tokens=30)
    roomy = evaluate_task(model, chat, TASK, n=TOOL_QUESTIONS, split="train", tools=tools, max_new_tokens=80)
    assert tight == roomy and tight["correct"] >= TOOL_QUESTIONS - 1


def test_task_accuracy_keeps_one_task_in_two_settings_apart(tool_chat):
    """A mixture may hold a task with and without tools (TOOL_MIXTURE does): each gets its own figure."""
    from gptlab.eval.chat import accuracy_keys, task_accuracy_fn
    from gptlab.tools.turn import tasks_own_tools

    model, chat = tool_chat
    plain = Arithmetic(digits=2, ops="*", work=0)
    figures = task_accuracy_fn(chat, [TASK, plain, plain], 4, split="train", tools=tasks_own_tools(chat))(model)
    assert list(figures) == ["arithmetic_tools_accuracy", "arithmetic_accuracy", "arithmetic_2_accuracy"]
    assert figures["arithmetic_tools_accuracy"] > figures["arithmetic_accuracy"] == figures["arithmetic_2_accuracy"]
    assert accuracy_keys(["a", "b", "a", "a"]) == ["a_accuracy", "b_accuracy", "a_2_accuracy", "a_3_accuracy"]
