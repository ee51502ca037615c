"""Reward functions: loaded from files and modules, called TRL-style, weighted and summed; user mistakes named in one line."""

import math
import textwrap

import pytest

from gptlab.align.rl.rewards import Reward, Rewards, completion_text, example_columns, load_reward, parse_rewards, verifier_reward
from gptlab.chat.tasks import Arithmetic
from gptlab.runtime import GptlabError

TASK = Arithmetic()
EXAMPLES = TASK.examples("test", 4)
PROMPTS = [example.question for example in EXAMPLES]
# right, wrong, right with extra words, empty
COMPLETIONS = [EXAMPLES[0].reply, "It is 1000000.", f"Let me see... {EXAMPLES[2].answer}", ""]

REWARDS_FILE = """
from dataclasses import dataclass

@dataclass
class Limit:  # a dataclass in the file: the module must be importable while it runs
    characters: int = 20

def brevity(prompts, completions, **columns):
    return [max(0.0, 1.0 - len(text) / Limit().characters) for text in completions]

def mentions_answer(completions, answer, **columns):
    return [None if not text else float(expected in text) for text, expected in zip(completions, answer)]

def strict(prompts, completions):
    return [0.0] * len(completions)

THRESHOLD = 3
"""


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS_FILE)
    return path


def brevity(text: str) -> float:
    return max(0.0, 1.0 - len(text) / 20)


# ---------------------------------------------------------------- loading


def test_load_reward_runs_a_file_without_installing_it(rewards_file):
    function = load_reward(f"{rewards_file}:brevity")
    assert function(prompts=PROMPTS, completions=COMPLETIONS) == [brevity(text) for text in COMPLETIONS]


