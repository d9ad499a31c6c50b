"""An info key whose values differ in kind between envs (an int in one, a str, None or dict in
another; arrays of different shapes): Gymnasium's SyncVectorEnv fails on it with numpy's bare
error, so SubprocVectorEnv fails too, but with an error naming the key and what each env gave."""

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from benchmax_gym import UnicodeText
from benchmax_gym.wrappers import SubprocVectorEnv
from benchmax_gym.wrappers.batching import InfoBatchError, batch_infos, join_columns, pack_columns

MIXES = [  # (env 0's value, env 1's value, the kinds the error names)
    (1, "x", ["int (env 0)", "str (env 1)"]),
    (1, None, ["int (env 0)", "NoneType (env 1)"]),
    (1.5, "x", ["float (env 0)", "str (env 1)"]),
    (1, {"a": 1}, ["int (env 0)", "dict (env 1)"]),
    (np.zeros(2), np.zeros(3), ["float64 array of shape (2,) (env 0)", "float64 array of shape (3,) (env 1)"]),
    (True, np.zeros(2), ["bool (env 0)", "float64 array of shape (2,) (env 1)"]),
    (1, 2**70, ["int (envs 0, 1)", "too large"]),
]


def both_paths(infos):
    """The per-env path (``batch_infos``) and the lock-step path (one worker per env, joined)."""
    yield lambda: batch_infos(infos, len(infos))
    yield lambda: join_columns([(j, 1, pack_columns([info])) for j, info in enumerate(infos)], len(infos))


@pytest.mark.parametrize("first, second, kinds", MIXES)
def test_a_key_of_mixed_kinds_is_an_error_naming_it(first, second, kinds):
    for batch in both_paths([{"ok": 1, "k": first}, {"ok": 2, "k": second}]):
        with pytest.raises(InfoBatchError) as caught:
            batch()
        message = str(caught.value)
        assert "info['k']" in message and all(kind in message for kind in kinds), message
        assert "ok" not in message  # (the key that batches is not blamed)


def test_a_nested_key_is_named_by_its_path():
    infos = [{"reward_components": {"em": 1.0}}, {}, {"reward_components": {"em": "n/a"}}]
    for batch in both_paths(infos):
        says = r"info\['reward_components'\]\['em'\].*float \(env 0\); str \(env 2\)"
        with pytest.raises(InfoBatchError, match=says):
            batch()


def test_mixes_gymnasium_batches_are_batched_as_it_batches_them():
    """A str (or None) first and an int after: Gymnasium makes an object array; so do we."""
    for batch in both_paths([{"k": "x"}, {"k": 1}, {"k": None}]):
        array = batch()["k"]
        assert array.dtype == object and list(array) == ["x", 1, None]


class Kinds(gym.Env):
    """Its info's ``k`` is ``value`` once it steps (0 at reset)."""

    observation_space = UnicodeText(100)
    action_space = UnicodeText(100)

    def __init__(self, value):
        self.value = value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {"k": 0}

    def step(self, action):
        return "ok", 0.0, False, False, {"k": self.value}


@pytest.mark.parametrize("ready_first", [False, True])
def test_the_vector_env_names_the_key_gymnasium_fails_on_bare(ready_first):
    fns = [functools.partial(Kinds, value) for value in (3, "three", 4)]
    sync = SyncVectorEnv(fns)
    sync.reset(seed=0)
    with pytest.raises(Exception) as bare:  # noqa: B017  (Gymnasium's own: numpy's, naming nothing)
        sync.step(["a"] * 3)
    assert "'k'" not in str(bare.value)
    sync.close()
    envs = SubprocVectorEnv(fns, num_workers=2)
    try:
        envs.reset(seed=0)
        with pytest.raises(InfoBatchError, match=r"info\['k'\].*int \(envs 0, 2\); str \(env 1\)"):
            if ready_first:
                envs.send(["a"] * 3)
                envs.recv(min_ready=3)
            else:
                envs.step(["a"] * 3)
    finally:
        envs.close()
