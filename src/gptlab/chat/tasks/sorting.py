"""Sorting: put a few distinct words in alphabetical order, or numbers from smallest to largest.

    Example(question="Sort alphabetically: pear, crown, apple", reply="apple, crown, pear", answer="apple, crown, pear")
    Example(question="Sort from smallest to largest: 42, 7, 19", reply="7, 19, 42", answer="7, 19, 42")

Items are distinct, so the sorted order is unique. The verifier reads the
last line of the response (after its last colon, if any), splits it at commas
and spaces and compares the items in order, ignoring case and trailing
punctuation. Words come from gptlab.chat.tasks.words. Not here: the Task
machinery (gptlab.chat.tasks.base).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from gptlab.chat.tasks.base import Example, Task
from gptlab.chat.tasks.words import WORDS
from gptlab.runtime import GptlabError

KINDS = ("words", "numbers")
MAX_ITEMS = 10
NUMBERS = range(100)  # numbers to sort: 0 to 99


@dataclass(frozen=True)
class Sorting(Task):
    """Sorting(items="numbers", max_items=6) for longer lists of numbers; the default sorts 3 or 4 words."""

    name = "sorting"
    items: str = "words"  # "words" or "numbers"
    min_items: int = 3
    max_items: int = 4

    def __post_init__(self) -> None:
        if self.items not in KINDS:
            raise GptlabError(f"sorting items must be one of {', '.join(KINDS)}, got {self.items!r}")
        for field in ("min_items", "max_items"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_ITEMS:
                raise GptlabError(f"sorting {field} must be a whole number from 2 to {MAX_ITEMS}, got {value!r}")
        if self.min_items > self.max_items:
            raise GptlabError(f"sorting min_items={self.min_items} is more than max_items={self.max_items}; swap them")

    def make(self, rng: random.Random) -> Example:
        count = rng.randint(self.min_items, self.max_items)
        if self.items == "words":
            drawn = rng.sample(WORDS, count)
            ordered, prompt = sorted(drawn), "Sort alphabetically"
        else:
            numbers = rng.sample(NUMBERS, count)
            drawn, ordered, prompt = [str(n) for n in numbers], [str(n) for n in sorted(numbers)], "Sort from smallest to largest"
        answer = ", ".join(ordered)
        return Example(question=f"{prompt}: {', '.join(drawn)}", reply=answer, answer=answer)

    def verify(self, example: Example, response: str) -> bool:
        return read_items(response) == example.answer.split(", ")


def read_items(response: str) -> list[str]:
    """The items of the response's last non-empty line, after its last colon: "Sorted: b, a." -> ["b", "a"]."""
    lines = [line for line in response.strip().splitlines() if line.strip()]
    if not lines:
        return []
    listed = lines[-1].rsplit(":", 1)[-1]
    return [item.strip(".!?;'\"").lower() for item in re.split(r"[,\s]+", listed) if item.strip(".!?;'\"")]
