"""SubprocVectorEnv: Gymnasium's vector contract, ready-first batches, and real faults."""

import asyncio
import gc
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import benchmax_gym
from benchmax_gym import UnicodeText
from benchmax_gym.wrappers import SubprocVectorEnv

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


async def nap(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


async def meet(folder: str, parties: int) -> str:
    """Arrive, then wait for the others: the calls meet only if they all run at once. A call
    left alone (calls run one after another) gives up after a minute, a hang guard, and the
    calls after it at once.

    Args:
        folder: where the arrivals are counted
        parties: how many calls meet
    """
    here = Path(folder)
    (here / f"arrived-{uuid.uuid4().hex}").touch()
    for _ in range(6000):
        if len(list(here.glob("arrived-*"))) >= parties:
            return f"met {parties}"
        if (here / "gave-up").exists():
            break
        await asyncio.sleep(0.01)
    (here / "gave-up").touch()
    return "gave up waiting"


async def wait_for(path: str) -> str:
    """Wait until the test creates ``path`` (at most a minute, a hang guard).

    Args:
        path: the file to wait for
    """
    for _ in range(6000):
        if os.path.exists(path):
            return "released"
        await asyncio.sleep(0.01)
    return "never released"


SLEEPY = benchmax_gym.register_tool_env(
    "testing/Sleepy-v0", tools=[nap, meet, wait_for],
    tasks=[{"prompt": f"task {i}", "answer": "ok"} for i in range(8)],
    rubric=[lambda completion, answer: float(completion == answer)], max_turns=50,
)


def nap_action(seconds):
    return f'<tool_call>{{"name": "nap", "arguments": {{"seconds": {seconds}}}}}</tool_call>'


def meet_action(folder, parties):
    arguments = {"folder": str(folder), "parties": parties}
    return '<tool_call>' + json.dumps({"name": "meet", "arguments": arguments}) + '</tool_call>'


def wait_action(path):
    return '<tool_call>' + json.dumps({"name": "wait_for", "arguments": {"path": str(path)}}) + '</tool_call>'


class Flaky(gym.Env):
    """A tiny env that misbehaves on request: 'raise', 'hang', 'die'; 'end' terminates."""

    observation_space = UnicodeText(1000)
    action_space = UnicodeText(1000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return f"start {int(self.np_random.integers(1000))}", {"count": 0}

    def step(self, action):
        self.count += 1
        if action == "raise":
            raise RuntimeError("the tool exploded")
        if action == "hang":
            time.sleep(1000)
        if action == "die":
            os._exit(3)
        return f"echo {action} {self.count}", 1.0, action == "end", False, {"count": self.count}


def same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


def children():
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = {p.pid for p in children()}
    yield
    gc.collect()
    deadline = time.monotonic() + 60  # (a hang guard: they go in moments)
    while time.monotonic() < deadline and {p.pid for p in children()} - before:
        time.sleep(0.1)
    assert {p.pid for p in children()} - before == set()


def test_make_vec_returns_it_with_gymnasium_spaces():
    envs = gym.make_vec("benchmax/Math-v0", num_envs=4, python_tool=False, num_workers=2)
    assert isinstance(envs, SubprocVectorEnv) and envs.num_envs == 4
    assert envs.single_observation_space == gym.make("benchmax/Math-v0").observation_space
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    obs, info = envs.reset(seed=0)
    assert isinstance(obs, tuple) and len(obs) == 4 and envs.observation_space.contains(obs)
    assert info["_task_id"].all() and len(set(info["task_id"])) == 4
    envs.close()


@pytest.mark.parametrize("make, expected", [
    (lambda: gym.make_vec("benchmax/Math-v0", num_envs=2, num_worker=2),
     "SubprocVectorEnv got an unexpected keyword argument 'num_worker' (did you mean 'num_workers'"),
    (lambda: SubprocVectorEnv("benchmax/Math-v0", 2, step_timeot=5, max_turns=3),
     "SubprocVectorEnv got an unexpected keyword argument 'step_timeot' (did you mean 'step_timeout'"),
    (lambda: gym.make_vec("benchmax/Math-v0", num_envs=2, vector_backend="ray", num_host=2),
     "RayVectorEnv got an unexpected keyword argument 'num_host' (did you mean 'num_hosts'"),
    # the env's own argument names the env, as gym.make does (it named SubprocVectorEnv)
    (lambda: gym.make_vec("benchmax/Math-v0", num_envs=2, max_turn=3),
     "MathEnv got an unexpected keyword argument 'max_turn' (did you mean 'max_turns'"),
    (lambda: gym.make_vec("benchmax/Math-v0", num_envs=2, max_turn=3, vector_backend="ray"),
     "MathEnv got an unexpected keyword argument 'max_turn' (did you mean 'max_turns'"),
    (lambda: gym.make_vec("benchmax/Math-v0", num_envs=2, colour="red"),
     "MathEnv got an unexpected keyword argument 'colour'"),
    (lambda: gym.make_vec("benchmax/Math-v0", num_envs=2, num_worker=2, max_turn=3),
     "MathEnv got an unexpected keyword arguments 'num_worker' (did you mean 'num_workers'?), 'max_turn' (did you "
     "mean 'max_turns'"),
])
def test_a_misspelt_option_fails_in_the_parent_with_a_did_you_mean(make, expected):
    """Before any worker (or Ray) starts: one line naming the argument, not a traceback per worker."""
    ray = pytest.importorskip("ray")
    before = {p.pid for p in children()}
    with pytest.raises(TypeError) as raised:
        make()
    assert str(raised.value).startswith(expected) and "\n" not in str(raised.value)
    assert {p.pid for p in children()} == before and not ray.is_initialized()


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_matches_sync_vector_env_step_for_step(mode):
    fns = [lambda: gym.make("benchmax/Math-v0", python_tool=False, max_turns=3) for _ in range(5)]
    ours = SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    a = ours.reset(seed=7)
    b = ref.reset(seed=7)
    assert a[0] == b[0] and list(a[1]["task_id"]) == list(b[1]["task_id"])
    script = [CALC, CALC, "\\boxed{1}", CALC, "\\boxed{2}", CALC, CALC, CALC, CALC]
    for t, action in enumerate(script):
        actions = [action if (i + t) % 2 else CALC for i in range(5)]
        if mode == AutoresetMode.DISABLED and t and done.any():
            a = ours.reset(options={"reset_mask": done.copy()})
            b = ref.reset(options={"reset_mask": done.copy()})
            assert a[0] == b[0]
        x, y = ours.step(actions), ref.step(actions)
        assert x[0] == y[0], t
        for k in (1, 2, 3):
            assert (x[k] == y[k]).all(), (t, k)
        for key in ("turn", "error", "task_id"):
            assert same(x[4].get(f"_{key}"), y[4].get(f"_{key}")), (t, key)
            assert list(x[4].get(key, [])) == list(y[4].get(key, [])), (t, key)
        if mode == AutoresetMode.SAME_STEP and "final_obs" in y[4]:
            assert list(x[4]["final_obs"]) == list(y[4]["final_obs"])
            assert (x[4]["final_info"]["_reward_components"] == y[4]["final_info"]["_reward_components"]).all()
        done = x[2] | x[3]
    ours.close()
    ref.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_info_keys_return_only_those_keys_and_step_alike(mode):
    """The lighter info mode: the same observations and rewards as with full infos, and infos
    with only the chosen keys (SAME_STEP's final_info filtered alike); from make_vec too."""
    fns = [lambda: gym.make("benchmax/Math-v0", python_tool=False, max_turns=2) for _ in range(4)]
    keys = ["error", "reward_components"]
    lean = gym.make_vec("benchmax/Math-v0", num_envs=4, python_tool=False, max_turns=2, num_workers=2,
                        autoreset_mode=mode, info_keys=keys)
    full = SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode)
    a, b = lean.reset(seed=3), full.reset(seed=3)
    assert a[0] == b[0] and a[1] == {}  # no chosen key in a reset's info
    bad = '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
    for t, actions in enumerate(([CALC, bad, CALC, bad], ["\\boxed{1}"] * 4, [CALC] * 4)):
        x, y = lean.step(actions), full.step(actions)
        if t == 0:  # the model's errors still come through
            assert [e is not None for e in x[4]["error"]] == [False, True, False, True]
            assert list(x[4]["error"]) == list(y[4]["error"])
        assert x[0] == y[0] and all((x[k] == y[k]).all() for k in (1, 2, 3))
        allowed = {*keys, *(f"_{k}" for k in keys), "final_obs", "_final_obs", "final_info", "_final_info",
                   "outcome", "_outcome", "scored", "_scored"}  # how an episode ended is always kept
        assert set(x[4]) <= allowed and "messages" in y[4] and "messages" not in x[4]
        for key in ("error", "reward_components"):
            if key in y[4]:
                assert same(x[4][f"_{key}"], y[4][f"_{key}"]) and list(x[4][key]) == list(y[4][key])
        if "final_info" in y[4]:
            assert set(x[4]["final_info"]) <= allowed and "reward_components" in x[4]["final_info"]
            assert list(x[4]["final_obs"]) == list(y[4]["final_obs"])
    lean.close()
    full.close()


def test_a_users_wrapper_runs_in_the_workers():
    """A worker steps past Gymnasium's default wrappers only: one a user adds still runs."""
    def bonus():
        return gym.wrappers.TransformReward(gym.make("benchmax/Math-v0", python_tool=False), lambda r: r + 10.0)

    wrapped = SubprocVectorEnv([bonus] * 2, num_workers=1)
    plain = gym.make_vec("benchmax/Math-v0", num_envs=2, python_tool=False, num_workers=1)
    for envs in (wrapped, plain):
        envs.reset(seed=0)
    assert wrapped.step([CALC] * 2)[1].tolist() == [10.0, 10.0]
    assert plain.step([CALC] * 2)[1].tolist() == [0.0, 0.0]
    wrapped.close()
    plain.close()


def test_per_env_options_and_distinct_reproducible_seeds():
    envs = gym.make_vec("benchmax/Math-v0", num_envs=4, python_tool=False, num_workers=2)
    obs, info = envs.reset(options=[{"task_index": i * 10} for i in range(4)])
    assert list(info["task_index"]) == [0, 10, 20, 30]
    first, _ = envs.reset(seed=123)
    again, _ = envs.reset(seed=123)
    assert first == again and len(set(first)) == 4
    other = gym.make_vec("benchmax/Math-v0", num_envs=4, python_tool=False, num_workers=3)
    assert other.reset(seed=123)[0] == first  # independent of how envs are spread over workers
    envs.close()
    other.close()


def test_call_get_attr_set_attr():
    envs = gym.make_vec("benchmax/Math-v0", num_envs=3, python_tool=False, num_workers=2)
    envs.reset(seed=0)
    assert envs.get_attr("max_turns") == (8, 8, 8)
    envs.set_attr("max_turns", [2, 3, 4])
    assert envs.get_attr("max_turns") == (2, 3, 4)
    rendered = envs.call("render")
    assert len(rendered) == 3
    envs.close()


def test_one_worker_interleaves_its_environments_io(tmp_path):
    envs = SubprocVectorEnv(SLEEPY, num_envs=8, num_workers=1, tool_timeout=120)
    envs.reset(seed=0)
    obs, *_ = envs.step([meet_action(tmp_path, 8)] * 8)
    assert all("met 8" in o for o in obs), obs  # the eight calls waited in one process at once
    envs.close()


def test_ready_first_returns_the_fast_ones_first(tmp_path):
    envs = SubprocVectorEnv(SLEEPY, num_envs=8, num_workers=2, tool_timeout=120)
    envs.reset(seed=0)
    slow, fast, release = {1, 6}, set(range(8)) - {1, 6}, tmp_path / "release"
    envs.send([wait_action(release) if i in slow else nap_action(0.01) for i in range(8)], np.arange(8))
    # the slow ones wait for this test: a recv that waited for them would return all 8, a minute later
    obs, rewards, terminated, truncated, info, ids = envs.recv(min_ready=6)
    assert set(ids.tolist()) == fast and all("slept 0.01" in o for o in obs) and list(info["turn"]) == [1] * 6
    envs.send([nap_action(0.01)] * 6, ids)  # the fast ones go on while the slow ones still run
    *_, ids = envs.recv(min_ready=6)
    assert set(ids.tolist()) == fast
    release.touch()
    obs, *_, ids = envs.recv(min_ready=2)
    assert set(ids.tolist()) == slow and all("released" in o for o in obs), obs
    envs.send([nap_action(0.01)] * 8, np.arange(8))
    seen = set()
    while len(seen) < 8:
        *_, got = envs.recv(min_ready=1)
        seen |= set(got.tolist())
    with pytest.raises(RuntimeError, match="in flight"):
        envs.send([CALC], [0]) or envs.send([CALC], [0])
    envs.recv(min_ready=1)
    envs.close()


STEP_TIMEOUT_SAYS = "step_timeout must be a positive number of seconds up to 2000000 or None (no limit), got "


@pytest.mark.parametrize("kwargs, says", [
    ({"num_envs": 0}, "num_envs must be an int from 1 to 1000000, got 0"),
    ({"num_envs": -1}, "num_envs must be an int from 1 to 1000000, got -1"),
    ({"num_envs": "2"}, "num_envs must be an int from 1 to 1000000, got '2'"),
    ({"num_envs": True}, "num_envs must be an int from 1 to 1000000, got True"),
    ({"num_envs": 2, "context": "nosuch"}, "context must be one of (None, 'fork', 'spawn', 'forkserver'), got 'nosuch'"),
    ({"num_envs": 2, "step_timeout": math.inf}, STEP_TIMEOUT_SAYS + "inf"),
    ({"num_envs": 2, "step_timeout": 10**30}, STEP_TIMEOUT_SAYS + str(10**30)),
    ({"num_envs": 2, "step_timeout": True}, STEP_TIMEOUT_SAYS + "True"),
    ({"num_envs": 2, "vector_backend": "ray", "step_timeout": math.inf}, STEP_TIMEOUT_SAYS + "inf"),
    ({"num_envs": 2, "vector_backend": "ray", "start_timeout": math.inf},
     "start_timeout must be a positive number of seconds up to 2000000, got inf"),
    ({"num_envs": 2, "vector_backend": "ray", "start_timeout": True},
     "start_timeout must be a positive number of seconds up to 2000000, got True"),
    ({"num_envs": 0, "vector_backend": "ray"}, "num_envs must be an int from 1 to 1000000, got 0"),
])
def test_make_vec_refuses_a_bad_count_context_or_wait_naming_it(kwargs, says):
    """At make_vec, before any worker (or Ray) starts: 0 envs named num_workers, "2" raised a bare
    TypeError, True made one env, an unknown context named no argument, and a timeout of inf or
    10**30 raised OverflowError at the first reset (True meant 1 s)."""
    ray = pytest.importorskip("ray")
    before = {p.pid for p in children()}
    with pytest.raises(ValueError) as raised:
        gym.make_vec("benchmax/Math-v0", **kwargs)
    assert str(raised.value) == says
    assert {p.pid for p in children()} == before and not ray.is_initialized()


def test_the_longest_step_timeout_steps_and_recv_refuses_a_bad_wait():
    envs = gym.make_vec("benchmax/Math-v0", num_envs=2, num_workers=1, step_timeout=2_000_000)
    envs.reset(seed=0)
    envs.step(["1", "2"])  # (the longest allowed waits: poll takes up to 2**31 - 1 ms)
    envs.send(["1", "2"])
    for kwargs, says in [({"timeout": math.inf}, "timeout must be a non-negative number of seconds up to 2000000 "
                                                 "or None (wait for them), got inf"),
                         ({"timeout": -1}, "timeout must be a non-negative number"),
                         ({"timeout": True}, "timeout must be a non-negative number"),
                         ({"min_ready": True}, "min_ready must be an int from 1 to the 2 environments in flight")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            envs.recv(**kwargs)
    assert envs.recv(min_ready=2)[-1].tolist() == [0, 1]  # (the refused calls took nothing)
    envs.close()


def test_recv_timeout_returns_what_is_ready(tmp_path):
    envs = SubprocVectorEnv(SLEEPY, num_envs=2, num_workers=2, tool_timeout=120)
    envs.reset(seed=0)
    release = tmp_path / "release"
    envs.send([nap_action(0.01), wait_action(release)], [0, 1])
    returned = []
    for _ in range(120):  # (a busy machine may need more than one timeout for env 0's step)
        *_, ids = envs.recv(min_ready=2, timeout=0.5)  # env 1 waits for this test: never ready here
        returned += ids.tolist()
        if returned:
            break
    assert returned == [0]
    release.touch()
    *_, ids = envs.recv(min_ready=1)
    assert ids.tolist() == [1]
    envs.close()


def test_worker_killed_mid_step():
    envs = SubprocVectorEnv(SLEEPY, num_envs=4, num_workers=2)
    envs.reset(seed=0)
    victim = envs.worker_pids[1]  # owns envs 2 and 3
    envs.send([nap_action(0.05), nap_action(0.05), nap_action(5), nap_action(5)], np.arange(4))
    time.sleep(0.3)
    os.kill(victim, signal.SIGKILL)
    obs, rewards, terminated, truncated, info, ids = envs.recv(min_ready=4)
    assert ids.tolist() == [0, 1, 2, 3]
    assert truncated.tolist() == [False, False, True, True]
    assert info["_error"].tolist()[2:] == [True, True] and "worker_restarted" in info["error"][2]
    assert envs.worker_pids[1] != victim and envs.faults == 1
    # issue 29: a lost worker is the envs' failure, never a reward; the mask says which rewards are signal
    assert info["_outcome"].tolist() == [False, False, True, True] and list(info["outcome"][2:]) == ["env_error"] * 2
    assert info["_outcome_detail"].tolist() == [False, False, True, True]
    assert info["outcome_detail"][2].startswith("its worker was restarted:")
    assert info["scored"].tolist() == [True, True, False, False] and np.isnan(rewards[2:]).all()
    assert rewards[info["scored"]].tolist() == [0.0, 0.0]
    obs, rewards, terminated, truncated, info = envs.step([nap_action(0.01)] * 4)
    assert "slept" in obs[0] and "slept" in obs[1]  # untouched envs go on
    assert info["turn"].tolist()[2:] == [0, 0]  # restarted envs autoreset (NEXT_STEP)
    obs, *_ = envs.step([nap_action(0.01)] * 4)
    assert all("slept" in o for o in obs)
    envs.close()


def test_a_worker_lost_while_another_has_results_waiting():
    """Both come out of one wait: restarting the lost worker keeps the other's results."""
    envs = SubprocVectorEnv(SLEEPY, num_envs=4, num_workers=2)
    envs.reset(seed=0)
    victim = envs.worker_pids[0]  # owns envs 0 and 1
    envs.send([nap_action(5), nap_action(5), nap_action(0.01), nap_action(0.01)], np.arange(4))
    time.sleep(0.5)  # worker 1's results wait in its pipe
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.2)
    obs, rewards, terminated, truncated, info, ids = envs.recv(min_ready=4)
    assert ids.tolist() == [0, 1, 2, 3] and truncated.tolist() == [True, True, False, False]
    assert "worker_restarted" in info["error"][0] and all("slept" in o for o in obs[2:])
    assert envs.faults == 1
    envs.close()


def test_env_that_raises_is_rebuilt_and_the_others_go_on():
    envs = SubprocVectorEnv([Flaky] * 4, num_workers=1)
    envs.reset(seed=0)
    obs, rewards, terminated, truncated, info = envs.step(["a", "raise", "b", "c"])
    assert truncated.tolist() == [False, True, False, False]
    assert "the tool exploded" in info["error"][1] and obs[0] == "echo a 1"
    assert info["outcome"][1] == "env_error" and np.isnan(rewards[1]) and info["scored"].tolist() == [True, False, True, True]
    assert info["outcome_detail"][1].startswith("the env raised") and "the tool exploded" in info["outcome_detail"][1]
    obs, rewards, terminated, truncated, info = envs.step(["d", "x", "e", "f"])
    assert obs[0] == "echo d 2" and obs[1].startswith("start ")  # rebuilt env reset (NEXT_STEP)
    assert envs.faults == 0  # no worker restart was needed
    envs.close()


@pytest.mark.timeout(120)  # a hang guard: without the step timeout, step waits for the 1000 s hang
def test_step_timeout_restarts_a_hung_worker():
    # 3 s: the hang (1000 s) passes it; the other worker's steps, on a loaded machine, must not
    envs = SubprocVectorEnv([Flaky] * 4, num_workers=2, step_timeout=3.0)
    envs.reset(seed=0)
    hung = envs.worker_pids[1]
    obs, rewards, terminated, truncated, info = envs.step(["a", "b", "hang", "c"])
    assert envs.worker_pids[1] != hung and hung not in {p.pid for p in children()}  # killed and replaced
    assert truncated.tolist() == [False, False, True, True]
    assert "step_timeout" in info["error"][2]
    # the hung env and the one sharing its worker: both lost with it, both env_error
    assert list(info["outcome"][2:]) == ["env_error"] * 2 and info["scored"].tolist() == [True, True, False, False]
    obs, *_ = envs.step(["x", "y", "z", "w"])
    assert obs[0] == "echo x 2" and obs[2].startswith("start ")
    envs.close()


def test_same_step_mode_faults_return_fresh_observations():
    envs = SubprocVectorEnv([Flaky] * 2, num_workers=2, autoreset_mode="SameStep")
    envs.reset(seed=0)
    os.kill(envs.worker_pids[0], signal.SIGKILL)
    obs, rewards, terminated, truncated, info = envs.step(["a", "end"])
    assert truncated[0] and obs[0].startswith("start ") and "worker_restarted" in info["final_info"]["error"][0]
    assert info["final_info"]["outcome"][0] == "env_error" and np.isnan(rewards[0]) and not info["scored"][0]
    # why the episode failed goes with the episode that ended (final_info), not the fresh one's info
    assert info["final_info"]["outcome_detail"][0].startswith("its worker was restarted:")
    assert info["final_info"]["_outcome_detail"].tolist() == [True, False] and "outcome_detail" not in info
    assert terminated[1] and obs[1].startswith("start ") and info["final_obs"][1] == "echo end 1"
    envs.close()


def test_dead_worker_between_calls():
    envs = SubprocVectorEnv([Flaky] * 2, num_workers=2)
    envs.reset(seed=0)
    obs, rewards, terminated, truncated, info = envs.step(["a", "die"])
    assert truncated.tolist() == [False, True] and "worker_restarted" in info["error"][1]
    assert info["outcome"][1] == "env_error" and np.isnan(rewards[1]) and info["scored"].tolist() == [True, False]
    obs, *_ = envs.step(["b", "c"])
    assert obs[0] == "echo b 2" and obs[1].startswith("start ")
    envs.close()


def test_gc_and_interpreter_exit_leave_no_process():
    envs = SubprocVectorEnv([Flaky] * 2, num_workers=2)
    pids = envs.worker_pids
    del envs
    gc.collect()
    time.sleep(0.5)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    code = (
        "import gymnasium as gym, benchmax_gym\n"
        "envs = gym.make_vec('benchmax/Math-v0', num_envs=4, num_workers=2)\n"
        "envs.reset(seed=0)\n"
        "print(*envs.worker_pids)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    time.sleep(0.5)
    assert not [p for p in pids if psutil.pid_exists(p)]


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"num_workers": 0}, "num_workers"),
        ({"num_workers": 9}, "num_workers"),
        ({"autoreset_mode": "Sometimes"}, "autoreset_mode"),
        ({"step_timeout": -1}, "step_timeout"),
        ({"info_keys": "error"}, "info_keys"),
        ({"info_keys": ["error", 3]}, "info_keys"),
    ],
)
def test_bad_configuration(kwargs, says):
    with pytest.raises(ValueError, match=says):
        SubprocVectorEnv("benchmax/Math-v0", 4, **kwargs)


