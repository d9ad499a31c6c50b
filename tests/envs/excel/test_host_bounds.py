"""Excel-v0's host-side work on a model's workbook stays bounded in time and memory, in proportion
to what the workbook really holds: one far cell, ranges hidden in R1C1, INDIRECT text or array
formulas, hyperlinks over millions of cells, worksheets under other names or in UTF-16, slow
formulas; and a save that fails leaves the workbook as it was."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import threading
import time
import zipfile

import gymnasium as gym
import openpyxl
import pytest
from openpyxl.worksheet.formula import ArrayFormula

import benchmax_gym
from benchmax_gym.core import files
from benchmax_gym.envs.excel import formulas_fixes, recalc
from benchmax_gym.envs.excel import tools as excel_tools
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import (
    TimeLimitExceeded,
    WorkbookTooLarge,
    _bound_formula,
    _bound_whole_references,
    check_workbook,
    recalculate,
    run_with_deadline,
)


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def to_bytes(wb) -> bytes:
    buffer = io.BytesIO()
    wb.save(buffer)
    return buffer.getvalue()


def small_book():
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet"
    ws["A1"], ws["A2"], ws["A3"] = 1, 2, 3
    return wb, ws


def small_env(tmp_path, **kwargs):
    """Excel-v0 on one task whose answer is 6 at Sheet!E1 (Sheet!A1:A3 holds 1, 2, 3)."""
    wb, ws = small_book()
    wb.save(tmp_path / "in.xlsx")
    ws["E1"] = 6
    wb.save(tmp_path / "answer.xlsx")
    spec = {"workbook": str(tmp_path / "answer.xlsx"), "position": "'Sheet'!E1"}
    task = benchmax_gym.Task("t", "Fill E1.", answer=spec, solution=spec, files={"workbook.xlsx": str(tmp_path / "in.xlsx")})
    env = gym.make("benchmax/Excel-v0", tasks=[task], python_tool=False, **kwargs)
    env.reset(seed=0)
    return env


@pytest.fixture
def small_limits(monkeypatch):
    """Ranges over 100 cells are cut to the used area; over 1,000 once cut, refused."""
    monkeypatch.setattr(recalc, "MAX_RANGE_CELLS", 100)
    monkeypatch.setattr(formulas_fixes, "MAX_LOADED_RANGE_CELLS", 1000)


# --------------------------------------------------------------------------- ranges


def test_bounding_walks_the_real_cells_not_the_grid():
    """``iter_rows`` over a loaded sheet made a cell per position of its used range: one value
    at F1048576 cost 6.3 million cells (18 s, 1.5 GB) before any formula was computed."""
    wb, ws = small_book()
    ws["B1"] = "=SUM(A:A)"
    ws.cell(row=50_000, column=3).number_format = "0.00"  # styled but empty: no data down there
    cells = len(ws._cells)
    _bound_whole_references(wb)
    assert len(ws._cells) == cells  # no cell was made
    assert ws["B1"].value == "=SUM(A$1:A$3)"  # cut to the data, not to the styled cell


def test_a_range_still_huge_once_cut_is_refused():
    # one value at XFD1048576 makes the used area the whole grid: nothing to cut
    with pytest.raises(WorkbookTooLarge, match="17179869184 cells even cut to the used area; the limit is"):
        _bound_formula("=SUM(A1:XFD1048576)", 1_048_576, 16_384)


def test_a_far_cell_makes_whole_columns_a_clear_zero(small_limits):
    wb, ws = small_book()
    ws["A5000"] = 1  # stretches A:A to 5,000 cells, over this test's cap of 1,000
    ws["E1"] = "=SUM(A:A)"
    answer, answer_ws = small_book()
    answer_ws["E1"] = 7
    with pytest.raises(WorkbookTooLarge, match=r"Sheet!E1: a formula refers to A\$1:A\$5000"):
        recalculate(to_bytes(wb), ranges=[("Sheet", "E1")])
    result = grade(to_bytes(wb), to_bytes(answer), "E1")
    assert result.cells == 0.0 and any("A$1:A$5000" in note and "limit" in note for note in result.notes), result.notes


def test_indirect_text_is_cut_like_a_range(small_limits):
    assert _bound_formula('=SUM(INDIRECT("Data!A1:Z200000"))', 10, 3) == '=SUM(INDIRECT("Data!A1:C10"))'
    assert _bound_formula('=SUM(INDIRECT("A:A"))', 10, 3) == '=SUM(INDIRECT("A$1:A$10"))'
    assert _bound_formula('=LEN("A1:Z200000")', 10, 3) == '=LEN("A1:Z200000")'  # text, not a range
    wb, ws = small_book()
    ws["E1"] = '=SUM(INDIRECT("A:A"))'
    assert recalculate(to_bytes(wb), ranges=[("Sheet", "E1")]) == {("Sheet", "E1"): 6}


@pytest.mark.parametrize("formula", ["=SUM(R1C1:R100C100)", "=SUM(A1:B2:Z500)", ArrayFormula("E1:Z500", "=1+1")],
                         ids=["r1c1", "compound", "array-formula"])
def test_ranges_the_text_cut_misses_are_refused_when_read(small_limits, formula):
    wb, ws = small_book()
    ws["E1"] = formula
    with pytest.raises(WorkbookTooLarge, match="cells even cut to the used area; the limit is 1000"):
        recalculate(to_bytes(wb), ranges=[("Sheet", "E1")])


def test_the_ranges_of_one_recalculation_are_bounded_in_all(monkeypatch):
    """Ranges under the cut are never cut: 40 formulas over their own 99,000-cell ranges held
    2.4 GB. Their cells together are bounded (here 500); one range used by many formulas counts once."""
    monkeypatch.setattr(formulas_fixes, "MAX_RANGES_CELLS", 500)
    wb, ws = small_book()
    for row in range(1, 11):
        ws[f"E{row}"] = "=SUM(F1:N10)"  # the same 90 cells ten times
    assert recalculate(to_bytes(wb), ranges=[("Sheet", "E1:E10")])[("Sheet", "E1")] == 0
    for row in range(1, 11):
        ws[f"E{row}"] = f"=SUM(F{row}:N{row + 9})"  # ten ranges of 90 cells: 900
    with pytest.raises(WorkbookTooLarge, match="ranges and arrays cover [0-9]+ cells in all .*; the limit is 500"):
        recalculate(to_bytes(wb), ranges=[("Sheet", "E1:E10")])
    answer, answer_ws = small_book()
    for row in range(1, 11):
        answer_ws[f"E{row}"] = 0
    result = grade(to_bytes(wb), to_bytes(answer), "E1:E10")
    assert result.cells == 0.0 and any("in all" in note and "limit is 500" in note for note in result.notes), result.notes


@pytest.mark.parametrize("formula, name", [
    ("=SUM(A1:A2000*TRANSPOSE(A1:A2000))", r"\*"), ("=SUM(IF(A1:A2000>0,TRANSPOSE(A1:A2000),0))", "IF"),
    ("=SUM(MMULT(A1:A2000,TRANSPOSE(A1:A2000)))", "MMULT"), ("=SUM(MUNIT(2000))", "MUNIT"),
    ("=SUM(MAKEARRAY(2000,2000,LAMBDA(r,c,r)))", "MAKEARRAY"), ("=SUM(EXPAND(A1,2000,2000,0))", "EXPAND"),
])
def test_an_array_too_large_is_refused_before_it_is_built(monkeypatch, formula, name):
    """One numpy operation on objects holds the GIL: ``MMULT`` of two 20,000-cell ranges ran 97 s
    and took 3.2 GB past a 3 s deadline. Results over the cap (here 10,000 cells) are refused
    from their arguments' shapes, before they are built; smaller ones are computed."""
    monkeypatch.setattr(formulas_fixes, "MAX_ARRAY_CELLS", 10_000)
    wb, ws = small_book()  # A1:A3 hold 1, 2, 3
    ws["E1"] = formula
    with pytest.raises(WorkbookTooLarge, match=f"a formula's {name} would make an array of 4000000 cells; "
                                               "the limit is 10000"):
        recalculate(to_bytes(wb), ranges=[("Sheet", "E1")])
    ws["E1"] = "=SUM(A1:A3*TRANSPOSE(A1:A3))"
    assert recalculate(to_bytes(wb), ranges=[("Sheet", "E1")]) == {("Sheet", "E1"): 36}


