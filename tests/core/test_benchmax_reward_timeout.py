"""``gym.make(id, reward_timeout=...)`` bounds a benchmax env's rewards as it bounds any env's:
its ``compute_reward`` and its ``compute_group_reward`` (the env's ``group_rubric``) alike. A
grader that hangs on the model's text scores 0 with a ``reward_timeout`` error at that bound,
not after the 60 s default nor whenever it ends."""

import asyncio

import gymnasium as gym
from benchmax.envs.base_env import BaseEnv as PackageBaseEnv

from benchmax_gym import register_benchmax_env

ROWS = [{"prompt": "Name a fruit.", "ground_truth": "apple"}]
HANG_S = 20.0  # a grader stuck this long on a reply (cut well before, at reward_timeout)


class SlowGrader(PackageBaseEnv):
    system_prompt = "Answer in one word."

    async def list_tools(self):
        return []

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        raise ValueError("no tools")

    async def init_rollout(self, rollout_id, **rollout_args):
        pass

    async def copy_to_workspace(self, rollout_id, src_path, dst_filename=None):
        pass

    async def copy_from_workspace(self, rollout_id, src_filename, dst_path):
        pass

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        if completion == "hang":
            await asyncio.sleep(HANG_S)
        return {"match": float(completion.strip().lower() == ground_truth)}

    async def compute_group_reward(self, rollout_ids, completions, ground_truths, **kwargs):
        await asyncio.sleep(HANG_S)
        return [{"unique": 1.0} for _ in completions]


def test_reward_timeout_reaches_a_benchmax_envs_reward_and_its_group_rubric():
    env_id = register_benchmax_env("test/BenchmaxSlowGrader-v0", SlowGrader, ROWS)
    env = gym.make(env_id, reward_timeout=2)
    try:
        env.reset(options={"task_index": 0})
        _, reward, terminated, _, info = env.step("hang")  # compute_reward hangs
        assert terminated and reward == 0.0
        assert "reward_timeout" in str(info["reward_errors"]), info["reward_errors"]
        records = []
        for reply in ("apple", "apple"):
            env.reset(options={"task_index": 0})
            _, reward, *_ = env.step(reply)
            assert reward == 1.0
            records.append(env.unwrapped.episode_record())
        out = env.unwrapped.group_rubric.score(records)  # compute_group_reward hangs: cut at 2 s, 0 for each member
        assert [r["reward"] for r in out] == [1.0, 1.0]
        assert all("reward_timeout" in str(r["group_errors"]) for r in out), out
    finally:
        env.close()

