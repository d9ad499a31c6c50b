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


def test_the_simulated_user_example_asks_the_customer_and_grades_when_they_are_done():
    namespace: dict = {"gym": gym}
    exec(compile(_code_block("Add an environment", "user=customer"), str(README), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    try:
        env.reset(seed=0)
        obs, *_ = env.step("What is your order number?")
        assert obs == "It is A-17."
        obs, *_ = env.step('<tool_call>{"name": "find_order", "arguments": {"order_number": "A-17"}}</tool_call>')
        assert "shipped" in obs
        _, reward, terminated, _, info = env.step("Your order has <answer>shipped</answer>.")
        assert terminated and reward == 1.0 and info["user"]["calls"] == 2
    finally:
        env.close()
        gym.registry.pop("me/Support-v0", None)
        registry.ENVS.pop("me/Support-v0", None)
