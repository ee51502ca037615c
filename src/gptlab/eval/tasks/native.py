"""Evaluation tasks' data: where each lives on the hub, and its native rows turned into the shared record shape.

Every loader returns records in one shape per kind of task (the DCLM/CORE eval-bundle form, plus raw fields):

    multiple_choice    {"query": "Question: ...\\nAnswer:", "choices": ["...", ...], "gold": 2, "question": "...", "id": "..."}
    schema             {"context_options": ["The trophy ...", "The suitcase ..."], "continuation": "was too big.", "gold": 0, "id": "..."}
    language_modeling  {"context": "... he picked up the", "continuation": "ball", "id": "..."}   (no leading space)
    code               {"id": "HumanEval/0", "prompt": "def f(x):\\n", "tests": "...\\ncheck(f)", "entry_point": "f"}

Queries follow lm-evaluation-harness 0.4 (its task YAMLs' doc_to_text and doc_to_choice):

    arc_easy  {"question": "Which gas ...?", "choices": {"text": ["O2", "CO2"], "label": ["A", "B"]}, "answerKey": "B"}
      ->      {"query": "Question: Which gas ...?\\nAnswer:", "choices": ["O2", "CO2"], "gold": 1, ...}
    winogrande {"sentence": "The cup fell off the table because _ was wobbly.", "option1": "the cup", "option2": "the table", "answer": "2"}
      ->      {"context_options": ["The cup fell off the table because the cup", "... because the table"], "continuation": "was wobbly.", "gold": 1}

Choices are stored without the continuation delimiter (" "), which the scorer puts between query and choice.
lm-eval's COPA choices carry their own leading space on top of its default " " delimiter, so lm-eval scores
"premise because  choice" (two spaces); here, as in DCLM's copa, there is one.

Hub revisions are commit SHAs, each found pinned in several public evaluation codebases; none is invented.

Not here: reading files, folders and the hub (gptlab.eval.tasks.sources), the DCLM bundle (gptlab.eval.tasks.bundle).
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Callable
from dataclasses import dataclass

from gptlab.runtime import GptlabError

LETTERS = "ABCDEFGHIJ"
BUILTIN_NAMES = frozenset(dir(builtins))  # len, set, sorted...: called by tests but never the tested function
SHARED_FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "language_modeling": ("context", "continuation"),
    "code": ("prompt", "tests", "entry_point"),
}


@dataclass(frozen=True)
class DatasetSpec:
    """A task's kind, its hub dataset (pinned) and splits, and how one native row becomes a record."""

    name: str
    kind: str  # a key of SHARED_FIELDS
    dataset: str
    config: str | None
    revision: str | None
    split: str  # the evaluation split
    fewshot_split: str | None  # where few-shot examples come from (None: the task is evaluated zero-shot)
    native_fields: tuple[str, ...]  # the columns that mark a row as native
    convert: Callable[[dict, str], dict]  # (row, where) -> record

    @property
    def hub_spec(self) -> str:
        """`hf:NAME[:CONFIG][@REVISION]`, as gptlab.data.sources reads it."""
        config = f":{self.config}" if self.config else ""
        revision = f"@{self.revision}" if self.revision else ""
        return f"hf:{self.dataset}{config}{revision}"


# ---------------------------------------------------------------- helpers


def _text(row: dict, field: str, where: str) -> str:
    value = row.get(field)
    if not isinstance(value, str):
        raise GptlabError(f"{where}: field {field!r} must be text, got {type(value).__name__}")
    return value


def _index(value: object, size: int, where: str, *, base: int = 0, field: str = "label") -> int:
    """An answer index from an int or its digits ("3"), counted from `base`; refused when out of range."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value - base < size:
        raise GptlabError(f"{where}: {field} {value!r} does not pick one of the {size} choices")
    return value - base


def _keyed_choices(row: dict, where: str) -> tuple[list[str], int]:
    """ARC/OpenBookQA/CommonsenseQA choices {"text": [...], "label": ["A", ...]} and answerKey -> (texts, gold)."""
    choices = row.get("choices")
    if not isinstance(choices, dict) or not isinstance(choices.get("text"), list) or not isinstance(choices.get("label"), list):
        raise GptlabError(f"{where}: choices must be {{'text': [...], 'label': [...]}}, got {choices!r:.80}")
    labels = [str(label).strip() for label in choices["label"]]
    key = str(row.get("answerKey", "")).strip()  # OpenBookQA's keys can carry a stray space
    if key not in labels:
        raise GptlabError(f"{where}: answerKey {row.get('answerKey')!r} is not one of the choice labels {labels}")
    return [str(text) for text in choices["text"]], labels.index(key)


def _lettered(question: str, texts: list[str]) -> str:
    """lm-eval's lettered prompt: "question\\nA. ...\\nB. ...\\nAnswer:"."""
    lines = [question.strip()] + [f"{LETTERS[number]}. {text}" for number, text in enumerate(texts)]
    return "\n".join(lines) + "\nAnswer:"


