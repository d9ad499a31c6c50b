"""Issue 29 in the engine: every finished episode says how it ended (``info["outcome"]``), and a
failure that is not the model's ends the episode ungraded - reward NaN in ``step``, ``None`` in
the record - with what it opened released at once; ``episode_timeout`` is one such failure."""

import asyncio
import json
import math
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

from benchmax_gym.core import ListTasks, Rubric, Task, ToolEnv, ToolError, ToolFailure, Toolset, tool
from benchmax_gym.core.outcomes import DEADLINE, FAILURES, SCORED, TOOL_UNAVAILABLE, TRUNCATED

sys.path.insert(0, str(Path(__file__).parent))
from sample_tools import add, anap, nap


@tool(inline=True)
def gone() -> str:
    """Its backend is gone."""
    raise ToolFailure("the server went away", TOOL_UNAVAILABLE)


@tool(inline=True)
def refuse() -> str:
    """The model's own mistake: scored as today."""
    raise ToolError("no such row")


class Env(ToolEnv):
    released: list

    def open_episode(self, episode, options):
        self.released = []
        episode.resources.callback(self.released.append, episode.rollout_id)


def make(**kwargs) -> Env:
    tasks = ListTasks([Task(f"t{i}", f"Question {i}", "42") for i in range(3)])
    return Env(tasks=tasks, toolset=Toolset([add, nap, anap, gone, refuse]),
               rubric=Rubric([lambda completion, answer: float(completion == answer)]), system_prompt="Test.", **kwargs)


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def test_a_final_answer_is_scored_and_steps_before_it_carry_no_outcome():
    env = make()
    env.reset(seed=0)
    *_, info = env.step(call("add", a=1, b=2))
    assert "outcome" not in info
    *_, info = env.step(call("refuse"))  # the model's mistake is part of a scored episode
    assert info["error"] == "tool_error" and "outcome" not in info
    _, reward, terminated, truncated, info = env.step("42")
    assert (reward, terminated, truncated, info["outcome"]) == (1.0, True, False, SCORED)
    record = env.episode_record()
    assert record["outcome"] == SCORED and record["reward"] == 1.0
    env.close()


def test_the_turn_limit_is_truncated_and_graded():
    env = make(max_turns=2)
    env.reset(seed=0)
    env.step(call("add", a=1, b=2))
    _, reward, terminated, truncated, info = env.step(call("add", a=1, b=2))
    assert (reward, terminated, truncated, info["outcome"]) == (0.0, False, True, TRUNCATED)
    assert env.episode_record()["outcome"] == TRUNCATED
    env.close()


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("action", [call("gone"), call("gone") + call("add", a=1, b=2)])
def test_a_tool_failure_ends_the_episode_ungraded_and_releases_it(action, asynchronous):
    env = make()
    env.reset(seed=0)
    result = asyncio.run(env.astep(action)) if asynchronous else env.step(action)
    _, reward, terminated, truncated, info = result
    assert math.isnan(reward) and not terminated and truncated
    assert info["outcome"] == TOOL_UNAVAILABLE and info["reward_components"] == {}
    assert info["error"] == TOOL_UNAVAILABLE and len(info["tool_calls"]) == 1  # the call after it never ran
    assert env.released == [env.episode.rollout_id]  # released now, not at the next reset
    record = env.episode_record()
    assert record["outcome"] == TOOL_UNAVAILABLE and record["reward"] is None and record["reward_components"] == {}
    with pytest.raises(gym.error.ResetNeeded):
        env.step("42")
    env.reset(seed=1)
    assert env.episode_record()["outcome"] is None
    env.close()


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("name", ["nap", "anap"])
def test_a_call_that_would_run_past_the_deadline_is_cut_to_the_time_left(name, asynchronous):
    env = make(episode_timeout=0.5, tool_timeout=30)
    env.reset(seed=0)
    action = call(name, seconds=20)
    _, reward, terminated, truncated, info = asyncio.run(env.astep(action)) if asynchronous else env.step(action)
    assert info["outcome"] == DEADLINE and math.isnan(reward) and truncated and not terminated
    assert info["error"] == DEADLINE and env.released
    assert env.episode_record()["reward"] is None
    env.close()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_step_that_starts_past_the_deadline_runs_nothing_and_is_not_graded(asynchronous):
    env = make(episode_timeout=2)  # (room for the first step on a loaded machine: it must be in time)
    env.reset(seed=0)
    *_, info = env.step(call("add", a=1, b=2))  # in time
    assert "outcome" not in info
    time.sleep(2.1)
    result = asyncio.run(env.astep("42")) if asynchronous else env.step("42")  # the right answer, too late
    obs, reward, terminated, truncated, info = result
    assert info["outcome"] == DEADLINE and math.isnan(reward) and truncated and not terminated
    assert "time limit" in obs and env.episode_record()["reward"] is None
    assert info["outcome_detail"] == "the episode's time limit (2 s) passed"
    env.close()


