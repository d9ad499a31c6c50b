"""Reading workbooks safely and giving their formula cells values, for grading and the tools.

openpyxl does not compute formulas, and a model may answer with formulas: :func:`recalculate`
computes them with the ``formulas`` package (made to scale: whole-column and huge ranges are
bounded to the used area, references to other workbooks become errors) or with headless
LibreOffice, falling back to the values cached in the file. Given a time limit (the model's
workbooks), the ``formulas`` recalculation runs in a process of its own, killed at the deadline
and bounded in memory (:func:`run_in_process`), as does every parse of the model's files
(:func:`open_within`), whatever the recalculation (LibreOffice's input and output too).
:func:`check_workbook` refuses workbooks whose parsing alone would cost the host unbounded time
or memory; for the model's files it runs first, within the same deadline.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import datetime as dt
import functools
import gc
import io
import itertools
import json
import logging
import math
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import zipfile
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import openpyxl
from openpyxl.cell.read_only import ReadOnlyCell
from openpyxl.formula.tokenizer import Token, Tokenizer
from openpyxl.styles.numbers import is_date_format, is_timedelta_format
from openpyxl.utils import get_column_letter, range_boundaries
from openpyxl.utils.datetime import from_excel
from openpyxl.worksheet._read_only import ReadOnlyWorksheet
from openpyxl.worksheet._reader import WorkSheetParser

from benchmax_gym.core.tempdirs import owned_tempdir, owned_workspace, remove_owned
from benchmax_gym.envs.excel import formulas_fixes

__all__ = [
    "RECALC_MODES", "MemoryLimitExceeded", "RecalcOutOfMemory", "RecalcUnavailable", "TimeLimitExceeded", "WorkbookTooLarge", "check_workbook", "recalculate",
    "open_within", "run_in_process", "run_with_deadline", "stop_recalc_worker",
]

RECALC_MODES = ("auto", "formulas", "libreoffice", "none")
"""How formula cells get their values: ``auto`` and ``formulas`` use the ``formulas`` package
(pure Python, always available); ``libreoffice`` converts the workbook with headless LibreOffice,
which recalculates on load; ``none`` trusts the values cached in the file, as upstream does."""

LIBREOFFICE_TIMEOUT_S = 120
"""The most a LibreOffice recalculation may take: then it is killed, with every process it started."""
LIBREOFFICE_MEMORY_BYTES = 4 * 2**30
"""The address space LibreOffice may use (``RLIMIT_AS``), so a hostile workbook cannot take the
host's memory; a headless conversion maps about 1 GB."""
GRADE_TIMEOUT_S = 30.0
"""The time the grader gives the recalculation of a model's workbook (the tools give theirs
``tool_timeout``); SpreadsheetBench's take well under a second."""

Workbook = str | Path | bytes | Callable[[], bytes]
CellKey = tuple[str, str]  # (sheet name, "A1")


# --------------------------------------------------------------------------- workbook reading


MAX_WORKBOOK_BYTES = 16 * 2**20
"""The largest workbook file the host opens (SpreadsheetBench's are under 100 KB)."""
MAX_XML_BYTES = 64 * 2**20
"""The most bytes a workbook's parts may inflate to, as their zip headers declare (a zip member
never yields more than it declares: Python's zipfile stops there)."""
MAX_RATIO = 200
"""The most a part larger than 1 MiB may inflate, relative to its compressed size."""
MAX_PARTS = 10_000
MAX_CELLS = 300_000
"""The most cells a workbook may have: written cells plus every cell that merged ranges,
hyperlinks and comments cover (openpyxl creates those one by one); openpyxl spends ~10 us and
~1 KB per cell."""
MAX_ROW, MAX_COL = 1_048_576, 16_384  # Excel's grid

# Every scan is linear in the part's size, whatever the bytes: a tag's attributes never hold "<"
# (XML forbids it), so a scan from one "<" stops at the next, and the atomic groups commit to the
# first match inside a tag ([^>]*? and .*? scanned on to the end from every unclosed tag: a 5 KB
# part of "<c <c <c ..." took minutes). Names are alternatives (``c|x:c``): re tries them at each
# "<" faster than an optional prefix.


def _name(name: bytes) -> bytes:
    """An element's name in a pattern, with or without a namespace prefix (``c``, ``x:c``)."""
    return rb"(?:" + name + rb"|[A-Za-z_][\w.-]*+:" + name + rb")"


_CELL_TAG = re.compile(rb"<" + _name(rb"c") + rb"[\s/>]")
_RANGE_TAG = re.compile(  # elements whose ref openpyxl fills with a cell per position
    rb"<" + _name(rb"(?:mergeCell|hyperlink|comment)") + rb"\s(?>[^<>]*?(?<=\s)ref\s*=\s*)[\"']([^\"'<]*)[\"']"
)
_SHARED_STRING = re.compile(  # one <si>...</si>, never across another <si>
    rb"<" + _name(rb"si") + rb"[\s>](?:[^<]++|<(?!/?" + _name(rb"si") + rb"[\s>/]))*+</" + _name(rb"si") + rb"\s*>"
)
_SHARED_STRING_CELL = re.compile(  # a cell's <v>: an index into the shared strings
    rb"<" + _name(rb"c") + rb"\s(?>[^<>]*?(?<=\s)t\s*=\s*[\"']s[\"'])[^<>]*+>\s*+<" + _name(rb"v")
    + rb"\s*>\s*([0-9]{1,9})\s*<"
)
_TOKEN = re.compile(rb"\S+")
_DECLARED_ENCODING = re.compile(rb"(?:\xef\xbb\xbf)?\s*<\?xml[^>]*?encoding\s*=\s*[\"']([\w.:-]{1,40})[\"']")


class WorkbookTooLarge(ValueError):
    """A workbook over the host's limits (:data:`MAX_WORKBOOK_BYTES`, :data:`MAX_XML_BYTES`,
    :data:`MAX_RATIO`, :data:`MAX_PARTS`, :data:`MAX_CELLS`; XML entities, which could expand
    past them), refused before openpyxl parses it,
    or with a range too large to recalculate (:data:`.formulas_fixes.MAX_LOADED_RANGE_CELLS`)."""


def _covered_cells(ref: bytes, limit: int) -> int:
    """The cells a ``ref`` attribute covers (``A1:C3``; whole columns or rows span the grid),
    counted until past ``limit``; a token that is not a range counts one, so a ref of millions of
    tokens is refused as soon as a range of as many cells would be."""
    total = 0
    for token in _TOKEN.finditer(ref):
        if total > limit:
            break
        try:
            min_col, min_row, max_col, max_row = range_boundaries(token[0].decode("ascii", "replace").replace("$", "").upper())
        except (TypeError, ValueError):
            total += 1
            continue
        cols = MAX_COL if min_col is None or max_col is None else abs(max_col - min_col) + 1
        rows = MAX_ROW if min_row is None or max_row is None else abs(max_row - min_row) + 1
        total += cols * rows
    return total


def _count(pattern: re.Pattern, data: bytes, limit: int) -> int:
    """The matches of ``pattern`` in ``data``, counted until past ``limit`` (no list of millions)."""
    return sum(1 for _ in itertools.islice(pattern.finditer(data), max(limit, 0) + 1))


def _as_parsed(xml: bytes) -> bytes:
    """A part's bytes as the XML parser reads them, in UTF-8: a part in UTF-16 or in a declared
    single-byte encoding such as EBCDIC hides its tags from a scan of the raw bytes."""
    if xml.startswith((b"\xff\xfe", b"\xfe\xff")):
        codec = "utf-16"
    elif xml[:2] in (b"<\x00", b"\x00<"):
        codec = "utf-16-le" if xml[0] == 0x3C else "utf-16-be"
    elif m := _DECLARED_ENCODING.match(xml):
        codec = m[1].decode("ascii").lower().replace("_", "-")
        if codec in ("utf-8", "utf8", "us-ascii", "ascii", "iso-8859-1", "latin-1", "latin1"):
            return xml  # tags are plain ASCII bytes
    else:
        return xml
    try:
        return xml.decode(codec, "replace").encode("utf-8", "replace")
    except (LookupError, ValueError):
        return xml  # an encoding Python lacks: the XML parser cannot read it either