def _env_that_cannot_be_built():
    raise ValueError("the org database at /nowhere/org.sqlite does not exist")


def test_a_worker_that_cannot_build_its_envs_says_why():
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="^the org database at /nowhere") as caught:  # (a bad argument: as gym.make)
        SubprocVectorEnv([_env_that_cannot_be_built] * 2, num_workers=2)
    assert any("the worker could not build its environments" in note for note in caught.value.__notes__)
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def workspace_dirs(root):
    """Episode workspaces under ``root``: sandboxes' ``ep-*`` and MCP-v0's ``benchmax-mcp-*``."""
    return sorted(p for pattern in ("**/ep-*", "**/benchmax-mcp-*") for p in root.glob(pattern) if p.is_dir())


def processes_in(root):
    """Live processes whose working directory is under ``root`` (sandboxes, MCP servers)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.cwd().startswith(str(root)):
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


@pytest.mark.parametrize("env_id, kwargs", [("benchmax/Math-v0", {"python_tool": True}), ("benchmax/MCP-v0", {})])
def test_restarts_after_sigkill_leave_no_workspace_behind(env_id, kwargs, tmp_path, monkeypatch):
    # Workers are forked with this temp dir, so every workspace they make is under tmp_path.
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    envs = gym.make_vec(env_id, num_envs=3, num_workers=2, **kwargs)
    envs.reset(seed=0)
    live = len(workspace_dirs(tmp_path))
    assert live >= 3  # one per episode at least (a sandbox's, or the MCP env's)
    for _ in range(4):
        os.kill(envs.worker_pids[0], signal.SIGKILL)
        _, _, _, truncated, info = envs.step([CALC] * 3)
        assert truncated[0] and "worker_restarted" in info["error"][0]
        envs.step([CALC] * 3)  # the restarted worker's envs reset: new workspaces
        assert len(workspace_dirs(tmp_path)) == live
    assert envs.faults == 4
    envs.close()
    deadline = time.monotonic() + 60  # (a hang guard)
    while (processes_in(tmp_path) or list(tmp_path.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_in(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


# -- info batching: the same dict of arrays as Gymnasium's own _add_info ------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_leaf = st.one_of(st.integers(-5, 5), st.floats(-2, 2, allow_nan=False), st.booleans(), st.text(max_size=3),
                  st.none(), st.lists(st.integers(0, 3), max_size=2), st.just(np.arange(3)),
                  st.sampled_from([np.int64(3), np.float32(1.5)]))
_info = st.dictionaries(st.sampled_from(["a", "b", "c", "final_obs"]),
                        st.one_of(_leaf, st.dictionaries(st.sampled_from(["x", "y"]), _leaf, max_size=2)), max_size=4)


def _same(a, b):
    from benchmax_gym.wrappers.batching import LazyInfos

    assert type(a) is type(b) or (type(a) is LazyInfos and type(b) is dict)  # (a lock-step batch's: decoded as read)
    if isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str)
        for key in a:
            _same(a[key], b[key])
    elif not isinstance(a, np.ndarray):  # what Gymnasium leaves in a dict when a key mixes kinds
        assert a == b
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        for x, y in zip(a.ravel() if a.dtype != object else a, b.ravel() if b.dtype != object else b):
            assert (x is y) or _equal(x, y), (x, y)


def _equal(x, y) -> bool:
    """Equal values of the same types, all the way down (arrays by their elements, NaN equal to NaN)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, np.ndarray):
        return x.dtype == y.dtype and x.shape == y.shape and all(map(_equal, x.ravel().tolist(), y.ravel().tolist()))
    if isinstance(x, dict):
        return list(x) == list(y) and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(map(_equal, x, y))
    return bool(x == y) or (x != x and y != y)