def test_the_arrays_cells_hold_count_toward_the_bound_in_all(monkeypatch):
    monkeypatch.setattr(formulas_fixes, "MAX_RANGES_CELLS", 100)
    wb, ws = small_book()
    ws["E1"] = "=A1:A3*TRANSPOSE(A1:A3)"  # 9 cells, spilled: held to the end of the recalculation
    assert recalculate(to_bytes(wb), ranges=[("Sheet", "E1")])[("Sheet", "E1")] == 1
    for row in range(1, 13):
        ws[f"E{row}"] = "=A1:A3*TRANSPOSE(A1:A3)"
    with pytest.raises(WorkbookTooLarge, match="ranges and arrays cover [0-9]+ cells in all .*an array of 9 cells"):
        recalculate(to_bytes(wb), ranges=[("Sheet", "E1:E12")])


# --------------------------------------------------------------------------- check_workbook


def repack(wb, change) -> bytes:
    """``wb`` saved, each part passed through ``change(name, data) -> (name, data)``."""
    src = zipfile.ZipFile(io.BytesIO(to_bytes(wb)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            name, data = change(info.filename, src.read(info))
            z.writestr(name, data)
    return out.getvalue()


SHEET = "xl/worksheets/sheet1.xml"


@pytest.mark.parametrize("extra", [
    b'<hyperlinks><hyperlink ref="A1:Z100000" location="Sheet!A1"/></hyperlinks>',
    b'<mergeCells count="1"><mergeCell ref="A:XFD"/></mergeCells>',
], ids=["hyperlink", "whole-column-merge"])
def test_ranges_openpyxl_fills_cell_by_cell_count_as_cells(extra):
    wb, _ = small_book()
    data = repack(wb, lambda name, xml: (name, xml.replace(b"</sheetData>", b"</sheetData>" + extra) if name == SHEET else xml))
    with pytest.raises(WorkbookTooLarge, match="limit of 300000"):
        check_workbook(data)


def test_comments_over_a_range_count_as_cells():
    wb, ws = small_book()
    ws["A1"].comment = openpyxl.comments.Comment("note", "me")
    data = repack(wb, lambda name, xml: (name, xml.replace(b'ref="A1"', b'ref="A1:Z100000"') if "comments" in name else xml))
    with pytest.raises(WorkbookTooLarge, match="limit of 300000"):
        check_workbook(data)


def big_sheet_book():
    wb = openpyxl.Workbook()
    for row in range(1, 201):
        wb.active.cell(row, 1, row)
    return wb


def moved_sheet(name, xml):
    """The worksheet at xl/data/s1.dat: openpyxl follows the workbook's relationships there."""
    if name == SHEET:
        return "xl/data/s1.dat", xml
    if name == "xl/_rels/workbook.xml.rels":
        return name, xml.replace(b"worksheets/sheet1.xml", b"data/s1.dat")
    if name == "[Content_Types].xml":
        return name, xml.replace(b'PartName="/xl/worksheets/sheet1.xml"', b'PartName="/xl/data/s1.dat"')
    return name, xml


def utf16_sheet(name, xml):
    if name == SHEET:
        return name, ('<?xml version="1.0" encoding="UTF-16"?>' + xml.decode()).encode("utf-16")
    return name, xml


@pytest.mark.parametrize("change", [moved_sheet, utf16_sheet], ids=["other-part-name", "utf-16"])
def test_every_worksheet_part_is_counted(monkeypatch, change):
    data = repack(big_sheet_book(), change)
    assert len(openpyxl.load_workbook(io.BytesIO(data)).active._cells) == 200  # openpyxl reads them all
    monkeypatch.setattr(recalc, "MAX_CELLS", 100)
    with pytest.raises(WorkbookTooLarge, match="limit of 100"):
        check_workbook(data)


# --------------------------------------------------------------------------- time


def test_run_with_deadline():
    assert run_with_deadline(lambda: 42, 5) == 42
    with pytest.raises(ZeroDivisionError):
        run_with_deadline(lambda: 1 / 0, 5)
    release, finished = threading.Event(), threading.Event()

    def wait_then_finish():
        release.wait(60)
        finished.set()

    with pytest.raises(TimeLimitExceeded, match="waiting took over 0.1 s"):
        run_with_deadline(wait_then_finish, 0.1, "waiting")
    assert not finished.is_set()  # given up while the work still waits: not after it
    release.set()
    assert finished.wait(60)  # (and the work, left to finish unwatched, does)


def workers_end(limit=5.0):
    """Whether every deadline worker thread ends within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while any(t.name == "excel-deadline" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not any(t.name == "excel-deadline" for t in threading.enumerate())


def chain(ws, n, column="H"):
    """``n`` formulas, each the next plus one: ~2 ms each to recalculate."""
    cells = {f"{column}{i}": f"={column}{i + 1}+1" for i in range(1, n + 1)}
    cells[f"{column}{n + 1}"] = 0
    if ws is not None:
        for coordinate, value in cells.items():
            ws[coordinate] = value
    return cells


def test_grading_gives_up_a_slow_recalculation():
    wb, ws = small_book()
    chain(ws, 1500)
    ws["E1"] = "=H1"
    answer, answer_ws = small_book()
    answer_ws["E1"] = 1500
    started = time.monotonic()
    result = grade(to_bytes(wb), to_bytes(answer), "E1", time_limit=0.2)
    # given up at the deadline: a grade that waited for the recalculation (~3 s) would have its
    # value, 1500, and solve the cell
    assert result.cells == 0.0 and any("took over 0.2 s" in note for note in result.notes), result.notes
    assert time.monotonic() - started < 60  # a hang guard
    assert workers_end(limit=1.0)  # the recalculation stopped itself too: it does not run on unwatched


def test_read_range_gives_up_a_slow_recalculation(tmp_path, monkeypatch):
    env = small_env(tmp_path, tool_timeout=0.3)
    obs, _, _, _, info = env.step(call("write_cells", sheet="Sheet", cells=chain(None, 1500)))
    assert info["error"] is None, obs
    recalculations = []
    monkeypatch.setattr(excel_tools, "recalculate", lambda *a, **k: recalculations.append(1) or recalculate(*a, **k))
    for _ in range(2):  # the second read is refused at once: the same work would overrun again
        started = time.monotonic()
        obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="H1"))
        # given up at the deadline: one that waited for the recalculation (~3 s) would show H1's value
        assert info["error"] == "tool_timeout" and "took over 0.3 s" in obs, obs
        assert time.monotonic() - started < 60  # a hang guard
    assert len(recalculations) == 1  # the second read did not recompute
    assert workers_end(limit=1.0)
    # the episode goes on: cut the chain short, and give its recalculation room (a read of it took
    # 0.19 s under load, the 0.3 s above being the deadline this case tests)
    env.unwrapped.episode.state["workbook"].timeout = 30
    cells = {**{f"H{i}": None for i in range(3, 1502)}, "H2": 5, "E1": "=SUM(A1:A3)"}
    obs, _, _, _, info = env.step(call("write_cells", sheet="Sheet", cells=cells))
    assert info["error"] is None, obs
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="E1:H1"))
    assert info["error"] is None and "E1: =SUM(A1:A3) -> 6" in obs and "H1: =H2+1 -> 6" in obs, obs


# --------------------------------------------------------------------------- saving


class _FullDisk:
    """``os`` for core.files, with a disk that fills up after the first 100 bytes written."""

    def __init__(self):
        self.written = 0

    def write(self, fd, data):
        if self.written >= 100:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, bytes(data[: 100 - self.written]))
        self.written += n
        return n

    def __getattr__(self, name):
        return getattr(os, name)


def test_a_failed_save_leaves_the_workbook_whole(tmp_path, monkeypatch):
    env = small_env(tmp_path)
    path = env.unwrapped.episode.state["workbook"].path
    os.chmod(path, 0o640)
    before = path.read_bytes()
    monkeypatch.setattr(files, "os", _FullDisk())
    obs, _, _, _, info = env.step(call("write_cells", sheet="Sheet", cells={"E1": 6}))
    assert info["error"] == "tool_error" and "could not be saved (No space left on device)" in obs, obs
    assert path.read_bytes() == before and os.listdir(path.parent) == [path.name]  # no partial file left
    monkeypatch.undo()
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="A1:E1"))
    assert info["error"] is None and "E1" not in obs
    _, _, _, _, info = env.step(call("write_cells", sheet="Sheet", cells={"E1": 6}))
    assert info["error"] is None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640  # the replaced file keeps its mode
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 1.0


# --------------------------------------------------------------------------- ranges the model gives


def test_a_backwards_range_reads_as_excel_reads_it(tmp_path):
    env = small_env(tmp_path)
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="B3:A1"))
    assert info["error"] is None and obs.splitlines() == ["<tool_response>", "A1: 1", "A2: 2", "A3: 3", "</tool_response>"], obs


# --------------------------------------------------------------------------- work one formula hides


@pytest.mark.parametrize("formula, name, cells", [
    ('=ROWS(TEXTSPLIT(REPT("a,",20)&REPT(";",20),",",";"))', "TEXTSPLIT", 441),
    ("=CUMIPMT(0.01,1000,1000,1,1000,0)", "CUMIPMT", 1000),
], ids=["textsplit", "cumipmt"])
def test_arrays_sized_by_their_values_are_refused_before_they_are_built(monkeypatch, formula, name, cells):
    """One 32,767-character text splits into 16,000 x 16,000 cells (64 million took 1.1 GB before
    the bound in all saw them); CUMIPMT lists every period (10^8 took 2.1 GB)."""
    monkeypatch.setattr(formulas_fixes, "MAX_ARRAY_CELLS", 100)
    wb, ws = small_book()
    ws["E1"] = formula
    with pytest.raises(WorkbookTooLarge, match=f"a formula's {name} would make an array of {cells} cells; the limit is 100"):
        recalculate(to_bytes(wb), ranges=[("Sheet", "E1")])
    ws["E1"] = '=INDEX(TEXTSPLIT("a,b;c,d",",",";"),2,2)'
    ws["E2"] = "=CUMIPMT(0.09/12,360,125000,13,14,0)"
    got = recalculate(to_bytes(wb), ranges=[("Sheet", "E1:E2")])
    assert got["Sheet", "E1"] == "d" and got["Sheet", "E2"] == pytest.approx(-1861.63, abs=0.01)


@pytest.mark.parametrize("formula, excel", [
    ("=FACT(170)", 7.257415615307999e306), ("=FACTDOUBLE(40)", 2.5510826561258285e24),
    ("=PERMUT(1000000000,1)", 1e9), ("=PERMUTATIONA(3,2)", 9), ("=FACTDOUBLE(-1)", 1),
    ("=FACT(1000000000)", "#NUM!"), ("=FACTDOUBLE(10000000000)", "#NUM!"),
    ("=PERMUT(1000000000,500)", "#NUM!"), ("=PERMUTATIONA(10,30000000)", "#NUM!"),
])
def test_numbers_past_a_float_are_num_errors_never_huge_integers(formula, excel):
    """Excel computes in floats: past 1.8e308 its answer is #NUM!. ``formulas`` built the exact
    integer, in one call that holds the GIL (FACT(3000000) ran over 60 s past a 3 s deadline;
    FACT(1E9) would run for days), and got FACT(170) and FACTDOUBLE(40) wrong."""
    wb, ws = small_book()
    ws["E1"] = formula
    got = recalculate(to_bytes(wb), ranges=[("Sheet", "E1")], time_limit=10)[("Sheet", "E1")]
    assert got == (excel if isinstance(excel, str) else pytest.approx(excel, rel=1e-12))


def test_a_backtracking_regular_expression_stops_at_the_deadline():
    """Python's ``re`` cannot be interrupted: this REGEXTEST would hold the interpreter, and so
    every thread of the worker, for days. It runs on the ``regex`` module with the deadline."""
    wb, ws = small_book()
    ws["E1"] = '=REGEXTEST(REPT("a",40)&"!","(a|aa)+b")'
    answer, answer_ws = small_book()
    answer_ws["E1"] = False
    result = grade(to_bytes(wb), to_bytes(answer), "E1", time_limit=0.2)
    assert result.cells == 0.0 and any("took over 0.2 s" in note for note in result.notes), result.notes
    assert workers_end(limit=1.0)


def test_regular_expressions_compute_as_excel_does():
    wb, ws = small_book()
    ws["E1"] = '=REGEXREPLACE("2024-03-01","(\\d+)-(\\d+)-(\\d+)","\\3/\\2/\\1")'
    ws["E2"] = '=REGEXEXTRACT("ab12cd","[0-9]+")'
    ws["E3"] = '=REGEXTEST("abc","B",1)'  # any part of the text, ignoring case (formulas matched at the start)
    ws["E4"] = '=LEN(REGEXREPLACE(REPT("a",200),"",REPT("x",200)))'  # 40,400 characters: past Excel's cap
    got = recalculate(to_bytes(wb), ranges=[("Sheet", "E1:E4")])
    assert [got["Sheet", f"E{i}"] for i in range(1, 5)] == ["01/03/2024", "12", True, "#VALUE!"]


@pytest.mark.parametrize("formula", [
    "=CONCAT({})", '=TEXTJOIN(",",1,{})', "=ARRAYTOTEXT(A1:A100)",
])
def test_text_from_many_cells_is_capped_before_it_is_built(formula):
    """``CONCAT(A1:A100,A1:A100,...)`` over long texts built the whole text before the cap: 32,767
    characters a cell times every cell of every range (gigabytes from a few thousand cells)."""
    import tracemalloc

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet"
    for row in range(1, 101):
        ws.cell(row, 1, "x" * 32767)
    ws["C1"] = formula.format(",".join(["A1:A100"] * 10))  # 32.8 million characters
    data = to_bytes(wb)
    tracemalloc.start()
    try:
        got = recalculate(data, ranges=[("Sheet", "C1")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == {("Sheet", "C1"): "#VALUE!"}
    assert peak < 20 * 2**20, peak


def shared_strings_book(cells: int, text: str) -> bytes:
    """A workbook whose ``cells`` cells all show one shared string (openpyxl writes inline strings;
    a model's code can write this)."""
    wb, _ = small_book()
    rows = b"".join(b'<row r="%d"><c r="B%d" t="s"><v>0</v></c></row>' % (i, i) for i in range(1, cells + 1))
    sst = (b'<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" count="1" uniqueCount="1">'
           b"<si><t>" + text.encode() + b"</t></si></sst>")

    def change(name, xml):
        if name == SHEET:
            return name, xml.replace(b"<sheetData>", b"<sheetData>" + rows).replace(b'<row r="1">', b'<row r="1000000">', 1)
        if name == "xl/_rels/workbook.xml.rels":
            return name, xml.replace(b"</Relationships>", b'<Relationship Id="rIdS" Target="sharedStrings.xml" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings"/></Relationships>')
        if name == "[Content_Types].xml":
            return name, xml.replace(b"</Types>", b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>')
        return name, xml

    data = repack(wb, change)
    out = io.BytesIO(data)
    with zipfile.ZipFile(out, "a") as z:
        z.writestr("xl/sharedStrings.xml", sst)
    return out.getvalue()


def test_shared_strings_count_once_for_every_cell_that_shows_them():
    """openpyxl writes a copy of a shared string into every cell that shows it when it saves (the
    recalculation saves, and so does write_cells): 20,000 cells showing one 32,767-character
    string, a 112 KB file, took 26 s and 876 MB to recalculate."""
    small = shared_strings_book(3, "hello")
    check_workbook(small)
    assert [c.value for c in openpyxl.load_workbook(io.BytesIO(small))["Sheet"]["B"][:3]] == ["hello"] * 3
    with pytest.raises(WorkbookTooLarge, match="shared strings, written out in every cell that shows them"):
        check_workbook(shared_strings_book(3000, "x" * 32767))


@pytest.mark.parametrize("formula, excel", [("=1E3+1", 1001), ("=1.5e3*2", 3000), ("=2*1E+3", 2000), ("=1E-3", 0.001)])
def test_a_number_written_with_an_exponent_and_no_sign_is_read_as_excel_reads_it(formula, excel):
    """Excel reads 1E3 as 1000; ``formulas`` only read 1E+3, so a correct =1E3+1 had no value and
    was graded wrong."""
    wb, ws = small_book()
    ws["E1"] = formula
    assert recalculate(to_bytes(wb), ranges=[("Sheet", "E1")], time_limit=10)[("Sheet", "E1")] == pytest.approx(excel)
