"""What a user of RayVectorEnv meets, against SubprocVectorEnv as the reference: the same batches
step for step (every autoreset mode, full and kept infos, envs that raise), failures that say the
host's own error, and joining Ray (a wrong address fails in seconds; a bad argument starts no Ray).

On the loopback cluster of this folder's conftest.py.
"""

import os
import signal
import socket
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import ray
from gymnasium.vector import AutoresetMode

from benchmax_gym import UnicodeText
from benchmax_gym.wrappers import RayVectorEnv, SubprocVectorEnv
from tests.wrappers.on_ray.test_ray_vector import HOST, _run, gone, our_actors

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Scripted(gym.Env):
    """Deterministic, so two vector envs compare value for value (a rebuilt env's unseeded reset
    too): 'raise' raises in step, options {'raise': True} in reset, 'nap S' sleeps, 'end'
    terminates; the fourth step truncates."""

    observation_space = UnicodeText(1000)
    action_space = UnicodeText(1000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options and options.get("raise"):
            raise RuntimeError("reset exploded")
        self.count = 0
        return f"start {seed}", {"count": 0, "seen": np.arange(3)}

    def step(self, action):
        self.count += 1
        if action == "raise":
            raise RuntimeError("the tool exploded")
        if action.startswith("nap "):
            time.sleep(float(action.split()[1]))
        info = {"count": self.count, "nested": {"calls": [self.count]}}
        return f"echo {action} {self.count}", float(self.count), action == "end", self.count >= 4, info


def assert_same(a, b, where=""):
    """Equal value for value: dicts by key (``_key`` masks included), arrays by dtype, shape and
    content (NaN equal to NaN), sequences item by item."""
    if isinstance(a, dict) or isinstance(b, dict):
        a, b = dict(a), dict(b)
        assert set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (where, a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a, b)):
                assert_same(x, y, f"{where}[{i}]")
        else:
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), (where, a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, (where, b)
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


SCRIPT = [["a", "raise", "end", "b", "c"], ["a"] * 5, ["end", "b", "raise", "a", "a"], ["a"] * 5, ["a"] * 5]


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_batches_equal_subprocess_ones_step_for_step(cluster, mode):
    """Observations, rewards (NaN for a failed env), flags and every info key with its mask, with
    full infos and with ``info_keys``; resets that raise, masked resets, a ready-first batch."""
    for info_keys in (None, ["count", "error"]):
        ours = RayVectorEnv([Scripted] * 5, num_hosts=2, autoreset_mode=mode, actor_options=HOST, info_keys=info_keys)
        ref = SubprocVectorEnv([Scripted] * 5, num_workers=2, autoreset_mode=mode, info_keys=info_keys)
        try:
            assert_same(ours.reset(seed=3), ref.reset(seed=3), "reset")
            done = np.zeros(5, dtype=bool)
            for t, actions in enumerate(SCRIPT):
                if mode == AutoresetMode.DISABLED and done.any():
                    mask = {"reset_mask": done.copy()}
                    assert_same(ours.reset(options=mask), ref.reset(options=mask), f"masked reset {t}")
                ours_step, ref_step = ours.step(actions), ref.step(actions)
                assert_same(ours_step, ref_step, f"{info_keys} step {t}")
                done = ours_step[2] | ours_step[3]
            options = [{"raise": i == 1} for i in range(5)]
            raised = ours.reset(seed=9, options=options)
            assert_same(raised, ref.reset(seed=9, options=options), "reset that raises")
            assert raised[1]["outcome"][1] == "env_error" and "reset exploded" in raised[1]["error"][1]
            for envs in (ours, ref):
                envs.send(["a", "b", "c"], [0, 2, 4])
            assert_same(ours.recv(min_ready=3), ref.recv(min_ready=3), "ready-first")
        finally:
            ours.close()
            ref.close()


def test_failures_say_the_hosts_error_and_close_leaves_nothing(cluster, monkeypatch):
    """A host SIGKILLed mid-batch: its envs end as failures (NaN, env_error, the host's name and
    Ray's reason), the others' results stand. An env function that cannot be pickled fails at
    construction naming that env, before any actor starts. close() twice, then nothing is left."""
    from benchmax_gym.wrappers import ray_vector

    # Ray's word on the death (raylet, GCS, then this driver) may take over 2 s on a loaded machine
    monkeypatch.setattr(ray_vector, "LOST_REASON_WAIT_S", 60.0)
    envs = RayVectorEnv([Scripted] * 4, num_hosts=2, actor_options=HOST)
    envs.reset(seed=0)
    victim = envs.hosts[1]
    killer = threading.Timer(1.0, os.kill, (victim["pid"], signal.SIGKILL))
    killer.start()
    try:
        obs, rewards, terminated, truncated, info = envs.step(["a", "b", "nap 30", "c"])
    finally:
        killer.cancel()
    assert obs[:2] == ("echo a 1", "echo b 1") and rewards[:2].tolist() == [1.0, 1.0]
    assert truncated.tolist() == [False, False, True, True] and np.isnan(rewards[2:]).all()
    assert list(info["outcome"][2:]) == ["env_error"] * 2 and info["scored"].tolist() == [True, True, False, False]
    assert victim["name"] in info["error"][2] and "ActorDiedError" in info["error"][2]
    obs, *_ = envs.step(["x"] * 4)
    assert obs[1] == "echo x 2" and obs[2] == "start None"  # the replacement host's envs start afresh
    hosts = envs.hosts
    envs.close()
    envs.close()
    with pytest.raises(RuntimeError, match="is closed"):
        envs.step(["x"] * 4)
    assert gone([h["pid"] for h in hosts], [h["workspace"] for h in hosts], actors=True)

    lock = threading.Lock()

    def holds_a_lock():
        with lock:
            return Scripted()

    with pytest.raises(TypeError, match=r"env: the function that makes env 3 .*holds_a_lock.* cannot be sent to an "
                                        r"env host \(cloudpickle\): TypeError: cannot pickle '_thread.lock'"):
        RayVectorEnv([Scripted] * 3 + [holds_a_lock], num_hosts=2, actor_options=HOST)
    assert not our_actors()  # (none started for the envs that could travel)


@pytest.mark.timeout(240, func_only=True)  # a hang guard: ray.init retried for many minutes
def test_joining_ray_fails_fast_at_no_ray_and_a_bad_argument_starts_no_ray(cluster):
    """In a process of its own that has not called ray.init: an address where something other
    than Ray listens (silent, or HTTP as the dashboard) fails within seconds, naming it; a bad
    argument fails before Ray is joined; a good address joins, and close() leaves that Ray."""
    silent = socket.create_server(("127.0.0.1", 0))
    http = socket.create_server(("127.0.0.1", 0))
    ports = [silent.getsockname()[1], http.getsockname()[1]]
    peers = []

    def answer_http():
        while True:
            try:
                conn, _ = http.accept()
            except OSError:
                return
            peers.append(conn)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer_http, daemon=True).start()
    code = f"""
import ray
from benchmax_gym.wrappers import RayVectorEnv
for port in {ports}:
    try:
        RayVectorEnv("benchmax/Math-v0", 2, address=f"127.0.0.1:{{port}}")
    except ConnectionError as exc:
        print("refused:", exc)
try:
    RayVectorEnv("benchmax/Math-v0", 2, address={cluster.address!r}, autoreset_mode="Sometimes")
except ValueError as exc:
    print("bad argument:", exc, "| ray initialized:", ray.is_initialized())
envs = RayVectorEnv("benchmax/Math-v0", 2, num_hosts=1, address={cluster.address!r}, actor_options={HOST!r},
                    python_tool=False)
obs, info = envs.reset(seed=0)
envs.close()
print("joined:", len(obs), "| ray initialized after close:", ray.is_initialized())
"""
    try:
        out = _run(code)  # (a 120 s timeout: the hang guard)
    finally:
        silent.close()
        http.close()
        for conn in peers:
            conn.close()
    refused = [line for line in out.stdout.splitlines() if line.startswith("refused:")]
    assert len(refused) == 2, out.stdout + out.stderr
    for line, port in zip(refused, ports):
        assert f"address='127.0.0.1:{port}'" in line and "does not answer as a Ray cluster does (gRPC)" in line and "not its dashboard's (8265)" in line
    assert "bad argument: autoreset_mode must be one of" in out.stdout and "| ray initialized: False" in out.stdout
    assert "joined: 2 | ray initialized after close: False" in out.stdout, out.stderr