_same_keys = st.lists(st.sampled_from(["a", "b", "c", "final_obs"]), min_size=1, max_size=4, unique=True).flatmap(
    lambda keys: st.lists(st.fixed_dictionaries({key: st.one_of(_leaf, st.dictionaries(
        st.sampled_from(["x", "y"]), _leaf, max_size=2)) for key in keys}), min_size=1, max_size=6))


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(_info, min_size=1, max_size=6), _same_keys), st.randoms(), st.booleans())
def test_batch_infos_builds_what_gymnasiums_add_info_builds(infos, rnd, whole):
    """Any infos, for some of the envs at random positions or for every env in order (a
    lock-step batch), with keys that differ or (as mid-episode) are the same for every env."""
    from benchmax_gym.wrappers.batching import _InfoBatch, batch_infos

    n = len(infos) if whole else len(infos) + 2
    positions = list(range(n)) if whole else rnd.sample(range(n), len(infos))
    for info in infos if rnd.random() < 0.5 else ():  # the same keys, inserted in another order
        items = list(info.items())
        rnd.shuffle(items)
        info.clear()
        info.update(items)
    pairs = list(zip(positions, infos))
    expected, error = {}, None
    try:
        batcher = _InfoBatch(n)
        for j, info in pairs:
            expected = batcher._add_info(expected, info, j)
    except Exception as exc:  # noqa: BLE001  (a mix Gymnasium itself refuses: ours must refuse it too)
        error = type(exc)
    if error is not None:
        with pytest.raises(Exception):  # noqa: B017
            batch_infos(infos, n, None if whole else positions)
        return
    _same(batch_infos(infos, n, None if whole else positions), expected)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(_info, min_size=1, max_size=8), _same_keys), st.randoms())
