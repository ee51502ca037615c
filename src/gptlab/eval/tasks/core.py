"""The base-model likelihood suite in the CORE/DCLM form: task specs, prompts, few-shot choice, scoring, metrics.

A task is declared once (`TaskSpec`: kind, CORE's shots, chance) and reads records in one shape per kind:

    multiple_choice    {"query": "Question: ...\\nAnswer:", "choices": ["...", ...], "gold": 1, "id": "..."}
    schema             {"context_options": ["...", "..."], "continuation": "...", "gold": 0, "id": "..."}
    language_modeling  {"context": "...", "continuation": "...", "id": "..."}

Prompts are rendered as DCLM's eval bundle (llm-foundry) and nanochat's core_eval render them: each few-shot
demonstration, then example_delimiter ("\\n\\n"), then the question. A question becomes text requests
(context, continuation), one per choice:

    multiple_choice    (shots + query,          delim + choice)         for each choice
    schema             (shots + context_option, delim + continuation)   for each option
    language_modeling  (shots + context,        delim + continuation)   (contexts trimmed, as nanochat does)

(a delimiter such as "\nAnswer: " leaves its text in the context and only its trailing space before the answer).

Text becomes ids as lm-eval's TemplateLM._encode_pair does it, so per-request log-likelihoods equal lm-eval's:
trailing whitespace of the context moves to the continuation, and the continuation's ids are
encode(context + continuation)[len(encode(context)):]. All requests of a question form one group for
gptlab.eval.packing.score_groups, which computes the shared context once.

Metrics, per question (ties go to the first choice):

    acc            argmax_k  logprob_k                            lm-eval's acc
    acc_norm       argmax_k  logprob_k / len(choice_k) in chars    lm-eval's acc_norm (the choice text without the
                                                                    delimiter; for schema the context option, as
                                                                    lm-eval's Winogrande lists its choices)
    acc_per_token  argmax_k  logprob_k / n_tokens_k               CORE's (llm-foundry's) multiple choice and schema
    exact          every continuation token is the greedy one     CORE's language modelling

acc_per_token divides by the continuation's tokens as lm-eval splits them; nanochat's core_eval leaves out
tokens every choice shares (its common prefix), so on choices that begin alike the two differ a little.

The card row carries the spec's metric (CORE's: acc_per_token, or exact); every metric is in the per-example
records. Few-shot examples are drawn for question i with random.Random(f"{seed}/{task}/{i}") from the task's
few-shot pool (its train/dev records when given, else the other evaluated records), so a run is reproducible
on any machine and rank; the chosen ids are saved with each example. A task with a few-shot group draws only
from its question's group, and may take a separate pool's first ones in order: MMLU, as lm-eval and Hendrycks
et al., gives each question the first 5 dev questions of its own subject, after the subject's description

    The following are multiple choice questions (with answers) about college physics.\n\n<shot>\n\n...<question> Under torch.distributed, rank r scores
questions r, r + world, ...; counts are summed and per-example records gathered, so every rank returns the same.

Not here: reading datasets (gptlab.eval.tasks.sources), the card and the centred mean (gptlab.eval.card),
the scoring kernels (gptlab.eval.packing, gptlab.eval.scoring).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from gptlab.eval.card import Aggregate, CardRow, centred_mean, proportion_row
from gptlab.eval.packing import score_groups
from gptlab.eval.scoring import count_truncated
from gptlab.eval.tasks.base import EXAMPLES_PER_CHUNK, _rank_and_world
from gptlab.runtime import GptlabError

Encode = Callable[[str], list[int]]
KINDS = ("multiple_choice", "schema", "language_modeling")
METRICS = {"multiple_choice": ("acc", "acc_norm", "acc_per_token"), "schema": ("acc", "acc_norm", "acc_per_token"),
           "language_modeling": ("exact",)}
COUNTED = ("acc", "acc_norm", "acc_per_token", "exact")  # the per-task counts, in this order after n


def spec_from_bundle(task) -> TaskSpec:
    """A DCLM eval-bundle task (gptlab.eval.tasks.bundle.BundleTask) as a spec: its shots, delimiter and baseline."""
    return TaskSpec(name=task.label, kind=task.kind, shots=task.num_fewshot, chance=task.random_baseline,
                    continuation_delimiter=task.continuation_delimiter)


def check_shots(task: str, shots) -> int:
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise GptlabError(f"{task}: shots must be a whole number >= 0, got {shots!r}")
    return shots


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """One task of the suite: how its records become prompts, how many shots CORE gives it, what guessing scores."""

    name: str
    kind: str  # one of KINDS
    shots: int  # CORE's number of few-shot demonstrations; a run may override it
    chance: float  # the fraction right by guessing (DCLM's "random baseline")
    metric: str = ""  # the card's metric; "" = CORE's (acc_per_token, or exact for language modelling)
    continuation_delimiter: str = " "
    example_delimiter: str = "\n\n"
    fewshot_group: str = ""  # a record field every shot shares with its question ("subject": MMLU's per-subject dev sets)
    first_shots: bool = False  # a separate few-shot pool gives its first shots, in order (lm-eval's first_n sampler)
    description: str = ""  # text before the shots (lm-eval's description); "{group}" is the question's group, "_" as " "

    def header(self, record: dict) -> str:
        """The description for this question: "The following are ... about college physics.\n\n" (none without a group)."""
        group = str(record.get(self.fewshot_group) or "") if self.fewshot_group else ""
        if not self.description or (self.fewshot_group and not group):
            return ""
        return self.description.format(group=group.replace("_", " "))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GptlabError(f"task {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.metric:
            object.__setattr__(self, "metric", "exact" if self.kind == "language_modeling" else "acc_per_token")
        if self.metric not in METRICS[self.kind]:
            raise GptlabError(f"task {self.name}: metric {self.metric!r} is not one of {', '.join(METRICS[self.kind])} "
                              f"for a {self.kind} task")
        check_shots(self.name, self.shots)
        if not 0 <= self.chance < 1:
            raise GptlabError(f"task {self.name}: chance {self.chance} must be a fraction in [0, 1)")


# Shots and chance as DCLM's eval/heavy.yaml (num_fewshot) and eval/eval_meta_data_v1.csv ("Random baseline", in %)
# give them, the values nanochat's base_eval reads from the eval bundle's core.yaml and eval_meta_data.csv.
# MMLU is DCLM's mmlu_fewshot (5 shots); it is not one of CORE's 22 tasks. DCLM's "\nAnswer: " delimiter of
# ARC, PIQA, BoolQ and MMLU is in the records' query ("...\nAnswer:"), so every delimiter here is " ".
# MMLU's prompt is lm-eval's mmlu/default (and Hendrycks et al.'s evaluate.py): the subject's description, then
# the first 5 questions of the question's own subject's dev set, in order (_generate_configs.py, sampler first_n).
CORE_TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec(name="arc_easy", kind="multiple_choice", shots=10, chance=0.25),
    TaskSpec(name="arc_challenge", kind="multiple_choice", shots=10, chance=0.25),
    TaskSpec(name="hellaswag", kind="multiple_choice", shots=10, chance=0.25),
    TaskSpec(name="piqa", kind="multiple_choice", shots=10, chance=0.50),
    TaskSpec(name="winogrande", kind="schema", shots=0, chance=0.50),
    TaskSpec(name="boolq", kind="multiple_choice", shots=10, chance=0.62),
    TaskSpec(name="copa", kind="multiple_choice", shots=0, chance=0.50),
    TaskSpec(name="openbookqa", kind="multiple_choice", shots=0, chance=0.25),
    TaskSpec(name="commonsense_qa", kind="multiple_choice", shots=10, chance=0.20),
    TaskSpec(name="lambada", kind="language_modeling", shots=0, chance=0.0),
    TaskSpec(name="mmlu", kind="multiple_choice", shots=5, chance=0.25, fewshot_group="subject", first_shots=True,
             description="The following are multiple choice questions (with answers) about {group}.\n\n"),
)}


def core_task(name: str) -> TaskSpec:
    """The spec of a suite task by name, or an error listing the names."""
    if name not in CORE_TASKS:
        raise GptlabError(f"unknown task {name!r}: the likelihood tasks are {', '.join(CORE_TASKS)}")
    return CORE_TASKS[name]


# ---------------------------------------------------------------- records and prompts


def _is_text_list(value) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(isinstance(item, str) for item in value)


def record_problem(kind: str, record) -> str | None:
    """Why a record does not have its kind's shape (see the module docstring), or None when it does."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    options = {"multiple_choice": "choices", "schema": "context_options"}.get(kind)
    needed = {"multiple_choice": ("query", "choices", "gold"), "schema": ("context_options", "continuation", "gold"),
              "language_modeling": ("context", "continuation")}[kind]
    missing = [field for field in needed if field not in record]
    if missing:
        return f"missing {', '.join(missing)} (a {kind} record has {', '.join(needed)})"
    text_fields = [field for field in needed if field not in ("gold", options)]
    if any(not isinstance(record[field], str) for field in text_fields):
        return f"{' and '.join(text_fields)} must be text"
    if kind != "multiple_choice" and not record["continuation"]:
        return "continuation is empty: there is nothing to score"
    if options is not None:
        gold = record["gold"]
        if not _is_text_list(record[options]):
            return f"{options} must be a non-empty list of texts"
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(record[options]):
            return f"gold {gold!r} is not an index into the {len(record[options])} {options}"
    return None


