"""Word problems: grade-school maths stories (GSM8K-style) made from templates, answered with the calculator.

    Example(question="Maya buys 3 notebooks at $12 each and a backpack for $5. How many dollars does Maya spend in all?",
            reply="3 * 12 + 5 = 41, so the answer is 41.", answer="41", turns=(
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression": "3 * 12 + 5"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "41"},
        {"role": "assistant", "content": "3 * 12 + 5 = 41, so the answer is 41."}))

Each question is a template (shopping totals, sharing equally, rate times time,
money left after spending, baking and giving away, saving then buying, packs
shared among friends, comparing two people, change from a bill, and a unit price
scaled up) filled with a random name, items and numbers. With `tools=1` (the
default) the reply calls the calculator (gptlab.chat.tool_specs.CALCULATOR) with
one expression that computes the answer, or for the unit price two calls in turn
(the second uses the first's result); the final message restates the working
and ends with the answer. With `tools=0` the reply is that final message alone.
Every answer is a whole number above 0, computed here with Python's integers;
divisions are exact.

`digits` sets the size of the amounts (prices, totals, rates): 2 to 10**digits - 1;
counts (people, days, packs) stay 2 to 12. The verifier reads the answer as GSM8K's
does (gptlab.chat.tasks.gsm8k.final_number: the number after a last `####`, else
the last number), so "$41", "1,234" and "The answer is 41." all count. Not here:
the Task machinery (gptlab.chat.tasks.base), GSM8K's own problems (gptlab.chat.tasks.gsm8k).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from gptlab.chat.tasks.base import Example, Task, tool_turns
from gptlab.chat.tasks.gsm8k import final_number
from gptlab.chat.tool_specs import CALCULATOR
from gptlab.runtime import GptlabError

MAX_DIGITS = 4
NAMES = ("Maya", "Liam", "Sofia", "Noah", "Ava", "Omar", "Lena", "Ravi", "Chloe", "Mateo", "Hana", "Ethan",
         "Zara", "Leo", "Amara", "Jonas", "Priya", "Felix", "Nora", "Kai", "Ines", "Tariq", "Ruby", "Sam")  # fmt: skip
ITEMS = ("notebooks", "pens", "apples", "stickers", "marbles", "cookies", "books", "cards", "shells", "stamps",
         "pencils", "oranges", "balloons", "candles", "buttons", "cupcakes")  # fmt: skip
THINGS = ("a backpack", "a lunch box", "a water bottle", "a scarf", "a kite", "a puzzle", "a lamp", "a ball")
RATES = (("reads", "pages", "day", "days"), ("walks", "kilometres", "week", "weeks"), ("bakes", "loaves", "hour", "hours"),
         ("packs", "boxes", "hour", "hours"), ("plants", "trees", "day", "days"), ("writes", "letters", "week", "weeks"))  # fmt: skip

Step = tuple[str, int]  # an expression for the calculator and its value: ("3 * 12 + 5", 41)


@dataclass(frozen=True)
class Problem:
    question: str
    steps: tuple[Step, ...]  # one calculator call each; the last step's value is the answer


class Draw:
    """The random choices a template makes: names, items, amounts (up to `digits` digits) and small counts."""

    def __init__(self, rng: random.Random, digits: int) -> None:
        self.rng, self.digits = rng, digits

    def amount(self) -> int:
        return self.rng.randint(2, 10**self.digits - 1)

    def count(self) -> int:
        return self.rng.randint(2, 12)

    def names(self, k: int = 1) -> list[str]:
        return self.rng.sample(NAMES, k)

    def pick(self, options: tuple):
        return self.rng.choice(options)


def shopping(draw: Draw) -> Problem:
    (name,), item, thing = draw.names(), draw.pick(ITEMS), draw.pick(THINGS)
    count, price, extra = draw.count(), draw.amount(), draw.amount()
    question = f"{name} buys {count} {item} at ${price} each and {thing} for ${extra}. How many dollars does {name} spend in all?"
    return Problem(question, ((f"{count} * {price} + {extra}", count * price + extra),))


def sharing(draw: Draw) -> Problem:
    (name,), item, friends, each = draw.names(), draw.pick(ITEMS), draw.count(), draw.amount()
    total = friends * each
    question = f"{name} has {total} {item} and shares them equally among {friends} friends. How many {item} does each friend get?"
    return Problem(question, ((f"{total} / {friends}", each),))


def rate(draw: Draw) -> Problem:
    (name,), (verb, unit, period, periods) = draw.names(), draw.pick(RATES)
    per, time = draw.amount(), draw.count()
    question = f"{name} {verb} {per} {unit} every {period}. How many {unit} does {name} {verb.removesuffix('s')} in {time} {periods}?"
    return Problem(question, ((f"{per} * {time}", per * time),))


def remaining(draw: Draw) -> Problem:
    (name,), (first, second) = draw.names(), draw.rng.sample(THINGS, 2)
    spent, spent_more, left = draw.amount(), draw.amount(), draw.amount()
    money = spent + spent_more + left
    question = (f"{name} had ${money}. {name} spent ${spent} on {first} and ${spent_more} on {second}. "
                f"How many dollars does {name} have left?")  # fmt: skip
    return Problem(question, ((f"{money} - {spent} - {spent_more}", left),))


def baking(draw: Draw) -> Problem:
    (name,), trays, per_tray = draw.names(), draw.count(), draw.amount()
    given = draw.rng.randint(1, trays * per_tray - 1)
    question = (f"{name} bakes {trays} trays of {per_tray} cookies each and gives away {given} cookies. "
                f"How many cookies does {name} have left?")  # fmt: skip
    return Problem(question, ((f"{trays} * {per_tray} - {given}", trays * per_tray - given),))


def saving(draw: Draw) -> Problem:
    (name,), thing, weekly, weeks = draw.names(), draw.pick(THINGS), draw.amount(), draw.count()
    cost = draw.rng.randint(1, weekly * weeks - 1)
    question = (f"{name} saves ${weekly} every week for {weeks} weeks, then buys {thing} for ${cost}. "
                f"How many dollars does {name} have left?")  # fmt: skip
    return Problem(question, ((f"{weekly} * {weeks} - {cost}", weekly * weeks - cost),))


def packs(draw: Draw) -> Problem:
    (name,), item, friends, per_pack, per_friend = draw.names(), draw.pick(ITEMS), draw.count(), draw.amount(), draw.count()
    bought = friends * per_friend  # packs a multiple of the friends, so the sharing is exact
    question = (f"{name} buys {bought} packs of {per_pack} {item} and shares them equally among {friends} friends. "
                f"How many {item} does each friend get?")  # fmt: skip
    return Problem(question, ((f"{bought} * {per_pack} / {friends}", per_friend * per_pack),))


def comparing(draw: Draw) -> Problem:
    (first, second), item, has, more = draw.names(2), draw.pick(ITEMS), draw.amount(), draw.amount()
    question = f"{first} has {has} {item}. {second} has {more} more {item} than {first}. How many {item} do they have together?"
    return Problem(question, ((f"{has} + ({has} + {more})", has + has + more),))


def change(draw: Draw) -> Problem:
    (name,), item, count, price = draw.names(), draw.pick(ITEMS), draw.count(), draw.amount()
    cost = count * price
    round_to = 10 ** max(1, len(str(cost)) - 1)
    bill = (cost // round_to + 1) * round_to  # the next round sum above the cost: "$200" for $156
    question = f"{name} buys {count} {item} at ${price} each and pays with ${bill}. How many dollars of change does {name} get?"
    return Problem(question, ((f"{bill} - {count} * {price}", bill - cost),))


def unit_price(draw: Draw) -> Problem:
    (name,), item, bought, wanted, price = draw.names(), draw.pick(ITEMS), draw.count(), draw.count(), draw.amount()
    total = bought * price
    question = f"{name} pays ${total} for {bought} {item}. At the same price, how many dollars would {wanted} {item} cost?"
    return Problem(question, ((f"{total} / {bought}", price), (f"{price} * {wanted}", price * wanted)))


TEMPLATES: tuple[Callable[[Draw], Problem], ...] = (shopping, sharing, rate, remaining, baking, saving, packs, comparing,
                                                    change, unit_price)  # fmt: skip


@dataclass(frozen=True)
class WordProblems(Task):
    """WordProblems(digits=3) for larger amounts; WordProblems(tools=0) answers without the calculator."""

    name = "word_problems"
    toolbox = (CALCULATOR,)
    digits: int = 2  # amounts (prices, totals, rates) run from 2 to 10**digits - 1
    tools: int = 1  # 1: the reply calls the calculator, then answers; 0: the final answer message alone

    def __post_init__(self) -> None:
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or not 1 <= self.digits <= MAX_DIGITS:
            raise GptlabError(f"word_problems digits must be a whole number from 1 to {MAX_DIGITS}, got {self.digits!r}")
        if self.tools not in (0, 1) or isinstance(self.tools, bool):
            raise GptlabError(f"word_problems tools must be 1 (call the calculator) or 0 (answer directly), got {self.tools!r}")

    def make(self, rng: random.Random) -> Example:
        problem = rng.choice(TEMPLATES)(Draw(rng, self.digits))
        answer = problem.steps[-1][1]
        working = " and ".join(f"{expression} = {value}" for expression, value in problem.steps)
        reply = f"{working}, so the answer is {answer}."
        calls = [("calculator", {"expression": expression}, str(value)) for expression, value in problem.steps]
        turns = tool_turns(calls, reply) if self.tools else ()
        return Example(question=problem.question, reply=reply, answer=str(answer), turns=turns)

    def verify(self, example: Example, response: str) -> bool:
        """The number after the response's last ####, or its last number, is the answer (as GSM8K's verifier)."""
        given = final_number(response)
        return given is not None and given == Decimal(example.answer)
