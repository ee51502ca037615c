"""The chat suite: letters read as models write them, tasks run end to end on the tiny chat model, code run and counted."""

import json
import math
import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptlab.chat import ChatFormat
from gptlab.chat.tasks import get_task
from gptlab.eval import chat_suite
from gptlab.eval.chat import respond
from gptlab.eval.chat_suite import ChatResponder, evaluate_chat_suite, mc_question, parse_letter
from gptlab.eval.code_tasks import build_program, code_question, extract_code
from gptlab.eval.stats import mean_pass_at_k
from gptlab.model.io import load_model
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

from .conftest import CHAT_TWO_RANKS

# ---------------------------------------------------------------- the letter parser

READ = [
    ("B", "B"), ("(B)", "B"), ("B.", "B"), ("B) Paris", "B"), ("The answer is B.", "B"), ("Answer: B", "B"),
    ("**B**", "B"), ("I think (c)", "C"), ("The answer is: (b)", "B"), ("**Answer:** C", "C"), ("Answer: B) Paris", "B"),
    ("c)", "C"), ("b.", "B"), ("A. Paris", "A"), ("(A) is wrong; the answer is D.", "D"), ("Option C", "C"),
    ("The correct choice is d.", "D"), ("ANSWER: b", "B"), ("Between A and B, the answer is B", "B"),
    ("The answer is A because Paris is the capital.", "A"), ("D\n\nParis is the capital of France.", "D"),
]
UNREAD = [
    "A or B", "I don't know", "E", "the answer is a bit unclear", "answer: a dog", "I think it is b", "(A) or (C)",
    "A dog is an animal. B", "", "Paris", "The answer is 42.",
]


@pytest.mark.parametrize(("response", "letter"), READ)
def test_parse_letter_reads_the_forms_models_write(response, letter):
    assert parse_letter(response, 4) == letter


@pytest.mark.parametrize("response", UNREAD)
def test_parse_letter_returns_none_for_no_letter_or_several(response):
    assert parse_letter(response, 4) is None


def test_parse_letter_ignores_letters_beyond_the_options():
    assert parse_letter("E", 5) == "E" and parse_letter("E", 4) is None and parse_letter("The answer is C", 3) == "C"


FORMS = ["{L}", "({L})", "{L}.", "{L})", "**{L}**", "The answer is {L}.", "Answer: {L}", "({l})", "{l})", "answer: {l}."]
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=8)  # no word is a lone letter
NOISE = st.lists(st.tuples(WORDS, st.sampled_from([" ", ", ", ". ", "! ", "\n", "? "])), max_size=6).map(
    lambda parts: "".join(word + gap for word, gap in parts))


@given(n_choices=st.integers(2, 10), data=st.data(), form=st.sampled_from(FORMS), before=NOISE, after=NOISE)
def test_parse_letter_finds_one_letter_in_any_noise_that_names_no_other_option(n_choices, data, form, before, after):
    letter = data.draw(st.sampled_from("ABCDEFGHIJ"[:n_choices]))
    response = f"{before}{form.format(L=letter, l=letter.lower())} {after}".strip()
    assert parse_letter(response, n_choices) == letter


def test_mc_question_lists_lettered_options_and_names_the_right_letter():
    text, n, gold = mc_question({"question": "Capital of France?", "choices": ["Rome", "Paris", "Oslo"], "gold": 1}, 0, "arc_easy")
    assert text == "Capital of France?\n\nA. Rome\nB. Paris\nC. Oslo\n\nAnswer with the letter of the right option (A, B or C)."
    assert (n, gold) == (3, "B")
    with pytest.raises(GptlabError, match="raw 'question'"):
        mc_question({"query": "Question: x\nAnswer:", "choices": ["a", "b"], "gold": 0}, 7, "mmlu")


# ---------------------------------------------------------------- code: extraction and programs

HUMANEVAL = [
    {"id": "HumanEval/0", "prompt": 'import math\n\n\ndef add(a, b):\n    """Sum of a and b."""\n',
     "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n\ncheck(add)", "entry_point": "add"},
    {"id": "HumanEval/1", "prompt": 'def double(x):\n    """Twice x."""\n',
     "tests": "def check(candidate):\n    assert candidate(4) == 8\n\ncheck(double)", "entry_point": "double"},
]
RIGHT_ADD = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
WRONG_ADD = "```python\ndef add(a, b):\n    return a - b\n```"
LOOPING_ADD = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
BODY_ONLY_DOUBLE = "return 2 * x"


