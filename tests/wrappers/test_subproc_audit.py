"""SubprocVectorEnv as a user meets it: step for step what Gymnasium's SyncVectorEnv returns over
hostile actions and a mixture, a reset after a worker died, an env whose reset raised, and a
close() from another thread while a call waits."""

import asyncio
import functools
import gc
import os
import random
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import benchmax_gym
from benchmax_gym import UnicodeText
from benchmax_gym.wrappers import SubprocVectorEnv
from benchmax_gym.wrappers.channel import WorkerLost

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "%d*%d"}}</tool_call>'
ACTIONS = [  # what a model writes: tool calls good and bad, answers, junk, huge and unpaired-surrogate text
    CALC, '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>', "<tool_call>{bad</tool_call>",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "\\boxed{%d}", "", "text \ud800 and \udfff",
    "\U0001F600" * 40, "x" * 100_000, '<tool_call>{"name": "calculator", "arguments": {"expression": "\udc80"}}</tool_call>',
]
MIX = [("benchmax/Math-v0", 0.5), ("benchmax/CRM-v0", 0.5)]
BATCH_WIDE = {"success_rate", "zero_variance", "scored"}  # (a vector env's own keys: see its docstring)


def children():
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def open_fds():
    """This process's pipes and sockets (a worker's connection, its process's sentinel)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(("pipe:", "socket:"))
        except OSError:  # (the listing's own descriptor, closed)
            pass
    return count


# Threads that live as long as the process, started by whichever call needs them first: the
# finalizer porter, the pool that runs async code off an event loop (core/aio.py), the reward
# runner each of that pool's threads keeps for its sync leaves (core/rubric.py), and the thread
# that detaches the sandbox's tmpfs mounts (core/sandbox.py; a test that was first in its process
# to close an episode's sandbox found it "left")
PROCESS_LIVED = ("benchmax-gym-finalizers", "benchmax-gym-loop", "benchmax-reward", "benchmax-sandbox-detach")


def new_threads(before: set[int]) -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.ident not in before and t.is_alive() and not t.name.startswith(PROCESS_LIVED)]


@pytest.fixture(autouse=True)
def no_leftovers():
    """No worker, descriptor or thread outlives a test (a thread ending under load is waited for)."""
    gc.collect()
    before, fds, threads = children(), open_fds(), {t.ident for t in threading.enumerate()}
    yield
    gc.collect()
    deadline = time.monotonic() + 60  # (a hang guard: they go in moments)
    while time.monotonic() < deadline and (children() - before or open_fds() > fds or new_threads(threads)):
        time.sleep(0.1)
    assert children() - before == set()
    assert open_fds() <= fds and new_threads(threads) == []


def _equal(x, y, path="") -> None:
    """Equal values of the same types all the way down; arrays by dtype, shape and elements, NaN
    equal to NaN; the vector env's own batch-wide keys set aside."""
    if isinstance(y, dict):
        assert isinstance(x, dict), path
        keys = {k for k in x if k.lstrip("_") not in BATCH_WIDE}
        assert keys == {k for k in y if k.lstrip("_") not in BATCH_WIDE}, (path, keys ^ set(y))
        for key in keys:
            _equal(x[key], y[key], f"{path}[{key!r}]")
    elif isinstance(y, np.ndarray):
        assert type(x) is np.ndarray and (x.dtype, x.shape) == (y.dtype, y.shape), (path, x, y)
        if y.dtype == object:
            for a, b in zip(x, y):
                _equal(a, b, path)
        else:
            assert np.array_equal(x, y, equal_nan=y.dtype.kind in "fc"), (path, x, y)
    elif isinstance(y, (list, tuple)):
        assert type(x) is type(y) and len(x) == len(y), (path, x, y)
        for a, b in zip(x, y):
            _equal(a, b, path)
    elif isinstance(y, float) and y != y:
        assert isinstance(x, float) and x != x, path
    else:
        assert type(x) is type(y) and x == y, (path, x, y)


