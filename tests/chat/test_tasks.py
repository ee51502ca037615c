"""Built-in chat tasks: answers checked against Python's own arithmetic, str.count and sorted; fixed, disjoint splits."""

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.chat.tasks import TASKS, Arithmetic, Example, Sorting, Spelling, get_task
from gptlab.chat.tasks.base import last_integer
from gptlab.chat.tasks.words import WORDS
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

VARIANTS = [
    Arithmetic(),
    Arithmetic(digits=3, ops="+-*"),
    Arithmetic(digits=1, ops="-"),
    Spelling(),
    Spelling(counting=0.0),
    Spelling(counting=1.0),
    Sorting(),
    Sorting(items="numbers", min_items=2, max_items=6),
]
IDS = [repr(task) for task in VARIANTS]


def wrong_reply(example: Example) -> str:
    """A reply in the task's own form whose final answer differs from the example's."""
    if example.answer.lstrip("-").isdigit():
        wrong = str(int(example.answer) + 1)
        return example.reply[: example.reply.rindex(example.answer)] + wrong
    if "-" in example.answer and "," not in example.answer:  # a spelling: drop the last letter
        return example.answer[:-2]
    items = example.answer.split(", ")
    return ", ".join(items[1:] + items[:1])  # distinct items rotated: never sorted


# ---------------------------------------------------------------- registry


def test_get_task_builds_every_registered_task_with_its_name():
    for name, cls in TASKS.items():
        task = get_task(name)
        assert isinstance(task, cls) and task.name == name
    assert get_task("arithmetic", digits=3) == Arithmetic(digits=3)


def test_get_task_unknown_name_lists_the_tasks():
    with pytest.raises(GptlabError, match="arithmetic, spelling, sorting"):
        get_task("chess")
    with pytest.raises(GptlabError, match="bad options"):
        get_task("sorting", digits=2)


@pytest.mark.parametrize("build", [
    lambda: Arithmetic(digits=0), lambda: Arithmetic(ops="/"), lambda: Arithmetic(ops="++"),
    lambda: Spelling(counting=1.5), lambda: Sorting(items="letters"), lambda: Sorting(min_items=5, max_items=3),
])
def test_task_bad_option_raises_with_the_value(build):
    with pytest.raises(GptlabError, match="got|swap"):
        build()


# ---------------------------------------------------------------- verifiers


@pytest.mark.parametrize("task", VARIANTS, ids=IDS)
def test_task_verify_accepts_its_own_reply_and_rejects_a_wrong_one(task):
    examples = task.examples("train", 300) + task.examples("test", min(50, task.test_size))
    for example in examples:
        assert task.verify(example, example.reply), example
        assert task.reward(example, example.reply) == 1.0
        assert not task.verify(example, wrong_reply(example)), (example, wrong_reply(example))
        assert task.reward(example, wrong_reply(example)) == 0.0
        assert not task.verify(example, "")


@pytest.mark.parametrize("digits", [1, 2, 3, 5])
@pytest.mark.parametrize("ops", ["+", "-", "*", "+-*"])
def test_arithmetic_answer_equals_python_evaluation_of_the_question(digits, ops):
    task = Arithmetic(digits=digits, ops=ops)
    rng = random.Random(digits)
    for _ in range(200):
        example = task.make(rng)
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", example.question).groups()
        assert op in ops and len(a) <= digits and len(b) <= digits
        assert int(example.answer) == eval(f"{int(a)} {op} {int(b)}") >= 0  # noqa: S307 (two ints and an operator, parsed above)
        assert example.reply == f"{a} {op} {b} = {example.answer}"


def test_spelling_answers_equal_str_count_and_the_letters_of_the_word():
    task = Spelling(counting=0.5)
    for example in task.examples("train", 500):
        if counted := re.fullmatch(r'How many times does the letter "(.)" appear in "(\w+)"\?', example.question):
            letter, word = counted.groups()
            assert example.answer == str(word.count(letter))
            assert example.reply.startswith("-".join(word) + " -> ")
        else:
            word = re.fullmatch(r'Spell the word "(\w+)" letter by letter\.', example.question).group(1)
            assert example.answer.split("-") == list(word)
        assert word in WORDS


@pytest.mark.parametrize("items", ["words", "numbers"])
def test_sorting_answer_equals_sorted_question_items(items):
    task = Sorting(items=items, min_items=2, max_items=7)
    key = int if items == "numbers" else str
    for example in task.examples("train", 300):
        given_items = example.question.split(": ", 1)[1].split(", ")
        assert len(set(given_items)) == len(given_items)
        assert example.answer.split(", ") == sorted(given_items, key=key)


@pytest.mark.parametrize("response", ["81", "The answer is 81.", "23 + 58 = 81", "80, no: 81", "81\n"])
def test_arithmetic_verify_reads_the_last_number(response):
    assert Arithmetic().verify(Example("What is 23 + 58?", "23 + 58 = 81", "81"), response)


def test_spelling_and_sorting_verify_are_lenient_about_case_spaces_and_punctuation():
    spelling = Example('Spell the word "crown" letter by letter.', "c-r-o-w-n", "c-r-o-w-n")
    assert Spelling().verify(spelling, "Sure: C - R - O - W - N.")
    assert not Spelling().verify(spelling, "crown")
    assert not Spelling().verify(spelling, "c-r-o-w-n-s")
    ordered = Example("Sort alphabetically: pear, crown, apple", "apple, crown, pear", "apple, crown, pear")
    assert Sorting().verify(ordered, "Here you go:\nSorted: Apple, crown, pear.")
    assert not Sorting().verify(ordered, "apple, crown")


