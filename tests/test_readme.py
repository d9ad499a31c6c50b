"""The README's examples, run as written."""

import re
from pathlib import Path

import gymnasium as gym

from benchmax_gym import registry

README = Path(__file__).resolve().parents[1] / "README.md"


def _code_block(heading: str, contains: str) -> str:
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return next(block for block in re.findall(r"```python\n(.*?)```", section, re.DOTALL) if contains in block)


def test_add_an_environment_example_rewards_the_answer_not_a_guess_list():
    namespace: dict = {}
    exec(compile(_code_block("Add an environment", "register_tool_env("), str(README), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    try:
        def final_reward(reply: str) -> float:
            env.reset(seed=0)
            _, reward, terminated, _, _ = env.step(reply)
            assert terminated
            return reward

        assert final_reward("<answer>Peru</answer>") == 1.0
        assert final_reward("Lima is in <answer> peru </answer>.") == 1.0
        for gaming in ("Peru? France? Chile?", "<answer>Peru? France? Chile?</answer>",
                       "<answer>Peru or France</answer>", "Peru"):
            assert final_reward(gaming) == 0.0, gaming
        # and its tool works through the environment
        env.reset(seed=0)
        obs, *_ = env.step('<tool_call>{"name": "lookup", "arguments": {"city": "Lima"}}</tool_call>')
        assert "Peru" in obs
    finally:
        env.close()
        gym.registry.pop("me/Geo-v0", None)
        registry.ENVS.pop("me/Geo-v0", None)


def test_rewards_examples_compose_gate_and_pay_a_milestone_once():
    section = README.read_text().split("## Rewards\n", 1)[1].split("\n## ", 1)[0]
    namespace: dict = {}
    try:
        exec(compile(_code_block("Rewards", "gate("), str(README), "exec"), namespace)  # noqa: S102
        env = namespace["env"]
        env.reset(seed=0)
        _, reward, *_, info = env.step("<answer>Peru</answer> <answer>Chile</answer>")
        assert reward == 0.0 and info["reward_components"]["one_answer"] == 0.0  # the gate holds the body at 0
        assert "└─ 1 × single_answer: gate" in repr(env.unwrapped.rubric)
        exec(compile(_code_block("Rewards", "milestones("), str(README), "exec"), namespace)  # noqa: S102
        env = namespace["env"]
        env.reset(seed=0)
        lookup = namespace["lookup"]
        rewards = [env.step(a)[1] for a in (lookup, lookup, lookup)]
        _, final, terminated, _, info = env.step("<answer>Peru</answer>")
        assert rewards == [0.2, 0.0, 0.0] and final == 1.0 and terminated
        assert info["reward_components"] == {"correct": 1.0, "found": 1.0}
        assert "dense_rewards=True" in section
    finally:
        for env_id in ("me/Capitals-v0", "me/Geo-v1"):
            gym.registry.pop(env_id, None)
