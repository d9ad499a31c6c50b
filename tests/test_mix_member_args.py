"""A mixture member's bad argument (a value, a type, an empty task list, an unknown keyword) fails at
``gym.make`` naming the member and the argument: the members with a weight are made there, and kept
for their first draw (before, only their task arguments were checked, the rest failed at the member's
first reset, possibly hours into a run in a worker)."""

import tempfile

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym import registry
from benchmax_gym.mix import register_mix
from benchmax_gym.testing import play

MIX = "benchmax/Mix-v0"
ADD = "testmixargs/Add-v0"  # a register_tool_env member, with a reference solver


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def stated(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def solver(env):
    return lambda obs, info: env.episode.task.answer


@pytest.fixture(scope="module", autouse=True)
def add_env():
    registry.register_tool_env(ADD, tools=[add], rubric=stated, solver=solver, max_turns=3,
                               tasks=[{"prompt": "What is 2 + 3?", "answer": "5"}])
    yield
    gym.registry.pop(ADD, None)
    registry.ENVS.pop(ADD, None)
    registry._PARTS.pop(ADD, None)


@pytest.mark.parametrize("member, error, says", [
    (("benchmax/Math-v0", {"max_turns": -1}), ValueError,
     r"members: Math-v0: max_turns must be a positive int, got -1"),
    (("benchmax/Math-v0", {"max_turns": "3"}), ValueError,  # a wrong type
     r"members: Math-v0: max_turns must be a positive int, got '3'"),
    (("benchmax/Math-v0", {"tasks": []}), ValueError,
     r"members: Math-v0: tasks must be one of .* a non-empty list of tasks, got \[\]"),
    (("benchmax/CRM-v0", {"query_timeout": -1}), ValueError,
     r"members: CRM-v0: query_timeout must be a positive number"),
    (("benchmax/CRM-v0", {"tool_format": "yaml"}), ValueError, r"members: CRM-v0: tool_format must be one of"),
    (("benchmax/CRM-v0", {"reward_weights": [1]}), TypeError,
     r"members: CRM-v0: reward_weights must be a dict of component -> weight, got \[1\]"),
    ((ADD, {"max_turn": 2}), TypeError,
     r"members: Add-v0: ToolEnv got an unexpected keyword argument 'max_turn' \(did you mean 'max_turns'\?\)"),
    ((ADD, {"max_turns": 0}), ValueError, r"members: Add-v0: max_turns must be a positive int, got 0"),
])
def test_a_members_bad_argument_fails_at_make_naming_the_member_and_the_argument(member, error, says):
    members = [("benchmax/Wikipedia-v0", 0.5), (*member, 0.5)]
    with pytest.raises(error, match=says):
        gym.make(MIX, members=members)
    with pytest.raises(error, match=says):  # (register_mix checks as make does)
        register_mix("testmixargs/Bad-v0", members)
    assert "testmixargs/Bad-v0" not in gym.registry


def test_an_option_given_to_the_mixture_itself_is_checked_in_each_member_that_takes_it():
    with pytest.raises(ValueError, match=r"members: CRM-v0: tool_timeout must be a positive number"):
        gym.make(MIX, members=[("benchmax/CRM-v0", 0.5), (ADD, 0.5)], tool_timeout=-2)


def test_a_failed_make_closes_the_members_it_had_made(tmp_path, monkeypatch):
    """An MCP member made before the bad one: its workspace goes with the failed make (no server starts)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ValueError, match=r"members: Math-v0: max_turns must be a positive int"):
        gym.make(MIX, members=[("benchmax/MCP-v0", 0.5), ("benchmax/Math-v0", {"max_turns": -1}, 0.5)])
    assert not list(tmp_path.glob("benchmax-mcp-*"))


def test_a_good_mixture_makes_its_members_once_at_make_and_plays_them():
    env = gym.make(MIX, members=[("benchmax/Math-v0", {"max_turns": 4}, 0.4), ("benchmax/CRM-v0", 0.3), (ADD, 0.3)])
    mix = env.unwrapped
    assert mix.built_members == ["Math-v0@0", "CRM-v0@0", "Add-v0@0"]
    made = dict(mix._built)
    for member in ("Add-v0", "CRM-v0", "Math-v0"):
        played = play(env, mix.reference_solver(), options={"member": member})
        assert played.info["member"] == member and played.terminated and played.reward == pytest.approx(1.0)
    assert mix._built == made  # the envs made at make are the ones played: none made twice
    assert mix.max_turns == 4  # (the member playing: Math-v0, with its own kwargs)
    env.close()


def test_a_bad_value_at_a_members_starting_level_fails_at_make_naming_the_level():
    curriculum = {"Math-v0": {"knob": "max_turns", "values": [0, 4], "start": 0}}
    with pytest.raises(ValueError, match=r"curriculum\['Math-v0'\] level 0 \{'max_turns': 0\}: max_turns must be a "
                                         r"positive int, got 0"):
        gym.make(MIX, members={"benchmax/Math-v0": 1.0}, curriculum=curriculum)


def test_a_bad_value_at_a_later_level_outside_task_args_fails_at_make_naming_the_level():
    """A level that sets more than task arguments (its knob ``max_turns``) was checked only when
    the curriculum first reached it, maybe hours into training. Each such level is made once at
    make and closed; the members kept are the starting levels'."""
    curriculum = {"Math-v0": {"knob": "max_turns", "values": [4, 8, -1], "start": 0}}
    with pytest.raises(ValueError, match=r"curriculum\['Math-v0'\] level 2 \{'max_turns': -1\}: max_turns must be a "
                                         r"positive int, got -1"):
        gym.make(MIX, members={"benchmax/Math-v0": 1.0}, curriculum=curriculum)
    good = gym.make(MIX, members={"benchmax/Math-v0": 1.0},
                    curriculum={"Math-v0": {"knob": "max_turns", "values": [4, 8, 16], "start": 0}})
    try:
        assert good.unwrapped.built_members == ["Math-v0@0"]
    finally:
        good.close()
