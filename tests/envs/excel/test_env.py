"""benchmax/Excel-v0 end to end: solver on generated and real tasks, doing nothing, tools, bad input."""

import json
import os

import gymnasium as gym
import openpyxl
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.testing import play


@pytest.fixture(scope="module")
def sb_dir(shared_data):
    return str(shared_data / "spreadsheetbench")



def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def test_solver_solves_generated_tasks_of_every_type():
    env = gym.make("benchmax/Excel-v0", python_tool=False)
    solver = env.unwrapped.reference_solver()
    types = set()
    for seed in range(40):
        p = play(env, solver, seed=seed)
        reward, info = p.reward, p.info
        assert reward == 1.0 and info["reward_components"] == {"solved": 1.0, "cells": 1.0}, seed
        types.add(env.unwrapped.episode.task.metadata["type"])
    assert types == {"aggregate", "fill_formula", "lookup", "sort", "filter", "split", "conditional"}


def test_solver_solves_bigger_multi_sheet_tasks():
    env = gym.make("benchmax/Excel-v0", python_tool=False, task_args={"difficulty": {"rows": 200, "multi_sheet": True}})
    solver = env.unwrapped.reference_solver()
    for seed in range(14):
        reward = play(env, solver, seed=seed).reward
        assert reward == 1.0, seed


@pytest.mark.parametrize("part", range(3))
def test_solver_solves_every_shared_spreadsheetbench_case(sb_dir, part):
    """Every task, a third of them per case (every third task: xdist runs the thirds at once)."""
    env = gym.make("benchmax/Excel-v0", tasks="spreadsheetbench", task_args={"dataset": sb_dir}, python_tool=False)
    tasks = env.unwrapped.tasks
    assert len(tasks) >= 60
    solver = env.unwrapped.reference_solver()
    for i in range(part, len(tasks), 3):
        p = play(env, solver, options={"task_index": i})
        reward, info = p.reward, p.info
        assert reward == 1.0, tasks[i].id
    scores = info["spreadsheetbench"]
    assert scores["soft"] == 1.0 and scores["hard"] == 1.0


@pytest.mark.parametrize("tasks, part", [("generated", 0), ("spreadsheetbench", 0), ("spreadsheetbench", 1)])
def test_doing_nothing_scores_zero_when_the_answer_differs(sb_dir, tasks, part):
    """30 generated tasks, and every SpreadsheetBench task (half of them per case: xdist runs the halves at once)."""
    kwargs = {"tasks": "spreadsheetbench", "task_args": {"dataset": sb_dir}} if tasks == "spreadsheetbench" else {}
    env = gym.make("benchmax/Excel-v0", python_tool=False, **kwargs)
    n = len(env.unwrapped.tasks) if kwargs else 30
    for i in range(part, n, 2 if kwargs else 1):
        env.reset(options={"task_index": i})
        task = env.unwrapped.episode.task
        untouched = grade(task.files["workbook.xlsx"], task.answer["workbook"], task.answer["position"])
        _, reward, terminated, _, info = env.step("I'm done.")
        assert terminated
        assert reward == float(untouched.solved)
        if not kwargs:
            assert reward == 0.0  # generated answers always differ from their input


def test_reset_observation_describes_the_workbook_and_hides_the_answer():
    env = gym.make("benchmax/Excel-v0")
    obs, info = env.reset(seed=3)
    task = env.unwrapped.episode.task
    assert task.prompt in obs and "Answer position" in obs
    assert "workbook.xlsx" in obs and "used range" in obs
    assert info["sandbox"] in ("bubblewrap", "unavailable")
    assert "answer" not in json.dumps(info["task_metadata"]).lower().replace("answer_position", "")
    workspace = env.unwrapped.episode.state["workbook"].path.parent
    assert sorted(os.listdir(workspace)) == ["workbook.xlsx"]  # no answer file in reach


