"""The calculator tool: exact arithmetic on integers and decimals, read by a small tokenizer and recursive-descent
parser of its own (never eval, exec, compile or ast: the text is the model's, and only arithmetic may come of it).

    calculate("1234 * 5678")      -> "7006652"
    calculate("1,250.5 / 4")      -> "312.625"
    calculate("-2 ** 2 + 2 ^ 10") -> "1020"
    calculate("1 / 3")            -> "0.333333333333"
    calculate("1 / 0")            -> GptlabError("division by zero"), the model reads "error: division by zero"

Numbers: integers and decimals (`12`, `1.25`, `.5`, `5.`), with `_` between digits or `,` between thousands
(`1_000_000`, `1,234.5`), and an optional exponent (`1.5e3`). Operators, as in Python: `+ - * / // % **` and
parentheses; `^` is `**` (a model writing 2^10 means a power, not xor), `×` is `*`, `÷` is `/`, `−` is `-`. The
grammar, with Python's precedence and associativity (so `-2 ** 2` is -4, `2 ** 3 ** 2` is 512, `2 ** -1` is 0.5):

    expression := term (("+" | "-") term)*
    term       := unary (("*" | "/" | "//" | "%") unary)*
    unary      := ("+" | "-")* power
    power      := atom ("**" unary)?
    atom       := NUMBER | "(" expression ")"

Every value is a fractions.Fraction, so nothing is rounded until the result is written: an integer as itself
(`7006652`, no separators), a fraction whose decimals end as its exact decimal (`0.125`), and one whose decimals
repeat rounded to 12 significant digits, keeping every digit of its integer part and at least one decimal (`1 / 3`
-> `0.333333333333`, `10 ** 15 / 7` -> `142857142857142.9`, `1 - 3 ** -40` -> `1.0`): enough for any answer a
chat model gives, short enough to copy, and never an integer-looking text for a value that is not one.

Limits, checked before the work is done so that no expression can run long: at most 200 characters, 40 nested
parentheses, exponents up to 10,000 in size, and no value with more than 1,000 digits above or below its fraction
line. A fractional power is computed only when it is exact (`4 ** 0.5` is 2; `2 ** 0.5` is an error), and only of
a number that is not negative.

Errors point at the 1-based position of what is wrong: `unexpected ")" at position 8`.

Not here: running the call and its error result (gptlab.tools.base); the tool's declaration (gptlab.chat.tool_specs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from gptlab.chat.tool_specs import CALCULATOR
from gptlab.runtime import GptlabError
from gptlab.tools.base import Tool, ToolLimits

MAX_CHARS = 200
MAX_DEPTH = 40  # nested parentheses; also keeps the parser's recursion far from Python's limit
MAX_EXPONENT = 10_000
MAX_DIGITS = 1000
DIGIT_LIMIT = 10**MAX_DIGITS  # the smallest number with more than MAX_DIGITS digits
SIGNIFICANT = 12  # digits kept of a result whose decimals repeat
OPERATORS = (("**", "**"), ("//", "//"), ("^", "**"), ("×", "*"), ("÷", "/"), ("−", "-"),
             ("+", "+"), ("-", "-"), ("*", "*"), ("/", "/"), ("%", "%"), ("(", "("), (")", ")"))  # fmt: skip
DIGITS = "0123456789"
READS = "the calculator reads numbers, + - * / // % ** and parentheses"


@dataclass(frozen=True)
class Token:
    """A piece of the expression: a number (with its value) or an operator (`symbol` in its usual spelling);
    "end" after the last one. `position` is 1-based, `text` as written."""

    kind: str
    text: str
    position: int
    symbol: str = ""
    value: Fraction | None = None


def calculate(expression: str) -> str:
    """The expression's exact value as text (module docstring); a GptlabError saying what is wrong with it."""
    return format_number(evaluate(expression))


def evaluate(expression: str) -> Fraction:
    """The expression's exact value."""
    if not isinstance(expression, str):
        raise GptlabError(f"the expression must be text, got {type(expression).__name__}")
    if len(expression) > MAX_CHARS:
        raise GptlabError(f"the expression has {len(expression):,} characters; the limit is {MAX_CHARS}")
    if not expression.strip():
        raise GptlabError("the expression is empty; write one, e.g. 12 * (3 + 4)")
    return _Parser(tokenize(expression)).parse()


def tokenize(expression: str) -> list[Token]:
    """The expression's tokens, ending with an "end" token."""
    tokens, index = [], 0
    while index < len(expression):
        character = expression[index]
        if character.isspace():
            index += 1
        elif character in DIGITS or character == ".":
            token, index = _read_number(expression, index)
            tokens.append(token)
        else:
            written, symbol = next(((text, symbol) for text, symbol in OPERATORS if expression.startswith(text, index)), ("", ""))
            if not symbol:
                raise GptlabError(f'unexpected "{character}" at position {index + 1}; {READS}')
            tokens.append(Token("operator", written, index + 1, symbol))
            index += len(written)
    tokens.append(Token("end", "", len(expression) + 1))
    return tokens


