"""Every way to build an environment through every way to run one.

Builders: a registered id (``benchmax/Math-v0``), ``register_tool_env``, ``register_benchmax_env``
and an MCP config (MCP-v0 with a user's server, tasks and reward), from ``tests/matrix_envs.py``.
Runners: ``gym.make``; ``gym.make_vec`` in the ``sync`` and ``async`` modes and the default
SubprocVectorEnv, lock-step and ready-first; the CLI's ``run``; ``mcp-serve``.
"""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

sys.path.insert(0, str(Path(__file__).parent))
import matrix_envs  # noqa: E402, F401  (registers the matrix/* ids, here and in forked workers)
from matrix_envs import CASES, final_reply  # noqa: E402

from benchmax_gym.wrappers import SubprocVectorEnv  # noqa: E402

TESTS = Path(__file__).parent
IDS = list(CASES)
CLI = [sys.executable, "-m", "benchmax_gym", "--import", "matrix_envs"]


@pytest.mark.parametrize("env_id", IDS)
def test_gym_make(env_id):
    kwargs, call, shows, _, reward = CASES[env_id]
    env = gym.make(env_id, **kwargs)
    env.reset(options={"task_index": 0})
    obs, _, terminated, _, info = env.step(call)
    assert shows in obs and not terminated and info["error"] is None
    _, got, terminated, _, _ = env.step(final_reply(env_id, kwargs))
    assert terminated and got == reward
    env.close()


@pytest.mark.parametrize("mode", ["sync", "async", "subprocess"])
@pytest.mark.parametrize("env_id", IDS)
def test_make_vec_lock_step(env_id, mode):
    kwargs, call, shows, _, reward = CASES[env_id]
    final = final_reply(env_id, kwargs)
    how = {"num_workers": 2} if mode == "subprocess" else {"vectorization_mode": mode}  # subprocess: the default
    envs = gym.make_vec(env_id, num_envs=2, **how, **kwargs)
    try:
        envs.reset(seed=0, options={"task_index": 0})
        obs, _, terminated, _, _ = envs.step([call, call])
        assert all(shows in o for o in obs) and not terminated.any()
        _, rewards, terminated, _, _ = envs.step([final, "<answer>wrong</answer>"])
        assert terminated.all() and rewards[0] == reward and rewards[1] < reward
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", IDS)
def test_subprocess_ready_first(env_id):
    kwargs, call, shows, _, reward = CASES[env_id]
    envs = SubprocVectorEnv(env_id, 3, num_workers=2, **kwargs)
    try:
        envs.reset(options=[{"task_index": 0}] * 3)
        envs.send([call] * 3, env_ids=np.arange(3))
        seen = {}
        while len(seen) < 3:
            obs, _, _, _, _, ids = envs.recv(min_ready=1)
            seen.update(zip(ids.tolist(), obs))
        assert all(shows in o for o in seen.values())
        envs.send([final_reply(env_id, kwargs)], env_ids=[1])
        _, rewards, terminated, _, _, ids = envs.recv(min_ready=1)
        assert ids.tolist() == [1] and terminated[0] and rewards[0] == reward
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", IDS)
def test_cli_run(env_id):
    kwargs, *_ = CASES[env_id]
    env_args = [a for k, v in kwargs.items() for a in ("--env-arg", f"{k}={json.dumps(v)}")]
    done = subprocess.run([*CLI, "run", env_id, "--policy", "random", "--episodes", "2", "--json", "--quiet",
                           *env_args], cwd=TESTS, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["env_id"] == env_id and summary["episodes"] == 2


@pytest.mark.parametrize("env_id", IDS)
def test_mcp_serve(env_id):
    kwargs, call, shows, _, _ = CASES[env_id]
    called = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    env_args = [a for k, v in kwargs.items() for a in ("--env-arg", f"{k}={json.dumps(v)}")]

    async def main():
        server = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp-serve", env_id, *env_args], cwd=str(TESTS))
        async with Client(server) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool(called["name"], called["arguments"])
            return names, "\n".join(block.text for block in result.content), result.is_error

    names, text, is_error = asyncio.run(main())
    assert called["name"] in names and shows in text and not is_error