def test_worker_columns_joined_build_what_gymnasiums_add_info_builds(infos, rnd):
    """The lock-step path's columns: each worker packs its slice (arrays and masks built there),
    the parent joins the slices; the result is Gymnasium's batch for any infos split at random
    among workers: keys present in some envs or some workers only, kinds and dtypes that differ
    between workers, numpy values, nested dicts. Each slice also unpacks to its envs' infos (the
    parent's path after a fault), and travels in marshal's format or pickle's."""
    import pickle

    from benchmax_gym.wrappers.batching import _InfoBatch, join_columns, unpack_columns
    from benchmax_gym.wrappers.worker import pack_results, unpack_results

    n = len(infos)
    cuts = sorted(rnd.sample(range(1, n), rnd.randint(0, n - 1))) if n > 1 else []
    bounds = list(zip([0, *cuts], [*cuts, n]))
    expected, error = {}, None
    try:
        batcher = _InfoBatch(n)
        for j, info in enumerate(infos):
            expected = batcher._add_info(expected, info, j)
    except Exception as exc:  # noqa: BLE001  (a mix Gymnasium itself refuses: ours must refuse it too)
        error = type(exc)
    parts = []
    for a, b in bounds:  # each worker's message, through a pipe
        message = pack_results([(a + j, ("", 0.0, False, False, info)) for j, info in enumerate(infos[a:b])])
        wire = unpack_results(pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)))[5]
        for got, info in zip(unpack_columns(wire, b - a), infos[a:b]):
            _same(got, info)
        parts.append((a, b - a, wire))
    if error is not None:
        with pytest.raises(Exception):  # noqa: B017
            join_columns(parts, n)
        return
    joined = join_columns(parts, n)
    _same(joined, expected)
    assert list(joined) == list(expected)  # the keys in Gymnasium's order too
    for value in joined.values():
        assert not isinstance(value, np.ndarray) or value.flags.writeable  # the caller's own arrays