def _read_number(expression: str, start: int) -> tuple[Token, int]:
    """The number starting at `start` and the index after it."""
    end = start
    while end < len(expression) and (expression[end] in DIGITS or expression[end] in "_,."):
        end += 1
    body, exponent = expression[start:end], 0
    if end < len(expression) and expression[end] in "eE":
        digits_start = end + 1 + (end + 1 < len(expression) and expression[end + 1] in "+-")
        digits_end = digits_start
        while digits_end < len(expression) and expression[digits_end] in DIGITS:
            digits_end += 1
        if digits_end == digits_start:
            raise GptlabError(f'unexpected "{expression[end]}" at position {end + 1}; an exponent is written 1.5e3')
        exponent = int(expression[end + 1 : digits_end])
        end = digits_end
    whole, point, decimals = body.partition(".")
    if "." in decimals or not (whole or decimals) or "," in decimals:
        raise GptlabError(f'"{expression[start:end]}" at position {start + 1} is not a number; write e.g. 1,234.5 or 1234.5')
    whole_digits, decimal_digits = _grouped_digits(whole, start), _grouped_digits(decimals, start, commas=False)
    if abs(exponent) > MAX_EXPONENT:
        raise GptlabError(f"the exponent of {expression[start:end]} is over the limit of {MAX_EXPONENT:,}")
    mantissa = Fraction(int(whole_digits + decimal_digits or "0"), 10 ** len(decimal_digits))
    value = _checked(mantissa * Fraction(10) ** exponent)
    return Token("number", expression[start:end], start + 1, value=value), end


def _grouped_digits(text: str, start: int, *, commas: bool = True) -> str:
    """The digits of `text` without their separators: `_` between two digits, or `,` before each group of three."""
    if commas and "," in text:
        groups = text.split(",")
        if "_" in text or not 1 <= len(groups[0]) <= 3 or any(len(group) != 3 for group in groups[1:]) or not all(map(str.isdigit, groups)):
            raise GptlabError(f'"{text}" at position {start + 1} is not a number: a comma separates thousands, as in 1,234,567')
        return "".join(groups)
    if text and any(not piece for piece in text.split("_")):
        raise GptlabError(f'"{text}" at position {start + 1} is not a number: "_" goes between two digits, as in 1_000')
    return text.replace("_", "")


