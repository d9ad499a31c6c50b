"""Group rewards: a GroupRubric over the k rollouts of one task, from records, a vector env's
group (real worker processes) and the built-in group functions; failures never enter a group."""

import math

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.group import (
    GroupRubric,
    best_of_k,
    diversity_penalty,
    relative_rank,
    score_groups,
    score_vector_group,
)
from benchmax_gym.core.outcomes import RewardFailure


def record(task, reward, text="x", outcome="scored"):
    return {"task_index": task, "reward": reward, "outcome": outcome, "actions": [text],
            "reward_components": {} if reward is None else {"correct": reward}}


def test_relative_rank_best_of_k_and_diversity():
    assert relative_rank([1.0, 0.0, 0.0, 1.0]) == [5 / 6, 1 / 6, 1 / 6, 5 / 6]
    assert relative_rank([0.3]) == [0.5]
    assert best_of_k([0.2, 0.9, 0.9]) == [0.0, 1.0, 1.0]
    assert diversity_penalty(["A  b", "a b", "c"]) == [-0.5, -0.5, 0.0]
    assert diversity_penalty(["a", "b"]) == [0.0, 0.0]


def test_add_keeps_the_own_reward_and_replace_drops_it():
    group = [record(0, 1.0, "a"), record(0, 0.0, "b"), record(0, 0.0, "b")]
    added = GroupRubric([("diverse", diversity_penalty, 0.5)]).score(group)
    assert [r["reward"] for r in added] == [1.0, -0.25, -0.25]
    assert added[1]["individual_reward"] == 0.0
    assert added[1]["reward_components"] == {"correct": 0.0, "diverse": -0.5}  # every leaf kept
    assert added[1]["group_components"] == {"diverse": -0.5} and added[1]["group_size"] == 3
    replaced = GroupRubric([("rank", relative_rank, 1.0)], combine="replace").score(group)
    assert [r["reward"] for r in replaced] == [1.0, 0.25, 0.25]
    assert group[0]["reward"] == 1.0 and "group_components" not in group[0]  # the input is not changed


def test_a_failed_episode_never_enters_the_group():
    seen = []

    def spy(rewards, completions):
        seen.append((rewards, completions))
        return relative_rank(rewards)

    group = [record(0, 1.0, "a"), record(0, None, "lost", outcome="tool_unavailable"), record(0, 0.0, "b")]
    out = GroupRubric([("rank", spy)], combine="replace").score(group)
    assert seen == [([1.0, 0.0], ["a", "b"])]  # two members: the failed one is not one
    assert out[1] == group[1]  # unchanged: no reward
    assert [out[0]["reward"], out[2]["reward"]] == [1.0, 0.0] and out[0]["group_size"] == 2


def test_groups_are_by_task_and_keep_their_order():
    records = [record(0, 1.0), record(1, 0.0), record(0, 0.0), record(1, 1.0)]
    out = score_groups(records, GroupRubric([best_of_k], combine="replace"))
    assert [(r["task_index"], r["reward"]) for r in out] == [(0, 1.0), (1, 0.0), (0, 0.0), (1, 1.0)]


def test_a_group_function_that_cannot_score_fails_the_group_and_other_errors_score_zero():
    def down(rewards):
        raise RewardFailure("judge unreachable")

    out = GroupRubric([("judge", down)]).score([record(0, 1.0), record(0, 0.0)])
    assert all(r["reward"] is None and r["outcome"] == "model_error" for r in out)
    wrong = GroupRubric([("short", lambda rewards: [1.0]), ("nan", lambda rewards: [math.nan] * len(rewards))])
    out = wrong.score([record(0, 1.0), record(0, 0.0)])
    assert [r["reward"] for r in out] == [1.0, 0.0]
    assert "returned 1 scores for a group of 2" in out[0]["group_errors"]["short"]
    assert "nan" in out[0]["group_errors"]


async def _async_rank(rewards):
    return relative_rank(rewards)


def test_async_group_functions_from_sync_and_async_callers():
    import asyncio

    rubric = GroupRubric([("rank", _async_rank)], combine="replace")
    group = [record(0, 0.0), record(0, 1.0)]
    assert [r["reward"] for r in rubric.score(group)] == [0.0, 1.0]
    assert [r["reward"] for r in asyncio.run(rubric.ascore(group))] == [0.0, 1.0]

    async def inside_a_loop():
        return rubric.score(group)  # a sync call from a running loop goes through a helper thread

    assert [r["reward"] for r in asyncio.run(inside_a_loop())] == [0.0, 1.0]


@pytest.mark.parametrize("bad, message", [
    (lambda: GroupRubric([]), "at least one"),
    (lambda: GroupRubric([relative_rank], combine="sum"), "combine must be one of"),
    (lambda: GroupRubric([("r", lambda rewards, grade: rewards)]), "asks for ['grade']"),
    (lambda: GroupRubric([("r", relative_rank, float("inf"))]), "finite number"),
    (lambda: GroupRubric([("r", relative_rank, 1.0), ("r", best_of_k, 1.0)]), "duplicate"),  # (derived names are numbered)
])
def test_bad_group_rubrics_are_refused_naming_the_problem(bad, message):
    with pytest.raises((ValueError, TypeError), match=None) as info:
        bad()
    assert message in str(info.value)


def test_a_vector_env_group_of_one_task():
    """make_vec with options=[{"task_index": i}] * k: the k episodes, played in worker processes,
    scored together once all have ended."""
    k = 4
    envs = gym.make_vec("benchmax/Math-v0", num_envs=k, python_tool=False, num_workers=2)
    try:
        _, infos = envs.reset(seed=0, options=[{"task_index": 3}] * k)
        assert len(set(infos["task_id"])) == 1
        answer = gym.make("benchmax/Math-v0", python_tool=False).unwrapped.tasks.get(3).answer
        actions = [f"\\boxed{{{answer}}}", "\\boxed{-1}", f"\\boxed{{{answer}}}", "\\boxed{-2}"]
        _, rewards, terminated, _, _ = envs.step(actions)
        assert terminated.all()
        with pytest.raises(ValueError, match="group_rubric is missing"):
            score_vector_group(envs)
        out = score_vector_group(envs, GroupRubric([("rank", relative_rank)], combine="replace"))
        assert [r["individual_reward"] for r in out] == list(rewards)
        assert [r["reward"] for r in out] == [5 / 6, 1 / 6, 5 / 6, 1 / 6]
        assert all(r["task_index"] == 3 for r in out)
        envs.step(["\\boxed{0}"] * k)  # autoreset (NEXT_STEP): new episodes
        with pytest.raises(ValueError, match="have not finished"):
            score_vector_group(envs, GroupRubric([relative_rank]))
    finally:
        envs.close()