def test_the_deadline_is_per_episode():
    env = make(episode_timeout=2)  # (room for the second episode's step on a loaded machine)
    env.reset(seed=0)
    time.sleep(2.1)
    env.reset(seed=1)  # a new episode, a new deadline
    *_, info = env.step("42")
    assert info["outcome"] == SCORED
    env.close()


@pytest.mark.parametrize("value", [0, -1, "10", float("nan"), True])
def test_a_bad_episode_timeout_fails_at_make_naming_it(value):
    with pytest.raises(ValueError, match="episode_timeout"):
        gym.make("benchmax/Math-v0", python_tool=False, episode_timeout=value)


def test_episode_timeout_reaches_a_family_through_make():
    env = gym.make("benchmax/Math-v0", python_tool=False, episode_timeout=60)
    assert env.unwrapped.episode_timeout == 60.0
    env.close()


def test_the_failures_are_the_outcomes_that_are_not_signal():
    assert DEADLINE in FAILURES and TOOL_UNAVAILABLE in FAILURES and SCORED not in FAILURES


def test_sandboxed_code_is_cut_at_the_deadline_but_a_model_loop_is_the_models_timeout():
    """The python tool's call is bounded by the time left: a loop cut by the deadline ends the
    episode with ``deadline``; the same loop hitting the call's own timeout is the model's
    mistake, scored as before (``info["error"] == "tool_timeout"``, the episode goes on)."""
    from benchmax_gym.core.sandbox import bubblewrap_status
    if not bubblewrap_status()[0]:
        pytest.skip("bubblewrap is not usable here")
    loop = call("python", code="while True: pass")
    env = gym.make("benchmax/Math-v0", tool_timeout=1, episode_timeout=600)
    env.reset(seed=0)
    _, reward, _, truncated, info = env.step(loop)
    assert info["error"] == "tool_timeout" and "outcome" not in info and reward == 0.0 and not truncated
    env.close()
    env = gym.make("benchmax/Math-v0", tool_timeout=30, episode_timeout=1.5)
    env.reset(seed=0)
    _, reward, _, truncated, info = env.step(loop)
    assert info["outcome"] == DEADLINE and math.isnan(reward) and truncated
    env.close()


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("name", ["nap", "anap"])
def test_a_tool_past_its_timeout_ends_the_episode_with_tool_timeout(name, asynchronous):
    """A tool the engine had to time out (not model-written code, which times itself out in the
    sandbox and is the model's error) failed: ``tool_timeout``, ungraded, without waiting for it."""
    env = make(tool_timeout=0.2)
    env.reset(seed=0)
    action = call(name, seconds=5)
    obs, reward, terminated, truncated, info = asyncio.run(env.astep(action)) if asynchronous else env.step(action)
    assert info["outcome"] == info["error"] == "tool_timeout" and "timed out" in obs
    assert math.isnan(reward) and truncated and not terminated and env.episode_record()["reward"] is None
    assert f"'{name}'" in info["outcome_detail"] and "timed out" in info["outcome_detail"]
    env.close()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_reward_that_cannot_score_fails_the_episode_instead_of_scoring_zero(asynchronous):
    from benchmax_gym.core.outcomes import MODEL_ERROR, RewardFailure

    def judge(completion):
        raise RewardFailure("the judge endpoint answered 500 three times")

    def broken(completion):
        raise ValueError("a bug in the rubric: scored 0, as before")

    tasks = ListTasks([Task("t0", "Question 0", "42")])
    env = Env(tasks=tasks, toolset=Toolset([add]), rubric=Rubric([judge, broken]), system_prompt="Test.")
    env.reset(seed=0)
    step = (lambda a: asyncio.run(env.astep(a))) if asynchronous else env.step
    _, reward, terminated, truncated, info = step("42")
    assert math.isnan(reward) and (terminated, truncated, info["outcome"]) == (False, True, MODEL_ERROR)
    assert env.episode_record()["reward"] is None and env.released
    assert info["outcome_detail"] == "a reward could not score: the judge endpoint answered 500 three times"
    assert "500 three times" not in str(info["messages"])  # the model is told only that it could not be graded
    env2 = Env(tasks=tasks, toolset=Toolset([add]), rubric=Rubric([broken]), system_prompt="Test.")
    env2.reset(seed=0)
    _, reward, _, _, info = env2.step("42")
    assert reward == 0.0 and info["outcome"] == SCORED and "broken" in info["reward_errors"]
    with pytest.raises(ValueError, match="outcome must be one of"):
        RewardFailure("x", outcome="scored")


