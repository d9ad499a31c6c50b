"""The Excel grader: answer positions, SpreadsheetBench normalization, recalculation, grading.

Most tests run on the real SpreadsheetBench samples in ../shared/data/spreadsheetbench.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import random
import re
import stat
import sys
from pathlib import Path

import openpyxl
import pytest
from openpyxl.utils import get_column_letter, range_boundaries

from benchmax_gym.envs.excel import grading, recalc
from benchmax_gym.envs.excel.grading import GradeResult, grade, normalize, parse_answer_position
from benchmax_gym.envs.excel.recalc import RECALC_MODES, recalculate

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "spreadsheetbench"


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict]:
    if not (DATA / "dataset.json").is_file():
        pytest.skip(f"SpreadsheetBench samples not found at {DATA}")
    return {str(t["id"]): t for t in json.loads((DATA / "dataset.json").read_text())}


def _path(task: dict, case: int, kind: str) -> Path:
    return DATA / task["spreadsheet_path"] / f"{case}_{task['id']}_{kind}.xlsx"


def _cases(tasks: dict[str, dict]):
    for task in tasks.values():
        for case in (1, 2, 3):
            yield task, case


def _coordinates(rng: str) -> list[str]:
    min_col, min_row, max_col, max_row = range_boundaries(rng)
    return [f"{get_column_letter(c)}{r}" for r in range(min_row, max_row + 1)
            for c in range(min_col, max_col + 1)]


def _to_bytes(wb: openpyxl.Workbook) -> bytes:
    buffer = io.BytesIO()
    wb.save(buffer)
    return buffer.getvalue()


# --------------------------------------------------------------------------- answer positions


def test_every_real_answer_position_parses(tasks):
    for task, case in _cases(tasks):
        sheets = openpyxl.load_workbook(_path(task, case, "answer"), read_only=True).sheetnames
        ranges = parse_answer_position(task["answer_position"], sheets)
        assert ranges, task["id"]
        for sheet, rng in ranges:
            assert sheet in sheets, (task["id"], sheet)
            assert re.fullmatch(r"[A-Z]+[0-9]+:[A-Z]+[0-9]+", rng), (task["id"], rng)


def test_real_answer_positions_exactly(tasks):
    def parse(task_id: str) -> list[tuple[str, str]]:
        path = _path(tasks[task_id], 1, "answer")
        sheets = openpyxl.load_workbook(path, read_only=True).sheetnames
        return parse_answer_position(tasks[task_id]["answer_position"], sheets)

    assert parse("48799") == [("Sheet2", "Z2:Z2")]  # 'Sheet2'!Z2
    assert parse("50066") == [("Updated Data", "B5:B9")]  # Updated Data'!B5:B9 (one quote)
    assert parse("184-45") == [  # 'Sheet1!'A2:B19,'Sheet2!'A2:B19,'Sheet3!'A2:D11'
        ("Sheet1", "A2:B19"), ("Sheet2", "A2:B19"), ("Sheet3", "A2:D11")
    ]
    assert parse("79-7") == [("Sheet1", "A1:A4")]  # 'Sheet1'!A1:A4
    assert parse("37228") == [("Sheet1", "G2:G23")]  # no sheet: the first
    assert parse("39490") == [("Sheet1", "E1:E1")]  # a single cell
    assert parse("134-14") == [("Outstanding Recons", "A2:B8")]


@pytest.mark.parametrize(
    ("position", "sheets", "expected"),
    [
        ("C2", ["Data", "Other"], [("Data", "C2:C2")]),
        ("'Sheet2'!Z2", ["Sheet1", "Sheet2"], [("Sheet2", "Z2:Z2")]),
        (" 'sheet1 '!$a$1 : $b$3 ", ["Sheet1"], [("Sheet1", "A1:B3")]),  # case, spaces, $
        ("B3:A1", ["S"], [("S", "A1:B3")]),  # reversed corners
        ("'Données 2024'!A1:B2", ["Résumé", "Données 2024"], [("Données 2024", "A1:B2")]),
        ("'O''Brien'!A1", ["O'Brien"], [("O'Brien", "A1:A1")]),  # Excel's escaped quote
        ("'a,b'!A1,C3", ["x", "a,b"], [("a,b", "A1:A1"), ("x", "C3:C3")]),  # comma in a name
        ("Sheet1!!A1", ["Sheet1"], [("Sheet1", "A1:A1")]),  # doubled !
        ("'Q&A!'!A1", ["Q&A!"], [("Q&A!", "A1:A1")]),  # a ! in the name itself
        ("Sheet1!A1", [" Sheet1 "], [(" Sheet1 ", "A1:A1")]),  # the real name has spaces
        ("\u2018Sheet1\u2019!A1", ["Sheet1"], [("Sheet1", "A1:A1")]),  # curly quotes
    ],
)
def test_parse_answer_position_forms(position, sheets, expected):
    assert parse_answer_position(position, sheets) == expected


def test_parse_answer_position_errors():
    with pytest.raises(ValueError, match=r"'Missing'.*\['Sheet1', 'Sheet2'\]"):
        parse_answer_position("'Missing'!A1", ["Sheet1", "Sheet2"])
    with pytest.raises(ValueError, match="invalid cell range"):
        parse_answer_position("A:A", ["Sheet1"])
    with pytest.raises(ValueError, match="invalid cell range"):
        parse_answer_position("Sheet1!", ["Sheet1"])
    with pytest.raises(ValueError, match="empty"):
        parse_answer_position("  ", ["Sheet1"])


# --------------------------------------------------------------------------- normalization


def test_normalize_numbers_round_to_two_decimals():
    assert normalize(1.004) == normalize(1.0) == 1.0
    assert normalize(1.006) != normalize(1.0)
    assert normalize(3) == normalize(3.0) == 3.0 and isinstance(normalize(3), float)
    assert normalize("3.50") == normalize(3.5) == 3.5
    assert normalize(" 12 ") == 12.0  # float() accepts surrounding spaces, as upstream
    assert normalize("1e3") == 1000.0


def test_normalize_empty_bool_strings():
    assert normalize(None) == normalize("") == ""
    assert normalize(True) is True and normalize(False) is False
    assert type(normalize(True)) is not type(normalize(1))  # TRUE is not 1
    assert normalize("abc") == "abc"
    assert normalize("abc ") != normalize("abc")  # compared exactly, not stripped
    assert normalize("ABC") != normalize("abc")
    assert normalize(" ") == " " and normalize(" ") != normalize(None)
    assert normalize("nan") == "nan" and normalize("inf") == "inf"  # not numbers


def test_normalize_dates_and_times():
    serial = normalize(dt.datetime(2022, 11, 21))
    assert serial == 44886.0 == normalize(44886) == normalize(dt.date(2022, 11, 21))
    assert normalize(dt.datetime(2022, 11, 21, 9, 30)) == serial  # whole days, as upstream
    assert normalize(dt.datetime(1900, 1, 1)) == 1.0  # openpyxl's to_excel: Excel's 1900 serials
    assert normalize(dt.time(9, 5, 59)) == "09:05"
    assert normalize(dt.time(9, 5)) == normalize("09:05")
    assert normalize(dt.timedelta(hours=26, minutes=30)) == "26:30"


def test_normalize_numpy_scalars():
    np = pytest.importorskip("numpy")
    assert normalize(np.float64(2.004)) == 2.0
    assert normalize(np.int64(7)) == 7.0
    assert normalize(np.bool_(True)) is True


# --------------------------------------------------------------------------- grading real data


@pytest.mark.parametrize("which", (1, 2, 3))
def test_every_answer_grades_itself_perfectly(tasks, which):
    """Every task's answers, one case number per test (xdist runs the three at once)."""
    for task, case in _cases(tasks):
        if case != which:
            continue
        answer = _path(task, case, "answer")
        result = grade(answer, answer, task["answer_position"])
        assert isinstance(result, GradeResult)
        assert result.cells == 1.0 and result.solved, (task["id"], case, result)
        assert result.total == result.correct > 0 and not result.mismatches


