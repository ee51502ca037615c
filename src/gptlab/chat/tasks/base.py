"""Built-in chat tasks: the Example, and the Task base class with fixed train and test splits.

A task makes examples from a random generator, renders one as a conversation
for SFT, and checks a model's response against the example's answer:

    task = Arithmetic()
    example = task.examples("train", 1)[0]
        Example(question="What is 23 + 58?", reply="23 + 58 = 81", answer="81")
    task.conversation(example)
        [{"role": "user", "content": "What is 23 + 58?"}, {"role": "assistant", "content": "23 + 58 = 81"}]
    task.verify(example, "I think it is 81.")  -> True   (the last number is read)
    task.reward(example, "80")                 -> 0.0

A task that offers tools (its `toolbox`, declared in gptlab.chat.tool_specs, and its
option `tools=1`) answers with tool calls: the example's `turns` are the assistant-side
messages after the question, OpenAI's shape, and its conversation is a
gptlab.chat.format.Conversation that carries the tools offered:

    Arithmetic(digits=4, tools=1).conversation(example)
        Conversation([{"role": "user", "content": "What is 1234 * 5678?"},
                      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "calculator", "arguments": '{"expression": "1234 * 5678"}'}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "7006652"},
                      {"role": "assistant", "content": "1234 * 5678 = 7006652"}], tools=[CALCULATOR])

`reply` stays the final message's content and `answer` the canonical answer, so
verifiers read the final message as they read any reply. Tool options never
change what `make` draws: the questions, and so both splits, are the same with
and without tools.

Splits are fixed: each split draws from `random.Random("gptlab/<name>/<split>")`
(a string seed is hashed with SHA-512 by `random`, never with the salted
`hash()`, so every process and run sees the same examples). The test split is
the first `test_size` distinct questions of its stream, and `examples("test",
n)` its first n. The train split is its own stream with every question of the
test split skipped, so the two never share a question; train questions may
repeat. Both are prefixes: asking for more examples extends the list.

A new task is a subclass (a frozen dataclass whose fields are its difficulty
options) that sets `name` and implements `make(rng)` and `verify`. Not here:
tokenizing and rendering to ids (gptlab.chat.format), generating and scoring
responses with a model (gptlab.eval.chat).
"""

from __future__ import annotations

import copy
import functools
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from gptlab.chat.format import Conversation
from gptlab.runtime import GptlabError

SPLITS = ("train", "test")
DRAWS_PER_EXAMPLE = 50  # draws allowed per wanted example before a split is declared exhausted
INTEGER = re.compile(r"(?<!\d)-?\d+")  # a minus right after a digit is subtraction, not a sign


@dataclass(frozen=True)
class Example:
    question: str  # the user's message
    reply: str  # the assistant's full reply used for SFT (may show work, e.g. "23 + 58 = 81")
    answer: str  # the canonical final answer the verifier expects (e.g. "81")
    # A tool-using reply's messages after the question: calls, tool results, then the final answer (content `reply`).
    # Left out of the hash (its dicts cannot be hashed); equal examples still hash alike.
    turns: tuple = field(default=(), hash=False)


