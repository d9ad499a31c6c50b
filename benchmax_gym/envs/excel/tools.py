"""The Excel family's tools, acting on the episode's copy of the workbook (``workbook.xlsx``).

``list_sheets``, ``read_range`` and ``write_cells`` work on the host with openpyxl; ``run_python``
runs model code in the episode's sandbox on the same file. The loaded workbook is cached and
reloaded only when the file changed on disk (after ``run_python``), so reads cost microseconds
and a write costs one save.

Bad input - an impossible range, a missing sheet, a merged cell, a huge read, characters Excel
cannot store - is a clear tool error and leaves the workbook as it was.
"""

from __future__ import annotations

import datetime as dt
import io
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openpyxl
from openpyxl.cell.cell import MergedCell
from openpyxl.utils import get_column_letter, range_boundaries
from openpyxl.utils.exceptions import IllegalCharacterError
from openpyxl.worksheet.formula import ArrayFormula, DataTableFormula

from benchmax_gym.core.files import WorkspaceFileError, read_workspace_file, unchanged, workspace_file_version, write_workspace_file
from benchmax_gym.core.tools import ToolError, tool
from benchmax_gym.envs.excel.recalc import (
    MAX_WORKBOOK_BYTES,
    MemoryLimitExceeded,
    TimeLimitExceeded,
    WorkbookTooLarge,
    as_excel_stores,
    external_reference,
    open_within,
    recalculate,
)

WORKBOOK = "workbook.xlsx"
MAX_ROW, MAX_COL = 1_048_576, 16_384  # Excel's own limits
MAX_READ_CELLS = 2_000
MAX_WRITE_CELLS = 5_000
MAX_TEXT = 32_767  # the most characters an Excel cell holds
ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?$")
TIME = re.compile(r"^(\d{1,5}):([0-5]\d)(?::([0-5]\d)(?:\.(\d{1,6}))?)?$")
"""``H:MM[:SS[.ffffff]]``: a time of day below 24 hours, a duration (Excel's ``[h]:mm:ss``) from 24."""
NOT_IN_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
"""Characters an xlsx file (XML 1.0) cannot hold: saved anyway, they leave a workbook no one can open."""


