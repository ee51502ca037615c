"""Code tasks of the chat suite (HumanEval, MBPP): the model writes a function, the sandbox runs it against the tests.

    record   {"id": "HumanEval/0", "prompt": "def add(a, b):\\n    \\"\\"\\"Sum.\\"\\"\\"\\n", "tests": "...\\ncheck(add)",
              "entry_point": "add"}
    question "Complete this Python function. Reply with the whole function in a ```python block.\\n\\n```python\\ndef add..."
    reply    "Sure:\\n```python\\ndef add(a, b):\\n    return a + b\\n```"  -> code "def add(a, b):\\n    return a + b"
    program  prompt + code + tests     (run by gptlab.eval.sandbox; exit code 0 is a pass)

The code is the first ```python (or bare ```) fenced block of the reply, else the whole reply, as
nanochat's tasks/humaneval.py extracts it. HumanEval's prompt is the signature and docstring: when the
code defines the entry point, the program is the prompt then the code (the model's definition replaces
the prompt's stub, and the prompt's imports and helper functions stay in scope); when the reply is only
the body, it is joined to the prompt, indented under the signature if the model left it flush. MBPP's
prompt is the task in words with its tests listed, so its program is the code alone. Then the record's
tests run (the loaders end HumanEval's with `check(entry_point)`, MBPP's are its asserts).

pass@1 is greedy: one reply per problem, right or wrong. pass@k draws `samples` replies per problem at
temperature 0.8 (Chen et al. 2021 sample at 0.8 for pass@100; nanochat's chat_eval samples the same
way), seeded per problem from the run's seed and the problem's id, so the samples do not depend on
which rank drew them or on --limit; then the unbiased estimator (gptlab.eval.stats.pass_at_k) is
averaged over problems. A run stopped for time, memory or a blocked call is a failure; every status
is counted in the row's note and kept in the per-example records.

Not here: the sandbox (gptlab.eval.sandbox), generating replies (gptlab.eval.chat_suite's responder),
reading the datasets (gptlab.eval.tasks.sources).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Sequence

from gptlab.eval.card import CardRow, mean_row, proportion_row
from gptlab.eval.stats import mean_pass_at_k, pass_at_k
from gptlab.runtime import GptlabError

CODE_TASKS = ("humaneval", "mbpp")
SAMPLE_TEMPERATURE = 0.8  # Chen et al. 2021, section 2.3: the temperature for pass@k with k > 1
FENCED = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL | re.IGNORECASE)
OUTPUT_KEPT = 400  # characters of a run's output kept in its record: enough to see the error
STATUSES = ("passed", "failed", "timeout", "memory", "blocked", "error")

Runner = Callable[[str], object]  # source -> a result with .passed and .status (gptlab.eval.sandbox.SandboxResult)


def extract_code(reply: str) -> str:
    """The first fenced code block of the reply, else the reply itself: "Here:\\n```python\\nx = 1\\n```" -> "x = 1"."""
    found = FENCED.search(reply)
    code = found.group(1) if found else reply
    return code.strip("\n").rstrip()


def defines(code: str, name: str) -> bool:
    """Whether the code defines the function `name` at its top level."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def build_program(task: str, record: dict, code: str) -> str:
    """The program the sandbox runs for one reply: the function (joined to the prompt for HumanEval), then the tests."""
    if task == "humaneval":
        prompt = record["prompt"] if record["prompt"].endswith("\n") else record["prompt"] + "\n"
        if defines(code, record["entry_point"]):
            function = prompt + "\n" + code  # the later def wins; the prompt's imports and helpers stay
        else:
            function = prompt + indent_body(code)
    else:
        function = code
    return f"{function}\n\n\n{record['tests'].rstrip()}\n"


def indent_body(code: str) -> str:
    """A reply that is only a function body, indented under the signature if it was written flush left."""
    lines = code.split("\n")
    first = next((line for line in lines if line.strip()), "")
    if first[:1] in (" ", "\t"):
        return code
    return "\n".join("    " + line if line.strip() else line for line in lines)


def code_question(task: str, record: dict) -> str:
    """The user's turn for a code problem."""
    if task == "humaneval":
        return ("Complete this Python function. Reply with the whole function in a ```python block.\n\n"
                f"```python\n{record['prompt'].rstrip()}\n```")
    return f"{record['prompt'].rstrip()}\n\nReply with the Python function in a ```python block."


