"""eval holds each task's k samples: a GroupRubric scores them together once all have run, in
one process or spread over workers, and a resumed run scores the same groups the same way."""

import json

from benchmax_gym.core.group import GroupRubric, relative_rank
from benchmax_gym.eval import evaluate


def policy(obs, info):
    """A wrong answer, every time."""
    return "\\boxed{-1}"


def test_groups_of_k_samples_are_ranked_together_in_workers_and_on_resume(tmp_path):
    rank = GroupRubric([("rank", relative_rank)], combine="replace")
    out = tmp_path / "run"
    result = evaluate("benchmax/Math-v0", "solver", env_kwargs={"python_tool": False}, tasks=2, k=3, workers=2,
                      concurrency=2, out=out, group_rubric=rank, preflight=False)
    assert [r["individual_reward"] for r in result.records] == [1.0] * 6
    assert [r["reward"] for r in result.records] == [0.5] * 6  # all tie: the middle rank
    assert [r["group_size"] for r in result.records] == [3] * 6
    assert result.summary["mean_reward"]["value"] == 0.5  # the summary is over the group-scored rewards
    assert result.summary["pass_at_k"]["1"] == 1.0  # success stays each episode's own
    own = [json.loads(line)["reward"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert own == [1.0] * 6  # what resuming reads: each episode's own
    grouped = [json.loads(line) for line in (out / "group_rewards.jsonl").read_text().splitlines()]
    assert [(g["task_index"], g["sample"], g["reward"]) for g in grouped] == [(t, s, 0.5) for t in range(2)
                                                                               for s in range(3)]
    again = evaluate("benchmax/Math-v0", "solver", env_kwargs={"python_tool": False}, tasks=2, k=3, out=out,
                     group_rubric=rank, preflight=False)
    assert [r["reward"] for r in again.records] == [0.5] * 6


def test_without_a_group_rubric_records_are_unchanged():
    result = evaluate("benchmax/Math-v0", policy, env_kwargs={"python_tool": False}, tasks=1, k=2, preflight=False)
    assert all("group_size" not in r and "individual_reward" not in r for r in result.records)
    assert "group_rubric" not in result.summary and "judge" not in result.summary


def test_a_group_rubric_that_raises_is_said_in_the_summary_not_averaged_in_silently(tmp_path):
    """Task 1's group function raises: its component scores 0 (a rubric leaf's rule), and the
    summary says how many episodes that was (it read as a plain mean of 0.5)."""
    def fussy(rewards, task):
        if task.id == "gen-1":
            raise KeyError("difficulty")
        return [1.0] * len(rewards)

    result = evaluate("benchmax/Math-v0", "solver", env_kwargs={"python_tool": False}, tasks=2, k=2,
                      out=tmp_path / "run", group_rubric=GroupRubric([("fussy", fussy)], combine="replace"),
                      preflight=False)
    assert [r["reward"] for r in result.records] == [1.0, 1.0, 0.0, 0.0]
    assert result.summary["group_errors"] == 2
    assert any(n.startswith("2 episodes' group rubric raised") for n in result.summary["notes"])
    grouped = [json.loads(line) for line in (tmp_path / "run" / "group_rewards.jsonl").read_text().splitlines()]
    assert [g["group_errors"] for g in grouped[2:]] == [{"fussy": "KeyError: 'difficulty'"}] * 2
    clean = evaluate("benchmax/Math-v0", "solver", env_kwargs={"python_tool": False}, tasks=1, k=2,
                     group_rubric=GroupRubric([("fussy", fussy)], combine="replace"), preflight=False)
    assert "group_errors" not in clean.summary
