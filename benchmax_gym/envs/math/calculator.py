"""A safe calculator for model-written arithmetic.

The model's text is hostile input: ``eval`` would run anything, and even pure arithmetic such as
``9**9**9`` or ``factorial(10**6)`` can hang a worker for minutes. So :func:`evaluate` parses with
``ast.parse(mode="eval")``, accepts only a whitelist of node types, names and functions, and
checks every operation that could grow without bound *before* running it. Every failure is a
:class:`CalculatorError` with a one-line message the model can act on.

Exact arithmetic is kept where it is cheap: ints stay ints (``6/3`` is ``2``, ``7/2`` is ``3.5``,
``sqrt(16)`` is ``4``), so generated tasks with integer answers are checked exactly.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
from collections.abc import Callable

from benchmax_gym.core.tools import ToolError

MAX_LENGTH = 2000  # characters of expression text
MAX_NODES = 500  # AST nodes after parsing
MAX_DEPTH = 250  # AST nesting depth (a flat sum of n terms is n deep); keeps recursion bounded
MAX_INT_BITS = 10_000  # about 3,000 decimal digits: any int result beyond that is refused
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 1000  # also bounds n in comb(n, k) and perm(n, k)
MAX_ROUND_DIGITS = 400  # round(x, n): 10**|n| is computed internally for ints

Number = int | float


class CalculatorError(ToolError):
    """A clean, model-readable calculator failure (no traceback)."""


# -- arithmetic with bounds ---------------------------------------------------------------


def _check(value: Number) -> Number:
    """Refuse results that are too big to be useful (or to print) and non-finite floats."""
    if type(value) is int:
        if value.bit_length() > MAX_INT_BITS:
            raise CalculatorError(f"result too large (more than {MAX_INT_BITS} bits)")
    elif type(value) is float:
        if not math.isfinite(value):
            is_nan = value != value
            raise CalculatorError("result is not a number" if is_nan else "result too large")
    else:  # complex from e.g. (-8) ** 0.5, or a bool that slipped through
        raise CalculatorError("result is not a real number")
    return value


def _add(a: Number, b: Number) -> Number:
    return _check(a + b)


def _sub(a: Number, b: Number) -> Number:
    return _check(a - b)


def _mul(a: Number, b: Number) -> Number:
    if type(a) is int and type(b) is int and a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
        raise CalculatorError(f"result too large (more than {MAX_INT_BITS} bits)")
    return _check(a * b)


def _truediv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    if type(a) is int and type(b) is int and a % b == 0:
        return a // b  # exact: keep it an int
    return _check(a / b)


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return _check(a // b)


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return _check(a % b)


def _pow(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent too large (|exponent| > {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    if type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1:
        if base.bit_length() * exponent > MAX_INT_BITS + exponent:  # estimated before computing
            raise CalculatorError(f"result too large (more than {MAX_INT_BITS} bits)")
    return _check(base**exponent)


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: _add,
    ast.Sub: _sub,
    ast.Mult: _mul,
    ast.Div: _truediv,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

# -- functions --------------------------------------------------------------------------


def _int_arg(name: str, x: Number, upper: int | None = None) -> int:
    """The int a function like factorial() needs; integral floats (5.0) are accepted."""
    if type(x) is float and x.is_integer():
        x = int(x)
    if type(x) is not int or x < 0 or (upper is not None and x > upper):
        bound = f" <= {upper}" if upper is not None else ""
        raise CalculatorError(f"{name}() needs a non-negative integer{bound}")
    return x


def _sqrt(x: Number) -> Number:
    if type(x) is int and x >= 0:
        root = math.isqrt(x)
        if root * root == x:
            return root  # exact, and works for ints too large for a float
    return math.sqrt(x)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if type(ndigits) is not int or abs(ndigits) > MAX_ROUND_DIGITS:
        raise CalculatorError(f"round() digits must be an integer with |n| <= {MAX_ROUND_DIGITS}")
    return round(x, ndigits)


def _factorial(n: Number) -> int:
    return math.factorial(_int_arg("factorial", n, MAX_FACTORIAL))


def _comb(n: Number, k: Number) -> int:
    return math.comb(_int_arg("comb", n, MAX_FACTORIAL), _int_arg("comb", k))


def _perm(n: Number, k: Number | None = None) -> int:
    n = _int_arg("perm", n, MAX_FACTORIAL)
    return math.perm(n) if k is None else math.perm(n, _int_arg("perm", k))


def _gcd(*xs: Number) -> int:
    return math.gcd(*(_int_arg_signed("gcd", x) for x in xs))


def _lcm(*xs: Number) -> int:
    ints = [_int_arg_signed("lcm", x) for x in xs]
    if sum(i.bit_length() for i in ints) > MAX_INT_BITS + len(ints):
        raise CalculatorError(f"result too large (more than {MAX_INT_BITS} bits)")
    return math.lcm(*ints)


def _int_arg_signed(name: str, x: Number) -> int:
    if type(x) is float and x.is_integer():
        x = int(x)
    if type(x) is not int:
        raise CalculatorError(f"{name}() needs integers")
    return x


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


# name -> (function, min args, max args or None for any number)
FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int | None]] = {
    "sqrt": (_sqrt, 1, 1),
    "cbrt": (math.cbrt, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (_log, 1, 2),
    "log2": (math.log2, 1, 1),
    "log10": (math.log10, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "asin": (math.asin, 1, 1),
    "acos": (math.acos, 1, 1),
    "atan": (math.atan, 1, 1),
    "atan2": (math.atan2, 2, 2),
    "sinh": (math.sinh, 1, 1),
    "cosh": (math.cosh, 1, 1),
    "tanh": (math.tanh, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "factorial": (_factorial, 1, 1),
    "gcd": (_gcd, 1, None),
    "lcm": (_lcm, 1, None),
    "comb": (_comb, 2, 2),
    "perm": (_perm, 1, 2),
    "min": (min, 1, None),
    "max": (max, 1, None),
    "hypot": (math.hypot, 1, None),
    "degrees": (math.degrees, 1, 1),
    "radians": (math.radians, 1, 1),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}

# -- parsing and validation ----------------------------------------------------------------

_SYNTAX_NAMES = {
    ast.Attribute: "attribute access",
    ast.Subscript: "indexing",
    ast.Lambda: "lambda",
    ast.ListComp: "comprehension",
    ast.SetComp: "comprehension",
    ast.DictComp: "comprehension",
    ast.GeneratorExp: "comprehension",
    ast.Compare: "comparison",
    ast.BoolOp: "'and'/'or'",
    ast.IfExp: "conditional expression",
    ast.NamedExpr: "assignment",
    ast.List: "list",
    ast.Tuple: "tuple",
    ast.Set: "set",
    ast.Dict: "dict",
    ast.JoinedStr: "f-string",
    ast.Starred: "starred argument",
    ast.keyword: "keyword argument",
    ast.BitXor: "'^' (use '**' for powers)",
    ast.BitAnd: "'&'",
    ast.BitOr: "'|'",
    ast.LShift: "'<<'",
    ast.RShift: "'>>'",
    ast.Invert: "'~'",
    ast.Not: "'not'",
    ast.MatMult: "'@'",
}


def _unsupported(node: ast.AST) -> CalculatorError:
    what = _SYNTAX_NAMES.get(type(node), type(node).__name__)
    return CalculatorError(f"unsupported syntax: {what}")


class _Builder:
    """Validate a parsed expression and turn it into nested closures, in one pass.

    Closures are cheaper to re-run than re-walking the AST. The walk is recursive but stops at
    :data:`MAX_DEPTH`, so hostile nesting (``-------...1``) cannot overflow the stack, and both
    the walk and the evaluation stay far below the interpreter's recursion limit.
    """

    def __init__(self) -> None:
        self.nodes = 0

    def build(self, node: ast.AST, depth: int = 0) -> Callable[[], Number]:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise CalculatorError(f"expression too long (more than {MAX_NODES} parts)")
        if depth > MAX_DEPTH:
            raise CalculatorError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
        kind = type(node)
        if kind is ast.BinOp:
            op = _BINARY.get(type(node.op))
            if op is None:
                raise _unsupported(node.op)
            left, right = self.build(node.left, depth + 1), self.build(node.right, depth + 1)
            return lambda: op(left(), right())
        if kind is ast.Constant:
            value = node.value
            if type(value) not in (int, float):
                what = "string" if isinstance(value, (str, bytes)) else type(value).__name__
                raise CalculatorError(f"unsupported syntax: {what} literal {value!r:.40}")
            value = _check(value)
            return lambda: value
        if kind is ast.UnaryOp:
            op = _UNARY.get(type(node.op))
            if op is None:
                raise _unsupported(node.op)
            operand = self.build(node.operand, depth + 1)
            return lambda: op(operand())
        if kind is ast.Name:
            if node.id in FUNCTIONS:
                raise CalculatorError(f"'{node.id}' is a function: call it, e.g. {node.id}(2)")
            if node.id not in CONSTANTS:
                raise CalculatorError(
                    f"unsupported syntax: name '{node.id:.40}' (known constants: pi, e, tau)"
                )
            value = CONSTANTS[node.id]
            return lambda: value
        if kind is ast.Call:
            return self.call(node, depth)
        raise _unsupported(node)

    def call(self, node: ast.Call, depth: int) -> Callable[[], Number]:
        if not isinstance(node.func, ast.Name):
            raise CalculatorError("unsupported syntax: only named functions can be called")
        name = node.func.id
        if name not in FUNCTIONS:
            raise CalculatorError(f"unknown function '{name:.40}'")
        if node.keywords:
            raise _unsupported(node.keywords[0])
        fn, low, high = FUNCTIONS[name]
        n = len(node.args)
        if n < low or (high is not None and n > high):
            want = str(low) if low == high else f"{low} or {high}" if high else f"at least {low}"
            raise CalculatorError(f"{name}() takes {want} argument(s), got {n}")
        args = [self.build(a, depth + 1) for a in node.args]

        def run() -> Number:
            try:
                return _check(fn(*[a() for a in args]))
            except ValueError:
                raise CalculatorError(f"math domain error in {name}()") from None
            except OverflowError:
                raise CalculatorError(f"result too large in {name}()") from None
            except TypeError as exc:
                raise CalculatorError(f"{name}(): {exc}") from None

        return run


# ``a op b`` of two plain ints (a negative one in parentheses), the shape of every step the task
# generator computes and of most calls: read without the parser, with the same operations
# (a fifth of the time). Anything else (spaces of other kinds, underscores, leading zeros, longer
# numbers) goes through ``ast``, which gives the same value or error (tested against it).
_INT = r"(?:0|[1-9][0-9]{0,17}|\(-(?:0|[1-9][0-9]{0,17})\))"
_SIMPLE = re.compile(f"({_INT}) *([-+*/]) *({_INT})")
_SIMPLE_OPS = {"+": _add, "-": _sub, "*": _mul, "/": _truediv}


def _simple_int(text: str) -> int:
    return -int(text[2:-1]) if text[0] == "(" else int(text)


def _compile(expression: str) -> Callable[[], Number]:
    simple = _SIMPLE.fullmatch(expression)
    if simple is not None:  # (after the cache: a repeated expression costs no match)
        left, op, right = simple.groups()
        value = _SIMPLE_OPS[op](_simple_int(left), _simple_int(right))
        return lambda: value
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        detail = "" if exc.msg == "invalid syntax" else f": {exc.msg}"
        raise CalculatorError(f"invalid syntax{detail}") from None
    except (ValueError, RecursionError, MemoryError):  # null bytes, pathological nesting
        raise CalculatorError("invalid expression") from None
    return _Builder().build(tree.body)


# Models repeat short expressions (and the reference solver replays them); long ones are not
# cached so the cache stays small whatever the input.
_CACHE_MAX_CHARS = 256
_compile_cached = functools.lru_cache(maxsize=1024)(_compile)


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression safely and return an int or a finite float.

    Surrounding white space and a trailing ``=`` are ignored. Raises :class:`CalculatorError`
    for anything else than numbers, ``+ - * / // % **``, parentheses, the functions in
    :data:`FUNCTIONS` and the constants ``pi``, ``e``, ``tau``, and for results that are
    undefined or too large.
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression too long (more than {MAX_LENGTH} characters)")
    text = expression.strip().removesuffix("=").strip()
    if not text:
        raise CalculatorError("empty expression")
    try:
        run = _compile_cached(text) if len(text) <= _CACHE_MAX_CHARS else _compile(text)
        return _check(run())
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large") from None
    except ValueError:
        raise CalculatorError("math domain error") from None
    except TypeError as exc:
        raise CalculatorError(str(exc)) from None
    except (RecursionError, MemoryError):
        raise CalculatorError("expression too complex") from None


def format_number(value: Number) -> str:
    """The text the model sees: ints exactly, floats to 12 significant digits (``3.0`` -> ``3``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"format_number needs an int or float, got {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    text = f"{value:.12g}"
    return "0" if text == "-0" else text
