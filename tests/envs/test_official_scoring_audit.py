"""Our graders against each benchmark's own scoring, on the real samples in ../shared/data.

Each benchmark's official scorer is written out here again from its documented rules (never by
calling our code): SpreadsheetBench's ``evaluation.py`` cell comparison, HotpotQA's
``hotpot_evaluate_v1.py`` EM/F1, MATH's ``is_equiv`` (Hendrycks' ``math_equivalence.py``) and
GSM8K's final-number match. The environments are driven through ``gym.make`` of their registered
ids, as a user would, and their reward must be what the official rule gives, except where we are
deliberately stricter (documented in the family READMEs, and asserted here as such).
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import io
import json
import re
import shutil
import string
from pathlib import Path

import gymnasium as gym
import openpyxl
import pytest
from openpyxl.utils import get_column_letter, range_boundaries

import benchmax_gym  # noqa: F401


# ============================================================== SpreadsheetBench (evaluation.py)


def sb_datetime_to_float(value: dt.datetime) -> float:
    delta = value - dt.datetime(1899, 12, 30)
    return delta.days + delta.seconds / 86400.0


def sb_transform(v):
    if isinstance(v, (int, float)):
        v = round(float(v), 2)
    elif isinstance(v, dt.time):
        v = str(v)[:-3]
    elif isinstance(v, dt.datetime):
        v = round(sb_datetime_to_float(v), 0)
    elif isinstance(v, str):
        try:
            v = round(float(v), 2)
        except ValueError:
            pass
    return v


def sb_cell_equal(a, b) -> bool:
    a, b = sb_transform(a), sb_transform(b)
    if (a == "" and b is None) or (a is None and b == ""):
        return True
    if (a == "" and b == "") or (a is None and b is None):
        return True
    if type(a) is not type(b):
        return False
    return a == b


def sb_positions(position: str, gt_sheetnames: list[str]) -> list[tuple[str, str]]:
    """Upstream's split: ``,`` between parts, ``!`` between sheet and range, quotes stripped."""
    out = []
    for part in position.split(","):
        if "!" in part:
            sheet, rng = part.split("!")
        else:
            sheet, rng = gt_sheetnames[0], part
        out.append((sheet.strip("'"), rng.strip("'")))
    return out


def sb_cells(rng: str) -> list[str]:
    if ":" not in rng:
        return [rng]
    c1, r1, c2, r2 = range_boundaries(rng)
    return [f"{get_column_letter(c)}{r}" for r in range(r1, r2 + 1) for c in range(c1, c2 + 1)]


_IF_NOT_BLANK = re.compile(r'=IF\(NOT\(ISBLANK\((\w+)\)\),(\w+),""\)')
_IF_ZERO_LINK = re.compile(r'=IF\((\w+)=0,"",HYPERLINK\(.*,"([^"]*)"\)\)')
_INDEX_MATCH = re.compile(
    r"=IFERROR\(INDEX\('([^']+)'!(\S+?),MATCH\((\S+?),'[^']+'!(\S+?),0\),MATCH\((\S+?),'[^']+'!(\S+?),0\)\)&\"\",\"\"\)"
)


def sb_recalc(formula: str, sheet) -> object:
    """What a recalculation (upstream: LibreOffice) gives the sample's formulas that were saved without
    a value, worked out here by hand for the three forms they take; any other fails the test."""
    formula = getattr(formula, "text", formula)  # an array formula's text
    if m := _IF_NOT_BLANK.fullmatch(formula):
        return "" if sheet[m[1]].value is None else sheet[m[2]].value
    if m := _IF_ZERO_LINK.fullmatch(formula):
        return "" if sheet[m[1]].value in (None, 0) else m[2]
    if m := _INDEX_MATCH.fullmatch(formula.replace("$", "")):
        table = sheet.parent[m[1]]
        area = [[c.value for c in row] for row in table[m[2]]]
        keys = [row[0].value for row in table[m[4]]]
        heads = [c.value for c in table[m[6]][0]]
        fold = lambda v: str(v).casefold()  # noqa: E731 - MATCH ignores case
        try:
            value = area[[fold(k) for k in keys].index(fold(sheet[m[3]].value))][
                [fold(h) for h in heads].index(fold(sheet[m[5]].value))]
        except ValueError:
            return ""  # IFERROR
        return "" if value is None else str(value)
    raise NotImplementedError(f"no reference value for {formula!r}")


