"""Opening the model's workbook cannot outlive its deadline: within check_workbook's limits a file
of a million fonts (or rows, names, shared strings) takes openpyxl 30 s and 2 GB to parse, so the
tools and the grader parse the model's files in a process killed at the deadline and bounded in
memory, as its formulas are recalculated (test_recalc_deadline.py)."""

from __future__ import annotations

import io
import threading
import zipfile

import openpyxl
import pytest

from benchmax_gym.core.tools import ToolError
from benchmax_gym.envs.excel import recalc
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import check_workbook
from benchmax_gym.envs.excel.tools import WorkbookFile
from tests.envs.excel.test_recalc_deadline import nothing_runs_on, to_bytes

STYLES = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    '<styleSheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
    '<fonts count="{n}">{fonts}</fonts>'
    '<fills count="2"><fill><patternFill/></fill><fill><patternFill patternType="gray125"/></fill></fills>'
    '<borders count="1"><border><left/><right/><top/><bottom/><diagonal/></border></borders>'
    '<cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0"/></cellStyleXfs>'
    '<cellXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" xfId="0"/></cellXfs></styleSheet>'
)


def plain() -> bytes:
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    wb.active["A1"] = 1
    return to_bytes(wb)


def with_fonts(n: int) -> bytes:
    """:func:`plain` with ``n`` fonts: one cell, yet ~25 us and ~1.4 KB a font to parse."""
    fonts = "".join(f'<font><sz val="{i % 400 + 1}"/><name val="f{i}"/></font>' for i in range(n))
    source = zipfile.ZipFile(io.BytesIO(plain()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for part in source.infolist():
            xml = STYLES.format(n=n, fonts=fonts) if part.filename == "xl/styles.xml" else source.read(part)
            archive.writestr(part.filename, xml)
    data = out.getvalue()
    check_workbook(data)  # within the limits: only its parse can bound it
    return data


@pytest.fixture(scope="module")
def slow() -> bytes:
    return with_fonts(200_000)  # ~5 s to parse


def opened(tmp_path, timeout: float) -> WorkbookFile:
    """The episode's workbook, its task's file loaded: the next file is the model's."""
    (tmp_path / "workbook.xlsx").write_bytes(plain())
    workbook = WorkbookFile(tmp_path / "workbook.xlsx", timeout=timeout)
    workbook.book()
    return workbook


def test_a_workbook_slow_to_parse_is_a_tool_timeout_and_leaves_nothing_running(tmp_path, slow):
    workbook = opened(tmp_path, timeout=0.5)
    recalc._the_worker()  # started (once) outside any deadline
    (tmp_path / "workbook.xlsx").write_bytes(slow)
    threads = set(threading.enumerate())
    with pytest.raises(ToolError) as raised:
        workbook.book()
    assert raised.value.code == "tool_timeout", raised.value
    assert "opening workbook.xlsx took over 0.5 s; make it smaller" in str(raised.value)
    nothing_runs_on(threads)  # HEAD: its parse thread ran on for seconds
    # the model replaces the file again: it opens, as it would have in process
    workbook.timeout = 60  # (its parse, in the worker, is not instant on a loaded machine)
    (tmp_path / "workbook.xlsx").write_bytes(plain())
    assert workbook.book()["Sheet"]["A1"].value == 1


def test_a_workbook_too_large_to_parse_is_workbook_too_large(tmp_path, monkeypatch):
    data = with_fonts(60_000)  # ~85 MB parsed
    workbook = opened(tmp_path, timeout=60)
    monkeypatch.setattr(recalc, "RECALC_MEMORY_BYTES", 30 * 2**20)
    (tmp_path / "workbook.xlsx").write_bytes(data)
    threads = set(threading.enumerate())
    with pytest.raises(ToolError) as raised:
        workbook.book()
    assert raised.value.code == "workbook_too_large", raised.value
    assert "workbook.xlsx is too large to open" in str(raised.value) and "30 MB of memory" in str(raised.value)
    nothing_runs_on(threads)


def test_a_workbook_that_does_not_parse_says_why_as_before(tmp_path):
    """openpyxl's error, under its own name, from the call's process."""
    source = zipfile.ZipFile(io.BytesIO(plain()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for part in source.infolist():
            archive.writestr(part.filename, b"<workbook" if part.filename == "xl/workbook.xml" else source.read(part))
    broken = out.getvalue()
    with pytest.raises(Exception) as direct:
        openpyxl.load_workbook(io.BytesIO(broken))
    workbook = opened(tmp_path, timeout=30)
    (tmp_path / "workbook.xlsx").write_bytes(broken)
    with pytest.raises(ToolError) as raised:
        workbook.book()
    assert str(raised.value) == f"workbook.xlsx cannot be opened: {type(direct.value).__name__}: {direct.value}"


def test_the_grader_gives_up_reading_a_slow_workbook_at_its_time_limit(slow):
    recalc._the_worker()
    threads = set(threading.enumerate())
    result = grade(slow, plain(), "A1", time_limit=0.5)
    assert result.cells == 0.0 and not result.solved, result  # HEAD: read it all, graded 1.0
    assert any("reading the workbook took over 0.5 s" in note for note in result.notes), result.notes
    nothing_runs_on(threads)
    assert grade(plain(), plain(), "A1", time_limit=30).solved  # and the next one is read
