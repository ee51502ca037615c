"""Arithmetic: add, subtract or multiply two whole numbers of up to `digits` digits.

    Example(question="What is 23 + 58?", reply="23 + 58 = 81", answer="81")

Each operand first draws its length (1 to `digits` digits), then its value, so
short sums are as common as long ones and a small model meets easy cases
early. Subtraction puts the larger operand first: answers are never negative.
The verifier reads the last whole number of the response. Not here: the
Task machinery (gptlab.chat.tasks.base).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from gptlab.chat.tasks.base import Example, Task, last_integer
from gptlab.runtime import GptlabError

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
MAX_DIGITS = 9


EQUATION = re.compile(r"(\d+\s*[-+*]\s*\d+)\s*=")  # "23 + 58 =" in a reply


@dataclass(frozen=True)
class Arithmetic(Task):
    """Arithmetic(digits=3, ops="+-") for harder sums; the default is 2-digit addition."""

    name = "arithmetic"
    digits: int = 2  # operands have 1 to `digits` digits
    ops: str = "+"  # the operations to draw from, any of "+-*"
    work: int = 1  # 1: the reply restates the sum ("23 + 58 = 81"); 0: the answer alone ("81")

    def __post_init__(self) -> None:
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or not 1 <= self.digits <= MAX_DIGITS:
            raise GptlabError(f"arithmetic digits must be a whole number from 1 to {MAX_DIGITS}, got {self.digits!r}")
        if not isinstance(self.ops, str) or not self.ops or set(self.ops) - set(OPERATIONS) or len(set(self.ops)) < len(self.ops):
            raise GptlabError(f"arithmetic ops must be distinct characters from {''.join(OPERATIONS)!r}, e.g. '+-', got {self.ops!r}")
        if self.work not in (0, 1) or isinstance(self.work, bool):
            raise GptlabError(f"arithmetic work must be 1 (restate the sum) or 0 (the answer alone), got {self.work!r}")

    @property
    def test_size(self) -> int:  # type: ignore[override]
        """500, or a quarter of the distinct questions when there are fewer (1-digit sums: 100 questions, 25 held out)."""
        pairs = 10 ** (2 * self.digits)
        questions = sum(pairs // 2 if op == "-" else pairs for op in self.ops)  # a - b with a >= b: about half the pairs
        return min(500, questions // 4)

    def make(self, rng: random.Random) -> Example:
        op = rng.choice(self.ops)
        a, b = self._operand(rng), self._operand(rng)
        if op == "-" and a < b:
            a, b = b, a
        result = OPERATIONS[op](a, b)
        reply = f"{a} {op} {b} = {result}" if self.work else str(result)
        return Example(question=f"What is {a} {op} {b}?", reply=reply, answer=str(result))

    def _operand(self, rng: random.Random) -> int:
        length = rng.randint(1, self.digits)
        low = 0 if length == 1 else 10 ** (length - 1)
        return rng.randint(low, 10**length - 1)

    def verify(self, example: Example, response: str) -> bool:
        """The last number is the answer; a restated sum must be the question's ("9 + 2 = 10" for 8 + 2 is wrong)."""
        restated = EQUATION.search(response)
        if restated and " ".join(restated.group(1).replace("+", " + ").replace("-", " - ").replace("*", " * ").split()) != example.question.removeprefix("What is ").removesuffix("?"):
            return False
        return last_integer(response) == int(example.answer)