# ---------------------------------------------------------------- native rows -> records


def convert_arc(row: dict, where: str) -> dict:
    question = _text(row, "question", where)
    texts, gold = _keyed_choices(row, where)
    return {"query": f"Question: {question}\nAnswer:", "choices": texts, "gold": gold, "question": question, "id": row.get("id")}


def _hellaswag_clean(text: str) -> str:
    """lm-eval's HellaSwag preprocess: drop WikiHow's "[title]"-style markers and double spaces."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def convert_hellaswag(row: dict, where: str) -> dict:
    context = _text(row, "ctx_a", where) + " " + _text(row, "ctx_b", where).capitalize()
    endings = row.get("endings")
    if not isinstance(endings, list) or not endings:
        raise GptlabError(f"{where}: endings must be a non-empty list of text")
    query = _hellaswag_clean(_text(row, "activity_label", where) + ": " + context)
    gold = _index(row.get("label"), len(endings), where)
    record_id = row.get("ind")
    return {"query": query, "choices": [_hellaswag_clean(str(ending)) for ending in endings], "gold": gold, "question": context, "id": record_id}


def convert_piqa(row: dict, where: str) -> dict:
    goal = _text(row, "goal", where)
    choices = [_text(row, "sol1", where), _text(row, "sol2", where)]
    return {"query": f"Question: {goal}\nAnswer:", "choices": choices, "gold": _index(row.get("label"), 2, where), "question": goal,
            "id": row.get("id")}


def convert_winogrande(row: dict, where: str) -> dict:
    """lm-eval's split: the sentence up to "_" with each option is a context; the rest is the shared continuation."""
    sentence = _text(row, "sentence", where)
    if "_" not in sentence:
        raise GptlabError(f"{where}: a winogrande sentence needs a '_' where the option goes, got {sentence!r:.80}")
    blank = sentence.index("_")
    options = [_text(row, "option1", where), _text(row, "option2", where)]
    return {"context_options": [sentence[:blank] + option for option in options], "continuation": sentence[blank + 1 :].strip(),
            "gold": _index(row.get("answer"), 2, where, base=1, field="answer"), "id": row.get("id")}


def convert_boolq(row: dict, where: str) -> dict:
    """super_glue's boolq has `label` 0/1; google/boolq has `answer` true/false."""
    passage, question = _text(row, "passage", where), _text(row, "question", where)
    answer = row.get("label", row.get("answer"))
    gold = int(answer) if isinstance(answer, bool) else _index(answer, 2, where)
    return {"query": f"{passage}\nQuestion: {question}?\nAnswer:", "choices": ["no", "yes"], "gold": gold, "question": question,
            "id": row.get("idx")}


def convert_copa(row: dict, where: str) -> dict:
    """lm-eval's form: the premise without its full stop, joined to a choice by "because" (cause) or "therefore" (effect)."""
    connector = {"cause": "because", "effect": "therefore"}.get(row.get("question"))
    if connector is None:
        raise GptlabError(f"{where}: copa question must be 'cause' or 'effect', got {row.get('question')!r}")
    choices = [_text(row, name, where) for name in ("choice1", "choice2")]
    return {"query": _text(row, "premise", where).strip()[:-1] + f" {connector}", "choices": [text[:1].lower() + text[1:] for text in choices],
            "gold": _index(row.get("label"), 2, where), "question": row["premise"], "id": row.get("idx")}


def convert_openbookqa(row: dict, where: str) -> dict:
    stem = _text(row, "question_stem", where)
    texts, gold = _keyed_choices(row, where)
    return {"query": stem, "choices": texts, "gold": gold, "question": stem, "id": row.get("id")}


def convert_commonsense_qa(row: dict, where: str) -> dict:
    question = _text(row, "question", where)
    texts, gold = _keyed_choices(row, where)
    return {"query": "Question: " + _lettered(question, texts), "choices": list(LETTERS[: len(texts)]), "gold": gold, "question": question,
            "choice_texts": texts, "id": row.get("id")}


