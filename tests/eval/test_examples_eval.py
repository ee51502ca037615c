"""examples/eval/: the local evaluation data a fresh clone evaluates on, read by the loaders the CLI uses.

Each file loads without error and holds what it claims: the right count, the gold answer the question means
(checked against answers written here, independently of the file's indices), code problems that a correct
solution passes and a wrong one fails in the sandbox, GSM8K answers that match their worked solutions. Then
`gptlab eval --suite core`, `--suite chat` and `--judge`'s reader run on the files as the README names them.
"""

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from gptlab.chat.tasks import get_task
from gptlab.cli.main import main
from gptlab.eval.chat_suite import evaluate_chat_suite, mc_question
from gptlab.eval.code_tasks import build_program, code_question
from gptlab.eval.judging import read_alpaca
from gptlab.eval.sandbox import run_program
from gptlab.eval.suite import EvalConfig, evaluate_card
from gptlab.eval.tasks.sources import load_task_records
from gptlab.model import GPT, preset

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "eval"

# the right answer to each science question, by id: the file's gold index must point at this text
SCIENCE_ANSWERS = [
    "the roots", "It melts into liquid water.", "a candle flame", "gravity", "a whale", "carbon dioxide", "a balance",
    "condensation", "copper", "one year", "the heart", "metamorphosis", "the crust", "Earth spinning on its axis", "solid",
    "a consumer", "sunlight", "to take in oxygen", "a steel paper clip", "the rain and temperature outside today", "Mercury",
    "weathering", "to find food and warmer weather", "They expand.", "the ears", "It helps them make seeds.", "blocks light",
    "a lever", "degrees Celsius", "a fish",
]
GSM8K_TEST_ANSWERS = ["27", "270", "10", "280", "22", "10", "8", "4", "60", "190", "110", "21", "5", "6", "12"]
GSM8K_TRAIN_ANSWERS = ["56", "57", "8", "25", "395"]

# a correct solution to each code problem, and a plausible wrong one (an off-by-one, a missed case) the tests must catch
SOLUTIONS = {
    "count_vowels": "def count_vowels(text):\n    return sum(1 for letter in text.lower() if letter in 'aeiou')\n",
    "running_max": ("def running_max(numbers):\n    result = []\n    for number in numbers:\n"
                    "        result.append(number if not result else max(result[-1], number))\n    return result\n"),
    "is_palindrome": ("def is_palindrome(text):\n    kept = [c.lower() for c in text if c.isalnum()]\n"
                      "    return kept == kept[::-1]\n"),
    "second_largest": ("def second_largest(numbers):\n    distinct = sorted(set(numbers))\n"
                       "    return distinct[-2] if len(distinct) > 1 else None\n"),
    "longest_word": ("def longest_word(sentence):\n    best = ''\n    for word in sentence.split():\n"
                     "        if len(word) > len(best):\n            best = word\n    return best\n"),
    "digit_sum": "def digit_sum(n):\n    return sum(int(digit) for digit in str(abs(n)))\n",
    "rotate_left": ("def rotate_left(items, k):\n    if not items:\n        return []\n    k %= len(items)\n"
                    "    return items[k:] + items[:k]\n"),
    "run_length": ("def run_length(text):\n    out, i = [], 0\n    while i < len(text):\n        j = i\n"
                   "        while j < len(text) and text[j] == text[i]:\n            j += 1\n"
                   "        out.append(f'{text[i]}{j - i}')\n        i = j\n    return ''.join(out)\n"),
}
WRONG = {
    "count_vowels": "def count_vowels(text):\n    return sum(1 for letter in text if letter in 'aeiou')\n",  # lower case only
    "running_max": "def running_max(numbers):\n    return sorted(numbers)\n",
    "is_palindrome": "def is_palindrome(text):\n    return text == text[::-1]\n",  # counts spaces and case
    "second_largest": "def second_largest(numbers):\n    return sorted(numbers)[-2] if len(numbers) > 1 else None\n",  # repeats
    "longest_word": "def longest_word(sentence):\n    return max(sentence.split(), key=len, default='x')\n",
    "digit_sum": "def digit_sum(n):\n    return sum(int(digit) for digit in str(n) if digit.isdigit()) + (n < 0)\n",
    "rotate_left": "def rotate_left(items, k):\n    return items[k:] + items[:k]\n",  # k larger than the list
    "run_length": "def run_length(text):\n    return ''.join(f'{c}{text.count(c)}' for c in dict.fromkeys(text))\n",
}


