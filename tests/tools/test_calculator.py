"""The calculator against exact references: expression trees computed with Fraction node by node, and Python's own
parser reading the same text with every number a Fraction."""

import ast
import math
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptlab.runtime import GptlabError
from gptlab.tools import Toolbox
from gptlab.tools.calculator import MAX_DIGITS, calculate, calculator_tool, evaluate, format_number

LIMIT = 10**MAX_DIGITS


class TooBig(Exception):
    pass


# ---------------------------------------------------------------- random trees, a brute-force reference


def _leaf_text(value: Fraction, style: str) -> str:
    """A non-negative leaf written plainly, with thousands commas, with underscores, or as a decimal."""
    if value.denominator != 1:
        return format_number(value)  # the leaves' decimals end: 1/8, 3/20 ... (checked below to read back exactly)
    if style == "commas":
        return f"{value.numerator:,}"
    return f"{value.numerator:_}" if style == "underscores" else str(value.numerator)


leaves = st.builds(
    lambda whole, places, style: (Fraction(whole, 10**places), style),
    st.integers(0, 10**7), st.sampled_from([0, 0, 0, 1, 2, 3]), st.sampled_from(["plain", "commas", "underscores"]),
)  # fmt: skip


def _trees(children):
    binary = st.tuples(st.sampled_from(["+", "-", "*", "/", "//", "%"]), children, children)
    power = st.tuples(st.just("**"), children, st.integers(-3, 4))
    negate = st.tuples(st.just("neg"), children)
    return binary | power | negate


trees = st.recursive(leaves, _trees, max_leaves=10)


def _checked(value: Fraction) -> Fraction:
    if abs(value.numerator) >= LIMIT or value.denominator >= LIMIT:
        raise TooBig
    return value


