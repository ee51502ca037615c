"""Tasks whose replies call tools: calls well formed, calculator results checked by a Fraction evaluator of our own,
answers recomputed from the question text, programs run in the real sandbox; the same questions with and without tools."""

import ast
import json
import math
import operator
import re
from fractions import Fraction

import pytest

from gptlab.chat.format import Conversation
from gptlab.chat.tasks import Arithmetic, Compute, Example, WordProblems, get_task
from gptlab.chat.tool_specs import BUILTIN
from gptlab.runtime import GptlabError

TOOL_TASKS = [
    Arithmetic(digits=4, min_digits=3, ops="+-*", tools=1),
    Arithmetic(tools=1, work=0),
    WordProblems(),
    WordProblems(digits=4),
    Compute(),
    Compute(size=1),
]
IDS = [repr(task) for task in TOOL_TASKS]


def sample(task, train: int = 300, test: int = 100) -> list[Example]:
    return task.examples("train", train) + task.examples("test", test)


def calls(conversation: list[dict]) -> list[tuple[str, dict, str]]:
    """(tool name, parsed arguments, result text) of each call in the conversation, in order."""
    found = []
    for call_message, result in zip(conversation[1:-1:2], conversation[2:-1:2]):
        (call,) = call_message["tool_calls"]
        found.append((call["function"]["name"], json.loads(call["function"]["arguments"]), result["content"]))
    return found


BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}  # fmt: skip