def test_answer_formulas_recalculate_to_excels_values(tasks):
    """The formulas in these answers are recomputed (the output side), not read from Excel's
    cache, and still match the cached values the expected side reads."""
    for task_id in ("59259", "37228", "59902", "10452", "50811", "39490"):
        answer = _path(tasks[task_id], 1, "answer")
        sheets = openpyxl.load_workbook(answer, read_only=True).sheetnames
        ranges = parse_answer_position(tasks[task_id]["answer_position"], sheets)
        assert recalculate(answer, ranges=ranges), task_id  # there are formulas to recalculate
        result = grade(answer, answer, tasks[task_id]["answer_position"])
        assert result.solved and not result.notes, (task_id, result.notes)


def _clearly_differs(a, b) -> bool:
    """An independent, conservative difference test on raw openpyxl values."""
    if a in (None, "") and b in (None, ""):
        return False
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return abs(a - b) > 0.01
    return a != b


def test_inputs_do_not_solve_tasks(tasks):
    differing = same = 0
    for task, case in _cases(tasks):
        answer_path, input_path = _path(task, case, "answer"), _path(task, case, "input")
        answer = openpyxl.load_workbook(answer_path, data_only=True)
        given = openpyxl.load_workbook(input_path, data_only=True)
        ranges = parse_answer_position(task["answer_position"], answer.sheetnames)
        differs = any(
            sheet not in given.sheetnames
            or _clearly_differs(answer[sheet][c].value, given[sheet][c].value)
            for sheet, rng in ranges for c in _coordinates(rng)
        )
        result = grade(input_path, answer_path, task["answer_position"])
        if differs:
            differing += 1
            assert not result.solved and result.cells < 1.0, (task["id"], case)
            assert 0 < len(result.mismatches) <= grading.MAX_MISMATCHES
        else:  # a few inputs already hold the answer values (570-43; CF_8276 is about format)
            same += 1
            assert result.solved, (task["id"], case, result)
    assert differing >= 50, (differing, same)