def check_workbook(data: bytes) -> None:
    """Refuse, with :class:`WorkbookTooLarge`, a workbook whose parsing would cost the host
    unbounded time or memory: a zip bomb, or a small file that expands to millions of cells.
    The zip directory, then one linear scan of every part (openpyxl finds worksheets through
    relationships, under any name): up to seconds for 64 MiB, so the model's files are checked
    within their deadline (:func:`open_within`'s ``check``, the grader's reading process). Files
    that are not a zip pass through (openpyxl's own error then says what is wrong)."""
    if len(data) > MAX_WORKBOOK_BYTES:
        raise WorkbookTooLarge(f"the workbook is {len(data)} bytes; the limit is {MAX_WORKBOOK_BYTES}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError):
        return
    with archive:
        parts = archive.infolist()
        if len(parts) > MAX_PARTS:
            raise WorkbookTooLarge(f"the workbook has {len(parts)} parts; the limit is {MAX_PARTS}")
        total = sum(p.file_size for p in parts)
        if total > MAX_XML_BYTES:
            raise WorkbookTooLarge(f"the workbook expands to {total} bytes; the limit is {MAX_XML_BYTES}")
        for p in parts:
            if p.file_size > 2**20 and p.file_size > MAX_RATIO * max(p.compress_size, 1):
                raise WorkbookTooLarge(f"{p.filename} expands {p.file_size // max(p.compress_size, 1)}-fold; the limit is {MAX_RATIO}")
        cells = 0
        uses: collections.Counter = collections.Counter()  # shared string index -> cells that show it
        string_parts: list[bytes] = []  # the parts that may hold shared strings
        for p in parts:
            try:
                xml = _as_parsed(archive.read(p))
            except Exception:
                continue  # a broken part: openpyxl reports it if it reads it
            if b"<!ENTITY" in xml:  # the XML parser would expand them: a few KB into millions of cells
                raise WorkbookTooLarge(
                    f"{p.filename} declares XML entities (<!ENTITY>), whose expansion no limit here can "
                    "see; xlsx parts never declare any"
                )
            if b"sheetData" in xml:
                found = _count(_CELL_TAG, xml, MAX_CELLS - cells)
                cells += found
                if found and cells <= MAX_CELLS:  # (each match is a cell: at most MAX_CELLS)
                    uses.update(map(int, _SHARED_STRING_CELL.findall(xml)))
            if b"sst" in xml:
                string_parts.append(xml)
            ranges = any(name in xml for name in (b"mergeCell", b"hyperlink", b"comment"))  # (a fast search)
            for ref in _RANGE_TAG.finditer(xml) if ranges else ():
                if cells > MAX_CELLS:
                    break
                cells += _covered_cells(ref[1], MAX_CELLS - cells)
            if cells > MAX_CELLS:
                raise WorkbookTooLarge(
                    f"the workbook has more cells than the limit of {MAX_CELLS} "
                    "(merged ranges, hyperlinks and comments count every cell they cover)"
                )
        # openpyxl gives each cell that shows a shared string its own copy when it saves, and
        # formulas' ranges copy it again: one 32,767-character string in 300,000 cells is 10 GB.
        longest: dict[int, int] = {}  # a shown string's bytes (the longest where parts disagree)
        for xml in string_parts if uses else ():
            for i, string in zip(range(max(uses) + 1), _SHARED_STRING.finditer(xml)):
                if i in uses:
                    longest[i] = max(longest.get(i, 0), string.end() - string.start())
        inlined = sum(longest.get(i, 0) * n for i, n in uses.items())
        if total + inlined > MAX_XML_BYTES:
            raise WorkbookTooLarge(
                f"the workbook's shared strings, written out in every cell that shows them, come to "
                f"{total + inlined} bytes; the limit is {MAX_XML_BYTES}"
            )


class TimeLimitExceeded(TimeoutError):
    """Work given up at its deadline (:func:`run_with_deadline`)."""


def run_with_deadline(fn: Callable[[], Any], seconds: float | None, what: str = "the work") -> Any:
    """``fn()``, given up after ``seconds`` (None: no limit) with :class:`TimeLimitExceeded`.

    It runs in a daemon thread of its own (~0.1 ms): the inline tools have no other deadline.
    One that overruns finishes unwatched (no pool outlives a fork or delays the interpreter's
    exit), so ``fn`` must bound its own work. Work that a model's input can make long (its
    formulas, parsing its files) runs in a process instead (:func:`run_in_process`): a thread
    cannot be stopped.
    """
    if seconds is None:
        return fn()
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            future.set_exception(exc)

    threading.Thread(target=run, name="excel-deadline", daemon=True).start()
    try:
        return future.result(seconds)
    except concurrent.futures.TimeoutError:
        raise TimeLimitExceeded(f"{what} took over {seconds:g} s") from None


def _read_bytes(workbook: Workbook) -> bytes:
    if callable(workbook):
        return workbook()
    if isinstance(workbook, bytes | bytearray):
        return bytes(workbook)
    return Path(workbook).read_bytes()


def _open(data: bytes, *, data_only: bool, read_only: bool = True) -> openpyxl.Workbook:
    """openpyxl workbook from bytes; read-only (streamed, fast) unless it will be edited, and then
    with its pictures saved as they were read (:func:`_keep_pictures`)."""
    wb = openpyxl.load_workbook(io.BytesIO(data), read_only=read_only, data_only=data_only)
    if not read_only:
        _keep_pictures(wb)
    return wb


def _keep_pictures(wb: openpyxl.Workbook) -> None:
    """Make every picture of ``wb`` save the bytes it was read from. openpyxl decodes each picture
    that is not PNG, JPEG or GIF and writes it again as PNG at every save (a 114 KB compressed
    9000 x 9000 TIFF: ~2 s a copy, unbounded by any deadline once the parse is done), and closes
    a picture's file as it saves it, so a second save of the workbook failed (ValueError: I/O
    operation on closed file). Kept as read, a save copies them: as fast as the file's size."""
    for ws in wb.worksheets:
        for picture in getattr(ws, "_images", ()):
            if isinstance(picture.ref, io.BytesIO):  # (as openpyxl's reader makes them)
                picture._data = picture.ref.getvalue


def _iter_range(ws: Any, rng: str) -> Iterator[tuple[str, Any]]:
    """``(coordinate, cell or None)`` for every cell of ``rng``.

    Positions are computed rather than read from the cells: read-only sheets yield empty
    placeholders without coordinates, and may stop early when the data ends before the range.
    """
    min_col, min_row, max_col, max_row = range_boundaries(rng)
    letters = [get_column_letter(c) for c in range(min_col, max_col + 1)]
    rows = ws.iter_rows(min_row=min_row, max_row=max_row, min_col=min_col, max_col=max_col)
    seen = 0
    for offset, row in enumerate(rows):
        row = tuple(row)
        for i, letter in enumerate(letters):
            cell = row[i] if i < len(row) else None
            yield f"{letter}{min_row + offset}", cell
        seen += 1
    for row_number in range(min_row + seen, max_row + 1):
        for letter in letters:
            yield f"{letter}{row_number}", None


def _stored_cells(ws: Any, rng: str | None = None) -> Iterator[tuple[str, Any]]:
    """``(coordinate, cell)`` for the cells of ``rng`` (None: the whole sheet) that the file holds,
    in one pass over the sheet's XML, as openpyxl's read-only ``iter_rows`` reads it but without the
    empty cells it fills every gap with: work proportional to the file, never to the range's area
    (cells at A1 and XFD1048576 make a used area of 17 billion cells)."""
    min_col, min_row, max_col, max_row = range_boundaries(rng) if rng else (None,) * 4
    min_col, min_row, max_col, max_row = min_col or 1, min_row or 1, max_col or MAX_COL, max_row or MAX_ROW
    if not isinstance(ws, ReadOnlyWorksheet):  # an editable sheet: its cells are in memory
        for (row, col), cell in sorted(ws._cells.items()):
            if min_row <= row <= max_row and min_col <= col <= max_col:
                yield cell.coordinate, cell
        return
    book = ws.parent
    with ws._get_source() as source:
        parser = WorkSheetParser(source, ws._shared_strings, data_only=book.data_only, epoch=book.epoch,
                                 date_formats=book._date_formats, timedelta_formats=book._timedelta_formats)
        for row, cells in parser.parse():
            if row > max_row:
                break
            if row < min_row:
                continue
            for cell in cells:
                if min_col <= cell["column"] <= max_col:
                    yield f"{get_column_letter(cell['column'])}{row}", ReadOnlyCell(ws, **cell)


def _is_formula(cell: Any) -> bool:
    return cell is not None and getattr(cell, "data_type", None) == "f"


def _bounding_ranges(keys: Iterable[CellKey]) -> dict[str, str]:
    """``{sheet: "A1:C9"}``: the smallest range per sheet holding the given cells."""
    bounds: dict[str, list[int]] = {}
    for sheet, coordinate in keys:
        col, row, _, _ = range_boundaries(coordinate)
        b = bounds.setdefault(sheet, [col, row, col, row])
        b[0], b[1], b[2], b[3] = min(b[0], col), min(b[1], row), max(b[2], col), max(b[3], row)
    return {
        sheet: f"{get_column_letter(b[0])}{b[1]}:{get_column_letter(b[2])}{b[3]}"
        for sheet, b in bounds.items()
    }


def _read_values(wb: Any, keys: Iterable[CellKey]) -> dict[CellKey, Any]:
    """Values of the given cells (sheet names as in ``wb``; None where empty), one streamed pass
    per sheet over the cells it holds (:func:`_stored_cells`)."""
    wanted = set(keys)
    values: dict[CellKey, Any] = {key: None for key in wanted if key[0] in wb.sheetnames}
    for sheet, rng in _bounding_ranges(wanted).items():
        if sheet not in wb.sheetnames:
            continue
        for coordinate, cell in _stored_cells(wb[sheet], rng):
            if (sheet, coordinate) in wanted:
                values[sheet, coordinate] = cell.value
    return values


# --------------------------------------------------------------------------- recalculation


def _check_recalc(recalc: str) -> str:
    """Validate ``recalc`` up front: a misconfiguration must fail loudly, not grade 0."""
    if recalc not in RECALC_MODES:
        raise ValueError(f"recalc must be one of {RECALC_MODES}, got {recalc!r}")
    if recalc == "libreoffice" and soffice_executable() is None:
        raise RuntimeError(
            "recalc='libreoffice' needs LibreOffice, but neither `soffice` nor `libreoffice` is "
            "on PATH; install LibreOffice or use recalc='auto' (the formulas package)"
        )
    return recalc


def soffice_executable() -> str | None:
    """LibreOffice's command on PATH (``soffice``, else ``libreoffice``), or None."""
    return shutil.which("soffice") or shutil.which("libreoffice")


_formulas_log = threading.local()  # .messages: warnings of the current thread's recalculation


class _CollectWarnings(logging.Filter):
    """Turns ``formulas``' load warnings into grade notes while this thread recalculates."""

    def filter(self, record: logging.LogRecord) -> bool:
        messages = getattr(_formulas_log, "messages", None)
        if messages is None:
            return True
        messages.append(record.getMessage())
        return False


def _xhyperlink(link: Any, friendly_name: Any = None) -> Any:
    """Excel's HYPERLINK shows its friendly name (else the link); ``formulas`` lacks it."""
    return link if friendly_name is None else friendly_name


@functools.cache
def _formulas_module() -> Any:
    """Import ``formulas`` on first use (~0.5 s) and adapt it to grading many workbooks.

    * its tqdm progress bar (one per workbook, on stderr) is silenced: at one grade per RL
      episode it is pure noise, and tqdm reads ``TQDM_DISABLE`` only at import time;
    * its "Error in loading" warnings become notes (:class:`_CollectWarnings`);
    * ``HYPERLINK``, used by real SpreadsheetBench answers, is added;
    * :mod:`.formulas_fixes`: no external workbooks, ``--x``, Excel's text length cap.
    """
    import formulas
    import formulas.excel
    import tqdm
    from formulas.functions import replace_empty, wrap_ufunc

    formulas.excel.tqdm = types.SimpleNamespace(tqdm=functools.partial(tqdm.tqdm, disable=True))
    logging.getLogger("formulas.excel").addFilter(_CollectWarnings())
    formulas.get_functions()["HYPERLINK"] = wrap_ufunc(
        _xhyperlink,
        input_parser=lambda *args: args,
        args_parser=lambda *args: map(functools.partial(replace_empty, empty=""), args),
    )
    formulas_fixes.apply()
    return formulas


_WHOLE_COLUMNS_RE = re.compile(r"(\$?)([A-Za-z]{1,3}):(\$?)([A-Za-z]{1,3})")
_WHOLE_ROWS_RE = re.compile(r"(\$?)([0-9]+):(\$?)([0-9]+)")
_AREA_RE = re.compile(r"(\$?)([A-Za-z]{1,3})(\$?)([0-9]+):(\$?)([A-Za-z]{1,3})(\$?)([0-9]+)")
# A cheap test that a formula may hold one (false hits, e.g. in strings, are sorted out by the
# tokenizer): tokenizing every formula would cost more than the recalculation of most.
_WHOLE_HINT_RE = re.compile(
    r"(?<![\w$.])\$?(?:[A-Za-z]{1,3}:\$?[A-Za-z]{1,3}|[0-9]+:\$?[0-9]+)(?![\w(])"
)
MAX_RANGE_CELLS = 100_000
"""A range with more cells than this is cut to the workbook's used area before recalculation:
``formulas`` holds ~300 bytes per cell of a range, so ``SUMPRODUCT(A1:Z100000,A1:Z100000)``
took 1.7 GB. Cut ranges keep the work proportional to the workbook's own size."""


def _huge(ref: str) -> bool:
    m = _AREA_RE.fullmatch(ref)
    if not m:
        return False
    min_col, min_row, max_col, max_row = range_boundaries(f"{m[2]}{m[4]}:{m[6]}{m[8]}".upper())
    return (abs(max_col - min_col) + 1) * (abs(max_row - min_row) + 1) > MAX_RANGE_CELLS


def _may_be_huge(formula: str) -> bool:
    return ":" in formula and any(_huge(m[0]) for m in _AREA_RE.finditer(formula))


def _bound_ref(ref: str, max_row: int, max_col: int) -> str | None:
    """``ref`` (``Sheet1!$E:$E``, ``3:3``, ``A1:Z200000``) cut to the used area, or None when it
    needs no cut."""
    prefix, bang, ref = ref.rpartition("!")
    prefix += bang
    if m := _WHOLE_COLUMNS_RE.fullmatch(ref):
        return f"{prefix}{m[1]}{m[2]}$1:{m[3]}{m[4]}${max_row}"
    if m := _WHOLE_ROWS_RE.fullmatch(ref):
        last = get_column_letter(max_col)
        return f"{prefix}$A{m[1]}{m[2]}:${last}{m[3]}{m[4]}"
    if _huge(ref):
        min_col, min_row, max_c, max_r = range_boundaries(ref.replace("$", "").upper())
        last_col, last_row = min(max_c, max(max_col, min_col)), min(max_r, max(max_row, min_row))
        return f"{prefix}{get_column_letter(min_col)}{min_row}:{get_column_letter(last_col)}{last_row}"
    return None


def _check_size(ref: str) -> str:
    """``ref``, a range cut to the used area; :class:`WorkbookTooLarge` if it is still over
    :data:`.formulas_fixes.MAX_LOADED_RANGE_CELLS` (one far cell stretches the used area)."""
    min_col, min_row, max_col, max_row = range_boundaries(ref.rpartition("!")[2].replace("$", "").upper())
    cells = (max_col - min_col + 1) * (max_row - min_row + 1)
    if cells > formulas_fixes.MAX_LOADED_RANGE_CELLS:
        raise WorkbookTooLarge(
            f"a formula refers to {ref}, {cells} cells even cut to the used area; "
            f"the limit is {formulas_fixes.MAX_LOADED_RANGE_CELLS}"
        )
    return ref


def _bound_formula(formula: str, max_row: int, max_col: int) -> str:
    """``formula`` with whole-column/row references (``$E:$E``, ``3:3``) and ranges of more than
    :data:`MAX_RANGE_CELLS` cells cut to the used area, also as the text of ``INDIRECT("A:A")``
    (which ``formulas`` reads as a range).

    ``formulas`` materializes ``E:E`` as 1,048,576 cells: one ``SUMIFS($E:$E, ...)`` takes
    minutes. Cells past the used area are empty, so for the usual aggregates the result is the
    same (functions that count the blanks or the rows themselves could differ). A range still
    too large once cut (one far cell stretches the used area) is :class:`WorkbookTooLarge`, as
    are the ranges this text-level cut misses, when ``formulas`` reads them (:mod:`.formulas_fixes`).
    """
    if not _WHOLE_HINT_RE.search(formula) and not _may_be_huge(formula):
        return formula
    try:
        tokens = Tokenizer(formula)
    except Exception:
        return formula
    changed = False
    items = tokens.items
    for i, token in enumerate(items):
        if token.type != Token.OPERAND:
            continue
        if token.subtype == Token.RANGE:
            if (bounded := _bound_ref(token.value, max_row, max_col)) is not None:
                token.value, changed = _check_size(bounded), True
        elif (token.subtype == Token.TEXT and 0 < i < len(items) - 1 and items[i + 1].subtype == Token.CLOSE
              and items[i - 1].type == Token.FUNC and items[i - 1].value.upper() == "INDIRECT("):
            if (bounded := _bound_ref(token.value[1:-1], max_row, max_col)) is not None:
                token.value, changed = f'"{_check_size(bounded)}"', True
    return tokens.render() if changed else formula


def _used_extent(wb: openpyxl.Workbook) -> tuple[int, int]:
    """The last row and column that hold a value in any sheet of ``wb`` (at least 1), from the
    cells the sheets hold: walking their grid (``iter_rows``) creates a cell per position, and
    one far cell would make that millions."""
    max_row = max_col = 1
    for ws in wb.worksheets:
        for (row, col), cell in ws._cells.items():
            if cell.value is not None:
                max_row, max_col = max(max_row, row), max(max_col, col)
    return max_row, max_col


def _bound_whole_references(wb: openpyxl.Workbook) -> None:
    """Apply :func:`_bound_formula` to every formula and defined name of ``wb``, in place."""
    max_row, max_col = _used_extent(wb)
    for ws in wb.worksheets:
        for cell in ws._cells.values():
            if cell.data_type != "f":
                continue
            try:
                if isinstance(cell.value, str):
                    cell.value = _bound_formula(cell.value, max_row, max_col)
                elif isinstance(getattr(cell.value, "text", None), str):  # ArrayFormula
                    cell.value.text = _bound_formula(cell.value.text, max_row, max_col)
            except WorkbookTooLarge as exc:
                raise WorkbookTooLarge(f"{ws.title}!{cell.coordinate}: {exc}") from None
    for name in wb.defined_names.values():
        if name.attr_text and ":" in name.attr_text:
            try:
                name.attr_text = _bound_formula("=" + name.attr_text, max_row, max_col)[1:]
            except WorkbookTooLarge as exc:
                raise WorkbookTooLarge(f"the name {name.name}: {exc}") from None


def _plain(value: Any) -> Any:
    """A value from ``formulas`` as openpyxl would read it from a file Excel saved."""
    import numpy as np
    import schedula

    if isinstance(value, np.ndarray):
        value = value.flat[0] if value.size else None
    if isinstance(value, np.generic):
        value = value.item()
    if value is schedula.EMPTY:  # an empty cell
        return None
    if isinstance(value, schedula.Token):  # XlError: "#DIV/0!", "#NAME?", ... (a str subclass)
        return str(value)
    return value


def _parse_formulas_key(key: str) -> tuple[str, str] | None:
    """``"'[book.xlsx]SHEET'!A1:B2"`` -> ``("SHEET", "A1:B2")``; None for non-cell nodes."""
    if not isinstance(key, str) or "!" not in key or "]" not in key:
        return None
    book_sheet, _, ref = key.rpartition("!")
    sheet = book_sheet.split("]", 1)[1]
    if book_sheet.startswith("'") and sheet.endswith("'"):
        sheet = sheet[:-1].replace("''", "'")
    return sheet, ref.replace("$", "")


def _parses(formulas: Any, formula: Any) -> bool:
    text = getattr(formula, "text", formula)  # ArrayFormula keeps its formula in .text
    try:
        formulas.Parser().ast(text if text.startswith("=") else "=" + text)
    except Exception:
        return False
    return True


def _drop_unreadable_names(formulas: Any, wb: openpyxl.Workbook) -> None:
    """Leave out of the copy ``formulas`` computes the defined names it cannot parse (a table
    reference, ``tblStaff[NAME]``, common in real workbooks: SpreadsheetBench 31202): one such
    name made it answer ``#REF!`` for every formula of the workbook, used or not, so a right
    formula graded 0 (upstream's LibreOffice computes it) and ``read_range`` showed ``#REF!``. A
    formula that does use the name still fails alone, and takes its cached value."""
    for names in (wb.defined_names, *(ws.defined_names for ws in wb.worksheets)):
        for name, defined in list(names.items()):
            if not _parses(formulas, defined.attr_text or ""):
                del names[name]


def _formulas_values(
    data: bytes, keys: set[CellKey], time_limit: float | None = None, workdir: str | None = None
) -> tuple[dict[CellKey, Any], list[str]]:
    """Compute the formula cells ``keys`` with the ``formulas`` package; also its warnings.

    Each cell is requested on its own (``from_ranges``), so only what it depends on is loaded:
    an unsupported formula elsewhere in the workbook does not matter, and one that it does
    depend on spoils that cell alone (as ``#REF!``) rather than its whole range. Past
    ``time_limit`` seconds ``formulas`` stops at its next cell or formula
    (:class:`TimeLimitExceeded`); a formula that holds one C call that long is stopped only by
    running this in a process (:func:`_formulas_values_in_child`). The workbook is copied into
    ``workdir`` (a temporary directory of its own if None) for ``formulas`` to read.
    """
    formulas = _formulas_module()
    _formulas_log.messages = messages = []
    try:
        with formulas_fixes.deadline(time_limit):  # from the start, as the caller's
            wb = _open(data, data_only=False, read_only=False)
            _bound_whole_references(wb)
            _drop_unreadable_names(formulas, wb)
            own = owned_workspace("excel") if workdir is None else None
            with own or contextlib.nullcontext(workdir) as tmp:
                path = Path(tmp) / "book.xlsx"
                wb.save(path)
                with formulas_fixes.only_book(path):  # formulas naming other files load none
                    try:
                        solution = _solve(formulas, path, keys)
                    except Exception:
                        # Usually a requested formula that formulas cannot parse (a table reference
                        # such as ``Data[Cost]``): leave those out, so they alone use cached values.
                        bad = {key for key in keys if not _parses(formulas, wb[key[0]][key[1]].value)}
                        if not bad:
                            raise
                        messages.append(f"cannot parse {len(bad)} formula(s), e.g. at {min(bad)}")
                        solution = _solve(formulas, path, keys - bad)
    except formulas_fixes.Overrun:
        raise TimeLimitExceeded(f"the recalculation took over {time_limit:g} s") from None
    except formulas_fixes.RangeTooLarge as exc:
        ref = exc.ref.rpartition("]")[2].replace("'!", "!")  # without the temporary file's path
        if isinstance(exc, formulas_fixes.ArrayTooLarge):
            raise WorkbookTooLarge(
                f"a formula's {exc.ref} would make an array of {exc.cells} cells; "
                f"the limit is {formulas_fixes.MAX_ARRAY_CELLS}"
            ) from None
        if isinstance(exc, formulas_fixes.RangesTooLarge):
            raise WorkbookTooLarge(
                f"the formulas' ranges and arrays cover {exc.cells} cells in all (the last: {ref}); "
                f"the limit is {formulas_fixes.MAX_RANGES_CELLS}"
            ) from None
        raise WorkbookTooLarge(
            f"a formula refers to {ref}, {exc.cells} cells even cut to the used area; "
            f"the limit is {formulas_fixes.MAX_LOADED_RANGE_CELLS}"
        ) from None
    finally:
        _formulas_log.messages = None
    return _solution_values(solution, keys, wb.sheetnames), messages


def _solve(formulas: Any, path: Path, keys: Iterable[CellKey]) -> dict[str, Any]:
    """``formulas``' solution for the cells ``keys`` of the workbook file ``path``."""
    import numpy as np

    quoted = {sheet: sheet.replace("'", "''") for sheet, _ in keys}
    refs = [f"'[{path}]{quoted[sheet]}'!{cell}" for sheet, cell in sorted(keys)]
    if not refs:
        return {}
    with np.errstate(all="ignore"):  # Excel errors such as #DIV/0! are values, not warnings
        return formulas.ExcelModel().from_ranges(*refs).finish().calculate()


def _solution_values(
    solution: dict[str, Any], keys: set[CellKey], sheet_names: list[str]
) -> dict[CellKey, Any]:
    """Pick the values of ``keys`` out of a ``formulas`` solution (upper-cased sheet names;
    array formulas appear as one range node whose values are spread over their cells)."""
    import numpy as np

    upper = {name.upper(): name for name in sheet_names}
    values: dict[CellKey, Any] = {}
    ranges: list[tuple[str, str, Any]] = []
    for node, result in solution.items():
        parsed = _parse_formulas_key(node)
        if parsed is None or parsed[0] not in upper:
            continue
        sheet, ref = upper[parsed[0]], parsed[1]
        array = getattr(result, "value", result)
        if ":" in ref:
            ranges.append((sheet, ref, array))
        elif (sheet, ref) in keys:
            values[sheet, ref] = _plain(array)
    for sheet, ref, array in ranges:
        try:
            min_col, min_row, max_col, max_row = range_boundaries(ref)
        except (ValueError, TypeError):
            continue
        for key in keys - values.keys():
            col, row, _, _ = range_boundaries(key[1])
            if key[0] != sheet or not (min_col <= col <= max_col and min_row <= row <= max_row):
                continue
            r, c = row - min_row, col - min_col
            if isinstance(array, np.ndarray) and array.ndim == 2:
                inside = r < array.shape[0] and c < array.shape[1]
                values[key] = _plain(array[r, c]) if inside else None
            else:
                values[key] = _plain(array)
    return values


# --------------------------------------------------------------------------- the recalculation process
#
# A recalculation with a time limit runs the model's formulas: one C call (a backtracking regular
# expression in COUNTIF's wildcards, a numpy operation on objects) can hold the interpreter lock
# for minutes, where no check of the deadline runs and no thread can be given up. So it runs in a
# process of its own, killed at the deadline and bounded in memory.
#
# The processes are forked from a *worker*: a clean interpreter started once per process (lazily,
# ~2 s: Python, benchmax_gym and ``formulas``), single-threaded, so forking it is safe and each call
# pays a fork, not an import. Forking the caller instead would copy a process with threads (the
# engine's, a vector env's), whose locks a child can inherit held. multiprocessing's fork server
# or spawn would run the caller's ``__main__`` again in the worker. Each call's process starts from
# the same warm state, holds no other call's data, and is killed before the call returns.

RECALC_MEMORY_BYTES = 2**30
"""The memory a recalculation may add to the worker's (address space, ``RLIMIT_AS``): the bounds of
:mod:`.formulas_fixes` keep the largest legitimate ones near 0.65 GB; SpreadsheetBench's take a
few MB."""
RECALC_IDLE_S = 60.0
"""The worker stops after this long without a call (the next call starts it again); it also stops
when the process that started it exits or dies."""
_WORKER_START_S = 120.0  # the most a worker's start (an interpreter and its imports) may take
_WORKER_REPLY_S = 30.0  # the most a worker may take to fork a call's process or reap one
_PR_SET_PDEATHSIG = 1


class MemoryLimitExceeded(WorkbookTooLarge):
    """Work on the model's workbook in a call's process (:func:`run_in_process`: parsing it,
    reading it, recalculating it) past :data:`RECALC_MEMORY_BYTES`, or whose process was killed
    before it finished (the kernel's out-of-memory killer, an allocation that crashed C code)."""


RecalcOutOfMemory = MemoryLimitExceeded
"""The former name of :class:`MemoryLimitExceeded` (from when only recalculations ran in a process)."""


class _RemoteError(RuntimeError):
    """An unexpected error of a call's process, raised under its original name (notes name it)."""


def _remote_error(name: str, message: str) -> _RemoteError:
    return type(name, (_RemoteError,), {"__module__": __name__})(message)


class RecalcUnavailable(RuntimeError):
    """The recalculation's own machinery failed (its worker did not start, or a call's process
    ended with no result and no sign of the model's work killing it): not the workbook's doing,
    so a grade must not read it as a 0 (:func:`.grading.grade` raises it)."""


class _WorkerGone(RuntimeError):
    """The worker stopped (idle, or died) before it answered: a fresh one takes the call."""


_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from benchmax_gym.envs.excel.recalc import _serve; _serve(int(sys.argv[2]), float(sys.argv[3]))"
)


