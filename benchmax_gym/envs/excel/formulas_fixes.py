"""Local fixes to the ``formulas`` package (1.3.x), applied once by :func:`apply`.

Each fix makes the recalculation behave as Excel does where ``formulas`` does not, or closes a
way for a model's workbook to reach outside itself at grading:

* **one book only**: ``formulas`` follows external references (``='../[answer.xlsx]Sheet1'!A1``,
  ``[1]Sheet1!A1`` through an ``externalLink`` part) by loading that file from disk. Loading any
  workbook other than the one being recalculated (:func:`only_book`) is refused, so such a
  reference evaluates to ``#REF!`` and the grader never opens a file the model named.
* **double unary**: the parser folds ``--x`` into a unary ``+``, which Excel treats as a no-op,
  so ``SUMPRODUCT(--(A1:A3=C1:C3),B1:B3)`` summed booleans as 0. A sign run with any ``-`` that
  folds to ``+`` becomes the operator ``u--``, which converts to a number as ``-`` does.
  (Still so upstream in ``formulas/tokens/operator.py``, ``OperatorToken.process``.)
* **range cap**: ``formulas`` materializes a range cell by cell (~300 bytes each). The recalculation
  first cuts whole columns and huge ranges to the used area; a range that is still over
  :data:`MAX_LOADED_RANGE_CELLS` (the used area stretched by one far cell, R1C1 or ``INDIRECT``
  text, an array formula's area) stops the recalculation with :class:`RangeTooLarge`.
* **ranges in all**: the ranges one recalculation assembles and the arrays its cells hold may
  cover at most :data:`MAX_RANGES_CELLS` together (:class:`RangesTooLarge`): ranges under the
  cut are never cut, and 40 formulas over their own 99,000-cell ranges took 2.4 GB.
* **array size**: a function or operator whose result would have over :data:`MAX_ARRAY_CELLS`
  cells (``A1:A20000*TRANSPOSE(A1:A20000)``, ``MMULT``, ``MUNIT``, ``MAKEARRAY``, ``EXPAND``, the
  periods ``CUMIPMT``/``CUMPRINC`` list, the cells ``TEXTSPLIT`` pads) is refused before it runs
  (:class:`ArrayTooLarge`): one such numpy operation on objects holds the GIL, so no deadline
  could stop it (97 s and 3.2 GB past a 3 s limit).
* **numbers past a float**: ``FACT``, ``FACTDOUBLE``, ``PERMUT`` and ``PERMUTATIONA`` answer
  Excel's ``#NUM!`` past 1.8e308 instead of building the exact integer in one GIL-holding call
  (``FACT(3000000)`` ran over 60 s past a 3 s limit); ``FACTDOUBLE`` no longer wraps past 33!!.
* **regular expressions**: ``REGEXTEST``/``REGEXEXTRACT``/``REGEXREPLACE`` run on the ``regex``
  module with the GIL released and the deadline as timeout (``re`` cannot be interrupted:
  ``(a|aa)+b`` on 40 letters backtracks for days); ``REGEXTEST`` looks for a match anywhere, as
  Excel does (``formulas`` only at the start).
* **number literals**: ``1E3`` is 1000, as Excel reads it (``formulas`` read only ``1E+3``: a
  correct ``=1E3+1`` had no value).
* **deadline**: a recalculation given a time limit (:func:`deadline`) stops at the next cell
  ``formulas`` loads, range it assembles or formula it evaluates past it (:class:`Overrun`):
  20,000 chained formulas took 44 s. Between checks one C call can run on (a wildcard
  ``COUNTIF`` backtracks in ``re``, holding the interpreter lock): the recalculation's process
  is killed at the same deadline (:func:`.recalc._formulas_values_in_child`).
* **text cap**: Excel's text results stop at 32,767 characters (``#VALUE!`` past that);
  ``formulas`` builds any string, so ``REPT(REPT("x",30000),30000)`` took ~1 GB. ``REPT`` and
  ``SUBSTITUTE``, ``REGEXREPLACE``, and ``CONCAT``, ``CONCATENATE``, ``TEXTJOIN`` and
  ``ARRAYTOTEXT`` (whose inputs may be many ranges of long texts: gigabytes) check the length
  before building; ``&`` and ``REPLACE`` (at most twice their capped inputs) check after.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

MAX_TEXT = 32_767  # Excel's limit on the characters of a text value
MAX_LOADED_RANGE_CELLS = 300_000
"""The most cells one range may cover when ``formulas`` reads it: no workbook the host opens holds
more cells than this (:data:`.recalc.MAX_CELLS`), so a larger range is mostly empty grid."""

MAX_RANGES_CELLS = 1_000_000
"""The most cells the distinct ranges of one recalculation may cover together: ``formulas`` holds
each assembled range cell by cell (~600 bytes a cell), so this bounds its memory near 0.6 GB."""


class RangeTooLarge(BaseException):
    """A range over :data:`MAX_LOADED_RANGE_CELLS`. A BaseException, so that the ``except
    Exception`` of ``formulas`` and schedula (which would make it a ``#REF!``) let it through."""

    def __init__(self, ref: str, cells: int):
        super().__init__(ref, cells)
        self.ref, self.cells = ref, cells


MAX_ARRAY_CELLS = 1_000_000
"""The most cells one function's or operator's result may have."""


class ArrayTooLarge(RangeTooLarge):
    """A function or operator whose result would be over :data:`MAX_ARRAY_CELLS` cells; ``ref``
    is its name."""


class RangesTooLarge(RangeTooLarge):
    """The ranges of one recalculation over :data:`MAX_RANGES_CELLS` together; ``ref`` is the one
    that passed it."""


class Overrun(BaseException):
    """This thread's recalculation ran past its :func:`deadline`; a BaseException, as
    :class:`RangeTooLarge`."""


_allowed = threading.local()  # .path: the one workbook file this thread may load
_deadline = threading.local()  # .at: the time.monotonic() past which this thread's recalculation stops
# .cells: the cells of the ranges it has assembled and the arrays its nodes hold so far (.held: their ids)


@contextlib.contextmanager
def only_book(path: str | os.PathLike) -> Iterator[None]:
    """While this thread recalculates ``path``, ``formulas`` may load that file and no other."""
    _allowed.path = os.path.realpath(path)
    try:
        yield
    finally:
        _allowed.path = None


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """While this thread recalculates, ``formulas`` stops with :class:`Overrun` past ``seconds``
    (None: never): checked before each cell it loads, range it assembles and node it evaluates.
    It also counts the cells of the ranges it assembles, against :data:`MAX_RANGES_CELLS`."""
    _deadline.at = None if seconds is None else time.monotonic() + seconds
    _deadline.cells, _deadline.held = 0, set()
    try:
        yield
    finally:
        _deadline.at = _deadline.held = None


def _checked(method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        at = getattr(_deadline, "at", None)
        if at is not None and time.monotonic() > at:
            raise Overrun
        return method(*args, **kwargs)
    return wrapper


@functools.cache
def apply() -> None:
    """Install the fixes into the imported ``formulas`` package (idempotent)."""
    import formulas.excel.xlreader as xlreader
    import schedula as sh
    from formulas.functions import (
        Error, XlError, flatten, get_error, get_functions, is_not_empty, raise_errors, replace_empty,
        return_2d_func, wrap_func, wrap_ufunc,
    )
    from formulas.functions import text as ftext
    from formulas.functions.operators import OPERATORS
    from formulas.tokens.operator import Operator

    # --- one book only
    load_workbook = xlreader.load_workbook

    def guarded_load_workbook(filename: Any, *args: Any, **kwargs: Any) -> Any:
        allowed = getattr(_allowed, "path", None)
        if allowed is None or os.path.realpath(filename) != allowed:
            raise PermissionError("external workbook references are not followed")
        return load_workbook(filename, *args, **kwargs)

    xlreader.load_workbook = guarded_load_workbook  # add_book imports it from the module per call

    # --- range cap
    from formulas.ranges import Ranges

    get_range = Ranges.get_range

    def bounded_get_range(ref: Any, context: Any = None, raise_anchor: bool = True) -> Any:
        rng = get_range(ref, context, raise_anchor)
        rows = int(rng.get("r2") or 1) - (int(rng.get("r1") or 1) or 1) + 1  # 0: from the first
        cols = int(rng.get("n2") or 1) - (int(rng.get("n1") or 1) or 1) + 1
        if rows * cols > MAX_LOADED_RANGE_CELLS:
            raise RangeTooLarge(str(ref), rows * cols)
        return rng

    Ranges.get_range = staticmethod(bounded_get_range)  # ranges formulas loads and assembles pass here

    # --- deadline
    from formulas.cell import RangesAssembler
    from formulas.excel import ExcelModel
    from schedula.utils.sol import Solution

    ExcelModel.compile_cell = _checked(ExcelModel.compile_cell)
    assemble = _checked(RangesAssembler.__init__)

    def counted_assemble(self: Any, ref: Any, *args: Any, **kwargs: Any) -> None:
        assemble(self, ref, *args, **kwargs)
        if getattr(_deadline, "held", None) is None:  # not in a recalculation of ours: not counted
            return
        _deadline.cells += len(self.indices)
        if _deadline.cells > MAX_RANGES_CELLS:
            raise RangesTooLarge(str(ref), _deadline.cells)

    RangesAssembler.__init__ = counted_assemble
    evaluate_node = _checked(Solution._evaluate_node)

    def counted_evaluate_node(self: Any, args: Any, node_attr: Any, node_id: Any, *rest: Any, **kwargs: Any) -> Any:
        value = evaluate_node(self, args, node_attr, node_id, *rest, **kwargs)
        held = getattr(_deadline, "held", None)
        if isinstance(value, np.ndarray) and value.size > 1 and held is not None and id(value) not in held:
            held.add(id(value))  # a cell's array, held to the end (often by two nodes)
            _deadline.cells += value.size
            if _deadline.cells > MAX_RANGES_CELLS:
                raise RangesTooLarge(f"an array of {value.size} cells", _deadline.cells)
        return value

    Solution._evaluate_node = counted_evaluate_node

    # --- double unary
    Operator._precedences["u--"] = Operator._precedences["u-"]
    Operator._n_args["u--"] = 1
    OPERATORS["U--"] = wrap_ufunc(lambda x: x)  # the numeric input parser makes TRUE 1, "3" 3
    update_name, set_expr = Operator.update_name, Operator.set_expr

    def fixed_update_name(self: Any, tokens: Any, stack: Any) -> None:
        update_name(self, tokens, stack)
        if self.name == "u+" and "-" in (self.attr.get("sum_minus") or ""):
            self.attr["name"] = "u--"

    def fixed_set_expr(self: Any, *tokens: Any) -> None:
        if self.name == "u--":
            self.attr["expr"] = "--{}".format(*[t.get_expr for t in tokens])
        else:
            set_expr(self, *tokens)

    Operator.update_name = fixed_update_name
    Operator.set_expr = fixed_set_expr

    # --- text cap
    too_long = Error.errors["#VALUE!"]

    def capped(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any) -> Any:
            result = func(*args)
            return too_long if isinstance(result, str) and len(result) > MAX_TEXT else result
        return wrapper

    def rept(text: Any, number_times: Any) -> Any:
        times = int(float(replace_empty(number_times)))
        if times > 0 and len(ftext._str(text)) * times > MAX_TEXT:
            return too_long
        return ftext.xrept(text, number_times)

    def substitute(text: Any, old_text: Any, new_text: Any, instance_num: Any = None) -> Any:
        if instance_num is None and not isinstance(text, XlError):
            text_, old, new = (ftext._str(v) for v in (text, old_text, new_text))
            if old and len(text_) + text_.count(old) * (len(new) - len(old)) > MAX_TEXT:
                return too_long
        return capped(ftext.xsubstitute)(text, old_text, new_text, instance_num)

    functions = get_functions()
    functions["REPT"] = wrap_ufunc(rept, **ftext._kw0)
    functions["SUBSTITUTE"] = wrap_ufunc(
        substitute, input_parser=lambda *a: a,
        args_parser=lambda *a: (replace_empty(v, "") for v in a),
    )
    functions["REPLACE"] = functions["REPLACEB"] = wrap_ufunc(capped(ftext.xreplace), **ftext._kw0)
    OPERATORS["&"] = wrap_ufunc(
        capped(lambda x, y: x + y), input_parser=lambda *a: map(ftext._str, a),
        args_parser=lambda *a: (replace_empty(v, "") for v in a),
    )

    # --- text built from many values: checked before it is built
    def concat(text: Any, *args: Any) -> Any:
        values = list(flatten((text, *args), is_not_empty))
        raise_errors(values)
        parts = [ftext._str(v) for v in values]
        return too_long if sum(map(len, parts)) > MAX_TEXT else "".join(parts)

    def textjoin(delimiter: Any, ignore_empty: Any, text: Any, *args: Any) -> Any:
        raise_errors(delimiter, ignore_empty, text, *args)
        if ignore_empty:
            values = flatten((text, *args), is_not_empty)
        else:
            values = (replace_empty(v, "") for v in flatten((text, *args), None))
        parts, sep = [ftext._str(v) for v in values], ftext._str(next(flatten(delimiter, None)))
        if sum(map(len, parts)) + len(sep) * (len(parts) - 1) > MAX_TEXT:
            return too_long
        return sep.join(parts)

    def arraytotext(array: Any, format_type: Any = 0) -> Any:
        values = flatten(np.asarray(array, object), None)
        if sum(len(ftext._str(v)) + 3 for v in values) > MAX_TEXT:  # ", " or '"",' per value at most
            return too_long
        return ftext.xarraytotext(array, format_type)

    def textsplit(text: Any, col_delimiter: Any, row_delimiter: Any = None, *args: Any) -> Any:
        rows, cols = _split_shape(ftext._str(text), col_delimiter, row_delimiter, flatten)
        if rows * cols > MAX_ARRAY_CELLS:
            raise ArrayTooLarge("TEXTSPLIT", rows * cols)
        return ftext.xtextsplit(text, col_delimiter, row_delimiter, *args)

    functions["_XLFN.CONCAT"] = functions["CONCAT"] = wrap_func(concat)
    functions["_XLFN.CONCATENATE"] = functions["CONCATENATE"] = wrap_ufunc(concat, **ftext._kw0)
    functions["_XLFN.TEXTJOIN"] = functions["TEXTJOIN"] = wrap_func(textjoin)
    functions["ARRAYTOTEXT"] = functions["_XLFN.ARRAYTOTEXT"] = wrap_ufunc(
        arraytotext, input_parser=lambda *a: a, args_parser=lambda *a: a,
        check_error=lambda a, format_type=0: get_error(format_type), excluded={0},
    )
    functions["TEXTSPLIT"] = functions["_XLFN.TEXTSPLIT"] = wrap_ufunc(
        textsplit, input_parser=lambda *a: a, args_parser=lambda *a: a,
        excluded={1, 2, 5}, return_func=return_2d_func, check_nan=False,
    )

    # --- regular expressions: the regex module, stopped at the deadline, results capped
    ftext._xregex = functools.partial(_regex, too_long=too_long)

    def regextest(text: Any, pattern: Any, case_sensitivity: Any = 0) -> bool:
        rx, text = ftext._xregex(text, pattern, case_sensitivity)
        return rx.search(text) is not None  # Excel: whether any part of the text matches (formulas: the start)

    functions["REGEXTEST"] = functions["_XLFN.REGEXTEST"] = wrap_ufunc(regextest, check_nan=False, **ftext._kw0)

    # --- numbers past a float: Excel's #NUM!, never the exact integer (FACT(1E9) would hold the GIL for days)
    from formulas.functions import stat as fstat

    def fact(number: Any) -> Any:
        return float(math.factorial(int(number))) if 0 <= number < 171 else np.nan  # 171! is past a float

    def factdouble(number: Any) -> Any:
        raise_errors(number)
        x = next(flatten(number, None))
        if isinstance(x, bool):
            return Error.errors["#VALUE!"]
        x = float(0 if x is sh.EMPTY else x)
        if not -1 <= x < 301:  # 301!! is past a float (numpy's int64 product wrapped from 35!!)
            return Error.errors["#NUM!"]
        return float(math.prod(range(int(x), 0, -2)))

    def permut(number: Any, number_chosen: Any) -> Any:
        n, k = int(number), int(number_chosen)
        if k < 0 or n < k:
            return Error.errors["#NUM!"]
        if math.lgamma(n + 1) - math.lgamma(n - k + 1) > _LOG_FLOAT_MAX:
            return Error.errors["#NUM!"]
        return float(math.perm(n, k))

    def permutationa(number: Any, number_chosen: Any) -> Any:
        n, k = int(number), int(number_chosen)
        if n > 1 and k > 0 and k * math.log(n) > _LOG_FLOAT_MAX:
            return Error.errors["#NUM!"]
        return fstat.xpermutationa(number, number_chosen)

    functions["FACT"] = wrap_ufunc(fact)
    functions["FACTDOUBLE"] = wrap_func(factdouble)
    functions["_XLFN.PERMUT"] = functions["PERMUT"] = wrap_ufunc(permut)
    functions["_XLFN.PERMUTATIONA"] = functions["PERMUTATIONA"] = wrap_ufunc(permutationa)

    # --- number literals: Excel reads 1E3 as 1000; formulas only 1E+3 (a correct =1E3+1 had no value)
    from formulas.tokens.operand import Number

    import regex

    Number._re = regex.compile(Number._re.pattern.replace("(?>E[+-][0-9]+)?", "(?>E[+-]?[0-9]+)?"),
                               Number._re.flags)

    # --- array size
    for table in (functions, OPERATORS):
        for name, entry in table.items():
            if name in (",", " ", ":"):  # range operators: get_range bounds them
                continue
            if isinstance(entry, dict) and callable(entry.get("function")):
                entry["function"] = _sized(name, entry["function"])
            elif callable(entry):
                table[name] = _sized(name, entry)


_LOG_FLOAT_MAX = math.log(sys.float_info.max)


def _remaining() -> float | None:
    """Seconds left to this thread's recalculation (None: no deadline)."""
    at = getattr(_deadline, "at", None)
    return None if at is None else max(at - time.monotonic(), 0.001)


class _Regex:
    """A pattern of the ``regex`` module run with the GIL released and the recalculation's deadline
    as its timeout (:class:`Overrun` past it): Python's ``re`` cannot be interrupted, and
    ``REGEXTEST(REPT("a",40)&"!","(a|aa)+b")`` backtracks for days. ``sub`` stops at Excel's text
    limit before it builds more: a 32,767-character text with a 32,767-character replacement at each
    of its 32,768 empty matches is a billion characters."""

    def __init__(self, pattern: Any, too_long: Any):
        self.pattern, self.too_long = pattern, too_long

    def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            result = getattr(self.pattern, method)(*args, timeout=_remaining(), concurrent=True, **kwargs)
            return list(result) if method == "finditer" else result
        except TimeoutError:
            raise Overrun from None

    def match(self, text: str) -> Any:
        return self._run("match", text)

    def search(self, text: str) -> Any:
        return self._run("search", text)

    def finditer(self, text: str) -> Any:
        return self._run("finditer", text)

    def sub(self, template: str, text: str, count: int = 0) -> Any:
        refs = len(_TEMPLATE_REF.findall(template))
        size = len(text)  # at most the result's length, match by match

        def expand(m: Any) -> str:
            nonlocal size
            longest = max(len(g) for g in (m[0], *m.groups()) if g is not None)
            size += len(template) + refs * longest - len(m[0])
            if size > MAX_TEXT:
                raise _TooLong
            return m.expand(template)

        try:
            return self._run("sub", expand, text, count=count)
        except _TooLong:
            return self.too_long


class _TooLong(Exception):
    pass


# A group reference in a replacement template (\1, \g<name>); an escaped backslash before a digit
# may count too, which only overestimates.
_TEMPLATE_REF = re.compile(r"\\(?:g<[^>]*>|[1-9][0-9]?)")


def _regex(text: Any, pattern: Any, case_sensitivity: Any = 0, *, too_long: Any) -> tuple[_Regex, str]:
    """``formulas``' ``_xregex`` on the ``regex`` module (see :class:`_Regex`)."""
    import regex
    from formulas.functions import Error, replace_empty
    from formulas.functions.text import _str
    from formulas.errors import FoundError

    case_sensitivity = int(float(replace_empty(case_sensitivity)))
    if case_sensitivity not in (0, 1):
        raise FoundError(err=Error.errors["#VALUE!"])
    flags = regex.IGNORECASE if case_sensitivity == 1 else 0
    return _Regex(regex.compile(_str(pattern), flags), too_long), _str(text)


def _split_shape(text: str, col_delimiter: Any, row_delimiter: Any, flatten: Any) -> tuple[int, int]:
    """Rows and columns of ``TEXTSPLIT(text, ...)`` before its padding makes them (0 where the
    delimiters are bad: the function answers that; matched ignoring case, an upper bound): one text
    of 32,767 characters splits into 16,000 x 16,000 cells."""
    def pattern(delimiter: Any) -> str | None:
        from formulas.functions.text import _str
        parts = [_str(v) for v in flatten(delimiter, None, True)]
        return "|".join(map(re.escape, parts)) if parts and all(parts) else None

    cols = pattern(col_delimiter)
    rows = [text] if row_delimiter is None else (re.split(p, text, flags=re.IGNORECASE) if (p := pattern(row_delimiter)) else [])
    if cols is None or not rows:
        return 0, 0
    split = re.compile(cols, re.IGNORECASE)
    return len(rows), max(len(split.split(row)) for row in rows)


def _shape(value: Any) -> tuple[int, int] | None:
    """The rows and columns of an array or range argument (None for a single value)."""
    if isinstance(value, np.ndarray):
        return value.shape if value.ndim == 2 else None
    ranges = getattr(value, "ranges", None)
    if ranges and isinstance(ranges[0], dict):
        r = ranges[0]
        try:
            return int(r["r2"]) - int(r["r1"]) + 1, int(r["n2"]) - int(r["n1"]) + 1
        except (KeyError, TypeError, ValueError):
            return None
    return None


def _number(value: Any) -> float:
    """A count argument as a number (0 when it is not one: the function itself answers that)."""
    value = getattr(value, "value", value)
    try:
        number = float(np.ravel(value)[0])
    except (TypeError, ValueError, IndexError):
        return 0.0
    return number if number == number else 0.0  # NaN


def _result_cells(name: str, args: tuple) -> float:
    """How many cells ``name(*args)`` would produce, from its arguments' shapes alone: their
    broadcast (element-wise functions and operators), or what the array makers are asked for."""
    base = name.rpartition(".")[2]
    if base == "MMULT" and len(args) >= 2:
        left, right = _shape(args[0]), _shape(args[1])
        if left and right:
            return left[0] * right[1]
    elif base == "MUNIT" and args:
        return _number(args[0]) ** 2
    elif base == "MAKEARRAY" and len(args) >= 2:
        return _number(args[0]) * _number(args[1])
    elif base in ("CUMIPMT", "CUMPRINC") and len(args) >= 5:  # a list of its periods
        return _number(args[4]) - _number(args[3]) + 1
    elif base == "EXPAND" and len(args) >= 2:
        return _number(args[1]) * (_number(args[2]) if len(args) > 2 else 1)
    shapes = [shape for shape in map(_shape, args) if shape]
    if len(shapes) < 2:
        return 0
    try:
        return math.prod(np.broadcast_shapes(*shapes))
    except ValueError:  # shapes that do not broadcast: the function pairs them its own way
        return 0


def _sized(name: str, func: Any) -> Any:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cells = _result_cells(name, args)
        if cells > MAX_ARRAY_CELLS:
            raise ArrayTooLarge(name, int(min(cells, 1e18)))
        return func(*args, **kwargs)
    return wrapper