def sb_values(data: bytes, position: str, gt_sheetnames: list[str], computed=None) -> dict:
    """``{(sheet, cell): value}`` as upstream reads them (``data_only``, formulas recalculated first):
    a formula saved without a value gets :func:`sb_recalc`'s, or ``computed``'s."""
    if computed is None:  # the answer workbook, read again for each variant scored against it
        return dict(_sb_values(data, position, tuple(gt_sheetnames)))
    return _sb_values_uncached(data, position, gt_sheetnames, computed)


@functools.lru_cache(maxsize=64)
def _sb_values(data: bytes, position: str, gt_sheetnames: tuple[str, ...]) -> dict:
    return _sb_values_uncached(data, position, list(gt_sheetnames))


def _sb_values_uncached(data: bytes, position: str, gt_sheetnames: list[str], computed=None) -> dict:
    wb = openpyxl.load_workbook(io.BytesIO(data), data_only=True)
    formulas = openpyxl.load_workbook(io.BytesIO(data))
    values = {}
    for sheet, rng in sb_positions(position, gt_sheetnames):
        if sheet in wb.sheetnames:
            for cell in sb_cells(rng):
                value = wb[sheet][cell].value
                formula = formulas[sheet][cell].value
                if value is None and formula is not None and (sheet, cell) not in (computed or {}):
                    value = sb_recalc(formula, wb[sheet])
                values[sheet, cell] = value
    values.update(computed or {})
    return values


def sb_official(gt: bytes, proc: bytes, position: str, computed=None) -> bool:
    """SpreadsheetBench's pass/fail of one test case (a missing sheet fails, as upstream's KeyError)."""
    names = sheet_names(gt)
    want = sb_values(gt, position, names)
    have = sb_values(proc, position, names, computed)
    return all(k in have and sb_cell_equal(v, have[k]) for k, v in want.items())


@pytest.fixture(scope="module")
def sb_env(shared_data):
    env = gym.make("benchmax/Excel-v0", tasks="spreadsheetbench",
                   task_args={"dataset": str(shared_data / "spreadsheetbench")}, python_tool=False)
    yield env
    env.close()


def workbook_reward(env, index: int, data: bytes) -> float:
    """The reward of a reply that leaves ``data`` as the workspace's workbook (a new regular file)."""
    env.reset(options={"task_index": index})
    path = env.unwrapped.episode.state["workbook"].path
    path.unlink()
    path.write_bytes(data)
    _, reward, terminated, _, info = env.step("Done.")
    assert terminated and info["error"] is None, info
    return reward


@functools.lru_cache(maxsize=64)
def sheet_names(data: bytes) -> tuple[str, ...]:
    return tuple(openpyxl.load_workbook(io.BytesIO(data), read_only=True).sheetnames)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def edited(data: bytes, edit) -> bytes:
    """The workbook as values (a formula's cached value, else :func:`sb_recalc`'s) after
    ``edit(workbook)``, saved by openpyxl: what a model that pasted values would leave."""
    wb = openpyxl.load_workbook(io.BytesIO(data), data_only=True)
    touched, recalculated = _recalculated(data)
    for sheet, row, column in touched:
        wb[sheet].cell(row=row, column=column)
    for sheet, coordinate, value in recalculated:
        wb[sheet][coordinate].value = value
    edit(wb)
    out = io.BytesIO()
    wb.save(out)
    return out.getvalue()


@functools.lru_cache(maxsize=64)
def _recalculated(data: bytes) -> tuple[tuple, tuple]:
    """The cells the recalculation reads (openpyxl creates each one it is asked for: they are saved too)
    and the ``(sheet, cell, value)`` it sets, in order (one reads the cells set before it): worked out
    once per workbook, as each answer is edited many times."""
    wb = openpyxl.load_workbook(io.BytesIO(data), data_only=True)
    formulas = openpyxl.load_workbook(io.BytesIO(data))
    existing = {ws.title: set(ws._cells) for ws in wb.worksheets}
    done = []
    for ws in formulas.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                if cell.data_type == "f" and wb[ws.title][cell.coordinate].value is None:
                    try:
                        value = sb_recalc(cell.value, wb[ws.title])
                    except NotImplementedError:
                        continue  # outside the answer positions (they are checked when read)
                    wb[ws.title][cell.coordinate].value = value
                    done.append((ws.title, cell.coordinate, value))
    touched = [(ws.title, row, column) for ws in wb.worksheets
               for row, column in set(ws._cells) - existing[ws.title]]
    return tuple(touched), tuple(done)