class _Worker:
    """The caller's side of the worker: its process and its control socket (a fork per call)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        threads = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")  # none: it forks
        env = {**os.environ, **dict.fromkeys(threads, "1")}
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno()),
                 repr(RECALC_IDLE_S)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env=env, start_new_session=True,  # no Ctrl-C of its own: it stops when we do
            )
        self.control, self.lock, self.owner = ours, threading.Lock(), os.getpid()
        try:
            ours.settimeout(_WORKER_START_S)
            ready = ours.recv(16)
        except OSError as exc:
            ready = f"{type(exc).__name__}: {exc}".encode()
        if ready != b"ready":
            self.close()
            why = ready.decode(errors="replace") or "it exited"
            raise RecalcUnavailable(f"the recalculation worker did not start ({why})")
        ours.settimeout(_WORKER_REPLY_S)

    def _ask(self, message: bytes, fds: tuple[int, ...] = ()) -> bytes:
        with self.lock:
            try:
                socket.send_fds(self.control, [message], list(fds))
                reply = self.control.recv(64)
            except OSError:
                reply = b""
        if not reply:
            raise _WorkerGone("the recalculation worker stopped")
        return reply

    def start(self) -> tuple[int, Connection]:
        """A fresh process for one call: its pid and a connection to it."""
        ours, theirs = socket.socketpair()
        with theirs:
            try:
                pid = int(self._ask(b"fork", (theirs.fileno(),)))
            except BaseException:
                ours.close()
                raise
        return pid, Connection(ours.detach())

    def end(self, pid: int, status: bool = False) -> int | None:
        """Kill the call's process (it may run still); with ``status``, wait for its end and
        return its wait status (None: unknown)."""
        if not status:  # unanswered: the worker reaps it soon after
            with self.lock, contextlib.suppress(OSError):
                self.control.send(b"kill %d" % pid)
            return None
        try:
            reply = self._ask(b"end %d" % pid)
        except _WorkerGone:
            return None
        return int(reply) if reply.isdigit() else None

    def close(self) -> None:
        self.control.close()  # the worker reads the end of its input and stops, with its calls
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode != 0:  # killed (SIGKILL, the OOM killer): its calls' files are left
            remove_owned(self.proc.pid)


_worker: _Worker | None = None
# Reentrant: a dropped env's release (a finalizer: it may stop the worker) takes it, and the
# collector runs finalizers in whichever thread allocates, one starting the worker under this lock
# included (it waited for itself for ever). Such a release may come in at any point below.
_worker_lock = threading.RLock()


def _the_worker(replace: _Worker | None = None) -> _Worker:
    """The process's worker, started on first use; ``replace``: one that stopped, started anew."""
    global _worker
    with _worker_lock:
        worker = _worker
        if worker is not None and (worker is replace or worker.proc.poll() is not None):
            _worker = None
            worker.close()  # (closing twice, if a release stopped it meanwhile, does nothing more)
            worker = None
        if worker is None:
            worker = _worker = _Worker()  # (a release meanwhile finds no worker to stop)
        return worker  # (a release may have stopped it since: its call finds it gone and starts one)