_DICT_READS = {  # every way a caller reads (or changes, then reads) Gymnasium's info batch
    "index": lambda d: d["messages"], "get": lambda d: d.get("tool_calls"), "get absent": lambda d: d.get("x", 7),
    "in": lambda d: ("messages" in d, "x" in d), "len": len, "keys": lambda d: list(d), "items": lambda d: list(d.items()),
    "values": lambda d: list(d.values()), "dict": dict, "unpacked": lambda d: {**d}, "or": lambda d: d | {"x": 1},
    "ror": lambda d: {"x": 1} | d, "ior": lambda d: _did(d.__ior__({"messages": 1}), d), "copy": lambda d: d.copy(),
    "copy.copy": lambda d: __import__("copy").copy(d), "deepcopy": lambda d: __import__("copy").deepcopy(d),
    "pickle": lambda d: __import__("pickle").loads(__import__("pickle").dumps(d)), "repr": repr, "str": str,
    "pop": lambda d: (d.pop("tool_calls"), d.pop("x", 3), list(d.items())), "popitem": lambda d: (d.popitem(), dict(d)),
    "setdefault": lambda d: (d.setdefault("messages"), d.setdefault("x", 2), dict(d)),
    "set, then read": lambda d: _did(d.__setitem__("messages", 5), dict(d)),
    "del, then read": lambda d: _did(d.__delitem__("messages"), list(d.values())),
    "update, then read": lambda d: _did(d.update(task_id=1), list(d.items())),
    "equal": lambda d: (d == dict(d), d != dict(d), d == {}, {} != d),
    "json": lambda d: __import__("json").dumps(d, default=lambda a: a.tolist()),
    "kwargs": lambda d: (lambda **kw: kw)(**d),
}


def _did(_, result):
    return result


@pytest.mark.parametrize("read", list(_DICT_READS))
def test_a_lockstep_batchs_infos_read_as_gymnasiums_dict_though_decoded_late(read):
    """A lock-step batch's object columns (messages, tool calls...) stay in the workers' bytes
    until read (LazyInfos): every way of reading or changing a dict gives what it gives on
    Gymnasium's own batch of the same infos, and nothing is decoded before it is read."""
    import pickle

    from benchmax_gym.wrappers.batching import LazyInfos, _InfoBatch, join_columns
    from benchmax_gym.wrappers.worker import pack_results, unpack_results

    envs = [gym.make("benchmax/Math-v0", python_tool=False).unwrapped for _ in range(5)]
    rows = []
    for i, env in enumerate(envs):
        env.reset(seed=i)
        rows.append((i, env.step(CALC if i != 2 else "<tool_call>{bad</tool_call>")))
    parts = []
    for a, b in ((0, 2), (2, 5)):  # two workers' messages, through a pipe
        wire = unpack_results(pickle.loads(pickle.dumps(pack_results(rows[a:b]), protocol=pickle.HIGHEST_PROTOCOL)))
        parts.append((a, b - a, wire[5]))
    expected, batcher = {}, _InfoBatch(5)
    for i, (_, result) in enumerate(rows):
        expected = batcher._add_info(expected, result[4], i)
    lazy = join_columns(parts, 5)
    assert type(lazy) is LazyInfos and list(lazy) == list(expected)
    assert repr(dict.__getitem__(lazy, "messages")).startswith("<an info column not decoded yet")
    assert type(dict.__getitem__(lazy, "task_id")) is np.ndarray  # (strings: as cheap to decode at once)
    got, want = _DICT_READS[read](lazy), _DICT_READS[read](expected)
    if read in ("repr", "str", "json"):
        assert got == want
    else:
        assert _equal(_plain(got), _plain(want)), (got, want)
    assert isinstance(lazy, dict) and len(lazy) == len(expected)


def _plain(value):
    """LazyInfos as the dict it reads as, inside any result."""
    from benchmax_gym.wrappers.batching import LazyInfos

    if isinstance(value, LazyInfos):
        return dict(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map(_plain, value))
    return value


def _same_subset(lean, full):
    """Every key of ``lean`` (an ``info_keys`` batch) as ``full`` (Gymnasium's) has it."""
    for key, value in lean.items():
        if isinstance(value, dict):
            _same_subset(value, full[key])
        else:
            _same(value, full[key])


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_lockstep_columns_equal_sync_vector_env_whole_infos(mode, monkeypatch):
    """The lock-step path (workers answer in columns, several messages per worker) returns what
    Gymnasium's SyncVectorEnv returns over the same envs and actions, step for step: every info
    key, mask, dtype and nested final_info, with episodes ending at different steps in different
    messages (keys present in some envs only), full infos and info_keys alike."""
    from benchmax_gym.wrappers import worker

    monkeypatch.setattr(worker, "COLUMN_FLUSH_EVERY", 2)  # (forked workers inherit it) messages of 2 results
    n = 9
    fns = [lambda: gym.make("benchmax/Math-v0", python_tool=False, max_turns=4) for _ in range(n)]
    ours = SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode)
    lean = SubprocVectorEnv(fns, num_workers=3, autoreset_mode=mode, info_keys=["error", "reward_components"])
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    bad = '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
    try:
        a, c, b = ours.reset(seed=11), lean.reset(seed=11), ref.reset(seed=11)
        assert a[0] == b[0] == c[0]
        _same(a[1], b[1])
        done = np.zeros(n, dtype=np.bool_)
        for t in range(12):
            actions = [("\\boxed{3}" if (i * 5 + t) % 7 == 0 else bad if (i + t) % 4 == 0 else CALC) for i in range(n)]
            if mode == AutoresetMode.DISABLED and done.any():
                a, c, b = (e.reset(options={"reset_mask": done.copy()}) for e in (ours, lean, ref))
                assert a[0] == b[0] == c[0]
                _same(a[1], b[1])
            x, z, y = ours.step(actions), lean.step(actions), ref.step(actions)
            assert x[0] == y[0] == z[0], t
            for k in (1, 2, 3):
                _same(x[k], y[k])
                _same(z[k], y[k])
                assert x[k].flags.writeable and z[k].flags.writeable  # the caller's own arrays
            for got in (x[4], z[4]):
                assert got.pop("scored").tolist() == (~np.isnan(y[1])).tolist() and got.pop("_scored").all()
            _same(x[4], y[4])
            assert list(x[4]) == list(y[4])  # the keys in Gymnasium's order too
            assert "messages" in x[4] and "messages" not in z[4]
            _same_subset(z[4], y[4])
            done = x[2] | x[3]
        assert ours.faults == lean.faults == 0
    finally:
        ours.close()
        lean.close()
        ref.close()


