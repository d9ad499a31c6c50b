"""Excel-v0 formulas end to end: what the grader's recalculation computes for formulas a model
writes with ``write_cells``, external references, Excel's text cap, times, and read_range values."""

from __future__ import annotations

import datetime as dt
import json
import tempfile

import gymnasium as gym
import openpyxl
import pytest

import benchmax_gym
from benchmax_gym.envs.excel.grading import parse_answer_position
from benchmax_gym.testing import play

DATA = {  # Sheet1 of every custom task: A region, B sales, C region again, D a date
    "A1": "North", "A2": "South", "A3": "North", "A4": "East",
    "B1": 10, "B2": 20, "B3": 30, "B4": 40,
    "C1": "North", "C2": "North", "C3": "South", "C4": "East",
    "D1": dt.datetime(2024, 3, 1),
}


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def one_cell_env(tmp_path, answer, position="E1", **kwargs):
    """Excel-v0 on one task: Sheet1 holds DATA; the answer workbook holds ``answer`` at ``position``."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet1"
    for coordinate, value in DATA.items():
        ws[coordinate] = value
    wb.save(tmp_path / "in.xlsx")
    ws[position] = answer
    wb.save(tmp_path / "answer.xlsx")
    spec = {"workbook": str(tmp_path / "answer.xlsx"), "position": f"'Sheet1'!{position}"}
    task = benchmax_gym.Task("t", f"Fill {position}.", answer=spec, solution=spec, files={"workbook.xlsx": str(tmp_path / "in.xlsx")})
    env = gym.make("benchmax/Excel-v0", tasks=[task], python_tool=False, **kwargs)
    env.reset(seed=0)
    return env


def grade_formula(env, formula, cell="E1"):
    obs, _, _, _, info = env.step(call("write_cells", sheet="Sheet1", cells={cell: formula}))
    assert info["error"] is None, obs
    _, reward, terminated, _, _ = env.step("done")
    assert terminated
    return reward


# --------------------------------------------------------------------------- common idioms

# Excel's documented results for these inputs (the shared SpreadsheetBench sample has no cached
# value for SUMPRODUCT, COUNTIFS or XLOOKUP formulas; the real ones are tested below).
IDIOMS = [
    ("=SUMPRODUCT(--(A1:A4=C1:C4),B1:B4)", 50),
    ('=SUMPRODUCT(--(A1:A4="North"))', 2),
    ('=SUMPRODUCT(--(A1:A4="North"),--(B1:B4>15))', 1),
    ('=SUMPRODUCT((A1:A4="North")*B1:B4)', 40),
    ("=--TRUE", 1),
    ('=-+-(A1="North")', 1),
    ('=+(A1="North")', True),  # unary plus is no conversion in Excel
    ('=COUNTIFS(A1:A4,"North",B1:B4,">15")', 1),
    ('=SUMIFS(B1:B4,A1:A4,"North")', 40),
    ('=INDEX(B1:B4,MATCH("East",A1:A4,0))', 40),
    ('=XLOOKUP("South",A1:A4,B1:B4)', 20),
    ('=IFERROR(MATCH("West",A1:A4,0),"none")', "none"),
    ('=TEXT(D1,"yyyy-mm-dd")', "2024-03-01"),
    ("=DATE(2024,1,31)+30", 45352),  # 2024-03-01 as a serial day (General format)
    ("=D1-DATE(2024,1,1)", 60),
    ("=EOMONTH(D1,0)", 45382),  # 2024-03-31
]


@pytest.mark.parametrize("formula, excel", IDIOMS, ids=[f for f, _ in IDIOMS])
def test_common_idioms_score_as_excel_computes_them(tmp_path, formula, excel):
    assert grade_formula(one_cell_env(tmp_path, excel), formula) == 1.0


@pytest.mark.parametrize("task_id", ["sb-59259-1", "sb-59259-2", "sb-59259-3", "sb-39490-2", "sb-39490-3"])
def test_real_answer_formulas_written_by_a_model_match_excels_cached_values(shared_data, task_id):
    """SUMIFS with EOMONTH date criteria and INDEX/MATCH(ROUND): the answer workbook's own formulas,
    written with write_cells, grade against the values Excel cached in that workbook."""
    env = gym.make("benchmax/Excel-v0", tasks="spreadsheetbench", task_args={"dataset": str(shared_data / "spreadsheetbench")}, python_tool=False)
    tasks = env.unwrapped.tasks
    index = next(i for i in range(len(tasks)) if tasks[i].id == task_id)
    env.reset(options={"task_index": index})
    answer = env.unwrapped.episode.task.solution
    wb = openpyxl.load_workbook(answer["workbook"])
    formulas = 0
    for sheet, rng in parse_answer_position(answer["position"], wb.sheetnames):
        cells = {}
        for row in wb[sheet][rng]:
            for cell in row:
                value = cell.value
                if isinstance(value, str) and value.startswith("="):
                    formulas += 1
                elif isinstance(value, dt.datetime):
                    value = value.isoformat()
                cells[cell.coordinate] = value
        obs, _, _, _, info = env.step(call("write_cells", sheet=sheet, cells=cells))
        assert info["error"] is None, obs
    assert formulas
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 1.0


# --------------------------------------------------------------------------- external references


SECRET = 987654321


@pytest.fixture
def host_secret(tmp_path, monkeypatch):
    """A workbook on the host next to the grader's temporary directory (``../[secret.xlsx]``)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the grader's scratch dirs go here
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet1"
    wb.active["A1"] = SECRET
    wb.save(tmp_path / "secret.xlsx")
    return tmp_path / "secret.xlsx"


