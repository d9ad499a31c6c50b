"""SubprocVectorEnv.close() with a worker stuck in a synchronous step: the stuck worker is killed
at once, not after the grace that healthy workers get to close their envs (which they still do);
and a command a worker cannot unpickle is its own error, said at once."""

import functools
import threading
import time
from pathlib import Path

import gymnasium as gym
import psutil
import pytest

from benchmax_gym import UnicodeText
from benchmax_gym.wrappers import SubprocVectorEnv
from benchmax_gym.wrappers import vector
from benchmax_gym.wrappers.channel import WorkerLost


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Stalls(gym.Env):
    """'stall' blocks its worker for good (a sync tool without a timeout). Its close() waits (a
    minute at most, a hang guard) for the process named in ``folder/stuck`` to be gone, then says
    so: it can only say it if close() kills the stuck worker while this one still closes."""

    observation_space = action_space = UnicodeText(100)

    def __init__(self, folder: str, i: int):
        self.folder, self.i = Path(folder), i

    def reset(self, *, seed=None, options=None):
        return "start", {}

    def step(self, action):
        if action == "stall":
            time.sleep(1000)
        return action, 1.0, False, False, {}

    def close(self):
        stuck = self.folder / "stuck"
        for _ in range(600):
            if stuck.exists() and not running(int(stuck.read_text())):
                (self.folder / f"closed-{self.i}").write_text("after the stuck worker was gone")
                return
            time.sleep(0.1)


def stalling_envs(folder, **kwargs):
    envs = SubprocVectorEnv([functools.partial(Stalls, str(folder), i) for i in range(2)], num_workers=2, **kwargs)
    envs.reset(seed=0)
    (folder / "stuck").write_text(str(envs.worker_pids[0]))
    return envs


@pytest.mark.timeout(120)
def test_close_kills_a_worker_stuck_in_a_ready_first_step_while_the_others_close_their_envs(tmp_path):
    envs = stalling_envs(tmp_path, step_timeout=300)
    pids = envs.worker_pids
    envs.send(["stall", "fine"], [0, 1])
    obs, *_, ids = envs.recv(min_ready=1)
    assert list(ids) == [1]
    envs.close()
    assert (tmp_path / "closed-1").read_text() == "after the stuck worker was gone"
    assert not (tmp_path / "closed-0").exists()  # (stuck: its envs could not close)
    assert not any(running(pid) for pid in pids)


@pytest.mark.timeout(120)
def test_close_from_another_thread_cuts_a_lock_step_short_on_a_stuck_worker(tmp_path):
    envs = stalling_envs(tmp_path)
    pids = envs.worker_pids
    closer = threading.Timer(0.5, envs.close)
    closer.start()
    try:
        with pytest.raises(RuntimeError, match="closed"):
            envs.step(["stall", "fine"])
    finally:
        closer.join()
    assert (tmp_path / "closed-1").read_text() == "after the stuck worker was gone"
    assert not any(running(pid) for pid in pids)


class Unloadable:
    """Pickles here, but cannot be unpickled in a worker (a module it lacks)."""

    def __reduce__(self):
        import importlib

        return importlib.import_module, ("benchmax_no_such_module",)


def test_a_command_a_worker_cannot_unpickle_is_its_error_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(vector, "CALL_TIMEOUT", 30.0)  # (a hang guard: before, the worker never answered)
    (tmp_path / "stuck").write_text("0")  # (the envs' close returns at once)
    envs = SubprocVectorEnv([functools.partial(Stalls, str(tmp_path), i) for i in range(2)], num_workers=1)
    try:
        envs.reset(seed=0)
        with pytest.raises(WorkerLost, match="ModuleNotFoundError: No module named 'benchmax_no_such_module'"):
            envs.set_attr("marker", Unloadable())
        _, _, _, truncated, info = envs.step(["a", "b"])  # the worker is restarted: its envs end truncated
        assert truncated.all() and "benchmax_no_such_module" in info["error"][0]
        envs.step(["a", "b"])  # (reset)
        obs, rewards, *_ = envs.step(["a", "b"])
        assert list(obs) == ["a", "b"] and rewards.tolist() == [1.0, 1.0]
    finally:
        envs.close()