def test_extract_code_takes_the_first_fenced_block_else_the_reply():
    assert extract_code(RIGHT_ADD) == "def add(a, b):\n    return a + b"
    assert extract_code("```\nx = 1\n```\n```python\ny = 2\n```") == "x = 1"
    assert extract_code("```python\nx = 1\n") == "x = 1"  # the model ran out of tokens before closing the fence
    assert extract_code("    return a + b\n") == "    return a + b"


def test_build_program_joins_a_body_to_the_prompt_and_a_function_after_it():
    record = HUMANEVAL[1]
    assert build_program("humaneval", record, "return 2 * x") == record["prompt"] + "    return 2 * x\n\n\n" + record["tests"] + "\n"
    assert build_program("humaneval", record, "    return 2 * x").startswith(record["prompt"] + "    return 2 * x")
    whole = build_program("humaneval", HUMANEVAL[0], extract_code(RIGHT_ADD))
    assert whole.startswith(HUMANEVAL[0]["prompt"] + "\ndef add(a, b):\n    return a + b")  # the prompt's import stays
    assert build_program("mbpp", {"prompt": "Write add.", "tests": "assert add(1, 2) == 3"}, "def add(a, b): return a + b") == (
        "def add(a, b): return a + b\n\n\nassert add(1, 2) == 3\n")
    assert "```python\n" + HUMANEVAL[0]["prompt"].rstrip() + "\n```" in code_question("humaneval", HUMANEVAL[0])


class Scripted:
    """A stand-in for the model: replies looked up by question; sampled replies by question too, with the seeds kept."""

    def __init__(self, greedy: dict, sampled: dict | None = None):
        self.replies, self.sampled, self.seeds = greedy, sampled or {}, []

    def greedy(self, questions, *, max_new_tokens):
        return [self.replies.get(question, "") for question in questions]

    def sample(self, question, n, *, seed, temperature, max_new_tokens):
        self.seeds.append((question, seed, temperature))
        return self.sampled[question][:n]


class Result:
    def __init__(self, passed, status, output=""):
        self.passed, self.status, self.output = passed, status, output


def subprocess_runner(program: str) -> Result:
    """Runs a program in a plain subprocess with a 1-second limit: enough to tell pass, fail and a loop apart in a test."""
    try:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=1)
    except subprocess.TimeoutExpired:
        return Result(False, "timeout")
    return Result(done.returncode == 0, "passed" if done.returncode == 0 else "failed", done.stderr)


@pytest.mark.parametrize(("reply", "status"), [(RIGHT_ADD, "passed"), (WRONG_ADD, "failed"), (LOOPING_ADD, "timeout")])
def test_code_replies_are_run_and_counted_by_status(reply, status):
    responder = Scripted({code_question("humaneval", HUMANEVAL[0]): reply, code_question("humaneval", HUMANEVAL[1]): BODY_ONLY_DOUBLE})
    rows, examples, _ = evaluate_chat_suite(None, None, ["humaneval"], sources={"humaneval": HUMANEVAL}, responder=responder,
                                            runner=subprocess_runner)
    assert [example["status"] for example in examples] == [status, "passed"]  # the body-only reply joined to its prompt passes
    assert [example["correct"] for example in examples] == [status == "passed", True]
    (row,) = rows
    assert (row.metric, row.n, row.score) == ("pass@1", 2, (1 + (status == "passed")) / 2)
    assert row.note == ("greedy; passed 2" if status == "passed" else f"greedy; passed 1, {status} 1")


def test_pass_at_k_from_samples_matches_the_estimator_on_known_counts():
    right, wrong = RIGHT_ADD, WRONG_ADD
    questions = [code_question("humaneval", record) for record in HUMANEVAL]
    sampled = {questions[0]: [right, wrong, right, wrong, right], questions[1]: ["return x", "return x", "return x", "return 3", "return 0"]}
    responder = Scripted({questions[0]: right, questions[1]: BODY_ONLY_DOUBLE}, sampled)
    rows, examples, _ = evaluate_chat_suite(None, None, ["humaneval"], sources={"humaneval": HUMANEVAL}, samples=5, k=(1, 2),
                                            responder=responder, runner=subprocess_runner, seed=7)
    assert [(e["samples_right"], len(e["sample_statuses"])) for e in examples] == [(3, 5), (0, 5)]
    greedy, at1, at2 = rows
    assert (greedy.metric, greedy.score) == ("pass@1", 1.0)
    assert at1.metric.startswith("pass@1 (n=5") and at1.score == pytest.approx((3 / 5 + 0) / 2)
    assert at2.score == pytest.approx((1 - math.comb(2, 2) / math.comb(5, 2) + 0) / 2)  # 1 - C(n-c, k) / C(n, k) = 0.9 and 0
    assert at2.score == pytest.approx(mean_pass_at_k([(5, 3), (5, 0)], 2))
    seeds = [seed for _, seed, _ in responder.seeds]
    assert len(set(seeds)) == 2 and {temperature for _, _, temperature in responder.seeds} == {0.8}
    again = Scripted(responder.replies, sampled)
    evaluate_chat_suite(None, None, ["humaneval"], sources={"humaneval": HUMANEVAL[1:]}, samples=5, k=(2,), responder=again,
                        runner=subprocess_runner, seed=7)
    assert again.seeds[0][1] == seeds[1]  # a problem's samples do not depend on which others are evaluated