@pytest.mark.parametrize("formula", [
    "='../[secret.xlsx]Sheet1'!A1",
    "='{dir}/[secret.xlsx]Sheet1'!A1",
    "=[1]Sheet1!A1",
    "=SUM('..\\[secret.xlsx]Sheet1'!A1:A2)",
])
def test_write_cells_refuses_references_to_other_workbooks(tmp_path, host_secret, formula):
    env = one_cell_env(tmp_path, SECRET)
    obs, _, terminated, _, info = env.step(call("write_cells", sheet="Sheet1", cells={"E1": formula.format(dir=tmp_path)}))
    assert info["error"] == "tool_error" and "another workbook" in obs and not terminated
    _, reward, *_ = env.step("done")
    assert reward == 0.0


@pytest.mark.parametrize("formula", ["'../[secret.xlsx]Sheet1'!A1", "'{dir}/[secret.xlsx]Sheet1'!A1"])
def test_grader_never_follows_external_references_already_in_the_workbook(tmp_path, host_secret, formula):
    """As run_python (or a task's own file) could leave them: the recalculation loads no other file."""
    env = one_cell_env(tmp_path, SECRET)
    path = env.unwrapped.episode.state["workbook"].path
    wb = openpyxl.load_workbook(path)
    wb["Sheet1"]["E1"] = "=" + formula.format(dir=tmp_path)
    wb["Sheet1"]["F1"] = "=E1+0"
    wb.save(path)
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 0.0


def test_grader_never_follows_external_link_parts(tmp_path, host_secret):
    """``[1]Sheet1!A1`` resolved through an externalLink part naming ../secret.xlsx."""
    from openpyxl.workbook.external_link.external import ExternalLink, ExternalBook
    from openpyxl.packaging.relationship import Relationship

    env = one_cell_env(tmp_path, SECRET)
    path = env.unwrapped.episode.state["workbook"].path
    wb = openpyxl.load_workbook(path)
    link = ExternalLink(externalBook=ExternalBook(id="rId1"))
    link.file_link = Relationship(Type="externalLinkPath", Target="../secret.xlsx", TargetMode="External", Id="rId1")
    wb._external_links.append(link)
    wb["Sheet1"]["E1"] = "=[1]Sheet1!A1"
    wb.save(path)
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 0.0


# --------------------------------------------------------------------------- Excel's text cap