def test_tools_read_write_and_python_agree(tmp_path):
    env = gym.make("benchmax/Excel-v0", task_args={"difficulty": {"rows": 10}})
    env.reset(seed=0)
    if env.unwrapped.sandbox_level != "bubblewrap":
        pytest.skip("bubblewrap unavailable: run_python is left out")
    obs, *_ = env.step(call("list_sheets"))
    sheet = json.loads(obs.split("\n")[1])[0]["name"]
    obs, _, _, _, info = env.step(call("write_cells", sheet=sheet, cells={"Z1": 41, "Z2": "=Z1+1", "Z3": "2024-02-29"}))
    assert info["error"] is None
    obs, *_ = env.step(call("read_range", sheet=sheet, range="Z1:Z3"))
    assert "Z1: 41" in obs and "Z2: =Z1+1 -> 42" in obs and "Z3: 2024-02-29" in obs
    code = (f"import openpyxl\nwb = openpyxl.load_workbook('workbook.xlsx')\nws = wb[{sheet!r}]\n"
            "print(ws['Z1'].value, ws['Z3'].value.year)\nws['Z4'] = 'from python'\nwb.save('workbook.xlsx')")
    obs, _, _, _, info = env.step(call("run_python", code=code))
    assert info["error"] is None and "41 2024" in obs
    obs, *_ = env.step(call("read_range", sheet=sheet, range="Z4"))
    assert "Z4: from python" in obs  # the host tools see what the code saved


@pytest.mark.parametrize(
    "action, says",
    [
        (call("read_range", sheet="Sheet1", range="ZZZZ99999999"), "not a cell or range"),
        (call("read_range", sheet="Sheet1", range="A1:XFD1048576"), "at most 2000"),
        (call("read_range", sheet="Nope", range="A1"), "no sheet named 'Nope'"),
        (call("write_cells", sheet="Nope", cells={"A1": 1}), "create_sheet"),
        (call("write_cells", sheet="Sheet1", cells={"A1": "bad\x00\x07junk"}), "control characters"),
        (call("write_cells", sheet="Sheet1", cells={"A1:B2": 1}), "one cell per key"),
        (call("write_cells", sheet="Sheet1", cells={"A1": {"nested": 1}}), "not dict"),
        (call("write_cells", sheet="Sheet1", cells={"B3": 1}), "merged"),
        (call("read_range", sheet="Sheet1", range="A0:B0"), "rows are numbered from 1"),  # row 0: no 2,000-cell cap
        (call("write_cells", sheet="Sheet1", cells={"A0": 1}), "rows are numbered from 1"),
        (call("write_cells", sheet="Sheet1", cells={"A1": "a\uffffb"}), "U+FFFF"),  # saved, no one could open it
        (call("write_cells", sheet="Sheet1", cells={"A1": "\ud800"}), "lone surrogates"),
        (call("write_cells", sheet="Sheet1", cells={"A1": float("inf")}), "cannot be stored"),  # saved as nothing
        (call("write_cells", sheet="Sheet1", cells={"A1": float("-inf")}), "cannot be stored"),
        (call("write_cells", sheet="\x01x", cells={"A1": 1}, create_sheet=True), "not a valid sheet name"),
        (call("write_cells", sheet="SHEET1", cells={"A1": 1}, create_sheet=True), "ignore case"),
    ],
)
def test_bad_tool_input_is_a_clear_error_and_the_workbook_is_intact(tmp_path, action, says):
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet1"
    ws["A1"], ws["A2"] = "keep", 7
    ws.merge_cells("B2:C3")
    path = tmp_path / "in.xlsx"
    wb.save(path)
    answer = tmp_path / "answer.xlsx"
    ws["A2"] = 8
    wb.save(answer)
    task = benchmax_gym.Task("t", "Set A2 to 8.\nAnswer position: 'Sheet1'!A2", answer={"workbook": str(answer), "position": "'Sheet1'!A2"},
                             solution={"workbook": str(answer), "position": "'Sheet1'!A2"}, files={"workbook.xlsx": str(path)})
    env = gym.make("benchmax/Excel-v0", tasks=[task], python_tool=False)
    env.reset(seed=0)
    before = (env.unwrapped.episode.state["workbook"].path).read_bytes()
    obs, _, terminated, _, info = env.step(action)
    assert info["error"] in ("tool_error", "bad_arguments") and says in obs and not terminated
    assert env.unwrapped.episode.state["workbook"].path.read_bytes() == before
    obs, *_ = env.step(call("read_range", sheet="Sheet1", range="A1:A2"))
    assert "A1: keep" in obs and "A2: 7" in obs
    _, reward, *_ = env.step(call("write_cells", sheet="Sheet1", cells={"A2": 8}))
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 1.0