_holders = 0  # environments holding the worker (hold_worker): the last to let go stops it


def hold_worker() -> Callable[[], None]:
    """An environment's claim on this process's worker, from its making to its ``close()`` (the
    release returned, idempotent): when the last claim goes, the worker stops at once, so closing
    the environments leaves no process behind (unclaimed, it stops after ``RECALC_IDLE_S``)."""
    global _holders
    with _worker_lock:
        _holders += 1
    pid, released = os.getpid(), []

    def release() -> None:
        global _holders
        if released or pid != os.getpid():  # (a forked child's copy holds nothing of the parent's)
            return
        released.append(True)
        with _worker_lock:
            _holders = _holders - 1 if _holders > 0 else 0  # (no call: a release run in one is lost)
            last = _holders == 0
        if last:
            stop_recalc_worker()

    return release


def stop_recalc_worker() -> None:
    """Stop this process's recalculation worker, if it runs (the next recalculation starts one)."""
    global _worker
    with _worker_lock:
        worker, _worker = _worker, None
    if worker is not None and worker.owner == os.getpid():
        worker.close()


def _forget_worker_after_fork() -> None:
    """A forked child starts its own worker; it closes its copy of the parent's channel, so the
    parent's worker still sees the end of its input when the parent goes."""
    global _worker, _worker_lock, _holders
    worker, _worker, _worker_lock, _holders = _worker, None, threading.RLock(), 0
    if worker is not None:
        worker.control.close()


