"""The calculator: exact arithmetic, the whitelist, and hostile input failing fast and cleanly."""

import math
import tracemalloc

import pytest

from benchmax_gym.core.tools import ToolError
from benchmax_gym.envs.math.calculator import (
    FUNCTIONS,
    MAX_LENGTH,
    CalculatorError,
    evaluate,
    format_number,
)


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("(12 + 7) * 3 - 4 / 2", 55),
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("2 ** 10", 1024),
        ("2 ** -2", 0.25),
        ("-3 ** 2", -9),
        ("(-3) ** 2", 9),
        ("+5 - -5", 10),
        ("10 // 3", 3),
        ("-7 // 2", -4),
        ("10 % 3", 1),
        ("-7 % 3", 2),
        ("0.1 + 0.2", 0.1 + 0.2),
        ("1.5e3 / 3", 500.0),
        ("  3 + 4  ", 7),
        ("3 + 4 =", 7),
        (" 3 + 4 = ", 7),
        ("1_000 + 1", 1001),
        ("123456789 * 987654321", 121932631112635269),
        ("2 ** 9999 // 2 ** 9998", 2),
    ],
)
def test_arithmetic(expression, expected):
    assert evaluate(expression) == expected


def test_exact_division_stays_int():
    assert evaluate("6/3") == 2 and type(evaluate("6/3")) is int
    assert evaluate("7/2") == 3.5 and type(evaluate("7/2")) is float
    assert type(evaluate("-12 / 4")) is int
    assert type(evaluate("6.0 / 3")) is float  # a float operand stays a float


FUNCTION_CASES = [
    ("sqrt(16)", 4),
    ("sqrt(2)", math.sqrt(2)),
    ("cbrt(27)", 3.0),
    ("exp(1)", math.e),
    ("log(e)", 1.0),
    ("log(8, 2)", 3.0),
    ("log2(1024)", 10.0),
    ("log10(1000)", 3.0),
    ("sin(pi / 2)", 1.0),
    ("cos(0)", 1.0),
    ("tan(0)", 0.0),
    ("asin(1)", math.pi / 2),
    ("acos(1)", 0.0),
    ("atan(1)", math.pi / 4),
    ("atan2(1, 1)", math.pi / 4),
    ("sinh(0)", 0.0),
    ("cosh(0)", 1.0),
    ("tanh(0)", 0.0),
    ("floor(3.7)", 3),
    ("ceil(3.2)", 4),
    ("abs(-3)", 3),
    ("round(2.675, 2)", round(2.675, 2)),
    ("round(3.5)", 4),
    ("factorial(5)", 120),
    ("gcd(12, 18)", 6),
    ("gcd(12, 18, 8)", 2),
    ("lcm(4, 6)", 12),
    ("comb(10, 3)", 120),
    ("perm(5, 2)", 20),
    ("perm(5)", 120),
    ("min(3, 2, 7)", 2),
    ("max(3, 2, 7)", 7),
    ("hypot(3, 4)", 5.0),
    ("degrees(pi)", 180.0),
    ("radians(180)", math.pi),
]


@pytest.mark.parametrize("expression, expected", FUNCTION_CASES)
def test_functions(expression, expected):
    assert evaluate(expression) == pytest.approx(expected)


def test_every_whitelisted_function_is_tested():
    tested = {call.split("(")[0] for call, _ in FUNCTION_CASES}
    assert tested == set(FUNCTIONS)


def test_constants():
    assert evaluate("pi") == math.pi
    assert evaluate("e") == math.e
    assert evaluate("tau") == math.tau
    assert evaluate("2 * pi") == math.tau


def test_int_results_are_exact():
    assert evaluate("sqrt(10**40)") == 10**20  # exact root of an int too large for float precision
    assert evaluate("factorial(30)") == math.factorial(30)
    assert evaluate("comb(1000, 500)") == math.comb(1000, 500)


def test_calculator_error_is_a_tool_error():
    with pytest.raises(CalculatorError) as caught:
        evaluate("1/0")
    assert isinstance(caught.value, ToolError)
    assert caught.value.code == "tool_error"
    assert str(caught.value) == "division by zero"