class Task:
    """Base class: subclasses set `name` and implement `make(rng)` and `verify(example, response)`."""

    name: ClassVar[str] = "task"
    test_size: ClassVar[int] = 500  # distinct questions held out in the test split
    generated: ClassVar[bool] = True  # examples drawn by make(rng), with no data to read; False: from a dataset (gsm8k)
    toolbox: ClassVar[tuple[dict, ...]] = ()  # declarations of the tools its replies may call (gptlab.chat.tool_specs)
    tools = 0  # a task with a toolbox makes this an option: 1 offers the toolbox and its replies call it

    @property
    def offered_tools(self) -> tuple[dict, ...]:
        """The tool declarations its conversations offer: the toolbox when `tools` is on, else ()."""
        return self.toolbox if self.tools else ()

    @property
    def offers_tools(self) -> bool:
        """Whether its conversations offer tools (and its replies call them)."""
        return bool(self.offered_tools)

    def make(self, rng: random.Random) -> Example:
        """One example drawn with `rng` (the only source of randomness, so splits are reproducible)."""
        raise NotImplementedError

    def verify(self, example: Example, response: str) -> bool:
        """Whether `response` (read leniently) gives the example's answer."""
        raise NotImplementedError

    def reward(self, example: Example, response: str) -> float:
        """1.0 when `verify` accepts the response, else 0.0 (a reward for reinforcement learning)."""
        return 1.0 if self.verify(example, response) else 0.0

    def conversation(self, example: Example) -> list[dict]:
        """The example as a user question and the assistant's reply: a conversation for ChatFormat.render; with
        tools, a Conversation of the question, the example's turns (copies: callers may edit them) and the tools."""
        if not self.offers_tools:
            return [*self.prompt(example), {"role": "assistant", "content": example.reply}]
        turns = copy.deepcopy(example.turns) or ({"role": "assistant", "content": example.reply},)
        return Conversation([*self.prompt(example), *turns], tools=self.offered_tools)

    def prompt(self, example: Example) -> list[dict]:
        """The conversation up to the assistant's reply: the user's question (a Conversation with its tools)."""
        question = [{"role": "user", "content": example.question}]
        return Conversation(question, tools=self.offered_tools) if self.offers_tools else question

    def examples(self, split: str, n: int) -> list[Example]:
        """The first n examples of a split ("train" or "test"); the same list in every process and run."""
        if split not in SPLITS:
            raise GptlabError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise GptlabError(f"n must be a whole number of examples (0 or more), got {n!r}")
        if split == "test":
            held_out = self._test_split()
            if n > len(held_out):
                raise GptlabError(f"the {self.name} test split holds {len(held_out)} examples; ask for at most that, got n={n}")
            return list(held_out[:n])
        return self._train_split(n)

    # Splits are cached per task configuration: tasks are frozen dataclasses, so equal options share them.
    @functools.cache  # noqa: B019 (tasks are small, hashable configs; the cache holds a few hundred examples each)
    def _test_split(self) -> tuple[Example, ...]:
        rng = random.Random(f"gptlab/{self.name}/test")
        held_out: dict[str, Example] = {}
        for _ in range(self.test_size * DRAWS_PER_EXAMPLE):
            example = self.make(rng)
            held_out.setdefault(example.question, example)
            if len(held_out) == self.test_size:
                return tuple(held_out.values())
        raise GptlabError(
            f"{self!r} has too few distinct questions for a test split of {self.test_size}: "
            f"found {len(held_out)}; make the task harder (e.g. more digits or items)"
        )

    def _train_split(self, n: int) -> list[Example]:
        rng = random.Random(f"gptlab/{self.name}/train")
        held_out = {example.question for example in self._test_split()}
        found: list[Example] = []
        for _ in range((n + 1) * DRAWS_PER_EXAMPLE):
            if len(found) == n:
                return found
            example = self.make(rng)
            if example.question not in held_out:
                found.append(example)
        if len(found) == n:
            return found
        raise GptlabError(f"{self!r} drew only {len(found)} train examples outside its test split; make the task harder")


def tool_turns(calls: Sequence[tuple[str, dict, str]], final: str) -> tuple[dict, ...]:
    """The turns of a tool-using reply: for each (tool, arguments, result) an assistant message calling the tool
    (ids call_1, call_2, ... in order) and the tool's result, then the final answer `final`.

        tool_turns([("calculator", {"expression": "2 + 3"}, "5")], "2 + 3 = 5")
        ({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "calculator", "arguments": '{"expression": "2 + 3"}'}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "5"},
         {"role": "assistant", "content": "2 + 3 = 5"})
    """
    turns: list[dict] = []
    for number, (tool, arguments, result) in enumerate(calls, start=1):
        call = {"id": f"call_{number}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments, ensure_ascii=False)}}  # fmt: skip
        turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
        turns.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    turns.append({"role": "assistant", "content": final})
    return tuple(turns)


def last_integer(response: str) -> int | None:
    """The last whole number written in the response, or None: "so 3 + 4 = 7." -> 7, "12-5" -> 5, "1,024" -> 1024."""
    numbers = INTEGER.findall(response.replace(",", ""))
    return int(numbers[-1]) if numbers else None
