"""Rubric trees (issue 30): combinators, dict normalisation, per-turn leaves and shaping, on the
engine with a small real toolset."""

import asyncio
import json
import math
import sys
from pathlib import Path

import pytest

from benchmax_gym.core import ListTasks, RewardFn, Rubric, Task, ToolEnv, Toolset, all_of, gate, milestones, min_of, product
from benchmax_gym.core.outcomes import MODEL_ERROR, RewardFailure

sys.path.insert(0, str(Path(__file__).parent))
from sample_tools import add  # noqa: E402


def exact(completion, answer):
    return float(completion.strip() == answer)


def make_env(rubric, **kwargs):
    return ToolEnv(tasks=ListTasks([Task("t0", "Add, then say 42.", "42")]), toolset=Toolset([add]), rubric=rubric,
                   system_prompt="Test.", **kwargs)


def call(a, b):
    return "<tool_call>" + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}) + "</tool_call>"


def two_calls(a, b):
    return call(a, b) + call(b, a)


def score(rubric, completion="42"):
    return rubric.score(completion=completion, answer="42")


# -- composition ------------------------------------------------------------------------------


def test_a_dict_returning_function_shares_its_weight_among_its_entries():
    both = Rubric([RewardFn("bm", lambda completion: {"a": 1.0, "b": 1.0}, 0.5)])
    assert score(both) == (0.5, {"a": 1.0, "b": 1.0}, {})  # not 2.0 (or 1.0): the entries sum to the weight
    half = Rubric([RewardFn("bm", lambda completion: {"a": 1.0, "b": 0.0})])
    assert score(half)[0] == 0.5
    parts = Rubric([RewardFn("bm", lambda completion: {"a": 1.0, "b": 0.0, "c": 1.0}, 2.0, parts={"a": 3, "b": 1})])
    reward, components, _ = score(parts)
    assert reward == pytest.approx(2.0 * 3 / 4) and components == {"a": 1.0, "b": 0.0, "c": 1.0}  # c: reported only
    empty = Rubric([RewardFn("bm", lambda completion: {})])
    assert score(empty)[0] == 0.0 and "empty dict" in score(empty)[2]["bm"]


def test_combinators_and_every_leaf_in_the_components():
    def fmt(completion):
        return 0.5

    def untouched(completion):
        return float(completion != "vandal")

    rubric = Rubric([
        gate(untouched, Rubric([exact, ("fmt", fmt, 0.5)], name="quality"), name="safe"),
        ("floor", min_of(("same", exact), ("half", lambda completion: 0.5)), 0.25),
        ("scaled", product(("p1", lambda completion: 0.5), ("p2", lambda completion: 0.5)), 1.0),
        ("both", all_of(("c1", lambda completion: 1.0), ("c2", lambda completion: 0.9)), 1.0),
    ])
    reward, components, errors = score(rubric)
    assert reward == pytest.approx((1.0 + 0.5 * 0.5) + 0.25 * 0.5 + 0.25 + 0.0)
    assert components == {"untouched": 1.0, "exact": 1.0, "fmt": 0.5, "same": 1.0, "half": 0.5, "p1": 0.5, "p2": 0.5,
                          "c1": 1.0, "c2": 0.9}
    vandal, components, _ = score(rubric, "vandal")
    assert vandal == pytest.approx(0.25 * 0.0 + 0.25)  # the gate zeroes its body; its leaves are still reported
    assert components["fmt"] == 0.5 and components["untouched"] == 0.0
    assert all_of(lambda completion: 0.5, threshold=0.5).combine([0.5]) == 1.0
    assert rubric.max_reward == pytest.approx(1.5 + 0.25 + 1.0 + 1.0)
    drawn = repr(rubric)
    for line in ("Rubric rubric: weighted sum", "├─ 1 × safe: gate (body if untouched >= 1, else 0)",
                 "│  └─ quality: weighted sum", "│     ├─ 1 × exact", "├─ 0.25 × floor: min", "└─ 1 × both: all_of"):
        assert line in drawn, drawn


def test_weights_reach_nested_leaves_and_nodes_and_names_stay_unique():
    rubric = Rubric([gate(lambda completion: 1.0, Rubric([exact, ("fmt", lambda completion: 1.0, 0.0)], name="q"))])
    assert score(rubric.with_weights({"fmt": 0.5}))[0] == 1.5
    assert score(rubric.with_weights({"gate": 2.0}))[0] == 2.0
    env = make_env(rubric, reward_weights={"fmt": 1.0})
    env.reset(seed=0)
    assert env.step("42")[1] == 2.0
    with pytest.raises(ValueError, match="unknown component.*'nope'"):
        rubric.with_weights({"nope": 1.0})
    assert Rubric([exact, min_of(exact)]).names == ["exact", "exact#2"]  # a derived name is numbered
    with pytest.raises(ValueError, match="duplicate reward component name 'exact'"):
        Rubric([("exact", exact, 1.0), min_of(("exact", exact, 1.0))])  # two the user gave: refused
    with pytest.raises(ValueError, match="weight of reward component"):
        Rubric([("x", exact, math.inf)])