@pytest.mark.parametrize("formula, excel", [
    ('=LEN(REPT(REPT("x",300),300))', "#VALUE!"),  # 90,000 characters: past Excel's 32,767
    ('=LEN(REPT("x",32767))', 32767),
    ('=LEN(REPT("x",32768))', "#VALUE!"),
    ('=LEN(REPT("x",20000)&REPT("y",20000))', "#VALUE!"),
    ('=LEN(CONCAT(REPT("x",20000),REPT("y",20000)))', "#VALUE!"),
    ('=LEN(SUBSTITUTE(REPT("x",30000),"x","yy"))', "#VALUE!"),
    ('=LEN(SUBSTITUTE(REPT("x",300),"x","yy"))', 600),
])
def test_text_results_stop_at_excels_cap(tmp_path, formula, excel):
    assert grade_formula(one_cell_env(tmp_path, excel), formula) == 1.0


def test_huge_text_formula_is_cheap_to_grade(tmp_path):
    """Building the 900-million-character string took ~1 GB and seconds before the cap."""
    import resource
    import time

    env = one_cell_env(tmp_path, "#VALUE!")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    assert grade_formula(env, '=LEN(REPT(REPT("x",30000),30000))') == 1.0
    assert time.perf_counter() - start < 60
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: < 200 MB more


def test_huge_ranges_are_cut_to_the_used_area(tmp_path):
    """``formulas`` held ~300 bytes per cell of a range: 800,000 cells took ~1.7 GB and seconds."""
    import resource

    env = one_cell_env(tmp_path, 3000)  # 10^2 + 20^2 + 30^2 + 40^2; C holds text, counted as 0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert grade_formula(env, "=SUMPRODUCT(B1:C400000,B1:C400000)") == 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB


# --------------------------------------------------------------------------- times


@pytest.mark.parametrize("text, excel", [
    ("9:30", dt.time(9, 30)),
    ("17:45:10", dt.time(17, 45, 10)),
    ("2024-03-01 09:30", dt.datetime(2024, 3, 1, 9, 30)),
    ("36:15:00", dt.timedelta(hours=36, minutes=15)),
])
def test_write_cells_enters_times_and_datetimes(tmp_path, text, excel):
    env = one_cell_env(tmp_path, excel)
    assert grade_formula(env, text) == 1.0
    value = openpyxl.load_workbook(env.unwrapped.episode.state["workbook"].path)["Sheet1"]["E1"].value
    assert value == excel and type(value) is type(excel)


def test_a_time_kept_as_text_is_not_a_time(tmp_path):
    env = one_cell_env(tmp_path, dt.time(9, 30))
    assert grade_formula(env, "'9:30") == 0.0


@pytest.mark.parametrize("answer", [
    dt.time(9, 30),
    dt.time(23, 59, 59),
    dt.datetime(2024, 3, 1, 17, 5),
    dt.timedelta(hours=1, minutes=30),
    dt.timedelta(hours=49, minutes=5),
    "9:30",  # text that looks like a time stays text
])
def test_solver_solves_answers_with_time_cells(tmp_path, answer):
    env = one_cell_env(tmp_path, answer, position="E2")
    assert play(env, seed=0).reward == 1.0


# --------------------------------------------------------------------------- read_range


def test_read_range_shows_the_values_of_formulas_written_in_the_episode(tmp_path):
    env = one_cell_env(tmp_path, 50)
    env.step(call("write_cells", sheet="Sheet1", cells={
        "E1": "=SUMPRODUCT(--(A1:A4=C1:C4),B1:B4)", "E2": "=B1/0", "E3": '=A1&"!"', "E4": "=D1+1", "E5": '=""'}))
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet1", range="E1:E5"))
    assert info["error"] is None
    assert "E1: =SUMPRODUCT(--(A1:A4=C1:C4),B1:B4) -> 50" in obs
    assert "E2: =B1/0 -> #DIV/0!" in obs
    assert "E3: =A1&\"!\" -> North!" in obs
    assert "E4: =D1+1 -> 45353" in obs
    assert "E5: =\"\" -> ''" in obs
    assert "not yet calculated" not in obs
    env.step(call("write_cells", sheet="Sheet1", cells={"B4": 1000}))  # a change shows at once
    obs, *_ = env.step(call("read_range", sheet="Sheet1", range="E1"))
    assert "-> 1010" in obs