def test_a_failed_first_step_under_gym_make_is_not_flagged_by_gymnasiums_checker():
    """gym.make's PassiveEnvChecker checks the first step and warns about a NaN reward: for a
    failure that NaN is the design, so it stays quiet; the step still reports the failure."""
    import warnings

    from benchmax_gym.testing.chaos import CHAOS_ID

    env = gym.make(CHAOS_ID, tool_timeout=0.2)
    assert "PassiveEnvChecker" in str(env)
    env.reset(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        _, reward, _, truncated, info = env.step(call("fetch", seconds=30))
    assert info["outcome"] == "tool_timeout" and math.isnan(reward) and truncated
    assert not [w for w in caught if "NaN" in str(w.message)], [str(w.message) for w in caught]
    env.close()


def test_recorded_episodes_carry_their_outcome_and_an_abandoned_one_is_cancelled(tmp_path):
    """RecordEpisodes: a failed episode's line has reward null (its step's NaN is not JSON), an
    episode reset or closed after its first step is written as cancelled, one never stepped is
    not written."""
    from benchmax_gym.testing.chaos import CHAOS_ID
    from benchmax_gym.wrappers import RecordEpisodes

    path = tmp_path / "episodes.jsonl"
    env = RecordEpisodes(gym.make(CHAOS_ID, tool_timeout=0.2), path)
    env.reset(seed=0, options={"task_index": 0})
    env.step(call("fetch", seconds=30))  # tool_timeout
    env.reset(seed=1, options={"task_index": 1})
    env.step(call("calculator", expression="1+1"))
    env.reset(seed=2, options={"task_index": 2})  # the episode of seed 1 abandoned: cancelled
    env.reset(seed=3, options={"task_index": 3})  # seed 2 never stepped: nothing to write
    env.step(f"\\boxed{{{env.unwrapped.episode.task.answer}}}")
    env.reset(seed=4, options={"task_index": 4})
    env.step(call("calculator", expression="1+1"))
    env.close()  # closed mid-episode: cancelled
    lines = path.read_text().splitlines()
    records = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in a record")) for line in lines]
    assert [(r["seed"], r["outcome"], r["reward"]) for r in records] == [
        (0, "tool_timeout", None), (1, "cancelled", None), (3, "scored", 1.0), (4, "cancelled", None)]
    assert records[1]["turns"] == 1 and records[1]["reward_components"] == {}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_per_turn_reward_that_cannot_score_says_why_in_info_and_never_to_the_model(asynchronous):
    """A per-turn leaf's RewardFailure mid-episode (the one-call step and the general one): the
    reason reaches info["outcome_detail"], and neither the observation nor the transcript."""
    from benchmax_gym.core import RewardFn
    from benchmax_gym.core.outcomes import MODEL_ERROR, RewardFailure

    def progress(tool_results):
        raise RewardFailure("the progress judge timed out")

    env = Env(tasks=ListTasks([Task("t0", "Question 0", "42")]), toolset=Toolset([add]),
              rubric=Rubric([RewardFn("progress", progress, per_turn=True)]), system_prompt="Test.")
    env.reset(seed=0)
    action = call("add", a=1, b=2)
    obs, reward, _, truncated, info = asyncio.run(env.astep(action)) if asynchronous else env.step(action)
    assert math.isnan(reward) and truncated and info["outcome"] == MODEL_ERROR
    assert info["outcome_detail"] == "a reward could not score: the progress judge timed out"
    assert "progress judge" not in json.dumps([obs, env.messages])
    env.close()