def _as_formula(value, ws, coordinate: str, helper: str) -> str:
    """A formula evaluating to ``value``, using a helper cell so references are exercised."""
    if isinstance(value, bool):
        return "=1=1" if value else "=1=0"
    if isinstance(value, int | float):
        ws[helper] = 1
        return f"=SUM({helper},{value - 1!r})"
    if isinstance(value, dt.datetime):
        ws[coordinate].number_format = "yyyy-mm-dd hh:mm:ss"
        return f"=DATE({value.year},{value.month},{value.day})+TIME({value.hour},{value.minute},0)"
    if isinstance(value, dt.time):
        ws[coordinate].number_format = "hh:mm"
        return f"=TIME({value.hour},{value.minute},{value.second})"
    half = len(value) // 2
    return '="{}"&"{}"'.format(value[:half].replace('"', '""'), value[half:].replace('"', '""'))


@pytest.mark.parametrize(("task_id", "case"), [("184-45", 1), ("532-24", 2), ("79-7", 3)])
def test_answers_written_as_formulas_are_recalculated(tasks, task_id, case):
    task = tasks[task_id]
    answer_path = _path(task, case, "answer")
    answer = openpyxl.load_workbook(answer_path, data_only=True)
    output = openpyxl.load_workbook(_path(task, case, "input"))
    written = 0
    for sheet, rng in parse_answer_position(task["answer_position"], answer.sheetnames):
        ws = output[sheet]
        for coordinate in _coordinates(rng):
            value = answer[sheet][coordinate].value
            if value is None:
                ws[coordinate] = None
                continue
            col, row, _, _ = range_boundaries(coordinate)
            helper = f"{get_column_letter(100 + col)}{row}"  # far right of any answer range
            ws[coordinate] = _as_formula(value, ws, coordinate, helper)
            written += 1
    data = _to_bytes(output)  # openpyxl stores formulas without values: only recalculation helps
    assert written > 0

    result = grade(data, answer_path, task["answer_position"])
    assert result.solved and result.cells == 1.0, result
    cached_only = grade(data, answer_path, task["answer_position"], recalc="none")
    assert not cached_only.solved  # proves the values came from recalculation


def test_whole_column_references_are_fast_and_right(tmp_path):
    wb = openpyxl.Workbook()
    ws = wb.active
    for row, (name, amount) in enumerate([("a", 1), ("b", 2), ("a", 3), ("c", 4)], start=1):
        ws.cell(row, 1, name)
        ws.cell(row, 2, amount)
    formulas = {  # below the data: row 2 holds no formula, so SUM(2:2) is not circular
        "D6": ('=SUMIF($A:$A,"a",$B:$B)', 4),
        "D7": ("=SUM(B:B)/COUNT(B:B)", 2.5),
        "D8": ("=SUM(2:2)", 2),
        "D9": ("=TODAY()-TODAY()+DATE(2024,2,29)", dt.datetime(2024, 2, 29)),
        "D10": ("=1/0", "#DIV/0!"),
    }
    answer = openpyxl.Workbook()
    for coordinate, (formula, value) in formulas.items():
        ws[coordinate] = formula
        answer.active[coordinate] = value
    ws["D9"].number_format = "yyyy-mm-dd"
    values = recalculate(_to_bytes(wb))
    assert values[("Sheet", "D6")] == 4 and values[("Sheet", "D9")] == dt.datetime(2024, 2, 29)
    result = grade(_to_bytes(wb), _to_bytes(answer), "D6:D10")
    assert result.solved, result


# --------------------------------------------------------------------------- robustness


