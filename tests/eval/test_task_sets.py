"""run.json records the task set; resuming over changed tasks and comparing runs over different
task sets are refused (unless told)."""

import json

import pytest

from benchmax_gym.cli import main
from benchmax_gym.eval import EvalError, evaluate

ENV = "benchmax/Math-v0"


def math_tasks(*answers):
    return [{"id": f"t{i}", "prompt": f"What is {a} + 0?", "answer": a} for i, a in enumerate(answers)]


def run(tmp_path, name, answers, **kwargs):
    return evaluate(ENV, "solver", env_kwargs={"tasks": math_tasks(*answers)}, out=tmp_path / name, **kwargs)


def test_run_json_and_records_carry_the_task_set_and_ids(tmp_path):
    result = run(tmp_path, "a", ("1", "2", "3"))
    saved = json.loads((tmp_path / "a" / "run.json").read_text())
    assert saved["task_set"].startswith("sha256:") and saved["task_set"] == result.run["task_set"]
    assert [r["task_id"] for r in result.records] == ["t0", "t1", "t2"]
    assert run(tmp_path, "b", ("1", "2", "3")).run["task_set"] == saved["task_set"]


def test_compare_refuses_different_task_sets_unless_allowed(tmp_path, capsys):
    run(tmp_path, "a", ("1", "2", "3"))
    run(tmp_path, "same", ("1", "2", "3"))
    run(tmp_path, "b", ("1", "2", "4"))  # same ids, one task changed
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "same"), "--json"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "different task sets" in err and "--allow-different-tasks" in err and len(err.strip().splitlines()) == 1
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--allow-different-tasks", "--json"]) == 0
    assert "warning: the runs are over different task sets" in capsys.readouterr().err


def test_resuming_over_changed_tasks_is_refused(tmp_path):
    run(tmp_path, "a", ("1", "2", "3"), tasks=2)
    saved = tmp_path / "a" / "run.json"
    record = json.loads(saved.read_text())
    record["task_set"] = "sha256:" + "0" * 32  # as if the source's tasks had changed since
    saved.write_text(json.dumps(record))
    with pytest.raises(EvalError, match="over other tasks"):
        run(tmp_path, "a", ("1", "2", "3"), tasks=2)
