"""The chat-model suite: questions asked as conversations, answers generated, then checked; ChatCORE over the tasks.

    rows, examples, chatcore = evaluate_chat_suite(model, chat, ["arc_easy", "gsm8k", "humaneval"], limit=100)
    rows      [CardRow(task="arc_easy", metric="acc", ...), CardRow(task="gsm8k", ...), CardRow(task="humaneval", metric="pass@1")]
    examples  [{"task": "arc_easy", "id": "...", "response": "The answer is B.", "letter": "B", "gold": "B", "correct": True}, ...]
    chatcore  Aggregate(name="ChatCORE", score=..., tasks=("arc_easy", "gsm8k", "humaneval"))

Tasks (CHAT_TASKS):
- arc_easy, arc_challenge, mmlu: the user turn is the question, the options lettered "A. ...", and a request
  for the letter; the model answers greedily and `parse_letter` reads the letter from what it wrote. Unlike
  nanochat's chat_eval, which compares the logits of the letter tokens only, the model must write the letter:
  an answer with no letter, or two, is wrong. Chance is the mean of 1/(number of options).
- gsm8k, spelling: gptlab.chat.tasks' tasks and verifiers, answered by gptlab.eval.chat.respond. Chance 0.
- humaneval, mbpp: the model writes code that the sandbox runs (gptlab.eval.code_tasks). Chance 0.

ChatCORE is nanochat's (scripts/chat_eval.py, "calculate the ChatCORE metric"): the mean over tasks of the
centred accuracy (acc - baseline) / (1 - baseline), with baseline 0.25 for ARC-Easy, ARC-Challenge and MMLU
(four options) and 0 for the open-ended GSM8K, HumanEval and SpellingBee; here MBPP joins the open-ended
ones, and each code task counts by its greedy pass@1. gptlab.eval.card.centred_mean computes it.

Under torch.distributed, rank r answers examples r, r + world, ... of each task (as gptlab.eval.chat does);
the per-example records are gathered, so every rank returns the same rows. Greedy answers do not depend on
the rank; the sampled code answers are seeded per problem (gptlab.eval.code_tasks).

Not here: the tasks' data (gptlab.eval.tasks.sources, gptlab.chat.tasks), the sandbox (gptlab.eval.sandbox),
the card's table and file (gptlab.eval.card), the CLI (gptlab.cli.eval).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from string import ascii_uppercase

import torch

from gptlab.chat import ChatFormat
from gptlab.chat.tasks import get_task
from gptlab.eval.card import Aggregate, CardRow, centred_mean, proportion_row
from gptlab.eval.chat import respond
from gptlab.eval.code_tasks import CODE_TASKS, Runner, code_rows, run_code_task
from gptlab.infer.generate import SamplingConfig, generate
from gptlab.model import GPT
from gptlab.runtime import GptlabError

MC_TASKS = ("arc_easy", "arc_challenge", "mmlu")
VERIFIED_TASKS = ("gsm8k", "spelling")  # gptlab.chat.tasks with their verifiers
CHAT_TASKS = (*MC_TASKS, *VERIFIED_TASKS, *CODE_TASKS)
MAX_NEW_TOKENS = {"multiple_choice": 32, "gsm8k": 256, "spelling": 64, "code": 256}  # per kind of answer

# The forms a letter answer takes, strongest first; within the first form that finds a letter, two different
# letters make the answer ambiguous. Lower-case letters count only where marked ("(c)", "c)", "answer: c."),
# since "a" is also a word.
STATED = re.compile(r"(?i:\b(?:answer|option|choice)\b(?:\s+(?:is|would\s+be|will\s+be|should\s+be))?)\s*[:\-]?[\s*(\[]*"
                    r"(?:([A-Z])(?![A-Za-z0-9])|([a-z])(?=[\s*)\]]*(?:[.,:;!?)\]*]|$)))", re.MULTILINE)
MARKED = re.compile(r"\(([A-Za-z])\)|\*\*([A-Za-z])\*\*|(?<![A-Za-z0-9(])([A-Za-z])\)|^[\s*]*([A-Za-z])[.:](?=\s|$)", re.MULTILINE)
BARE = re.compile(r"(?<![A-Za-z0-9'])([A-Z])(?![A-Za-z0-9'])")


def parse_letter(response: str, n_choices: int) -> str | None:
    """The option letter the response gives, or None when it gives none or several.

    "B", "(B)", "B.", "B) Paris", "The answer is B.", "Answer: B", "**B**", "I think (c)" -> "B" / "C";
    "A or B", "I don't know", "E" (of four options) -> None.
    """
    letters = ascii_uppercase[:n_choices]
    for pattern in (STATED, MARKED, BARE):
        if pattern is STATED:
            found = [upper or lower for upper, lower in (match.groups() for match in pattern.finditer(response))]
        else:
            found = [next(group for group in match.groups() if group) for match in pattern.finditer(response)]
        named = {letter.upper() for letter in found if letter.upper() in letters}
        if len(named) == 1:
            return named.pop()
        if named:
            return None
    return None


def mc_question(record: dict, position: int, task: str) -> tuple[str, int, str]:
    """(the user's turn, the number of options, the right letter) for a multiple-choice record."""
    choices = record.get("choice_texts") or record.get("choices")
    question = record.get("question")
    if not isinstance(question, str) or not isinstance(choices, Sequence) or isinstance(choices, str) or len(choices) < 2:
        raise GptlabError(f"{task} record {position} ({record.get('id', 'no id')}) needs the raw 'question' and its 'choices' "
                          "texts (gptlab.eval.tasks.sources keeps them)")
    if len(choices) > len(ascii_uppercase) or not isinstance(record.get("gold"), int) or not 0 <= record["gold"] < len(choices):
        raise GptlabError(f"{task} record {position}: gold {record.get('gold')!r} is not one of its {len(choices)} options")
    letters = ascii_uppercase[: len(choices)]
    options = "\n".join(f"{letter}. {str(choice).strip()}" for letter, choice in zip(letters, choices))
    ask = f"{', '.join(letters[:-1])} or {letters[-1]}"
    text = f"{question.strip()}\n\n{options}\n\nAnswer with the letter of the right option ({ask})."
    return text, len(choices), letters[record["gold"]]


@dataclass
class ChatResponder:
    """A chat model's replies: greedy (gptlab.eval.chat.respond) or sampled with a seed. Tests pass a scripted stand-in."""

    model: GPT
    chat: ChatFormat
    batch_size: int = 32
    autocast: object = None

    def greedy(self, questions: Sequence[str], *, max_new_tokens: int) -> list[str]:
        return respond(self.model, self.chat, list(questions), batch_size=self.batch_size,
                       max_new_tokens=self.fit(max_new_tokens), autocast=self.autocast)

    def sample(self, question: str, n: int, *, seed: int, temperature: float, max_new_tokens: int) -> list[str]:
        """n replies to one question; batches of the same prompt, each batch seeded from `seed`, so they repeat exactly."""
        tokenizer = self.chat.tokenizer
        prompt = self.chat.prompt([{"role": "user", "content": question}])
        replies: list[str] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for batch, start in enumerate(range(0, n, self.batch_size)):
                config = SamplingConfig(max_new_tokens=self.fit(max_new_tokens), temperature=temperature, seed=seed + batch,
                                        stop_tokens=self.chat.stop_tokens, vocab_size=tokenizer.vocab_size)
                with self.autocast or nullcontext():
                    outputs = generate(self.model, [prompt] * min(self.batch_size, n - start), config, truncate=True)
                replies += [tokenizer.decode([token for token in ids if token in tokenizer.vocab]) for ids in outputs]
        finally:
            self.model.train(was_training)
        return replies

    def fit(self, max_new_tokens: int) -> int:
        """At most half the context: a small model's context must still hold the question."""
        return max(1, min(max_new_tokens, self.model.config.block_size // 2))


def run_multiple_choice(task: str, records: Sequence[dict], responder, *, indices: Sequence[int], max_new_tokens: int) -> list[dict]:
    """One per-example record per question: the reply, the letter read from it, the right letter."""
    asked = [mc_question(record, index, task) for index, record in zip(indices, records)]
    replies = responder.greedy([text for text, _, _ in asked], max_new_tokens=max_new_tokens) if asked else []
    examples = []
    for index, record, (_, n_choices, gold), reply in zip(indices, records, asked, replies):
        letter = parse_letter(reply, n_choices)
        examples.append({"task": task, "index": index, "id": str(record.get("id", index)), "response": reply,
                         "letter": letter, "gold": gold, "choices": n_choices, "correct": letter == gold})
    return examples


def run_verified(task, examples: Sequence, responder, *, indices: Sequence[int], max_new_tokens: int) -> list[dict]:
    """A gptlab.chat.tasks task's questions answered greedily and checked by its verifier (gptlab.eval.chat.grade's steps)."""
    replies = responder.greedy([example.question for example in examples], max_new_tokens=max_new_tokens) if examples else []
    return [{"task": task.name, "index": index, "id": str(index), "question": example.question, "response": reply,
             "answer": example.answer, "correct": bool(task.verify(example, reply))}
            for index, example, reply in zip(indices, examples, replies)]


def evaluate_chat_suite(
    model: GPT | None,
    chat_format: ChatFormat | None,
    tasks: Sequence[str] = CHAT_TASKS,
    *,
    sources: Mapping[str, object] | None = None,
    limit: int | None = None,
    samples: int = 1,
    k: Sequence[int] = (1,),
    batch_size: int = 32,
    seed: int = 0,
    autocast=None,
    runner: Runner | None = None,
    responder=None,
    max_new_tokens: int | None = None,
    code_timeout: float = 10.0,
) -> tuple[list[CardRow], list[dict], Aggregate]:
    """(card rows, per-example records, ChatCORE) for the chat tasks, each on its first `limit` examples.

    `sources` maps a task to its data: a path or hf: name for gptlab.eval.tasks.sources (gsm8k: an hf: source
    for gptlab.chat.tasks.GSM8K), or a list of records already in the shared shape. `samples` > 1 adds pass@k rows
    for the code tasks, for each k in `k`; each program may run `code_timeout` seconds. `runner` replaces the
    sandbox and `responder` the model (tests).
    """
    tasks, sources, k = _check_options(tasks, sources, limit, samples, k, seed)
    if responder is None and (model is None or chat_format is None):
        raise GptlabError("the chat suite needs a model and its chat format (or a responder that answers for it)")
    responder = responder or ChatResponder(model, chat_format, batch_size=batch_size, autocast=autocast)
    rows: list[CardRow] = []
    headline: list[CardRow] = []  # each task's figure for ChatCORE: its accuracy or greedy pass@1
    everything: list[dict] = []
    for task in tasks:
        tokens = max_new_tokens or MAX_NEW_TOKENS["multiple_choice" if task in MC_TASKS else "code" if task in CODE_TASKS else task]
        examples, task_rows = _run_task(task, _load(task, sources.get(task), limit), responder, max_new_tokens=tokens,
                                        samples=samples, k=k, seed=seed, runner=runner, timeout=code_timeout)
        rows += task_rows
        headline.append(task_rows[0])
        everything += examples
    return rows, everything, centred_mean("ChatCORE", headline)


def _run_task(task: str, items, responder, *, max_new_tokens: int, samples: int, k, seed: int, runner,
              timeout: float) -> tuple[list[dict], list[CardRow]]:
    """One task's per-example records (every rank's) and its card rows."""
    if task in MC_TASKS:
        examples = _shared(items, partial(run_multiple_choice, task, responder=responder, max_new_tokens=max_new_tokens))
        unread = sum(example["letter"] is None for example in examples)
        chance = sum(1 / example["choices"] for example in examples) / len(examples)  # 0.25 when every question has 4 options
        return examples, [proportion_row(task, shots=0, metric="acc", right=sum(e["correct"] for e in examples), n=len(examples),
                                         chance=chance, note=f"{unread} answers named no single letter" if unread else "")]
    if task in CODE_TASKS:
        examples = _shared(items, partial(run_code_task, task, responder=responder, samples=samples, seed=seed,
                                          max_new_tokens=max_new_tokens, runner=runner, timeout=timeout))
        return examples, code_rows(task, examples, samples=samples, k=k, seed=seed)
    verified, questions = items
    examples = _shared(questions, partial(run_verified, verified, responder=responder, max_new_tokens=max_new_tokens))
    return examples, [proportion_row(task, shots=0, metric="acc", right=sum(e["correct"] for e in examples), n=len(examples))]


def _check_options(tasks, sources, limit, samples, k, seed) -> tuple[list[str], dict, list[int]]:
    """The task list and sources, or one clear error about the first bad option."""
    tasks = [tasks] if isinstance(tasks, str) else list(tasks)
    unknown = [task for task in tasks if task not in CHAT_TASKS]
    if unknown or not tasks:
        raise GptlabError(f"unknown chat task {unknown[0] if unknown else '(none given)'!r}; the chat suite's tasks are "
                          f"{', '.join(CHAT_TASKS)}")
    if len(set(tasks)) < len(tasks):
        raise GptlabError(f"a chat task is named twice in {', '.join(tasks)}: name each once")
    sources = dict(sources or {})
    stray = [name for name in sources if name not in tasks]
    if stray:
        raise GptlabError(f"a source is given for {stray[0]!r}, which is not among the tasks ({', '.join(tasks)})")
    if "spelling" in sources:
        raise GptlabError("spelling is generated by gptlab and reads no data: drop its source")
    for name, value, low in (("limit", limit, 1), ("samples", samples, 1), ("seed", seed, 0)):
        if (value is not None or name != "limit") and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise GptlabError(f"{name} must be a whole number of at least {low}, got {value!r}")
    k = [k] if isinstance(k, int) else list(k)
    for each in k:
        if isinstance(each, bool) or not isinstance(each, int) or each < 1:
            raise GptlabError(f"k must be whole numbers of at least 1 (pass@k), got {each!r}")
        if samples > 1 and each > samples:
            raise GptlabError(f"pass@{each} needs at least {each} samples per problem; pass samples={each} or more")
        if samples == 1 and each != 1 and any(task in CODE_TASKS for task in tasks):
            raise GptlabError(f"pass@{each} needs samples per problem: pass samples={max(each, 2)} or more (samples=1 is greedy pass@1)")
    return tasks, sources, k


def _load(task: str, source, limit: int | None):
    """A task's examples: shared-shape records (multiple choice, code), or (chat task, its Example list) for gsm8k and spelling."""
    if task in VERIFIED_TASKS:
        verified = get_task(task, source=source) if source is not None else get_task(task)
        size = verified.test_size
        return verified, verified.examples("test", min(limit or size, size))
    if isinstance(source, Sequence) and not isinstance(source, str):
        records = list(source)  # already loaded, e.g. by the caller or a test
    else:
        from gptlab.eval.tasks.sources import load_task_records  # the loaders read datasets: imported when data is needed

        records = list(load_task_records(task, source=source).records)
    if not records:
        raise GptlabError(f"{task}: its source holds no examples")
    return records[:limit] if limit else records


def _shared(items: Sequence, run) -> list[dict]:
    """run(this rank's items, their indices) on items r, r + world, ...; every rank gets all results, in index order."""
    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if (
        torch.distributed.is_available() and torch.distributed.is_initialized()) else (0, 1)
    indices = list(range(rank, len(items), world))
    mine = run([items[i] for i in indices], indices=indices)
    if world == 1:
        return mine
    gathered: list = [None] * world
    torch.distributed.all_gather_object(gathered, mine)
    return sorted((example for share in gathered for example in share), key=lambda example: example["index"])