def test_chat_responder_samples_repeat_with_the_seed_and_differ_between_seeds(model_and_chat):
    model, chat = model_and_chat
    responder = ChatResponder(model, chat, batch_size=2)
    first = responder.sample("Write a function.", 3, seed=5, temperature=0.8, max_new_tokens=12)
    assert len(first) == 3 and first == responder.sample("Write a function.", 3, seed=5, temperature=0.8, max_new_tokens=12)
    assert first != responder.sample("Write a function.", 3, seed=6, temperature=0.8, max_new_tokens=12)


# ---------------------------------------------------------------- end to end on the tiny chat model

ARC = [
    {"id": "arc/0", "question": "Which gas do plants take in?", "choices": ["oxygen", "carbon dioxide", "helium", "neon"], "gold": 1},
    {"id": "arc/1", "question": "What melts ice?", "choices": ["heat", "cold", "dark"], "gold": 0},
    {"id": "arc/2", "question": "Which is a mammal?", "choices": ["shark", "trout", "whale", "crab", "squid"], "gold": 2},
    {"id": "arc/3", "question": "What do bees make?", "choices": ["milk", "silk", "wax", "honey"], "gold": 3},
]
GSM8K_TEST = [{"question": "What is 6 times 7?", "answer": "6*7 = <<6*7=42>>42\n#### 42"},
              {"question": "What is 10 minus 4?", "answer": "10-4 = <<10-4=6>>6\n#### 6"}]


@pytest.fixture(scope="module")
def model_and_chat(chat_model):
    return load_model(chat_model), ChatFormat(Tokenizer.load(chat_model / "tokenizer"))


def gsm8k_source(folder) -> str:
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in GSM8K_TEST))
    return f"hf:{folder}"


def test_chat_suite_end_to_end_verdicts_equal_the_parser_and_verifiers_on_the_actual_responses(model_and_chat, tmp_path):
    pytest.importorskip("datasets")
    model, chat = model_and_chat
    programs = []

    def runner(program):
        programs.append(program)
        return Result(False, "failed", "AssertionError")

    rows, examples, chatcore = evaluate_chat_suite(
        model, chat, ["arc_easy", "gsm8k", "spelling", "humaneval"], limit=3, batch_size=2, max_new_tokens=16, runner=runner,
        sources={"arc_easy": ARC, "gsm8k": gsm8k_source(tmp_path / "gsm8k"), "humaneval": HUMANEVAL})
    assert [(row.task, row.metric, row.n) for row in rows] == [("arc_easy", "acc", 3), ("gsm8k", "acc", 2), ("spelling", "acc", 3),
                                                              ("humaneval", "pass@1", 2)]
    assert all(row.low <= row.score <= row.high for row in rows)
    assert rows[0].chance == pytest.approx((1 / 4 + 1 / 3 + 1 / 5) / 3) and rows[1].chance == 0
    arc = [e for e in examples if e["task"] == "arc_easy"]
    questions = [mc_question(record, i, "arc_easy")[0] for i, record in enumerate(ARC[:3])]
    assert [e["response"] for e in arc] == respond(model, chat, questions, max_new_tokens=16)  # the model's own greedy replies
    assert [e["letter"] for e in arc] == [parse_letter(e["response"], e["choices"]) for e in arc]
    assert [e["correct"] for e in arc] == [e["letter"] == "ABC"[record["gold"]] for e, record in zip(arc, ARC)]
    assert rows[0].score == sum(e["correct"] for e in arc) / 3
    for name in ("gsm8k", "spelling"):
        task = get_task(name, source=f"hf:{tmp_path / 'gsm8k'}") if name == "gsm8k" else get_task(name)
        graded = [e for e in examples if e["task"] == name]
        expected = task.examples("test", len(graded))
        assert [e["correct"] for e in graded] == [task.verify(x, e["response"]) for x, e in zip(expected, graded)]
    assert len(programs) == 2 and all(record["tests"] in program for record, program in zip(HUMANEVAL, programs))
    assert [e["status"] for e in examples if e["task"] == "humaneval"] == ["failed", "failed"]
    assert chatcore.tasks == ("arc_easy", "gsm8k", "spelling", "humaneval")
    assert chatcore.score == pytest.approx(sum(row.centred for row in rows) / 4)


