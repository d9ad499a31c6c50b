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


def test_runs_of_one_file_cut_to_different_task_counts_compare_where_their_tasks_meet(tmp_path, capsys):
    """eval builds only the first N tasks of a file (--tasks N), so its task_set hashes those: runs
    of 3 and of 5 tasks of one file differ in hash but not in any task they share, and compare
    pairs them; a task changed under a shared id is still refused."""
    lines = [json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) for i in range(8)]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    changed = lines[:1] + [json.dumps({"question": "What is 1 + 1?", "answer": "#### 3"})] + lines[2:]
    (tmp_path / "changed.jsonl").write_text("\n".join(changed) + "\n")

    def of(name, file, n):
        kwargs = {"tasks": "gsm8k", "task_args": {"dataset": str(tmp_path / file)}}
        return evaluate(ENV, "solver", env_kwargs=kwargs, tasks=n, out=tmp_path / name)

    three, five, other = of("three", "tasks.jsonl", 3), of("five", "tasks.jsonl", 5), of("other", "changed.jsonl", 5)
    assert three.run["task_set"] != five.run["task_set"]
    assert main(["compare", str(tmp_path / "three"), str(tmp_path / "five"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["shared_tasks"] == 3
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(tmp_path / "three"), str(tmp_path / "other")])
    assert exit_.value.code == 2 and "different task sets" in capsys.readouterr().err
    assert other.run["task_set"] != five.run["task_set"]
