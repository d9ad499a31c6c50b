"""Ids a driver registers in Python (``register_tool_env`` in a script's ``__main__``) reach
SubprocVectorEnv's workers started by ``spawn`` or ``forkserver``, which are fresh processes;
a forked worker inherits them, and nothing of the registration is pickled for it."""

import functools
import json
import os
import subprocess
import sys
import threading

import pytest

import benchmax_gym
from benchmax_gym.wrappers import SubprocVectorEnv

SCRIPT = '''
import json, sys
import gymnasium as gym
import benchmax_gym
from benchmax_gym.wrappers import SubprocVectorEnv

CALL = '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'


def shout(text: str) -> str:
    """Shout.

    Args:
        text: what to shout
    """
    return text.upper()


def exact(completion, answer):
    return float(completion.strip() == answer)


def make():
    return gym.make("script/SpawnShout-v0")


if __name__ == "__main__":
    benchmax_gym.register_tool_env("script/SpawnShout-v0", tools=[shout], tasks=[{"prompt": "say hi", "answer": "HI"}],
                                   rubric=exact, max_turns=3)
    out = {}
    for context in ("spawn", "forkserver"):
        for name, build in [("make_vec", lambda: gym.make_vec("script/SpawnShout-v0", num_envs=2, context=context)),
                            ("by id", lambda: SubprocVectorEnv("script/SpawnShout-v0", 2, context=context)),
                            ("by factory", lambda: SubprocVectorEnv(make, 2, context=context))]:
            envs = build()
            try:
                envs.reset(seed=0)
                obs, _, _, _, info = envs.step([CALL] * 2)
                shouted = ["<tool_response>\\nHI\\n</tool_response>" in o for o in obs]
                obs, rewards, terminated, _, info = envs.step(["HI"] * 2)
                out[f"{context} {name}"] = [shouted, rewards.tolist(), terminated.tolist()]
            finally:
                envs.close()
    print(json.dumps(out))
'''


def test_a_scripts_main_registration_reaches_spawn_and_forkserver_workers(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    root = os.path.dirname(os.path.dirname(benchmax_gym.__file__))  # (the script imports the benchmax_gym under test)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for context in ("spawn", "forkserver"):
        for name in ("make_vec", "by id", "by factory"):  # the script's tool and rubric ran in the workers
            assert out[f"{context} {name}"] == [[True, True], [1.0, 1.0], [True, True]], (context, name)


def _check(completion, answer, lock=None):
    return float(completion.strip() == answer)


# a rubric holding a lock: its registration cannot be pickled
LOCKED = benchmax_gym.register_tool_env("testing/SpawnLocked-v0", tools=[], tasks=[{"prompt": "say hi", "answer": "HI"}],
                                        rubric=functools.partial(_check, lock=threading.Lock()), max_turns=2)


def test_a_forked_worker_inherits_a_registration_that_cannot_be_pickled():
    envs = SubprocVectorEnv(LOCKED, 2, num_workers=1, context="fork")
    try:
        envs.reset(seed=0)
        _, rewards, terminated, _, info = envs.step(["HI", "no"])
        assert rewards.tolist() == [1.0, 0.0] and terminated.all()
    finally:
        envs.close()


def test_a_registration_that_cannot_reach_a_spawned_worker_fails_at_construction_naming_the_id():
    with pytest.raises(TypeError, match=r"env: 'testing/SpawnLocked-v0''s registration .* cannot be sent to a worker "
                                        r"process \(cloudpickle\): TypeError: cannot pickle '_thread.lock'"):
        SubprocVectorEnv(LOCKED, 2, num_workers=1, context="spawn")