def test_chatcore_is_nanochats_mean_centred_accuracy_on_fixed_numbers():
    arc = [{**record, "choices": record["choices"][:3] + ["x"] * (4 - len(record["choices"][:3])), "gold": record["gold"] % 3}
           for record in ARC]  # four options each: chance 0.25
    letters = "ABCD"
    replies = {mc_question(r, i, "arc_easy")[0]: f"The answer is {letters[r['gold']]}." for i, r in enumerate(arc[:3])}
    replies[mc_question(arc[3], 3, "arc_easy")[0]] = "(A) or (B)"  # 3 of 4 right: acc 0.75
    spelling = get_task("spelling").examples("test", 4)
    replies.update({example.question: example.reply for example in spelling[:2]})  # 2 of 4 right: acc 0.5
    replies[code_question("humaneval", HUMANEVAL[0])] = RIGHT_ADD  # 1 of 2 passes: pass@1 0.5
    rows, _, chatcore = evaluate_chat_suite(None, None, ["arc_easy", "spelling", "humaneval"], limit=4, responder=Scripted(replies),
                                            sources={"arc_easy": arc, "humaneval": HUMANEVAL}, runner=subprocess_runner)
    assert [row.score for row in rows] == [0.75, 0.5, 0.5] and rows[0].chance == 0.25
    # nanochat's chat_eval: centred = (acc - baseline) / (1 - baseline), baseline 0.25 for ARC and 0 for the open-ended tasks
    assert chatcore.score == pytest.approx(((0.75 - 0.25) / 0.75 + 0.5 + 0.5) / 3)
    assert rows[0].note == "1 answers named no single letter"


def test_ranks_share_the_examples_and_every_rank_gets_them_all(monkeypatch):
    import torch.distributed as dist

    items, calls = list("abcdefg"), []

    def run(mine, *, indices):
        calls.append(list(indices))
        return [{"index": i, "item": item} for i, item in zip(indices, mine)]

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, mine: out.__setitem__(
        slice(None), [run(items[0::3], indices=range(0, 7, 3)), mine, run(items[2::3], indices=range(2, 7, 3))]))
    result = chat_suite._shared(items, run)
    assert calls[0] == [1, 4]  # this rank answered its share only
    assert [(e["index"], e["item"]) for e in result] == list(enumerate(items))


@pytest.mark.parametrize(("options", "message"), [
    ({"tasks": ["arc_easy", "nope"]}, "unknown chat task 'nope'"),
    ({"tasks": ["humaneval"], "samples": 2, "k": (5,)}, "pass@5 needs at least 5 samples"),
    ({"tasks": ["humaneval"], "k": (10,)}, "pass samples=10 or more"),
    ({"tasks": ["spelling"], "sources": {"spelling": "x.jsonl"}}, "spelling is generated"),
    ({"tasks": ["mmlu"], "sources": {"arc_easy": ARC}}, "not among the tasks"),
    ({"tasks": ["mmlu"], "limit": 0}, "limit must be a whole number of at least 1"),
    ({"tasks": ["mmlu"], "sources": {"mmlu": [{"query": "Q\nAnswer:", "choices": ["A", "B"], "gold": 0}]}}, "raw 'question'"),
    ({"tasks": ["humaneval"], "sources": {"humaneval": [{"id": "x", "prompt": "def f():\n"}]}}, "no text field 'tests'"),
])
def test_chat_suite_bad_options_raise_one_clear_error(options, message):
    tasks = options.pop("tasks")
    with pytest.raises(GptlabError, match=message):
        evaluate_chat_suite(None, None, tasks, responder=Scripted({}), runner=subprocess_runner, **options)