def answer_cells(data: bytes, position: str):
    """``[(sheet, cell, value)]`` at the answer position, as upstream reads the answer."""
    return [(s, c, v) for (s, c), v in sb_values(data, position, sheet_names(data)).items()]


@pytest.mark.parametrize("part", range(2))
def test_every_sample_case_answer_scores_one_and_input_as_official(sb_env, part):
    """Every task and case of the sample: the answer workbook passes, the untouched input scores what
    upstream's rule gives it (0 except where the answer cells already hold the answer). Every other
    task per case: xdist runs the halves at once."""
    tasks = sb_env.unwrapped.tasks
    assert len(tasks) == 60
    already, here = [], set()
    for i in range(part, len(tasks), 2):
        task = tasks[i]
        answer, given = read(task.answer["workbook"]), read(task.files["workbook.xlsx"])
        position = task.answer["position"]
        assert sb_official(answer, answer, position)
        assert workbook_reward(sb_env, i, answer) == 1.0, task.id
        official = sb_official(answer, given, position)
        assert workbook_reward(sb_env, i, given) == float(official), task.id
        here.add(task.metadata["spreadsheet_id"])
        if official:
            already.append(task.metadata["spreadsheet_id"])
    assert {"570-43", "CF_8276"} <= {tasks[i].metadata["spreadsheet_id"] for i in range(len(tasks))}
    assert sorted(set(already)) == sorted(here & {"570-43", "CF_8276"})  # the sample's two no-op tasks


def _perturbations(answer: bytes, position: str):
    """``(name, make, computed)`` variants of the answer workbook (``make()``: its bytes): each changes
    answer cells the way a model's output may differ; ``computed`` gives formulas' recalculated values."""
    wb = openpyxl.load_workbook(io.BytesIO(answer))
    cells = [(s, c, v) for s, c, v in answer_cells(answer, position)
             if not isinstance(wb[s][c], openpyxl.cell.cell.MergedCell)]  # (inside a merge: not writable)
    numbers = [(s, c, v) for s, c, v in cells if isinstance(v, (int, float)) and not isinstance(v, bool)]
    empties = [(s, c) for s, c, v in cells if v is None]
    dates = [(s, c, v) for s, c, v in cells if isinstance(v, dt.datetime)]
    texts = [(s, c, v) for s, c, v in cells if isinstance(v, str)]

    def later(edit):  # (the workbook is made only for the perturbations a test asks for)
        return functools.partial(edited, answer, edit)

    def setting(pairs):
        def edit(wb):
            for (sheet, cell), value in pairs.items():
                wb[sheet][cell].value = value
        return edit

    for delta in (0.001, 0.004, 0.006, 0.01):
        if numbers:
            s, c, v = numbers[0]
            yield f"number {delta:+}", later(setting({(s, c): v + delta})), None
    if numbers:
        yield "numbers as numeric strings", later(setting({(s, c): repr(v) for s, c, v in numbers})), None
        yield "numbers as padded strings", later(setting({(s, c): f" {v:.4f} " for s, c, v in numbers})), None
        s, c, v = numbers[0]
        yield "a number as a formula", later(setting({(s, c): f"={v!r}+0"})), {(s, c): v}
    if texts:
        s, c, v = texts[0]
        if not v.startswith("="):
            formula = '="' + v.replace('"', '""') + '"'
            yield "a text as a formula", later(setting({(s, c): formula})), {(s, c): v}
        yield "a text in another case", later(setting({(s, c): v.swapcase()})), None
        yield "a text with a trailing space", later(setting({(s, c): v + " "})), None
    if empties:
        s, c = empties[0]
        yield 'an empty cell as =""', later(setting({(s, c): '=""'})), {(s, c): ""}
        yield "an empty cell as 0", later(setting({(s, c): 0})), None
    if dates:
        serials = {(s, c): sb_datetime_to_float(v) for s, c, v in dates}
        yield "datetimes as serial days", later(setting(serials)), None
        yield "datetimes as serials + 1", later(setting({k: v + 1 for k, v in serials.items()})), None
        yield "datetimes as ISO text", later(setting({(s, c): v.isoformat() for s, c, v in dates})), None

    def reorder(wb):  # the first sheet last: cells are found by the answer's sheet names
        wb.move_sheet(wb.sheetnames[0], offset=len(wb.sheetnames) - 1)
    if len(sheet_names(answer)) > 1:
        yield "sheets reordered", later(reorder), None


