"""Excel-v0 never pays for a value cached in the model's workbook that nobody computed.

An xlsx formula cell carries the value last computed for it (``<f>...</f><v>42</v>``). The model
can write that file itself (``run_python`` has openpyxl and zipfile), so for the output workbook
the grader uses only values it computed: a formula it cannot compute (a function ``formulas``
lacks) does not match, with a note naming the function. The task's answer workbook is ours: its
cached values stay trusted."""

from __future__ import annotations

import io
import json

import gymnasium as gym
import openpyxl
import pytest

import benchmax_gym
from benchmax_gym.envs.excel.grading import correct_cells, expected_values, grade
from tests.envs.excel.test_pictures_and_saves import with_cached_formula


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def answer_book(value=42) -> bytes:
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    wb.active["A1"] = value
    buffer = io.BytesIO()
    wb.save(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("time_limit", [30, None])
def test_a_formula_the_grader_cannot_compute_is_not_paid_its_cached_value(time_limit):
    """``=NOSUCHFN(1)`` saved with 42, against an answer of 42: HEAD graded it solved by the 42 in
    the file. Now the cell does not match, and the note names the function."""
    output = with_cached_formula("=NOSUCHFN(1)", "42")
    result = grade(output, answer_book(), "A1", time_limit=time_limit)
    assert not result.solved and result.correct == 0, result
    assert any("NOSUCHFN" in note and "not taken" in note for note in result.notes), result.notes
    assert correct_cells(output, answer_book(), "A1", time_limit=time_limit) == (set(), 1)  # the dense signal too


def test_an_uncomputable_formula_never_matches_an_empty_answer_cell():
    """No computed value is not an empty value: a formula the grader cannot parse (a table
    reference), with no value saved, against an answer cell left empty. HEAD gave it None, which
    equalled the empty cell: solved."""
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    wb.active["A1"] = "=Data[Cost]"
    buffer = io.BytesIO()
    wb.save(buffer)
    answer = answer_book(None)
    assert expected_values(answer, "A1") == [("Sheet", "A1", "")]
    result = grade(buffer.getvalue(), answer, "A1")
    assert not result.solved and any("=Data[Cost]" in note for note in result.notes), result


def test_a_computed_formula_is_graded_by_its_value_not_the_cached_one():
    """A formula the grader computes is paid by what it computes, whatever value the file claims."""
    assert grade(with_cached_formula("=6*7", "41"), answer_book(), "A1").solved
    assert not grade(with_cached_formula("=6*6", "42"), answer_book(), "A1").solved


def test_the_answer_workbooks_cached_values_stay_trusted():
    """The answer workbook is the task's: a formula there that ``formulas`` cannot compute keeps the
    value Excel saved, and an output holding that value is solved."""
    answer = with_cached_formula("=NOSUCHFN(1)", "42")
    assert expected_values(answer, "A1") == [("Sheet", "A1", 42.0)]
    assert grade(answer_book(42), answer, "A1").solved


def test_the_answer_workbooks_own_formula_and_value_are_taken_in_the_output():
    """An output cell holding the answer workbook's own uncomputable formula with the value Excel
    cached for it there (the answer graded against itself, as the SpreadsheetBench audit does) is
    graded by that value; the same formula claiming another value is not."""
    answer = with_cached_formula("=NOSUCHFN(1)", "42")
    assert grade(answer, answer, "A1").solved
    assert not grade(with_cached_formula("=NOSUCHFN(1)", "43"), answer, "A1").solved


def test_recalc_none_still_grades_the_values_saved_in_the_file():
    """``recalc="none"`` is upstream's rule, asked for: the values saved in the file are the answer."""
    assert grade(with_cached_formula("=NOSUCHFN(1)", "42"), answer_book(), "A1", recalc="none").solved


def test_a_model_that_writes_the_cached_value_with_run_python_earns_nothing(tmp_path):
    """Through the env: the model's code rewrites the workbook's XML to cache 42 under a formula the
    grader cannot compute. The episode is scored (not an env_error: the sample stays in training),
    with reward 0 and a grade note naming the function."""
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    wb.active["B1"] = 1
    wb.save(tmp_path / "in.xlsx")
    (tmp_path / "answer.xlsx").write_bytes(answer_book())
    spec = {"workbook": str(tmp_path / "answer.xlsx"), "position": "'Sheet'!A1"}
    task = benchmax_gym.Task("t", "Fill A1.", answer=spec, solution=spec, files={"workbook.xlsx": str(tmp_path / "in.xlsx")})
    env = gym.make("benchmax/Excel-v0", tasks=[task])
    try:
        env.reset(seed=0)
        if env.unwrapped.sandbox_level != "bubblewrap":
            pytest.skip("bubblewrap unavailable: run_python is left out")
        code = (
            "import openpyxl, re, zipfile\n"
            "wb = openpyxl.load_workbook('workbook.xlsx'); wb['Sheet']['A1'] = '=NOSUCHFN(1)'; wb.save('plain.xlsx')\n"
            "src = zipfile.ZipFile('plain.xlsx')\n"
            "with zipfile.ZipFile('workbook.xlsx', 'w') as out:\n"
            "    for name in src.namelist():\n"
            "        data = src.read(name)\n"
            "        if name == 'xl/worksheets/sheet1.xml':\n"
            "            data = re.sub(rb'<f>NOSUCHFN\\(1\\)</f>(<v\\s*/>|<v></v>)?', b'<f>NOSUCHFN(1)</f><v>42</v>', data)\n"
            "            assert b'<v>42</v>' in data, data\n"
            "        out.writestr(name, data)\n"
            "print('planted')\n")
        obs, _, _, _, info = env.step(call("run_python", code=code))
        assert info["error"] is None and "planted" in obs, obs
        _, reward, terminated, _, info = env.step("done")
        assert terminated and info["outcome"] == "scored", info
        assert reward == 0.0
        assert any("NOSUCHFN" in note for note in info["grade_notes"]), info["grade_notes"]
    finally:
        env.close()