def test_answers_written_as_formulas_score():
    env = gym.make("benchmax/Excel-v0", python_tool=False, task_args={"difficulty": {"task_types": ["aggregate"]}})
    env.reset(seed=5)
    task = env.unwrapped.episode.task
    from benchmax_gym.envs.excel.solver import planned_writes

    (sheet, cells, _), = planned_writes(task.solution, env.unwrapped.episode.state["workbook"].book().sheetnames)
    as_formulas = {k: (f"={v}" if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in cells.items()}
    env.step(call("write_cells", sheet=sheet, cells=as_formulas))
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 1.0


def test_episode_workspaces_are_removed():
    env = gym.make("benchmax/Excel-v0", python_tool=False)
    env.reset(seed=0)
    path = env.unwrapped.episode.state["workbook"].path
    assert path.exists()
    env.reset(seed=1)
    assert not path.exists()
    env.close()


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"tasks": "nope"}, "tasks must be one of"),
        ({"tasks": "spreadsheetbench"}, "dataset"),
        ({"recalc": "excel"}, "recalc must be one of"),
        ({"difficulty": {"rows": 1}}, "rows"),
        ({"difficulty": {"colour": 1}}, "difficulty.*colour"),
        ({"dataset": "x"}, "only to tasks='spreadsheetbench'"),
    ],
)
def test_bad_configuration_fails_at_make(kwargs, says):
    with pytest.raises(ValueError, match=says):
        gym.make("benchmax/Excel-v0", **kwargs)


def test_a_sandbox_server_killed_during_a_call_ends_the_episode_with_tool_unavailable():
    """Excel's python tool on a sandbox that dies mid-call: ``tool_unavailable``, ungraded (issue 29)."""
    import math
    import sys
    from pathlib import Path

    from benchmax_gym.core.sandbox import bubblewrap_status
    if not bubblewrap_status()[0]:
        pytest.skip("bubblewrap is not usable here")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from faults import kill_sandbox_server_during

    env = gym.make("benchmax/Excel-v0", tool_timeout=60)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = kill_sandbox_server_during(
        env, call("run_python", code="import time; time.sleep(60)"))
    assert info["outcome"] == "tool_unavailable" and math.isnan(reward) and truncated and not terminated
    assert env.unwrapped.episode_record()["reward"] is None and env.unwrapped.episode_record()["outcome"] == "tool_unavailable"
    env.close()


def _workbooks(tmp_path):
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet1"
    wb.save(tmp_path / "in.xlsx")
    wb.active["A1"] = 1
    wb.save(tmp_path / "answer.xlsx")
    return str(tmp_path / "in.xlsx"), str(tmp_path / "answer.xlsx")


@pytest.mark.parametrize("bad", ["dict", "string answer", "no position", "missing input file", "no files"])
def test_a_task_excel_cannot_play_or_grade_fails_at_make_naming_it(tmp_path, bad):
    """A task dict (no files), a string answer, ...: refused at make naming the task and the shape
    Excel needs (they failed at reset as the model's ToolError, or were graded 0 by a TypeError)."""
    given, answer = _workbooks(tmp_path)
    good = dict(answer={"workbook": answer, "position": "A1"}, files={"workbook.xlsx": given})
    wrong = {"string answer": {"answer": "1"}, "no position": {"answer": {"workbook": answer}},
             "missing input file": {"files": {"workbook.xlsx": str(tmp_path / "gone.xlsx")}},
             "no files": {"files": {}}}
    tasks = [benchmax_gym.Task("fine", "p", **good)]
    if bad == "dict":
        tasks.append({"id": "mine", "prompt": "x", "answer": "y"})
    else:
        tasks.append(benchmax_gym.Task("mine", "p", **{**good, **wrong[bad]}))
    with pytest.raises(ValueError, match=r"tasks\[1\] \(id 'mine'\).*files=\{'workbook.xlsx'.*'position'"):
        gym.make("benchmax/Excel-v0", tasks=tasks, python_tool=False)


def test_a_lazy_source_task_excel_cannot_grade_fails_its_reset_as_the_envs_error(tmp_path):
    given, _ = _workbooks(tmp_path)

    class Lazy(benchmax_gym.TaskSource):
        def __len__(self):
            return 1

        def get(self, index):
            return benchmax_gym.Task("lazy", "p", answer="1", files={"workbook.xlsx": given})

    env = gym.make("benchmax/Excel-v0", tasks=Lazy(), python_tool=False)
    with pytest.raises(ValueError, match=r"task 0 \(id 'lazy'\): its answer is '1'"):
        env.reset(seed=0)
    env.close()