def check_code_record(task: str, record: dict, position: int) -> None:
    missing = [key for key in ("prompt", "tests", "entry_point") if not isinstance(record.get(key), str)]
    if missing:
        raise GptlabError(f"{task} record {position} ({record.get('id', 'no id')}) has no text field {missing[0]!r}: "
                          "code records need prompt, tests and entry_point (gptlab.eval.tasks.sources makes them)")


def sample_seed(seed: int, task: str, record_id: str) -> int:
    """A problem's sampling seed: fixed by the run's seed and the problem, whatever rank or batch draws it."""
    return random.Random(f"gptlab/chat_suite/{seed}/{task}/{record_id}").getrandbits(62)  # a str seed hashes with SHA-512


def run_code_task(task: str, records: Sequence[dict], responder, *, indices: Sequence[int], samples: int = 1, seed: int = 0,
                  max_new_tokens: int = 256, runner: Runner | None = None, timeout: float = 10.0) -> list[dict]:
    """One per-example record per problem: the greedy reply's verdict and, with samples > 1, the sampled replies' verdicts."""
    for position, record in zip(indices, records):
        check_code_record(task, record, position)
    questions = [code_question(task, record) for record in records]
    greedy = responder.greedy(questions, max_new_tokens=max_new_tokens) if questions else []
    sampled = [responder.sample(question, samples, seed=sample_seed(seed, task, str(record.get("id", index))),
                                temperature=SAMPLE_TEMPERATURE, max_new_tokens=max_new_tokens)
               if samples > 1 else [] for question, record, index in zip(questions, records, indices)]
    programs = [build_program(task, record, extract_code(reply)) for record, reply in zip(records, greedy)]
    programs += [build_program(task, record, extract_code(reply)) for record, replies in zip(records, sampled) for reply in replies]
    results = run_all(programs, runner, timeout=timeout)
    examples, sample_results = [], iter(results[len(records):])
    for index, record, reply, result, replies in zip(indices, records, greedy, results, sampled):
        statuses = [_status(next(sample_results)) for _ in replies]
        examples.append({"task": task, "index": index, "id": str(record.get("id", index)), "response": reply,
                         "status": _status(result), "correct": _status(result) == "passed",
                         "output": str(getattr(result, "output", ""))[-OUTPUT_KEPT:],
                         "sample_statuses": statuses, "samples_right": statuses.count("passed")})
    return examples


def run_all(programs: list[str], runner: Runner | None, *, timeout: float = 10.0) -> list:
    """Each program's sandbox result, in order: the sandbox's parallel runner, or `runner` (a test's stub) one by one."""
    if runner is not None:
        return [runner(program) for program in programs]
    if not programs:
        return []
    from gptlab.eval.sandbox import run_programs  # the sandbox starts subprocesses: imported when code is run

    return run_programs(programs, timeout=timeout)


def _status(result) -> str:
    """The result's status; a result that says it passed but names no status counts as "passed"."""
    status = getattr(result, "status", None) or ("passed" if getattr(result, "passed", False) else "failed")
    return status if status in STATUSES else "error"


def code_rows(task: str, examples: Sequence[dict], *, samples: int, k: Sequence[int], seed: int) -> list[CardRow]:
    """pass@1 of the greedy replies, then pass@k of the sampled ones for each k (only when samples > 1)."""
    greedy = Counter(example["status"] for example in examples)
    note = "greedy; " + ", ".join(f"{status} {greedy[status]}" for status in STATUSES if greedy[status])
    rows = [proportion_row(task, shots=0, metric="pass@1", right=greedy["passed"], n=len(examples), note=note)]
    if samples > 1:
        counts = [(len(example["sample_statuses"]), example["samples_right"]) for example in examples]
        drawn = Counter(status for example in examples for status in example["sample_statuses"])
        tally = ", ".join(f"{status} {drawn[status]}" for status in STATUSES if drawn[status])
        for each in k:
            row = mean_row(task, shots=0, metric=f"pass@{each} (n={samples}, T={SAMPLE_TEMPERATURE})",
                           values=[pass_at_k(n, c, each) for n, c in counts],
                           note=f"{samples} samples per problem at temperature {SAMPLE_TEMPERATURE}, seed {seed}; {tally}")
            assert abs(row.score - mean_pass_at_k(counts, each)) < 1e-12  # the row is the estimator of gptlab.eval.stats
            rows.append(row)
    return rows
