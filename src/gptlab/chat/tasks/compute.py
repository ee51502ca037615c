"""Compute: questions whose answers a short Python program prints and a small model cannot know by heart.

    Example(question="What is the sum of the digits of 7**23?", reply="The sum of the digits of 7**23 is 85.",
            answer="85", turns=(
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "python", "arguments": '{"code": "print(sum(int(d) for d in str(7**23)))"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "85"},
        {"role": "assistant", "content": "The sum of the digits of 7**23 is 85."}))

The kinds of question, drawn evenly: the sum of the digits of a power, primes
below a bound, the nth Fibonacci number (1, 1, 2, 3, 5, ...), how often a letter
appears in a long random string, a power modulo a number, how many digits a
factorial has, and the sum of the multiples of two numbers below a bound. With
`tools=1` (the default) the reply calls the python tool
(gptlab.chat.tool_specs.PYTHON) with a program of one to three lines that prints
the answer, the tool's result is what it prints (trailing whitespace stripped),
and the final message states the answer (the last number in it). With `tools=0` the reply is that
final message alone. The answers are computed here in plain Python, each by
other means than its program (a sieve for the primes, for one), so a test that
runs the programs in gptlab.eval.sandbox checks the two agree.

`size` scales the numbers (exponents, bounds, indices, string lengths): 1 small,
2 (the default) medium, 3 large; every program runs well under a second. The
verifier reads the last whole number of the response. Not here: running
programs (gptlab.eval.sandbox; the tools themselves, gptlab.tools), the Task
machinery (gptlab.chat.tasks.base).
"""

from __future__ import annotations

import bisect
import functools
import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from gptlab.chat.tasks.base import Example, Task, last_integer, tool_turns
from gptlab.chat.tool_specs import PYTHON
from gptlab.runtime import GptlabError

SIZES = (1, 2, 3)
DIVISOR_PAIRS = tuple((a, b) for a in range(2, 10) for b in range(a + 1, 10) if b % a)  # "3 or 9" would be just 3
PRIME_BOUND = {1: 1_000, 2: 10_000, 3: 50_000}  # the largest bound asked per size (trial division stays well under 1 s)


@dataclass(frozen=True)
class Computation:
    question: str
    code: str  # the program that prints the answer
    answer: int
    statement: str  # the final message: the answer in a sentence, the number last