def evaluate(expression: str) -> Fraction:
    """The exact value of a calculator expression: whole numbers, + - * / // % **, parentheses, unary minus."""

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            return BINARY[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise AssertionError(f"not calculator arithmetic: {ast.dump(node)}")

    return value(ast.parse(expression, mode="eval").body)


# ---------------------------------------------------------------- every tool task


@pytest.mark.parametrize("task", TOOL_TASKS, ids=IDS)
def test_tool_task_train_and_test_splits_share_no_question(task):
    test = {example.question for example in task.examples("test", task.test_size)}
    assert len(test) == task.test_size
    assert not test & {example.question for example in task.examples("train", 2000)}


@pytest.mark.parametrize("task", TOOL_TASKS, ids=IDS)
def test_tool_task_conversation_calls_a_declared_tool_with_its_required_arguments(task):
    declared = {spec["function"]["name"]: spec["function"]["parameters"] for spec in task.toolbox}
    assert task.offers_tools and all(spec is BUILTIN[name] for name, spec in zip(declared, task.toolbox))
    for example in sample(task):
        conversation = task.conversation(example)
        assert isinstance(conversation, Conversation) and conversation.tools == task.toolbox
        assert conversation[0] == {"role": "user", "content": example.question}
        assert conversation[-1] == {"role": "assistant", "content": example.reply} and len(conversation) % 2 == 0
        assert 1 <= len(calls(conversation)) <= 2
        for number, (call_message, result) in enumerate(zip(conversation[1:-1:2], conversation[2:-1:2]), start=1):
            (call,) = call_message["tool_calls"]
            assert call_message["role"] == "assistant" and call_message["content"] == ""
            assert call["id"] == f"call_{number}" and call["type"] == "function"
            assert result == {"role": "tool", "tool_call_id": call["id"], "content": result["content"]}
            name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
            assert call["function"]["arguments"] == json.dumps(arguments, ensure_ascii=False)
            parameters = declared[name]
            assert set(parameters["required"]) <= set(arguments) <= set(parameters["properties"])
            assert all(isinstance(value, str) and value for value in arguments.values())
            assert result["content"] == result["content"].rstrip() and result["content"]


@pytest.mark.parametrize("task", TOOL_TASKS, ids=IDS)
def test_tool_task_final_message_verifies_and_a_wrong_answer_does_not(task):
    for example in sample(task):
        final = task.conversation(example)[-1]["content"]
        assert task.verify(example, final), example
        wrong = final[: final.rindex(example.answer)] + str(int(example.answer) + 1)
        assert not task.verify(example, wrong), wrong


def test_task_conversation_copies_the_turns_and_examples_stay_hashable_and_cached():
    task = WordProblems()
    first = task.examples("test", 5)
    task.conversation(first[0])[1]["tool_calls"][0]["id"] = "edited"
    assert task.conversation(first[0])[1]["tool_calls"][0]["id"] == "call_1"
    assert task.examples("test", 5) == first and WordProblems().examples("test", 5) == first
    assert len({*first, *task.examples("test", 5)}) == 5  # hashable, equal examples hash alike
    assert task.prompt(first[0]) == [{"role": "user", "content": first[0].question}] and task.prompt(first[0]).tools == task.toolbox
    assert WordProblems(tools=0).conversation(first[0]) == [task.prompt(first[0])[0], {"role": "assistant", "content": first[0].reply}]
    assert not WordProblems(tools=0).offers_tools and type(WordProblems(tools=0).conversation(first[0])) is list


@pytest.mark.parametrize("build", [lambda: Arithmetic(tools=2), lambda: Arithmetic(digits=3, min_digits=4),
                                   lambda: Arithmetic(min_digits=0), lambda: WordProblems(digits=5),
                                   lambda: WordProblems(tools=True), lambda: Compute(size=4), lambda: Compute(tools=-1)])  # fmt: skip
def test_tool_task_bad_option_raises_with_the_value(build):
    with pytest.raises(GptlabError, match="got"):
        build()


# ---------------------------------------------------------------- the calculator's tasks


@pytest.mark.parametrize("task", [task for task in TOOL_TASKS if task.toolbox[0] is BUILTIN["calculator"]], ids=repr)
def test_calculator_call_evaluates_to_its_recorded_result(task):
    for example in sample(task):
        steps = calls(task.conversation(example))
        for name, arguments, result in steps:
            value = evaluate(arguments["expression"])
            assert name == "calculator" and value.denominator == 1 and result == str(value.numerator)
        assert steps[-1][2] == example.answer


def test_arithmetic_with_tools_asks_the_same_questions_as_without():
    def questions(**options) -> list[str]:
        task = Arithmetic(digits=3, ops="+-*", **options)
        return [example.question for example in task.examples("test", task.test_size) + task.examples("train", 300)]

    assert questions(tools=1) == questions(tools=0) == questions(tools=1, work=0) == questions(work=0)
    assert Arithmetic(digits=3, ops="+-*", tools=1).examples("test", 4)[0].reply == "378 * 505 = 190890"


def test_arithmetic_default_draws_are_unchanged_by_the_new_options():
    """Pinned from before min_digits and tools existed: existing splits must not move."""
    assert [e.question for e in Arithmetic(digits=3, ops="+-*").examples("test", 4)] == \
        ["What is 378 * 505?", "What is 755 * 2?", "What is 690 - 215?", "What is 802 - 58?"]  # fmt: skip
    assert [e.question for e in Arithmetic().examples("train", 3)] == ["What is 79 + 3?", "What is 83 + 82?", "What is 41 + 82?"]


@pytest.mark.parametrize(("digits", "min_digits"), [(4, 3), (4, 4), (2, 1)])
def test_arithmetic_min_digits_draws_operands_of_exactly_those_lengths(digits, min_digits):
    task = Arithmetic(digits=digits, min_digits=min_digits, ops="+-*", tools=1)
    lengths = set()
    for example in task.examples("test", task.test_size) + task.examples("train", 500):
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", example.question).groups()
        lengths |= {len(a), len(b)}
        assert int(example.answer) == {"+": operator.add, "-": operator.sub, "*": operator.mul}[op](int(a), int(b)) >= 0
    assert lengths == set(range(min_digits, digits + 1))


WORD_PROBLEMS = {  # each template's question, read back, and its answer from the numbers read
    r"buys (\d+) \w+ at \$(\d+) each and a [\w ]+ for \$(\d+)\. How many dollars .* spend": lambda n, p, e: n * p + e,
    r"has (\d+) \w+ and shares them equally among (\d+) friends": lambda total, k: Fraction(total, k),
    r"^\w+ \w+ (\d+) \w+ every \w+\. How many \w+ does \w+ \w+ in (\d+) \w+\?$": lambda per, time: per * time,
    r"had \$(\d+)\. \w+ spent \$(\d+) on [\w ]+ and \$(\d+) on": lambda money, a, b: money - a - b,
    r"bakes (\d+) trays of (\d+) cookies each and gives away (\d+) cookies": lambda t, k, g: t * k - g,
    r"saves \$(\d+) every week for (\d+) weeks, then buys [\w ]+ for \$(\d+)\.": lambda s, w, c: s * w - c,
    r"buys (\d+) packs of (\d+) \w+ and shares them equally among (\d+) friends": lambda p, k, f: Fraction(p * k, f),
    r"has (\d+) \w+\. \w+ has (\d+) more \w+ than": lambda x, more: x + x + more,
    r"buys (\d+) \w+ at \$(\d+) each and pays with \$(\d+)\.": lambda n, p, bill: bill - n * p,
    r"pays \$(\d+) for (\d+) \w+\. At the same price, how many dollars would (\d+)": lambda t, k, w: Fraction(t, k) * w,
}


@pytest.mark.parametrize("digits", [1, 2, 4])
def test_word_problem_answers_are_recomputed_from_the_question_text(digits):
    task, seen = WordProblems(digits=digits), set()
    for example in sample(task, 600):
        matches = [(pattern, re.search(pattern, example.question)) for pattern in WORD_PROBLEMS]
        ((pattern, match),) = [(pattern, match) for pattern, match in matches if match]
        answer = WORD_PROBLEMS[pattern](*map(int, match.groups()))
        assert answer == int(example.answer) > 0 and Fraction(answer).denominator == 1, example.question
        seen.add(pattern)
    assert seen == set(WORD_PROBLEMS)  # every template is drawn


# ---------------------------------------------------------------- the python tool's task


def digit_sum(base: int, exponent: int) -> int:
    number, total = base**exponent, 0
    while number:
        number, digit = divmod(number, 10)
        total += digit
    return total


def fibonacci(index: int) -> int:
    sequence = [1, 1]
    while len(sequence) < index:
        sequence.append(sequence[-1] + sequence[-2])
    return sequence[index - 1]


COMPUTATIONS = {  # each kind of compute question, read back, and its answer worked out by other means than the task's
    r"What is the sum of the digits of (\d+)\*\*(\d+)\?": digit_sum,
    r"How many primes are there below (\d+)\?": lambda bound: sum(all(n % d for d in range(2, math.isqrt(n) + 1)) for n in range(2, bound)),
    r"What is the (\d+)(?:st|nd|rd|th) Fibonacci number \(1, 1, 2, 3, 5, \.\.\.\)\?": fibonacci,
    r'How many times does the letter "([a-z])" appear in "([a-z]+)"\?': lambda letter, text: text.count(letter),
    r"What is (\d+)\*\*(\d+) mod (\d+)\?": lambda base, exponent, modulus: base**exponent % modulus,
    r"How many digits does (\d+)! \(\d+ factorial\) have\?": lambda n: len(str(math.prod(range(1, n + 1)))),
    r"What is the sum of all the numbers below (\d+) that are multiples of (\d) or (\d)\?":
        lambda bound, a, b: sum(n for n in range(bound) if n % a == 0 or n % b == 0),
}


def test_compute_answers_equal_a_brute_force_reading_of_the_question():
    seen = set()
    for example in sample(Compute(size=1), 150, 50) + sample(Compute(), 30, 20):
        ((pattern, match),) = [(p, m) for p in COMPUTATIONS if (m := re.fullmatch(p, example.question))]
        numbers = [int(group) if group.isdigit() else group for group in match.groups()]
        assert COMPUTATIONS[pattern](*numbers) == int(example.answer), example.question
        seen.add(pattern)
    assert seen == set(COMPUTATIONS)  # every kind is drawn


def test_compute_programs_print_the_recorded_result_in_the_sandbox():
    sandbox = pytest.importorskip("gptlab.eval.sandbox")
    examples = Compute().examples("test", 20) + Compute(size=3).examples("test", 6)
    programs = [arguments["code"] for example in examples for _, arguments, _ in calls(Compute().conversation(example))]
    assert len(programs) == len(examples)
    results = sandbox.run_programs(programs, workers=2)
    for example, program, result in zip(examples, programs, results):
        assert result.passed, (program, result)
        assert result.output.strip() == example.answer == calls(Compute().conversation(example))[0][2]


def test_get_task_builds_the_tool_tasks_from_their_names_and_options():
    assert get_task("word_problems", digits=3) == WordProblems(digits=3)
    assert get_task("compute", tools=0) == Compute(tools=0)
    assert get_task("arithmetic", digits=4, min_digits=3, ops="+*", tools=1).offers_tools


@pytest.mark.parametrize("spec, message", [
    ("arithmetic[digits=3", "write NAME or NAME[option=value,...]"),
    ("arithmetic, spelling", "name one task"),
    ("arithmetic[n=5]", "give the task and its settings only"),
])
def test_task_from_spec_refuses_what_is_not_one_task_with_one_line(spec, message):
    from gptlab.chat.data import task_from_spec

    with pytest.raises(GptlabError, match=re.escape(message)):
        task_from_spec(spec, "--chat-task", sizes="--limit")