def reference(tree) -> Fraction:
    """The tree's value with Fraction, every intermediate checked against the calculator's digit limit."""
    if isinstance(tree[0], Fraction):
        return tree[0]
    if tree[0] == "neg":
        return -reference(tree[1])
    if tree[0] == "**":
        base = reference(tree[1])
        if base == 0 and tree[2] < 0:
            raise ZeroDivisionError
        return _checked(base ** tree[2])
    operator, left, right = tree[0], reference(tree[1]), reference(tree[2])
    if operator in ("/", "//", "%") and right == 0:
        raise ZeroDivisionError
    results = {"+": lambda: left + right, "-": lambda: left - right, "*": lambda: left * right,
               "/": lambda: left / right, "//": lambda: Fraction(left // right), "%": lambda: left % right}  # fmt: skip
    return _checked(results[operator]())


def render(tree) -> str:
    """The tree as text, every operation in parentheses (so the text means the tree whatever the precedence)."""
    if isinstance(tree[0], Fraction):
        return _leaf_text(*tree)
    if tree[0] == "neg":
        return f"(-{render(tree[1])})"
    if tree[0] == "**":
        return f"({render(tree[1])} ** {tree[2]})"
    return f"({render(tree[1])} {tree[0]} {render(tree[2])})"


@given(trees)
def test_calculator_matches_exact_arithmetic_on_random_trees(tree):
    text = render(tree)
    if len(text) > 200:
        with pytest.raises(GptlabError, match="the limit is 200"):
            evaluate(text)
        return
    try:
        expected = reference(tree)
    except ZeroDivisionError:
        with pytest.raises(GptlabError, match="by zero"):
            evaluate(text)
    except TooBig:
        with pytest.raises(GptlabError, match="digits"):
            evaluate(text)
    else:
        assert evaluate(text) == expected


# ---------------------------------------------------------------- precedence: Python's parser as the reference


def _join(*parts):
    return "".join(part[0] for part in parts), "".join(part[1] for part in parts)


numbers = st.integers(0, 99).map(lambda n: (str(n), f"F({n})"))
exponents = st.integers(-2, 3).map(lambda n: (str(n), f"F({n})") if n >= 0 else (f"-{-n}", f"-F({-n})"))


def _expressions(children):
    binary = st.builds(lambda left, op, right: _join(left, (f" {op} ",) * 2, right), children,
                       st.sampled_from(["+", "-", "*", "/", "//", "%"]), children)  # fmt: skip
    unary = st.builds(lambda sign, child: _join((sign,) * 2, child), st.sampled_from(["-", "+"]), children)
    grouped = children.map(lambda child: _join(("(",) * 2, child, (")",) * 2))
    power = st.builds(lambda base, exponent: _join(base, (" ** ",) * 2, exponent), children, exponents)
    return binary | unary | grouped | power


# at most two powers in a text: a chain of them would make numbers no test can wait for
expressions = st.recursive(numbers, _expressions, max_leaves=8).filter(lambda pair: pair[0].count("**") <= 2)


@given(expressions)
def test_calculator_parses_as_python_does_with_its_precedence_and_associativity(pair):
    text, python_text = pair
    try:
        expected = eval(python_text, {"F": Fraction})  # the test's reference only; the calculator never evals
    except ZeroDivisionError:
        with pytest.raises(GptlabError, match="by zero"):
            evaluate(text)
        return
    if len(text) > 200 or max(abs(expected.numerator), expected.denominator) >= LIMIT:
        return  # over the calculator's limits: the error cases below
    assert evaluate(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("-2 ** 2", "-4"), ("2 ** -1", "0.5"), ("2 ** 3 ** 2", "512"), ("(2 ** 3) ** 2", "64"), ("2 ^ 10", "1024"),
    ("-2 ^ 2", "-4"), ("2 ** -2 ** 2", "0.0625"), ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("10 - 4 - 3", "3"),
    ("100 / 10 / 5", "2"), ("7 // 2", "3"), ("-7 // 2", "-4"), ("-7 % 3", "2"), ("7 % -3", "-2"), ("2 * 3 % 4", "2"),
    ("--3", "3"), ("2 - -3", "5"), ("+4", "4"), ("6 × 7", "42"), ("84 ÷ 2", "42"), ("5 − 3", "2"),
    ("1234 * 5678", "7006652"), ("1,234 * 1_000", "1234000"), ("1,234.5 + .5", "1235"), ("5. * 2", "10"),
    ("1.5e3", "1500"), ("2E-2", "0.02"), ("1 / 8", "0.125"), ("5 / 2", "2.5"), ("0.1 + 0.2", "0.3"),
    ("1 / 3", "0.333333333333"), ("2 / 3", "0.666666666667"), ("-1 / 3", "-0.333333333333"),
    ("10 ** 15 / 7", "142857142857142.9"), ("1 / 7000000", "0.000000142857142857"), ("4 ** 0.5", "2"),
    ("8 ** (1 / 3)", "2"), ("(4 / 9) ** 1.5", "0.296296296296"), ("27 ** (-2 / 3)", "0.111111111111"),
    ("2 ** 100", "1267650600228229401496703205376"), ("0 ** 0", "1"), ("  ( 1 )  ", "1"),
    ("1 - 1 / 3 ** 40", "1.0"), ("10 ** 15 + 1 / 30", "1000000000000000.0"),
])  # fmt: skip
def test_calculator_gives_pythons_precedence_and_exact_decimals(text, expected):
    assert calculate(text) == expected


@pytest.mark.parametrize("text, message", [
    ("1 / 0", "division by zero"), ("5 // (2 - 2)", "division by zero"), ("5 % 0", "modulo by zero"),
    ("0 ** -1", "division by zero"), ("(1 + 2))", 'unexpected ")" at position 8'), ("2 3", 'unexpected "3" at position 3'),
    ("1 +", 'ends after "+" at position 3'), ("(1 + 2", 'the "(" at position 1 is never closed'), ("()", 'unexpected ")" at position 2'),
    ("2 ** ** 3", 'unexpected "**" at position 6'), ("", "the expression is empty"), ("   ", "the expression is empty"),
    ("1" * 201, "201 characters; the limit is 200"), ("2 ** 10001", "the exponent 10001 is over the limit of 10,000"),
    ("9 ** 9999", "would have over 1,000 digits"), ("10 ** 600 * 10 ** 600", "more than 1,000 digits"),
    ("1e20000", "over the limit of 10,000"), ("2 ** 0.5", "is not exact: 2 is not a perfect power of degree 2"),
    ("(-8) ** (1 / 3)", "negative number to a fractional power"), ("1,23", "a comma separates thousands"),
    ("1__0", '"_" goes between two digits'), ("1.2.3", "is not a number"), ("1e", "an exponent is written"),
    ("x + 1", 'unexpected "x" at position 1; the calculator reads numbers'), ("2 = 2", 'unexpected "="'),
    ("(" * 41 + "1" + ")" * 41, "more than 40 nested parentheses"),
])  # fmt: skip
def test_calculator_errors_say_what_is_wrong_and_where(text, message):
    with pytest.raises(GptlabError) as raised:
        calculate(text)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_calculator_never_evaluates_python(tmp_path):
    box = Toolbox([calculator_tool()])
    for text in ["__import__('os').system('touch " + str(tmp_path / "x") + "')", "open('f')", "[1, 2]", "1 if 1 else 2", "len('ab')"]:
        result = box.run("calculator", {"expression": text})
        assert not result.ok and result.text.startswith("error: unexpected "), result
    assert not (tmp_path / "x").exists()
    source = ast.parse(Path(evaluate.__code__.co_filename).read_text())
    called = {node.func.id for node in ast.walk(source) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    imported = {alias.name for node in ast.walk(source) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert not called & {"eval", "exec", "compile", "__import__"} and "ast" not in imported


# ---------------------------------------------------------------- writing the result


@given(st.fractions(max_denominator=10**6).filter(lambda value: value.denominator != 1) | st.integers(-(10**30), 10**30).map(Fraction))
def test_calculator_format_is_exact_when_the_decimals_end_and_12_digits_when_they_repeat(value):
    text = format_number(value)
    assert "e" not in text and "," not in text
    denominator = value.denominator
    while denominator % 2 == 0:
        denominator //= 2
    while denominator % 5 == 0:
        denominator //= 5
    if denominator == 1:
        assert Fraction(text) == value and ("." in text) == (value.denominator != 1)
    else:
        assert "." in text and abs(Fraction(text) - value) <= abs(value) * Fraction(1, 10**11)
        digits = text.lstrip("-").replace(".", "").lstrip("0")
        whole = text.lstrip("-").partition(".")[0]
        assert len(digits) <= max(12, len(whole) + 1)


def test_calculator_result_runs_through_the_toolbox_as_text():
    box = Toolbox([calculator_tool()])
    assert box.run("calculator", '{"expression": "1234 * 5678"}').text == "7006652"
    assert box.run("calculator", '{"expression": "(1 + 2))"}').text == 'error: unexpected ")" at position 8'
    assert math.isclose(float(box.run("calculator", {"expression": "22 / 7"}).text), 22 / 7)