def test_leaves_receive_state_by_name():
    """``state`` is what the env's ``setup`` returned (issue 31), for final and per-turn leaves
    alike; a family's own per-episode dict stays ``episode.state``."""
    seen = []

    def stateful(state, episode, completion):
        seen.append((dict(state), episode.state.get("family")))
        return float(state.get("mark") == "set")

    def every_turn(state, turn):
        seen.append(("turn", turn, state["mark"]))
        return 0.0

    class Env(ToolEnv):
        def open_episode(self, episode, options):
            episode.state["family"] = "mine"

    env = Env(tasks=ListTasks([Task("t0", "Q", "42")]), toolset=Toolset([add]),
              rubric=Rubric([stateful, RewardFn("every_turn", every_turn, per_turn=True)]),
              setup=lambda task, episode: {"mark": "set"})
    env.reset(seed=0)
    assert env.step("42")[1] == 1.0
    assert seen == [("turn", 1, "set"), ({"mark": "set"}, "mine")]


# -- per-turn leaves --------------------------------------------------------------------------


def progress(tool_calls, tool_results, state):
    """A per-turn leaf: 0.1 a result of 5, whatever it is asked (farmable on purpose: shaping tests)."""
    return sum(0.1 for r in tool_results if r == "5")


@pytest.mark.parametrize("action", [call, two_calls], ids=["fast path", "general path"])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_per_turn_leaf_is_each_steps_reward_and_the_return_is_the_sum(action, asynchronous):
    env = make_env(Rubric([exact, RewardFn("progress", progress, 1.0, per_turn=True)]))
    env.reset(seed=0)
    step = (lambda a: asyncio.run(env.astep(a))) if asynchronous else env.step
    rewards, infos = [], []
    for a in (action(2, 3), action(1, 1), "42"):
        _, reward, terminated, _, info = step(a)
        rewards.append(reward)
        infos.append(info)
    per_call = 1 if action is call else 2
    assert rewards == pytest.approx([0.1 * per_call, 0.0, 1.0]) and terminated
    assert infos[0]["reward_components"] == {"progress": pytest.approx(0.1 * per_call)}
    # the final step keeps every leaf: the final ones and each per-turn leaf's episode total
    assert infos[-1]["reward_components"] == {"exact": 1.0, "progress": pytest.approx(0.1 * per_call)}
    assert env.episode_record()["reward"] == 1.0  # the graded (final) reward, as before


def test_shaping_keeps_the_return_at_the_final_reward():
    env = make_env(Rubric([exact, RewardFn("progress", progress, 1.0, per_turn=True)], shaping=True))
    env.reset(seed=0)
    rewards = [env.step(a)[1] for a in (call(2, 3), call(2, 3), "42")]
    assert rewards[:2] == pytest.approx([0.1, 0.1]) and sum(rewards) == pytest.approx(1.0)


def test_milestones_pay_once_and_never_more_than_their_weight():
    def fives(tool_results):
        return [r for r in tool_results if r in ("5", "7")], 2

    env = make_env(Rubric([exact, milestones("steps", fives, 0.4)]), max_turns=20)
    env.reset(seed=0)
    rewards = [env.step(a)[1] for a in (call(2, 3), call(2, 3), two_calls(3, 4), call(3, 4), call(2, 3))]
    assert rewards == pytest.approx([0.2, 0.0, 0.2, 0.0, 0.0])
    assert env.episode.milestones["steps"] == {"5", "7"}


def test_a_per_turn_leaf_that_cannot_score_fails_the_episode():
    def judge(tool_results):
        raise RewardFailure("the judge is down")

    for action in (call(2, 3), two_calls(2, 3)):
        env = make_env(Rubric([exact, RewardFn("judge", judge, per_turn=True)]))
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(action)
        assert math.isnan(reward) and truncated and info["outcome"] == MODEL_ERROR


def test_an_async_per_turn_leaf_runs_on_the_envs_loop():
    async def slow_progress(tool_results):
        await asyncio.sleep(0)
        return float("5" in tool_results)

    env = make_env(Rubric([exact, RewardFn("progress", slow_progress, 0.5, per_turn=True)]))
    assert env.needs_event_loop
    env.reset(seed=0)
    assert env.step(call(2, 3))[1] == 0.5
    env.close()


def test_per_turn_leaves_belong_at_the_top_of_the_tree():
    with pytest.raises(ValueError, match="top-level"):
        Rubric([min_of(exact, RewardFn("progress", progress, per_turn=True))])


def test_without_per_turn_leaves_mid_episode_steps_pay_zero_and_carry_no_components():
    env = make_env(Rubric([exact]))
    env.reset(seed=0)
    for action in (call(2, 3), two_calls(2, 3)):
        _, reward, _, _, info = env.step(action)
        assert reward == 0.0 and "reward_components" not in info