def raw_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------- each file, read by its loader


def test_science_file_loads_as_arc_with_the_gold_answers_it_means():
    data = load_task_records("arc_easy", source=EXAMPLES / "science.jsonl")
    assert len(data.records) == 30 and data.provenance["records"] == 30 and data.provenance["fewshot_split"] == "records"
    assert [record["gold"] for record in data.records] == [row["gold"] for row in raw_lines(EXAMPLES / "science.jsonl")]
    assert [record["choices"][record["gold"]] for record in data.records] == SCIENCE_ANSWERS
    assert len({record["id"] for record in data.records}) == 30
    assert {len(record["choices"]) for record in data.records} == {3, 4, 5}
    assert len(Counter(record["gold"] for record in data.records)) == 4  # the right answer is not always in one place
    for record in data.records:
        assert record["query"] == f"Question: {record['question']}\nAnswer:"  # lm-eval's ARC prompt
        assert len(set(record["choices"])) == len(record["choices"])


def test_science_file_asks_chat_questions_with_the_right_letter():
    records = load_task_records("arc_easy", source=EXAMPLES / "science.jsonl").records
    for index, record in enumerate(records):
        text, n_choices, letter = mc_question(record, index, "arc_easy")
        assert n_choices == len(record["choices"]) and f"{letter}. {SCIENCE_ANSWERS[index]}" in text


def test_passages_file_loads_as_lambada_with_one_last_word_each():
    data = load_task_records("lambada", source=EXAMPLES / "passages.jsonl")
    assert len(data.records) == 30 and len({record["id"] for record in data.records}) == 30
    for record in data.records:
        word = record["continuation"]
        assert word.isalpha() and not record["context"].endswith(" "), record["id"]
        sentences = record["context"].count(". ") + 1
        assert 2 <= sentences <= 4, record["id"]
    # LAMBADA's design: the word is guessable from the passage; most of ours name it earlier in the passage
    assert sum(record["continuation"] in record["context"] for record in data.records) >= 25


def test_code_file_loads_as_humaneval_with_a_check_of_the_entry_point():
    records = load_task_records("humaneval", source=EXAMPLES / "code.jsonl").records
    assert len(records) == 8 and sorted(record["entry_point"] for record in records) == sorted(SOLUTIONS)
    for record in records:
        assert record["prompt"].rstrip().endswith('"""') and f"def {record['entry_point']}(" in record["prompt"]
        assert record["tests"].startswith("def check(candidate):") and record["tests"].endswith(f"check({record['entry_point']})")


@pytest.mark.parametrize("entry_point", sorted(SOLUTIONS))
def test_code_problem_passes_a_correct_solution_and_fails_a_wrong_one(entry_point):
    records = {record["entry_point"]: record for record in load_task_records("humaneval", source=EXAMPLES / "code.jsonl").records}
    record = records[entry_point]
    right = run_program(build_program("humaneval", record, SOLUTIONS[entry_point]), timeout=20)
    assert right.status == "passed", right.output
    wrong = run_program(build_program("humaneval", record, WRONG[entry_point]), timeout=20)
    assert wrong.status == "failed" and "AssertionError" in wrong.output, wrong.output


