"""A subclass of the real ``benchmax`` package's BaseEnv, written as its users write them, runs
through gym.make and make_vec (installed without its dependencies: tests/requirements-nodeps.txt)."""

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import gymnasium as gym
import pytest
from benchmax.envs.base_env import BaseEnv as PackageBaseEnv
from benchmax.envs.types import StandardizedExample, ToolDefinition

from benchmax_gym import register_benchmax_env

RAW_ROWS = [{"question": "Write the word 'apple' to answer.txt, then say done.", "answer": "apple"},
            {"question": "Write the word 'pear' to answer.txt, then say done.", "answer": "pear"}]


class FileEnv(PackageBaseEnv):
    """Raw rows need dataset_preprocess; a workspace per rollout; graded on the workspace file."""

    system_prompt = "Use the tools."
    workspaces: dict = {}

    def dataset_preprocess(self, example) -> StandardizedExample:
        return StandardizedExample(prompt=example["question"], ground_truth=example["answer"],
                                   init_rollout_args={"greeting": "hello"})

    async def list_tools(self):
        return [ToolDefinition("write_file", "Write text to a file in the workspace.",
                               {"type": "object", "properties": {"name": {"type": "string"}, "text": {"type": "string"}},
                                "required": ["name", "text"]})]

    async def init_rollout(self, rollout_id, **rollout_args):
        workspace = Path(tempfile.mkdtemp(prefix="benchmax-pkg-"))
        (workspace / "greeting.txt").write_text(rollout_args["greeting"])
        FileEnv.workspaces[rollout_id] = workspace

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        (FileEnv.workspaces[rollout_id] / Path(tool_args["name"]).name).write_text(tool_args["text"])
        return "written"

    async def copy_to_workspace(self, rollout_id, src_path, dst_filename=None):
        shutil.copy(src_path, FileEnv.workspaces[rollout_id] / (dst_filename or Path(src_path).name))

    async def copy_from_workspace(self, rollout_id, src_filename, dst_path):
        shutil.copy(FileEnv.workspaces[rollout_id] / src_filename, dst_path)

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        with tempfile.TemporaryDirectory() as out:
            target = Path(out) / "answer.txt"
            try:
                await self.copy_from_workspace(rollout_id, "answer.txt", target)
            except FileNotFoundError:
                return {"file": 0.0}
            return {"file": float(target.read_text() == ground_truth)}

    def cleanup_rollout(self, rollout_id):
        shutil.rmtree(FileEnv.workspaces.pop(rollout_id))


def write(word):
    return f'<tool_call>{{"name": "write_file", "arguments": {{"name": "answer.txt", "text": "{word}"}}}}</tool_call>'


@pytest.fixture(scope="module")
def env_id():
    return register_benchmax_env("test/PackageFile-v0", FileEnv, RAW_ROWS)


def test_a_real_benchmax_env_runs_unchanged(env_id):
    env = gym.make(env_id)
    obs, info = env.reset(options={"task_index": 0})
    assert "Write the word 'apple'" in obs and info["task_metadata"] == {"source": "benchmax"}
    assert len(FileEnv.workspaces) == 1
    obs, _, _, _, _ = env.step(write("apple"))
    assert "written" in obs
    _, reward, terminated, _, info = env.step("done")
    assert terminated and reward == 1.0 and info["reward_components"] == {"file": 1.0}
    env.reset(options={"task_index": 1})
    assert len(FileEnv.workspaces) == 1  # the finished rollout's was cleaned up (cleanup_rollout)
    env.step(write("apple"))
    assert env.step("done")[1] == 0.0
    env.close()
    assert FileEnv.workspaces == {}


def test_a_real_benchmax_env_in_subprocess_workers(env_id):
    envs = gym.make_vec(env_id, num_envs=2)
    try:
        envs.reset(options=[{"task_index": 0}, {"task_index": 1}])
        envs.step([write("apple"), write("apple")])
        _, rewards, terminated, _, _ = envs.step(["done", "done"])
        assert terminated.all() and list(rewards) == [1.0, 0.0]
    finally:
        envs.close()


class AnswerEnv(FileEnv):
    """Written as the package's envs have been since 2026-03 (``Completion = List[Dict]``): the
    reward reads the model's final reply as ``completion[-1]["content"]``."""

    async def list_tools(self):
        return [ToolDefinition("echo", "Echo the text.", {"type": "object", "properties": {"text": {"type": "string"}}})]

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        return tool_args.get("text", "")

    async def compute_reward(self, rollout_id: str, completion: List[Dict[str, Any]], ground_truth: Any,
                             **kwargs: Any) -> Dict[str, float]:
        final = completion[-1].get("content", "") if completion else ""
        match = re.search(r"<answer>(.*?)</answer>", final, re.S)
        return {"match": float(bool(match) and match.group(1).strip() == ground_truth),
                "turns": float(sum(m["role"] == "assistant" for m in completion))}


def test_a_reward_written_for_the_packages_list_completion_gets_the_model_s_messages():
    """Given the assistant's text (a str), ``completion[-1].get`` failed every episode as the
    env's error; it gets the transcript from the model's first reply on, its final reply last."""
    env = gym.make(register_benchmax_env("test/PackageAnswer-v0", AnswerEnv, [{"question": "Say 7.", "answer": "7"}]))
    env.reset(options={"task_index": 0})
    env.step('<answer>6</answer> <tool_call>{"name": "echo", "arguments": {"text": "hm"}}</tool_call>')
    _, reward, terminated, _, info = env.step("So: <answer>7</answer>")
    env.close()
    assert terminated and info["outcome"] == "scored", info.get("outcome_detail")
    assert info["reward_components"] == {"match": 1.0, "turns": 2.0}