os.register_at_fork(after_in_child=_forget_worker_after_fork)
atexit.register(stop_recalc_worker)


def _formulas_values_in_child(
    data: bytes, keys: set[CellKey], time_limit: float
) -> tuple[dict[CellKey, Any], list[str]]:
    """:func:`_formulas_values` in a process of its own (:func:`run_in_process`)."""
    return run_in_process(
        _formulas_values_within_memory, (data, keys, time_limit), time_limit, "the recalculation",
        memory="the workbook's formulas need more than {} MB of memory to compute",
    )


def _formulas_values_within_memory(
    data: bytes, keys: set[CellKey], time_limit: float
) -> tuple[dict[CellKey, Any], list[str]]:
    """:func:`_formulas_values` in a call's process, its memory limit made visible: ``formulas``
    makes an exception in a function, a MemoryError too, the cell's ``#VALUE!`` (or leaves the cell
    out), so a result with an error or a missing cell from a call whose peak came within 1/16 of its
    limit ran out (:class:`MemoryError`), wherever that was caught. A result without one is what
    the workbook computes, however close to the limit it came."""
    import resource

    values, messages = _formulas_values(data, keys, time_limit)
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    near = limit != resource.RLIM_INFINITY and _memory_size("VmPeak") > limit - RECALC_MEMORY_BYTES // 16
    if near and (keys - values.keys() or any(isinstance(v, str) and v.startswith("#") for v in values.values())):
        raise MemoryError
    return values, messages