def test_load_reward_imports_a_module_on_the_path(tmp_path, monkeypatch):
    package = tmp_path / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scores.py").write_text("def length(prompts, completions, **columns):\n    return [float(len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("mypackage.scores:length")(prompts=["p"], completions=["abc"]) == [3.0]


@pytest.mark.parametrize("spec, message", [
    ("{folder}/missing.py:brevity", r"file .*missing.py not found; give the path of a \.py file"),
    ("{folder}/my_rewards.py:shortness", r"has no 'shortness' \(it defines: brevity, mentions_answer, strict\)"),
    ("{folder}/my_rewards.py:THRESHOLD", "THRESHOLD is a int, not a function"),
    ("{folder}/my_rewards.py", "write path/to/file.py:function, package.module:function or 'verifier'"),
    ("brevity", "write path/to/file.py:function"),
    ("no_such_package.rewards:brevity", "no module named 'no_such_package'; give a file as path/to/file.py:function"),
])
def test_load_reward_names_the_spec_and_the_fix(rewards_file, spec, message):
    spec = spec.format(folder=rewards_file.parent)
    with pytest.raises(GptlabError, match=message) as raised:
        load_reward(spec)
    assert str(raised.value).startswith(f"reward {spec!r}: ") and "\n" not in str(raised.value)


@pytest.mark.parametrize("source, message", [
    ("import no_such_module\n", "raised ModuleNotFoundError: No module named 'no_such_module'; fix the file"),
    ("def brevity(prompts, completions:\n", "raised SyntaxError: "),
    ("x = undefined_name\n", "raised NameError: name 'undefined_name' is not defined"),
])
def test_load_reward_names_the_exception_a_file_raises(tmp_path, source, message):
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(GptlabError, match=message) as raised:
        load_reward(f"{path}:brevity")
    assert "\n" not in str(raised.value)


# ---------------------------------------------------------------- the verifier


def test_verifier_reward_is_the_tasks_reward_for_text_and_conversational_completions():
    verifier = verifier_reward(TASK)
    expected = [TASK.reward(example, text) for example, text in zip(EXAMPLES, COMPLETIONS)]
    assert expected == [1.0, 0.0, 1.0, 0.0]
    assert verifier(prompts=PROMPTS, completions=COMPLETIONS, **example_columns(EXAMPLES)) == expected
    conversational = [[{"role": "assistant", "content": text}] for text in COMPLETIONS]
    assert verifier(prompts=PROMPTS, completions=conversational, **example_columns(EXAMPLES)) == expected
    assert completion_text("plain") == "plain"
    with pytest.raises(GptlabError, match="a completion is text or a list of messages, got int"):
        completion_text(3)


def test_example_columns_are_the_examples_fields():
    columns = example_columns(EXAMPLES)
    assert columns["example"] == list(EXAMPLES)
    assert columns["question"] == PROMPTS and columns["answer"] == [example.answer for example in EXAMPLES]


# ---------------------------------------------------------------- several rewards


def test_rewards_from_spec_sums_weighted_values_and_logs_each_mean(rewards_file):
    rewards = Rewards.from_spec(f"verifier, {rewards_file}:brevity*0.1, {rewards_file}:mentions_answer*-2", task=TASK)
    assert rewards.names == ["verifier", "brevity", "mentions_answer"]
    scores = rewards.score(PROMPTS, COMPLETIONS, **example_columns(EXAMPLES))
    right = [1.0, 0.0, 1.0, 0.0]
    mentions = [float(example.answer in text) if text else None for example, text in zip(EXAMPLES, COMPLETIONS)]
    expected = [r + 0.1 * brevity(text) - 2 * (m or 0.0) for r, text, m in zip(right, COMPLETIONS, mentions)]
    assert scores.total == pytest.approx(expected)
    assert scores.values == {"verifier": right, "brevity": [brevity(text) for text in COMPLETIONS], "mentions_answer": mentions}
    assert scores.means["verifier"] == 0.5
    assert scores.means["mentions_answer"] == pytest.approx(sum(m for m in mentions if m is not None) / 3)  # None left out


def test_rewards_default_weight_is_one_and_zero_weight_only_logs(rewards_file):
    spec = f"verifier,{rewards_file}:brevity*0"
    scores = Rewards.from_spec(spec, task=TASK).score(PROMPTS, COMPLETIONS, **example_columns(EXAMPLES))
    assert scores.total == [1.0, 0.0, 1.0, 0.0] and scores.means["brevity"] > 0
    assert [term.weight for term in parse_rewards(spec, task=TASK)] == [1.0, 0.0]


def test_rewards_all_none_counts_as_zero_and_logs_nan():
    def silent(prompts, completions, **columns):
        return [None] * len(completions)

    scores = Rewards([silent]).score(PROMPTS, COMPLETIONS)
    assert scores.total == [0.0] * 4 and math.isnan(scores.means["silent"])


def test_rewards_repeated_names_are_logged_apart(rewards_file):
    rewards = Rewards.from_spec(f"{rewards_file}:brevity,{rewards_file}:brevity*2")
    assert rewards.names == ["brevity", "brevity_2"]


@pytest.mark.parametrize("returned, message", [
    (lambda n: [1.0] * (n - 1), "returned 3 values for 4 completions; return a list of 4 floats"),
    (lambda n: 1.0, r"returned a float \(1.0\); return a list of 4 floats"),
    (lambda n: (x for x in range(n)), "returned a generator"),
    (lambda n: ["1.0"] * n, "returned '1.0' for completion 0"),
    (lambda n: [0.0, math.nan] + [0.0] * (n - 2), "returned nan for completion 1; .*finite"),
    (lambda n: [0.0, 0.0, math.inf, 0.0], "returned inf for completion 2"),
])
def test_rewards_bad_return_value_names_the_function_and_what_it_returned(returned, message):
    def shaky(prompts, completions, **columns):
        return returned(len(completions))

    with pytest.raises(GptlabError, match=f"reward 'shaky' {message}") as raised:
        Rewards([shaky]).score(PROMPTS, COMPLETIONS)
    assert "\n" not in str(raised.value)


def test_rewards_accept_ints_bools_and_numpy_numbers():
    import numpy as np

    def mixed(prompts, completions, **columns):
        return [1, True, np.float32(0.5), None]

    assert Rewards([mixed]).score(PROMPTS, COMPLETIONS).values["mixed"] == [1.0, 1.0, 0.5, None]


def test_rewards_refuse_a_call_the_function_cannot_take_before_making_it(rewards_file):
    with pytest.raises(GptlabError, match=r"'strict' cannot be called .* define it as def strict\(prompts, completions, \*\*columns\)"):
        Rewards.from_spec(f"{rewards_file}:strict").score(PROMPTS, COMPLETIONS, answer=[e.answer for e in EXAMPLES])
    with pytest.raises(GptlabError, match="'verifier' reads the column 'example', which was not passed"):
        Rewards.from_spec("verifier", task=TASK).score(PROMPTS, COMPLETIONS, answer=[e.answer for e in EXAMPLES])
    with pytest.raises(GptlabError, match="column 'answer' has 2 items for 4 completions"):
        Rewards.from_spec("verifier", task=TASK).score(PROMPTS, COMPLETIONS, answer=["1", "2"])


@pytest.mark.parametrize("spec, message", [
    ("verifier*heavy", r"the weight after \* must be a number, e.g. verifier\*0.1"),
    ("verifier*nan", "weight must be a finite number, got nan"),
    ("verifier,,verifier", "has an empty term"),
])
def test_parse_rewards_bad_spec_raises_with_the_fix(spec, message):
    with pytest.raises(GptlabError, match=message):
        parse_rewards(spec, task=TASK)


def test_parse_rewards_verifier_needs_a_task():
    with pytest.raises(GptlabError, match="needs a task"):
        parse_rewards("verifier")
    with pytest.raises(GptlabError, match="no reward functions"):
        Rewards([])
    with pytest.raises(GptlabError, match="not a function"):
        Reward("three", 3)  # type: ignore[arg-type]


def test_rewards_file_loaded_twice_gives_independent_modules(tmp_path):
    path = tmp_path / "counter.py"
    path.write_text(textwrap.dedent("""
        calls = []
        def count(prompts, completions, **columns):
            calls.append(1)
            return [float(len(calls))] * len(completions)
    """))
    first, second = load_reward(f"{path}:count"), load_reward(f"{path}:count")
    assert first(prompts=[], completions=["a"]) == [1.0] and second(prompts=[], completions=["a"]) == [1.0]


def test_rewards_a_function_that_raises_is_named_with_the_file_and_line_it_raised_at(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text("def per_char(text):\n    return 1 / len(text)\n\n\n"
                                            "def brevity(prompts, completions, **columns):\n"
                                            "    return [per_char(text) for text in completions]\n")
    rewards = Rewards.from_spec("verifier, my_rewards.py:brevity*0.1", task=TASK)
    with pytest.raises(GptlabError) as raised:
        rewards.score(PROMPTS, COMPLETIONS, **example_columns(EXAMPLES))  # the last completion is empty
    message = str(raised.value)
    assert message == "reward brevity (my_rewards.py:2) raised ZeroDivisionError: division by zero; fix the function"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no traceback chained to it


def test_rewards_gptlabs_own_verifier_raises_its_errors_unchanged():
    """A failing built-in reward is gptlab's bug, not the user's: its traceback is kept whole."""
    class Broken(Arithmetic):
        def reward(self, example, completion):
            raise KeyError("bug")

    with pytest.raises(KeyError, match="bug"):
        Rewards.from_spec("verifier", task=Broken()).score(PROMPTS, COMPLETIONS, **example_columns(EXAMPLES))
