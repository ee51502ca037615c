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

Tools. With `tools=` (a ChatTools: the declarations and a fresh tool loop per
reply; gptlab.tools.turn.chat_tools makes one from a toolbox) each prompt
offers the tools in its tools block, the calls the model makes run while it
generates and their results are fed back (gptlab.infer.tool_loop), and what
is graded is the final answer: the reply's last assistant message, the text
after the last tool result ("" when the reply ended in a call). What that
costs is counted per answer: tokens the model generated, tokens the tools fed
(each result as a tool message and the assistant's opening after it), and
calls that ran (results fed):

    evaluate_task(model, chat, Arithmetic(digits=4, tools=1), n=200, tools=chat_tools(chat, load_tools("calculator")))
        {"accuracy": 0.93, "correct": 186, "total": 200, "generated_tokens": 21.4, "fed_tokens": 5.2, "tool_calls": 1.0}

Not here: the tasks and their verifiers (gptlab.chat.tasks), the decoding
engine (gptlab.infer), the tools and their loop (gptlab.tools: it sits above
eval, as the python tool runs in eval's sandbox).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from gptlab.chat import ChatFormat
from gptlab.chat.tasks import Example, Task, get_task
from gptlab.infer.generate import SamplingConfig, generate
from gptlab.infer.tool_loop import ToolTurn
from gptlab.model import GPT
from gptlab.runtime import GptlabError

TOOL_ROOM = 48  # tokens beyond max_new_tokens a reply with tools may take, for the results fed back


class Graded(NamedTuple):
    """One question, the model's response to it, and whether the task's verifier accepts the response."""

    question: str
    response: str
    correct: bool


@dataclass(frozen=True)
class ChatTools:
    """Tools a model may call while it answers: their declarations (the prompt's tools block, the OpenAI shape) and
    `turn()`, a fresh tool loop for one reply (gptlab.tools.turn.chat_tools builds both from a toolbox)."""

    specs: tuple[Mapping, ...]
    turn: Callable[[], ToolTurn]


class Reply(NamedTuple):
    """A generated reply: the text graded, every token of it (tools' results included, the final stop token left
    out), and what it cost: tokens the tools fed and the calls that ran."""

    text: str
    ids: list[int]
    fed: int = 0
    calls: int = 0

    @property
    def generated(self) -> int:
        """Tokens the model chose itself."""
        return len(self.ids) - self.fed


def question_prompt(chat: ChatFormat, question: str, tools: ChatTools | None = None) -> list[int]:
    """The ids a question is answered from: the question alone as the user's turn, after the tools block when
    `tools` offers some."""
    return chat.prompt([{"role": "user", "content": question}], tools=tools.specs if tools is not None else None)


def final_answer(chat: ChatFormat, ids: Sequence[int]) -> str:
    """The text after the last tool result: the reply's last message when it is the assistant's, else "" (a reply
    cut off in a call or just after a result gives no answer). Ids no token uses (an untrained model's) are dropped."""
    known = [token for token in ids if token in chat.tokenizer.vocab and token != chat.bos]
    messages = chat.parse_reply(known)
    return messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""


def tool_costs(chat: ChatFormat, ids: Sequence[int]) -> tuple[int, int]:
    """(tokens the tools fed, calls that ran: the results fed) of a reply's ids (ChatFormat.generated_mask)."""
    mask = chat.generated_mask(ids)
    calls = sum(1 for token, own in zip(ids, mask) if not own and token == chat.role_ids["tool"])
    return len(mask) - sum(mask), calls


def tool_reply(chat: ChatFormat, ids: list[int]) -> Reply:
    """A reply generated with tools: its final answer and its costs."""
    fed, calls = tool_costs(chat, ids)
    return Reply(final_answer(chat, ids), ids, fed=fed, calls=calls)


def tool_budget(config: SamplingConfig, model: GPT, prompts: list[list[int]]) -> SamplingConfig:
    """With tools, the results fed back take room too: up to TOOL_ROOM more tokens, as far as the context has room
    after the batch's longest prompt (never fewer than asked)."""
    room = model.config.block_size - max(len(prompt) for prompt in prompts)
    return replace(config, max_new_tokens=max(config.max_new_tokens, min(config.max_new_tokens + TOOL_ROOM, room)))


def replies(
    model: GPT,
    chat: ChatFormat,
    questions: Sequence[str],
    *,
    tools: ChatTools | None = None,
    batch_size: int = 32,
    max_new_tokens: int = 48,
    autocast=None,
) -> list[Reply]:
    """The model's greedy reply to each question (asked alone, as the user), in the questions' order; with `tools`,
    each reply runs its own tool loop (module docstring)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GptlabError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
    tokenizer = chat.tokenizer
    config = SamplingConfig(
        max_new_tokens=max_new_tokens, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=tokenizer.vocab_size
    )
    prompts = [question_prompt(chat, question, tools) for question in questions]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batched: little padding
    answers: list[Reply] = [Reply("", [])] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            loops = {} if tools is None else {"tools": [tools.turn() for _ in rows]}  # without tools: the call as before
            batch = config if tools is None else tool_budget(config, model, [prompts[i] for i in rows])
            with autocast or nullcontext():
                outputs = generate(model, [prompts[i] for i in rows], batch, truncate=True, **loops)
            for i, ids in zip(rows, outputs):
                # an untrained model may emit ids that no token uses (the vocabulary's gaps): they spell nothing
                answers[i] = tool_reply(chat, ids) if tools is not None else \
                    Reply(tokenizer.decode([token for token in ids if token in tokenizer.vocab]), ids)
    finally:
        model.train(was_training)
    return answers


def respond(
    model: GPT,
    chat: ChatFormat,
    questions: Sequence[str],
    *,
    tools: ChatTools | None = None,
    batch_size: int = 32,
    max_new_tokens: int = 48,
    autocast=None,
) -> list[str]:
    """The model's greedy reply to each question (asked alone, as the user), in the questions' order: with `tools`,
    its final answer."""
    return [reply.text for reply in replies(model, chat, questions, tools=tools, batch_size=batch_size,
                                            max_new_tokens=max_new_tokens, autocast=autocast)]


def grade(
    model: GPT,
    chat: ChatFormat,
    task: Task,
    examples: Sequence[Example],
    *,
    tools: ChatTools | None = None,
    batch_size: int = 32,
    max_new_tokens: int = 48,
    autocast=None,
) -> list[Graded]:
    """(question, response, correct) for each example, on this process alone: e.g. a few to print in a demo."""
    questions = [example.question for example in examples]
    responses = respond(model, chat, questions, tools=tools, batch_size=batch_size, max_new_tokens=max_new_tokens,
                        autocast=autocast)
    return [Graded(example.question, response, task.verify(example, response)) for example, response in zip(examples, responses)]


def evaluate_task(
    model: GPT,
    chat: ChatFormat,
    task: Task,
    *,
    n: int = 200,
    split: str = "test",
    tools: ChatTools | None = None,
    costs: bool = False,
    batch_size: int = 32,
    max_new_tokens: int = 48,
    autocast=None,
) -> dict:
    """{"accuracy", "correct", "total"} over the first n examples of the split, every rank taking its share; with
    `tools` (or `costs`) also the means per answer of "generated_tokens", "fed_tokens" and "tool_calls"."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GptlabError(f"n must be a whole number of at least 1 example, got {n!r}")
    examples = task.examples(split, n)
    rank, world_size = _rank_and_world()
    mine = examples[rank::world_size]
    answers = replies(model, chat, [example.question for example in mine], tools=tools, batch_size=batch_size,
                      max_new_tokens=max_new_tokens, autocast=autocast) if mine else []
    right = sum(task.verify(example, answer.text) for example, answer in zip(mine, answers))
    counts = torch.tensor([right, len(answers), sum(a.generated for a in answers), sum(a.fed for a in answers),
                           sum(a.calls for a in answers)], dtype=torch.float64)
    if world_size > 1:
        counts = counts.to(next(model.parameters()).device)  # NCCL reduces only GPU tensors
        torch.distributed.all_reduce(counts)
        counts = counts.cpu()
    correct, total = int(counts[0]), int(counts[1])
    result = {"accuracy": correct / total, "correct": correct, "total": total}
    if tools is not None or costs:
        result.update(zip(COSTS, (float(count) / total for count in counts[2:])))
    return result


COSTS = ("generated_tokens", "fed_tokens", "tool_calls")  # evaluate_task's means per answer of what answering cost


def task_accuracy_fn(chat: ChatFormat, task_names: list[str | Task], n: int, *,
                     tools: Callable[[Task], ChatTools | None] | None = None, **options) -> Callable[[GPT], dict[str, float]]:
    """A function model -> {"<name>_accuracy": value, ...} for the Trainer's `task_fn`.

    `options` (batch_size, max_new_tokens, autocast, split) go to evaluate_task; `tools(task)` gives the tools a
    task's questions are answered with (None: none). Unknown task names raise here, before training starts. A task
    whose held-out split is smaller than n is evaluated on all of it.
    """
    tasks = [name if isinstance(name, Task) else get_task(name) for name in task_names]
    offered = [tools(task) if tools is not None else None for task in tasks]  # loaded now: a bad one raises here
    keys = accuracy_keys([task.name + ("_tools" if offer is not None else "") for task, offer in zip(tasks, offered)])

    def evaluate(model: GPT) -> dict[str, float]:
        return {key: evaluate_task(model, chat, task, n=_capped(task, n, options), tools=offer, **options)["accuracy"]
                for key, task, offer in zip(keys, tasks, offered)}

    return evaluate


def accuracy_keys(names: list[str]) -> list[str]:
    """"<name>_accuracy" per task; a name met again (one task in two settings) gets _2, _3, ... so none is lost."""
    seen: dict[str, int] = {}
    keys = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        keys.append(f"{name}_accuracy" if seen[name] == 1 else f"{name}_{seen[name]}_accuracy")
    return keys


def _capped(task: Task, n: int, options: dict) -> int:
    """n, or the whole held-out split when it is smaller (1-digit addition has 25 held-out questions)."""
    size = getattr(task, "test_size", None)
    return min(n, size) if size and options.get("split", "test") == "test" else n


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
