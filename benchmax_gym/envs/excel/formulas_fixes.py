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
* **text cap**: Excel's text results stop at 32,767 characters (``#VALUE!`` past that);
  ``formulas`` builds any string, so ``REPT(REPT("x",30000),30000)`` took ~1 GB. ``REPT`` and
  ``SUBSTITUTE`` check the length before building; ``&``, ``CONCAT``, ``CONCATENATE``,
  ``TEXTJOIN`` and ``REPLACE`` (whose results are at most a few times their capped inputs)
  check after.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

MAX_TEXT = 32_767  # Excel's limit on the characters of a text value

_allowed = threading.local()  # .path: the one workbook file this thread may load


@contextlib.contextmanager
def only_book(path: str | os.PathLike) -> Iterator[None]:
    """While this thread recalculates ``path``, ``formulas`` may load that file and no other."""
    _allowed.path = os.path.realpath(path)
    try:
        yield
    finally:
        _allowed.path = None


@functools.cache
def apply() -> None:
    """Install the fixes into the imported ``formulas`` package (idempotent)."""
    import formulas.excel.xlreader as xlreader
    from formulas.functions import Error, XlError, get_functions, replace_empty, wrap_func, wrap_ufunc
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
    functions["_XLFN.CONCAT"] = functions["CONCAT"] = wrap_func(capped(ftext.xconcat))
    functions["_XLFN.CONCATENATE"] = functions["CONCATENATE"] = wrap_ufunc(
        capped(ftext.xconcat), **ftext._kw0
    )
    functions["_XLFN.TEXTJOIN"] = functions["TEXTJOIN"] = wrap_func(capped(ftext.xtextjoin))
    OPERATORS["&"] = wrap_ufunc(
        capped(lambda x, y: x + y), input_parser=lambda *a: map(ftext._str, a),
        args_parser=lambda *a: (replace_empty(v, "") for v in a),
    )
