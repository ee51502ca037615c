"""Evaluations by an LM judge: a win rate against reference answers, 1-10 grades, and refusal rates.

    client = JudgeClient("http://127.0.0.1:8000", model="judge")
    row, records = judge_pairwise(client, instructions, answers, references)  # AlpacaEval-style win rate
    row, records = judge_single(client, instructions, answers)                # MT-Bench-style mean grade
    row, records = judge_refusals(client, prompts, answers, harmful=True)     # share of harmful requests refused
    rows, records = evaluate_with_judge(model, chat, client, alpaca="alpaca_eval.jsonl", safety="sst.csv", limit=100)

Pairwise (AlpacaEval, Li et al. 2023): each instruction's answer is compared with the reference
output, twice: the model's answer as A, then as B. A judge prefers one position more often than
chance (Zheng et al. 2023, section 3.3), and asking both orders cancels that: an instruction counts 1
when the model wins both, 0 when it loses both, and 0.5 for a tie or when the orders disagree. The
win rate is the mean of those values with a t interval, and the note gives how often the orders
disagreed (the judge's position bias: a judge that always answers "A" scores every model 0.5 with
100% disagreement). Single grading (MT-Bench) is the mean 1-10 rating with a t interval.

Safety: the share of harmful requests (SimpleSafetyTests, Vidgen et al. 2023: a CSV of id, harm_area,
counter, category, prompts_final) that the model refuses, and the share of benign requests that it
wrongly refuses, each judged with the rubric in prompts/refusal.md (refusal as XSTest, Röttger et al.
2024, defines it). prompts/benign.jsonl holds 25 benign requests written for gptlab in XSTest's style:
safe questions that look unsafe at a glance ("How do I kill a Python process ...?").

A judgement that fails (timeouts, rate limits or server errors after their retries, another HTTP
error, a malformed verdict) is kept: its record says why, the row's note counts the failures by kind,
and the score is over the judged examples. When none was judged the evaluation raises GptlabError.
Not here: the HTTP client and verdict parsing (gptlab.eval.judge), generating answers (gptlab.eval.chat).
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from gptlab.chat import ChatFormat
from gptlab.eval.card import CardRow, mean_row, proportion_row
from gptlab.eval.chat import respond
from gptlab.eval.judge import PROMPTS, JudgeClient, Judgement, JudgeTemplates, load_templates
from gptlab.model import GPT
from gptlab.runtime import GptlabError

BENIGN = PROMPTS / "benign.jsonl"
OUTCOME_AS_A = {"A": "win", "B": "loss", "tie": "tie"}  # the model's outcome when its answer is shown as A
OUTCOME_AS_B = {"A": "loss", "B": "win", "tie": "tie"}
PAIR_VALUE = {("win", "win"): 1.0, ("loss", "loss"): 0.0}  # any other pair of outcomes: 0.5


def judge_pairwise(client: JudgeClient, instructions: Sequence[str], answers: Sequence[str], references: Sequence[str],
                   templates: JudgeTemplates | None = None, *, task: str = "alpaca_eval",
                   ids: Sequence[str] | None = None) -> tuple[CardRow, list[dict]]:
    """The model's win rate against the references, each pair judged in both orders (see the module docstring)."""
    ids = _ids(ids, _same_length(instructions=instructions, answers=answers, references=references))
    templates = templates or load_templates()
    as_a = [templates.fill("pairwise", instruction=i, answer_a=a, answer_b=r) for i, a, r in zip(instructions, answers, references)]
    as_b = [templates.fill("pairwise", instruction=i, answer_a=r, answer_b=a) for i, a, r in zip(instructions, answers, references)]
    judgements = client.judge_all(as_a + as_b, "pairwise")
    records, values, failures, disagreed = [], [], [], 0
    for i, (first, second) in enumerate(zip(judgements[: len(ids)], judgements[len(ids) :])):
        record = {"id": ids[i], "instruction": instructions[i], "answer": answers[i], "reference": references[i],
                  "model_as_a": first.to_dict(), "model_as_b": second.to_dict(), "value": None, "orders_disagree": None,
                  "failure": first.failure or second.failure}
        if record["failure"]:
            failures.append(first if first.failure else second)
        else:
            outcomes = (OUTCOME_AS_A[first.verdict], OUTCOME_AS_B[second.verdict])
            record["value"], record["orders_disagree"] = PAIR_VALUE.get(outcomes, 0.5), outcomes[0] != outcomes[1]
            values.append(record["value"])
            disagreed += record["orders_disagree"]
        records.append(record)
    _check_judged(task, len(values), failures)
    bias = f"orders disagreed on {disagreed} of {len(values)} ({disagreed / len(values):.1%}, position bias)"
    note = "; ".join(part for part in (bias, _failure_note(failures, len(ids))) if part)
    return mean_row(task, shots=0, metric="win_rate", values=values, note=note), records


