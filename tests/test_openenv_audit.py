"""`benchmax/OpenEnv-v0` when the server fails it (its environment raises, it dies, it is slow),
under make_vec too, and text OpenEnv's wire cannot carry as the model wrote it. Real servers
on 127.0.0.1: `build_app` in a thread, `benchmax-gym openenv-serve` as a process."""

import asyncio
import math
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.openenv import _require

_require()  # openenv.core as benchmax-gym loads it: without its Gradio web UI (~3 s of every test process's collection)
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_openenv import CALC, call, serve_cli, served  # noqa: E402, F401  (fixtures)

FAULTY = "audit/FaultyMath-v0"


class Faulty(gym.Wrapper):
    """Math-v0 whose step raises or stalls on cue, and whose reset raises for task 99: a server
    environment with a bug, or one that hangs."""

    def step(self, action):
        if action == "RAISE":
            raise ValueError("the faulty env broke on purpose")
        if action == "STALL":
            time.sleep(2)
        return self.env.step(action)

    def reset(self, *, seed=None, options=None):
        if (options or {}).get("task_index") == 99:
            raise ValueError("reset broke on purpose")
        return self.env.reset(seed=seed, options=options)


if FAULTY not in gym.registry:
    gym.register(FAULTY, entry_point=lambda **kwargs: Faulty(gym.make("benchmax/Math-v0", python_tool=False, **kwargs)))


def assert_failed(result, outcome, says):
    """An episode the server could not play: ended, ungraded, NaN, the server's message kept."""
    obs, reward, terminated, truncated, info = result
    assert math.isnan(reward) and truncated and not terminated, result
    assert info["outcome"] == outcome and says in info["outcome_detail"], info
    assert "could not be graded" in obs and says not in obs  # the model is told no more than that


def test_a_step_the_servers_environment_raises_in_ends_the_episode_as_env_error(served):
    env = gym.make("benchmax/OpenEnv-v0", base_url=served(FAULTY))
    env.reset(seed=0)
    assert "42" in env.step(CALC)[0]
    assert_failed(env.step("RAISE"), "env_error", "the faulty env broke on purpose")
    record = env.unwrapped.episode_record()
    assert record["outcome"] == "env_error" and record["reward"] is None
    with pytest.raises(gym.error.ResetNeeded):  # (it answered reward 0.0, done, from a fresh session)
        env.step(CALC)
    env.reset(seed=0)  # a new session plays on
    assert "42" in env.step(CALC)[0]
    env.close()


def test_a_step_after_a_failed_reset_is_never_a_reward(served):
    env = gym.make("benchmax/OpenEnv-v0", base_url=served(FAULTY))
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="reset broke on purpose"):
        env.reset(seed=0, options={"task_index": 99})
    assert_failed(env.step(CALC), "env_error", "no episode running")
    env.close()


def test_a_server_that_dies_mid_episode_ends_it_as_tool_unavailable(serve_cli):
    server = serve_cli("openenv-serve", "benchmax/Math-v0", "--env-arg", "python_tool=false")
    env = gym.make("benchmax/OpenEnv-v0", base_url=server.url)
    env.reset(seed=0)
    assert "42" in env.step(CALC)[0]
    server.close()  # SIGKILL
    assert_failed(env.step(CALC), "tool_unavailable", f"base_url='{server.url}'")
    with pytest.raises(ConnectionError, match=f"base_url='{server.url}'"):
        env.reset(seed=0)
    env.close()


def test_a_step_past_the_clients_timeout_ends_as_tool_timeout(served):
    env = gym.make("benchmax/OpenEnv-v0", base_url=served(FAULTY), timeout=0.5)
    env.reset(seed=0)
    assert_failed(env.step("STALL"), "tool_timeout", "did not answer within timeout=0.5 s")
    env.reset(seed=0)
    assert "42" in env.step(CALC)[0]
    env.close()