def ordinal(n: int) -> str:
    """1 -> "1st", 12 -> "12th", 23 -> "23rd"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@functools.cache
def primes_below(bound: int) -> list[int]:
    """The primes below `bound` by the sieve of Eratosthenes: 10 -> [2, 3, 5, 7]."""
    sieve = bytearray([1]) * bound
    sieve[:2] = b"\x00\x00"[:bound]
    for n in range(2, math.isqrt(max(bound - 1, 0)) + 1):
        if sieve[n]:
            sieve[n * n :: n] = bytes(len(range(n * n, bound, n)))
    return [n for n, prime in enumerate(sieve) if prime]


def digit_sum(rng: random.Random, size: int) -> Computation:
    base, exponent = rng.randint(2, 9 * size), rng.randint(10, 40 * size)
    power = f"{base}**{exponent}"
    total = sum(map(int, str(pow(base, exponent))))
    return Computation(f"What is the sum of the digits of {power}?", f"print(sum(int(d) for d in str({power})))", total,
                       f"The sum of the digits of {power} is {total}.")  # fmt: skip


def prime_count(rng: random.Random, size: int) -> Computation:
    bound = rng.randint(10, PRIME_BOUND[size])
    count = bisect.bisect_left(primes_below(PRIME_BOUND[size]), bound)  # the primes under `bound` of the largest sieve
    code = f"print(sum(all(n % d for d in range(2, int(n**0.5) + 1)) for n in range(2, {bound})))"
    return Computation(f"How many primes are there below {bound}?", code, count, f"The number of primes below {bound} is {count}.")


def fibonacci(rng: random.Random, size: int) -> Computation:
    index = rng.randint(10, 50 * size)
    previous, current = 1, 1  # F(1), F(2): the sequence 1, 1, 2, 3, 5, ...
    for _ in range(index - 2):
        previous, current = current, previous + current
    code = f"a, b = 0, 1\nfor _ in range({index}):\n    a, b = b, a + b\nprint(a)"
    return Computation(f"What is the {ordinal(index)} Fibonacci number (1, 1, 2, 3, 5, ...)?", code, current,
                       f"The {ordinal(index)} Fibonacci number is {current}.")  # fmt: skip


def letter_count(rng: random.Random, size: int) -> Computation:
    text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(10 * size, 30 * size)))  # short: the code repeats it
    letter = rng.choice(string.ascii_lowercase)
    count = sum(character == letter for character in text)
    return Computation(f'How many times does the letter "{letter}" appear in "{text}"?', f"print({text!r}.count({letter!r}))",
                       count, f'The letter "{letter}" appears {count} times.')  # fmt: skip


def power_modulo(rng: random.Random, size: int) -> Computation:
    base, exponent, modulus = rng.randint(2, 20 * size), rng.randint(20, 200 * size), rng.randint(3, 200 * size)
    result = pow(base, exponent, modulus)
    return Computation(f"What is {base}**{exponent} mod {modulus}?", f"print(pow({base}, {exponent}, {modulus}))", result,
                       f"{base}**{exponent} mod {modulus} is {result}.")  # fmt: skip


def factorial_digits(rng: random.Random, size: int) -> Computation:
    n = rng.randint(10, 100 * size)
    digits = len(str(math.factorial(n)))
    return Computation(f"How many digits does {n}! ({n} factorial) have?", f"import math\nprint(len(str(math.factorial({n}))))",
                       digits, f"{n}! has {digits} digits.")  # fmt: skip


def multiples_sum(rng: random.Random, size: int) -> Computation:
    first, second = rng.choice(DIVISOR_PAIRS)
    bound = rng.randint(20, 1000 * size)
    # Inclusion-exclusion over the multiples of each and of their least common multiple, instead of the program's loop.
    total = sum(k * _sum_up_to((bound - 1) // k) * sign for k, sign in ((first, 1), (second, 1), (math.lcm(first, second), -1)))
    code = f"print(sum(n for n in range({bound}) if n % {first} == 0 or n % {second} == 0))"
    return Computation(f"What is the sum of all the numbers below {bound} that are multiples of {first} or {second}?", code,
                       total, f"The sum is {total}.")  # fmt: skip


def _sum_up_to(n: int) -> int:
    return n * (n + 1) // 2


KINDS: tuple[Callable[[random.Random, int], Computation], ...] = (digit_sum, prime_count, fibonacci, letter_count,
                                                                  power_modulo, factorial_digits, multiples_sum)  # fmt: skip


@dataclass(frozen=True)
class Compute(Task):
    """Compute(size=3) for larger numbers; Compute(tools=0) answers without running code."""

    name = "compute"
    toolbox = (PYTHON,)
    size: int = 2  # how large the numbers are: 1 small, 2 medium, 3 large
    tools: int = 1  # 1: the reply runs a program with the python tool, then answers; 0: the final message alone

    def __post_init__(self) -> None:
        if self.size not in SIZES or isinstance(self.size, bool):
            raise GptlabError(f"compute size must be one of {', '.join(map(str, SIZES))} (small to large), got {self.size!r}")
        if self.tools not in (0, 1) or isinstance(self.tools, bool):
            raise GptlabError(f"compute tools must be 1 (run a program) or 0 (answer directly), got {self.tools!r}")

    def make(self, rng: random.Random) -> Example:
        computation = rng.choice(KINDS)(rng, self.size)
        reply = computation.statement
        turns = tool_turns([("python", {"code": computation.code}, str(computation.answer))], reply) if self.tools else ()
        return Example(question=computation.question, reply=reply, answer=str(computation.answer), turns=turns)

    def verify(self, example: Example, response: str) -> bool:
        return last_integer(response) == int(example.answer)