@pytest.mark.parametrize(
    "expression, message",
    [
        ("1/0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("sqrt(-1)", "math domain error in sqrt()"),
        ("log(0)", "math domain error in log()"),
        ("acos(2)", "math domain error in acos()"),
        ("x + 1", "unsupported syntax: name 'x'"),
        ("2 ^ 3", "use '**'"),
        ("sqrt", "'sqrt' is a function"),
        ("sqrt(1, 2)", "sqrt() takes 1 argument(s), got 2"),
        ("log(1, 2, 3)", "log() takes 1 or 2 argument(s), got 3"),
        ("max()", "max() takes at least 1 argument(s), got 0"),
        ("foo(1)", "unknown function 'foo'"),
        ("1 +", "invalid syntax"),
        ("", "empty expression"),
        ("  =  ", "empty expression"),
        ("'abc'", "string literal"),
        ("1j", "complex literal"),
        ("True + 1", "bool literal"),
        ("(-8) ** 0.5", "not a real number"),
        ("exp(1000)", "result too large in exp()"),
        ("1e308 * 10", "result too large"),
        ("1e999", "result too large"),
        ("factorial(-1)", "factorial() needs a non-negative integer"),
        ("factorial(2.5)", "factorial() needs a non-negative integer"),
        ("1 < 2", "unsupported syntax: comparison"),
        ("1, 2", "unsupported syntax: tuple"),
        ("max(1, key=2)", "keyword argument"),
    ],
)
def test_errors_are_clean(expression, message):
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


HOSTILE = [
    "9**9**9",
    "10**100000",
    "2**10001",
    "(2**5000) * (2**5000) * 2",
    "99999**9999",
    "1.0001 ** 100000",
    "2.5 ** 5000",
    "10**3000 * 1.5",
    "factorial(10**6)",
    "factorial(1001)",
    "comb(10**9, 5)",
    "perm(10**6, 1000)",
    "lcm(2**6000, 3**4000)",
    "round(5, 10**100)",
    "__import__('os')",
    "__import__('os').system('echo hi')",
    "().__class__",
    "().__class__.__bases__[0].__subclasses__()",
    "open('/etc/passwd')",
    "eval('1')",
    "lambda: 1",
    "(lambda: 1)()",
    "[x for x in range(10)]",
    "{x: 1 for x in range(3)}",
    "(x for x in ())",
    "[1, 2, 3]",
    "'a' * 10**9",
    "f'{1}'",
    "a[0]",
    "(y := 5)",
    "1 if 2 else 3",
    "max(*[1, 2])",
    "1" * (MAX_LENGTH + 1),
    "1+" * 5000 + "1",
    "(" * 10_000 + "1" + ")" * 10_000,
    "-" * 1999 + "1",
    "+".join(["1"] * 999),
    "sqrt(" * 300 + "4" + ")" * 300,
    "\x00",
]


@pytest.mark.parametrize("expression", HOSTILE, ids=lambda e: repr(e[:30]))
def test_hostile_input_fails_fast(expression):
    """Refused before the work: no huge result is ever built (``factorial(10**6)`` computed is
    14 MB and seconds, ``9**9**9`` minutes; parsing the longest text allowed peaks at ~1 MB)."""
    tracemalloc.start()
    try:
        with pytest.raises(CalculatorError):
            evaluate(expression)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak


def test_deep_but_legal_nesting():
    assert evaluate("(" * 150 + "1" + ")" * 150) == 1  # parentheses add no depth to the tree
    assert evaluate("+".join(["1"] * 200)) == 200
    assert evaluate("-" * 100 + "1") == 1


def test_non_string_input():
    with pytest.raises(CalculatorError, match="must be a string"):
        evaluate(12)


def test_largest_allowed_results():
    assert evaluate("2**9999").bit_length() == 10_000
    assert evaluate("factorial(1000)") == math.factorial(1000)
    assert len(format_number(evaluate("2**9999"))) == 3010


@pytest.mark.parametrize(
    "value, text",
    [
        (3, "3"),
        (-42, "-42"),
        (10**30, "1" + "0" * 30),
        (3.0, "3"),
        (-0.0, "0"),
        (2.5, "2.5"),
        (1 / 3, "0.333333333333"),
        (0.1 + 0.2, "0.3"),
        (123456.789, "123456.789"),
        (1e20, "1e+20"),
        (1.5e-7, "1.5e-07"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


def test_format_number_refuses_non_numbers():
    for bad in (float("inf"), float("nan")):
        with pytest.raises(CalculatorError):
            format_number(bad)
    with pytest.raises(TypeError):
        format_number("3")
    with pytest.raises(TypeError):
        format_number(True)


def _outcome(expression):
    try:
        value = evaluate(expression)
        return type(value), value
    except CalculatorError as exc:
        return "error", str(exc)


def test_simple_fast_path_agrees_with_the_parser(monkeypatch):
    """``a op b`` of two ints is read without ``ast``: every value, type and error message is
    the parser's, over near-miss shapes too (spaces, tabs, leading zeros, underscores, signs,
    long numbers, zero divisors)."""
    import random
    import re

    from benchmax_gym.envs.math import calculator

    rng = random.Random(7)
    numbers = ["0", "7", "10", "12345", "999999999999999999", "1000000000000000000", "123456789012345678901",
               "007", "1_000", "(-0)", "(-8)", "(-123456789012345678)", "(- 3)", "( -3)", "-4", "+4", "4.0"]
    ops = ["+", "-", "*", "/", "//", "%", "**", "x"]
    spaces = ["", " ", "  ", "\t"]
    cases = [f"{rng.choice(numbers)}{rng.choice(spaces)}{rng.choice(ops)}{rng.choice(spaces)}{rng.choice(numbers)}"
             for _ in range(3000)]
    cases += [f"{a if a >= 0 else f'({a})'} {op} {b if b >= 0 else f'({b})'}" for a, op, b in (
        (rng.randint(-10**6, 10**6), rng.choice("+-*/"), rng.choice([0, rng.randint(-999, 999)])) for _ in range(1000))]
    cases += ["87 - 33", "(-5) * 3", "7/2", "6/3", "5 / 0", "(-0) - 0", " 2 + 2 =", "1+1"]
    fast = [_outcome(case) for case in cases]
    assert sum(calculator._SIMPLE.fullmatch(c.strip().removesuffix("=").strip()) is not None for c in cases) > 1000
    monkeypatch.setattr(calculator, "_SIMPLE", re.compile(r"(?!)"))  # the parser's path only
    calculator._compile_cached.cache_clear()
    assert [_outcome(case) for case in cases] == fast