@given(st.integers(-10**12, 10**12), st.text(alphabet="abc .:=?\n", max_size=12))
def test_last_integer_finds_a_number_written_last(number, prefix):
    assert last_integer(f"{prefix} {number}.") == number


def test_last_integer_reads_a_minus_after_a_digit_as_subtraction():
    assert last_integer("12-5") == 5
    assert last_integer("no digits") is None


# ---------------------------------------------------------------- splits


@pytest.mark.parametrize("task", VARIANTS, ids=IDS)
def test_task_train_and_test_splits_share_no_question(task):
    test = task.examples("test", task.test_size)
    assert len({example.question for example in test}) == len(test)  # distinct within the test split
    train = task.examples("train", 2000)
    assert not {example.question for example in train} & {example.question for example in test}


@pytest.mark.parametrize("task", VARIANTS, ids=IDS)
def test_task_examples_are_fixed_prefixes(task):
    for split in ("train", "test"):
        n = min(40, task.test_size // 2)
        first = task.examples(split, n)
        assert len(first) == n and first == type(task)(**vars(task)).examples(split, n)  # a fresh instance agrees
        assert task.examples(split, 2 * n)[:n] == first
    assert task.examples("train", 10) != task.examples("test", 10)


def test_task_examples_are_the_same_in_a_new_process_with_another_hash_seed():
    code = (
        "import json; from gptlab.chat.tasks import TASKS\n"
        "print(json.dumps({name: [e.question for split in ('train', 'test') for e in cls().examples(split, 30)]"
        " for name, cls in TASKS.items() if cls.generated}))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PYTHONHASHSEED": "12345"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    here = {name: [e.question for split in ("train", "test") for e in cls().examples(split, 30)] for name, cls in TASKS.items() if cls.generated}
    assert json.loads(result.stdout) == here


def test_task_examples_bad_split_or_count_raises():
    task = Arithmetic()
    with pytest.raises(GptlabError, match="unknown split 'val'"):
        task.examples("val", 3)
    with pytest.raises(GptlabError, match="holds 500 examples; ask for at most that, got n=501"):
        task.examples("test", 501)
    with pytest.raises(GptlabError, match="got -1"):
        task.examples("train", -1)


def test_arithmetic_one_digit_holds_out_a_quarter_of_its_questions():
    task = Arithmetic(digits=1, ops="+")  # 100 questions
    assert task.test_size == 25
    train = {example.question for example in task.examples("train", 1000)}
    assert len(train) == 75  # every other question shows up in 1000 draws, none of the held-out 25


# ---------------------------------------------------------------- conversations


def test_task_conversation_renders_the_reply_as_the_only_target():
    tokenizer = add_chat_tokens(Tokenizer.train(["What is 12 + 7? c-r-o-w-n apple, pear"], vocab_size=300))
    chat = ChatFormat(tokenizer)
    for name in (name for name, cls in TASKS.items() if cls.generated):
        task = get_task(name)
        if task.offers_tools:  # its tool turns are checked in test_tool_tasks.py; here the reply without tools
            task = get_task(name, tools=0)
        for example in task.examples("train", 5):
            conversation = task.conversation(example)
            assert conversation == [{"role": "user", "content": example.question}, {"role": "assistant", "content": example.reply}]
            rendered = chat.render(conversation)
            targets = [i for i, m in zip(rendered.ids, rendered.mask) if m]
            assert tokenizer.decode(targets) == example.reply + "<|end|>"


def test_spelling_counts_are_balanced_so_no_single_guess_scores_well():
    task = Spelling(counting=1.0)
    answers = [int(example.answer) for example in task.examples("train", 3000)]
    for count in (0, 1):
        assert 0.25 < answers.count(count) / len(answers) < 0.42
    assert 0.25 < sum(count >= 2 for count in answers) / len(answers) < 0.42


def test_arithmetic_verify_rejects_a_wrong_restatement_with_the_right_total():
    """'9 + 2 = 10' answers 10 to 'What is 8 + 2?', but not to that question: wrong."""
    from gptlab.chat.tasks import get_task

    task = get_task("arithmetic", digits=1)
    example = next(e for e in task.examples("test", 25) if e.question == "What is 8 + 2?")
    assert task.verify(example, "8 + 2 = 10") and task.verify(example, "8+2 = 10") and task.verify(example, "10")
    assert not task.verify(example, "9 + 2 = 10") and not task.verify(example, "8 + 2 = 11")


def test_arithmetic_answer_alone_when_work_is_0():
    from gptlab.chat.tasks import get_task
    from gptlab.runtime import GptlabError

    plain, worked = get_task("arithmetic", digits=1, work=0), get_task("arithmetic", digits=1)
    for a, b in zip(plain.examples("test", 25), worked.examples("test", 25)):
        assert a.question == b.question and a.reply == a.answer == b.answer and b.reply.endswith(f"= {b.answer}")
        assert plain.verify(a, a.reply) and plain.verify(a, b.reply)
    with pytest.raises(GptlabError, match="work must be 1"):
        get_task("arithmetic", work=2)