def check_records(spec: TaskSpec, records: Sequence[dict], what: str = "record") -> None:
    """Raise on the first record that is not in the task's shape, naming it by position and id."""
    if isinstance(records, (str, bytes, dict)) or not isinstance(records, Sequence):
        raise GptlabError(f"{spec.name}: {what}s must be a list of records, got {type(records).__name__}")
    for index, record in enumerate(records):
        problem = record_problem(spec.kind, record)
        if problem:
            name = f" (id {record.get('id')!r})" if isinstance(record, dict) and "id" in record else ""
            raise GptlabError(f"{spec.name} {what} {index}{name}: {problem}")


def record_id(record: dict, index: int) -> str:
    return str(record.get("id", index))


def demonstration(spec: TaskSpec, record: dict) -> str:
    """A solved example as it appears among the shots."""
    delimiter = spec.continuation_delimiter
    if spec.kind == "multiple_choice":
        return f"{record['query']}{delimiter}{record['choices'][record['gold']]}"
    if spec.kind == "schema":
        return f"{record['context_options'][record['gold']]}{delimiter}{record['continuation']}"
    return f"{record['context'].strip()}{delimiter}{record['continuation']}"


def render_requests(spec: TaskSpec, record: dict, shots: Sequence[dict] = ()) -> list[tuple[str, str]]:
    """(context text, continuation text) per choice: the task's description, the shots' demonstrations, then the question.

    The delimiter's text before its trailing whitespace joins the context ("\nAnswer: " puts "\nAnswer:" there),
    so only the answer is scored, as in DCLM and nanochat; for " " the requests are (query, " " + choice).
    """
    prefix = spec.header(record) + "".join(demonstration(spec, shot) + spec.example_delimiter for shot in shots)
    head = spec.continuation_delimiter.rstrip()
    tail = spec.continuation_delimiter[len(head):]
    if spec.kind == "multiple_choice":
        return [(prefix + record["query"] + head, tail + choice) for choice in record["choices"]]
    if spec.kind == "schema":
        return [(prefix + option + head, tail + record["continuation"]) for option in record["context_options"]]
    # nanochat trims LM contexts: some datasets keep a trailing space that would otherwise join the continuation
    return [(prefix + record["context"].strip() + head, tail + record["continuation"])]


