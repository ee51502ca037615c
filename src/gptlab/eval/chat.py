"""Chat task accuracy: the model answers each held-out question greedily, the task's verifier grades the answer.

    from gptlab.eval.chat import evaluate_task, grade
    evaluate_task(model, chat, get_task("arithmetic"), n=200)
        {"accuracy": 0.415, "correct": 83, "total": 200}
    for question, response, correct in grade(model, chat, task, task.examples("test", 3)):
        print(question, "->", response, "ok" if correct else "wrong")

A prompt is the question alone as a user turn, rendered with
`chat.prompt` (ending in `<|assistant|>`); the response is what the model
writes before its first stop token (`chat.stop_tokens`), at most
`max_new_tokens` tokens, greedy, decoded with the chat tokenizer. Prompts are
generated in batches of similar length (gptlab.infer.generate pads on the
left; a row's tokens are the same as when it is generated alone), and a
prompt too long for the context keeps its last tokens. Under
torch.distributed, rank r answers examples r, r + world, ... and the counts
are summed over ranks, so every rank returns the same result.

Not here: the tasks and their verifiers (gptlab.chat.tasks), the decoding
engine (gptlab.infer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import NamedTuple

import torch

from gptlab.chat import ChatFormat
from gptlab.chat.tasks import Example, Task, get_task
from gptlab.infer.generate import SamplingConfig, generate
from gptlab.model import GPT
from gptlab.runtime import GptlabError


class Graded(NamedTuple):
    """One question, the model's response to it, and whether the task's verifier accepts the response."""

    question: str
    response: str
    correct: bool


def respond(
    model: GPT,
    chat: ChatFormat,
    questions: Sequence[str],
    *,
    batch_size: int = 32,
    max_new_tokens: int = 48,
    autocast=None,
) -> list[str]:
    """The model's greedy reply to each question (asked alone, as the user), in the questions' order."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GptlabError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
    tokenizer = chat.tokenizer
    config = SamplingConfig(
        max_new_tokens=max_new_tokens, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=tokenizer.vocab_size
    )
    prompts = [chat.prompt([{"role": "user", "content": question}]) for question in questions]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batched: little padding
    responses = [""] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            with autocast or nullcontext():
                outputs = generate(model, [prompts[i] for i in rows], config, truncate=True)
            for i, ids in zip(rows, outputs):
                # an untrained model may emit ids that no token uses (the vocabulary's gaps): they spell nothing
                responses[i] = tokenizer.decode([token for token in ids if token in tokenizer.vocab])
    finally:
        model.train(was_training)
    return responses


def grade(
    model: GPT,
    chat: ChatFormat,
    task: Task,
    examples: Sequence[Example],
    *,
    batch_size: int = 32,
    max_new_tokens: int = 48,
    autocast=None,
) -> list[Graded]:
    """(question, response, correct) for each example, on this process alone: e.g. a few to print in a demo."""
    questions = [example.question for example in examples]
    responses = respond(model, chat, questions, batch_size=batch_size, max_new_tokens=max_new_tokens, autocast=autocast)
    return [Graded(example.question, response, task.verify(example, response)) for example, response in zip(examples, responses)]


def evaluate_task(
    model: GPT,
    chat: ChatFormat,
    task: Task,
    *,
    n: int = 200,
    split: str = "test",
    batch_size: int = 32,
    max_new_tokens: int = 48,
    autocast=None,
) -> dict:
    """{"accuracy", "correct", "total"} over the first n examples of the split, every rank taking its share."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GptlabError(f"n must be a whole number of at least 1 example, got {n!r}")
    examples = task.examples(split, n)
    rank, world_size = _rank_and_world()
    mine = examples[rank::world_size]
    graded = grade(model, chat, task, mine, batch_size=batch_size, max_new_tokens=max_new_tokens, autocast=autocast) if mine else []
    counts = torch.tensor([sum(g.correct for g in graded), len(graded)], dtype=torch.float64)
    if world_size > 1:
        counts = counts.to(next(model.parameters()).device)  # NCCL reduces only GPU tensors
        torch.distributed.all_reduce(counts)
        counts = counts.cpu()
    correct, total = int(counts[0]), int(counts[1])
    return {"accuracy": correct / total, "correct": correct, "total": total}


def task_accuracy_fn(chat: ChatFormat, task_names: list[str | Task], n: int, **options) -> Callable[[GPT], dict[str, float]]:
    """A function model -> {"<name>_accuracy": value, ...} for the Trainer's `task_fn`.

    `options` (batch_size, max_new_tokens, autocast, split) go to evaluate_task. Unknown task names
    raise here, before training starts. A task whose held-out split is smaller than n is evaluated on all of it.
    """
    tasks = [name if isinstance(name, Task) else get_task(name) for name in task_names]

    def evaluate(model: GPT) -> dict[str, float]:
        return {f"{task.name}_accuracy": evaluate_task(model, chat, task, n=_capped(task, n, options), **options)["accuracy"]
                for task in tasks}

    return evaluate


def _capped(task: Task, n: int, options: dict) -> int:
    """n, or the whole held-out split when it is smaller (1-digit addition has 25 held-out questions)."""
    size = getattr(task, "test_size", None)
    return min(n, size) if size and options.get("split", "test") == "test" else n


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
