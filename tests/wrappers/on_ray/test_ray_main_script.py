"""A driver script's own tools, rubrics, env classes and values (defined in its ``__main__``)
reach RayVectorEnv's hosts, which are fresh processes: on the loopback cluster of
this folder's conftest.py, with the script run as ``__main__`` in a process of its own."""

import json
import subprocess
import sys

import pytest


pytestmark = pytest.mark.ray

SCRIPT = '''
import json, sys
from dataclasses import dataclass
import gymnasium as gym
import ray
ray.init(address=sys.argv[1], logging_level="WARNING")
import benchmax_gym
from benchmax_gym import UnicodeText
from benchmax_gym.wrappers import RayVectorEnv

HOST = {"num_cpus": 0, "resources": {"benchmax_env_host": 1}}
CALL = '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'


def shout(text: str) -> str:
    """Shout.

    Args:
        text: what to shout
    """
    return text.upper()


def exact(completion, answer):
    return float(completion.strip() == answer)


exact.reward_timeout = 60  # (without one, a pickled Rubric's leaf loses its "no timeout of its own" sentinel)

benchmax_gym.register_tool_env("script/Shout-v0", tools=[shout], tasks=[{"prompt": "say hi", "answer": "HI"}],
                               rubric=exact, max_turns=3)


def make():
    return gym.make("script/Shout-v0")


@dataclass
class Note:
    text: str


class Echo(gym.Env):
    observation_space = action_space = UnicodeText(100)

    def reset(self, *, seed=None, options=None):
        return "start", {}

    def step(self, action):
        return "echo " + action, 1.0, False, False, {"note": Note(action)}


out = {}
for name, build in [("by id", lambda: gym.make_vec("script/Shout-v0", num_envs=2, vector_backend="ray",
                                                   actor_options=HOST)),
                    ("by factory", lambda: RayVectorEnv(make, 2, actor_options=HOST))]:
    envs = build()
    try:
        envs.reset(seed=0)
        obs, _, _, _, info = envs.step([CALL] * 2)
        shouted = ["<tool_response>\\nHI\\n</tool_response>" in o for o in obs]
        obs, rewards, terminated, _, info = envs.step(["HI"] * 2)
        out[name] = [shouted, rewards.tolist(), terminated.tolist(), [str(e) for e in info.get("error", []) if e]]
    finally:
        envs.close()
envs = RayVectorEnv(Echo, 2, actor_options=HOST)
try:
    envs.reset(seed=0)
    obs, _, _, _, info = envs.step(["a", "b"])
    out["infos"] = [list(obs), [n == Note(o[5:]) and type(n) is Note for n, o in zip(info["note"], obs)]]
    envs.set_attr("marker", Note("x"))
    out["set_attr"] = [m == Note("x") and type(m) is Note for m in envs.get_attr("marker")]
finally:
    envs.close()
print(json.dumps(out))
'''


def test_a_scripts_main_tools_rubric_classes_and_values_reach_the_hosts(cluster, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(script), cluster.address], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for name in ("by id", "by factory"):  # the id registered in the script, its tool and rubric ran on the hosts
        assert out[name] == [[True, True], [1.0, 1.0], [True, True], []], (name, out[name])
    assert out["infos"] == [["echo a", "echo b"], [True, True]]  # an info holding the script's class comes back
    assert out["set_attr"] == [True, True]  # a value of the script's class goes to the hosts