def convert_lambada(row: dict, where: str) -> dict:
    text = _text(row, "text", where)
    context, space, word = text.rpartition(" ")
    if not space or not word:
        raise GptlabError(f"{where}: a lambada text needs a context and a last word after a space, got {text!r:.80}")
    return {"context": context, "continuation": word, "id": row.get("id")}


def convert_mmlu(row: dict, where: str) -> dict:
    """cais/mmlu's row (answer 0-3, or a letter as in the CSV files); the raw question and texts stay for the chat suite."""
    question = _text(row, "question", where)
    texts = row.get("choices")
    if not isinstance(texts, list) or len(texts) != 4:
        raise GptlabError(f"{where}: mmlu choices must be a list of 4 texts, got {texts!r:.80}")
    answer = row.get("answer")
    if isinstance(answer, str) and answer.strip().upper() in LETTERS[:4]:
        answer = LETTERS.index(answer.strip().upper())
    gold = _index(answer, 4, where, field="answer")
    return {"query": _lettered(question, [str(text) for text in texts]), "choices": list(LETTERS[:4]), "gold": gold, "question": question,
            "choice_texts": [str(text) for text in texts], "subject": row.get("subject", ""), "id": row.get("id")}


def convert_humaneval(row: dict, where: str) -> dict:
    entry_point = _text(row, "entry_point", where)
    return {"id": row.get("task_id"), "prompt": _text(row, "prompt", where),
            "tests": _text(row, "test", where) + f"\ncheck({entry_point})", "entry_point": entry_point}


def convert_mbpp(row: dict, where: str) -> dict:
    """MBPP full (`text`, `test_setup_code`) or sanitized (`prompt`, `test_imports`): the prompt of Austin et al. (2021)."""
    description = row.get("text") if isinstance(row.get("text"), str) else _text(row, "prompt", where)
    asserts = row.get("test_list")
    if not isinstance(asserts, list) or not asserts or not all(isinstance(line, str) for line in asserts):
        raise GptlabError(f"{where}: test_list must be a non-empty list of assert lines")
    setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or [])
    tests = "\n".join([setup, *asserts]) if setup else "\n".join(asserts)
    prompt = f"You are an expert Python programmer, and here is your task: {description} Your code should pass these tests:\n\n" + "\n".join(asserts)
    task_id = row.get("task_id")
    return {"id": f"MBPP/{task_id}" if task_id is not None else None, "prompt": prompt, "tests": tests,
            "entry_point": tested_function(asserts, str(row.get("code", "")), where)}


