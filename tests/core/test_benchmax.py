"""Code written for benchmax runs unchanged as a Gymnasium environment."""

import asyncio
import os
import re
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import benchmax_gym
from benchmax_gym import BaseEnv, ToolDefinition, extract_completion_text, register_benchmax_env

ROWS = [
    {"prompt": "What is the capital of France?", "ground_truth": "Paris"},
    {"prompt": "What colour is the sky on a clear day?", "ground_truth": "Blue"},
]


class AnswerTagEnv(BaseEnv):
    """As a user writes it: <answer> tags, no tools, lower-cased exact match (older signature)."""

    system_prompt = "Answer the question. Put your final answer inside <answer></answer> tags."

    async def list_tools(self):
        return []

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        raise ValueError("this environment has no tools")

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        match = re.search(r"<answer>(.*?)</answer>", completion, re.DOTALL)
        got = match.group(1).strip().lower() if match else None
        return {"exact_match": 1.0 if got == str(ground_truth).lower() else 0.0}


class NotesEnv(BaseEnv):
    """With tools, per-rollout state and the newer compute_reward(rollout_id, messages, task)."""

    system_prompt = "Keep notes with the tools, then answer inside <answer></answer>."
    log: list = []

    def __init__(self, **kwargs):
        self.notes: dict[str, list[str]] = {}

    async def list_tools(self):
        return [
            ToolDefinition(
                "write_note",
                "Save a note.",
                {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            ),
            ToolDefinition("read_notes", "Read all notes.", {"type": "object", "properties": {}}),
        ]

    async def init_rollout(self, rollout_id, **rollout_args):
        self.notes[rollout_id] = list(rollout_args.get("preset", []))
        NotesEnv.log.append(("init", rollout_id))

    async def release_rollout(self, rollout_id):
        self.notes.pop(rollout_id, None)
        NotesEnv.log.append(("release", rollout_id))

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        await asyncio.sleep(0)
        if tool_name == "write_note":
            self.notes[rollout_id].append(tool_args["text"])
            return "saved"
        return "\n".join(self.notes[rollout_id])

    async def compute_reward(self, rollout_id, messages, task, **kwargs):
        text = extract_completion_text(messages)
        match = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        used_tools = any(m["role"] == "tool" for m in messages)
        return {
            "correct": float(bool(match) and match.group(1).strip() == task["ground_truth"]),
            "used_tools": float(used_tools),
        }


def test_answer_tag_env_old_signature():
    env_id = register_benchmax_env("test/AnswerTag-v0", AnswerTagEnv, ROWS)
    env = gym.make(env_id)
    obs, info = env.reset(options={"task_index": 0})
    assert obs.startswith(AnswerTagEnv.system_prompt) and "capital of France" in obs
    assert "Paris" not in obs and "Paris" not in str(info)
    _, reward, terminated, _, info = env.step("I think it is <answer>paris</answer>.")
    assert terminated and reward == 1.0 and info["reward_components"] == {"exact_match": 1.0}

    env.reset(options={"task_index": 1})
    _, reward, terminated, _, info = env.step("<answer>green</answer>")
    assert terminated and reward == 0.0


def test_tools_state_and_new_signature():
    NotesEnv.log.clear()
    env = gym.make(register_benchmax_env(
        "test/Notes-v0", NotesEnv, [{"prompt": "Remember 42, then answer it.", "ground_truth": "42",
                                     "init_rollout_args": {"preset": ["start"]}}],
    ))
    obs, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["write_note", "read_notes"]
    assert "write_note" in obs  # tool schemas rendered for the model
    env.step('<tool_call>{"name": "write_note", "arguments": {"text": "42"}}</tool_call>')
    obs, *_ , info = env.step('<tool_call>{"name": "read_notes", "arguments": {}}</tool_call>')
    assert "start\n42" in obs
    _, _, _, _, info = env.step('<tool_call>{"name": "write_note", "arguments": {"text": 42}}</tool_call>')
    assert info["error"] == "bad_arguments"  # validated against the declared JSON schema
    _, reward, terminated, _, info = env.step("<answer>42</answer>")
    assert terminated and info["reward_components"] == {"correct": 1.0, "used_tools": 1.0} and reward == 1.0  # the entries share the function's weight (issue 30): not 2.0
    rollout = env.unwrapped.episode.rollout_id
    env.reset(seed=1)  # the previous rollout is released
    assert ("init", rollout) in NotesEnv.log and ("release", rollout) in NotesEnv.log
    env.close()


def test_messages_rows_and_async_api():
    rows = [{"messages": [{"role": "user", "content": "Say yes."}], "ground_truth": "yes"}]
    env = benchmax_gym.BenchmaxEnv(AnswerTagEnv, rows)

    async def episode():
        obs, info = await env.areset(seed=0)
        assert [m["role"] for m in info["messages"]] == ["system", "user"]
        return await env.astep("<answer>YES</answer>")

    _, reward, terminated, _, _ = asyncio.run(episode())
    assert terminated and reward == 1.0


# Text environments have no frame rate; Gymnasium warns about a missing render_fps for any env
# that declares render modes, so that one warning is allowed.
@pytest.mark.filterwarnings("ignore:.*render fps:UserWarning")
def test_check_env_passes():
    check_env(gym.make(register_benchmax_env("test/NotesCheck-v0", NotesEnv, ROWS)).unwrapped)


def test_bad_rows_and_classes_fail_at_make():
    with pytest.raises(ValueError, match="rows\\[0\\] needs a 'prompt'"):
        benchmax_gym.BenchmaxEnv(AnswerTagEnv, [{"question": "x"}])
    with pytest.raises(TypeError, match="BaseEnv"):
        benchmax_gym.BenchmaxEnv(dict, ROWS)


def test_extract_completion_text():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "first"},
        {"role": "tool", "content": "t"},
        {"role": "assistant", "content": "second"},
    ]
    assert extract_completion_text(messages) == "first\nsecond"
    assert extract_completion_text("plain") == "plain"
    assert extract_completion_text([]) == ""