def encode_request(encode: Encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair for a causal model: trailing whitespace joins the continuation,
    whose ids are those of the whole text after the context's."""
    if not context:
        raise GptlabError("a rendered context is empty: give the record a context (or the task shots)")
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = list(encode(context))
    return context_ids, list(encode(context + continuation))[len(context_ids):]


def encode_group(encode: Encode, texts: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """encode_request for each of a question's requests, encoding each distinct text once (choices share a context)."""
    cache: dict[str, list[int]] = {}

    def cached(text: str) -> list[int]:
        if text not in cache:
            cache[text] = list(encode(text))
        return cache[text]

    return [encode_request(cached, context, continuation) for context, continuation in texts]


# ---------------------------------------------------------------- few-shot choice


def choose_fewshot(task: str, index: int, own_id: str, pool_size: int, shots: int, seed: int,
                   pool_ids: Mapping[str, int] | None = None, *, candidates: Sequence[int] | None = None,
                   first: bool = False, group: str = "") -> list[int]:
    """Positions in the few-shot pool of question `index`'s shots: seeded by (seed, task, index), never itself.

    pool_ids None: the pool is the evaluated records, and position `index` is the question. Else the question
    is left out of its pool when an id matches. `candidates`: the positions allowed (those of the question's
    `group`, in pool order; default all); `first`: the first `shots` of them, else a seeded draw. random.Random
    seeds from a string through SHA-512, not hash(), so the choice is the same in every process and on every machine.
    """
    own = index if pool_ids is None else pool_ids.get(own_id)
    allowed = None if candidates is None else [position for position in candidates if position != own]
    available = pool_size - (own is not None) if allowed is None else len(allowed)
    if shots > available:
        among = f" of {group!r}" if group else ""
        raise GptlabError(f"{task}: {shots} shots need {shots} examples{among} besides each question, but the few-shot pool "
                          f"has {available}; pass fewer shots (shots=) or a larger few-shot pool")
    if first:
        return (allowed if allowed is not None else [position for position in range(shots + 1) if position != own])[:shots]
    picked = random.Random(f"{seed}/{task}/{index}").sample(range(available), shots)
    if allowed is not None:
        return [allowed[position] for position in picked]
    return [position + (own is not None and position >= own) for position in picked]  # skip over the question


class FewshotPool(NamedTuple):
    """Where a task's shots come from."""

    records: Sequence[dict]
    ids: Mapping[str, int] | None  # record id -> position; None: the pool is the evaluated records themselves
    groups: Mapping[str, list[int]] | None  # positions by the spec's fewshot_group value; None: the task has none


def build_fewshot_pool(spec: TaskSpec, records: Sequence[dict], pool: Sequence[dict] | None) -> FewshotPool:
    """The pool (`pool`, else the records themselves), indexed by id and by group."""
    chosen = records if pool is None else pool
    ids = None if pool is None else {record_id(record, j): j for j, record in enumerate(pool)}
    groups = None
    if spec.fewshot_group:
        groups = {}
        for position, record in enumerate(chosen):
            groups.setdefault(str(record.get(spec.fewshot_group) or ""), []).append(position)
    return FewshotPool(chosen, ids, groups)


def choose_shots(spec: TaskSpec, pool: FewshotPool, records: Sequence[dict], index: int, shots: int, seed: int) -> list[int]:
    """choose_fewshot for question `index` under the spec's rules: only its group, the first ones from a separate pool."""
    record = records[index]
    group = str(record.get(spec.fewshot_group) or "") if pool.groups is not None else ""
    candidates = None if pool.groups is None else pool.groups.get(group, [])
    return choose_fewshot(spec.name, index, record_id(record, index), len(pool.records), shots, seed, pool.ids,
                          candidates=candidates, first=spec.first_shots and pool.ids is not None, group=group)


# ---------------------------------------------------------------- metrics


def choose_answers(logprobs: Sequence[float], n_tokens: Sequence[int], n_chars: Sequence[int]) -> dict[str, int]:
    """The choice each metric picks (see the module docstring); ties go to the first choice.

        choose_answers([-4.0, -5.0, -6.0], n_tokens=[1, 2, 4], n_chars=[2, 10, 8])
            -> {"acc": 0, "acc_norm": 1, "acc_per_token": 2}
    """
    choices = range(len(logprobs))
    return {"acc": max(choices, key=lambda k: logprobs[k]),
            "acc_norm": max(choices, key=lambda k: logprobs[k] / max(n_chars[k], 1)),
            "acc_per_token": max(choices, key=lambda k: logprobs[k] / n_tokens[k])}


def score_example(spec: TaskSpec, gold: int | None, pairs: list[tuple[list[int], list[int]]], scores,
                  choice_texts: Sequence[str]) -> dict:
    """The per-example numbers and which metrics it gets right (1) or wrong (0)."""
    logprobs = [score.logprob for score in scores]
    if spec.kind == "language_modeling":
        (score,) = scores
        return {"logprob": score.logprob, "tokens": len(pairs[0][1]), "exact": int(score.greedy)}
    picks = choose_answers(logprobs, [len(continuation) for _, continuation in pairs], [len(text) for text in choice_texts])
    return {"logprobs": logprobs, "tokens": [len(continuation) for _, continuation in pairs],
            "chars": [len(text) for text in choice_texts], "greedy": [score.greedy for score in scores],
            "picks": picks, **{metric: int(pick == gold) for metric, pick in picks.items()}}


# ---------------------------------------------------------------- evaluation


class SuiteResult(NamedTuple):
    rows: list[CardRow]
    aggregate: Aggregate
    examples: dict[str, list[dict]]  # per task, the per-example records


def evaluate_task(model, spec: TaskSpec | str, records: Sequence[dict], encode: Encode, *, shots: int | None = None,
                  seed: int = 1234, limit: int | None = None, fewshot_pool: Sequence[dict] | None = None,
                  batch_size: int = 32, autocast=None, progress: bool = False) -> tuple[CardRow, list[dict]]:
    """Score one task: its card row (the spec's metric; the others in its note) and one record per example.

    `shots`: demonstrations per question (default CORE's). `limit`: the first `limit` questions; shots are
    still drawn from all records (or from `fewshot_pool`). Every rank returns the same row and records.
    """
    spec = core_task(spec) if isinstance(spec, str) else spec
    shots = spec.shots if shots is None else check_shots(spec.name, shots)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise GptlabError(f"{spec.name}: limit must be a whole number >= 1, got {limit!r}")
    check_records(spec, records)
    if not records:
        raise GptlabError(f"{spec.name} has no records to evaluate")
    if fewshot_pool is not None:
        check_records(spec, fewshot_pool, what="few-shot record")
    pool = build_fewshot_pool(spec, records, fewshot_pool)
    total = len(records) if limit is None else min(limit, len(records))
    for index in _first_of_each_group(spec, records, total if pool.groups is not None else 1):
        choose_shots(spec, pool, records, index, shots, seed)  # too few: fail on every rank, before any compute
    rank, world = _rank_and_world()
    device = next(model.parameters()).device
    mine = range(rank, total, world)
    counts = torch.zeros(2 + len(COUNTED), dtype=torch.float64)  # n, the COUNTED metrics right, truncated requests
    examples: list[dict] = []
    bar = tqdm(total=len(mine), desc=spec.name, unit="example", disable=None if progress and rank == 0 else True)
    for start in range(0, len(mine), EXAMPLES_PER_CHUNK):
        chunk = mine[start:start + EXAMPLES_PER_CHUNK]
        done = _score_chunk(model, spec, records, chunk, encode, shots, seed, pool, batch_size, autocast)
        examples += done
        for example in done:
            counts += torch.tensor([1, *(example.get(metric, 0) for metric in COUNTED), example["truncated"]],
                                   dtype=torch.float64)
        bar.update(len(chunk))
    bar.close()
    if world > 1:
        counts, examples = _share(counts, examples, device, world)
    return _row(spec, shots, counts), examples


def _first_of_each_group(spec: TaskSpec, records: Sequence[dict], total: int) -> list[int]:
    """The first question of each few-shot group among the first `total` (each group's pool is checked once)."""
    first: dict[str, int] = {}
    for index in range(total):
        first.setdefault(str(records[index].get(spec.fewshot_group) or "") if spec.fewshot_group else "", index)
    return list(first.values())


def _score_chunk(model, spec, records, indices, encode, shots, seed, pool: FewshotPool, batch_size, autocast) -> list[dict]:
    """Render, encode and score the questions at `indices`, one group per question."""
    groups, chosen = [], []
    for index in indices:
        record = records[index]
        picked = choose_shots(spec, pool, records, index, shots, seed)
        group = encode_group(encode, render_requests(spec, record, [pool.records[j] for j in picked]))
        empty = [k for k, (_, continuation) in enumerate(group) if not continuation]
        if empty:
            raise GptlabError(f"{spec.name} record {index} (id {record_id(record, index)!r}): choice {empty[0]} "
                              f"encodes to no tokens; there is nothing to score")
        groups.append(group)
        chosen.append(picked)
    scored = score_groups(model, groups, batch_size=batch_size, autocast=autocast)
    block_size = model.config.block_size
    out = []
    for index, picked, group, scores in zip(indices, chosen, groups, scored):
        record = records[index]
        choice_texts = record.get("choices") or record.get("context_options") or []
        example = {"task": spec.name, "index": index, "id": record_id(record, index),
                   "fewshot_ids": [record_id(pool.records[j], j) for j in picked], "gold": record.get("gold"),
                   **score_example(spec, record.get("gold"), group, scores, choice_texts),
                   "truncated": count_truncated(group, block_size)}
        out.append(example)
    return out


def _share(counts: torch.Tensor, examples: list[dict], device, world: int) -> tuple[torch.Tensor, list[dict]]:
    """Sum the counts over ranks and give every rank every example, in question order."""
    counts = counts.to(device)
    torch.distributed.all_reduce(counts)
    gathered: list[list[dict] | None] = [None] * world
    torch.distributed.all_gather_object(gathered, examples)
    merged = sorted((example for part in gathered for example in part or []), key=lambda example: example["index"])
    return counts.cpu(), merged


def _row(spec: TaskSpec, shots: int, counts: torch.Tensor) -> CardRow:
    """The card row for the spec's metric; the other metrics and truncation go in its note."""
    n = int(counts[0])
    right = {metric: int(counts[1 + i]) for i, metric in enumerate(COUNTED)}
    others = [f"{metric} {right[metric] / n:.4f}" for metric in METRICS[spec.kind] if metric != spec.metric]
    truncated = int(counts[-1])
    if truncated:
        others.append(f"{truncated:,} request{'s' if truncated != 1 else ''} cut on the left to fit the context")
    return proportion_row(spec.name, shots=shots, metric=spec.metric, right=right[spec.metric], n=n,
                          chance=spec.chance, note="; ".join(others))


def evaluate_suite(model, records: Mapping[str, Sequence[dict]], encode: Encode, *,
                   specs: Mapping[str, TaskSpec] | None = None, shots: int | Mapping[str, int] | None = None, seed: int = 1234, limit: int | None = None,
                   fewshot_pools: Mapping[str, Sequence[dict]] | None = None, batch_size: int = 32, autocast=None,
                   progress: bool = False, aggregate: str = "CORE") -> SuiteResult:
    """evaluate_task over several tasks ({task name: records}), and their mean centred score (CORE's aggregate).

    `specs`: tasks beyond (or instead of) CORE_TASKS by name, e.g. spec_from_bundle for the eval bundle's 22.
    `shots`: one number for every task, or {task: shots} for some (the rest keep CORE's). The aggregate equals
    nanochat's CORE only over CORE's 22 tasks; over other tasks it is the same formula on those tasks.
    """
    if not records:
        raise GptlabError(f"no tasks to evaluate: give records for some of {', '.join(CORE_TASKS)}")
    declared = dict(specs or {})
    specs = [declared[name] if name in declared else core_task(name) for name in records]
    for what, mapping in (("shots", shots if isinstance(shots, Mapping) else {}), ("fewshot_pools", fewshot_pools or {})):
        stray = [name for name in mapping if name not in records]
        if stray:
            raise GptlabError(f"{what} names {', '.join(stray)}, which the suite does not evaluate ({', '.join(records)})")
    rows, examples = [], {}
    for spec in specs:
        task_shots = shots.get(spec.name) if isinstance(shots, Mapping) else shots
        row, done = evaluate_task(model, spec, records[spec.name], encode, shots=task_shots, seed=seed, limit=limit,
                                  fewshot_pool=(fewshot_pools or {}).get(spec.name), batch_size=batch_size,
                                  autocast=autocast, progress=progress)
        rows.append(row)
        examples[spec.name] = done
    return SuiteResult(rows, centred_mean(aggregate, rows), examples)