def test_chat_suite_reads_its_data_through_the_task_loaders(tmp_path):
    """MMLU from its CSV folder keeps the option texts (the lettered choices are the base suite's); HumanEval from its native JSONL."""
    (tmp_path / "mmlu" / "test").mkdir(parents=True)
    (tmp_path / "mmlu" / "test" / "astronomy_test.csv").write_text(
        '"What orbits the Earth?",Mars,The Moon,The Sun,Venus,B\n"Which is a star?",The Sun,Mars,Io,Titan,A\n')
    native = {"task_id": "HumanEval/0", "prompt": HUMANEVAL[1]["prompt"], "entry_point": "double",
              "test": "def check(candidate):\n    assert candidate(4) == 8\n", "canonical_solution": "    return 2 * x\n"}
    (tmp_path / "humaneval.jsonl").write_text(json.dumps(native) + "\n")
    first = mc_question({"question": "What orbits the Earth?", "choices": ["Mars", "The Moon", "The Sun", "Venus"], "gold": 1}, 0, "mmlu")[0]
    humaneval = {"prompt": native["prompt"], "entry_point": "double"}
    responder = Scripted({first: "**B**", code_question("humaneval", humaneval): "```python\ndef double(x):\n    return x + x\n```"})
    rows, examples, _ = evaluate_chat_suite(None, None, ["mmlu", "humaneval"], responder=responder, runner=subprocess_runner,
                                            sources={"mmlu": tmp_path / "mmlu", "humaneval": str(tmp_path / "humaneval.jsonl")})
    assert [(row.task, row.score, row.n, row.chance) for row in rows] == [("mmlu", 0.5, 2, 0.25), ("humaneval", 1.0, 1, 0.0)]
    assert [e["letter"] for e in examples if e["task"] == "mmlu"] == ["B", None]


FORKING_ADD = "```python\nimport os\n\ndef add(a, b):\n    os.system('true')\n    return a + b\n```"
GREEDY_ADD = "```python\ndef add(a, b):\n    hoard = bytearray(1 << 40)\n    return a + b\n```"  # a terabyte: far past the limit


def test_code_in_the_real_sandbox_passes_fails_times_out_runs_out_of_memory_and_is_blocked_each_a_failure():
    records = [{**HUMANEVAL[0], "id": f"HumanEval/{i}"} for i in range(5)]
    replies = [RIGHT_ADD, WRONG_ADD, LOOPING_ADD, FORKING_ADD, GREEDY_ADD]

    class ByRecord(Scripted):  # the records share a question: answer them in turn
        def greedy(self, questions, *, max_new_tokens):
            return replies[: len(questions)]

    rows, examples, _ = evaluate_chat_suite(None, None, ["humaneval"], sources={"humaneval": records}, responder=ByRecord({}),
                                            code_timeout=1.5)
    assert [e["status"] for e in examples] == ["passed", "failed", "timeout", "blocked", "memory"]
    assert [e["correct"] for e in examples] == [True, False, False, False, False]
    assert rows[0].score == 0.2 and rows[0].note == "greedy; passed 1, failed 1, timeout 1, memory 1, blocked 1"


SUITE_ON_TWO_RANKS = """
import json, sys
import torch.distributed as dist
from pathlib import Path
from gptlab.chat import ChatFormat
from gptlab.eval.chat_suite import evaluate_chat_suite
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer
dist.init_process_group("gloo")
folder = Path(sys.argv[1])
rows, examples, aggregate = evaluate_chat_suite(load_model(folder), ChatFormat(Tokenizer.load(folder / "tokenizer")), ["spelling"],
                                                limit=5, batch_size=2, max_new_tokens=8)
result = {"rows": [row.to_dict() for row in rows], "responses": [e["response"] for e in examples]}
sys.stdout.write(f"RESULT {dist.get_rank()} {json.dumps(result)}\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


@CHAT_TWO_RANKS
def test_chat_suite_on_two_gloo_ranks_equals_one_process(chat_model, chat_two_ranks):
    """Rank r answers questions r::2; both ranks return the single process's rows and every response, in order."""
    from gptlab.model.io import load_model
    from gptlab.tokenizer import Tokenizer

    from .two_ranks import ranks_stdout

    rows, examples, _ = evaluate_chat_suite(load_model(chat_model), ChatFormat(Tokenizer.load(chat_model / "tokenizer")),
                                            ["spelling"], limit=5, batch_size=2, max_new_tokens=8)
    single = {"rows": [row.to_dict() for row in rows], "responses": [e["response"] for e in examples]}
    stdout = ranks_stdout(chat_two_ranks, "suite")
    results = sorted(re.findall(r"^RESULT (\d) (.*)$", stdout, flags=re.MULTILINE))
    assert [rank for rank, _ in results] == ["0", "1"]
    assert [json.loads(text) for _, text in results] == [json.loads(json.dumps(single))] * 2
