"""A per-turn and a final reward leaf that return dicts with the same key: both values reach
info["reward_components"] at the last step (the per-turn total wrote over the final's), the
clash numbered as the rubric numbers names (``name#2``), never written over."""

import sys
from pathlib import Path

import gymnasium as gym

from benchmax_gym import register_tool_env
from benchmax_gym.core import RewardFn, Rubric

sys.path.insert(0, str(Path(__file__).parent))
from sample_tools import add  # noqa: E402


def steady(tool_calls):
    """Per-turn: a dict whose key the final leaf also uses."""
    return {"format": 0.125}


def checked(completion):
    return {"format": 1.0, "answer": float("42" in completion)}


def test_a_key_both_a_per_turn_and_a_final_leaf_return_is_numbered_at_the_last_step():
    rubric = Rubric([checked, RewardFn("steady", steady, 0.5, per_turn=True)])
    env_id = register_tool_env("test_h3/SameKey-v0", tools=[add], tasks=[{"prompt": "Say 42.", "answer": "42"}],
                               rubric=rubric)
    env = gym.make(env_id)
    try:
        env.reset(seed=0)
        call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        _, first, terminated, _, info = env.step(call)
        assert not terminated and info["reward_components"] == {"format": 0.125}
        _, last, terminated, _, info = env.step("<answer>42</answer>")
    finally:
        env.close()
    assert terminated
    # the per-turn total keeps its name (it meant the same at every step); the final's is numbered
    assert info["reward_components"] == {"format#2": 1.0, "answer": 1.0, "format": 0.25}
    assert first + last == 1.0 + 0.5 * 0.25
