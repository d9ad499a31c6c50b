"""Resuming an eval run compares the tasks ``--tasks`` chose, not how it spelled them: a run
started with ``--tasks 3`` and resumed with ``--tasks 0:3`` was refused as another run."""

import pytest

from benchmax_gym.eval import EvalError, evaluate

ENV = "benchmax/Math-v0"
ENV_KWARGS = {"python_tool": False}


def test_the_same_tasks_spelled_otherwise_resume_and_other_tasks_are_refused(tmp_path):
    out = tmp_path / "run"
    evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=3, out=out)
    for spelled in ("3", "0:3", ":3", (0, 3)):  # (the CLI hands over "3"; the API 3)
        resumed = evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=spelled, out=out)
        assert sorted(r["task_index"] for r in resumed.records) == [0, 1, 2]
    for other, said in (("0:4", '"0:4"'), ("1:3", '"1:3"'), (2, "2")):
        with pytest.raises(EvalError, match=rf"other settings \(tasks\): --tasks 3 then, {said} now"):
            evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=other, out=out)


def test_all_of_a_finite_source_is_its_range_and_a_longer_range_is_not(tmp_path):
    out = tmp_path / "run"
    kwargs = {**ENV_KWARGS, "task_args": {"num_tasks": 4}}
    evaluate(ENV, "solver", env_kwargs=kwargs, tasks="all", out=out)
    for spelled in ("0:4", 4, "0:"):
        assert len(evaluate(ENV, "solver", env_kwargs=kwargs, tasks=spelled, out=out).records) == 4
    for other in ("0:3", "1:"):
        with pytest.raises(EvalError, match=rf'--tasks "all" then, "{other}" now'):
            evaluate(ENV, "solver", env_kwargs=kwargs, tasks=other, out=out)