def test_gsm8k_folder_reads_as_the_chat_task_with_answers_from_the_worked_solutions(monkeypatch):
    monkeypatch.chdir(REPO)  # the README's relative form
    task = get_task("gsm8k", source="hf:examples/eval/gsm8k")
    assert task.test_size == 15 and task.train_size == 5
    assert task.skipped("test") == 0 and task.skipped("train") == 0
    assert [example.answer for example in task.examples("test", 15)] == GSM8K_TEST_ANSWERS
    assert [example.answer for example in task.examples("train", 5)] == GSM8K_TRAIN_ANSWERS
    for example in task.examples("test", 15) + task.examples("train", 5):
        assert example.reply.endswith(f"The answer is {example.answer}.") and "<<" not in example.reply
        assert task.verify(example, example.reply) and not task.verify(example, "#### 100000")


def test_instructions_file_reads_as_alpaca_eval_references():
    rows = read_alpaca(EXAMPLES / "instructions.jsonl")
    assert len(rows) == 12 and len({row["instruction"] for row in rows}) == 12
    assert {row["generator"] for row in rows} == {"gptlab-examples"} and {row["dataset"] for row in rows} == {"gptlab-examples"}
    assert all(len(row["output"].split()) >= 5 for row in rows)
    assert read_alpaca(EXAMPLES / "instructions.jsonl", limit=3) == rows[:3]


def test_examples_folder_is_small():
    assert sum(path.stat().st_size for path in EXAMPLES.rglob("*") if path.is_file()) < 100_000


# ---------------------------------------------------------------- the suites on the files


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_core_suite_scores_the_science_and_passages_files_with_shots_from_the_others():
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny")).eval()  # vocab 512 holds the 256 byte ids
    config = EvalConfig(suite="core", tasks=("arc_easy", "lambada"),
                        task_data={"arc_easy": str(EXAMPLES / "science.jsonl"), "lambada": str(EXAMPLES / "passages.jsonl")})
    card, examples = evaluate_card(model, config, encode=byte_ids)
    rows = {row.task: row for row in card.rows}
    assert (rows["arc_easy"].n, rows["arc_easy"].shots, rows["lambada"].n, rows["lambada"].shots) == (30, 10, 30, 0)
    for example in examples["arc_easy"]:
        assert len(example["fewshot_ids"]) == 10 and example["id"] not in example["fewshot_ids"]  # never its own answer
    assert card.settings["data"]["arc_easy"]["sha256"] and len(card.aggregates) == 1


class Answers:
    """A stand-in for the chat model: the reply to each question looked up in a table, "" when it has none."""

    def __init__(self, replies: dict[str, str]):
        self.replies = replies

    def greedy(self, questions, *, max_new_tokens):
        return [self.replies.get(question, "") for question in questions]


def chat_replies(right: bool) -> tuple[dict[str, str], dict]:
    """Every example file's chat question with a right (or a wrong) reply, and the suite's sources for them."""
    science = load_task_records("arc_easy", source=EXAMPLES / "science.jsonl").records
    code = load_task_records("humaneval", source=EXAMPLES / "code.jsonl").records
    gsm8k = get_task("gsm8k", source=f"hf:{EXAMPLES / 'gsm8k'}")
    replies = {}
    for index, record in enumerate(science):
        text, n_choices, letter = mc_question(record, index, "arc_easy")
        replies[text] = f"The answer is {letter if right else 'ABCDE'[(record['gold'] + 1) % n_choices]}."
    for example in gsm8k.examples("test", 15):
        replies[example.question] = example.reply if right else f"{example.reply}\n#### {int(example.answer) + 1}"
    for record in code:
        solution = (SOLUTIONS if right else WRONG)[record["entry_point"]]
        replies[code_question("humaneval", record)] = f"Here it is:\n```python\n{solution}```"
    return replies, {"arc_easy": science, "gsm8k": f"hf:{EXAMPLES / 'gsm8k'}", "humaneval": code}