def _of_numbers(name: str) -> bool:
    return name.startswith(("number", "a number"))


@pytest.mark.parametrize("numbers", [True, False], ids=["numbers", "others"])
def test_answer_perturbations_score_as_the_official_rule(sb_env, numbers):
    """Numbers off in the 3rd decimal, numeric strings, formulas without a cached value (recalculated),
    ``""`` against an empty cell, datetimes against serials, and sheets in another order: case 1 of every
    task scores what SpreadsheetBench's rule gives. The numbers' perturbations in one case, the others
    in the other: xdist runs the two at once."""
    tasks = sb_env.unwrapped.tasks
    seen, disagree = collections.Counter(), []
    for i in range(len(tasks)):
        task = tasks[i]
        if task.metadata["case"] != 1:
            continue
        answer, position = read(task.answer["workbook"]), task.answer["position"]
        for name, make, computed in _perturbations(answer, position):
            if _of_numbers(name) != numbers:
                continue
            data = make()
            official = sb_official(answer, data, position, computed)
            seen[name, official] += 1
            if workbook_reward(sb_env, i, data) != float(official):
                disagree.append((task.id, name, official))
    assert not disagree
    # the perturbations reached both verdicts where the rule has both
    for name, verdict in [("number +0.001", True), ("number +0.006", False), ("numbers as numeric strings", True),
                          ("a number as a formula", True), ("a text as a formula", True), ('an empty cell as =""', True),
                          ("an empty cell as 0", False), ("datetimes as serial days", True),
                          ("datetimes as serials + 1", False), ("datetimes as ISO text", False),
                          ("sheets reordered", True), ("a text in another case", False)]:
        if _of_numbers(name) == numbers:
            assert seen[name, verdict], (name, verdict, seen)


def _sb_copy(shared_data, tmp_path, sid: str, edit, position: str | None = None) -> str:
    """A SpreadsheetBench directory holding one sample record whose case-1 answer was ``edit``-ed."""
    root = shared_data / "spreadsheetbench"
    record = next(r for r in json.loads((root / "dataset.json").read_text()) if str(r["id"]) == sid)
    if position is not None:
        record["answer_position"] = position
    folder = tmp_path / "sb" / "spreadsheet" / sid
    folder.mkdir(parents=True)
    for kind in ("input", "answer"):
        shutil.copyfile(root / "spreadsheet" / sid / f"1_{sid}_{kind}.xlsx", folder / f"1_{sid}_{kind}.xlsx")
    answer = folder / f"1_{sid}_answer.xlsx"
    answer.write_bytes(edited(answer.read_bytes(), edit))
    (tmp_path / "sb" / "dataset.json").write_text(json.dumps([record]))
    return str(tmp_path / "sb")


def test_times_compare_as_hh_mm(shared_data, tmp_path):
    """An answer that is a time of day: its ``HH:MM`` text passes, seconds do not count, another
    minute fails (the sample has no time cells, so one of its records gets some)."""
    times = {"B5": dt.time(9, 30), "B6": dt.time(17, 45, 59)}

    def put_times(wb):
        for cell, value in times.items():
            wb["Updated Data"][cell].value = value
    dataset = _sb_copy(shared_data, tmp_path, "50066", put_times)
    env = gym.make("benchmax/Excel-v0", tasks="spreadsheetbench", task_args={"dataset": dataset}, python_tool=False)
    task = env.unwrapped.tasks[0]
    answer, position = read(task.answer["workbook"]), task.answer["position"]

    def with_values(**values):
        return edited(answer, lambda wb: [wb["Updated Data"].__setitem__(k, v) for k, v in values.items()])
    cases = [with_values(B5="09:30", B6="17:45"), with_values(B5=dt.time(9, 30, 40)), with_values(B6="17:46"),
             with_values(B5="9:30"), with_values(B5=dt.time(9, 31))]
    verdicts = []
    for data in cases:
        official = sb_official(answer, data, position)
        verdicts.append(official)
        assert workbook_reward(env, 0, data) == float(official)
    assert verdicts == [True, True, False, False, False]
    env.close()