class WorkbookFile:
    """The episode's workbook on disk, with the loaded openpyxl object cached by file version.

    The model's code can replace the file with anything, so it is only ever opened through
    :mod:`benchmax_gym.core.files` (a regular file in the workspace, no symlink, one link, size
    capped) and checked by :func:`.recalc.check_workbook` before openpyxl parses it."""

    def __init__(self, path: Path, timeout: float | None = None, recalc: str = "auto"):
        self.path = Path(path)
        self.timeout = timeout  # the wall-clock bound on parsing a file the model's code changed
        self.recalc = recalc  # the env's mode (:data:`.recalc.RECALC_MODES`): reads show what the grader computes
        self._book: openpyxl.Workbook | None = None
        self._values: openpyxl.Workbook | None = None
        self._version: tuple | None = None
        self._data: bytes | None = None  # the file as last loaded or saved
        self._loaded = False  # the task's file was loaded: every later load may be the model's

    def data(self) -> bytes:
        """The file's bytes, read safely (:class:`WorkspaceFileError`, a ToolError, if refused)."""
        data, _ = read_workspace_file(self.path.parent, self.path.name, MAX_WORKBOOK_BYTES)
        return data

    def book(self) -> openpyxl.Workbook:
        if self._book is not None and unchanged(self.path.parent, self.path.name, self._version):
            return self._book
        try:
            version = workspace_file_version(self.path.parent, self.path.name, MAX_WORKBOOK_BYTES)
        except WorkspaceFileError as exc:
            if exc.code == "file_missing":
                raise ToolError(f"{WORKBOOK} no longer exists in the workspace") from None
            raise
        if self._book is None or version != self._version:
            data, version = read_workspace_file(self.path.parent, self.path.name, MAX_WORKBOOK_BYTES)
            # The first load is the task's own file (reset stays fast); later ones may be the
            # model's: checked against the limits and parsed, both within the deadline.
            model_written = self._loaded
            self._book = self._parse(data, data_only=False, bounded=model_written, check=model_written)
            self._values, self._version, self._data, self._loaded = None, version, data, True
        return self._book

    def cached_values(self) -> openpyxl.Workbook | None:
        """The values Excel saved for formula cells (absent for formulas written here)."""
        self.book()
        if self._values is None:
            try:
                self._values = self._parse(self._data, data_only=True, bounded=True)
            except ToolError as exc:
                if exc.code in ("tool_timeout", "workbook_too_large"):
                    raise
                return None
        return self._values

    def _parse(self, data: bytes, data_only: bool, bounded: bool, check: bool = False) -> openpyxl.Workbook:
        """openpyxl's workbook from ``data``; ``bounded`` (the model's file): parsed first in a
        process killed after ``timeout`` and bounded in memory (:func:`open_within`): within
        :func:`.recalc.check_workbook`'s limits a file can still take a parse 30 s and 2 GB;
        ``check``: those limits checked first, within the same deadline."""
        try:
            return open_within(data, self.timeout if bounded else None, f"opening {WORKBOOK}", data_only=data_only, check=check)
        except TimeLimitExceeded as exc:
            raise ToolError(f"{exc}; make it smaller", code="tool_timeout") from None
        except WorkbookTooLarge as exc:  # over check_workbook's limits, or MemoryLimitExceeded
            raise ToolError(f"{WORKBOOK} is too large to open: {exc}", code="workbook_too_large") from None
        except Exception as exc:
            raise ToolError(f"{WORKBOOK} cannot be opened: {type(exc).__name__}: {exc}") from None

    def save(self) -> None:
        buffer = io.BytesIO()
        self._book.save(buffer)
        data = buffer.getvalue()
        try:
            self._version = write_workspace_file(self.path.parent, self.path.name, data)
        except OSError as exc:  # the file was replaced whole or not at all: it is as it was
            why = os.strerror(exc.errno) if exc.errno else exc
            raise ToolError(f"{WORKBOOK} could not be saved ({why}); it is unchanged") from None
        self._values, self._data = None, data

    def discard(self) -> None:
        """Forget in-memory changes (a failed write): the next access reloads the file."""
        self._book = self._values = self._version = self._data = None

    def recalculated(self, sheet: str, rng: str) -> dict[tuple[str, str], Any]:
        """Values of the formula cells of ``sheet!rng`` computed as the grader computes them, with
        the env's ``recalc`` (``"none"``: the values saved in the file; ``"libreoffice"`` without
        LibreOffice raises the grader's error), from the bytes of the loaded workbook (as loaded or
        saved), all within ``timeout`` (a read is an inline tool: nothing else bounds it; saving the
        loaded workbook again here took as long as its parse, outside any deadline); cached,
        refusals too, until the workbook changes."""
        self.book()
        key = (self._version, sheet, rng)
        cache = self.__dict__.setdefault("_recalculated", {})  # made on first use: reads rarely need it
        if key not in cache:
            cache.clear()  # only the current version's results are worth keeping
            try:
                cache[key] = recalculate(self._data, self.recalc, ranges=[(sheet, rng)], time_limit=self.timeout)
            except TimeLimitExceeded as exc:  # kept: the same read would only overrun again
                cache[key] = (f"computing the formulas: {exc} (the tool time limit); simplify them", "tool_timeout")
            except MemoryLimitExceeded as exc:
                cache[key] = (f"{exc}; simplify them", "workbook_too_large")
            except WorkbookTooLarge as exc:
                cache[key] = (f"the formulas cannot be computed: {exc}", "workbook_too_large")
        if isinstance(cache[key], tuple):
            raise ToolError(cache[key][0], code=cache[key][1])
        return cache[key]

    def sheet(self, name: str):
        book = self.book()
        if name in book.sheetnames:
            return book[name]
        raise ToolError(f"no sheet named {name!r}; the sheets are {book.sheetnames}")


def _workbook(episode) -> WorkbookFile:
    return episode.state["workbook"]


def _bounds(ref: str) -> tuple[int, int, int, int]:
    """'B2:D9' or 'C3' -> (min_col, min_row, max_col, max_row), checked against Excel's limits."""
    text = ref.strip().replace("$", "").upper()
    if "!" in text:
        raise ToolError(f"give the sheet in the sheet argument, not in the range ({ref!r})")
    try:
        min_col, min_row, max_col, max_row = range_boundaries(text)
    except (ValueError, TypeError):
        raise ToolError(f"{ref!r} is not a cell or range like 'B2' or 'A1:D20'") from None
    if None in (min_col, min_row, max_col, max_row):
        raise ToolError(f"{ref!r}: give both corners of the range, like 'A1:D20' (whole rows/columns are not supported)")
    if min(min_row, max_row) < 1:  # openpyxl reads row 0 as "no limit": the whole column
        raise ToolError(f"{ref!r}: rows are numbered from 1")
    min_col, max_col = sorted((min_col, max_col))  # 'C3:A1' is A1:C3, as in Excel
    min_row, max_row = sorted((min_row, max_row))
    if max_col > MAX_COL or max_row > MAX_ROW:
        raise ToolError(f"{ref!r} is outside Excel's grid (at most {get_column_letter(MAX_COL)}{MAX_ROW})")
    return min_col, min_row, max_col, max_row