def tested_function(asserts: list[str], code: str, where: str) -> str:
    """The function the asserts call: the first called name the reference code defines, else the first that is not a builtin."""
    called: list[str] = []
    for line in asserts:
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        called += [node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    defined = set(re.findall(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", code, flags=re.MULTILINE))
    chosen = next((name for name in called if name in defined), None) or next((name for name in called if name not in BUILTIN_NAMES), None)
    if chosen is None:
        raise GptlabError(f"{where}: cannot tell which function the tests call ({asserts[0]!r:.80})")
    return chosen


# ---------------------------------------------------------------- the tasks

ARC_REVISION = "210d026faf9955653af8916fad021475a3f00453"
SUPER_GLUE_REVISION = "3de24cf8022e94f4ee4b9d55a6f539891524d646"
ARC_FIELDS = ("question", "choices", "answerKey")

DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in [
    DatasetSpec("arc_easy", "multiple_choice", "allenai/ai2_arc", "ARC-Easy", ARC_REVISION, "test", "train", ARC_FIELDS, convert_arc),
    DatasetSpec("arc_challenge", "multiple_choice", "allenai/ai2_arc", "ARC-Challenge", ARC_REVISION, "test", "train", ARC_FIELDS, convert_arc),
    DatasetSpec("hellaswag", "multiple_choice", "Rowan/hellaswag", None, "218ec52e09a7e7462a5400043bb9a69a41d06b76", "validation", "train",
             ("ctx_a", "ctx_b", "activity_label", "endings", "label"), convert_hellaswag),
    # baber/piqa: the parquet copy lm-eval 0.4 reads (ybisk/piqa is a loading script that datasets no longer runs)
    DatasetSpec("piqa", "multiple_choice", "baber/piqa", None, "142f6d7367fd9877f0fb3b5734ea6a545f54cdd1", "validation", "train",
             ("goal", "sol1", "sol2", "label"), convert_piqa),
    DatasetSpec("winogrande", "schema", "allenai/winogrande", "winogrande_xl", "01e74176c63542e6b0bcb004dcdea22d94fb67b5", "validation", "train",
             ("sentence", "option1", "option2", "answer"), convert_winogrande),
    DatasetSpec("boolq", "multiple_choice", "aps/super_glue", "boolq", SUPER_GLUE_REVISION, "validation", "train", ("passage", "question"), convert_boolq),
    DatasetSpec("copa", "multiple_choice", "aps/super_glue", "copa", SUPER_GLUE_REVISION, "validation", "train",
             ("premise", "choice1", "choice2", "question", "label"), convert_copa),
    DatasetSpec("openbookqa", "multiple_choice", "allenai/openbookqa", "main", "388097ea7776314e93a529163e0fea805b8a6454", "test", "train",
             ("question_stem", "choices", "answerKey"), convert_openbookqa),
    # the test split has no answers: validation is the evaluation split
    DatasetSpec("commonsense_qa", "multiple_choice", "tau/commonsense_qa", None, "94630fe30dad47192a8546eb75f094926d47e155", "validation", "train",
             ARC_FIELDS, convert_commonsense_qa),
    DatasetSpec("lambada", "language_modeling", "EleutherAI/lambada_openai", "default", "900124bf3b8235c6daf21033af9948b3f07346c4", "test", None,
             ("text",), convert_lambada),
    DatasetSpec("mmlu", "multiple_choice", "cais/mmlu", "all", "c30699e8356da336a370243923dbaf21066bb9fe", "test", "dev",
             ("question", "choices", "answer"), convert_mmlu),
    DatasetSpec("humaneval", "code", "openai/openai_humaneval", None, "7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544", "test", None,
             ("task_id", "prompt", "test", "entry_point"), convert_humaneval),
    # MBPP's "prompt" split (task ids 1-10) is the few-shot pool Austin et al. set aside
    DatasetSpec("mbpp", "code", "google-research-datasets/mbpp", "full", "4bb6404fdc6cacfda99d4ac4205087b89d32030c", "test", "prompt",
             ("task_id", "test_list", "code"), convert_mbpp),
]}


def dataset_spec(task: str) -> DatasetSpec:
    """The spec of a task by name; one line naming the known tasks if there is none."""
    if task not in DATASETS:
        raise GptlabError(f"unknown evaluation task {task!r}; known: {', '.join(DATASETS)}")
    return DATASETS[task]


# ---------------------------------------------------------------- a record in either form


def to_record(row: object, kind: str, spec: DatasetSpec | None, where: str, number: int) -> dict:
    """A row in the shared shape (checked) or the task's native columns (converted); anything else is refused."""
    if not isinstance(row, dict):
        raise GptlabError(f"{where}: expected a JSON object, got {type(row).__name__}")
    shared = SHARED_FIELDS[kind]
    if all(field in row for field in shared):
        record = check_shared(dict(row), kind, where)
    elif spec is not None and all(field in row for field in spec.native_fields):
        record = spec.convert(row, where)
    else:
        native = f" or {spec.name}'s native columns ({', '.join(spec.native_fields)})" if spec is not None else ""
        raise GptlabError(f"{where}: expected the shared {kind} fields ({', '.join(shared)}){native}; the record has: {', '.join(row) or 'nothing'}")
    # rows without an id (PIQA has none) are named by their place in the source
    record["id"] = str(record["id"]) if record.get("id") not in (None, "") else f"{spec.name if spec else kind}/{number}"
    return record


def check_shared(record: dict, kind: str, where: str) -> dict:
    """The shared shape's types: text where text goes, a list of choices, a gold index among them."""
    if kind in ("multiple_choice", "schema"):
        options = "choices" if kind == "multiple_choice" else "context_options"
        texts = record[options]
        if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
            raise GptlabError(f"{where}: {options} must be a non-empty list of text")
        record["gold"] = _index(record["gold"], len(texts), where, field="gold")
    text_fields = {"multiple_choice": ("query",), "schema": ("continuation",), "language_modeling": ("context", "continuation"),
                   "code": ("prompt", "tests", "entry_point")}[kind]
    for field in text_fields:
        _text(record, field, where)
    return record
