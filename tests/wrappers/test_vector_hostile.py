"""SubprocVectorEnv against envs that misbehave in ways a worker must contain: results that cannot
be pickled or unpickled, an env (or a tool it calls) that exits or raises KeyboardInterrupt. The
env at fault reports what was wrong; the envs sharing its worker keep their results."""

import asyncio
import gc
import os
import signal
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.vector import AutoresetMode

import benchmax_gym
from benchmax_gym import UnicodeText
from benchmax_gym.wrappers import SubprocVectorEnv



def children():
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = children()
    yield
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and children() - before:
        time.sleep(0.1)
    assert children() - before == set()


class NeedsTwo(Exception):
    """Pickles, but does not unpickle: ``__init__`` takes two arguments, ``args`` holds one
    (``json.JSONDecodeError`` is another)."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class Hostile(gym.Env):
    """Echoes its action; some actions make it misbehave. Its resets put a lock in the info
    while the file ``flag`` exists."""

    observation_space = UnicodeText(1000)
    action_space = UnicodeText(1000)

    def __init__(self, flag: str = ""):
        self.flag = flag

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        if options and options.get("exit"):
            sys.exit(2)
        info = {"bad": threading.Lock()} if self.flag and os.path.exists(self.flag) else {}
        return "start", info

    def step(self, action):
        self.count += 1
        obs, info = f"echo {action} {self.count}", {"count": self.count}
        if action == "lock":
            info["bad"] = threading.Lock()
        elif action == "generator":
            info["bad"] = (n for n in range(3))
        elif action == "lambda":
            info["bad"] = lambda: 1
        elif action == "exit":
            sys.exit(2)
        elif action == "interrupt":
            raise KeyboardInterrupt
        elif action == "unreadable":
            info["bad"] = NeedsTwo(1, 2)
        elif action == "unreadable obs":
            obs = NeedsTwo(1, 2)
        return obs, 1.0, False, False, info


class AsyncHostile(Hostile):
    """``Hostile`` with the coroutine API, which a worker runs as tasks on its event loop."""

    needs_event_loop = True

    async def areset(self, *, seed=None, options=None):
        await asyncio.sleep(0)
        return self.reset(seed=seed, options=options)

    async def astep(self, action):
        await asyncio.sleep(0)
        return self.step(action)


def _step(envs, actions, ready_first):
    if ready_first:
        envs.send(actions)
        *batch, ids = envs.recv(min_ready=len(actions), timeout=60)
        assert ids.tolist() == list(range(len(actions)))
        return batch
    return envs.step(actions)


@pytest.mark.parametrize("ready_first", [False, True])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("bad", ["lock", "generator", "lambda"])
def test_a_result_that_cannot_be_pickled_ends_that_envs_episode_alone(bad, mode, ready_first):
    """It killed the worker: every env it held lost its step, and the error named none of them."""
    envs = SubprocVectorEnv([Hostile] * 3, num_workers=1, autoreset_mode=mode)
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, info = _step(envs, ["a", bad, "b"], ready_first)
        assert obs[0] == "echo a 1" and obs[2] == "echo b 1" and rewards[[0, 2]].tolist() == [1.0, 1.0]
        assert truncated.tolist() == [False, True, False] and np.isnan(rewards[1])
        assert info["scored"].tolist() == [True, False, True] and envs.faults == 0
        ended = info["final_info"] if mode == AutoresetMode.SAME_STEP else info
        assert ended["_error"].tolist() == [False, True, False] and ended["outcome"][1] == "env_error"
        assert "env 1's result cannot be sent to the parent: info['bad']:" in ended["error"][1]
        assert info["count"][[0, 2]].tolist() == [1, 1]
        if mode == AutoresetMode.SAME_STEP:
            assert obs[1] == "start"  # (its fresh episode's)
        obs, *_ = _step(envs, ["c"] * 3, ready_first)
        assert obs[0] == obs[2] == "echo c 2"
        assert obs[1] == ("echo c 1" if mode == AutoresetMode.SAME_STEP else "start")
        _, _, _, truncated, info = _step(envs, [bad] * 3, ready_first)  # every env of the worker at once
        ended = info["final_info"] if mode == AutoresetMode.SAME_STEP else info
        assert truncated.all() and all(f"env {i}'s result cannot be sent" in ended["error"][i] for i in range(3))
        assert envs.faults == 0
    finally:
        envs.close()


def test_same_step_when_the_reset_that_replaces_an_unsendable_result_is_unsendable_too(tmp_path):
    flag = tmp_path / "resets-hold-a-lock"
    make = lambda: Hostile(str(flag))  # noqa: E731
    envs = SubprocVectorEnv([make] * 2, num_workers=1, autoreset_mode="SameStep")
    try:
        envs.reset(seed=0)
        flag.touch()
        obs, rewards, terminated, truncated, info = envs.step(["a", "lock"])
        assert obs[0] == "echo a 1" and truncated.tolist() == [False, True] and envs.faults == 0
        assert "env 1's result cannot be sent to the parent: info['bad']:" in info["final_info"]["error"][1]
        assert "env 1's result cannot be sent" in info["error"][1]  # (its reset's, which held a lock too)
        flag.unlink()
        obs, *_ = envs.step(["b", "b"])
        assert list(obs) == ["echo b 2", "echo b 1"]  # (env 1 was reset: only its info was left out)
    finally:
        envs.close()


def cli(args: str) -> str:
    """Run a command line that exits on arguments it does not know, as argparse and click do.

    Args:
        args: the arguments
    """
    if args != "--help":
        sys.exit(2)
    return "usage: cli [--help]"


async def acli(args: str) -> str:
    """Run a command line, asynchronously; it exits on arguments it does not know.

    Args:
        args: the arguments
    """
    await asyncio.sleep(0)
    return cli(args)


_TASKS = [{"prompt": "run it", "answer": "ok"}]
CLI = benchmax_gym.register_tool_env("testing/ExitingCli-v0", tools=[cli], tasks=_TASKS,
                                     rubric=[lambda completion, answer: 1.0])
ACLI = benchmax_gym.register_tool_env("testing/ExitingAsyncCli-v0", tools=[acli], tasks=_TASKS,
                                      rubric=[lambda completion, answer: 1.0])


def _call(tool, args):
    return f'<tool_call>{{"name": "{tool}", "arguments": {{"args": "{args}"}}}}</tool_call>'


@pytest.mark.parametrize("ready_first", [False, True])
@pytest.mark.parametrize("env, actions, says", [
    (Hostile, ["a", "exit", "a"], "SystemExit: 2"),
    (Hostile, ["a", "interrupt", "a"], "KeyboardInterrupt"),
    (AsyncHostile, ["a", "exit", "a"], "SystemExit: 2"),
])
def test_an_env_that_exits_or_raises_keyboard_interrupt_ends_its_own_episode(env, actions, says, ready_first):
    """An env whose code calls sys.exit() took the worker down, and the results of every env it
    held ("the worker process exited (code 2)", no env named)."""
    envs = SubprocVectorEnv(env if isinstance(env, str) else [env] * 3, num_envs=3 if isinstance(env, str) else None,
                            num_workers=1)
    try:
        first, _ = envs.reset(seed=0)
        obs, rewards, terminated, truncated, info = _step(envs, actions, ready_first)
        assert truncated.tolist() == [False, True, False] and info["scored"].tolist() == [True, False, True]
        assert [bool(e) for e in info["error"]] == [False, True, False] and says in info["error"][1]
        assert info["outcome"][1] == "env_error" and envs.faults == 0
        assert obs[0] == obs[2] != "" and obs[0] != first[0]  # the neighbours' own steps
        obs, *_ = _step(envs, actions[:1] * 3, ready_first)
        assert obs[1] == first[1] and envs.faults == 0  # (rebuilt, and reset by its next step)
    finally:
        envs.close()


@pytest.mark.parametrize("ready_first", [False, True])
@pytest.mark.parametrize("env, tool", [(CLI, "cli"), (ACLI, "acli")])
def test_a_tool_that_exits_on_bad_arguments_is_that_calls_error_in_a_worker(env, tool, ready_first):
    """A tool that calls sys.exit() on a model's bad arguments (argparse) fails its call, sync or
    async: the episode goes on, and the worker and its other envs are untouched."""
    envs = SubprocVectorEnv(env, num_envs=3, num_workers=1)
    try:
        envs.reset(seed=0)
        actions = [_call(tool, "--help"), _call(tool, "--bad"), _call(tool, "--help")]
        obs, rewards, terminated, truncated, info = _step(envs, actions, ready_first)
        assert truncated.tolist() == [False] * 3 and terminated.tolist() == [False] * 3
        assert list(info["error"]) == [None, "tool_error", None] and "exited (sys.exit(2))" in obs[1]
        assert obs[0] == obs[2] != "" and envs.faults == 0
    finally:
        envs.close()


def test_a_reset_that_exits_in_an_async_env_fails_that_env_alone():
    envs = SubprocVectorEnv([AsyncHostile] * 2, num_workers=1)
    try:
        obs, info = envs.reset(seed=0, options=[{}, {"exit": True}])
        assert obs[0] == "start" and "SystemExit: 2" in info["error"][1] and envs.faults == 0
        assert info["_error"].tolist() == [False, True]
    finally:
        envs.close()


@pytest.mark.parametrize("action, ready_first", [("unreadable", True), ("unreadable obs", False),
                                                 ("unreadable obs", True)])
def test_a_result_that_does_not_unpickle_in_the_parent_restarts_its_worker_and_never_hangs(action, ready_first):
    """A value that pickles in the worker but not back in the parent (an exception whose
    ``__init__`` takes other arguments) raised a bare TypeError and lost the message: the envs
    it held then waited for ever (or until step_timeout, called too slow)."""
    envs = SubprocVectorEnv([Hostile] * 4, num_workers=2)
    hung = threading.Timer(60, lambda: [os.kill(pid, signal.SIGKILL) for pid in envs.worker_pids])
    hung.start()  # (a hang would block this test for ever: the watchdog breaks it, and the test fails)
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, info = _step(envs, ["a", "b", "c", action], ready_first)
        assert list(obs[:2]) == ["echo a 1", "echo b 1"] and truncated.tolist() == [False, False, True, True]
        assert all("could not be read in the parent: TypeError:" in info["error"][i] for i in (2, 3))
        assert envs.faults == 1
        obs, *_ = _step(envs, ["d"] * 4, ready_first)
        assert list(obs) == ["echo d 2", "echo d 2", "start", "start"] and envs.faults == 1
    finally:
        hung.cancel()
        envs.close()
