"""Grading for ``benchmax/Excel-v0``: SpreadsheetBench's cell-by-cell comparison, made robust.

The workbook the model leaves behind is compared with the task's answer workbook at the task's
``answer_position`` cells, with SpreadsheetBench's value rules (see :func:`normalize`). Three
things the upstream scorer leaves to the caller are handled here:

* ``answer_position`` strings in the real data are messy (stray and unbalanced quotes, ``!``
  inside the quotes, comma-separated lists); :func:`parse_answer_position` tolerates them.
* openpyxl does not compute formulas, and a model may answer with formulas: formula cells in
  the answer positions are recalculated (:func:`.recalc.recalculate`), but only when there are some, so
  the common all-values case costs one fast read of each workbook.
* a model may corrupt or delete its workbook: :func:`grade` then scores 0 with a note and
  never raises (configuration mistakes, such as a bad ``recalc``, still raise).
* a model may write the workbook's XML itself, cached values included: the output's formula
  cells are graded by the values computed here. One that cannot be computed matches nothing (a
  note names the functions ``formulas`` lacks), unless the answer workbook holds the same formula
  and cached value in that cell; the answer workbook's cached values are trusted (it is the task's).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import numbers
import re
import sys
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from openpyxl.utils import get_column_letter, range_boundaries
from openpyxl.utils.datetime import to_excel

from benchmax_gym.envs.excel.recalc import (
    GRADE_TIMEOUT_S,
    CellKey,
    Workbook,
    _bounding_ranges,
    _check_recalc,
    _compute,
    _formula_formats,
    _is_formula,
    _iter_range,
    _open,
    RecalcUnavailable,
    Unverified,
    _formulas_and_cached,
    _read_bytes,
    check_workbook,
    run_in_process,
)

__all__ = ["GradeResult", "grade", "normalize", "parse_answer_position"]

MAX_MISMATCHES = 5
"""Mismatches kept in a :class:`GradeResult`: enough to debug a grade, small enough to log."""

_MISSING_SHEET = object()  # an answer cell whose sheet is not in the output workbook


# --------------------------------------------------------------------------- answer positions

_QUOTES = "'\"\u2018\u2019\u201c\u201d`"
_CELL = r"\$?[A-Za-z]{1,3}\$?[0-9]+"
_RANGE_RE = re.compile(rf"\s*({_CELL})\s*(?::\s*({_CELL}))?\s*")
_ENDS_WITH_CELL_RE = re.compile(rf"{_CELL}[\s{_QUOTES}]*$")


def _loose(name: str) -> str:
    """A sheet name without the noise seen in positions: case, outer spaces, quotes, ``!``."""
    return unicodedata.normalize("NFC", name).strip().strip(_QUOTES + "! \t").strip().casefold()


def _find_sheet(name: str, sheet_names: list[str]) -> str | None:
    """The real sheet name ``name`` refers to: an exact match first, then a loose one."""
    if name in sheet_names:
        return name
    for candidate in (name, name.replace("''", "'")):  # Excel escapes ' as '' inside quotes
        key = _loose(candidate)
        matches = [s for s in sheet_names if _loose(s) == key]
        if len(matches) == 1:
            return matches[0]
    return None


def _split_parts(position: str) -> list[str]:
    """Split a comma-separated position, re-joining pieces of sheet names that contain commas."""
    parts: list[str] = []
    pending = ""
    for piece in position.split(","):
        pending = f"{pending},{piece}" if pending else piece
        if _ENDS_WITH_CELL_RE.search(pending):
            parts.append(pending)
            pending = ""
    if pending.strip():
        parts.append(pending)  # no cell at the end: reported as an invalid range below
    return parts


def parse_answer_position(position: str, sheet_names: list[str]) -> list[tuple[str, str]]:
    """``[(sheet_name, "A1:B3"), ...]`` for a SpreadsheetBench ``answer_position``.

    Accepts ``C2``, ``G2:G23``, ``'Sheet2'!Z2``, ``Updated Data'!B5:B9`` (unbalanced quote),
    ``'Sheet1!'A2:B19,'Sheet2!'A2:B19`` (``!`` inside the quotes), ``$A$1``, lower case, and
    spaces. Sheet names are matched against ``sheet_names`` (the workbook's real names, in
    order) exactly, else ignoring case, surrounding spaces and stray quotes or ``!``; no sheet
    means the first sheet. Ranges always come back as ``"TOPLEFT:BOTTOMRIGHT"``, upper case and
    without ``$``, so a single cell ``Z2`` becomes ``"Z2:Z2"`` and callers need only one form.

    Raises:
        ValueError: an empty position, a part that is not a bounded cell or range (``A:A`` is
            not supported), or a sheet that is not in ``sheet_names`` (the message names it and
            the available sheets).
    """
    if not sheet_names:
        raise ValueError("the workbook has no sheets")
    if not position or not position.strip():
        raise ValueError("empty answer position")
    ranges = []
    for part in _split_parts(position):
        sheet_part, _, ref = part.strip().rpartition("!")
        ref = ref.strip().strip(_QUOTES).replace("$", "")
        match = _RANGE_RE.fullmatch(ref)
        if not match:
            raise ValueError(f"invalid cell range {ref!r} in answer position {position!r}")
        first, last = match.group(1), match.group(2) or match.group(1)
        min_col, min_row, max_col, max_row = range_boundaries(f"{first}:{last}".upper())
        min_col, max_col = sorted((min_col, max_col))
        min_row, max_row = sorted((min_row, max_row))
        rng = f"{get_column_letter(min_col)}{min_row}:{get_column_letter(max_col)}{max_row}"

        sheet_name = sheet_part.strip().strip(_QUOTES + "!").strip()
        if not sheet_name:
            ranges.append((sheet_names[0], rng))
            continue
        real = _find_sheet(sheet_name, sheet_names)
        if real is None:
            raise ValueError(
                f"sheet {sheet_name!r} from answer position {position!r} is not in the "
                f"workbook; available sheets: {list(sheet_names)}"
            )
        ranges.append((real, rng))
    return ranges


def _cells(rng: str) -> list[str]:
    """Every coordinate of ``"A1:B3"``, row by row."""
    min_col, min_row, max_col, max_row = range_boundaries(rng)
    letters = [get_column_letter(c) for c in range(min_col, max_col + 1)]
    return [f"{col}{row}" for row in range(min_row, max_row + 1) for col in letters]


# --------------------------------------------------------------------------- normalization


def normalize(value: Any) -> Any:
    """A cell value in the form SpreadsheetBench compares (two values match iff these are ``==``
    and of the same type).

    * numbers and numeric strings (``"3.50"``, ``" 1e3"``: anything ``float()`` accepts that is
      finite) -> ``float`` rounded to 2 decimals, so ``1.004 == 1.0`` and ``"3.50" == 3.5``;
    * ``bool`` stays ``bool``: upstream's ``isinstance(v, (int, float))`` turns ``True`` into
      ``1.0``, an accident of ``bool`` being an ``int`` that we do not copy (``TRUE != 1``);
    * ``datetime``/``date`` -> Excel serial day as a float rounded to whole days (upstream's
      ``round(serial, 0)``: the time of day does not count);
    * ``time`` -> ``"HH:MM"`` (seconds ignored, as upstream's ``str(t)[:-3]``);
    * ``timedelta`` (``[h]:mm`` cells; not handled upstream) -> ``"HH:MM"`` total hours, by the
      same reasoning as times, so a duration under a day equals the time of day Excel stores
      as the same number;
    * ``None`` -> ``""`` (an empty cell equals an empty string);
    * other strings are compared exactly, not stripped and case-sensitive, as upstream does;
      ``"nan"``/``"inf"`` stay strings (upstream would make a NaN that never equals itself).
    """
    if value is None:
        return ""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()  # numpy scalars from recalculation: plain Python first
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real):
        number = float(value)
        return round(number, 2) if math.isfinite(number) else number
    if isinstance(value, dt.datetime | dt.date):
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            value = value.replace(tzinfo=None)
        return float(round(to_excel(value), 0))
    if isinstance(value, dt.time):
        return value.strftime("%H:%M")
    if isinstance(value, dt.timedelta):
        minutes = math.floor(value.total_seconds() / 60)
        return f"{minutes // 60:02d}:{minutes % 60:02d}"
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return round(number, 2) if math.isfinite(number) else value
    return value


# --------------------------------------------------------------------------- grading


@dataclass(frozen=True)
class GradeResult:
    """One graded workbook.

    Attributes:
        cells: fraction of answer cells that match, in [0, 1] (a partial-credit signal).
        solved: every answer cell matches (SpreadsheetBench's pass/fail for one test case).
        total: number of answer cells; ``correct`` of them match.
        mismatches: up to :data:`MAX_MISMATCHES` ``(sheet, cell, expected, got)`` with both
            values normalized; ``got`` is None when the sheet is missing. For debugging and
            logs only: the environment does not show them to the model.
        notes: what happened out of the ordinary (recalculation fallbacks, missing sheets,
            an unreadable output workbook).
    """

    cells: float
    solved: bool
    total: int
    correct: int
    mismatches: list[tuple[str, str, Any, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# (ranges, ((sheet, cell, normalized expected value), ...), notes)
_ExpectedCells = tuple[
    tuple[tuple[str, str], ...], tuple[tuple[str, str, Any], ...], tuple[str, ...]
]
_expected_cache: OrderedDict[tuple[bytes, str, str], _ExpectedCells] = OrderedDict()
_expected_lock = threading.Lock()
_EXPECTED_CACHE_SIZE = 256


def _expected_cells(data: bytes, position: str, method: str) -> _ExpectedCells:
    """``(ranges, ((sheet, cell, normalized expected), ...), notes)`` for an answer workbook.

    The answer is read with the values Excel cached (``data_only``); answer cells that are
    formulas without a cached value are recalculated. Answers repeat across episodes, so the
    result is cached by content hash.
    """
    key = (hashlib.sha256(data).digest(), position, method)
    with _expected_lock:
        if key in _expected_cache:
            _expected_cache.move_to_end(key)
            return _expected_cache[key]

    wb = _open(data, data_only=True)
    try:
        ranges = parse_answer_position(position, wb.sheetnames)
        values: dict[CellKey, Any] = {}
        for sheet, rng in ranges:
            for coordinate, cell in _iter_range(wb[sheet], rng):
                values[sheet, coordinate] = None if cell is None else cell.value
    finally:
        wb.close()

    notes: list[str] = []
    empty = {k for k, v in values.items() if v is None}
    if empty and method != "none":
        formulas_wb = _open(data, data_only=False)
        try:
            formats = _formula_formats(formulas_wb, _bounding_ranges(empty).items(), empty)
            epoch = formulas_wb.epoch
        finally:
            formulas_wb.close()
        if formats:
            computed, notes = _compute(data, method, formats, epoch, trust_empty_cache=True)
            values.update({k: computed.get(k) for k in formats})
            notes = [f"answer workbook: {note}" for note in notes]

    expected = tuple(
        (sheet, coordinate, normalize(values[sheet, coordinate]))
        for sheet, rng in ranges
        for coordinate in _cells(rng)
    )
    result = (tuple(ranges), expected, tuple(notes))
    with _expected_lock:
        _expected_cache[key] = result
        while len(_expected_cache) > _EXPECTED_CACHE_SIZE:
            _expected_cache.popitem(last=False)
    return result


def _output_cells(
    data: bytes, ranges: Iterable[tuple[str, str]]
) -> tuple[dict[CellKey, Any], dict[CellKey, str], dict[str, str], list[tuple[str, str]], dt.datetime]:
    """The output's cells at ``ranges``: plain values keyed by the answer's sheet names, formula
    cells' number formats keyed by the output's, the output's sheet names -> the answer's, the
    ranges whose sheet is missing, and the epoch. Plain data: it may come from a call's process.
    The output is checked first (:func:`check_workbook`: the model's file), within that process's
    deadline: its scan of a file that expands to 64 MB takes seconds."""
    check_workbook(data)
    values: dict[CellKey, Any] = {}
    formats: dict[CellKey, str] = {}
    renamed: dict[str, str] = {}
    missing: list[tuple[str, str]] = []
    wb = _open(data, data_only=False)
    try:
        for sheet, rng in ranges:
            real = _find_sheet(sheet, wb.sheetnames)
            if real is None:
                missing.append((sheet, rng))
                continue
            renamed[real] = sheet
            for coordinate, cell in _iter_range(wb[real], rng):
                if _is_formula(cell):
                    formats[real, coordinate] = cell.number_format
                else:
                    values[sheet, coordinate] = None if cell is None else cell.value
        return values, formats, renamed, missing, wb.epoch
    finally:
        wb.close()


def _output_values(
    data: bytes, ranges: Iterable[tuple[str, str]], method: str, time_limit: float | None = GRADE_TIMEOUT_S
) -> tuple[dict[CellKey, Any], list[str]]:
    """Output values keyed by the answer's sheet names; ``_MISSING_SHEET`` for absent sheets.

    With a ``time_limit`` the workbook is read, and its formulas computed (with the values cached
    in it where they cannot be), in a process killed at the deadline and bounded in memory
    (:func:`.recalc.run_in_process`): within :func:`check_workbook`'s limits a file can still
    take a parse 30 s and 2 GB (a million fonts, names or shared strings), and so can reading its
    cached values again. LibreOffice (bounded by its own timeout) runs here; the copy it gets, its
    output and the fallback to the cached values are made and read in processes of their own
    (:func:`.recalc._compute`)."""
    ranges = list(ranges)
    if time_limit is None:
        values, notes, missing = _read_output(data, ranges, method, None)
    elif method != "libreoffice" and sys.platform == "linux":
        values, notes, missing = run_in_process(
            _read_output, (data, ranges, method, time_limit, True), time_limit, "reading the workbook",
            memory="reading the workbook and computing its formulas need more than {} MB of memory",
        )
    else:
        cells = run_in_process(_output_cells, (data, ranges), time_limit, "reading the workbook")
        values, notes, missing = _read_output(data, ranges, method, time_limit, cells=cells)
    for sheet, rng in missing:
        values.update({(sheet, c): _MISSING_SHEET for c in _cells(rng)})
    return values, [f"sheet {sheet!r} is missing from the output workbook" for sheet, _ in missing] + notes


def _read_output(
    data: bytes, ranges: list[tuple[str, str]], method: str, time_limit: float | None, in_call: bool = False,
    cells: tuple | None = None,
) -> tuple[dict[CellKey, Any], list[str], list[tuple[str, str]]]:
    """The output's values at ``ranges`` (its formulas computed), notes, and the ranges whose sheet
    is missing; from ``cells`` when read already (:func:`_output_cells`); ``in_call``: in a call's
    process (plain data)."""
    values, formats, renamed, missing, epoch = cells or _output_cells(data, ranges)
    notes: list[str] = []
    if formats:
        # the model's workbook: a formula the grader cannot compute has no value (never the one cached in
        # the file, which the model can write itself) and matches nothing
        computed, notes = _compute(data, method, formats, epoch, time_limit=time_limit, in_call=in_call,
                                   trust_cache=False)
        for (real, coordinate) in formats:
            values[renamed[real], coordinate] = computed.get((real, coordinate))
    return values, notes, missing


def _answers_own(got: dict[CellKey, Any], answer: bytes, notes: list[str] | None = None) -> None:
    """Where the output's formula could not be computed (:class:`.recalc.Unverified`) but is the
    formula the answer workbook holds in that cell, with the same value cached, that value is the
    cell's: Excel computed it for the task (the answer graded against itself, a formula of the
    task's input the model left alone). Anywhere else the model's cached value stays untaken."""
    pending = {key: value for key, value in got.items() if isinstance(value, Unverified)}
    if not pending:
        return
    ours = _formulas_and_cached(answer, set(pending))  # the task's own file: read here
    taken = 0
    for key, value in pending.items():
        formula, cached = ours.get(key, ("", None))
        if formula and formula == value.formula and normalize(cached) == normalize(value.cached):
            got[key] = value.cached
            taken += 1
    if taken and notes is not None:
        notes.append(f"{taken} formula cell(s) not recalculated hold the answer workbook's own formula and "
                     "cached value: graded by that value")


def expected_values(answer: Workbook, position: str, recalc: str = "auto") -> list[tuple[str, str, Any]]:
    """``(sheet, cell, normalized value)`` for every answer cell: exactly what :func:`grade` expects."""
    _, expected, _ = _expected_cells(_read_bytes(answer), position, _check_recalc(recalc))
    return list(expected)


def grade(output: Workbook, answer: Workbook, position: str, recalc: str = "auto",
          time_limit: float | None = GRADE_TIMEOUT_S) -> GradeResult:
    """Grade the ``output`` workbook against ``answer`` at ``position``, SpreadsheetBench-style.

    ``output`` and ``answer`` are xlsx paths or bytes; ``output`` may also be a function that
    returns the bytes (an environment reading a hostile workspace: its errors grade 0 with a
    note), and is refused over the limits of :func:`check_workbook`. Every cell of ``position`` (see
    :func:`parse_answer_position`; sheet names come from the answer workbook) must match after
    :func:`normalize`. Formula cells are recalculated with ``recalc`` (see :data:`.recalc.RECALC_MODES`)
    only when the answer positions hold any, within ``time_limit`` seconds. A sheet missing from
    the output makes its cells wrong; an output that is missing, over the limits, not an xlsx
    workbook or slower to recalculate than ``time_limit`` grades 0 with a note.

    Raises:
        ValueError: a bad ``recalc``, or a ``position`` that does not fit the answer workbook.
        RuntimeError: ``recalc="libreoffice"`` without LibreOffice installed.
        OSError, zipfile.BadZipFile, ...: the answer workbook itself cannot be read (a task bug).
    """
    method = _check_recalc(recalc)
    answer_data = _read_bytes(answer)
    ranges, expected, answer_notes = _expected_cells(answer_data, position, method)
    notes = list(answer_notes)
    total = len(expected)
    try:
        data = _read_bytes(output)
        got, output_notes = _output_values(data, ranges, method, time_limit)
    except RecalcUnavailable:
        raise  # the machinery's failure, not the workbook's: no grade (the env fails the episode)
    except Exception as exc:  # the model's workbook: deleted, truncated, not a zip, ...
        notes.append(f"output workbook could not be read ({type(exc).__name__}: {str(exc)[:200]})")
        return GradeResult(cells=0.0, solved=False, total=total, correct=0, notes=notes)
    notes.extend(output_notes)
    _answers_own(got, answer_data, notes)

    correct = 0
    mismatches: list[tuple[str, str, Any, Any]] = []
    for sheet, coordinate, want in expected:
        value = got.get((sheet, coordinate))
        have = None if value is _MISSING_SHEET else normalize(value)
        if value is not _MISSING_SHEET and type(have) is type(want) and have == want:
            correct += 1
        elif len(mismatches) < MAX_MISMATCHES:
            mismatches.append((sheet, coordinate, want, have))
    return GradeResult(
        cells=correct / total if total else 0.0,
        solved=total > 0 and correct == total,
        total=total,
        correct=correct,
        mismatches=mismatches,
        notes=notes,
    )


def correct_cells(output: Workbook, answer: Workbook, position: str, recalc: str = "auto",
                  time_limit: float | None = GRADE_TIMEOUT_S) -> tuple[set[tuple[str, str]], int]:
    """The answer cells ``output`` already holds right, ``(sheet, cell)``, and how many there are:
    :func:`grade`'s comparison, cell by cell (Excel's dense signal). An unreadable output holds none."""
    method = _check_recalc(recalc)
    answer_data = _read_bytes(answer)
    ranges, expected, _ = _expected_cells(answer_data, position, method)
    try:
        data = _read_bytes(output)
        got, _ = _output_values(data, ranges, method, time_limit)
    except Exception:  # noqa: BLE001 - the model's workbook: deleted, truncated, not a zip
        return set(), len(expected)
    _answers_own(got, answer_data)
    right = set()
    for sheet, coordinate, want in expected:
        value = got.get((sheet, coordinate))
        have = None if value is _MISSING_SHEET else normalize(value)
        if value is not _MISSING_SHEET and type(have) is type(want) and have == want:
            right.add((sheet, coordinate))
    return right, len(expected)
