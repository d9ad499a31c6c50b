"""What a trainer trusts of the reward machinery, driven through the authoring API
(``register_tool_env``, ``gym.make``, ``step``): whatever a user's reward function returns, a step
gives a finite float or the documented failure (NaN, an outcome in ``info``), a value that is no
score is reported in ``info["reward_errors"]`` rather than paid, and a group is one task's rollouts."""

import asyncio
import functools
import json
import math
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from benchmax_gym import final_answer, register_tool_env
from benchmax_gym.core import RewardFn, Rubric, ToolFailure, product
from benchmax_gym.core import outcomes
from benchmax_gym.core.group import GroupRubric, best_of_k, relative_rank, score_groups, score_vector_group

README = Path(__file__).resolve().parents[2] / "README.md"
_ids = iter(range(10**6))


def make(rubric, tools=(), answer="5", **kwargs):
    """A fresh id of one task (its answer ``answer``) graded by ``rubric``, made and reset."""
    env_id = register_tool_env(f"audit/Rewards{next(_ids)}-v0", tools=list(tools), rubric=rubric,
                               tasks=[{"prompt": "What is 2+3?", "answer": answer}], **kwargs)
    env = gym.make(env_id)
    env.reset(seed=0)
    return env


def the_answer(completion):  # a bug a user can write: the model's answer, not a score
    return final_answer(completion)


@pytest.mark.parametrize("returned", [the_answer, lambda completion: b"1", lambda completion: "0.7"])
@pytest.mark.parametrize("per_turn", [False, True])
def test_a_reward_returning_text_is_an_error_never_a_score(returned, per_turn):
    env = make(Rubric([RewardFn("leaf", returned, per_turn=per_turn), ("base", lambda completion: 0.25, 1.0)]))
    _, reward, terminated, _, info = env.step("<answer>5</answer>")
    assert (reward, terminated, info["outcome"]) == (0.25, True, "scored")  # not 5.0 (the answer read as a number)
    assert info["reward_components"]["leaf"] == 0.0
    assert "not a number" in info["reward_errors"]["leaf"] and "5" not in info["reward_errors"]["leaf"]
    env.close()


class AsyncScore:
    async def __call__(self, completion):
        await asyncio.sleep(0)
        return 0.5


