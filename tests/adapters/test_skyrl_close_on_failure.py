"""SkyRL: an env whose ``init`` or ``step`` raises, or whose episode ends failed, is closed at once
by the adapter (and a raising one ends its trajectory ``env_error`` rather than SkyRL's batch). SkyRL 0.4's generator closes an env only after an episode that ends without an
exception (no ``finally`` around its loop), so such an env kept its MCP server running and its
workspace on disk until garbage collection. The env here is MCP-v0 with its bundled example
server (a real stdio subprocess), driven as SkyRL's generator drives it (``test_skyrl._agent_loop``)."""

import asyncio
import concurrent.futures
import json
import math

import gymnasium as gym
import psutil
import pytest
import skyrl_gym
from test_skyrl import _agent_loop

import benchmax_gym  # noqa: F401

ENV_ID = "benchmax-test/SkyRLBreakingMCP-v0"
MADE: list["Breaking"] = []  # every env made, to look at its server and workspace afterwards
ANSWER = "<answer>1</answer>"


class Breaking(gym.Wrapper):
    """MCP-v0 whose backend is lost: ``fail_at="init"``: after its servers started, its reset
    raises; ``"step"``: its step raises; ``"outcome"``: its step ends the episode
    ``tool_unavailable`` (the engine's failed episode). Notes its server's pids and its closes."""

    def __init__(self, env, fail_at):
        super().__init__(env)
        self.fail_at, self.closes, self.servers = fail_at, 0, []
        MADE.append(self)

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self.servers = [pid for c in self.env.unwrapped.connections.values() for pid in c.pids]
        if self.fail_at == "init":
            raise ConnectionError("the task store at 10.0.0.7 is unreachable")
        return out

    def step(self, action):
        if self.fail_at == "step":
            raise ConnectionResetError("the env's sandbox host reset the connection")
        obs, _, _, _, info = self.env.step(action)
        return obs, math.nan, False, True, {**info, "outcome": "tool_unavailable"}

    def close(self):
        self.closes += 1
        super().close()


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=lambda fail_at=None, **kwargs: Breaking(gym.make("benchmax/MCP-v0", **kwargs),
                                                                              fail_at), disable_env_checker=True)


def _row(fail_at):
    return {"prompt": [], "env_class": "benchmax", "env_id": ENV_ID, "task_index": 0,
            "env_kwargs": json.dumps({"fail_at": fail_at})}


def _running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _released(env):
    """The env's MCP server is gone and its workspace removed."""
    return env.servers and not any(map(_running, env.servers)) and not env.unwrapped._root.exists()


@pytest.mark.parametrize("fail_at, error", [("init", "ConnectionError: the task store at 10.0.0.7 is unreachable"),
                                            ("step", "ConnectionResetError: the env's sandbox host reset the connection")])
def test_an_env_raising_in_skyrls_loop_is_closed_and_its_trajectory_fails(fail_at, error):
    """init: its reset raises after its server started; step: its step raises. SkyRL's loop gets
    a trajectory that ends ``env_error`` (NaN, the error's own text in ``outcome_detail``), not
    the exception (which failed SkyRL's whole batch), and by then the server is gone and the
    workspace removed."""
    MADE.clear()

    async def main():
        with concurrent.futures.ThreadPoolExecutor(1) as executor:
            return await _agent_loop(executor, {}, _row(fail_at), lambda history: ANSWER)

    history, rewards, last, metrics = asyncio.run(main())
    assert last["done"] and last["metadata"]["failed"] and last["metadata"]["outcome"] == "env_error"
    assert error in last["metadata"]["outcome_detail"] and ENV_ID in last["metadata"]["outcome_detail"]
    assert math.isnan(rewards[-1]) and metrics["env/outcome/env_error"] == 1.0
    [env] = MADE
    assert _released(env), "its MCP server or workspace outlived the error"
    assert env.closes == 1


def test_an_interrupt_in_skyrls_loop_still_raises_with_the_env_closed():
    """A KeyboardInterrupt (or a cancellation) in the env's step is no env failure: it goes on,
    the env closed first."""
    MADE.clear()
    env = skyrl_gym.make("benchmax", env_config={}, extras={k: v for k, v in _row(None).items()
                                                            if k not in ("prompt", "env_class")})
    env.init([])
    [inner] = MADE

    def interrupted(action):
        raise KeyboardInterrupt

    inner.step = interrupted
    with pytest.raises(KeyboardInterrupt):
        env.step(ANSWER)
    assert _released(inner) and inner.closes == 1


def test_a_failed_episode_is_closed_when_it_ends_and_skyrls_close_is_harmless():
    """The step that ends the episode ``tool_unavailable`` returns with the env closed; SkyRL's
    own close afterwards closes nothing again and raises nothing."""
    MADE.clear()
    env = skyrl_gym.make("benchmax", env_config={}, extras={k: v for k, v in _row("outcome").items()
                                                            if k not in ("prompt", "env_class")})
    env.init([])
    [inner] = MADE
    assert inner.servers and all(map(_running, inner.servers))
    out = env.step(ANSWER)
    assert out["done"] and out["metadata"]["failed"] and out["metadata"]["outcome"] == "tool_unavailable"
    assert _released(inner), "its MCP server or workspace outlived the failed episode"
    assert inner.closes == 1
    assert env.get_metrics()["env/outcome/tool_unavailable"] == 1.0
    env.close()
    assert inner.closes == 1
