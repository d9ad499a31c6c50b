"""The offline Excel task generator: a seeded table, a request about it, and the answer workbook.

Seven task types (:data:`TASK_TYPES`), each a builder that adds what the request needs to the
input workbook and returns how to solve it; the answer workbook is the input changed that way.
Answer workbooks hold plain values (never formulas), so they grade without recalculation, and
every number in an answer position is either exact at 2 decimals or far from a rounding tie, so
SpreadsheetBench's "round to 2 decimals" comparison is never ambiguous.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from openpyxl import Workbook

from benchmax_gym.core.checks import arg, config_of
from benchmax_gym.core.sources import GeneratedSource
from benchmax_gym.core.tasks import GeneratedTasks, Task
from benchmax_gym.core.tasks import pick as _pick, rand_int as _int, sample as _sample, shuffled as _shuffled
from benchmax_gym.envs.excel.spreadsheetbench import (
    CELL_LEVEL,
    SHEET_LEVEL,
    excel_task,
    spreadsheetbench_prompt,
)
from benchmax_gym.envs.excel.workbooks import (
    CATEGORIES,
    CLASSES,
    MONTHS,
    REGIONS,
    _TABLES,
    _Book,
    _col,
    _header,
    _money,
    _people,
    _Table,
    _write_rows,
    workbook_bytes,
)

TASK_TYPES = ("aggregate", "fill_formula", "lookup", "sort", "filter", "split", "conditional")


@dataclass(frozen=True)
class ExcelTaskConfig:
    """Knobs of the generator.

    Attributes:
        rows: data rows in the main table (5-500).
        multi_sheet: lookup keys go on a second sheet, filter tasks read a table that is not
            on the first sheet, and distractor sheets (notes, an archive table with the same
            columns) may be added.
        task_types: which task types to draw from (a tuple of names from :data:`TASK_TYPES`;
            a list or a single name is accepted too).
    """

    rows: int = 20
    multi_sheet: bool = False
    task_types: tuple[str, ...] = TASK_TYPES

    def __post_init__(self):
        rows = self.rows
        if (
            isinstance(rows, bool)
            or not isinstance(rows, (int, np.integer))
            or not 5 <= rows <= 500
        ):
            raise ValueError(f"rows must be an int from 5 to 500, got {rows!r}")
        object.__setattr__(self, "rows", int(rows))
        if not isinstance(self.multi_sheet, (bool, np.bool_)):
            raise ValueError(f"multi_sheet must be True or False, got {self.multi_sheet!r}")
        object.__setattr__(self, "multi_sheet", bool(self.multi_sheet))
        types = self.task_types
        if isinstance(types, str):
            types = (types,)
        if not isinstance(types, (tuple, list)) or not types:
            raise ValueError(
                f"task_types must be a non-empty tuple of {TASK_TYPES}, got {self.task_types!r}"
            )
        unknown = [t for t in types if t not in TASK_TYPES]
        if unknown:
            raise ValueError(f"task_types may only contain {TASK_TYPES}, got {unknown!r}")
        object.__setattr__(self, "task_types", tuple(dict.fromkeys(types)))


def make_excel_task(
    rng: np.random.Generator, index: int, config: ExcelTaskConfig | None = None
) -> Task:
    """Task ``index`` drawn with ``rng``: a table, a request about it, and the answer workbook."""
    config = ExcelTaskConfig() if config is None else config
    task_type = _pick(rng, config.task_types)
    kind = _pick(rng, tuple(_TABLES))
    table = _TABLES[kind](rng, config.rows)
    book = _Book(rng, table, config.multi_sheet, task_type)
    spec = _BUILDERS[task_type](rng, book)
    sheets = list(book.wb.sheetnames)
    input_bytes = workbook_bytes(book.wb)
    spec.solve(book.wb)  # the answer workbook is the input workbook, changed as asked
    prompt = spreadsheetbench_prompt(
        spec.instruction, spec.instruction_type, spec.position, spec.answer_sheet, spec.data_position
    )
    metadata = {
        "source": "generated", "type": task_type, "table": kind, "rows": config.rows, "sheets": sheets
    }
    return excel_task(f"gen-{index}", prompt, input_bytes, workbook_bytes(book.wb), spec.position, metadata)


@dataclass(frozen=True)
class GeneratedSheets(GeneratedSource):
    """``tasks="generated"``: ``difficulty`` is an :class:`ExcelTaskConfig` or a dict of its fields."""

    difficulty: ExcelTaskConfig = arg(None, config_of(ExcelTaskConfig))

    def make_task(self, rng, index: int) -> Task:
        return make_excel_task(rng, index, self.difficulty)


def generated_tasks(
    config: ExcelTaskConfig | None = None, *, seed: int = 0, size: int | None = None
) -> GeneratedTasks:
    """The generated task source: item ``i`` of ``seed`` is always the same task (and bytes)."""
    return GeneratedSheets(difficulty=config, num_tasks=size, task_seed=seed).build(None)


# -- small helpers ---------------------------------------------------------------------------


def _quote(sheet: str) -> str:
    return f"'{sheet}'"


def _unambiguous(value: Fraction) -> bool:
    """False when the value sits on (or within 1e-6 of) a tie at 2 decimals, e.g. 12.125."""
    scaled = value * 100
    return abs((scaled - math.floor(scaled)) - Fraction(1, 2)) > Fraction(1, 10**6)


def _number(value: Fraction | int) -> int | float:
    """An exact value as a cell value: an int when whole, else a float."""
    value = Fraction(value)
    return int(value) if value.denominator == 1 else float(value)


def _cents(value: float) -> int:
    return round(value * 100)


def _middle(values: Sequence[int]) -> int | None:
    """A threshold with values on both sides (``>= t`` is neither none nor all), if any."""
    distinct = sorted(set(values))
    if len(distinct) < 2:
        return None
    return distinct[len(distinct) // 2]


@dataclass
class _Spec:
    instruction: str
    instruction_type: str
    position: str
    solve: Callable[[Workbook], None]
    answer_sheet: str | None = None
    data_position: str | None = None


def _fill(
    ws, column: int, values: Sequence[Any], fmt: str | None = None, start_row: int = 2
) -> None:
    for i, value in enumerate(values):
        cell = ws.cell(row=start_row + i, column=column + 1, value=value)
        if fmt and isinstance(value, (int, float)):
            cell.number_format = fmt


def _on(t: _Table, book: _Book) -> str:
    return f"on sheet {_quote(t.sheet)}"


# -- aggregate -------------------------------------------------------------------------------


def _aggregate_candidates(
    rng: np.random.Generator, t: _Table
) -> list[tuple[str, str, Fraction, str | None]]:
    """(label, what to compute, exact value, number format) options for this table."""
    out = []
    if t.kind == "sales":
        rows = t.rows
        region = _pick(rng, sorted({r[2] for r in rows}, key=REGIONS.index))
        product = _pick(rng, sorted({r[4] for r in rows}))
        rep = _pick(rng, sorted({r[3] for r in rows}))
        money = t.formats[6]
        revenue = sum(r[5] * _cents(r[6]) for r in rows if r[2] == region)
        out.append((f"{region} revenue", f"the total revenue of the {region} region: "
                    "the sum of Units × Unit Price over its orders", Fraction(revenue, 100), money))
        out.append((f"{product} units", f"the total number of units of {product} sold (sum of Units)",
                    Fraction(sum(r[5] for r in rows if r[4] == product)), "0"))
        out.append((f"{region} orders", f"the number of orders from the {region} region",
                    Fraction(sum(r[2] == region for r in rows)), "0"))
        prices = [_cents(r[6]) for r in rows if r[4] == product]
        out.append((f"Avg {product} price", f"the average Unit Price of the {product} orders",
                    Fraction(sum(prices), 100 * len(prices)), money))
        threshold = _middle([r[5] for r in rows])
        if threshold is not None:
            out.append((f"Orders >= {threshold}", f"the number of orders with at least {threshold} Units",
                        Fraction(sum(r[5] >= threshold for r in rows)), "0"))
        out.append((f"{rep} units", f"the total Units sold by {rep}",
                    Fraction(sum(r[5] for r in rows if r[3] == rep)), "0"))
    elif t.kind == "inventory":
        rows = t.rows
        category = _pick(rng, sorted({r[2] for r in rows}))
        money = t.formats[5]
        out.append((f"{category} stock", f"the total Stock of the {category} category",
                    Fraction(sum(r[3] for r in rows if r[2] == category)), "0"))
        out.append(("Below reorder level", "the number of items whose Stock is below their Reorder Level",
                    Fraction(sum(r[3] < r[4] for r in rows)), "0"))
        value = sum(r[3] * _cents(r[5]) for r in rows if r[2] == category)
        out.append((f"{category} stock value", f"the total stock value of the {category} category: "
                    "the sum of Stock × Unit Cost over its items", Fraction(value, 100), money))
        costs = [_cents(r[5]) for r in rows if r[2] == category]
        out.append((f"Avg {category} cost", f"the average Unit Cost of the {category} items",
                    Fraction(sum(costs), 100 * len(costs)), money))
        out.append((f"{category} items", f"the number of items in the {category} category",
                    Fraction(sum(r[2] == category for r in rows)), "0"))
    else:
        rows = t.rows
        klass = _pick(rng, sorted({r[1] for r in rows}, key=CLASSES.index))
        test = _int(rng, 1, 3)
        scores = [r[1 + test] for r in rows if r[1] == klass]
        out.append((f"{klass} Test {test} avg", f"the average Test {test} score of class {klass}",
                    Fraction(sum(scores), len(scores)), "0.00"))
        threshold = _middle([r[1 + test] for r in rows])
        if threshold is not None:
            out.append((f"Test {test} >= {threshold}",
                        f"the number of students who scored at least {threshold} on Test {test}",
                        Fraction(sum(r[1 + test] >= threshold for r in rows)), "0"))
        out.append((f"{klass} best Test {test}", f"the highest Test {test} score in class {klass}",
                    Fraction(max(scores)), "0"))
        out.append((f"{klass} students", f"the number of students in class {klass}",
                    Fraction(len(scores)), "0"))
        out.append((f"Test {test} average", f"the average Test {test} score of all students",
                    Fraction(sum(r[1 + test] for r in rows), len(rows)), "0.00"))
    return out


def _aggregate(rng: np.random.Generator, book: _Book) -> _Spec:
    t = book.table
    options = _shuffled(rng, _aggregate_candidates(rng, t))
    label, what, value, fmt = next(
        (o for o in options if o[2] != 0 and _unambiguous(o[2])), options[0]
    )
    if value == 0 or not _unambiguous(value):  # pragma: no cover - every table has a count > 0
        raise RuntimeError(f"generator bug: no usable aggregate for {t.kind}")
    row = _int(rng, 2, 4)
    label_col, answer_col = t.m + 1, t.m + 2
    label_cell, cell = f"{_col(label_col)}{row}", f"{_col(answer_col)}{row}"
    _header(book.ws, label_cell, label, width=max(14, len(label) + 2))
    instruction = (
        f'Cell {label_cell} {_on(t, book)} is labelled "{label}". '
        f"In {cell}, next to it, calculate {what}. Use the table in {t.data_range}."
    )

    def solve(wb):
        c = wb[t.sheet][cell]
        c.value = _number(value)
        if fmt:
            c.number_format = fmt

    return _Spec(instruction, CELL_LEVEL, f"{_quote(t.sheet)}!{cell}", solve)


# -- fill_formula ----------------------------------------------------------------------------


def _fill_formula(rng: np.random.Generator, book: _Book) -> _Spec:
    t = book.table
    if t.kind == "sales":  # (header, what to fill with, values, number format)
        options = [
            ("Revenue", "the order's Units multiplied by its Unit Price",
             [Fraction(r[5] * _cents(r[6]), 100) for r in t.rows], t.formats[6]),
            ("Quarter", 'the quarter of the order\'s Date as text: "Q1" for January-March, "Q2" for '
             'April-June, "Q3" for July-September and "Q4" for October-December',
             [f"Q{(r[1].month - 1) // 3 + 1}" for r in t.rows], None),
        ]
    elif t.kind == "inventory":
        options = [
            ("Stock Value", "the item's Stock multiplied by its Unit Cost",
             [Fraction(r[3] * _cents(r[5]), 100) for r in t.rows], t.formats[5]),
            ("Gap", "the item's Stock minus its Reorder Level (negative when the stock is below it)",
             [Fraction(r[3] - r[4]) for r in t.rows], "0"),
        ]
    else:
        options = [
            ("Total", "the sum of the student's Test 1, Test 2 and Test 3 scores",
             [Fraction(sum(r[2:5])) for r in t.rows], "0"),
            ("Average", "the average of the student's three test scores (Test 1, Test 2 and Test 3)",
             [Fraction(sum(r[2:5]), 3) for r in t.rows], "0.00"),
            ("Best", "the student's highest score of the three tests",
             [Fraction(max(r[2:5])) for r in t.rows], "0"),
        ]
    header, what, values, fmt = _pick(rng, options)
    values = [_number(v) if isinstance(v, Fraction) else v for v in values]
    col = _col(t.m)
    _header(book.ws, f"{col}1", header, width=12)
    span = f"{col}2:{col}{t.n + 1}"
    instruction = (
        f'Column {col} {_on(t, book)} has the header "{header}". For every {t.noun} in the table '
        f"(rows 2 to {t.n + 1}), fill {span} with {what}."
    )

    def solve(wb):
        _fill(wb[t.sheet], t.m, values, fmt)

    return _Spec(instruction, CELL_LEVEL, f"{_quote(t.sheet)}!{span}", solve)


# -- lookup ----------------------------------------------------------------------------------


def _missing_key(rng: np.random.Generator, t: _Table) -> str:
    present = set(t.values(t.headers[t.key]))
    for _ in range(100):
        if t.kind == "sales":
            key = f"SO-{_int(rng, 10000, 99999)}"
        elif t.kind == "inventory":
            prefix = CATEGORIES[_pick(rng, sorted({r[2] for r in t.rows}))][0]
            key = f"{prefix}-{_int(rng, 10000, 99999)}"
        else:
            ((first, last),) = _people(rng, 1)
            key = f"{last}, {first}"
        if key not in present:
            return key
    raise RuntimeError("generator bug: no missing key found")  # pragma: no cover


def _lookup(rng: np.random.Generator, book: _Book) -> _Spec:
    t = book.table
    fields = {
        "sales": ("Rep", "Product", "Units", "Unit Price", "Region"),
        "inventory": ("Item", "Category", "Stock", "Unit Cost"),
        "grades": ("Class", "Test 1", "Test 2", "Test 3"),
    }[t.kind]
    field_name = _pick(rng, fields)
    c = t.column(field_name)
    key_header = t.headers[t.key]
    k = min(_int(rng, 3, 6), t.n - 1)
    picked = [t.rows[i] for i in sorted(_sample(rng, range(t.n), k))]
    keys = [r[t.key] for r in picked]
    values = [r[c] for r in picked]
    if rng.random() < 0.4:
        at = _int(rng, 0, k)
        keys.insert(at, _missing_key(rng, t))
        values.insert(at, "Not found")
    order = rng.permutation(len(keys))
    keys = [keys[int(i)] for i in order]
    values = [values[int(i)] for i in order]
    fmt = t.formats[c]
    if book.multi_sheet:
        name = _pick(rng, ("Lookup", "Requests", "Query"))
        ws = book.wb.create_sheet(name, index=_int(rng, 0, len(book.wb.sheetnames)))
        sheet, key_col, value_col = name, 0, 1
        ws.column_dimensions["A"].width = 16
        ws.column_dimensions["B"].width = 14
        where = f"on sheet {_quote(name)}"
        source = f"the table on sheet {_quote(t.sheet)} ({t.data_range})"
    else:
        ws = book.ws
        sheet, key_col, value_col = t.sheet, t.m + 1, t.m + 2
        where = f"on sheet {_quote(t.sheet)}"
        source = f"the table in {t.data_range}"
    kc, vc = _col(key_col), _col(value_col)
    _header(ws, f"{kc}1", key_header, width=16)
    _header(ws, f"{vc}1", field_name, width=14)
    for i, key in enumerate(keys):
        ws.cell(row=2 + i, column=key_col + 1, value=key)
    last = 1 + len(keys)
    instruction = (
        f"The cells {kc}2:{kc}{last} {where} list {key_header} values. In {vc}2:{vc}{last} "
        f'(header "{field_name}"), write the {field_name} of each one, looked up from {source}. '
        f'If a {key_header} does not appear in the table, write "Not found".'
    )

    def solve(wb):
        _fill(wb[sheet], value_col, values, fmt)

    return _Spec(instruction, CELL_LEVEL, f"{_quote(sheet)}!{vc}2:{vc}{last}", solve)


# -- sort ------------------------------------------------------------------------------------

_ASC = {"text": "A to Z", "number": "smallest to largest", "date": "oldest to newest"}
_DESC = {"text": "Z to A", "number": "largest to smallest", "date": "newest to oldest"}


def _sort_key(value: Any) -> Any:
    return (
        value.casefold() if isinstance(value, str) else value
    )  # Excel sorts text case-insensitively


def _sort(rng: np.random.Generator, book: _Book) -> _Spec:
    t = book.table
    columns = {
        "sales": ("Units", "Unit Price", "Region", "Rep", "Product", "Date"),
        "inventory": ("Stock", "Unit Cost", "Reorder Level", "Category", "Item", "SKU"),
        "grades": ("Test 1", "Test 2", "Test 3", "Class", "Student"),
    }[t.kind]
    name = _pick(rng, columns)
    c = t.column(name)
    kind = (
        "date"
        if isinstance(t.rows[0][c], dt.datetime)
        else "text"
        if isinstance(t.rows[0][c], str)
        else "number"
    )
    descending = bool(rng.random() < 0.5)
    key_name = t.headers[t.key]

    def ordered(desc: bool) -> list[list[Any]]:
        by_key = sorted(t.rows, key=lambda r: _sort_key(r[t.key]))
        return sorted(
            by_key, key=lambda r: _sort_key(r[c]), reverse=desc
        )  # stable: ties keep key order

    rows = ordered(descending)
    if rows == t.rows:  # already in that order: sorting would change nothing
        descending = not descending
        rows = ordered(descending)
    direction = (_DESC if descending else _ASC)[kind]
    tie = "" if c == t.key else f"; rows with the same {name} are ordered by {key_name} (A to Z)"
    instruction = (
        f"Sort the table {_on(t, book)} ({t.data_range}, header in row 1) by {name} "
        f"from {direction}{tie}. Keep the header in row 1, move whole rows, and write the "
        "sorted table back in place."
    )

    def solve(wb):
        ws = wb[t.sheet]
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                ws.cell(row=2 + i, column=1 + j, value=value)

    return _Spec(
        instruction,
        SHEET_LEVEL,
        f"{_quote(t.sheet)}!{t.data_range}",
        solve,
        answer_sheet=t.sheet,
        data_position=t.data_range,
    )


# -- filter ----------------------------------------------------------------------------------


def _filter_candidates(
    rng: np.random.Generator, t: _Table
) -> list[tuple[str, str, Callable[[list], bool]]]:
    """(new sheet name, condition text, predicate) options."""
    rows, out = t.rows, []
    if t.kind == "sales":
        region = _pick(rng, sorted({r[2] for r in rows}, key=REGIONS.index))
        product = _pick(rng, sorted({r[4] for r in rows}))
        month = _pick(rng, sorted({r[1].month for r in rows}))
        out.append((f"{region} Orders", f"the Region is {region}", lambda r, v=region: r[2] == v))
        out.append((f"{product}", f"the Product is {product}", lambda r, v=product: r[4] == v))
        out.append(
            (
                f"{MONTHS[month - 1]} Orders",
                f"the Date is in {MONTHS[month - 1]} 2024",
                lambda r, v=month: r[1].month == v,
            )
        )
        threshold = _middle([r[5] for r in rows])
        if threshold is not None:
            out.append(
                ("Large Orders", f"Units is at least {threshold}", lambda r, v=threshold: r[5] >= v)
            )
    elif t.kind == "inventory":
        category = _pick(rng, sorted({r[2] for r in rows}))
        out.append((f"{category}", f"the Category is {category}", lambda r, v=category: r[2] == v))
        out.append(("To Reorder", "the Stock is below the Reorder Level", lambda r: r[3] < r[4]))
        threshold = _middle([_cents(r[5]) for r in rows])
        if threshold is not None:
            out.append(
                (
                    "Expensive Items",
                    f"the Unit Cost is at least {_money(threshold):.2f}",
                    lambda r, v=threshold: _cents(r[5]) >= v,
                )
            )
    else:
        klass = _pick(rng, sorted({r[1] for r in rows}, key=CLASSES.index))
        test = _int(rng, 1, 3)
        out.append((f"Class {klass}", f"the Class is {klass}", lambda r, v=klass: r[1] == v))
        threshold = _middle([r[1 + test] for r in rows])
        if threshold is not None:
            out.append(
                (
                    f"Test {test} Below {threshold}",
                    f"the Test {test} score is below {threshold}",
                    lambda r, v=threshold, k=test: r[1 + k] < v,
                )
            )
        low = _middle([min(r[2:5]) for r in rows])
        if low is not None:
            out.append(
                (
                    "All Tests Passed",
                    f"all three test scores are at least {low}",
                    lambda r, v=low: min(r[2:5]) >= v,
                )
            )
    return out


def _filter(rng: np.random.Generator, book: _Book) -> _Spec:
    t = book.table
    options = _shuffled(rng, _filter_candidates(rng, t))
    for new, condition, keep in options:  # noqa: B007 - the match is used below
        matched = [r for r in t.rows if keep(r)]
        if 0 < len(matched) < t.n and new not in book.wb.sheetnames:
            break
    else:  # pragma: no cover - a numeric threshold always splits a table of 5+ rows
        raise RuntimeError(f"generator bug: no usable filter for {t.kind}")
    span = f"A1:{t.last_col}{len(matched) + 1}"
    instruction = (
        f"Copy every row of the table {_on(t, book)} ({t.data_range}) where {condition} "
        f'to a new sheet named "{new}". On that sheet, put the header row in row 1 starting '
        f"at A1 and the matching rows below it in their original order, with all {t.m} "
        "columns. Leave the original table unchanged."
    )

    def solve(wb):
        ws = wb.create_sheet(new)
        _write_rows(ws, t.headers, matched, t.formats)

    return _Spec(
        instruction,
        SHEET_LEVEL,
        f"{_quote(new)}!{span}",
        solve,
        answer_sheet=new,
        data_position=f"{_quote(t.sheet)}!{t.data_range}",
    )


# -- split -----------------------------------------------------------------------------------


def _split(rng: np.random.Generator, book: _Book) -> _Spec:
    t = book.table
    if t.kind == "sales":
        source, example = (
            "Rep",
            'first name and last name separated by a space, like "Ada Lovelace"',
        )
        headers = ("First Name", "Last Name")
        parts = [tuple(r[3].split(" ", 1)) for r in t.rows]
        what = "the first name in {a} and the last name in {b}"
    elif t.kind == "inventory":
        source, example = "SKU", 'a letter prefix, a hyphen and a number, like "AB-12345"'
        headers = ("Prefix", "Number")
        parts = [(r[0].split("-")[0], int(r[0].split("-")[1])) for r in t.rows]
        what = (
            'the letter prefix in {a} (as text, e.g. "AB") and the number in {b} '
            "(as a number, e.g. 12345)"
        )
    else:
        source, example = "Student", '"Last, First", like "Lovelace, Ada"'
        headers = ("First Name", "Last Name")
        parts = [tuple(reversed(r[0].split(", ", 1))) for r in t.rows]
        what = "the first name in {a} and the last name in {b}"
    a, b = _col(t.m), _col(t.m + 1)
    _header(book.ws, f"{a}1", headers[0], width=13)
    _header(book.ws, f"{b}1", headers[1], width=13)
    span = f"{a}2:{b}{t.n + 1}"
    instruction = (
        f"The {source} column {_on(t, book)} holds {example}. Split it into two columns: "
        f"for every row (rows 2 to {t.n + 1}), write {what.format(a=a, b=b)}. "
        f'The headers "{headers[0]}" ({a}1) and '
        f'"{headers[1]}" ({b}1) are already there.'
    )

    def solve(wb):
        ws = wb[t.sheet]
        for i, (x, y) in enumerate(parts):
            ws.cell(row=2 + i, column=t.m + 1, value=x)
            ws.cell(row=2 + i, column=t.m + 2, value=y)

    return _Spec(instruction, CELL_LEVEL, f"{_quote(t.sheet)}!{span}", solve)


# -- conditional -----------------------------------------------------------------------------


def _conditional(rng: np.random.Generator, book: _Book) -> _Spec:
    t = book.table
    options: list[tuple[str, str, list[str]]] = []
    if t.kind == "sales":
        threshold = _middle([r[5] for r in t.rows])
        if threshold is not None:
            options.append(
                (
                    "Size",
                    f'"Large" when Units is at least {threshold}, otherwise "Small"',
                    ["Large" if r[5] >= threshold else "Small" for r in t.rows],
                )
            )
        revenues = [r[5] * _cents(r[6]) for r in t.rows]
        limit = _middle([100_00 * (v // 100_00) for v in revenues])
        if limit is not None:
            options.append(
                (
                    "Priority",
                    f'"High" when Units × Unit Price is at least {limit // 100}, '
                    'otherwise "Normal"',
                    ["High" if v >= limit else "Normal" for v in revenues],
                )
            )
    elif t.kind == "inventory":
        options.append(
            (
                "Status",
                '"Reorder" when Stock is below the Reorder Level, otherwise "OK"',
                ["Reorder" if r[3] < r[4] else "OK" for r in t.rows],
            )
        )
        options.append(
            (
                "Stock Check",
                '"Out of stock" when Stock is 0, "Low" when Stock is above 0 but '
                'below the Reorder Level, otherwise "OK"',
                ["Out of stock" if r[3] == 0 else "Low" if r[3] < r[4] else "OK" for r in t.rows],
            )
        )
    else:
        pass_mark = _pick(rng, (50, 60, 65))
        options.append(
            (
                "Result",
                f'"Pass" when the average of the three tests is at least {pass_mark}, '
                'otherwise "Fail"',
                ["Pass" if sum(r[2:5]) >= 3 * pass_mark else "Fail" for r in t.rows],
            )
        )
        test = _int(rng, 1, 3)
        options.append(
            (
                f"Test {test} Grade",
                f'the letter grade of Test {test}: "A" for 90 or more, "B" for '
                '80-89, "C" for 70-79, "D" for 60-69 and "F" below 60',
                [
                    "A"
                    if s >= 90
                    else "B"
                    if s >= 80
                    else "C"
                    if s >= 70
                    else "D"
                    if s >= 60
                    else "F"
                    for s in (r[1 + test] for r in t.rows)
                ],
            )
        )
    if not options:  # pragma: no cover - a constant Units column and constant revenue
        options.append(
            ("Size", '"Large" when Units is at least 1, otherwise "Small"', ["Large"] * t.n)
        )
    header, rule, values = _pick(rng, options)
    col = _col(t.m)
    _header(book.ws, f"{col}1", header, width=max(12, len(header) + 2))
    span = f"{col}2:{col}{t.n + 1}"
    instruction = (
        f'Column {col} {_on(t, book)} has the header "{header}". '
        f"For every {t.noun} (rows 2 to {t.n + 1}), "
        f"fill {span} with {rule}."
    )

    def solve(wb):
        _fill(wb[t.sheet], t.m, values)

    return _Spec(instruction, CELL_LEVEL, f"{_quote(t.sheet)}!{span}", solve)


_BUILDERS: dict[str, Callable[[np.random.Generator, _Book], _Spec]] = {
    "aggregate": _aggregate,
    "fill_formula": _fill_formula,
    "lookup": _lookup,
    "sort": _sort,
    "filter": _filter,
    "split": _split,
    "conditional": _conditional,
}