def logged(fn):
    """A plain decorator: its sync wrapper hands back the async function's coroutine."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@logged
async def wrapped_score(completion):
    await asyncio.sleep(0)
    return 0.5


@pytest.mark.parametrize("fn", [AsyncScore(), wrapped_score, lambda completion: wrapped_score(completion)],
                         ids=["async __call__", "decorated", "lambda"])
@pytest.mark.parametrize("per_turn", [False, True])
def test_an_async_reward_behind_a_callable_or_a_sync_wrapper_is_awaited(fn, per_turn):
    env = make(Rubric([RewardFn("leaf", fn, per_turn=per_turn)]))
    _, reward, _, _, info = env.step("<answer>5</answer>")
    assert reward == 0.5 and info["reward_components"] == {"leaf": 0.5}
    assert "reward_errors" not in info
    env.close()


def test_an_async_reward_behind_a_sync_wrapper_is_awaited_by_astep():
    env = make(Rubric([RewardFn("leaf", lambda completion: wrapped_score(completion))]))
    _, reward, *_ = asyncio.run(env.unwrapped.astep("<answer>5</answer>"))
    assert reward == 0.5
    env.close()


def huge(completion):
    return 1e200


@pytest.mark.parametrize("rubric", [
    Rubric([product(huge, ("huge2", huge, 1.0), name="scaled")]),   # 1e400: inf
    Rubric([("a", lambda completion: 1e308, 1.0), ("b", lambda completion: 1e308, 1.0)]),
    Rubric([RewardFn("a", lambda completion: 1e308, per_turn=True), RewardFn("b", lambda completion: 1e308, per_turn=True),
            ("final", lambda completion: 0.0, 1.0)]),
], ids=["product", "weighted sum", "per-turn sum"])
def test_finite_scores_that_combine_past_a_float_are_an_error_never_an_inf_reward(rubric):
    env = make(rubric)
    _, reward, _, _, info = env.step("<answer>5</answer>")
    assert reward == 0.0 and info["outcome"] == "scored"
    assert any("not finite" in why for why in info["reward_errors"].values())
    env.close()


@pytest.mark.parametrize("returned, why", [
    (lambda completion: None, "NoneType"), (lambda completion: float("nan"), "not finite"),
    (lambda completion: -math.inf, "not finite"), (lambda completion: np.array([0.5, 0.7]), "TypeError"),
    (lambda completion: 1 / 0, "ZeroDivisionError"), (lambda completion: {"nan": math.nan, "one": 1}, "not finite"),
])
def test_a_value_that_is_no_score_is_reported_and_the_others_still_pay(returned, why):
    env = make(Rubric([("leaf", returned, 1.0), ("base", lambda completion: 0.25, 1.0)]))
    _, reward, _, _, info = env.step("<answer>5</answer>")
    paid = 0.5 if "one" in info["reward_components"] else 0.0  # (the dict's good entry: half the leaf)
    assert reward == 0.25 + paid and info["outcome"] == "scored"
    assert why in " ".join(info["reward_errors"].values())
    env.close()


@pytest.mark.parametrize("returned, expected", [
    (lambda completion: True, 1.0), (lambda completion: np.float32(0.5), 0.5), (lambda completion: np.int64(1), 1.0),
    (lambda completion: __import__("decimal").Decimal("0.25"), 0.25),
    (lambda completion: __import__("fractions").Fraction(1, 4), 0.25),
    (lambda completion: -2.0, -2.0), (lambda completion: 3.0, 3.0),  # penalties and bonuses are the user's to give
])
def test_numbers_of_any_type_pay_as_floats(returned, expected):
    env = make(Rubric([returned]))
    _, reward, _, _, info = env.step("<answer>5</answer>")
    assert type(reward) is float and reward == expected and "reward_errors" not in info
    env.close()


def lookup(city: str) -> str:
    """Look a city up.

    Args:
        city: its name
    """
    if city == "gone":
        raise ToolFailure("the backend went away", outcomes.TOOL_UNAVAILABLE)
    return "Peru"


def test_a_failure_after_per_turn_rewards_leaves_a_nan_return_and_no_graded_reward():
    found = RewardFn("found", lambda tool_results: 0.2 * ("Peru" in tool_results), per_turn=True)
    env = make(Rubric([lambda completion: 1.0, found]), tools=[lookup], max_turns=5)
    call = lambda city: "<tool_call>" + json.dumps({"name": "lookup", "arguments": {"city": city}}) + "</tool_call>"
    rewards = [env.step(call("Lima"))[1]]
    _, reward, terminated, truncated, info = env.step(call("gone"))
    rewards.append(reward)
    assert rewards[0] == 0.2 and math.isnan(rewards[1]) and math.isnan(sum(rewards))  # the return is no signal
    assert (terminated, truncated, info["outcome"], info["reward_components"]) == (False, True, "tool_unavailable", {})
    assert "went away" in info["outcome_detail"]
    assert env.unwrapped.episode_record()["reward"] is None
    env.close()


def record(task, reward, text="x", outcome="scored", **extra):
    return {"task_index": task, "reward": reward, "outcome": outcome, "actions": [text], "reward_components": {}, **extra}


@pytest.mark.parametrize("returned", [lambda rewards: "101", lambda rewards: {"a": 1, "b": 0, "c": 1},
                                      lambda rewards: ["1", "0", "1"]], ids=["str", "dict", "strs"])
def test_a_group_function_returning_text_or_a_mapping_scores_zero_and_says_why(returned):
    group = [record(0, 1.0), record(0, 0.0), record(0, 0.0)]
    out = GroupRubric([("bad", returned, 1.0)], combine="replace").score(group)
    assert [r["reward"] for r in out] == [0.0, 0.0, 0.0]  # not 1, 0, 1 read off the characters
    assert out[0]["group_errors"]


def test_a_record_whose_reward_is_a_nan_of_any_type_is_no_member():
    group = [record(0, np.float32("nan")), record(0, 1.0), record(0, 0.0)]
    out = GroupRubric([relative_rank], combine="replace").score(group)
    assert out[0] == group[0]
    assert [(r["reward"], r["group_size"]) for r in out[1:]] == [(1.0, 2), (0.0, 2)]


def test_records_of_two_mixture_members_with_one_task_index_are_two_groups():
    records = [record(0, 1.0, member="Math-v0", difficulty=0), record(0, 0.0, member="Math-v0", difficulty=0),
               record(0, 1.0, member="CRM-v0", difficulty=0), record(0, 1.0, member="Math-v0", difficulty=1)]
    out = score_groups(records, GroupRubric([best_of_k], combine="replace"))
    assert [(r["reward"], r["group_size"]) for r in out] == [(1.0, 2), (0.0, 2), (1.0, 1), (1.0, 1)]


def test_a_mixture_vector_env_scores_each_members_group_apart():
    def right(completion, answer):
        return float(final_answer(completion) == answer)

    a = register_tool_env(f"audit/MixA{next(_ids)}-v0", tools=[], tasks=[{"prompt": "a?", "answer": "A"}], rubric=right)
    b = register_tool_env(f"audit/MixB{next(_ids)}-v0", tools=[], tasks=[{"prompt": "b?", "answer": "B"}], rubric=right)
    names = [a.split("/")[1], b.split("/")[1]]
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=4, members={a: 1, b: 1})
    try:
        envs.reset(seed=0, options=[{"member": names[0], "task_index": 0}] * 2 + [{"member": names[1], "task_index": 0}] * 2)
        envs.step(["<answer>A</answer>", "<answer>no</answer>", "<answer>B</answer>", "<answer>B</answer>"])
        out = score_vector_group(envs, GroupRubric([relative_rank], combine="replace"))
    finally:
        envs.close()
    assert [(r["task_id"].split("/")[0], r["reward"], r["group_size"]) for r in out] == [
        (names[0], 1.0, 2), (names[0], 0.0, 2), (names[1], 0.5, 2), (names[1], 0.5, 2)]


def test_the_outcomes_readme_documents_are_the_ones_the_module_has():
    text = README.read_text(encoding="utf-8")
    table = text[text.index("| outcome | meaning |"):]
    table = table[:table.index("\n\n")]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M))
    assert documented == set(outcomes.OUTCOMES)
    assert {o for o in documented if "| yes |" in next(line for line in table.splitlines() if f"`{o}`" in line)} \
        == set(outcomes.SIGNAL)
    namespace: dict = {}
    exec("from benchmax_gym.core.outcomes import *", namespace)  # the public names, the detail helper among them
    assert {"outcome_detail", "RewardFailure", "is_failure", "failed_reward", *[n.upper() for n in outcomes.OUTCOMES]} \
        <= set(namespace)
