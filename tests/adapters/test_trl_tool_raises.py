"""``environment_factory`` on one process: an exception escaping the env in a tool call (its own
failure, not the model's mistake, which the env answers as an observation) is never shown to the
model as the tool's answer and trained on: the model is told the env failed, and grading the
episode raises the env's own error."""

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

ENV_ID = "benchmax-test/ToolStoreDown-v0"


class _StoreDown(gym.Wrapper):
    """Math-v0 whose step raises once a tool is called (its backing store gone)."""

    def step(self, action):
        if isinstance(action, dict) and action.get("tool_calls"):
            raise ConnectionError("the calculator's store at 10.0.0.7 is unreachable")
        return self.env.step(action)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=lambda **kwargs: _StoreDown(gym.make("benchmax/Math-v0", **kwargs)),
                 disable_env_checker=True)


def test_a_tool_call_whose_env_raises_is_not_an_answer_and_grading_raises_it():
    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment(ENV_ID)
    env = Env()
    env.reset(task_index=0)
    said = env.calculator(expression="1+1")  # TRL would catch a raise here and show it to the model
    assert said.startswith("Error: the environment failed") and "10.0.0.7" not in said
    assert env.done and env.calculator(expression="2+2").startswith("Error: the episode is over")
    with pytest.raises(ConnectionError, match="store at 10.0.0.7 is unreachable"):
        Env.reward([[{"role": "assistant", "content": "<answer>2</answer>"}]], environments=[env])
    env.reset(task_index=0)  # a new episode starts clean
    assert not env.done and Env.reward([[{"role": "assistant", "content": "no answer"}]], environments=[env]) == [0.0]
