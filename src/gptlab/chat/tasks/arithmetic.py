"""Arithmetic: add, subtract or multiply two whole numbers of up to `digits` digits.

    Example(question="What is 23 + 58?", reply="23 + 58 = 81", answer="81")

Each operand first draws its length (`min_digits` to `digits` digits, 1 to
`digits` by default), then its value, so short sums are as common as long ones
and a small model meets easy cases early; `min_digits=digits` asks only
full-length operands (held-out 4-digit products:
`task:arithmetic[digits=4,min_digits=4,ops=*]`). Subtraction puts the larger
operand first: answers are never negative.

With `tools=1` the reply calls the calculator (gptlab.chat.tool_specs.CALCULATOR)
with the question's expression, and the final message is the usual reply:

    Example(question="What is 1234 * 5678?", reply="1234 * 5678 = 7006652", answer="7006652", turns=(
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression": "1234 * 5678"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "7006652"},
        {"role": "assistant", "content": "1234 * 5678 = 7006652"}))

`tools` and `work` shape only the reply: the questions drawn, and so both splits,
are the same whatever they are, so accuracy with and without the calculator is
measured on the same held-out questions. The verifier reads the last whole
number of the response (its final message). Not here: the Task machinery
(gptlab.chat.tasks.base).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from gptlab.chat.tasks.base import Example, Task, last_integer, tool_turns
from gptlab.chat.tool_specs import CALCULATOR
from gptlab.runtime import GptlabError

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
MAX_DIGITS = 9


EQUATION = re.compile(r"(\d+\s*[-+*]\s*\d+)\s*=")  # "23 + 58 =" in a reply


@dataclass(frozen=True)
class Arithmetic(Task):
    """Arithmetic(digits=3, ops="+-") for harder sums; the default is 2-digit addition."""

    name = "arithmetic"
    toolbox = (CALCULATOR,)
    digits: int = 2  # operands have min_digits to `digits` digits
    ops: str = "+"  # the operations to draw from, any of "+-*"
    work: int = 1  # 1: the reply restates the sum ("23 + 58 = 81"); 0: the answer alone ("81")
    tools: int = 0  # 1: the reply calls the calculator with the sum, then gives the reply as above
    min_digits: int = 1  # the fewest digits an operand has; `digits` asks only full-length operands

    def __post_init__(self) -> None:
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or not 1 <= self.digits <= MAX_DIGITS:
            raise GptlabError(f"arithmetic digits must be a whole number from 1 to {MAX_DIGITS}, got {self.digits!r}")
        if isinstance(self.min_digits, bool) or not isinstance(self.min_digits, int) or not 1 <= self.min_digits <= self.digits:
            raise GptlabError(f"arithmetic min_digits must be a whole number from 1 to digits={self.digits}, got {self.min_digits!r}")
        if not isinstance(self.ops, str) or not self.ops or set(self.ops) - set(OPERATIONS) or len(set(self.ops)) < len(self.ops):
            raise GptlabError(f"arithmetic ops must be distinct characters from {''.join(OPERATIONS)!r}, e.g. '+-', got {self.ops!r}")
        if self.work not in (0, 1) or isinstance(self.work, bool):
            raise GptlabError(f"arithmetic work must be 1 (restate the sum) or 0 (the answer alone), got {self.work!r}")
        if self.tools not in (0, 1) or isinstance(self.tools, bool):
            raise GptlabError(f"arithmetic tools must be 1 (call the calculator) or 0 (answer directly), got {self.tools!r}")

    @property
    def test_size(self) -> int:  # type: ignore[override]
        """500, or a quarter of the distinct questions when there are fewer (1-digit sums: 100 questions, 25 held out)."""
        shortest = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
        pairs = (10**self.digits - shortest) ** 2
        questions = sum(pairs // 2 if op == "-" else pairs for op in self.ops)  # a - b with a >= b: about half the pairs
        return min(500, questions // 4)

    def make(self, rng: random.Random) -> Example:
        op = rng.choice(self.ops)
        a, b = self._operand(rng), self._operand(rng)
        if op == "-" and a < b:
            a, b = b, a
        result = OPERATIONS[op](a, b)
        reply = f"{a} {op} {b} = {result}" if self.work else str(result)
        # Drawn above whatever the options: the reply's form must never change the questions (or the splits).
        turns = tool_turns([("calculator", {"expression": f"{a} {op} {b}"}, str(result))], reply) if self.tools else ()
        return Example(question=f"What is {a} {op} {b}?", reply=reply, answer=str(result), turns=turns)

    def _operand(self, rng: random.Random) -> int:
        length = rng.randint(self.min_digits, self.digits)
        low = 0 if length == 1 else 10 ** (length - 1)
        return rng.randint(low, 10**length - 1)

    def verify(self, example: Example, response: str) -> bool:
        """The last number is the answer; a restated sum must be the question's ("9 + 2 = 10" for 8 + 2 is wrong)."""
        restated = EQUATION.search(response)
        if restated and " ".join(restated.group(1).replace("+", " + ").replace("-", " - ").replace("*", " * ").split()) != example.question.removeprefix("What is ").removesuffix("?"):
            return False
        return last_integer(response) == int(example.answer)