def test_corrupted_output_grades_zero(tasks, tmp_path):
    task = tasks["398-47"]
    answer = _path(task, 1, "answer")
    junk = random.Random(0).randbytes(4096)
    truncated = answer.read_bytes()[:2000]
    for output in (junk, truncated, tmp_path / "deleted.xlsx", tmp_path):
        result = grade(output, answer, task["answer_position"])
        assert result.cells == 0.0 and not result.solved and result.correct == 0
        assert result.total == 304
        assert any("could not be read" in note for note in result.notes), result.notes


def test_missing_sheet_counts_as_wrong(tasks):
    task = tasks["184-45"]
    answer_path = _path(task, 1, "answer")
    output = openpyxl.load_workbook(answer_path)
    del output["Sheet2"]
    result = grade(_to_bytes(output), answer_path, task["answer_position"])
    assert result.total == 36 + 36 + 40
    assert result.correct == 36 + 40 and not result.solved
    assert result.cells == pytest.approx(76 / 112)
    assert any("'Sheet2'" in note and "missing" in note for note in result.notes)
    assert result.mismatches[0][:2] == ("Sheet2", "A2") and result.mismatches[0][3] is None


def test_output_sheet_names_match_loosely_and_bytes_equal_paths(tasks):
    task = tasks["50066"]
    answer_path = _path(task, 1, "answer")
    output = openpyxl.load_workbook(answer_path)
    output["Updated Data"].title = "updated data "
    result = grade(_to_bytes(output), answer_path.read_bytes(), task["answer_position"])
    assert result.solved, result


def test_unparsable_formula_falls_back_without_raising():
    wb = openpyxl.Workbook()
    wb.active["A1"] = "=Table1[Amount]"  # a table reference formulas cannot parse; no cache
    wb.active["A2"] = "=2+2"
    answer = openpyxl.Workbook()
    answer.active["A2"] = 4
    result = grade(_to_bytes(wb), _to_bytes(answer), "A1:A2")
    assert result.correct == 1 and not result.solved  # A2 still recalculated; A1 has no computed value: no match
    assert any("Table1[Amount]" in note for note in result.notes), result.notes


def test_mismatches_are_capped_and_normalized():
    out, answer = openpyxl.Workbook(), openpyxl.Workbook()
    for row in range(1, 21):
        out.active.cell(row, 1, row)
        answer.active.cell(row, 1, row + 0.5)
    result = grade(_to_bytes(out), _to_bytes(answer), "A1:A20")
    assert result.cells == 0.0 and result.total == 20
    assert len(result.mismatches) == grading.MAX_MISMATCHES
    assert result.mismatches[0] == ("Sheet", "A1", 1.5, 1.0)


# --------------------------------------------------------------------------- recalc options


def test_bad_recalc_value_names_the_choices(tasks):
    answer = _path(tasks["39490"], 1, "answer")
    with pytest.raises(ValueError, match="auto.*libreoffice"):
        grade(answer, answer, "E1", recalc="excel")
    assert "auto" in RECALC_MODES and "libreoffice" in RECALC_MODES


def test_libreoffice_missing_is_a_clear_error(tasks, monkeypatch):
    monkeypatch.setattr(recalc.shutil, "which", lambda name: None)
    answer = _path(tasks["39490"], 1, "answer")
    with pytest.raises(RuntimeError, match="LibreOffice"):
        grade(answer, answer, "E1", recalc="libreoffice")
    with pytest.raises(RuntimeError, match="LibreOffice"):
        recalculate(answer, recalc="libreoffice")


@pytest.mark.skipif(sys.platform == "win32", reason="the fake soffice is a shell script")
def test_libreoffice_plumbing_with_a_fake_soffice(tmp_path, monkeypatch):
    """A stand-in ``soffice`` that 'converts' by copying a prepared result checks the command
    line and the reading of the converted file, whatever LibreOffice computes (test_libreoffice.py
    runs the real one)."""
    computed = openpyxl.Workbook()
    computed.active["A1"] = 42
    computed.save(tmp_path / "computed.xlsx")
    fake = tmp_path / "bin" / "soffice"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 1 ]; do [ "$1" = --outdir ] && out=$2; shift; done\n'
        f'cp "{tmp_path / "computed.xlsx"}" "$out/$(basename "$1")"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")

    output, answer = openpyxl.Workbook(), openpyxl.Workbook()
    output.active["A1"] = "=6*7"
    answer.active["A1"] = 42
    assert recalculate(_to_bytes(output), recalc="libreoffice") == {("Sheet", "A1"): 42}
    assert grade(_to_bytes(output), _to_bytes(answer), "A1", recalc="libreoffice").solved