def _show(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ") if value.time() != dt.time() else value.date().isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):  # an [h]:mm:ss duration
        total = round(value.total_seconds())
        minutes, seconds = divmod(abs(total), 60)
        return f"{'-' if total < 0 else ''}{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"
    if isinstance(value, str):
        return repr(value) if value != value.strip() or not value else value
    if isinstance(value, ArrayFormula):  # (shown as Excel shows an array formula, with its range)
        return f"{{{value.text}}} over {value.ref}"
    if isinstance(value, DataTableFormula):
        return f"=TABLE({', '.join(filter(None, (value.r1, value.r2)))}) over {value.ref}"
    return str(value)


def _stored_rows(ws, min_col: int, min_row: int, max_col: int, max_row: int) -> Iterator[list[Any]]:
    """The cells the sheet holds in the range, row by row (a bounded range: the callers cap it).
    Not ``iter_rows``: on an editable sheet it creates a cell at every position it passes, and each
    empty one stretched the used range ``list_sheets`` shows (reading T90:Z99 of a one-cell sheet
    made it A1:Z99)."""
    cells = ws._cells  # {(row, column): cell}
    for r in range(min_row, max_row + 1):
        yield [cells[r, c] for c in range(min_col, max_col + 1) if (r, c) in cells]


def describe_workbook(workbook: WorkbookFile, preview_rows: int = 8, preview_cols: int = 10, max_sheets: int = 5) -> str:
    """The reset observation's picture of the workbook: sheets, used ranges, a bounded preview."""
    book = workbook.book()
    lines = [f"The workbook is {WORKBOOK} in your working directory. Sheets:"]
    for i, ws in enumerate(book.worksheets):
        lines.append(f"- {ws.title!r}: used range {ws.dimensions}, {ws.max_row} rows x {ws.max_column} columns")
        if i >= max_sheets:
            continue
        for row in _stored_rows(ws, 1, 1, min(ws.max_column, preview_cols), min(ws.max_row, preview_rows)):
            cells = [f"{c.coordinate}={_show(c.value)}" for c in row if c.value is not None]
            if cells:
                lines.append("    " + " | ".join(cells))
        if ws.max_row > preview_rows or ws.max_column > preview_cols:
            lines.append("    ... (use read_range to see more)")
    return "\n".join(lines)


@tool(inline=True)
def list_sheets(episode) -> list[dict[str, Any]]:
    """List the workbook's sheets with their used ranges."""
    book = _workbook(episode).book()
    return [
        {"name": ws.title, "used_range": ws.dimensions, "rows": ws.max_row, "columns": ws.max_column}
        for ws in book.worksheets
    ]


@tool(inline=True)
def read_range(sheet: str, range: str, episode) -> str:  # noqa: A002 - the name the model sees
    """Read cells: one line per row, each non-empty cell as COORD: value; formulas as =FORMULA -> value.

    Args:
        sheet: the sheet name, e.g. "Sheet1"
        range: a cell or range, e.g. "A1:F20" (at most 2000 cells per read)
    """
    workbook = _workbook(episode)
    ws = workbook.sheet(sheet)
    min_col, min_row, max_col, max_row = _bounds(range)
    count = (max_col - min_col + 1) * (max_row - min_row + 1)
    if count > MAX_READ_CELLS:
        raise ToolError(f"{range!r} has {count} cells; read at most {MAX_READ_CELLS} at a time")
    values = computed = None
    lines = []
    for row in _stored_rows(ws, min_col, min_row, max_col, max_row):
        cells = []
        for c in row:
            if c.value is None:
                continue
            text = _show(c.value)
            if c.data_type == "f" or isinstance(c.value, str) and c.value.startswith("="):
                values = values or workbook.cached_values()
                saved = values[sheet][c.coordinate].value if values is not None else None
                if saved is None:  # written since Excel saved the file: compute it as the grader will
                    if computed is None:
                        rng = f"{get_column_letter(min_col)}{min_row}:{get_column_letter(max_col)}{max_row}"
                        computed = workbook.recalculated(sheet, rng)
                    saved = computed.get((sheet, c.coordinate))
                    saved = "" if saved is None else saved
                text = f"{c.value if isinstance(c.value, str) else text} -> {_show(saved)}"
            cells.append(f"{c.coordinate}: {text}")
        if cells:
            lines.append(" | ".join(cells))
    return "\n".join(lines) if lines else f"{range} on {sheet!r} is empty"


class _Text(str):
    """Text written with Excel's leading apostrophe: stored as is, never a formula or a date."""


def _time_value(match: re.Match) -> dt.time | dt.timedelta:
    hours, minutes = int(match[1]), int(match[2])
    seconds, micro = int(match[3] or 0), int((match[4] or "0").ljust(6, "0"))
    if hours < 24:
        return dt.time(hours, minutes, seconds, micro)
    return dt.timedelta(hours=hours, minutes=minutes, seconds=seconds, microseconds=micro)


def _cell_value(coordinate: str, value: Any) -> Any:
    """JSON value -> what openpyxl stores, as Excel reads what you type: "=..." is a formula, an
    ISO date becomes a date (with a time, a datetime), ``H:MM[:SS]`` a time of day (a duration
    from 24 hours), and a leading apostrophe keeps the rest as literal text. Formulas that refer
    to other workbooks are refused: the grader never opens files a formula names."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ToolError(f"{coordinate}: text longer than {MAX_TEXT} characters")
        if bad := NOT_IN_XML.search(value):
            raise ToolError(f"{coordinate}: the text contains {ascii(bad[0])}; Excel cannot store control "
                            "characters, U+FFFE, U+FFFF or lone surrogates")
        if value.startswith("'"):
            return _Text(value[1:])
        if value.startswith("="):
            if ref := external_reference(value):
                raise ToolError(f"{coordinate}: {ref!r} refers to another workbook; formulas may only refer to this "
                                "workbook's sheets")
            return as_excel_stores(value)
        if ISO_DATE.match(value):
            try:
                return dt.datetime.fromisoformat(value)
            except ValueError:
                pass
        if match := TIME.match(value):
            return _time_value(match)
        return value
    if value is None or isinstance(value, (bool, int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError(f"{coordinate}: {value} cannot be stored in a cell (NaN and infinity are not numbers Excel keeps)")
        return value
    raise ToolError(f"{coordinate}: a cell holds text, a number, true/false or null, not {type(value).__name__}")


@tool(inline=True)
def write_cells(sheet: str, cells: dict[str, Any], episode, create_sheet: bool = False) -> str:
    """Write values or formulas into cells, then save the workbook.

    Args:
        sheet: the sheet name
        cells: {"B2": 42, "C2": "text", "D2": "=SUM(B2:B9)", "E2": "2024-03-01", "F2": "9:30", "G2": null};
            as when typing in Excel, "=" starts a formula, ISO dates become dates ("2024-03-01 09:30"
            a datetime), "H:MM[:SS]" a time (from 24 hours, a duration), a leading ' keeps the rest
            as plain text ("'2024-03-01"), and null clears the cell
        create_sheet: create the sheet first if it does not exist
    """
    workbook = _workbook(episode)
    book = workbook.book()
    if sheet not in book.sheetnames:
        if not create_sheet:
            raise ToolError(f"no sheet named {sheet!r}; the sheets are {book.sheetnames} (pass create_sheet=true to add it)")
        if not sheet.strip() or len(sheet) > 31 or any(ch in sheet for ch in "[]:*?/\\") or NOT_IN_XML.search(sheet):
            raise ToolError(f"{sheet!r} is not a valid sheet name (1-31 characters, none of []:*?/\\ or control characters)")
        if clash := next((name for name in book.sheetnames if name.upper() == sheet.upper()), None):
            raise ToolError(f"a sheet named {clash!r} exists (sheet names ignore case): write to it, or choose another name")
    if not cells:
        raise ToolError("cells is empty: give at least one {coordinate: value}")
    if len(cells) > MAX_WRITE_CELLS:
        raise ToolError(f"{len(cells)} cells in one call; write at most {MAX_WRITE_CELLS}")
    planned = []
    for coordinate, value in cells.items():
        min_col, min_row, max_col, max_row = _bounds(coordinate)
        if (min_col, min_row) != (max_col, max_row):
            raise ToolError(f"{coordinate!r} is a range; give one cell per key")
        planned.append((min_row, min_col, get_column_letter(min_col) + str(min_row), _cell_value(coordinate, value)))
    ws = book[sheet] if sheet in book.sheetnames else None
    try:
        if ws is None:
            ws = book.create_sheet(sheet)
        for row, col, name, value in planned:
            cell = ws.cell(row=row, column=col)
            if isinstance(cell, MergedCell):
                merged = next((str(r) for r in ws.merged_cells.ranges if cell.coordinate in r), "a merged range")
                raise ToolError(f"{name} is inside merged cells {merged}; write to the range's top-left cell")
            try:
                cell.value = str(value) if isinstance(value, _Text) else value
            except IllegalCharacterError:
                raise ToolError(f"{name}: the text contains control characters Excel cannot store") from None
            if isinstance(value, _Text):
                cell.data_type = "s"  # "'=A1" stays the text "=A1"
        workbook.save()
    except BaseException:
        workbook.discard()  # nothing was saved: the file on disk is the workbook as it was
        raise
    return f"wrote {len(planned)} cell(s) on {sheet!r}"
