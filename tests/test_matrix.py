"""Every way to build an environment through every way to run one.

Builders: a registered id (``benchmax/Math-v0``), ``register_tool_env``, ``register_benchmax_env``
and an MCP config (MCP-v0 with a user's server, tasks and reward), from ``tests/matrix_envs.py``.
Runners: ``gym.make``; ``gym.make_vec`` in the ``sync`` and ``async`` modes and the default
SubprocVectorEnv, lock-step and ready-first; the CLI's ``run`` and ``eval`` (a model endpoint on
loopback); ``mcp-serve``; ``openenv-serve`` through ``benchmax/OpenEnv-v0``. Elsewhere:
``vector_backend="ray"`` in tests/wrappers/on_ray/test_ray_matrix.py; ``evaluate()``, the
in-process OpenEnv server and every trainer adapter (TRL, verl, SkyRL, OpenRLHF) for these ids
and the registered ones in tests/test_contract.py and tests/test_openenv.py.
"""

import asyncio
import json
import os
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

from cli_in_process import run_in_process  # noqa: E402
from test_openenv import Served  # noqa: E402

from benchmax_gym.testing.openai_server import FakeChatServer  # noqa: E402
from benchmax_gym.wrappers import SubprocVectorEnv  # noqa: E402

TESTS = Path(__file__).parent
IDS = list(CASES)
CLI = [sys.executable, "-m", "benchmax_gym", "--import", "matrix_envs"]


def env_args(kwargs):
    """The case's keyword arguments as the CLI takes them."""
    return [a for k, v in kwargs.items() for a in ("--env-arg", f"{k}={json.dumps(v)}")]


def play_case(env, env_id):
    """The case's tool call shows its output; its final reply earns the case's reward."""
    kwargs, call, shows, _, reward = CASES[env_id]
    env.reset(options={"task_index": 0})
    obs, _, terminated, _, info = env.step(call)
    assert shows in obs and not terminated and info["error"] is None
    _, got, terminated, _, _ = env.step(final_reply(env_id, kwargs))
    assert terminated and got == reward
    env.close()


@pytest.mark.parametrize("env_id", IDS)
def test_gym_make(env_id):
    play_case(gym.make(env_id, **CASES[env_id][0]), env_id)


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
    """One id runs the console script in a fresh process, which learns the id only from ``--import``;
    the others run the CLI's ``main`` in this process (a start costs ~0.5 CPU-s before any work)."""
    fresh = "matrix/Geo-v0"  # (a register_tool_env id: in that process only --import registers it)
    assert fresh in IDS
    kwargs, *_ = CASES[env_id]
    argv = ["run", env_id, "--policy", "random", "--episodes", "2", "--json", "--quiet", *env_args(kwargs)]
    if env_id == fresh:
        done = subprocess.run([*CLI, *argv], cwd=TESTS, capture_output=True, text=True, timeout=300)
    else:
        done = run_in_process(*CLI[3:], *argv, cwd=TESTS)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["env_id"] == env_id and summary["episodes"] == 2


@pytest.mark.parametrize("env_id", IDS)
def test_mcp_serve(env_id):
    kwargs, call, shows, _, _ = CASES[env_id]
    called = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))

    async def main():
        server = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp-serve", env_id, *env_args(kwargs)],
                                       cwd=str(TESTS))
        async with Client(server) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool(called["name"], called["arguments"])
            return names, "\n".join(block.text for block in result.content), result.is_error

    names, text, is_error = asyncio.run(main())
    assert called["name"] in names and shows in text and not is_error


@pytest.mark.parametrize("env_id", IDS)
def test_cli_eval_against_a_model_endpoint_and_a_baseline(env_id, tmp_path):
    """``eval --model`` on an OpenAI-compatible server on loopback, scripted to make the case's
    tool call, then give the right final reply: the run's records show the tool's output, and
    score the case's reward. ``--policy random``, the floor: every episode scored, below it.
    (``--policy solver`` is only for ids with a reference solver: a ``register_tool_env`` or
    benchmax ``BaseEnv`` build has none, and its episodes are ``model_error``.)"""
    kwargs, call, shows, _, reward = CASES[env_id]
    replies = [call, final_reply(env_id, kwargs)]

    def model(body):
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        return {"content": replies[min(turn, 1)]}

    with FakeChatServer(model) as server:  # (in this process: test_cli_run starts the console script once)
        done = run_in_process("--import", "matrix_envs", "eval", env_id, "--model", "test-model", "--base-url",
                              server.url, "--tool-mode", "text", "--tasks", "1", "-k", "2", "--json", "--quiet",
                              "--no-plots", "--out", str(tmp_path / "run"), *env_args(kwargs), cwd=TESTS)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and summary["mean_reward"]["value"] == reward
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in records] == [reward, reward]
    assert all(r["actions"] == replies and shows in json.dumps(r["messages"][3:]) for r in records)
    floor = run_in_process("--import", "matrix_envs", "eval", env_id, "--policy", "random", "--tasks", "1", "-k",
                           "2", "--json", "--quiet", "--no-plots", "--out", str(tmp_path / "random"),
                           *env_args(kwargs), cwd=TESTS)
    assert floor.returncode == 0, floor.stderr[-2000:]
    summary = json.loads(floor.stdout.strip().splitlines()[-1])
    assert summary["outcomes"] == {"scored": 2} and summary["mean_reward"]["value"] < reward