class Varied(gym.Env):
    """Infos that differ by env ``k``: keys some envs (or some workers) lack, numpy values,
    nested dicts, a key int in some envs and float in others; episodes of different lengths."""

    observation_space = UnicodeText(1000)
    action_space = UnicodeText(1000)

    def __init__(self, k: int):
        self.k = k

    def _info(self) -> dict:
        k, count = self.k, self.count
        info = {"count": count, "mixed": count + 0.5 if k % 2 else count}
        if k % 2:
            info["score"] = np.float32(count / 3)
        if k < 3:
            info["vec"] = np.arange(3) * count
        if k % 3 == 0:
            info["nested"] = {"a": count, "b": f"b{k}", **({"deep": {"c": [k]}} if count % 2 else {})}
        if k == 4 and count:
            info["late"] = np.int64(count)
        return info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return f"start {self.k}", self._info()

    def step(self, action):
        self.count += 1
        return f"{action} {self.k} {self.count}", float(self.k), self.count % (self.k + 2) == 0, False, self._info()


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_lockstep_varied_infos_equal_sync_vector_env(mode):
    """Infos that differ between envs and between workers (keys in some envs only, numpy
    scalars and arrays, nested dicts, int in one env and float in another) come back from the
    workers' columns as Gymnasium's SyncVectorEnv batches them, step for step, in every mode."""
    import functools

    n = 7
    fns = [functools.partial(Varied, k) for k in range(n)]
    ours = SubprocVectorEnv(fns, num_workers=3, autoreset_mode=mode)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        a, b = ours.reset(seed=0), ref.reset(seed=0)
        assert a[0] == b[0]
        _same(a[1], b[1])
        for t in range(9):
            x, y = ours.step([f"a{t}"] * n), ref.step([f"a{t}"] * n)
            assert x[0] == y[0], t
            for k in (1, 2, 3):
                _same(x[k], y[k])
            assert x[4].pop("scored").all() and x[4].pop("_scored").all()
            _same(x[4], y[4])
            assert list(x[4]) == list(y[4])
            done = x[2] | x[3]
            if mode == AutoresetMode.DISABLED and done.any():
                a, b = ours.reset(options={"reset_mask": done.copy()}), ref.reset(options={"reset_mask": done.copy()})
                assert a[0] == b[0]
                _same(a[1], b[1])
        assert ours.faults == 0
    finally:
        ours.close()
        ref.close()


class Dying(Varied):
    def step(self, action):
        if action == "die":
            os._exit(3)
        return super().step(action)


def test_a_worker_dying_mid_batch_keeps_the_others_varied_infos(monkeypatch):
    """Messages already read from the workers take the per-env path when one dies: the others'
    numpy arrays, float32 scores and nested dicts come through with their masks and dtypes."""
    import functools

    from benchmax_gym.wrappers import worker

    monkeypatch.setattr(worker, "COLUMN_FLUSH_EVERY", 1)
    envs = SubprocVectorEnv([functools.partial(Dying, k) for k in range(7)], num_workers=3)  # 0-2, 3-4, 5-6
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, info = envs.step(["a", "a", "a", "die", "a", "a", "a"])
        assert truncated.tolist() == [False, False, False, True, True, False, False] and envs.faults == 1
        assert info["vec"].dtype == np.int64 and info["vec"][:3].tolist() == [[0, 1, 2]] * 3
        assert info["_vec"].tolist() == [True] * 3 + [False] * 4
        assert info["score"].dtype == np.float32 and info["_score"].tolist() == [False, True] + [False] * 3 + [True, False]
        assert info["score"][5] == np.float32(1 / 3)
        assert info["nested"]["a"].tolist() == [1, 0, 0, 0, 0, 0, 1] and info["nested"]["_deep"].tolist() == [
            True] + [False] * 5 + [True]
        assert all("worker_restarted" in info["error"][i] for i in (3, 4)) and info["_error"].sum() == 2
        assert info["mixed"].dtype == np.int64  # (env 0's int decides, as Gymnasium's first env does)
    finally:
        envs.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_a_worker_dying_in_a_lockstep_batch_leaves_the_others_results(mode, monkeypatch):
    """The middle worker dies while the lock-step batch is read in messages of one result: the
    envs it held end truncated with the error, the others' results (read before and after) are theirs."""
    from benchmax_gym.wrappers import worker

    monkeypatch.setattr(worker, "COLUMN_FLUSH_EVERY", 1)
    envs = SubprocVectorEnv([Flaky] * 6, num_workers=3, autoreset_mode=mode)
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, info = envs.step(["a", "b", "c", "die", "e", "f"])
        assert truncated.tolist() == [False, False, True, True, False, False] and envs.faults == 1
        assert [obs[i] for i in (0, 1, 4, 5)] == ["echo a 1", "echo b 1", "echo e 1", "echo f 1"]
        errors = info["final_info"]["error"] if mode == AutoresetMode.SAME_STEP else info["error"]
        assert all("worker_restarted" in errors[i] for i in (2, 3))
        assert info["scored"].tolist() == [True, True, False, False, True, True]
        obs, *_ = envs.step(["g"] * 6)
        assert obs[0] == "echo g 2" and obs[5] == "echo g 2"
    finally:
        envs.close()