def test_an_answer_on_a_named_sheet_is_read_there(shared_data, sb_env):
    """``'Sheet2'!Z2``: the answer on the named sheet passes; the same value left on the first sheet
    instead (or the named sheet missing) fails, as upstream."""
    tasks = sb_env.unwrapped.tasks
    index = next(i for i in range(len(tasks)) if tasks[i].id == "sb-48799-1")
    task = tasks[index]
    answer, given = read(task.answer["workbook"]), read(task.files["workbook.xlsx"])
    (sheet, cell, value), = answer_cells(answer, task.answer["position"])
    assert sheet == "Sheet2" and openpyxl.load_workbook(io.BytesIO(answer)).sheetnames[0] != sheet
    on_first = edited(given, lambda wb: wb.worksheets[0].__setitem__(cell, value))
    on_named = edited(given, lambda wb: wb[sheet].__setitem__(cell, value))
    no_sheet = edited(answer, lambda wb: wb.remove(wb[sheet]))
    for data, official in [(on_named, True), (on_first, False), (no_sheet, False)]:
        assert sb_official(answer, data, task.answer["position"]) is official
        assert workbook_reward(sb_env, index, data) == float(official)


def test_formula_answers_in_a_workbook_with_table_names_are_computed(sb_env):
    """31202 names a table column (``listaEmpleados = tblEmpleados[NOMBRE]``), which ``formulas``
    cannot parse: it answered ``#REF!`` for every formula, so right formulas graded 0 where upstream
    (LibreOffice) computes them. Each answer cell as a formula giving its value now passes."""
    tasks = sb_env.unwrapped.tasks
    index = next(i for i in range(len(tasks)) if tasks[i].id == "sb-31202-1")
    task = tasks[index]
    answer, position = read(task.answer["workbook"]), task.answer["position"]
    cells = answer_cells(answer, position)
    assert len(cells) == 46 and all(isinstance(v, (int, float)) for _, _, v in cells)
    formulas = edited(answer, lambda wb: [wb[s].__setitem__(c, f"={v!r}*1") for s, c, v in cells])
    assert sb_official(answer, formulas, position, {(s, c): v for s, c, v in cells})
    assert workbook_reward(sb_env, index, formulas) == 1.0
    wrong = edited(answer, lambda wb: [wb[s].__setitem__(c, f"={v!r}+1") for s, c, v in cells])
    assert workbook_reward(sb_env, index, wrong) == 0.0


def test_booleans_are_not_numbers_a_documented_difference(shared_data, tmp_path):
    """Deliberately stricter than upstream (whose ``isinstance(v, (int, float))`` reads TRUE as 1.0):
    a boolean never matches a number, either way round; the Excel README says so."""
    dataset = _sb_copy(shared_data, tmp_path, "39490", lambda wb: wb.worksheets[0].__setitem__("E1", 1))
    env = gym.make("benchmax/Excel-v0", tasks="spreadsheetbench", task_args={"dataset": dataset}, python_tool=False)
    task = env.unwrapped.tasks[0]
    answer, position = read(task.answer["workbook"]), task.answer["position"]
    true = edited(answer, lambda wb: wb.worksheets[0].__setitem__("E1", True))
    assert sb_official(answer, true, position)  # upstream: TRUE == 1
    assert workbook_reward(env, 0, true) == 0.0
    assert workbook_reward(env, 0, answer) == 1.0
    env.close()
    readme = (Path(benchmax_gym.__file__).parent / "envs" / "excel" / "README.md").read_text(encoding="utf-8")
    assert "`TRUE` is not `1`" in readme


# ============================================================== MATH-500 (is_equiv) and hedges


def _fix_fracs(text: str) -> str:
    parts = text.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[:1] == "{":
            out += part
        elif len(part) < 2:
            return text
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _fix_a_slash_b(text: str) -> str:
    if len(text.split("/")) != 2:
        return text
    a, b = text.split("/")
    try:
        a, b = int(a), int(b)
        assert text == f"{a}/{b}"
        return "\\frac{" + str(a) + "}{" + str(b) + "}"
    except (ValueError, AssertionError):
        return text