@pytest.mark.parametrize("case, sheet, cell, shown", [
    ("39490/1_39490_input.xlsx", "Sheet1", "E1", "E1: {=INDEX($F$4:$F$6,MATCH($B$1,$E$4:$E$6,0),0)} over E1 -> #N/A"),
    ("48799/1_48799_input.xlsx", "Sheet2", "B1", "B1: {=TRANSPOSE(Sheet1!A2:A25)} over B1:Y1 -> A"),
])
def test_read_range_shows_spreadsheetbench_array_formulas_and_their_values(shared_data, case, sheet, cell, shown):
    """(read_range showed them as "<openpyxl.worksheet.formula.ArrayFormula object at 0x...>", no value.)"""
    import shutil
    import types
    from pathlib import Path

    from benchmax_gym.core.tools import Toolset
    from benchmax_gym.envs.excel.tools import WorkbookFile, read_range

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(shared_data / "spreadsheetbench" / "spreadsheet" / case, Path(tmp) / "workbook.xlsx")
        episode = types.SimpleNamespace(state={"workbook": WorkbookFile(Path(tmp) / "workbook.xlsx", timeout=30)})
        result = Toolset([read_range]).run("read_range", {"sheet": sheet, "range": cell}, episode=episode, timeout=30,
                                           max_chars=4000)
    assert result.error is None and result.content == shown

def test_read_range_shows_external_references_as_errors(tmp_path, host_secret):
    env = one_cell_env(tmp_path, SECRET)
    path = env.unwrapped.episode.state["workbook"].path
    wb = openpyxl.load_workbook(path)
    wb["Sheet1"]["E1"] = "='../[secret.xlsx]Sheet1'!A1"
    wb["Sheet1"]["F1"] = "=E1+0"
    wb.save(path)
    obs, *_ = env.step(call("read_range", sheet="Sheet1", range="E1:F1"))
    assert str(SECRET) not in obs and obs.count("#REF!") == 2


def test_workbooks_for_libreoffice_lose_their_external_references(tmp_path):
    """recalc="libreoffice" gets a copy without external references (test_libreoffice.py runs the real one)."""
    import io
    import zipfile

    from openpyxl.packaging.relationship import Relationship
    from openpyxl.workbook.defined_name import DefinedName
    from openpyxl.workbook.external_link.external import ExternalBook, ExternalLink

    from benchmax_gym.envs.excel.recalc import _without_external_references

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet1"
    link = ExternalLink(externalBook=ExternalBook(id="rId1"))
    link.file_link = Relationship(Type="externalLinkPath", Target="../secret.xlsx", TargetMode="External", Id="rId1")
    wb._external_links.append(link)
    ws["A1"], ws["A2"], ws["A3"], ws["A4"] = 5, "=[1]Sheet1!A1", "='../[secret.xlsx]Sheet1'!A1+A1", "=A1*2"
    wb.defined_names["Leak"] = DefinedName("Leak", attr_text="'../[secret.xlsx]Sheet1'!$A$1")
    buffer = io.BytesIO()
    wb.save(buffer)
    assert any("externalLink" in n for n in zipfile.ZipFile(buffer).namelist())

    cleaned = _without_external_references(buffer.getvalue())
    assert not any("externalLink" in n for n in zipfile.ZipFile(io.BytesIO(cleaned)).namelist())
    out = openpyxl.load_workbook(io.BytesIO(cleaned))
    assert [c.value for c in out["Sheet1"]["A"]] == [5, "=#REF!", "=#REF!", "=A1*2"]
    assert "Leak" not in out.defined_names
    plain = io.BytesIO()
    openpyxl.Workbook().save(plain)
    assert _without_external_references(plain.getvalue()) == plain.getvalue()  # untouched: no copy