def judge_single(client: JudgeClient, instructions: Sequence[str], answers: Sequence[str], templates: JudgeTemplates | None = None,
                 *, task: str = "alpaca_eval", ids: Sequence[str] | None = None) -> tuple[CardRow, list[dict]]:
    """The mean 1-10 grade the judge gives the answers, with a t interval."""
    ids = _ids(ids, _same_length(instructions=instructions, answers=answers))
    templates = templates or load_templates()
    prompts = [templates.fill("single", instruction=i, answer=a) for i, a in zip(instructions, answers)]
    judgements = client.judge_all(prompts, "single")
    records = [{"id": id_, "instruction": instruction, "answer": answer, "grade": judgement.verdict, "judge": judgement.to_dict(),
                "failure": judgement.failure} for id_, instruction, answer, judgement in zip(ids, instructions, answers, judgements)]
    grades = [judgement.verdict for judgement in judgements if judgement.failure is None]
    failures = [judgement for judgement in judgements if judgement.failure]
    _check_judged(task, len(grades), failures)
    return mean_row(task, shots=0, metric="grade_1_10", values=grades, note=_failure_note(failures, len(ids))), records


def judge_refusals(client: JudgeClient, prompts: Sequence[str], answers: Sequence[str], *, harmful: bool,
                   templates: JudgeTemplates | None = None, task: str | None = None,
                   ids: Sequence[str] | None = None) -> tuple[CardRow, list[dict]]:
    """The share of the requests the model refused: of harmful ones (higher is safer, metric "refusal_rate") or of
    benign ones (lower is better, metric "false_refusal_rate": refusing what it should answer)."""
    ids = _ids(ids, _same_length(prompts=prompts, answers=answers))
    templates = templates or load_templates()
    task = task or ("simple_safety_tests" if harmful else "benign_requests")
    judgements = client.judge_all([templates.fill("refusal", prompt=p, answer=a) for p, a in zip(prompts, answers)], "refusal")
    records = [{"id": id_, "prompt": prompt, "answer": answer, "harmful": harmful,
                "refused": None if judgement.failure else judgement.verdict == "REFUSED", "judge": judgement.to_dict(),
                "failure": judgement.failure} for id_, prompt, answer, judgement in zip(ids, prompts, answers, judgements)]
    judged = [record["refused"] for record in records if record["failure"] is None]
    failures = [judgement for judgement in judgements if judgement.failure]
    _check_judged(task, len(judged), failures)
    metric = "refusal_rate" if harmful else "false_refusal_rate"
    return proportion_row(task, shots=0, metric=metric, right=sum(judged), n=len(judged), note=_failure_note(failures, len(ids))), records


def _failure_note(failures: list[Judgement], total: int) -> str:
    """"2 of 50 failed (1 timeout, 1 malformed), scored over the 48 judged", or "" when none failed."""
    if not failures:
        return ""
    return f"{len(failures)} of {total} failed ({_kinds(failures)}), scored over the {total - len(failures)} judged"


def _kinds(failures: list[Judgement]) -> str:
    """"1 malformed, 2 timeout": the failures counted by kind."""
    return ", ".join(f"{count} {kind}" for kind, count in sorted(Counter(judgement.failure for judgement in failures).items()))


def _check_judged(task: str, judged: int, failures: list[Judgement]) -> None:
    if not judged:
        if not failures:
            raise GptlabError(f"{task}: nothing to judge: pass at least one example")
        raise GptlabError(f"{task}: all {len(failures)} judgements failed ({_kinds(failures)}); the first: {failures[0].error}")


def _same_length(**columns: Sequence[str]) -> int:
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise GptlabError(f"the judge needs one of each per example, got {', '.join(f'{n} {name}' for name, n in lengths.items())}")
    return next(iter(lengths.values()))


def _ids(ids: Sequence[str] | None, n: int) -> list[str]:
    if ids is None:
        return [str(i) for i in range(n)]
    if len(ids) != n:
        raise GptlabError(f"{len(ids)} ids for {n} examples: pass one id per example")
    return [str(id_) for id_ in ids]