class _Parser:
    """Reads the tokens by the grammar of the module docstring, computing as it goes."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    def parse(self) -> Fraction:
        value = self.expression()
        if self.peek().kind != "end":
            raise self.unexpected(self.peek())
        return value

    def peek(self) -> Token:
        return self.tokens[self.index]

    def take(self) -> Token:
        token = self.tokens[self.index]
        self.index += token.kind != "end"
        return token

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek().symbol in ("+", "-"):
            operator = self.take()
            right = self.term()
            value = _checked(value + right if operator.symbol == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek().symbol in ("*", "/", "//", "%"):
            symbol = self.take().symbol
            right = self.unary()
            value = _checked(value * right) if symbol == "*" else _divide(value, right, symbol)
        return value

    def unary(self) -> Fraction:
        negative = False
        while self.peek().symbol in ("+", "-"):
            negative ^= self.take().symbol == "-"
        value = self.power()
        return -value if negative else value

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek().symbol == "**":
            self.take()
            return _power(base, self.unary())
        return base

    def atom(self) -> Fraction:
        token = self.take()
        if token.kind == "number":
            assert token.value is not None
            return token.value
        if token.symbol != "(":
            raise self.unexpected(token)
        if self.depth == MAX_DEPTH:
            raise GptlabError(f'more than {MAX_DEPTH} nested parentheses at position {token.position}; write a shallower expression')
        self.depth += 1
        value = self.expression()
        self.depth -= 1
        closing = self.take()
        if closing.kind == "end":
            raise GptlabError(f'the "(" at position {token.position} is never closed; add a ")"')
        if closing.symbol != ")":
            raise self.unexpected(closing)
        return value

    def unexpected(self, token: Token) -> GptlabError:
        if token.kind == "end":
            last = self.tokens[self.index - 1] if self.index else token
            return GptlabError(f'the expression ends after "{last.text}" at position {last.position}; a number or "(" should follow')
        return GptlabError(f'unexpected "{token.text}" at position {token.position}')


def _checked(value: Fraction) -> Fraction:
    """The value, if neither its numerator nor its denominator has more than MAX_DIGITS digits."""
    if abs(value.numerator) >= DIGIT_LIMIT or value.denominator >= DIGIT_LIMIT:
        raise GptlabError(f"a value in this expression has more than {MAX_DIGITS:,} digits, the calculator's limit")
    return value


def _divide(left: Fraction, right: Fraction, symbol: str) -> Fraction:
    """left / right, left // right (floor, as Python) or left % right (the sign of right, as Python)."""
    if right == 0:
        raise GptlabError("modulo by zero" if symbol == "%" else "division by zero")
    if symbol == "/":
        return _checked(left / right)
    return _checked(Fraction(left // right) if symbol == "//" else left % right)


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """base ** exponent, exactly, refused before computing when it would pass the limits (module docstring)."""
    if abs(exponent) > MAX_EXPONENT:
        raise GptlabError(f"the exponent {_shown(exponent)} is over the limit of {MAX_EXPONENT:,}")
    if exponent.denominator != 1:
        base = _exact_root(base, exponent.denominator, exponent)
        exponent = Fraction(exponent.numerator)
    power = exponent.numerator
    if base == 0 and power < 0:
        raise GptlabError("division by zero (0 to a negative power)")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length()) - 1  # |part| >= 2 ** bits
    if bits * abs(power) * math.log10(2) > MAX_DIGITS:
        raise GptlabError(f"{_shown(base)} ** {power} would have over {MAX_DIGITS:,} digits, the calculator's limit")
    return _checked(base**power)


def _exact_root(base: Fraction, degree: int, exponent: Fraction) -> Fraction:
    """The `degree`-th root of a number that is not negative, when it is exact; else a GptlabError."""
    shown = f"{_shown(base)} ** {_shown(exponent)}"
    if base < 0:
        raise GptlabError(f"{shown}: a negative number to a fractional power is not computed; the calculator is exact and real")
    numerator, denominator = _integer_root(base.numerator, degree), _integer_root(base.denominator, degree)
    if numerator**degree != base.numerator or denominator**degree != base.denominator:
        raise GptlabError(f"{shown} is not exact: {_shown(base)} is not a perfect power of degree {degree}; "
                          "the calculator gives exact results only")
    return Fraction(numerator, denominator)


def _shown(value: Fraction) -> str:
    """A value as an error message quotes it: short, and in parentheses when negative (-8 ** 0.5 would read as -(8 ** 0.5))."""
    text = format_number(value)
    text = text if len(text) <= 20 else text[:17] + "..."
    return f"({text})" if value < 0 else text


def _integer_root(number: int, degree: int) -> int:
    """The largest r with r ** degree <= number (number >= 0), by bisection over r's possible bits."""
    low, high = 0, 1 << (number.bit_length() // degree + 1)
    while low < high:
        middle = (low + high + 1) // 2
        if middle**degree <= number:
            low = middle
        else:
            high = middle - 1
    return low


def format_number(value: Fraction) -> str:
    """A value as text: an integer as itself, an ending decimal exactly, a repeating one rounded (module docstring)."""
    if value.denominator == 1:
        return str(value.numerator)
    sign, magnitude = ("-" if value < 0 else ""), abs(value)
    denominator = magnitude.denominator
    twos = (denominator & -denominator).bit_length() - 1
    fives, rest = 0, denominator >> twos
    while rest % 5 == 0:
        fives, rest = fives + 1, rest // 5
    if rest == 1:  # only 2s and 5s: the decimals end after max(twos, fives) places, the last not 0
        places = max(twos, fives)
        digits = str(magnitude.numerator * 10**places // denominator).rjust(places + 1, "0")
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    places = _rounded_places(magnitude)
    digits = str(round(magnitude * 10**places)).rjust(places + 1, "0")  # half to even
    return f"{sign}{digits[:-places]}.{digits[-places:].rstrip('0') or '0'}"  # one decimal kept: "1.0" is not 1


def _rounded_places(magnitude: Fraction) -> int:
    """Decimal places that keep SIGNIFICANT significant digits of a positive value, every digit of its integer part,
    and at least one decimal."""
    if magnitude >= 1:
        return max(SIGNIFICANT - len(str(math.floor(magnitude))), 1)
    # zeros after the point before the first digit: b - a - 1 or b - a, for a digits above the line and b below
    zeros = max(0, len(str(magnitude.denominator)) - len(str(magnitude.numerator)) - 1)
    if magnitude * 10 ** (zeros + 1) < 1:
        zeros += 1
    return zeros + SIGNIFICANT


def _calculator(expression: str, timeout: float) -> str:
    """The tool's function: its work is capped before it is done (module docstring), so it needs no clock."""
    return calculate(expression)


def calculator_tool(limits: ToolLimits | None = None) -> Tool:
    """The built-in calculator as a Tool. Its limits are its own (module docstring); it takes `limits` as every
    built-in does."""
    declaration = CALCULATOR["function"]
    return Tool(declaration["name"], declaration["description"], declaration["parameters"], _calculator, in_process=True)