def test_under_make_vec_a_failing_session_leaves_the_others_playing(served):
    envs = gym.make_vec("benchmax/OpenEnv-v0", num_envs=3, num_workers=1, base_url=served(FAULTY))
    envs.reset(seed=0)
    obs, reward, terminated, truncated, info = envs.step(np.array(["RAISE", CALC, CALC], dtype=object))
    assert math.isnan(reward[0]) and truncated[0] and info["outcome"][0] == "env_error"
    assert all("42" in o for o in obs[1:]) and list(reward[1:]) == [0.0, 0.0] and not truncated[1:].any()
    obs, reward, terminated, truncated, info = envs.step(np.array([CALC] * 3, dtype=object))
    assert "math problem" in obs[0]  # its new episode began
    assert all("42" in o for o in obs[1:]) and not (terminated | truncated).any()
    envs.close()


def test_a_reply_past_the_servers_message_limit_is_refused_and_the_episode_goes_on(served):
    """Past 16 MiB the server closed the WebSocket: the model's long reply lost the episode."""
    env = gym.make("benchmax/OpenEnv-v0", base_url=served("benchmax/Math-v0", {"python_tool": False}))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("y" * (17 << 20))
    assert info["error"] == "action_too_long" and reward == 0.0 and not (terminated or truncated)
    assert "limit is 1000000" in obs and len(env.unwrapped.messages[-2]["content"]) <= 1_000_000
    assert "42" in env.step(CALC)[0]
    env.close()


def test_a_lone_surrogate_the_model_wrote_plays_as_in_process(served):
    """A JSON escape the model writes (``\\ud800``) decodes to a lone surrogate, which the env
    echoes in the call's arguments or the assistant turn; OpenEnv's serializer refused it and the
    step failed (EXECUTION_ERROR). It travels as U+FFFD, as the env shows it."""
    url = served("benchmax/Math-v0", {"python_tool": False})
    escaped = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7\\ud800"}}</tool_call>'
    raw = "\\boxed{1} \ud800"
    direct = gym.make("benchmax/Math-v0", python_tool=False)
    remote = gym.make("benchmax/OpenEnv-v0", base_url=url)
    results = []
    for env in (direct, remote):
        env.reset(seed=0)
        results.append((env.step(escaped), env.step(raw)))
    (d_call, d_end), (r_call, r_end) = results
    assert r_call[0] == d_call[0] and r_call[4]["error"] == d_call[4]["error"]
    assert r_end[:4] == d_end[:4] and r_end[4]["outcome"] == "scored"
    assert remote.unwrapped.messages[-1]["content"] == "\\boxed{1} \ufffd"

    async def state_of_a_session_named_so():
        async with GenericEnvClient(base_url=url) as client:
            await client.reset(seed=0, episode_id="run \ud800")
            return await client.state()

    assert asyncio.run(state_of_a_session_named_so())["episode_id"] == "run \ufffd"
    direct.close()
    remote.close()


def test_two_sessions_at_once_each_keep_their_own_files_and_state(served):
    """Two consumers of one server: the same file name in each sandbox workspace, each reads its own."""
    url = served("benchmax/Math-v0")
    a, b = (gym.make("benchmax/OpenEnv-v0", base_url=url) for _ in range(2))
    a.reset(seed=0, options={"task_index": 1})
    b.reset(seed=0, options={"task_index": 2})
    for env, name in ((a, "a"), (b, "b")):
        env.step(call("python", code=f"open('note.txt', 'w').write('{name}'); print('saved')"))
    seen = [env.step(call("python", code="import os; print(sorted(os.listdir('.')), open('note.txt').read())"))[0]
            for env in (a, b)]
    assert "['note.txt'] a" in seen[0] and "['note.txt'] b" in seen[1], seen
    states = [env.unwrapped.server_state() for env in (a, b)]
    assert [s["task_index"] for s in states] == [1, 2] and states[0]["episode_id"] != states[1]["episode_id"]
    a.close()
    b.close()