class Odd(Varied):
    """Varied, whose actions can also make it raise, end, or return odd rewards (a numpy float,
    a numeric string, an object that is no number)."""

    poisoned = False  # (its next reset raises: "poison{k}" ends the episode and sets it)

    def reset(self, *, seed=None, options=None):
        if self.poisoned:
            self.poisoned = False
            raise RuntimeError(f"env {self.k} cannot reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if action == f"poison{self.k}":
            self.poisoned = terminated = True
        if action == f"raise{self.k}":
            raise RuntimeError(f"env {self.k} exploded")
        if action == f"end{self.k}":
            terminated = True
        reward = {"np": np.float32(0.25), "str": "1.5", "bad": object()}.get(action[:-1] if action[-1:].isdigit()
                                                                          else action, reward)
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("keep", [None, ("count", "score", "error"), ("late", "nested", "late")])
def test_a_lockstep_slice_in_one_loop_sends_what_the_per_env_path_sends(mode, keep):
    """A worker steps a lock-step slice of plain envs in one loop (``_step_slice``); its column
    messages equal, value for value, those of the per-env path it skips, also when an env raises,
    ends, resets (NEXT_STEP: the step after an end), fails to reset, returns a numpy or non-float
    reward, or lacks kept keys others have."""
    import functools
    import marshal
    import pickle

    from benchmax_gym.wrappers import batching, worker

    n = 6

    def normal(message):  # (the tracebacks name each path's own frames)
        if isinstance(message, tuple) and len(message) == 4 and message[1] == "z":  # a column sent as bytes
            message = (message[0], "o", batching._deferred_values(message[2]), message[3])
        if isinstance(message, (list, tuple)):
            return type(message)(map(normal, message))
        if isinstance(message, dict):
            return {k: normal(v) for k, v in message.items()}
        return "TB" if isinstance(message, str) and message.startswith("Traceback") else message

    def make():
        sent, loop = [], asyncio.new_event_loop()
        wk = worker._Worker({k: functools.partial(Odd, k) for k in range(n)}, mode, True,
                            lambda m: sent.append(pickle.loads(pickle.dumps(m, protocol=5))), loop, keep)
        wk.handle("reset", [(k, k, None) for k in range(n)])
        loop.run_until_complete(asyncio.sleep(0))
        sent.clear()
        return wk, sent, loop

    fast, fast_sent, fast_loop = make()
    slow, slow_sent, slow_loop = make()
    slow._in_one_loop = lambda ids: False
    plans = [["a"] * n, ["np", "str", "a", "end3", "a", "a"], ["a", "raise1", "bad", "a", "a", "end5"],
             ["a"] * n, ["str", "bad", "end2", "a", "raise4", "np"], ["a"] * n, ["a"] * n,
             [f"end{k}" for k in range(n)], ["a"] * n, ["a"] * n,  # every env ends, then every env resets
             ["poison0", "a", "poison2", "end3", "a", "a"], ["a"] * n, ["a"] * n, ["a"] * n]
    loops, reset_failed = 0, False
    for actions in plans:
        loops += fast._in_one_loop(range(n))
        for wk, loop in ((fast, fast_loop), (slow, slow_loop)):
            wk.handle("step_all", (0, actions))
            loop.run_until_complete(asyncio.sleep(0))
        assert len(fast_sent) == len(slow_sent) == 1
        got, want = (normal(marshal.loads(m[1]) if type(m[1]) is bytes else m[1]) for m in (fast_sent[0], slow_sent[0]))
        assert got == want, actions
        reset_failed = reset_failed or "cannot reset" in repr(want)
        failed = [j for j, a in enumerate(actions) if a in (f"raise{j}", "bad")]
        assert [want[4][j] for j in failed] == [1] * len(failed)  # (truncated: the env failed)
        fast_sent.clear(), slow_sent.clear()
    assert loops == len(plans)  # (envs due a reset too: a NEXT_STEP end, a failure)
    assert reset_failed or mode == AutoresetMode.DISABLED or keep is not None and "error" not in keep
    fast.close(), slow.close()


# -- a worker's own failures, interrupted steps, failed resets, dict subclasses -----------------


class Fragile(Flaky):
    """``Flaky`` whose resets fail while ``flag`` (a file) exists; 'lock' puts an unpicklable
    value in its info, 'slow' takes half a second, and it has a read-only ``level``."""

    def __init__(self, flag: str = ""):
        self.flag = flag

    @property
    def level(self):
        return 1

    def reset(self, *, seed=None, options=None):
        if self.flag and os.path.exists(self.flag):
            raise RuntimeError("the task server is down")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if action == "slow":
            time.sleep(0.5)
        if action == "lock":
            import threading

            return "locked", 0.0, False, False, {"lock": threading.Lock()}
        return super().step(action)


@pytest.mark.timeout(120)  # a hang guard: the workers' error was waited on forever
def test_set_attr_an_env_refuses_raises_its_own_error_at_once():
    envs = SubprocVectorEnv([Fragile] * 2, num_workers=2)
    with pytest.raises(AttributeError, match="level"):
        envs.set_attr("level", 2)
    envs.set_attr("count", 5)  # the workers go on
    assert envs.get_attr("count") == (5, 5)
    envs.close()


@pytest.mark.parametrize("ready_first", [False, True])
def test_a_result_the_worker_cannot_send_is_reported_as_that_envs_error(ready_first):
    """(More in test_vector_hostile: the envs beside it keep their results.)"""
    envs = SubprocVectorEnv([Fragile] * 2, num_workers=1)
    envs.reset(seed=0)
    if ready_first:
        envs.send(["lock", "lock"])
        *_, info, _ = envs.recv(min_ready=2, timeout=60)
    else:
        *_, info = envs.step(["lock", "lock"])
    assert all(f"env {i}'s result cannot be sent to the parent: info['lock']: TypeError: cannot pickle '_thread.lock'"
               in e for i, e in enumerate(info["error"]))
    assert envs.faults == 0  # (the worker goes on)
    obs, *_ = envs.step(["x", "x"])
    assert all(o.startswith("start") for o in obs)  # (their episodes ended: this step resets them)
    envs.close()


def test_an_interrupted_step_leaves_no_results_for_the_next_one():
    envs = SubprocVectorEnv([Fragile] * 2, num_workers=2)
    envs.reset(seed=0)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            envs.step(["slow", "slow"])
    finally:
        signal.signal(signal.SIGALRM, old)
    obs, *_ = envs.step(["B", "B"])
    assert list(obs) == ["echo B 2", "echo B 2"]  # this step's results (the interrupted one's were step 1)
    obs, *_ = envs.step(["C", "C"])
    assert list(obs) == ["echo C 3", "echo C 3"]
    envs.close()


def test_same_step_keeps_an_episodes_result_when_its_reset_or_its_restart_fails(tmp_path):
    import functools

    flag = tmp_path / "resets-fail"
    make = functools.partial(Fragile, str(flag))
    envs = SubprocVectorEnv([make] * 3, num_workers=1, autoreset_mode="SameStep")
    envs.reset(seed=0)
    flag.touch()
    obs, reward, terminated, truncated, info = envs.step(["end", "raise", "x"])
    assert list(reward[[0, 2]]) == [1.0, 1.0] and np.isnan(reward[1])
    assert list(terminated) == [True, False, False] and list(truncated) == [False, True, False]
    assert info["final_info"]["count"][0] == 1 and info["_final_info"][0]  # the ended episode, as it ended
    assert "the task server is down" in info["error"][0]  # its autoreset's failure
    assert "the tool exploded" in info["final_info"]["error"][1]  # the step's own error is the one its episode ends with
    assert info["final_info"]["outcome_detail"][1].startswith("the env raised")
    assert "the tool exploded" in info["final_info"]["outcome_detail"][1]
    assert "the task server is down" in info["error"][1]
    envs.close()

    envs = SubprocVectorEnv([make] * 4, num_workers=2, autoreset_mode="SameStep")
    flag.unlink()
    envs.reset(seed=0)
    flag.touch()
    obs, reward, terminated, truncated, info = envs.step(["die", "x", "x", "x"])  # the restarted worker's resets fail
    assert list(truncated) == [True, True, False, False]
    assert all("worker_restarted" in e for e in info["final_info"]["error"][:2])
    assert all("the task server is down" in e for e in info["error"][:2])
    envs.close()


class Tallies(gym.Env):
    """Infos that are ``defaultdict``s with different keys per env."""

    observation_space = UnicodeText(100)
    action_space = UnicodeText(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        from collections import defaultdict

        info = defaultdict(int, calls=1)
        info[action] += 1
        return "ok", 0.0, False, False, info


def test_infos_that_are_dict_subclasses_are_batched_as_gymnasium_batches_them():
    actions = ["calculator", "search"]
    sync = SyncVectorEnv([Tallies] * 2)
    sync.reset(seed=0)
    expected = sync.step(actions)[4]
    for keys in (None, ["calls", "calculator", "search"]):
        envs = SubprocVectorEnv([Tallies] * 2, num_workers=1, info_keys=keys)
        envs.reset(seed=0)
        got = envs.step(actions)[4]
        for key in ("calls", "calculator", "search"):
            assert same(got[key], expected[key]) and same(got[f"_{key}"], expected[f"_{key}"]), key
        envs.close()


class Big(gym.Env):
    """Each step's info carries a long transcript (as a tool env's turn can)."""

    observation_space = UnicodeText(1 << 30)
    action_space = UnicodeText(1 << 30)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        return "obs", 1.0, False, False, {"transcript": "x" * len(action)}


@pytest.mark.parametrize("size", [1 << 20])
def test_big_actions_sent_while_big_results_wait_unread_never_deadlock(size):
    """A ready-first caller sends big actions to a worker whose big results it has not read: the
    worker must go on reading (its writes never block its loop), or both wait for ever."""
    import threading

    envs = SubprocVectorEnv([Big] * 4, num_workers=1, step_timeout=30)
    envs.reset(seed=0)
    hung = threading.Timer(60, lambda: [os.kill(pid, signal.SIGKILL) for pid in envs.worker_pids])
    hung.start()  # (a deadlock would block this test for ever: the watchdog breaks it, and the test fails)
    try:
        big = "a" * size
        envs.send([big, big], env_ids=[0, 1])
        time.sleep(0.5)  # the worker answers; the caller reads nothing yet
        envs.send([big, big], env_ids=[2, 3])
        *_, info, ids = envs.recv(min_ready=4, timeout=60)
    finally:
        hung.cancel()
    assert sorted(ids) == [0, 1, 2, 3] and envs.faults == 0
    assert all(len(t) == size for t in info["transcript"])
    envs.close()


class Collected(gym.Env):
    """Records, in its worker, each cyclic garbage collection that starts and whether one of its
    steps was running: ``keep N`` keeps N new lists (as transcripts grow), ``cycles N`` drops N
    self-referencing ones (garbage only a collection frees)."""

    observation_space = UnicodeText(100)
    action_space = UnicodeText(100)

    def __init__(self):
        self.events, self.kept, self.stepping = [], [], False
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase, info):
        if phase == "start":
            self.events.append(self.stepping)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        what, count = action.split()
        self.stepping = True
        try:
            for _ in range(int(count)):
                item = []
                if what == "keep":
                    self.kept.append(item)
                else:
                    item.append(item)
        finally:
            self.stepping = False
        return "ok", 0.0, False, False, {}

    def forget(self):
        self.events.clear()


def test_a_workers_collections_run_after_its_results_are_sent_yet_within_a_long_step():
    """A lock-step batch that every worker waits on is not stalled by one worker's collection:
    the one due while its envs step runs once their results are out; garbage one long step
    piles up is still collected during it."""
    envs = SubprocVectorEnv([Collected], num_workers=1)
    try:
        envs.reset(seed=0)
        envs.call("forget")
        envs.step(["keep 30000"])  # past the young threshold (20,000) within the step
        events = envs.get_attr("events")[0]
        assert events and not any(events), f"collections during the step: {events}"
        envs.call("forget")
        envs.step(["cycles 400000"])  # past the cap while the step runs
        assert any(envs.get_attr("events")[0])
    finally:
        envs.close()


class CutFrame(Flaky):
    """Flaky, whose action ``cut N`` writes the first N bytes of a 1,000-byte message frame to
    its parent, on its worker's own connection, then exits: a worker that dies mid-message."""

    def step(self, action):
        if action.startswith("cut "):
            import struct

            frame = sys._getframe()
            while frame.f_code.co_name != "_worker_main":  # (the worker loop's connection to its parent)
                frame = frame.f_back
            message = struct.pack("!i", 1000) + b"x" * 1000
            os.write(frame.f_locals["conn"].fileno(), message[:int(action.split()[1])])
            os._exit(3)
        return super().step(action)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cut", [2, 500])
@pytest.mark.parametrize("step_timeout", [None, 30])
def test_a_worker_that_dies_mid_message_is_lost_with_its_reason(cut, step_timeout):
    """The parent reads a message's length, then its body: a worker that dies after writing part
    of either (a cut header, a cut body) is lost with its exit code, its envs end truncated with
    that reason, the other worker's results are theirs, and the next step runs on a fresh worker
    (not a hang, not a bare EOFError).
    Both lock-step reads: in turn (no ``step_timeout``) and as workers become readable."""
    envs = SubprocVectorEnv([CutFrame] * 4, num_workers=2, step_timeout=step_timeout)
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, info = envs.step(["a", "b", f"cut {cut}", "d"])
        assert truncated.tolist() == [False, False, True, True] and envs.faults == 1
        assert list(obs[:2]) == ["echo a 1", "echo b 1"]
        assert all("worker_restarted" in e and "exited (code 3)" in e for e in info["error"][2:])
        assert info["scored"].tolist() == [True, True, False, False]
        obs, *_ = envs.step(["e"] * 4)
        assert obs[0] == "echo e 2" and obs[3].startswith("start")  # (its restarted envs reset: NEXT_STEP)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_the_parent_reads_a_message_with_its_header_at_once_and_keeps_what_came_after():
    """The parent's reads take whatever a worker's connection holds, up to its buffer: a message
    that fits comes with its header in one read, one a byte past the buffer comes whole too; what
    arrived after a message (the next ones, part of one) waits in the buffer, where ``recv`` and
    ``recv_ready`` find it though the connection no longer shows it; a 12-byte header and a batch
    in marshal's bytes read as the worker wrote them."""
    import marshal
    import pickle
    import socket
    import struct
    import threading

    from benchmax_gym.core.aio import frame_header
    from benchmax_gym.wrappers.channel import _READ_AHEAD, _Process

    parent, worker = socket.socketpair()

    def handle():
        reader = _Process.__new__(_Process)  # (the parent's side of a real connection, no process behind it)
        reader.conn = parent
        reader._reads(parent.fileno())
        return reader

    def body(size: int, tag: str) -> bytes:  # a pickled ("results", (tag, b"xx...")) message of exactly ``size`` bytes
        overhead = len(pickle.dumps(("results", (tag, b"x" * 256)), protocol=5)) - 256
        out = pickle.dumps(("results", (tag, b"x" * (size - overhead))), protocol=5)
        assert len(out) == size
        return out

    def send(data: bytes) -> None:  # (from a thread: a frame past the socket's buffer waits for the reads)
        sender = threading.Thread(target=worker.sendall, args=(data,))
        sender.start()
        return sender

    try:
        for size in (_READ_AHEAD - 4, _READ_AHEAD - 3):  # the whole frame fills the first read; one byte past it
            reader = handle()
            sender = send(frame_header(size) + body(size, f"edge {size}"))
            message = reader.recv(30)
            sender.join()
            assert pickle.dumps(message, protocol=5) == body(size, f"edge {size}") and not reader.has_message()

        reader = handle()
        first, second, third = body(300, "first"), body(400, "second"), body(500, "third")
        batch = marshal.dumps(((0, 2), ["a", "b"], b"", b"", b"", []), 4)  # (pack_results' bytes, no pickle around them)
        send(b"".join([frame_header(len(first)), first, frame_header(len(second)), second,
                       frame_header(len(batch)), batch, frame_header(len(third))[:2]])).join()
        assert reader.recv(30)[1][0] == "first"
        assert reader.has_message()  # the second: read with it, no longer on the connection
        assert reader.recv(0)[1][0] == "second"
        assert reader.recv_ready() == [("batch", marshal.loads(batch))]
        assert not reader.has_message()  # (half the third's header)
        with pytest.raises(TimeoutError):
            reader.recv(0)
        send(frame_header(len(third))[2:] + third + struct.pack("!iQ", -1, len(first)) + first).join()
        assert [m[1][0] for m in reader.recv_ready()] == ["third", "first"]
    finally:
        parent.close(), worker.close()