@pytest.mark.parametrize("env_id", IDS)
def test_openenv_serve(env_id):
    """The served id played through ``benchmax/OpenEnv-v0`` (OpenEnv's client underneath)."""
    server = Served("--import", "matrix_envs", "openenv-serve", env_id, *env_args(CASES[env_id][0]), cwd=TESTS)
    try:
        play_case(gym.make("benchmax/OpenEnv-v0", base_url=server.url), env_id)
    finally:
        server.close()


@pytest.mark.parametrize("env_id", IDS)
def test_trl_environment_factory_plays_an_episode(env_id):
    """TRL's ``environment_factory`` class: its tool method gives the tool's output, and its
    reward function grades the final reply (or the terminal tool's call) with the case's reward.
    (tests/test_contract.py checks these methods' signatures against the tools' schemas.)"""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from benchmax_gym.adapters.trl import trl_environment

    kwargs, call, shows, _, reward = CASES[env_id]
    Env = trl_environment(env_id, **kwargs)
    env = Env()
    try:
        env.reset(**Env.dataset(1)[0])
        called = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert shows in getattr(env, called["name"])(**called["arguments"])
        final = final_reply(env_id, kwargs)
        if final.startswith("<tool_call>"):  # a terminal tool (Desk's submit): TRL calls it as a method
            ending = json.loads(final.removeprefix("<tool_call>").removesuffix("</tool_call>"))
            getattr(env, ending["name"])(**ending["arguments"])
            final = ""
        assert Env.reward([[{"role": "assistant", "content": final}]], environments=[env]) == [reward]
    finally:
        env.env.close()


SCRIPT = """
import json, sys
import gymnasium as gym
from benchmax_gym import final_answer
from benchmax_gym.eval import evaluate
from benchmax_gym.wrappers import SubprocVectorEnv

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6 * 7"}}</tool_call>'


def stated(completion, answer):
    return float(final_answer(completion) == answer)


def model(obs, info):
    return [CALL, "<answer>42</answer>"][min(info["turn"], 1)]


if __name__ == "__main__":
    gym.register("script/MCPConfig-v0", entry_point="benchmax_gym.envs.mcp.env:MCPEnv", kwargs={
        "server": {"command": sys.executable, "args": ["-m", "benchmax_gym.envs.mcp.example_server"]},
        "tasks": [{"prompt": "What is 6 * 7? Use calculate.", "answer": "42"}], "reward": stated})
    envs = SubprocVectorEnv("script/MCPConfig-v0", 1, context="spawn")
    try:
        envs.reset(seed=0)
        obs, _, _, _, _ = envs.step([CALL])
        _, rewards, _, _, _ = envs.step(["<answer>42</answer>"])
    finally:
        envs.close()
    result = evaluate("script/MCPConfig-v0", model, tasks=1, k=2, workers=2)
    print(json.dumps({"shown": ["42" in o for o in obs], "rewards": rewards.tolist(),
                      "eval": [(r["reward"], r["error"]) for r in result.records]}))
"""


def test_an_mcp_config_registered_in_a_scripts_main_reaches_fresh_worker_processes(tmp_path):
    """``gym.register`` with a module path (MCP-v0's class) and the user's server, tasks and reward,
    in a script: a spawned vector worker and an eval worker are fresh processes that only learn
    the id from the script's process (their imports never register it)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    root = str(TESTS.parent)  # (the script imports the benchmax_gym under test)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"shown": [True], "rewards": [1.0], "eval": [[1.0, None], [1.0, None]]}


def test_a_trainers_fresh_process_makes_a_users_id_by_module_and_id():
    """The README's way to hand an env of your own to a trainer's fresh worker process (verl's,
    OpenRLHF's): ``module:id``, which imports the module that registers it before making it."""
    code = ("import sys\n"
            "from benchmax_gym.adapters.tokens import make_env\n"
            "assert 'matrix_envs' not in sys.modules\n"
            "env = make_env('matrix_envs:matrix/Geo-v0')\n"
            "env.reset(seed=0, options={'task_index': 0})\n"
            "print(type(env.unwrapped).__name__, [s['function']['name'] for s in env.unwrapped.toolset.schemas])\n"
            "env.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=TESTS)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] == "ToolEnv" and "country" in out.stdout