def _fix_sqrt(text: str) -> str:
    if "\\sqrt" not in text:
        return text
    parts = text.split("\\sqrt")
    return parts[0] + "".join(
        ("\\sqrt{" + p[0] + "}" + p[1:]) if p[:1] != "{" else "\\sqrt" + p for p in parts[1:])


def math_strip(text: str) -> str:
    """Hendrycks' ``_strip_string`` (MATH's math_equivalence.py)."""
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in text:
        pieces = text.split("\\text{ ")
        assert len(pieces) == 2
        text = pieces[0]
    text = text.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    if len(text.split("=")) == 2 and len(text.split("=")[0]) <= 2:
        text = text.split("=")[1]
    text = _fix_fracs(_fix_sqrt(text).replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _fix_a_slash_b(text)


def is_equiv(a: str, b: str) -> bool:
    try:
        return math_strip(a) == math_strip(b)
    except Exception:
        return a == b


@pytest.fixture(scope="module")
def math500(shared_data):
    path = shared_data / "math500" / "test_first100.jsonl"
    env = gym.make("benchmax/Math-v0", tasks="math500", task_args={"dataset": str(path)})
    golds = [json.loads(line)["answer"] for line in path.read_text().splitlines()]
    assert [t.answer for t in env.unwrapped.tasks.tasks] == golds
    yield env, golds
    env.close()


def reply_reward(env, index: int, reply: str) -> float:
    env.reset(options={"task_index": index})
    _, reward, terminated, _, info = env.step(reply)
    assert terminated and info["error"] is None, info
    return reward


def _rewrites(gold: str):
    """Forms of ``gold`` MATH's ``is_equiv`` treats as the same text (it is the judge of which are)."""
    yield gold
    yield gold.replace("\\frac", "\\dfrac")
    yield gold.replace("\\frac", "\\tfrac")
    yield gold.replace(" ", "")
    yield re.sub(r",\s*", ", ", gold)
    yield gold.replace("\\left", "").replace("\\right", "")
    yield re.sub(r"^\((.*)\)$", r"\\left(\1\\right)", gold)
    yield re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", gold)
    if m := re.fullmatch(r"\\frac\{(\d+)\}\{(\d+)\}", gold):
        yield f"{m[1]}/{m[2]}"
        if len(m[1]) == len(m[2]) == 1:
            yield f"\\frac{m[1]}{m[2]}"
    if re.fullmatch(r"-?\d+(\.\d+)?", gold):  # units, degrees, percent and dollars only on numbers
        yield from (gold + "^\\circ", gold + "^{\\circ}", gold + "\\%", "\\$" + gold, gold + "\\text{ cm}")


def test_every_math500_answer_and_its_is_equiv_rewrites_score_one(math500):
    """Each record's gold, boxed or tagged, and every rewrite MATH's ``is_equiv`` accepts, scores 1."""
    env, golds = math500
    misses = []
    for i, gold in enumerate(golds):
        for form in dict.fromkeys(_rewrites(gold)):
            assert is_equiv(gold, form), (gold, form)
            for reply in (f"So the answer is $\\boxed{{{form}}}$.", f"<answer>{form}</answer>"):
                if reply_reward(env, i, reply) != 1.0:
                    misses.append((gold, reply))
    assert not misses


EQUIVALENT = {  # forms math-verify reads as the same value, beyond is_equiv's text rules
    "\\frac{3}{2}": ["1.5", "\\frac32", "3/2", "1\\frac{1}{2}"],
    "1.25": ["\\frac{5}{4}", "5/4", "1.250"],
    "0.15": ["\\frac{3}{20}", "15\\%", "0.150"],
    "\\frac{14}{3}": ["\\frac{28}{6}", "4\\frac{2}{3}"],
    "90^\\circ": ["90", "90°", "90 degrees", "90\\text{ degrees}", "90\\degree"],
    "\\text{Evelyn}": ["Evelyn", "\\textbf{Evelyn}", "\\mathrm{Evelyn}"],
    "\\text{east}": ["east", "East"],
    "\\left( 3, \\frac{\\pi}{2} \\right)": ["(3, \\frac{\\pi}{2})", "(3,\\pi/2)"],
    "(6,31,-1)": ["(6, 31, -1)", "\\left(6,31,-1\\right)"],
    "2220": ["2,220", "2{,}220", "2220.0", "\\$2220", "2220 \\text{ dollars}"],
    "x=5": ["5", "x = 5"],
    "1,-2": ["-2, 1", "1, -2"],
    "3, 5, 7": ["7, 5, 3"],
    "11\\sqrt2": ["11\\sqrt{2}", "\\sqrt{242}"],
    "6 - 5i": ["6-5i", "-5i+6"],
    "52_8": ["52_{8}"],
    "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}":
        ["\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\\\ \\frac{5}{3} \\end{pmatrix}"],
    "-\\frac{\\pi}{6}": ["-\\pi/6", "\\frac{-\\pi}{6}"],
}
WRONG = {
    "\\frac{3}{2}": ["1.49", "\\frac{2}{3}", "3", "-1.5", "1.5 \\text{ or } 2"],
    "90^\\circ": ["91", "180^\\circ", "89.99"],
    "(6,31,-1)": ["(6,-1,31)", "(6,31,1)", "(6,31)"],
    "\\left( 3, \\frac{\\pi}{2} \\right)": ["(\\frac{\\pi}{2}, 3)", "(3, \\pi)", "(0, 3)"],
    "(-2,1)": ["(1,-2)", "[-2,1]", "(-2,1]"],
    "\\text{Evelyn}": ["Evelin", "Bob", "\\text{Evelyn or Bob}"],
    "1,-2": ["1", "1,2", "1,-2,3"],
    "2220": ["2221", "222", "22200", "2.22"],
    "x=5": ["x=6", "6"],
    "0.15": ["0.16", "15", "0.015"],
    "11\\sqrt2": ["11", "12\\sqrt{2}"],
    "1 \\pm \\sqrt{19}": ["1+\\sqrt{19}", "1 - \\sqrt{19}"],
    "\\cot x": ["\\tan x", "\\cos x"],
}


def test_equivalent_forms_score_one_and_wrong_answers_zero(math500):
    """Decimals for fractions, mixed numbers, degrees, percent, ``\\text{}``, tuples, unordered lists,
    thousands separators: 1. Near misses, swapped coordinates, other intervals, hedges: 0."""
    env, golds = math500
    for gold, forms in EQUIVALENT.items():
        for form in forms:
            for reply in (f"\\boxed{{{form}}}", f"<answer>{form}</answer>"):
                assert reply_reward(env, golds.index(gold), reply) == 1.0, (gold, reply)
    for gold, forms in WRONG.items():
        for form in forms:
            assert not is_equiv(gold, form)
            assert reply_reward(env, golds.index(gold), f"\\boxed{{{form}}}") == 0.0, (gold, form)


def test_other_records_answers_score_zero(math500):
    """Every gold against the answers of other records that ``is_equiv`` tells apart from it."""
    env, golds = math500
    for i, gold in enumerate(golds):
        for other in golds[(i % 9)::9]:
            if not is_equiv(gold, other):
                assert reply_reward(env, i, f"\\boxed{{{other}}}") == 0.0, (gold, other)


def test_two_different_answers_score_zero_whichever_comes_last(math500):
    """A hedge (two boxes, a box and a different tag, two tags) scores 0 on every record, also when the
    right one comes last (MATH's last-box rule would pay it); the right answer stated twice scores 1."""
    env, golds = math500
    paid = []
    for i, gold in enumerate(golds):
        wrong = "123456789"
        for reply in (f"\\boxed{{{wrong}}} or \\boxed{{{gold}}}", f"\\boxed{{{gold}}} or \\boxed{{{wrong}}}",
                      f"<answer>{wrong}</answer> \\boxed{{{gold}}}", f"\\boxed{{{wrong}}} <answer>{gold}</answer>",
                      f"<answer>{wrong}</answer><answer>{gold}</answer>"):
            if reply_reward(env, i, reply) != 0.0:
                paid.append(reply)
        assert reply_reward(env, i, f"\\boxed{{{gold}}}, that is \\boxed{{{gold}}}") == 1.0, gold
    assert not paid


# ============================================================== GSM8K (final number)

_GSM_NUMBER = re.compile(r"-?[$0-9.,]{2,}|-?[0-9]+")


def gsm8k_gold(solution: str) -> str:
    return solution.split("####")[-1].strip().replace(",", "")


def gsm8k_match(text: str, gold: str) -> bool:
    """The harness's flexible match: the last number of the text, ``$`` and ``,`` stripped."""
    found = _GSM_NUMBER.findall(text)
    if not found:
        return False
    try:
        return float(found[-1].replace("$", "").replace(",", "").rstrip(".")) == float(gold)
    except ValueError:
        return False


@pytest.mark.parametrize("part", range(2))
def test_gsm8k_golds_in_every_written_form_score_one(shared_data, part):
    """All 500 golds: plain, with thousands separators, ``$``, a unit, "The answer is 1,600.", ``.00``
    (every other gold per case: xdist runs the halves at once)."""
    path = shared_data / "gsm8k" / "train_sample500.jsonl"
    env = gym.make("benchmax/Math-v0", tasks="gsm8k", task_args={"dataset": str(path)})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == len(env.unwrapped.tasks) == 500
    misses, paid = [], []
    for i, record in list(enumerate(records))[part::2]:
        gold = gsm8k_gold(record["answer"])
        assert env.unwrapped.tasks[i].answer == gold
        sign, digits = ("-", gold[1:]) if gold.startswith("-") else ("", gold)
        whole, _, frac = digits.partition(".")
        commas = sign + f"{int(whole):,}" + (f".{frac}" if frac else "")
        forms = [gold, commas, f"${commas}", f"\\${commas}", f"{commas} dollars", f"The answer is {commas}.",
                 f"{commas}.", f"{commas} apples", f"So the answer is: {gold}"] + ([f"{gold}.00"] if not frac else [])
        for form in forms:
            assert gsm8k_match(form, gold), form
            for reply in (f"\\boxed{{{form}}}", f"<answer>{form}</answer>"):
                if reply_reward(env, i, reply) != 1.0:
                    misses.append((gold, reply))
        near = f"{float(gold) + 1:g}"
        for form in (near, gold + "0", f"{gold} or {near}"):
            assert not gsm8k_match(form, gold)
            if reply_reward(env, i, f"<answer>{form}</answer>") != 0.0:
                paid.append((gold, form))
    env.close()
    assert not misses and not paid


# ============================================================== HotpotQA (hotpot_evaluate_v1.py)


def hotpot_normalize(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def hotpot_f1(prediction: str, gold: str) -> float:
    pred, truth = hotpot_normalize(prediction), hotpot_normalize(gold)
    if pred in ("yes", "no", "noanswer") and pred != truth:
        return 0.0
    if truth in ("yes", "no", "noanswer") and pred != truth:
        return 0.0
    common = sum((collections.Counter(pred.split()) & collections.Counter(truth.split())).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred.split()), common / len(truth.split())
    return 2 * precision * recall / (precision + recall)


def hotpot_em(prediction: str, gold: str) -> float:
    return float(hotpot_normalize(prediction) == hotpot_normalize(gold))


def test_hotpotqa_reward_is_the_official_em_and_f1(shared_data):
    """The 100 records: the gold and its variants in case, articles, punctuation, yes/no and partial
    answers get the official EM (``em``) and F1 (``f1``, the reward)."""
    path = shared_data / "hotpotqa" / "dev_distractor_100.json"
    env = gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa", task_args={"dataset": str(path)})
    records = json.loads(path.read_text())
    checked, disagree = collections.Counter(), []
    for i, record in enumerate(records):
        gold = record["answer"]
        forms = [gold, gold.upper(), gold.lower(), f"The {gold}", f"a {gold}", f"{gold}.", f'"{gold}"',
                 gold.replace(",", ""), f"  {gold} !", gold.split()[0], f"{gold} (approximately)", "yes", "no",
                 "Yes.", f"No, {gold}", f"It is {gold}", f"{gold} and more", "noanswer"]
        for form in forms:
            env.reset(options={"task_index": i})
            _, reward, terminated, _, info = env.step(f"<answer>{form}</answer>")
            got = info["reward_components"]
            want = (hotpot_f1(form, gold), hotpot_em(form, gold))
            checked[want[1], 0 < want[0] < 1] += 1
            if got["f1"] != pytest.approx(want[0]) or got["em"] != want[1] or reward != pytest.approx(want[0]):
                disagree.append((gold, form, got, want))
    env.close()
    assert not disagree
    assert checked[1.0, False] and checked[0.0, True] and checked[0.0, False]  # all three verdicts reached