def run_in_process(
    fn: Callable[..., Any], args: tuple, time_limit: float, what: str, memory: str | None = None
) -> Any:
    """``fn(*args)`` (a module-level function; picklable arguments and result) in a process of its
    own, forked from the worker, killed at ``time_limit`` seconds (:class:`TimeLimitExceeded`
    naming ``what``) and bounded by :data:`RECALC_MEMORY_BYTES` (:class:`MemoryLimitExceeded`, with
    ``memory``'s message): nothing of it runs once this returns. For work on the model's files,
    which its input can make run long or large. Without Linux (no prctl, no /proc), a thread
    given up at the deadline (:func:`run_with_deadline`)."""
    if sys.platform != "linux":
        return run_with_deadline(functools.partial(fn, *args), time_limit, what)
    worker = _the_worker()  # started (once) outside the deadline
    try:
        pid, conn = worker.start()
    except _WorkerGone:  # it stopped idle as the call came, or died: once more, with a fresh one
        worker = _the_worker(replace=worker)
        pid, conn = worker.start()
    deadline = time.monotonic() + time_limit
    reply = None
    try:
        try:
            conn.send((fn, args, time_limit, _limits()))
            finished = conn.poll(max(deadline - time.monotonic(), 0))
            reply = conn.recv() if finished else None
        except (EOFError, OSError):
            finished = True  # it died: its wait status says how
    finally:
        conn.close()
        # reaped before a failure returns; a result's process is killed and reaped soon after
        status = worker.end(pid, status=reply is None or reply[0] != "values")
    if not finished:
        raise TimeLimitExceeded(f"{what} took over {time_limit:g} s")
    if reply is None:
        raise _lost(status, time_limit, what)
    kind, payload = reply
    if kind == "values":
        return payload
    if kind == "memory":
        message = memory or f"{what} needs more than {{}} MB of memory"
        raise MemoryLimitExceeded(message.format(RECALC_MEMORY_BYTES // 2**20))
    if kind == "raise":
        raise payload
    raise _remote_error(*payload)


def _parse_only(data: bytes, data_only: bool, check: bool = False) -> None:
    """Parse the workbook as :func:`open_within` will, for its time and memory (in a call's
    process), with ``check`` first checked (:func:`check_workbook`)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the caller's own parse shows them
        _checked_open(data, data_only, check).close()


def _checked_open(data: bytes, data_only: bool, check: bool) -> openpyxl.Workbook:
    if check:
        check_workbook(data)
    return _open(data, data_only=data_only, read_only=False)


PARSE_IN_PLACE_BYTES = 1 << 20
"""A model's workbook expanding to at most this is parsed in place (under the thread deadline):
the slowest files measured parse at ~0.5 s per expanded MB (a million fonts: 62 MB, 30 s), so
it is done in about half a second and ~30 MB; every SpreadsheetBench sample is under 0.1 MB."""


def _expanded_size(data: bytes) -> int:
    """The sum of the zip's entries' sizes (what :func:`check_workbook` bounds); 0 if unreadable
    (openpyxl then says why, at once). A zip directory over 1 MiB (~20,000 entries; 10,000 is the
    limit) counts as :data:`MAX_XML_BYTES`, unread: reading 16 MB of it takes seconds, so it is
    read in the call's process, within its deadline."""
    end = data.rfind(b"PK\x05\x06", max(0, len(data) - 65_557))  # where zipfile finds its end record
    if end >= 0 and int.from_bytes(data[end + 12:end + 16], "little") > 1 << 20:  # the directory's size
        return MAX_XML_BYTES
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return sum(entry.file_size for entry in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return 0


def open_within(
    data: bytes, time_limit: float | None, what: str, *, data_only: bool, check: bool = False
) -> openpyxl.Workbook:
    """openpyxl's (editable) workbook from the model's ``data``, with ``check`` first checked
    against :func:`check_workbook`'s limits within the same ``time_limit`` (its scan of a file
    that expands to 64 MB takes seconds). The limits still let a file take a parse 30 s and 2 GB
    (a million fonts, rows, names, shared strings), so it is checked and parsed first in a
    process killed at ``time_limit`` and bounded in memory (:func:`run_in_process`), then parsed
    here, in the time and memory it took there; one that expands to at most
    :data:`PARSE_IN_PLACE_BYTES` is checked and parsed here at once. Its errors are openpyxl's
    (under their names), :class:`WorkbookTooLarge`, :class:`TimeLimitExceeded` and
    :class:`MemoryLimitExceeded`."""
    if time_limit is not None and sys.platform == "linux" and _expanded_size(data) > PARSE_IN_PLACE_BYTES:
        run_in_process(_parse_only, (data, data_only, check), time_limit, what)
        return _open(data, data_only=data_only, read_only=False)
    return run_with_deadline(functools.partial(_checked_open, data, data_only, check), time_limit, what)


def _limits() -> dict[tuple[str, str], int | float]:
    """The caller's limits (this module's and :mod:`.formulas_fixes`' numeric constants, which
    a user may have changed), for the call's process to apply: the worker has the defaults."""
    return {
        (module.__name__, name): value
        for module in (sys.modules[__name__], formulas_fixes)
        for name, value in vars(module).items()
        if name.isupper() and not name.startswith("_") and type(value) in (int, float)
    }


def _lost(status: int | None, time_limit: float, what: str) -> Exception:
    """The error for a call's process that ended without a result."""
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:  # its CPU limit, the deadline's backstop
            return TimeLimitExceeded(f"{what} took over {time_limit:g} s")
        return MemoryLimitExceeded(
            f"{what} was killed ({signal.Signals(sig).name}) before it finished, most likely "
            f"out of memory (its limit is {RECALC_MEMORY_BYTES // 2**20} MB)"
        )
    if status is not None and os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        return RecalcUnavailable(f"the process of {what} exited with status {code} without a result")
    return RecalcUnavailable(f"the recalculation worker stopped during {what}")


def _serve(fd: int, idle_s: float) -> None:
    """The worker's main loop. ``fork`` (with a connection's socket): a process for one call, its
    pid the answer. ``kill PID``: kill it, unanswered (it is reaped soon after); ``end PID``: kill
    it and reap it, its wait status the answer. The worker stops when the caller closes the
    control socket (it exited or died), or after ``idle_s`` without a call, killing what is left."""
    import ctypes
    import tqdm

    control = socket.socket(fileno=fd)
    tqdm.tqdm.monitor_interval = 0  # no monitor thread: this process forks
    _formulas_module()
    _warm_up()
    libc = ctypes.CDLL(None, use_errno=True)
    gc.freeze()  # the collector leaves the worker's objects alone: a call copies fewer pages
    worker = os.getpid()
    calls: dict[int, str] = {}  # a call's process, until reaped (its pid is its own) -> its directory
    killed: set[int] = set()

    def reap(pid: int, block: bool) -> int | None:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        if not done:
            return None
        shutil.rmtree(calls.pop(pid), ignore_errors=True)
        killed.discard(pid)
        return status

    control.send(b"ready")
    waiting = select.poll()  # (not select.select: the channel's descriptor may be past FD_SETSIZE, 1024)
    waiting.register(control, select.POLLIN)
    try:
        while True:
            for pid in list(killed):
                reap(pid, block=False)
            if not waiting.poll(1000 * (0.1 if killed else idle_s)):
                if calls:
                    continue
                return  # idle
            try:
                message, fds, _, _ = socket.recv_fds(control, 64, 1)
            except OSError:
                return
            if not message:
                return  # the caller is gone
            command, _, arg = message.partition(b" ")
            if command == b"fork" and len(fds) == 1:
                tmp = str(owned_tempdir("excel"))  # (removed when the call is reaped; the worker killed: by the caller)
                pid = os.fork()
                if pid == 0:
                    status = 1
                    try:
                        control.close()
                        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the worker gone: so is the call
                        if os.getppid() == worker:
                            _run_call(fds[0], tmp)
                            status = 0
                    finally:
                        os._exit(status)
                os.close(fds[0])
                calls[pid] = tmp
                control.send(b"%d" % pid)
            elif command in (b"kill", b"end") and arg.isdigit() and int(arg) in calls and not fds:
                pid = int(arg)
                os.kill(pid, signal.SIGKILL)
                if command == b"kill":
                    killed.add(pid)
                else:
                    control.send(b"%d" % reap(pid, block=True))
            else:
                for extra in fds:
                    os.close(extra)
                if command != b"kill":  # (a kill is never answered)
                    control.send(b"?")
    finally:
        for pid in list(calls):
            os.kill(pid, signal.SIGKILL)
            reap(pid, block=True)


def _warm_up() -> None:
    """One small recalculation in the worker, so each call starts with ``formulas`` warm."""
    wb = openpyxl.Workbook()
    wb.active["A1"], wb.active["A2"] = 1, '=IF(A1>0,SUM(A1:A1)&"x",VLOOKUP(A1,A1:A1,1,FALSE))'
    buffer = io.BytesIO()
    wb.save(buffer)
    _formulas_values(buffer.getvalue(), {(wb.active.title, "A2")}, 60.0)


def _memory_size(field: str) -> int:
    """``VmSize`` or ``VmPeak`` of this process, in bytes (/proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _run_call(fd: int, tmp: str) -> None:
    """A call's process: read the request (a function and its arguments), run it within its limits
    (its temporary files in ``tmp``, which the worker removes even if this is killed), send the reply."""
    import resource

    conn = Connection(fd)
    fn, args, time_limit, limits = conn.recv()
    tempfile.tempdir = tmp
    for (module, name), value in limits.items():
        setattr(sys.modules[module], name, value)
    limit = _memory_size("VmSize") + RECALC_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu = math.ceil(time_limit) + 1  # a backstop: the caller kills it at the deadline
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    try:
        reply: tuple[str, Any] = ("values", fn(*args))
    except MemoryError:
        reply = ("memory", None)
    except (TimeLimitExceeded, WorkbookTooLarge) as exc:
        reply = ("raise", exc)
    except Exception as exc:  # noqa: BLE001 - the caller's note names it
        reply = ("error", (type(exc).__name__, str(exc)))
    try:
        conn.send(reply)
    except MemoryError:
        conn.send(("memory", None))


_SHEET_PREFIX_EXTERNAL = re.compile(r"[\[\]/\\]")  # never in a sheet name; always in a file's
_BOOK_NAME = re.compile(r"^\[[^\]\[@#]+\][A-Za-z_\\]")  # [1]Name, [Book.xlsx]Name; not [@Col]


def external_reference(formula: str) -> str | None:
    """The first reference of ``formula`` to another workbook (``'../[b.xlsx]S'!A1``), if any."""
    if "[" not in formula and "!" not in formula:
        return None
    try:
        tokens = Tokenizer(formula).items
    except Exception:
        return None  # Excel would refuse it; the recalculation makes it an error
    for token in tokens:
        if token.type != Token.OPERAND or token.subtype != Token.RANGE:
            continue
        prefix, bang, _ = token.value.rpartition("!")
        if (bang and _SHEET_PREFIX_EXTERNAL.search(prefix)) or _BOOK_NAME.match(token.value):
            return token.value
    return None


#: Functions newer than the file format's first version, which Excel stores with an ``_xlfn.``
#: prefix (and ``_xlfn._xlws.`` for FILTER and SORT) and shows without it. A file holding the bare
#: name (what openpyxl writes as given) is ``#NAME?`` to Excel and LibreOffice. The ones the
#: ``formulas`` package registers under ``_XLFN.`` less those openpyxl knows from the first
#: version, plus SEQUENCE and RANDARRAY (LET and LAMBDA also need their names prefixed: not done).
FUTURE_FUNCTIONS = frozenset("""
    ACOT ACOTH ARABIC ARRAYTOTEXT BETA.DIST BETA.INV BINOM.DIST BINOM.DIST.RANGE BINOM.INV BITAND
    BITLSHIFT BITOR BITRSHIFT BITXOR BYCOL BYROW CEILING.MATH CEILING.PRECISE CHISQ.DIST CHISQ.DIST.RT
    CHISQ.INV CHISQ.INV.RT CHISQ.TEST CHOOSECOLS CHOOSEROWS CONCAT CONFIDENCE.NORM CONFIDENCE.T COT COTH
    COVARIANCE.P COVARIANCE.S CSC CSCH DAYS DECIMAL DROP ERF.PRECISE ERFC.PRECISE EXPAND EXPON.DIST
    F.DIST F.DIST.RT F.INV F.INV.RT F.TEST FLOOR.MATH FLOOR.PRECISE FORECAST.ETS FORECAST.ETS.CONFINT
    FORECAST.ETS.SEASONALITY FORECAST.ETS.STAT FORECAST.LINEAR GAMMA GAMMA.DIST GAMMA.INV
    GAMMALN.PRECISE GAUSS GROUPBY HSTACK HYPGEOM.DIST IFNA IFS IMCOSH IMCOT IMCSC IMCSCH IMSEC IMSECH
    IMSINH IMTAN ISFORMULA ISOWEEKNUM LOGNORM.DIST LOGNORM.INV MAKEARRAY MAP MAXIFS MINIFS MODE.MULT
    MODE.SNGL MUNIT NEGBINOM.DIST NORM.DIST NORM.INV NORM.S.DIST NORM.S.INV NUMBERVALUE PDURATION
    PERCENTILE.EXC PERCENTILE.INC PERCENTOF PERCENTRANK.EXC PERCENTRANK.INC PERMUTATIONA PHI PIVOTBY
    POISSON.DIST QUARTILE.EXC QUARTILE.INC RANDARRAY RANK.AVG RANK.EQ REDUCE REGEXEXTRACT REGEXREPLACE
    REGEXTEST RRI SCAN SEC SECH SEQUENCE SINGLE SKEW.P SORTBY STDEV.P STDEV.S SWITCH T.DIST T.DIST.2T
    T.DIST.RT T.INV T.INV.2T T.TEST TAKE TEXTAFTER TEXTBEFORE TEXTJOIN TEXTSPLIT TOCOL TOROW TRIMRANGE
    UNICHAR UNICODE UNIQUE VALUETOTEXT VAR.P VAR.S VSTACK WEIBULL.DIST WRAPCOLS WRAPROWS XLOOKUP XMATCH
    XOR Z.TEST
""".split())
_WORKSHEET_FUNCTIONS = frozenset({"FILTER", "SORT"})  # _xlfn._xlws.


def as_excel_stores(formula: str) -> str:
    """``formula`` as Excel saves it: functions newer than the file format get their prefix
    (:data:`FUTURE_FUNCTIONS`), so that Excel and LibreOffice compute ``=TEXTJOIN(...)`` written
    by a tool, not ``#NAME?``. Text, sheet names and prefixed names stay as they are."""
    try:
        tokens = Tokenizer(formula)
    except Exception:  # noqa: BLE001 - Excel would refuse it; the recalculation makes it an error
        return formula
    changed = False
    for token in tokens.items:
        if token.type == Token.FUNC and token.subtype == Token.OPEN:
            name = token.value[:-1].upper()
            if name in _WORKSHEET_FUNCTIONS:
                token.value, changed = f"_xlfn._xlws.{name}(", True
            elif name in FUTURE_FUNCTIONS:
                token.value, changed = f"_xlfn.{name}(", True
    return tokens.render() if changed else formula


def _without_external_references(data: bytes) -> bytes:
    """``data`` with every formula that refers to another workbook made ``=#REF!`` and its
    ``externalLink`` parts dropped: LibreOffice, unlike our ``formulas`` loader, could follow them."""
    wb = _open(data, data_only=False, read_only=False)
    found = bool(wb._external_links)
    wb._external_links = []
    for ws in wb.worksheets:
        for cell in ws._cells.values():  # not iter_rows: it makes a cell per position of the grid
            formula = getattr(cell.value, "text", cell.value)  # ArrayFormula keeps .text
            if cell.data_type == "f" and isinstance(formula, str) and external_reference(formula):
                cell.value, found = "=#REF!", True
    for name, defined in list(wb.defined_names.items()):
        if defined.attr_text and external_reference("=" + defined.attr_text):
            del wb.defined_names[name]
            found = True
    if not found:
        return data
    buffer = io.BytesIO()
    wb.save(buffer)
    return buffer.getvalue()


# LibreOffice's own default for xlsx files is never to recalculate on load: it kept the values
# cached in the file, which the model's code can write (a formula "=1+1" saved with 99 graded 99).
# Its profile is made for each run with recalculation on load always, for xlsx and ODF alike.
_LIBREOFFICE_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema"
 xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Calc/Formula/Load"><prop oor:name="OOXMLRecalcMode" oor:op="fuse"><value>0</value></prop></item>
<item oor:path="/org.openoffice.Office.Calc/Formula/Load"><prop oor:name="ODFRecalcMode" oor:op="fuse"><value>0</value></prop></item>
</oor:items>
"""


def _libreoffice_values(data: bytes, keys: set[CellKey], time_limit: float | None = None) -> dict[CellKey, Any]:
    """Let headless LibreOffice load (and so recalculate) the workbook, then read ``keys``.

    With a ``time_limit`` (the model's workbook, checked already) nothing of it is parsed here:
    the copy LibreOffice gets and LibreOffice's output (the model's work, as hostile) are made
    and read in a call's process each (:func:`run_in_process`), the output checked first
    (:func:`check_workbook`). LibreOffice itself runs here, bounded by :data:`LIBREOFFICE_TIMEOUT_S`
    and by ``time_limit``: past it, :class:`TimeLimitExceeded`, as a ``formulas`` recalculation
    past it (a read's tool time ran to 120 s, and a grade's fell back to the values cached in the
    file, which the model may have written itself, after 120 s)."""
    exe = soffice_executable()
    if exe is None:
        raise RuntimeError("LibreOffice (soffice) is not installed")

    def bounded(fn: Callable[..., Any], *args: Any, what: str) -> Any:
        return fn(*args) if time_limit is None else run_in_process(fn, args, time_limit, what)

    with owned_workspace("excel") as tmp:
        source, outdir = Path(tmp) / "in" / "book.xlsx", Path(tmp) / "out"
        source.parent.mkdir()
        outdir.mkdir()
        source.write_bytes(bounded(_without_external_references, data, what="preparing the workbook for LibreOffice"))
        profile = Path(tmp) / "profile"  # own profile: parallel runs do not collide
        (profile / "user").mkdir(parents=True)
        (profile / "user" / "registrymodifications.xcu").write_text(_LIBREOFFICE_SETTINGS, encoding="utf-8")
        timeout = LIBREOFFICE_TIMEOUT_S if time_limit is None else min(LIBREOFFICE_TIMEOUT_S, time_limit)
        try:
            _run_soffice([exe, f"-env:UserInstallation={profile.as_uri()}", "--headless", "--norestore",
                          "--convert-to", "xlsx", "--outdir", str(outdir), str(source)], timeout)
        except subprocess.TimeoutExpired:
            if time_limit is None:  # (a trusted workbook: the caller falls back to its cached values)
                raise
            raise TimeLimitExceeded(f"LibreOffice's recalculation took over {timeout:g} s") from None
        converted = outdir / "book.xlsx"
        if not converted.is_file():
            raise RuntimeError("LibreOffice produced no converted workbook")
        if time_limit is not None and (size := converted.stat().st_size) > MAX_WORKBOOK_BYTES:
            raise WorkbookTooLarge(f"LibreOffice's recalculated workbook is {size} bytes; the limit is {MAX_WORKBOOK_BYTES}")
        return bounded(_cached_values, converted.read_bytes(), keys, time_limit is not None,
                       what="reading the workbook LibreOffice recalculated")


_EXEC_WITHIN_LIMITS = (  # run as `python -c THIS BYTES SECONDS COMMAND...`: limits set here, then exec
    "import os, resource, sys; n, t = int(sys.argv[1]), int(sys.argv[2]); "
    "resource.setrlimit(resource.RLIMIT_AS, (n, n)); resource.setrlimit(resource.RLIMIT_CPU, (t, t)); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def _run_soffice(command: list[str], timeout: float | None = None) -> None:
    """Run LibreOffice as ``subprocess.run(command, check=True, timeout=...)`` would, but in a
    session of its own within :data:`LIBREOFFICE_MEMORY_BYTES` of address space, and kill the
    whole session after ``timeout`` (default :data:`LIBREOFFICE_TIMEOUT_S`) and when it ends:
    ``soffice`` starts ``soffice.bin``, which outlived the launcher when only the launcher was
    killed. Each of its processes also gets that many seconds of CPU (``RLIMIT_CPU``, inherited):
    where the process that started it is killed first (a call's, at its deadline), nothing else
    would stop a LibreOffice busy on a hostile workbook. The limits are set by a small Python that
    then becomes LibreOffice (``preexec_fn`` is unsafe with threads)."""
    timeout = LIBREOFFICE_TIMEOUT_S if timeout is None else timeout
    posix = sys.platform != "win32"
    launch = [sys.executable, "-I", "-S", "-c", _EXEC_WITHIN_LIMITS, str(LIBREOFFICE_MEMORY_BYTES),
              str(math.ceil(timeout) + 1), *command]
    with subprocess.Popen(launch if posix else command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=posix) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(command, timeout) from None
        finally:  # (a launcher reaped already leaves its id to its group while any of it lives)
            if posix:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stdout, stderr)


def _cached_values(data: bytes, keys: set[CellKey], check: bool = False) -> dict[CellKey, Any]:
    """The values saved in the workbook for ``keys``; ``check``: :func:`check_workbook` first."""
    if check:
        check_workbook(data)
    wb = _open(data, data_only=True)
    try:
        return _read_values(wb, keys)
    finally:
        wb.close()


def _cached_values_within(data: bytes, keys: set[CellKey], time_limit: float) -> dict[CellKey, Any]:
    """:func:`_cached_values` of the model's workbook, in a process killed after ``time_limit``
    (:func:`run_in_process`): parsing it again takes as long as its first parse."""
    return run_in_process(_cached_values, (data, keys), time_limit, "reading the values cached in the workbook")


_UNCOMPUTABLE = ("#NAME?", "#REF!")  # what ``formulas`` answers for what it cannot evaluate


class Unverified:
    """The value of a formula cell of the model's workbook that the grader could not compute
    (a function ``formulas`` lacks, a formula it cannot parse, a recalculation that failed): it
    equals nothing, so the cell does not match. ``formula`` is its text, ``cached`` the value saved
    with it in the file, which is not its value: the model can write any
    (``<f>NOSUCHFN()</f><v>42</v>``), and nobody computed it (the grader uses it only where the
    task's own answer workbook holds that formula and that value: :func:`.grading.grade`)."""

    __slots__ = ("formula", "cached")

    def __init__(self, formula: Any = None, cached: Any = None):
        self.formula = _formula_text(formula)
        self.cached = cached

    def __repr__(self) -> str:
        return f"<no value computed for {self.formula or 'the formula'}>"

    def __reduce__(self) -> tuple:  # (made in a call's process: sent back by pickle)
        return Unverified, (self.formula, self.cached)


def _formula_text(formula: Any) -> str:
    text = getattr(formula, "text", formula)  # ArrayFormula keeps its formula in .text
    if not isinstance(text, str):
        return ""
    return text if text.startswith("=") else "=" + text


def _functions_named(formula: Any) -> list[str]:
    """The functions a formula calls, as written (``_xlfn.`` prefixes dropped), in order, once each."""
    text = _formula_text(formula)
    names: list[str] = []
    try:
        items = Tokenizer(text).items if text else []
    except Exception:  # noqa: BLE001 - a formula openpyxl cannot tokenize: none named
        items = []
    for token in items:
        if token.type == Token.FUNC and token.subtype == Token.OPEN:
            name = token.value[:-1].upper()
            for prefix in ("_XLFN._XLWS.", "_XLFN.", "_XLWS."):
                name = name.removeprefix(prefix)
            if name and name not in names:
                names.append(name)
    return names


def _formulas_and_cached(data: bytes, keys: set[CellKey]) -> dict[CellKey, tuple[str, Any]]:
    """``{key: (formula text, value cached in the file)}`` for the cells ``keys`` (``""`` for a
    cell without a formula; plain data: it may come from a call's process)."""
    wb = _open(data, data_only=False)
    try:
        texts = {key: _formula_text(value) for key, value in _read_values(wb, keys).items()}
    finally:
        wb.close()
    cached = _cached_values(data, keys)
    return {key: (texts.get(key, ""), cached.get(key)) for key in keys}


def _unverified_note(failed: dict[CellKey, str], method: str) -> str:
    """One note for the model's formula cells left without a value, naming the functions
    ``formulas`` lacks (else the first formula)."""
    known = set(_formulas_module().get_functions()) if method in ("auto", "formulas") else set()
    lacking: list[str] = []
    for key in sorted(failed):
        lacking += [n for n in _functions_named(failed[key]) if known and n not in known and n not in lacking]
    first = min(failed)
    where = f"{first[0]}!{first[1]}" + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else "")
    if lacking:
        why = f"the function(s) {', '.join(lacking)} cannot be computed with {method!r}"
    else:
        why = f"{failed[first] or 'its formula'} could not be computed with {method!r}"
    return (f"{len(failed)} formula cell(s) of the output workbook have no computed value ({where}): {why}; "
            "the values the model's workbook caches for them are not taken: they match only where the answer "
            "workbook holds the same formula and value")


def _compute(
    data: bytes,
    method: str,
    formats: dict[CellKey, str],
    epoch: dt.datetime,
    *,
    trust_empty_cache: bool = False,
    time_limit: float | None = None,
    in_call: bool = False,
    trust_cache: bool = True,
) -> tuple[dict[CellKey, Any], list[str]]:
    """Values for the formula cells ``formats`` (cell -> number format), and notes.

    A recalculation past ``time_limit`` seconds (:class:`TimeLimitExceeded`), with a range too
    large or past its memory (:class:`WorkbookTooLarge`, :class:`MemoryLimitExceeded`) raises: the
    workbook's own doing, never replaced by the values cached in it. With a ``time_limit`` it
    runs in a process killed at the deadline (``in_call``: this is that process, already); without
    one (the task's own answer), here.

    Falls back to the values cached in the file when the recalculation fails as a whole, and
    cell by cell where ``formulas`` answers ``#NAME?`` (a function it lacks) or ``#REF!`` (a
    formula it cannot parse, such as a table reference) and the file has a cached value. With
    ``trust_empty_cache`` an empty cache counts too: Excel-saved answer files store a formula
    that yields ``""`` as an empty value, which openpyxl cannot tell from no value.

    ``trust_cache=False`` (the model's workbook, graded): no fallback. A formula cell without a
    computed value gets :class:`Unverified` (it matches nothing), with a note naming the functions
    ``formulas`` lacks: the model can write any cached value itself. ``method="none"`` still reads
    the cached values (asked for: upstream's rule).
    """
    keys = set(formats)
    notes: list[str] = []
    if time_limit is not None and not in_call:  # the model's file: parsed again within the deadline
        cached_values = functools.partial(_cached_values_within, time_limit=time_limit)
        formulas_and_cached = functools.partial(run_in_process, _formulas_and_cached, time_limit=time_limit,
                                                what="reading the workbook's formulas")
    else:
        cached_values = _cached_values
        formulas_and_cached = None

    def unverified(failed: Iterable[CellKey]) -> dict[CellKey, Unverified]:
        failed = set(failed)
        read = formulas_and_cached(args=(data, failed)) if formulas_and_cached else _formulas_and_cached(data, failed)
        notes.append(_unverified_note({key: read[key][0] for key in failed}, method))
        return {key: Unverified(*read[key]) for key in failed}
    if method == "none":
        return cached_values(data, keys), notes
    try:
        if method == "libreoffice":
            return _libreoffice_values(data, keys, None if in_call else time_limit), notes
        if time_limit is None:  # the task's own answer workbook: trusted, computed here
            values, warnings = _formulas_values(data, keys)
        elif in_call:
            values, warnings = _formulas_values_within_memory(data, keys, time_limit)
        elif sys.platform == "linux":  # the model's formulas: in a process killed at the deadline
            values, warnings = _formulas_values_in_child(data, keys, time_limit)
        else:  # no prctl, no /proc: a thread given up at the deadline (one C call runs on)
            work = functools.partial(_formulas_values, data, keys, time_limit)
            values, warnings = run_with_deadline(work, time_limit, "the recalculation")
    except (TimeLimitExceeded, WorkbookTooLarge, RecalcUnavailable):
        raise
    except Exception as exc:
        if in_call and isinstance(exc, MemoryError):  # the call's process's limit: its caller says so
            raise
        if not trust_cache:
            notes.append(f"recalculation with {method!r} failed ({type(exc).__name__}: {str(exc)[:200]})")
            return unverified(keys), notes
        notes.append(
            f"recalculation with {method!r} failed ({type(exc).__name__}: {str(exc)[:200]}); "
            "used the values cached in the file"
        )
        return cached_values(data, keys), notes
    if warnings:
        more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
        notes.append(f"formulas package: {warnings[0][:200]}{more}")

    for key, fmt in formats.items():  # numbers in date-formatted cells are dates, as openpyxl reads
        value = values.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and is_date_format(fmt):
            try:
                values[key] = from_excel(value, epoch, timedelta=is_timedelta_format(fmt))
            except (ValueError, OverflowError):
                pass

    failed = [key for key in keys if key not in values or values[key] in _UNCOMPUTABLE]
    if failed and not trust_cache:
        values.update(unverified(failed))
    elif failed:
        cached = cached_values(data, set(failed))
        used = [key for key in failed if trust_empty_cache or cached.get(key) is not None]
        for key in used:
            values[key] = cached.get(key)
        if used:
            notes.append(f"{len(used)} formula cell(s) not recalculated: used cached values")
    return values, notes


def recalculate(
    workbook: Workbook, recalc: str = "auto", ranges: Iterable[tuple[str, str]] | None = None,
    time_limit: float | None = None,
) -> dict[CellKey, Any]:
    """``{(sheet, "A1"): value}`` for the formula cells of ``workbook`` (within ``ranges``,
    ``[(sheet, "A1:B3"), ...]``, when given; else everywhere), computed with ``recalc``.

    Values are what openpyxl would read from a file Excel had saved: numbers, strings, bools,
    datetimes for date-formatted cells, error strings such as ``"#DIV/0!"``, None for empty.
    When recalculation fails the values cached in the file are returned (None where absent);
    past ``time_limit`` seconds it raises :class:`TimeLimitExceeded`, and for a range too large
    even cut to the used area :class:`WorkbookTooLarge`. With a ``time_limit`` (the model's
    workbook) it is refused over :func:`check_workbook`'s limits (:class:`WorkbookTooLarge`), and
    all of it, checking and reading the workbook too, runs in a process killed at the deadline
    (:func:`run_in_process`): a file near those limits takes seconds to parse, whatever ``recalc``.
    LibreOffice runs here, under its own timeout, every parse of its input and output in such a
    process (:func:`_libreoffice_values`).
    """
    method = _check_recalc(recalc)
    data = _read_bytes(workbook)
    ranges = None if ranges is None else list(ranges)  # (sent to a call's process)
    if time_limit is None:  # the task's own workbook: trusted, read here
        return _recalculate(data, method, ranges, None)
    if method != "libreoffice" and sys.platform == "linux":
        reading = method == "none"
        return run_in_process(
            _recalculate, (data, method, ranges, time_limit, True), time_limit,
            "reading the workbook" if reading else "the recalculation",
            memory=None if reading else "the workbook's formulas need more than {} MB of memory to compute",
        )
    formats, epoch = run_in_process(_formula_cells, (data, ranges, True), time_limit, "reading the workbook")
    return _compute(data, method, formats, epoch, time_limit=time_limit)[0] if formats else {}


def _recalculate(
    data: bytes, method: str, ranges: list[tuple[str, str]] | None, time_limit: float | None,
    in_call: bool = False,
) -> dict[CellKey, Any]:
    """:func:`recalculate` of the workbook's bytes (``in_call``: the model's, in the call's process)."""
    formats, epoch = _formula_cells(data, ranges, check=in_call)
    if not formats:
        return {}
    return _compute(data, method, formats, epoch, time_limit=time_limit, in_call=in_call)[0]


def _formula_cells(
    data: bytes, ranges: list[tuple[str, str]] | None, check: bool = False
) -> tuple[dict[CellKey, str], dt.datetime]:
    """The number formats of the formula cells in ``ranges`` (None: every sheet's used area) and
    the workbook's epoch; ``check`` (the model's file): :func:`check_workbook` first. Plain data:
    it may come from a call's process."""
    if check:
        check_workbook(data)
    wb = _open(data, data_only=False)
    try:
        if ranges is None:  # every sheet, whole (not its dimension: finding it walks the grid)
            ranges = [(ws.title, None) for ws in wb.worksheets]
        return _formula_formats(wb, ranges), wb.epoch
    finally:
        wb.close()


def _formula_formats(
    wb: Any, ranges: Iterable[tuple[str, str | None]], only: set[CellKey] | None = None
) -> dict[CellKey, str]:
    """``{(sheet, cell): number format}`` for the formula cells in ``ranges`` (a range None: the
    whole sheet; and in ``only``), from the cells the sheets hold (:func:`_stored_cells`)."""
    formats = {}
    for sheet, rng in ranges:
        for coordinate, cell in _stored_cells(wb[sheet], rng):
            if _is_formula(cell) and (only is None or (sheet, coordinate) in only):
                formats[sheet, coordinate] = cell.number_format
    return formats