def evaluate_with_judge(model: GPT, chat: ChatFormat, client: JudgeClient, *, alpaca: str | os.PathLike | None = None,
                        safety: str | os.PathLike | None = None, benign: str | os.PathLike | None = None,
                        limit: int | None = None, prompts_dir: str | os.PathLike | None = None, single: bool = True,
                        batch_size: int = 32, max_new_tokens: int | None = None, autocast=None) -> tuple[list[CardRow], dict]:
    """The chat model's answers, generated greedily (gptlab.eval.chat.respond), then judged: a win rate (and, with
    `single`, a mean grade) on `alpaca`; refusal rates on `safety` and on `benign` (the built-in benign set when
    `safety` is given without one). `limit` keeps each file's first examples; answers are at most `max_new_tokens`
    long (default: 512, or half the context when that is shorter). Returns the rows and
    {"judge": settings, "<name>": [records]} for "alpaca_eval_pairwise", "alpaca_eval_single", "simple_safety_tests",
    "benign_requests"."""
    templates = load_templates(prompts_dir)  # a bad prompt folder fails before any generation
    if benign is None and safety is not None:
        benign = BENIGN
    if alpaca is None and safety is None and benign is None:
        raise GptlabError("nothing for the judge to evaluate: pass an AlpacaEval file, a safety file and/or a benign file")
    alpaca_rows = read_alpaca(alpaca, limit) if alpaca is not None else []
    harmful = read_requests(safety, limit) if safety is not None else []
    harmless = read_requests(benign, limit) if benign is not None else []
    questions = [row["instruction"] for row in alpaca_rows] + [row["prompt"] for row in harmful + harmless]
    max_new_tokens = max_new_tokens or min(512, model.config.block_size // 2)  # half: room for the question too
    answers = respond(model, chat, questions, batch_size=batch_size, max_new_tokens=max_new_tokens, autocast=autocast)
    alpaca_answers, answers = answers[: len(alpaca_rows)], answers[len(alpaca_rows) :]
    rows, records = [], {"judge": {**client.settings(), "prompts": templates.sources}}
    if alpaca_rows:
        instructions, ids = [row["instruction"] for row in alpaca_rows], [row["id"] for row in alpaca_rows]
        row, records["alpaca_eval_pairwise"] = judge_pairwise(client, instructions, alpaca_answers, [r["output"] for r in alpaca_rows],
                                                              templates, ids=ids)
        rows.append(row)
        if single:
            row, records["alpaca_eval_single"] = judge_single(client, instructions, alpaca_answers, templates, ids=ids)
            rows.append(row)
    for name, requests, is_harmful in (("simple_safety_tests", harmful, True), ("benign_requests", harmless, False)):
        if requests:
            mine, answers = answers[: len(requests)], answers[len(requests) :]
            row, records[name] = judge_refusals(client, [r["prompt"] for r in requests], mine, harmful=is_harmful,
                                                templates=templates, task=name, ids=[r["id"] for r in requests])
            for record, request in zip(records[name], requests):  # keep harm_area, category, type with each record
                record.update({key: value for key, value in request.items() if key not in record})
            rows.append(row)
    return rows, records


def read_alpaca(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """AlpacaEval's instructions and reference outputs, from JSONL or a JSON list of
    {"instruction", "output", "generator", "dataset"}: [{"id", "instruction", "output", "generator", "dataset"}, ...]."""
    rows = []
    for where, item in _read_items(Path(path), limit):
        for key in ("instruction", "output"):
            if not isinstance(item.get(key), str):
                raise GptlabError(f"{where}: an AlpacaEval record needs the text field {key!r} (fields: instruction, output, "
                                  f"generator, dataset); got {sorted(item)}")
        rows.append({"id": str(item.get("id", f"alpaca_eval/{len(rows)}")), "instruction": item["instruction"],
                     "output": item["output"], "generator": item.get("generator", ""), "dataset": item.get("dataset", "")})
    return rows


def read_requests(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """Requests to judge for refusal: SimpleSafetyTests' CSV (id, harm_area, counter, category, prompts_final), a CSV
    with a `prompt` column, or JSONL / a JSON list of {"prompt": ...}: [{"id", "prompt", ...the other fields}, ...]."""
    path = Path(path)
    rows = []
    for where, item in _read_items(path, limit):
        prompt = item.get("prompts_final", item.get("prompt"))
        if not isinstance(prompt, str) or not prompt.strip():
            raise GptlabError(f"{where}: a request needs its text in a `prompt` field (or SimpleSafetyTests' `prompts_final` "
                              f"column); got {sorted(item)}")
        extra = {key: value for key, value in item.items() if key not in ("id", "prompt", "prompts_final")}
        rows.append({"id": str(item.get("id") or f"{path.stem}/{len(rows)}"), "prompt": prompt, **extra})
    return rows


def _read_items(path: Path, limit: int | None) -> list[tuple[str, dict]]:
    """(where, record) from a .csv, .jsonl or .json file: the first `limit` records, each with its line for errors."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise GptlabError(f"limit must be a whole number of at least 1 example, got {limit!r}")
    if not path.is_file():
        raise GptlabError(f"no judge data file at {path}: pass an existing .jsonl, .json or .csv file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: spreadsheet exports start with a byte-order mark
    except (OSError, UnicodeDecodeError) as error:
        raise GptlabError(f"cannot read {path} as UTF-8 text ({error})") from None
    if path.suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        items = [(f"{path} row {n}", dict(row)) for n, row in enumerate(reader, 2)]  # row 1 is the header
    elif path.suffix == ".jsonl":
        items = [(f"{path} line {n}", _json(line, f"{path} line {n}")) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    elif path.suffix == ".json":
        data = _json(text, str(path))
        if not isinstance(data, list):
            raise GptlabError(f"{path} holds a JSON {type(data).__name__}, not a list of records: write [{{...}}, ...] or JSONL")
        items = [(f"{path} record {n}", item) for n, item in enumerate(data)]
    else:
        raise GptlabError(f"{path}: judge data must be .jsonl, .json or .csv, not {path.suffix or 'a file without a suffix'}")
    for where, item in items:
        if not isinstance(item, dict):
            raise GptlabError(f"{where} is not a record ({{\"field\": value, ...}})")
    if not items:
        raise GptlabError(f"{path} holds no records")
    return items[:limit]


def _json(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise GptlabError(f"{where} is not JSON ({error.msg} at column {error.colno})") from None
