"""`gptlab eval`'s report card: the likelihood suite, the chat suite and the LM judge over one model, into one Card.

    config = EvalConfig(suite="core", tasks=("arc_easy", "lambada"), task_data={"arc_easy": "arc.jsonl"})
    card, examples = evaluate_card(model, config, encode=tokenizer.encode_ordinary)
    print(card.text()); card.save("out/eval.json")

    EvalConfig(suite="chat", tasks=("mmlu", "gsm8k", "humaneval"), samples=10, k=(1, 5))   # needs chat=ChatFormat(...)
    EvalConfig(judge=JudgeSettings(url="http://127.0.0.1:8000", alpaca="alpaca_eval.jsonl", safety="sst.csv"))

Suites: `core`, few-shot tasks scored by log-likelihood in DCLM's CORE form (gptlab.eval.tasks.core), with
data from the hub at pinned revisions, local files, or DCLM's eval bundle (`bundle`: its exact 22 tasks, so
the aggregate is nanochat's CORE); `chat`, questions asked as conversations and checked (gptlab.eval.chat_suite),
with ChatCORE. The judge grades a chat model's answers through any OpenAI-compatible endpoint
(gptlab.eval.judging). Every figure lands in one Card; its settings name each task's data (provenance: source,
revision, file hashes) and the run's options, and `examples` holds what each question was asked (few-shot ids
included), answered and scored, for examples.jsonl.
Not here: loading the model and tokenizer, output folders (gptlab.cli.eval), the figures' own code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace

from gptlab.eval.card import Card, CardRow
from gptlab.runtime import GptlabError

SUITES = ("core", "chat")
CHATCORE_TASKS = ("arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval", "spelling")  # nanochat's ChatCORE (its SpellingBee: ours)
DEFAULT_KEY_ENV = "GPTLAB_JUDGE_API_KEY"


@dataclass(frozen=True, kw_only=True)
class JudgeSettings:
    """An OpenAI-compatible judge and what it grades: AlpacaEval-style pairs and grades, refusals (harmful and benign)."""

    url: str
    model: str | None = None  # the endpoint's model name (None: the server's default)
    key_env: str = DEFAULT_KEY_ENV  # the environment variable holding the API key (never the command line)
    prompts: str | None = None  # a folder of judge prompt files replacing the built-in ones
    alpaca: str | None = None  # AlpacaEval instructions with reference outputs (JSONL/JSON)
    safety: str | None = None  # harmful requests (SimpleSafetyTests' CSV, or JSONL {"prompt"})
    benign: str | None = None  # benign requests (default with `safety`: the built-in set)
    single: bool = True  # also grade each AlpacaEval answer 1-10 (MT-Bench style)
    timeout: float = 60.0  # seconds per judge request before it is retried

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise GptlabError(f"--judge {self.url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000")
        if not (self.alpaca or self.safety or self.benign):
            raise GptlabError("the judge has nothing to grade: pass --alpaca FILE, --safety FILE and/or --benign FILE")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    suite: str | None = None  # core | chat | None (the judge only)
    tasks: tuple[str, ...] = ()  # the suite's tasks to run (default: all of them)
    task_data: Mapping[str, str] = field(default_factory=dict)  # task -> file, folder or hf:NAME[:CONFIG][@REVISION]
    bundle: str | None = None  # DCLM eval bundle folder: the core suite's tasks and data
    shots: int | None = None  # few-shot examples per question, for every task (default: CORE's per task)
    seed: int = 1234  # few-shot choice and sampling
    limit: int | None = None  # the first `limit` questions of each task
    samples: int = 1  # code tasks: samples per problem (1: greedy pass@1; more: pass@k at temperature 0.8)
    k: tuple[int, ...] = (1,)  # the k of pass@k
    batch_size: int = 16
    judge: JudgeSettings | None = None

    def __post_init__(self) -> None:
        if self.suite is not None and self.suite not in SUITES:
            raise GptlabError(f"unknown suite {self.suite!r}; the suites are {', '.join(SUITES)}")
        if self.suite is None and self.judge is None:
            raise GptlabError("nothing to evaluate: choose --suite core or chat, and/or --judge URL")
        if self.suite is None and (self.tasks or self.task_data):
            raise GptlabError("--tasks and --task-data choose a suite's tasks: pass --suite core or --suite chat")
        if self.bundle and self.suite != "core":
            raise GptlabError("--bundle holds the core suite's tasks: pass --suite core")
        stray = [task for task in self.task_data if self.tasks and task not in self.tasks]
        if stray:
            raise GptlabError(f"--task-data names {stray[0]}, which is not among --tasks {','.join(self.tasks)}")
        for name, value, low in (("limit", self.limit, 1), ("shots", self.shots, 0), ("batch_size", self.batch_size, 1),
                                 ("samples", self.samples, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise GptlabError(f"{name} must be a whole number of at least {low}, got {value!r}")

    def settings(self) -> dict:
        """What the card records of how it was made (the judge's key variable, never a key)."""
        return {key: value for key, value in asdict(self).items() if value not in (None, (), {})}


def evaluate_card(model, config: EvalConfig, *, encode: Callable[[str], list[int]] | None = None, chat=None, autocast=None,
                  progress: bool = False, name: str = "") -> tuple[Card, dict[str, list[dict]]]:
    """The model's card for `config`, and every question's record by task. `encode` (text -> ids) serves the
    core suite; `chat` (a gptlab.chat.ChatFormat) the chat suite and the judge."""
    if (config.suite == "chat" or config.judge) and chat is None:
        raise GptlabError("the chat suite and the judge talk to a chat model (one with gptlab's chat tokens, made by "
                          "`gptlab sft`); this model's tokenizer has none: use --suite core for a base model")
    if config.suite == "core" and encode is None:
        raise GptlabError("the core suite needs the model's tokenizer to turn questions into ids: pass --tokenizer DIR")
    card = Card(name, settings=config.settings())
    examples: dict[str, list[dict]] = {}
    if config.suite == "core":
        _core(model, config, encode, autocast, progress, card, examples)
    elif config.suite == "chat":
        _chat(model, config, chat, autocast, card, examples)
    if config.judge is not None:
        _judge(model, config, chat, autocast, card, examples)
    return card, examples


def _core(model, config: EvalConfig, encode, autocast, progress: bool, card: Card, examples: dict) -> None:
    """Every task's spec and data first (a wrong name or a missing file fails before any compute), then the scores."""
    from gptlab.eval.tasks.core import CORE_TASKS, core_task, evaluate_task, spec_from_bundle
    from gptlab.eval.tasks.sources import load_task_records, read_bundle

    bundled = {task.label: task for task in read_bundle(config.bundle)} if config.bundle else {}
    names = list(config.tasks) or list(bundled or CORE_TASKS)
    for task in names:
        if bundled and task not in bundled:
            raise GptlabError(f"unknown task {task!r}: the bundle {config.bundle} holds {', '.join(bundled)}")
    specs = [spec_from_bundle(bundled[task]) if bundled else core_task(task) for task in names]
    loaded = [load_task_records(task, source=config.task_data.get(task) or config.bundle) for task in names]
    rows = []
    for spec, data in zip(specs, loaded):
        own = data.provenance.get("fewshot_split") in (None, "records") or not data.fewshot_pool
        row, done = evaluate_task(model, spec, data.records, encode, shots=config.shots, seed=config.seed, limit=config.limit,
                                  fewshot_pool=None if own else data.fewshot_pool, batch_size=config.batch_size,
                                  autocast=autocast, progress=progress)
        rows.append(row)
        examples[spec.name] = done
    for row in rows:
        card.add(row)
    exact = bool(bundled) and not config.tasks and config.shots is None
    card.add_aggregate("CORE" if exact else f"CORE-style ({len(rows)} task{'s' if len(rows) != 1 else ''})", rows)
    card.settings["data"] = {task: data.provenance for task, data in zip(names, loaded)}


def _chat(model, config: EvalConfig, chat, autocast, card: Card, examples: dict) -> None:
    from gptlab.eval.chat_suite import CHAT_TASKS, VERIFIED_TASKS, evaluate_chat_suite
    from gptlab.eval.tasks.sources import load_task_records

    tasks = list(config.tasks) or list(CHAT_TASKS)
    unknown = [task for task in tasks if task not in CHAT_TASKS]
    if unknown:
        raise GptlabError(f"unknown chat task {unknown[0]!r}; the chat suite's tasks are {', '.join(CHAT_TASKS)}")
    sources, provenance = {}, {}
    for task in tasks:
        source = config.task_data.get(task)
        if task in VERIFIED_TASKS:
            if source is not None:
                sources[task] = source
            provenance[task] = {"source": source or "built-in default"}
            continue
        data = load_task_records(task, source=source)
        sources[task], provenance[task] = data.records, data.provenance
    rows, done, aggregate = evaluate_chat_suite(model, chat, tasks, sources=sources, limit=config.limit, samples=config.samples,
                                                k=config.k, batch_size=config.batch_size, seed=config.seed, autocast=autocast)
    for row in rows:
        card.add(row)
    exact = set(CHATCORE_TASKS) <= set(tasks)
    card.aggregates.append(aggregate if exact else replace(aggregate, name=f"ChatCORE-style ({len(tasks)} task{'s' if len(tasks) != 1 else ''})"))
    for record in done:
        examples.setdefault(str(record.get("task", "chat")), []).append(record)
    card.settings["data"] = provenance


def _judge(model, config: EvalConfig, chat, autocast, card: Card, examples: dict) -> None:
    import torch

    from gptlab.eval.judge import JudgeClient
    from gptlab.eval.judging import evaluate_with_judge

    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        raise GptlabError("the judge grades from one process (every rank would ask it the same questions): run --judge without torchrun")
    settings = config.judge
    with JudgeClient(settings.url, settings.model, api_key_env=settings.key_env, timeout=settings.timeout) as client:
        client.check_reachable()
        rows, records = evaluate_with_judge(model, chat, client, alpaca=settings.alpaca, safety=settings.safety,
                                            benign=settings.benign, limit=config.limit, prompts_dir=settings.prompts,
                                            single=settings.single, batch_size=config.batch_size, autocast=autocast)
    judged: list[CardRow] = rows
    for row in judged:
        card.add(row)
    card.settings["judge"] = records.pop("judge", {})
    examples.update(records)
