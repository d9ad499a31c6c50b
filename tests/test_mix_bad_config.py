"""A mixture's bad configuration fails at ``gym.make`` naming the argument, even where the member it
concerns is built only later (a member of weight 0 when first drawn, a level when first reached)."""

import json

import gymnasium as gym
import numpy as np
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.mix import register_mix

MIX = "benchmax/Mix-v0"
DIGITS = "task_args.difficulty.digits"


@pytest.mark.parametrize("curriculum, says", [
    # a level the controller reaches hours into a run: the worker then died building it
    ({"Math-v0": {"knob": DIGITS, "values": [1, 2, 40]}},
     r"curriculum\['Math-v0'\] level 2 \{'task_args.difficulty.digits': 40\}: digits must be an int from 1 to 9"),
    ({"Math-v0": {"levels": [{DIGITS: 1}, {"task_args.difficulty.digitz": 2}]}},
     r"curriculum\['Math-v0'\] level 1 .*unknown MathTaskConfig field 'digitz' \(did you mean 'digits'\?\)"),
    ({"Math-v0": {"knob": "task_args.num_tasks", "values": [10, 0]}},
     r"curriculum\['Math-v0'\] level 1 .*num_tasks must be a positive int"),
])
def test_a_level_with_a_bad_knob_value_fails_at_make_naming_the_member_and_level(curriculum, says):
    with pytest.raises(ValueError, match=says):
        gym.make(MIX, members={"benchmax/Math-v0": 1.0}, curriculum=curriculum)
    with pytest.raises(ValueError, match=says):  # (register_mix checks as make does)
        register_mix("test/BadLevels-v0", {"benchmax/Math-v0": 1.0}, curriculum=curriculum)
    assert "test/BadLevels-v0" not in gym.registry


def test_a_members_own_bad_task_args_fail_at_make_naming_it():
    members = [("benchmax/Math-v0", 0.5), ("benchmax/Wikipedia-v0", {"task_args": {"difficulty": {
        "min_hops": 4, "max_hops": 2}}}, 0.5)]
    with pytest.raises(ValueError, match=r"members: Wikipedia-v0: min_hops \(4\) must not exceed max_hops \(2\)"):
        gym.make(MIX, members=members)


def test_good_levels_and_tasks_given_over_still_make_and_play():
    tasks = [{"prompt": "What is 2 + 2?", "answer": "4"}]
    env = gym.make(MIX, members=[("benchmax/Math-v0", {"tasks": tasks}, 0.5), ("benchmax/Wikipedia-v0", 0.5)],
                   curriculum={"Wikipedia-v0": "auto"})
    _, info = env.reset(seed=0, options={"member": "Math-v0"})
    assert info["task_id"] == "Math-v0/0"
    env.close()


def test_a_members_kwargs_that_are_no_dict_fail_naming_them():
    """(The JSON form's kwargs went into dict(): 'cannot convert dictionary update sequence')."""
    with pytest.raises(ValueError, match=r"members: the kwargs of 'benchmax/Math-v0' must be a dict"):
        gym.make(MIX, members=[{"id": "benchmax/Math-v0", "kwargs": [["max_turns", 3]]}])


def test_numpy_ints_are_ints_for_the_curriculum_and_its_state_stays_json():
    """A sweep's np.arange values were refused as window/group_size ("must be a positive int, got
    32"), and a numpy start level made the saved state no JSON."""
    env = gym.make(MIX, members={"benchmax/Math-v0": 1.0}, curriculum={"Math-v0": {"start": np.int64(1)}},
                   window=np.int64(8), group_size=np.int64(4))
    env.reset(seed=0)
    state = env.unwrapped.get_state()["curriculum"]
    assert json.loads(json.dumps(state))["members"]["Math-v0"]["level"] == 1
    assert env.unwrapped.curriculum.group_size == 4 and env.unwrapped.curriculum.members["Math-v0"].window == 8
    env.close()


@pytest.mark.parametrize("key", ["max_observation_chars", "max_action_chars"])
@pytest.mark.parametrize("value", ["abc", float("nan"), float("inf"), None, [1], 0, True])
def test_a_bad_size_limit_fails_at_make_naming_it_as_the_engine_does(key, value):
    """(It went into int() first: "invalid literal for int()", "cannot convert float NaN", an
    OverflowError or a TypeError, naming nothing.)"""
    with pytest.raises(ValueError, match=rf"^{key} must be a positive int, got "):
        gym.make(MIX, **{key: value})
    with pytest.raises(ValueError, match=rf"^members: Math-v0: {key} must be a positive int, got "):
        gym.make(MIX, members=[("benchmax/Math-v0", {key: value}, 1.0)])


def test_the_widest_size_limit_of_the_members_bounds_the_spaces():
    env = gym.make(MIX, members=[("benchmax/Math-v0", {"max_action_chars": 5000}, 0.5),
                                 ("benchmax/Wikipedia-v0", {"max_action_chars": 700}, 0.5)], max_observation_chars=9000)
    assert (env.observation_space.max_length, env.action_space.max_length) == (9000, 5000)
    env.close()


def test_a_member_that_is_no_text_env_fails_at_make_naming_it():
    """CartPole made, then its reset returned an array and its step failed on the text action."""
    says = r"members: CartPole-v1: CartPole-v1 is not a text environment \(its observation and action spaces are " \
           r"Box and Discrete\): a mixture's members take text actions and return text observations"
    with pytest.raises(ValueError, match=says):
        gym.make(MIX, members={"CartPole-v1": 1})
    # one of weight 0 is made when first forced: refused there, named
    env = gym.make(MIX, members={"CartPole-v1": 0, "benchmax/Math-v0": 1})
    with pytest.raises(ValueError, match="CartPole-v1 is not a text environment") as raised:
        env.reset(seed=0, options={"member": "CartPole-v1"})
    assert raised.value.__notes__ == ["mixture member 'CartPole-v1' (CartPole-v1 at level 0)"]
    env.close()


@pytest.mark.parametrize("arg, says", [
    ("max_observation_chars=abc", "max_observation_chars must be a positive int, got 'abc'"),
    ('members={"CartPole-v1": 1}', "members: CartPole-v1: CartPole-v1 is not a text environment"),
])
def test_the_cli_says_a_bad_mixture_in_one_line(arg, says):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cli_in_process import run_in_process

    out = run_in_process("run", MIX, "--env-arg", arg)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("benchmax-gym: error: ") and says in out.stderr