@pytest.mark.parametrize("right", [True, False])
def test_chat_suite_on_the_files_scores_right_replies_1_and_wrong_ones_0(right):
    replies, sources = chat_replies(right)
    rows, examples, chatcore = evaluate_chat_suite(None, None, ["arc_easy", "gsm8k", "humaneval"], sources=sources,
                                                   responder=Answers(replies), code_timeout=20)
    assert [(row.task, row.n) for row in rows] == [("arc_easy", 30), ("gsm8k", 15), ("humaneval", 8)]
    assert [row.score for row in rows] == [float(right)] * 3
    chance = sum(1 / len(record["choices"]) for record in sources["arc_easy"]) / 30  # 3 to 5 options: about 0.25
    # ChatCORE: the mean centred score; all wrong is -chance / (1 - chance) on ARC and 0 on the open-ended tasks
    assert chatcore.score == pytest.approx(1.0 if right else -chance / (1 - chance) / 3)
    if not right:
        assert {example["status"] for example in examples if example["task"] == "humaneval"} == {"failed"}


# ---------------------------------------------------------------- the README's commands, from the repository root


def test_cli_eval_core_and_chat_suites_run_on_the_example_files(chat_model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the paths as the README writes them
    core = ["eval", str(chat_model), "--suite", "core", "--tasks", "arc_easy,lambada", "--task-data", "arc_easy=examples/eval/science.jsonl",
            "--task-data", "lambada=examples/eval/passages.jsonl", "--limit", "3", "--device", "cpu", "--out", str(tmp_path / "core")]
    assert main(core) == 0
    chat = ["eval", str(chat_model), "--suite", "chat", "--tasks", "arc_easy,gsm8k,humaneval",
            "--task-data", "arc_easy=examples/eval/science.jsonl", "--task-data", "gsm8k=hf:examples/eval/gsm8k",
            "--task-data", "humaneval=examples/eval/code.jsonl", "--limit", "2", "--device", "cpu", "--out", str(tmp_path / "chat")]
    assert main(chat) == 0
    for folder, tasks in (("core", ["arc_easy", "lambada"]), ("chat", ["arc_easy", "gsm8k", "humaneval"])):
        card = json.loads((tmp_path / folder / "eval.json").read_text())
        assert [row["task"] for row in card["rows"]] == tasks
        assert {row["n"] for row in card["rows"]} == {3 if folder == "core" else 2}
    assert "ChatCORE" in capsys.readouterr().out


class PreferA(BaseHTTPRequestHandler):
    """A judge that always prefers answer A and grades 7: one reply both verdict parsers read ("[[A]]", "[[7]]")."""

    prompts: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.prompts.append(body["messages"][-1]["content"])
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Verdict: [[A]]. Rating: [[7]]"},
                              "finish_reason": "stop"}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_cli_eval_judge_runs_on_the_instructions_file_and_sends_its_references(chat_model, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("GPTLAB_JUDGE_API_KEY", raising=False)
    handler = type("Judge", (PreferA,), {"prompts": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        assert main(["eval", str(chat_model), "--judge", f"http://127.0.0.1:{server.server_address[1]}", "--alpaca",
                     "examples/eval/instructions.jsonl", "--limit", "2", "--device", "cpu", "--out", str(tmp_path / "judge")]) == 0
    finally:
        server.shutdown()
        server.server_close()
    rows = {row["metric"]: row for row in json.loads((tmp_path / "judge" / "eval.json").read_text())["rows"]}
    # always "A": the model wins when shown first and loses when shown second, so every pair is a draw (0.5)
    assert (rows["win_rate"]["score"], rows["win_rate"]["n"], rows["grade_1_10"]["score"]) == (0.5, 2, 7.0)
    references = read_alpaca(EXAMPLES / "instructions.jsonl", limit=2)
    assert len(handler.prompts) == 6  # 2 instructions x 2 orders, then 2 grades
    for reference in references:
        assert sum(reference["output"] in prompt for prompt in handler.prompts) == 2