def _subset(lean, full, path="") -> None:
    for key, value in lean.items():
        if key.lstrip("_") in BATCH_WIDE:
            continue
        if isinstance(value, dict):
            _subset(value, full[key], f"{path}[{key!r}]")
        else:
            _equal(value, full[key], f"{path}[{key!r}]")


def _action(rng: random.Random) -> str:
    action = rng.choice(ACTIONS)
    return action % (rng.randint(0, 99), rng.randint(0, 99)) if "%d*%d" in action else (
        action % rng.randint(0, 99) if "%d" in action else action)


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_a_mixture_under_hostile_actions_steps_as_sync_vector_env_does(mode):
    """Seeded random actions (malformed calls, answers, huge, emoji and lone-surrogate text) on a
    mixture of two families, 5 envs over 2 workers (3 + 2): observations, rewards, flags and
    every info key, mask, dtype and nested final_info equal SyncVectorEnv's, with full infos and
    with info_keys, through episode ends in every autoreset mode."""
    n, rng = 5, random.Random(mode.value)
    fns = [functools.partial(gym.make, "benchmax/Mix-v0", members=MIX, max_turns=3)] * n
    full = SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode)
    lean = SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode, info_keys=["error", "reward_components", "x"])
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        a, c, b = full.reset(seed=3), lean.reset(seed=3), ref.reset(seed=3)
        assert a[0] == c[0] == b[0]
        _equal(dict(a[1]), b[1])
        done = np.zeros(n, dtype=np.bool_)
        for t in range(8):
            if mode == AutoresetMode.DISABLED and done.any():
                a, c, b = (e.reset(options={"reset_mask": done.copy()}) for e in (full, lean, ref))
                assert a[0] == c[0] == b[0]
                _equal(dict(a[1]), b[1])
            actions = [_action(rng) for _ in range(n)]
            x, z, y = full.step(actions), lean.step(actions), ref.step(actions)
            assert x[0] == z[0] == y[0], t
            for k in (1, 2, 3):
                _equal(x[k], y[k], f"step {t} [{k}]")
                _equal(z[k], y[k], f"step {t} [{k}]")
            _equal(dict(x[4]), y[4], f"step {t} info")
            _subset(dict(z[4]), y[4], f"step {t} lean info")
            done = x[2] | x[3]
        assert full.faults == lean.faults == 0
    finally:
        full.close(), lean.close(), ref.close()


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_a_reset_after_a_worker_died_between_calls_keeps_its_seeds(mode):
    """A worker that died while idle (OOM killer, SIGKILL) is found at the next reset: its envs
    reset on the fresh worker with their seeds, as if it had not died, not with an error and an
    empty observation whose next step resets them unseeded."""
    make = functools.partial(gym.make, "benchmax/Math-v0", python_tool=False)
    envs = SubprocVectorEnv(make, 4, num_workers=2, autoreset_mode=mode)
    try:
        expected, _ = envs.reset(seed=5)
        envs.step([CALC % (6, 7)] * 4)
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        time.sleep(0.2)
        obs, info = envs.reset(seed=5)
        assert obs == expected and "error" not in info
        obs, rewards, terminated, truncated, info = envs.step([CALC % (6, 7)] * 4)
        assert not truncated.any() and list(info["turn"]) == [1] * 4 and "42" in obs[3]
    finally:
        envs.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_an_env_whose_reset_raised_is_reset_by_its_next_step_not_stepped_on(mode):
    """A reset that raised (here a bad option, which leaves the env's running episode as it was)
    reports its error; the env's next step resets it, as autoreset does after an episode's end:
    it never plays on in the episode the user was told had been replaced."""
    make = functools.partial(gym.make, "benchmax/Math-v0", python_tool=False)
    envs = SubprocVectorEnv(make, 2, num_workers=1, autoreset_mode=mode)
    try:
        first, _ = envs.reset(seed=0)
        envs.step([CALC % (6, 7)] * 2)
        obs, info = envs.reset(options=[{"task_index": 1}, {"task_index": "abc"}])
        assert "task_index must be an int" in info["error"][1] and info["outcome"][1] == "env_error"
        obs, rewards, terminated, truncated, info = envs.step([CALC % (6, 7)] * 2)
        assert list(info["turn"]) == [1, 0]  # env 1: a new episode (its old one was at turn 1)
        assert obs[1].startswith("You are solving a math problem") and rewards[1] == 0.0
        assert not terminated[1] and not truncated[1]
        obs, rewards, terminated, truncated, info = envs.step([CALC % (6, 7)] * 2)
        assert list(info["turn"]) == [2, 1] and "42" in obs[1]
    finally:
        envs.close()