@pytest.mark.parametrize("mode", ["sync", "async", None])
def test_benchmax_envs_run_in_every_vector_mode(mode):
    """A BaseEnv lists its tools at construction; SubprocVectorEnv's workers then crashed
    ("adopt() must come before...") and the parent raised a bare EOFError."""
    env_id = register_benchmax_env(f"test/NotesVec{mode or ''}-v0", NotesEnv,
                                   [{"prompt": "Remember 42, then answer it.", "ground_truth": "42"}])
    envs = gym.make_vec(env_id, num_envs=2, **({} if mode is None else {"vectorization_mode": mode}))
    try:
        envs.reset(seed=0)
        write = '<tool_call>{"name": "write_note", "arguments": {"text": "42"}}</tool_call>'
        obs, _, terminated, _, _ = envs.step([write, write])
        assert "saved" in obs[0] and not terminated.any()
        _, rewards, terminated, _, _ = envs.step(["<answer>42</answer>", "<answer>41</answer>"])
        assert terminated.all() and list(rewards) == [1.0, 0.5]  # the mean of correct and used_tools
    finally:
        envs.close()


class ServerEnv(NotesEnv):
    """Starts something at construction that only its (async) shutdown stops, as benchmax's MCP
    environments start servers: here a file that shutdown removes."""

    list_tools_loops: list = []

    def __init__(self, marker_dir, **kwargs):
        super().__init__()
        self.marker = Path(marker_dir) / f"server-{os.getpid()}-{id(self)}"
        self.marker.write_text("running")

    async def list_tools(self):
        ServerEnv.list_tools_loops.append(asyncio.get_running_loop())
        return await super().list_tools()

    async def shutdown(self):
        self.marker.unlink()


class SyncServerEnv(ServerEnv):
    """benchmax's LocalMCPEnv shuts down synchronously."""

    def shutdown(self):
        self.marker.unlink()


