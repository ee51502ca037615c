"""Chat task accuracy: batched greedy answers against each prompt generated alone, graded by hand."""

import json
import re

import pytest

from gptlab.chat import ChatFormat
from gptlab.chat.tasks import TASKS, Example, Spelling, Task, get_task
from gptlab.eval import chat as chat_eval
from gptlab.eval.chat import evaluate_task, grade, task_accuracy_fn
from gptlab.infer import SamplingConfig, generate
from gptlab.model.io import load_model
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

from .conftest import CHAT_TWO_RANKS
from .two_ranks import ranks_stdout

GENERATED = [name for name, task in TASKS.items() if task.generated]  # tasks that need no dataset


class EvenLength(Spelling):
    """Spelling questions, but a response is 'right' when it and the question together have an even number
    of characters: an untrained model's noise gets some right and some wrong, so a miscount shows."""

    def verify(self, example: Example, response: str) -> bool:
        return (len(example.question) + len(response)) % 2 == 0


@pytest.fixture(scope="module")
def model_and_chat(chat_model):
    return load_model(chat_model), ChatFormat(Tokenizer.load(chat_model / "tokenizer"))


def answer_alone(model, chat: ChatFormat, question: str, max_new_tokens: int) -> str:
    """The reference: one prompt, no batch, no KV cache."""
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0, stop_tokens=chat.stop_tokens,
                            vocab_size=chat.tokenizer.vocab_size)
    ids = generate(model, [chat.prompt([{"role": "user", "content": question}])], config, use_cache=False)[0]
    return chat.tokenizer.decode([token for token in ids if token in chat.tokenizer.vocab])


@pytest.mark.parametrize("task", [EvenLength(), get_task("arithmetic"), get_task("sorting")], ids=["even-length", "arithmetic", "sorting"])
def test_evaluate_task_equals_each_prompt_answered_alone_and_graded_by_hand(model_and_chat, task):
    model, chat = model_and_chat
    examples = task.examples("test", 10)
    expected = [answer_alone(model, chat, example.question, 24) for example in examples]
    right = sum(task.verify(example, response) for example, response in zip(examples, expected))
    result = evaluate_task(model, chat, task, n=10, batch_size=4, max_new_tokens=24)  # batches of 4, 4, 2
    assert result == {"accuracy": right / 10, "correct": right, "total": 10}
    graded = grade(model, chat, task, examples, batch_size=3, max_new_tokens=24)
    assert [g.response for g in graded] == expected
    assert [g.correct for g in graded] == [task.verify(e, r) for e, r in zip(examples, expected)]
    if isinstance(task, EvenLength):
        assert 0 < right < 10  # the check above can tell a miscount from a right count


def fake_generate(chat: ChatFormat, knows: set[str], seen: list):
    """A stand-in for gptlab.infer.generate that answers a question right when it is in `knows`, else says "no idea"."""
    answers = {example.question: example.reply for name in GENERATED for example in get_task(name).examples("test", 30)}

    def fake(model, prompts, config, **kwargs):
        seen.append((prompts, config, kwargs))
        replies = []
        for prompt in prompts:
            text = chat.tokenizer.decode(prompt)
            question = text.removeprefix("<|endoftext|><|user|>").removesuffix("<|end|><|assistant|>")
            assert chat.prompt([{"role": "user", "content": question}]) == prompt
            replies.append(chat.tokenizer.encode_ordinary(answers[question] if question in knows else "no idea"))
        return replies

    return fake


@pytest.mark.parametrize("name", GENERATED)
def test_evaluate_task_counts_exactly_the_questions_the_model_answers_right(model_and_chat, monkeypatch, name):
    model, chat = model_and_chat
    task = get_task(name)
    examples = task.examples("test", 30)
    knows = {example.question for example in examples[::3]}  # 10 of 30
    seen: list = []
    monkeypatch.setattr(chat_eval, "generate", fake_generate(chat, knows, seen))
    assert evaluate_task(model, chat, task, n=30, batch_size=8) == {"accuracy": 10 / 30, "correct": 10, "total": 30}
    assert [len(prompts) for prompts, _, _ in seen] == [8, 8, 8, 6]
    config = seen[0][1]
    assert config.temperature == 0 and config.stop_tokens == chat.stop_tokens and config.vocab_size == chat.tokenizer.vocab_size
    assert all(kwargs == {"truncate": True} for _, _, kwargs in seen)
    graded = grade(model, chat, task, examples[:6])
    assert [g.correct for g in graded] == [True, False, False, True, False, False]
    assert graded[0] == (examples[0].question, examples[0].reply, True)


def test_evaluate_task_restores_the_training_mode(model_and_chat):
    model, chat = model_and_chat
    model.train()
    evaluate_task(model, chat, get_task("arithmetic"), n=2, max_new_tokens=4)
    assert model.training
    model.eval()
    evaluate_task(model, chat, get_task("arithmetic"), n=2, max_new_tokens=4)
    assert not model.training


def test_evaluate_task_bad_arguments_raise(model_and_chat):
    model, chat = model_and_chat
    with pytest.raises(GptlabError, match="got 0"):
        evaluate_task(model, chat, get_task("arithmetic"), n=0)
    with pytest.raises(GptlabError, match="unknown split"):
        evaluate_task(model, chat, get_task("arithmetic"), split="val")
    with pytest.raises(GptlabError, match="batch_size"):
        evaluate_task(model, chat, get_task("arithmetic"), n=2, batch_size=0)
    with pytest.raises(GptlabError, match="the tasks are arithmetic"):
        task_accuracy_fn(chat, ["arithmetic", "chess"], n=2)


def test_task_accuracy_fn_reports_each_task_as_evaluate_task_does(model_and_chat):
    model, chat = model_and_chat
    scores = task_accuracy_fn(chat, ["arithmetic", "spelling"], n=4, max_new_tokens=8)(model)
    assert scores == {
        f"{name}_accuracy": evaluate_task(model, chat, get_task(name), n=4, max_new_tokens=8)["accuracy"]
        for name in ("arithmetic", "spelling")
    }


TWO_RANKS = """
import json, sys
import torch.distributed as dist
from gptlab.chat import ChatFormat
from gptlab.eval.chat import evaluate_task
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer
from tests.eval.test_chat_eval import EvenLength
from pathlib import Path
dist.init_process_group("gloo")
folder = Path(sys.argv[1])
result = evaluate_task(load_model(folder), ChatFormat(Tokenizer.load(folder / "tokenizer")), EvenLength(), n=7, batch_size=2, max_new_tokens=16)
sys.stdout.write(f"RESULT {dist.get_rank()} {json.dumps(result)}\\n")  # one write (print writes the newline apart)
sys.stdout.flush()
dist.destroy_process_group()
"""


@CHAT_TWO_RANKS
def test_evaluate_task_on_two_gloo_ranks_equals_one_process(model_and_chat, chat_two_ranks):
    """Rank r answers examples r::2 of 7; the summed counts are the single-process counts, on both ranks."""
    model, chat = model_and_chat
    single = evaluate_task(model, chat, EvenLength(), n=7, batch_size=2, max_new_tokens=16)
    stdout = ranks_stdout(chat_two_ranks, "task")
    results = sorted(re.findall(r"RESULT (\d) (\{[^}]*\})", stdout))
    assert [rank for rank, _ in results] == ["0", "1"] and [json.loads(text) for _, text in results] == [single, single]


def test_task_base_class_needs_make_and_verify():
    with pytest.raises(NotImplementedError):
        Task().examples("test", 1)