async def nap(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


NAPS = benchmax_gym.register_tool_env("testing/AuditNaps-v0", tools=[nap], tasks=[{"prompt": "nap", "answer": "ok"}],
                                      rubric=[lambda completion, answer: 1.0], max_turns=10)
NAP = '<tool_call>{"name": "nap", "arguments": {"seconds": %s}}</tool_call>'


@pytest.mark.timeout(120)  # a hang guard
@pytest.mark.parametrize("call", ["step", "step with step_timeout", "recv", "reset"])
def test_close_from_another_thread_ends_a_waiting_call_with_a_clear_error(call):
    """close() while another thread waits in step/recv/reset (its envs in a 60 s tool): close
    returns at once (the workers, idle on their event loops, obey), the waiting call raises that
    the vector env was closed (not an IndexError, not a worker restarted after the close), and
    nothing is left: no process, descriptor or thread."""
    envs = SubprocVectorEnv(NAPS, num_envs=4, num_workers=2, step_timeout=30 if "timeout" in call else None,
                            tool_timeout=120)
    envs.reset(seed=0)
    raised = []

    def waiting():
        try:
            if call == "recv":
                envs.send([NAP % 60] * 4)
                envs.recv(min_ready=4)
            elif call == "reset":
                envs.send([NAP % 60] * 4)  # (reset first finishes what is in flight)
                envs.reset(seed=1)
            else:
                envs.step([NAP % 60] * 4)
        except BaseException as exc:  # noqa: BLE001  (what the waiting thread meets)
            raised.append(exc)

    thread = threading.Thread(target=waiting)
    thread.start()
    time.sleep(1.0)  # (the naps are running)
    envs.close()
    thread.join(60)
    assert not thread.is_alive()
    assert len(raised) == 1 and type(raised[0]) is RuntimeError, raised
    assert "closed" in str(raised[0])
    envs.close()  # (again: nothing to do)


def test_close_releases_every_descriptor_though_the_env_is_still_referenced():
    """close() with the vector env still referenced (a trainer's attribute, a traceback's frame):
    the workers' pipes and their processes' sentinels are closed then, not when it is collected;
    after restarts too; closing again does nothing."""
    before = open_fds()
    envs = SubprocVectorEnv(functools.partial(gym.make, "benchmax/Math-v0", python_tool=False), 4, num_workers=2)
    envs.reset(seed=0)
    for _ in range(3):
        os.kill(envs.worker_pids[0], signal.SIGKILL)
        envs.step([CALC % (1, 2)] * 4)
    assert envs.faults == 3
    envs.close()
    assert open_fds() == before
    envs.close()
    with pytest.raises(RuntimeError, match="closed"):
        envs.step([CALC % (1, 2)] * 4)


class Answers(gym.Env):
    """Answers ``where`` calls; ``die(pid)`` kills the worker whose pid it is, mid-call."""

    observation_space = UnicodeText(100)
    action_space = UnicodeText(100)

    def reset(self, *, seed=None, options=None):
        return "start", {}

    def step(self, action):
        return f"echo {action}", 1.0, False, False, {}

    def where(self):
        return os.getpid()

    def die(self, pid):
        if os.getpid() == pid:
            os.kill(pid, signal.SIGKILL)
        return "alive"


@pytest.mark.parametrize("victim, how", [(0, "mid-call"), (1, "idle")])
def test_a_worker_lost_in_a_call_leaves_no_answer_for_the_next_step(victim, how):
    """The other workers' answers to a call that raised WorkerLost are read with it: the next
    step truncates the lost worker's envs and returns the others' steps (not their answers)."""
    envs = SubprocVectorEnv([Answers] * 4, num_workers=2)
    envs.reset(seed=0)
    pid = envs.worker_pids[victim]
    with pytest.raises(WorkerLost):
        if how == "idle":
            os.kill(pid, signal.SIGKILL)
            envs._workers[victim].process.join(10)  # (dead before the call: its pipe refuses it)
            envs.get_attr("where")
        else:
            envs.call("die", pid)
    obs, rewards, terminated, truncated, info = envs.step(["a"] * 4)
    lost = [victim * 2, victim * 2 + 1]
    assert truncated.tolist() == [i in lost for i in range(4)]
    assert [o for i, o in enumerate(obs) if i not in lost] == ["echo a", "echo a"]
    assert envs.get_attr("where") == tuple(envs.worker_pids[i // 2] for i in range(4))
    envs.close()


class Blocks(Answers):
    """``block(pid)`` and setting ``stall = pid`` block the worker whose pid it is (an env method
    that hangs); ``stall`` reads back what was set."""

    stall = None

    def block(self, pid):
        if os.getpid() == pid:
            time.sleep(60)  # (its worker is killed long before)
        return "done"

    def __setattr__(self, name, value):
        if name == "stall" and value == os.getpid():
            time.sleep(60)
        super().__setattr__(name, value)


@pytest.mark.parametrize("command", ["call", "set_attr"])
def test_a_worker_that_blocks_in_a_call_is_restarted_and_the_next_calls_answer(monkeypatch, command):
    """A worker silent past the call timeout (an env method that blocks) is restarted, its envs
    end truncated with the reason, and the call raises naming the worker, command and timeout,
    once the other worker's answer is read: the next step and call return their own values, not
    a late answer ("sent 'called', expected 'batch'") nor the old call's."""
    from benchmax_gym.wrappers import vector

    monkeypatch.setattr(vector, "CALL_TIMEOUT", 1.0)
    envs = SubprocVectorEnv([Blocks] * 4, num_workers=2)
    try:
        envs.reset(seed=0)
        pid = envs.worker_pids[0]
        with pytest.raises(vector.WorkerTimeout, match=rf"worker 0 \(pid {pid}\) of .* did not answer {command} "
                                                       rf"'(block|stall)' within 1 s .*envs \[0, 1\]"):
            envs.call("block", pid) if command == "call" else envs.set_attr("stall", pid)
        assert envs.faults == 1 and envs.worker_pids[0] != pid
        monkeypatch.setattr(vector, "CALL_TIMEOUT", 120.0)  # (the calls below: room on a loaded machine)
        obs, rewards, terminated, truncated, info = envs.step(["a"] * 4)
        assert truncated.tolist() == [True, True, False, False] and obs[2:] == ("echo a", "echo a")
        assert "did not answer" in info["error"][0] and list(info["outcome"][:2]) == ["env_error"] * 2
        assert envs.call("where") == tuple(envs.worker_pids[i // 2] for i in range(4))
        assert envs.call("block", -1) == ("done",) * 4
        envs.set_attr("stall", [1, 2, 3, 4])
        assert envs.get_attr("stall") == (1, 2, 3, 4)
        assert envs.step(["b"] * 4)[0][2:] == ("echo b", "echo b")
    finally:
        envs.close()


def test_set_attr_while_a_ready_first_step_is_in_flight_finishes_it_first():
    """set_attr after send() (its results not yet received) drops them, as call does: not
    "worker sent 'results', expected 'called'" and a vector env whose next call hangs."""
    envs = SubprocVectorEnv([Answers] * 4, num_workers=2)
    try:
        envs.reset(seed=0)
        envs.send(["a"] * 4)
        envs.set_attr("note", 7)
        assert envs.get_attr("note") == (7,) * 4
        assert envs.step(["b"] * 4)[0] == ("echo b",) * 4
    finally:
        envs.close()