@pytest.mark.parametrize("cls", [ServerEnv, SyncServerEnv])
def test_a_class_it_builds_is_shut_down_at_close_and_when_make_fails(cls, tmp_path):
    env = benchmax_gym.BenchmaxEnv(cls, ROWS, env_kwargs={"marker_dir": tmp_path})
    assert len(list(tmp_path.iterdir())) == 1
    env.reset(seed=0)
    env.close()
    env.close()  # twice is fine
    assert list(tmp_path.iterdir()) == []

    # A mistyped argument fails at make, and what the class started does not outlive the error.
    with pytest.raises(TypeError, match="'max_turnz'"):
        benchmax_gym.BenchmaxEnv(cls, ROWS, env_kwargs={"marker_dir": tmp_path}, max_turnz=3)
    assert list(tmp_path.iterdir()) == []
    assert cls.list_tools_loops[-1].is_closed()  # the event loop it listed the tools on, too

    # An instance the caller passes is the caller's: closing the env leaves it running.
    server = cls(marker_dir=tmp_path)
    env = benchmax_gym.BenchmaxEnv(server, ROWS)
    env.close()
    assert server.marker.exists()
    done = server.shutdown()
    if asyncio.iscoroutine(done):
        asyncio.run(done)
    assert not server.marker.exists()


def test_vector_workers_shut_down_the_classes_they_build(tmp_path):
    env_id = register_benchmax_env("test/Server-v0", ServerEnv, ROWS, env_kwargs={"marker_dir": str(tmp_path)})
    with pytest.raises(TypeError, match="'max_turnz'"):
        gym.make(env_id, max_turnz=3)
    assert list(tmp_path.iterdir()) == []
    envs = gym.make_vec(env_id, num_envs=2)
    envs.reset(seed=0)
    assert len(list(tmp_path.iterdir())) == 2  # one per env, in the worker processes
    envs.close()
    assert list(tmp_path.iterdir()) == []


class EchoEnv(BaseEnv):
    """A tool with an argument named like the engine's own (``episode``)."""

    async def list_tools(self):
        schema = {"type": "object", "properties": {"episode": {"type": "integer"}, "text": {"type": "string"}},
                  "required": ["episode", "text"]}
        return [ToolDefinition("echo", "Echo the arguments.", schema)]

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        return f"{rollout_id} {tool_name} {sorted(tool_args.items())}"

    async def compute_reward(self, rollout_id, messages, task, **kwargs):
        return {"done": 1.0}


def test_a_tool_argument_named_episode_reaches_run_tool_intact():
    env = gym.make(register_benchmax_env("test/Echo-v0", EchoEnv, ROWS))
    env.reset(seed=0)
    obs, *_, info = env.step('<tool_call>{"name": "echo", "arguments": {"episode": 7, "text": "x"}}</tool_call>')
    assert info["error"] is None, obs
    assert f"{env.unwrapped.episode.rollout_id} echo [('episode', 7), ('text', 'x')]" in obs
    env.close()



class SyncRolloutEnv(AnswerTagEnv):
    """Sync rollout hooks, named as the benchmax package's LocalMCPEnv (0.1.1) has them."""

    def __init__(self, **kwargs):
        self.live: set[str] = set()

    def init_rollout(self, rollout_id, **rollout_args):
        self.live.add(rollout_id)

    def cleanup_rollout(self, rollout_id, keep_workspace=True):
        self.live.remove(rollout_id)


class AsyncCleanupEnv(SyncRolloutEnv):
    async def init_rollout(self, rollout_id, **rollout_args):
        self.live.add(rollout_id)

    async def cleanup_rollout(self, rollout_id, keep_workspace=True):
        self.live.remove(rollout_id)


@pytest.mark.parametrize("cls", [SyncRolloutEnv, AsyncCleanupEnv])
def test_rollout_hooks_sync_or_async_and_named_cleanup_rollout_open_and_close_each_episode(cls):
    """A sync init_rollout made every reset fail ("object NoneType can't be used in 'await'
    expression"); a cleanup_rollout on a subclass of benchmax_gym's BaseEnv was never called
    (the base's no-op release_rollout was), so every episode's rollout was left open."""
    env = benchmax_gym.BenchmaxEnv(cls, ROWS)
    env.reset(seed=0)
    assert env.benchmax_env.live == {env.episode.rollout_id}
    env.step("<answer>Paris</answer>")
    env.reset(seed=1)
    assert env.benchmax_env.live == {env.episode.rollout_id}

    async def again():
        await env.areset(seed=2)
        return env.episode.rollout_id

    rollout_id = asyncio.run(again())
    assert env.benchmax_env.live == {rollout_id}
    env.close()
    assert env.benchmax_env.live == set()
