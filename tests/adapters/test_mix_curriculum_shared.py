"""A mixture's curriculum through the trainer adapters: SkyRL, verl and OpenRLHF make an env per
trajectory and TRL one per rollout slot, so each env's own controller saw one episode (its level
never moved) or one slot's (levels drifted apart within a group). The adapters' envs of one id
and kwargs in a process follow one controller, fed by all of their episodes."""

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.adapters.tokens import make_env

WRONG = "\\boxed{-1}"  # (no generated Math task's answer is negative)


def _kwargs(window=2, start=2):
    return {"members": [("benchmax/Math-v0", 1.0)], "python_tool": False, "max_turns": 2,
            "curriculum": {"Math-v0": {"window": window, "start": start}}}


@pytest.fixture(autouse=True)
def fresh_controllers():
    """Each test starts as a fresh trainer process would: no controller of an earlier run."""
    import benchmax_gym.mix

    benchmax_gym.mix._shared_curricula.clear()
    yield
    benchmax_gym.mix._shared_curricula.clear()


def _level(env):
    return env.unwrapped.curriculum.stats()["Math-v0"]["level"]


def test_skyrls_env_per_trajectory_moves_one_level_for_every_trajectory():
    """Two wrong trajectories (window 2) take Math from level 2 to 1, and the next trajectory's
    env plays level 1: the controller outlives each trajectory's env."""
    skyrl_gym = pytest.importorskip("skyrl_gym")
    import benchmax_gym.adapters.skyrl  # noqa: F401  (registers "benchmax")

    kwargs = _kwargs()
    played = []
    for trajectory in range(4):
        env = skyrl_gym.make("benchmax", env_config={"env_id": "benchmax/Mix-v0", "env_kwargs": kwargs},
                             extras={"task_index": trajectory, "max_turns": 2})
        env.init([{"role": "user", "content": "(the dataset's prompt)"}])
        played.append(_level(env.env))
        assert env.step(WRONG)["done"]
        env.close()
    assert played == [2, 2, 1, 1]


def test_trls_rollout_slots_share_one_controller_and_each_slot_sees_its_moves():
    """TRL keeps an env per slot: slot A's and slot B's wrong episodes together fill the window,
    and both slots then play the same level (before, each moved on its own episodes alone)."""
    kwargs = _kwargs()
    a, b = make_env("benchmax/Mix-v0", kwargs), make_env("benchmax/Mix-v0", kwargs)
    try:
        for env in (a, b):
            env.reset(options={"task_index": 0})
            assert env.step(WRONG)[2]
        assert _level(a) == _level(b) == 1
        for env in (a, b):
            _, info = env.reset(options={"task_index": 0})
            *_, info = env.step(WRONG)
            assert info["difficulty"] == 1  # (the episode was played at the shared level)
    finally:
        a.close()
        b.close()


def test_other_kwargs_and_a_plain_gym_make_keep_their_own_controller():
    """Only the adapters' envs of one id and kwargs share: another mixture, and an env the user
    makes with gym.make (one controller per env, as documented), move on their own."""
    shared = make_env("benchmax/Mix-v0", _kwargs())
    other = make_env("benchmax/Mix-v0", _kwargs(window=3))
    mine = gym.make("benchmax/Mix-v0", **_kwargs())
    try:
        for _ in range(2):
            shared.reset(options={"task_index": 0})
            shared.step(WRONG)
        assert (_level(shared), _level(other), _level(mine)) == (1, 2, 2)
    finally:
        for env in (shared, other, mine):
            env.close()
