"""RayVectorEnv on a real multi-node Ray cluster on loopback: the vector contract, ready-first
batches, host and node faults, and what close() leaves (nothing).

On the loopback cluster of this folder's conftest.py. Environments defined here travel to the
hosts by value (cloudpickle).
"""

import os

# Before Ray is imported: every node and process of the test cluster stays on 127.0.0.1 (Ray
# reads this once), and no token file a user left in ~/.ray turns authentication on.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"

import asyncio  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402
import ray  # noqa: E402
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402

import benchmax_gym  # noqa: E402
from benchmax_gym import UnicodeText  # noqa: E402
from benchmax_gym.wrappers import RayVectorEnv  # noqa: E402
from tests.wrappers.on_ray.conftest import NODE  # noqa: E402

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
HOST = {"num_cpus": 0, "resources": {"benchmax_env_host": 1}}


def math_env():
    return gym.make("benchmax/Math-v0", python_tool=False, max_turns=3)


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


def sleepy_env():
    """An id registered in Python: the host registers it too, as this function runs there."""
    if "testing/RaySleepy-v0" not in gym.registry:
        benchmax_gym.register_tool_env(
            "testing/RaySleepy-v0", tools=[nap, meet, wait_for],
            tasks=[{"prompt": f"task {i}", "answer": "ok"} for i in range(8)],
            rubric=[lambda completion, answer: float(completion == answer)], max_turns=4, tool_timeout=120)
    return gym.make("testing/RaySleepy-v0")


def nap_action(seconds):
    return f'<tool_call>{{"name": "nap", "arguments": {{"seconds": {seconds}}}}}</tool_call>'


def meet_action(folder, parties):
    arguments = {"folder": str(folder), "parties": parties}
    return '<tool_call>' + json.dumps({"name": "meet", "arguments": arguments}) + '</tool_call>'


def wait_action(path):
    return '<tool_call>' + json.dumps({"name": "wait_for", "arguments": {"path": str(path)}}) + '</tool_call>'


class Flaky(gym.Env):
    """A tiny env that misbehaves on request: 'raise', 'hang'; 'end' terminates."""

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
        return f"echo {action} {self.count}", 1.0, action == "end", False, {"count": self.count}


def cannot_be_built():
    import not_installed_on_this_host  # noqa: F401


def our_actors():
    return [name for name in ray.util.list_named_actors(all_namespaces=True) if "benchmax-env-host" in str(name)]


def processes_in(root):
    """Live processes whose working directory is under ``root`` (sandboxes)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.cwd().startswith(root):
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def gone(pids, paths, actors=False, deadline=60.0):
    """Wait until none of these host processes and workspaces is left (nor, with ``actors``, any host actor)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        live = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not live and not [p for p in paths if os.path.exists(p)] and not (actors and our_actors()):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_matches_sync_vector_env_step_for_step(cluster, mode):
    fns = [math_env] * 5
    ours = RayVectorEnv(fns, num_hosts=2, autoreset_mode=mode, actor_options=HOST)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    assert len({h["node_id"] for h in ours.hosts}) == 2  # spread over the two nodes
    a, b = ours.reset(seed=7), ref.reset(seed=7)
    assert a[0] == b[0] and list(a[1]["task_id"]) == list(b[1]["task_id"])
    script = [CALC, CALC, "\\boxed{1}", CALC, "\\boxed{2}", CALC, CALC, CALC, CALC]
    done = np.zeros(5, dtype=bool)
    for t, action in enumerate(script):
        actions = [action if (i + t) % 2 else CALC for i in range(5)]
        if mode == AutoresetMode.DISABLED and done.any():
            assert ours.reset(options={"reset_mask": done.copy()})[0] == ref.reset(options={"reset_mask": done.copy()})[0]
        x, y = ours.step(actions), ref.step(actions)
        assert x[0] == y[0], t
        for k in (1, 2, 3):
            assert (x[k] == y[k]).all(), (t, k)
        for key in ("turn", "error", "task_id"):
            assert list(x[4].get(key, [])) == list(y[4].get(key, [])), (t, key)
        if mode == AutoresetMode.SAME_STEP and "final_obs" in y[4]:
            assert list(x[4]["final_obs"]) == list(y[4]["final_obs"])
        done = x[2] | x[3]
    ours.close()
    ref.close()


def test_make_vec_per_env_options_and_attributes(cluster):
    envs = gym.make_vec("benchmax/Math-v0", num_envs=4, vector_backend="ray", envs_per_host=2,
                        actor_options=HOST, python_tool=False)
    assert isinstance(envs, RayVectorEnv) and len(envs.hosts) == 2
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    obs, info = envs.reset(options=[{"task_index": i * 10} for i in range(4)])
    assert list(info["task_index"]) == [0, 10, 20, 30] and envs.observation_space.contains(obs)
    first, _ = envs.reset(seed=123)
    assert envs.reset(seed=123)[0] == first and len(set(first)) == 4
    assert envs.get_attr("max_turns") == (8, 8, 8, 8)
    envs.set_attr("max_turns", [2, 3, 4, 5])
    assert envs.get_attr("max_turns") == (2, 3, 4, 5)
    assert len(envs.call("render")) == 4
    envs.close()
    local = gym.make_vec("benchmax/Math-v0", num_envs=4, num_workers=2, python_tool=False)
    assert local.reset(seed=123)[0] == first  # the same tasks as local workers give
    local.close()


def test_a_mixtures_hosts_share_one_curriculum_through_the_parent(cluster):
    """Two hosts, two envs each, a window of 4: one batch of wrong answers (4 episodes in all,
    2 per host) moves the level for every host at once; each member is built where it is drawn (and
    the level left is closed there)."""
    curriculum = {"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2, 3], "window": 4, "start": 2}}
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=4, vector_backend="ray", envs_per_host=2, actor_options=HOST,
                        members=[("benchmax/Math-v0", 1.0), ("benchmax/Excel-SpreadsheetBench-v0", 0.0)],
                        python_tool=False, curriculum=curriculum)
    _, info = envs.reset(seed=0)
    assert list(info["member"]) == ["Math-v0"] * 4 and list(info["difficulty"]) == [2] * 4
    _, _, terminated, _, info = envs.step(["\\boxed{not a number}"] * 4)
    assert terminated.all() and envs.curriculum_stats()["Math-v0"]["level"] == 1
    _, _, _, _, info = envs.step(["x"] * 4)  # the next episodes, at the parent's level
    assert list(info["difficulty"]) == [1] * 4
    assert all(keys == ["Math-v0@1"] for keys in envs.get_attr("built_members"))  # (level 2, left: closed)
    envs.close()


def test_ready_first_and_one_host_overlaps_its_envs_io(cluster, tmp_path):
    envs = RayVectorEnv([sleepy_env] * 8, num_hosts=2, actor_options=HOST)
    envs.reset(seed=0)
    obs, *_ = envs.step([meet_action(tmp_path, 8)] * 8)
    assert all("met 8" in o for o in obs), obs  # all eight calls waited at once, four on each host
    slow, fast = {1, 6}, set(range(8)) - {1, 6}
    envs.send([wait_action(tmp_path / "release") if i in slow else nap_action(0.01) for i in range(8)], np.arange(8))
    # the slow ones wait for this test: a recv that waited for them would return all 8, a minute later
    obs, rewards, terminated, truncated, info, ids = envs.recv(min_ready=6)
    assert set(ids.tolist()) == fast and all("slept 0.01" in o for o in obs)
    envs.send([nap_action(0.01)] * 6, ids)  # the fast ones go on while the slow ones still run
    *_, ids = envs.recv(min_ready=6)
    assert set(ids.tolist()) == fast
    (tmp_path / "release").touch()
    obs, *_, ids = envs.recv(min_ready=2)
    assert set(ids.tolist()) == slow and all("released" in o for o in obs), obs
    envs.send([nap_action(0.01), wait_action(tmp_path / "release-1")], [0, 1])
    returned = []
    for _ in range(120):  # (a busy machine may need more than one timeout for env 0's step)
        *_, ids = envs.recv(min_ready=2, timeout=0.5)  # env 1 waits for this test: never ready here
        returned += ids.tolist()
        if returned:
            break
    assert returned == [0]  # the timeout returns what is ready
    (tmp_path / "release-1").touch()
    *_, ids = envs.recv(min_ready=1)
    assert ids.tolist() == [1]
    envs.close()


@pytest.mark.timeout(120, func_only=True)  # a hang guard: without the step timeout, step waits for the 1000 s hang
def test_env_that_raises_is_rebuilt_and_a_stuck_host_is_replaced(cluster):
    # 5 s: the hang (1000 s) passes it; the other host's steps (Ray calls, on a loaded machine) must not
    envs = RayVectorEnv([Flaky] * 4, num_hosts=2, step_timeout=5.0, actor_options=HOST)
    envs.reset(seed=0)
    obs, rewards, terminated, truncated, info = envs.step(["a", "raise", "b", "c"])
    assert truncated.tolist() == [False, True, False, False] and "the tool exploded" in info["error"][1]
    assert envs.faults == 0
    stuck = envs.hosts[1]
    obs, rewards, terminated, truncated, info = envs.step(["a", "b", "hang", "c"])
    assert truncated.tolist() == [False, False, True, True] and "step_timeout" in info["error"][2]
    assert obs[0] == "echo a 2" and envs.faults == 1 and envs.hosts[1]["pid"] != stuck["pid"]
    obs, *_ = envs.step(["x", "y", "z", "w"])
    assert obs[0] == "echo x 3" and obs[2].startswith("start ")  # the new host's envs reset (NEXT_STEP)
    assert gone([stuck["pid"]], [stuck["workspace"]])  # the stuck host was killed, its workspace removed
    envs.close()


PYTHON = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'


def test_killed_host_same_step_and_no_workspace_left(cluster):
    # Sandboxed python keeps a workspace per episode under the host's own temp root; the host's
    # sandbox server starts with the first python call.
    envs = RayVectorEnv("benchmax/Math-v0", 2, num_hosts=2, autoreset_mode="SameStep", actor_options=HOST)
    envs.reset(seed=0)
    envs.step([PYTHON, PYTHON])
    victim = envs.hosts[0]
    assert os.listdir(victim["workspace"]) and processes_in(victim["workspace"])  # the sandbox server
    os.kill(victim["pid"], signal.SIGKILL)
    obs, rewards, terminated, truncated, info = envs.step([CALC, CALC])
    assert truncated.tolist() == [True, False] and "worker_restarted" in info["final_info"]["error"][0]
    # issue 29: the lost host's env failed (no reward); the other's reward is signal
    assert info["final_info"]["outcome"][0] == "env_error" and np.isnan(rewards[0]) and info["scored"].tolist() == [False, True]
    assert info["_task_id"][0] and "calculator" in obs[0]  # a fresh episode, in the same step
    # Ray killed the host's sandbox; a task on its node removed its workspace
    assert gone([victim["pid"]], [victim["workspace"]]) and not processes_in(victim["workspace"])
    hosts = envs.hosts
    envs.close()
    assert gone([h["pid"] for h in hosts], [h["workspace"] for h in hosts], actors=True)


BANK_LOG = f"/tmp/benchmax-ray-bank-{os.getpid()}.log"  # setups and teardowns, from every host


def deposit(amount: int, state) -> str:
    """Deposit money.

    Args:
        amount: how much
    """
    state["balance"] += amount
    return f"balance {state['balance']}"


def bank_env():
    """Per-episode state (issue 31) on a host: setup and teardown log where they ran."""

    def setup(task, episode):
        with open(BANK_LOG, "a") as f:
            f.write(f"setup {episode.rollout_id}\n")
        return {"balance": 0, "id": episode.rollout_id}

    def teardown(state):
        with open(BANK_LOG, "a") as f:
            f.write(f"teardown {state['id']}\n")

    if "testing/RayBank-v0" not in gym.registry:
        benchmax_gym.register_tool_env(
            "testing/RayBank-v0", tools=[deposit], tasks=[{"prompt": "Save.", "answer": "ok"}],
            rubric=[lambda state: float(state["balance"])], setup=setup, teardown=teardown, max_turns=4)
    return gym.make("testing/RayBank-v0")


def test_episodes_on_hosts_keep_their_own_state_and_tear_it_down_once(cluster):
    if os.path.exists(BANK_LOG):
        os.unlink(BANK_LOG)
    envs = RayVectorEnv([bank_env] * 4, num_hosts=2, actor_options=HOST)
    try:
        envs.reset(seed=0)
        deposits = [f'<tool_call>{{"name": "deposit", "arguments": {{"amount": {i + 1}}}}}</tool_call>' for i in range(4)]
        envs.step(deposits)
        envs.step(deposits)
        _, rewards, terminated, _, _ = envs.step(["done"] * 4)
        assert terminated.all() and rewards.tolist() == [2.0, 4.0, 6.0, 8.0]
    finally:
        envs.close()
    with open(BANK_LOG) as f:
        lines = [line.split() for line in f.read().splitlines()]
    os.unlink(BANK_LOG)
    setups = [rid for what, rid in lines if what == "setup"]
    assert len(setups) >= 4 and sorted(rid for what, rid in lines if what == "teardown") == sorted(setups)


def test_group_functions_get_the_tasks_played_on_the_hosts(cluster):
    """score_vector_group over Ray hosts: a CRM episode holds its sqlite connection and cannot be
    sent, so each host sends back only the task its env just played (``episode_task()``)."""
    from benchmax_gym.core.group import GroupRubric, score_vector_group

    local = gym.make("benchmax/CRM-v0")
    local.reset(seed=0, options={"task_index": 2})
    expected = local.unwrapped.episode.task
    local.close()
    seen = []

    def look(rewards, task, answer):
        seen.append((task, answer))
        return [0.0] * len(rewards)

    envs = RayVectorEnv("benchmax/CRM-v0", 3, num_hosts=2, actor_options=HOST)
    try:
        envs.reset(seed=0, options=[{"task_index": 2}] * 3)
        _, _, terminated, _, _ = envs.step(["The answer is nobody"] * 3)
        assert terminated.all()
        out = score_vector_group(envs, GroupRubric([("look", look)]))
    finally:
        envs.close()
    assert len(out) == 3 and len(seen) == 1
    task, answer = seen[0]
    assert task is not None and task.id == expected.id and answer == expected.answer


@pytest.mark.timeout(120, func_only=True)  # a hang guard, for hosts that would be waited on forever
def test_host_that_cannot_build_its_envs_says_why(cluster):
    with pytest.raises(RuntimeError, match="could not build.*ModuleNotFoundError: No module named 'not_installed_on"):
        RayVectorEnv([cannot_be_built] * 2, num_hosts=2, actor_options=HOST)
    assert gone([], [], actors=True)  # no actor left


def test_node_removed_mid_step(cluster):
    envs = RayVectorEnv([sleepy_env] * 4, num_hosts=2, actor_options=HOST)
    envs.reset(seed=0)
    nodes = {n.node_id: n for n in cluster.worker_nodes}
    victim = envs.hosts[1]  # owns envs 2 and 3
    envs.send([nap_action(0.05), nap_action(0.05), nap_action(30), nap_action(30)], np.arange(4))
    *_, ids = envs.recv(min_ready=2)
    assert ids.tolist() == [0, 1]
    envs.send([nap_action(0.05)] * 2, [0, 1])
    cluster.remove_node(nodes[victim["node_id"]], allow_graceful=False)
    try:
        obs, rewards, terminated, truncated, info, ids = envs.recv(min_ready=4)
        assert ids.tolist() == [0, 1, 2, 3]
        assert truncated.tolist() == [False, False, True, True]
        assert "worker_restarted" in info["error"][2] and victim["name"] in info["error"][2]
        assert all("slept 0.05" in o for o in obs[:2])  # the others completed
        new = envs.hosts[1]
        assert new["node_id"] != victim["node_id"] and envs.faults == 1
        # the replacement host plays whole episodes, like the host that stayed
        for episode in range(2):
            envs.reset(seed=episode)
            for _ in range(3):
                obs, rewards, terminated, truncated, info = envs.step([nap_action(0.01)] * 4)
                assert all("slept 0.01" in o for o in obs) and not (terminated | truncated).any()
            obs, rewards, terminated, truncated, info = envs.step(["<answer>ok</answer>"] * 4)
            assert terminated.all() and rewards.tolist() == [rewards[0]] * 4
    finally:
        envs.close()
        cluster.add_node(**NODE)  # the next tests get two nodes again
        cluster.wait_for_nodes()


def test_close_leaves_nothing_and_bad_configuration(cluster):
    envs = RayVectorEnv([Flaky] * 3, num_hosts=3, actor_options=HOST)
    hosts = envs.hosts
    assert len(our_actors()) == 3
    envs.close()
    assert gone([h["pid"] for h in hosts], [h["workspace"] for h in hosts], actors=True)
    for kwargs, says in [
        ({"num_hosts": 0}, "num_hosts"), ({"num_hosts": 4}, "num_hosts"), ({"envs_per_host": 0}, "envs_per_host"),
        ({"num_hosts": 1, "envs_per_host": 1}, "not both"), ({"actor_options": {"max_restarts": 3}}, "max_restarts"),
        ({"actor_options": {"num_cpu": 1}}, "actor_options"), ({"autoreset_mode": "Sometimes"}, "autoreset_mode"),
        ({"step_timeout": 0}, "step_timeout"),
    ]:
        with pytest.raises(ValueError, match=says):
            RayVectorEnv([Flaky] * 3, **kwargs)
    with pytest.raises(ValueError, match="vector_backend"):
        gym.make_vec("benchmax/Math-v0", num_envs=2, vector_backend="slurm")


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_unreachable_address_and_missing_ray_name_the_fix():
    out = _run("from benchmax_gym.wrappers import RayVectorEnv\nRayVectorEnv('benchmax/Math-v0', 2, address='127.0.0.1:9')")
    assert out.returncode != 0  # (ray.init would retry for long: _run's 120 s timeout is the hang guard)
    assert "ConnectionError: no Ray cluster answers at address='127.0.0.1:9'" in out.stderr
    out = _run("import sys; sys.modules['ray'] = None\n"
               "from benchmax_gym.wrappers import RayVectorEnv\nRayVectorEnv('benchmax/Math-v0', 2)")
    assert "pip install 'benchmax-gym[ray]'" in out.stderr


def test_workspace_removal_never_touches_anything_but_a_host_root(tmp_path, monkeypatch):
    from benchmax_gym.wrappers.ray_vector import _remove_workspace

    monkeypatch.chdir(tmp_path)
    (tmp_path / "precious.txt").write_text("keep")
    for path in ("", ".", "precious.txt", str(tmp_path)):  # a host that never started has ""
        _remove_workspace(path)
    assert (tmp_path / "precious.txt").read_text() == "keep"
    root = tmp_path / "benchmax-host-abc"
    (root / "ws-1").mkdir(parents=True)
    _remove_workspace(str(root))
    assert not root.exists()


@pytest.mark.slow
def test_ray_version_mismatch_is_reported_as_such(cached_venv):
    """A head of another Ray version (its own venv, .venv-ray-2.59.0) that this driver joins."""
    other = cached_venv(".venv-ray-2.59.0", "ray==2.59.0")
    head = (
        "import sys\n"
        "from ray.cluster_utils import Cluster\n"
        "c = Cluster(initialize_head=True, head_node_args={'num_cpus': 0, 'object_store_memory': 100 * 2**20, "
        "'node_ip_address': '127.0.0.1', 'include_dashboard': False})\n"
        "print(c.address, flush=True)\n"
        "sys.stdin.read()\n"
        "c.shutdown()\n"
    )
    for _ in range(2):  # (Ray's own limit for a node to register, 30 s, may pass on a loaded machine: once more)
        said = tempfile.TemporaryFile()
        proc = subprocess.Popen([other, "-c", head], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=said,
                                text=True, start_new_session=True)
        address = proc.stdout.readline().strip()
        if address:
            break
        proc.communicate(timeout=60)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the failed head had started
        except ProcessLookupError:
            pass
        said.seek(0)
        error = said.read().decode(errors="replace")[-3000:]
        said.close()
    else:
        raise AssertionError(f"the Ray 2.59 head did not start, twice: {error}")
    try:
        out = _run(f"from benchmax_gym.wrappers import RayVectorEnv\nRayVectorEnv('benchmax/Math-v0', 2, address={address!r})")
        assert "RuntimeError: Ray version mismatch between this process (ray 2.60.0" in out.stderr
        assert "The cluster was started with: Ray: 2.59.0" in out.stderr and address in out.stderr
    finally:
        proc.stdin.close()  # the head shuts its cluster down
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        said.close()


def test_a_host_takes_only_a_parent_that_holds_its_key(monkeypatch):
    """The host's port is open on its node until the parent connects: a stranger, a peer that
    reflects the host's own challenge back, and one that says nothing are all dropped, and the
    parent still gets through."""
    import hmac
    import socket
    import threading

    from benchmax_gym.wrappers import ray_vector as rv

    monkeypatch.setattr(rv, "HANDSHAKE_TIMEOUT", 0.5)
    key = os.urandom(32)
    server = socket.create_server(("127.0.0.1", 0))
    address = server.getsockname()
    accepted = []
    host = threading.Thread(target=lambda: accepted.append(rv._accept(server, key, 30)))
    host.start()

    stranger = socket.create_connection(address)
    with pytest.raises(ConnectionRefusedError, match="does not hold"):
        rv._authenticate(stranger, os.urandom(32), b"parent")
    stranger.close()

    reflector = socket.create_connection(address)
    challenge = rv._read_exactly(reflector, 32)
    reflector.sendall(challenge)  # the host's challenge as its own: the host answers it ...
    answer = rv._read_exactly(reflector, 32)
    assert answer == hmac.new(key, b"host" + challenge, "sha256").digest()
    reflector.sendall(answer)  # ... but a host-tagged answer is no parent's
    reflector.settimeout(5)
    assert reflector.recv(1) == b""  # dropped
    reflector.close()

    silent = socket.create_connection(address)
    silent.settimeout(5)
    assert len(rv._read_exactly(silent, 32)) == 32 and silent.recv(1) == b""  # dropped after the timeout
    silent.close()

    monkeypatch.setattr(rv, "HANDSHAKE_TIMEOUT", 30.0)  # (the parent's own handshake: room on a loaded machine)
    parent = socket.create_connection(address)
    conn = rv._connection(parent, rv._authenticate(parent, key, b"parent"))
    host.join(60)
    assert isinstance(accepted[0], rv._Sealed)
    conn.send_bytes(b"step")
    assert accepted[0].recv_bytes() == b"step"
    conn.close()
    accepted[0].close()
    server.close()


def test_a_host_lost_without_its_connection_closing_is_found_through_ray(cluster):
    """A node that vanishes from the network leaves the parent's connection open and silent:
    Ray's report of the host's death ends its envs' steps (with Ray's reason) and replaces it."""
    import threading

    from multiprocess import Pipe

    envs = RayVectorEnv([Flaky] * 4, num_hosts=2, actor_options=HOST)
    envs.reset(seed=0)
    host = envs._workers[1]
    silent, other_end = Pipe()  # stands in for a connection nobody will ever write to or close
    real, host.conn = host.conn, silent
    try:
        envs.send(["a"] * 4, np.arange(4))
        threading.Timer(0.5, lambda: ray.kill(host.actor, no_restart=True)).start()
        obs, rewards, terminated, truncated, info, ids = envs.recv(min_ready=4)
        assert truncated.tolist() == [False, False, True, True]
        assert "worker_restarted" in info["error"][2] and "Actor" in info["error"][2] and envs.faults == 1
        assert list(info["outcome"][2:]) == ["env_error"] * 2 and np.isnan(rewards[2:]).all()
        obs, *_ = envs.step(["b"] * 4)  # (next-step autoreset: the truncated envs start afresh)
        assert obs[0].startswith("echo b") and obs[2].startswith("start")
        obs, *_ = envs.step(["c"] * 4)
        assert obs[2] == "echo c 1"  # the replacement host plays on
    finally:
        real.close()
        other_end.close()
        envs.close()


def test_info_keys_travel_to_the_hosts(cluster):
    envs = RayVectorEnv(math_env, 2, num_hosts=2, actor_options=HOST, info_keys=["error", "reward_components"])
    envs.reset(seed=0)
    obs, rewards, terminated, truncated, info = envs.step([CALC, "\\boxed{42}"])
    assert "42" in obs[0] and terminated.tolist() == [False, True]
    assert set(info) == {"error", "_error", "reward_components", "_reward_components",
                         "outcome", "_outcome", "scored", "_scored"}  # how an episode ended always travels
    assert info["outcome"][1] == "scored" and info["_outcome"].tolist() == [False, True]
    assert info["_reward_components"].tolist() == [False, True]
    envs.close()


def test_a_host_handshakes_side_by_side_so_idle_and_trickling_peers_hold_up_nobody(monkeypatch):
    """Three idle peers and one that trickles a byte at a time, all in before the parent: the
    parent still gets through within its own handshake deadline, the trickler is dropped at its
    deadline for the whole handshake (not one per byte), and past ``MAX_HANDSHAKES`` open
    handshakes the oldest is dropped."""
    import socket
    import threading

    from benchmax_gym.wrappers import ray_vector as rv

    monkeypatch.setattr(rv, "HANDSHAKE_TIMEOUT", 2.0)
    monkeypatch.setattr(rv, "MAX_HANDSHAKES", 5)
    key = os.urandom(32)
    server = socket.create_server(("127.0.0.1", 0))
    address = server.getsockname()
    accepted = []
    host = threading.Thread(target=lambda: accepted.append(rv._accept(server, key, 60)))
    host.start()
    idle = [socket.create_connection(address) for _ in range(3)]
    trickled = []

    def trickle():  # one byte every 0.2 s (a per-byte timeout of 2 s would never fire)
        sock = socket.create_connection(address)
        try:
            for _ in range(64):
                sock.sendall(b"x")
                trickled.append(1)
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            sock.close()

    trickler = threading.Thread(target=trickle)
    trickler.start()
    time.sleep(0.5)  # all of them are in before the parent
    try:
        parent = socket.create_connection(address)
        conn = rv._connection(parent, rv._authenticate(parent, key, b"parent", timeout=1.5))
        host.join(60)
        conn.send_bytes(b"step")
        assert accepted[0].recv_bytes() == b"step"
        trickler.join(30)
        assert len(trickled) < 32  # dropped at the handshake's deadline, before its challenge was even in
        conn.close()
        accepted[0].close()

        accepted.clear()  # a new wait: more idle peers than MAX_HANDSHAKES
        host = threading.Thread(target=lambda: accepted.append(rv._accept(server, key, 60)))
        host.start()
        crowd = [socket.create_connection(address) for _ in range(7)]
        for sock in crowd:
            sock.settimeout(5)
        assert len(rv._read_exactly(crowd[0], 32)) == 32 and crowd[0].recv(1) == b""  # the oldest, dropped
        parent = socket.create_connection(address)
        conn = rv._connection(parent, rv._authenticate(parent, key, b"parent", timeout=1.5))
        host.join(60)
        assert accepted and isinstance(accepted[0], rv._Sealed)
        conn.close()
        accepted[0].close()
        for sock in crowd:
            sock.close()
    finally:
        for sock in idle:
            sock.close()
        server.close()


class Boom:
    """Unpickling this makes a directory: proof that a frame was run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _frame(body: bytes) -> bytes:
    import struct

    return struct.pack("!i", len(body)) + body


class Relay:
    """A man in the middle on loopback between the parent and a host: passes the handshake (64
    bytes each way), then frame by frame, applying ``attack`` to the first frame going ``to``
    ("host" or "parent")."""

    def __init__(self, target, to, attack):
        import socket
        import threading

        self.target, self.to, self.attack = target, to, attack
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = self.server.getsockname()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        import socket
        import threading

        down, _ = self.server.accept()
        self.server.close()
        up = socket.create_connection(self.target)
        threading.Thread(target=self._pipe, args=(down, up, "host"), daemon=True).start()
        self._pipe(up, down, "parent")

    def _pipe(self, src, dst, to):
        import socket
        import struct

        from benchmax_gym.wrappers.ray_vector import _read_exactly

        try:
            for _ in range(2):  # challenge, then answer (each end waits for the other's challenge)
                dst.sendall(_read_exactly(src, 32))
            first = True
            while True:
                header = _read_exactly(src, 4)
                frame = header + _read_exactly(src, struct.unpack("!i", header)[0])
                if first and to == self.to:
                    frame = self.attack(frame)
                first = False
                dst.sendall(frame)
        except OSError:
            pass
        finally:  # (shutdown: close alone would not wake the other direction's blocked read)
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


def _through(monkeypatch, make_socket):
    """Route the parent's connections to its hosts through ``make_socket(address) -> socket``."""
    import socket

    from benchmax_gym.wrappers import ray_vector as rv

    class Socket:
        def __getattr__(self, name):
            return getattr(socket, name)

        @staticmethod
        def create_connection(address, timeout=None):
            return make_socket(address, timeout)

    monkeypatch.setattr(rv, "socket", Socket())


@pytest.mark.parametrize("to, attack, says", [
    ("parent", "inject", "frame 0 from env host"),
    ("parent", "tamper", "frame 0 from env host"),
    ("parent", "replay", "frame 1 from env host"),
    ("host", "inject", "frame 0 from the parent"),
])
def test_a_relay_that_tampers_injects_or_replays_a_frame_is_caught_and_nothing_runs(
        cluster, monkeypatch, tmp_path, to, attack, says):
    """Each frame carries an HMAC over its sequence number, length and body with a key of its
    connection and direction: a relay holding no key cannot inject a pickle (which would make a
    directory here), change a frame, or play one again. The parent raises, saying so."""
    import socket

    marker = tmp_path / "ran"
    evil = _frame(pickle.dumps(Boom(marker)) + os.urandom(32))
    attacks = {
        "inject": lambda frame: evil + frame,
        "tamper": lambda frame: frame[:-40] + bytes([frame[-40] ^ 1]) + frame[-39:],
        "replay": lambda frame: frame + frame,
    }

    def via_relay(address, timeout=None):
        relay = Relay(address, to, attacks[attack])
        return socket.create_connection(relay.address, timeout=timeout)

    _through(monkeypatch, via_relay)
    with pytest.raises(RuntimeError, match=f"{says} .*failed authentication") as raised:
        RayVectorEnv([Flaky] * 2, num_hosts=1, actor_options=HOST)
    assert "\n" not in str(raised.value)
    time.sleep(0.5)
    assert not marker.exists()
    assert gone([], [], actors=True)


def test_idle_and_trickling_peers_at_a_hosts_port_do_not_stop_the_parent(cluster, monkeypatch):
    """Before the parent connects, three peers open connections to the host and say nothing,
    and a fourth trickles bytes: the host handshakes with the parent all the same."""
    import socket
    import threading

    peers = []

    def crowded(address, timeout=None):
        peers.extend(socket.create_connection(address) for _ in range(3))
        trickler = socket.create_connection(address)
        peers.append(trickler)

        def trickle():
            try:
                for _ in range(20):
                    trickler.sendall(b"x")
                    time.sleep(0.5)
            except OSError:
                pass

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(0.3)
        return socket.create_connection(address, timeout=timeout)

    _through(monkeypatch, crowded)
    try:
        envs = RayVectorEnv([Flaky] * 2, num_hosts=1, actor_options=HOST, start_timeout=60)
        obs, _ = envs.reset(seed=0)
        obs, *_ = envs.step(["a", "b"])
        assert obs[0].startswith("echo a") and envs.faults == 0 and len(peers) == 4
        envs.close()
    finally:
        for sock in peers:
            sock.close()


def test_chaos_a_killed_host_loses_only_the_episodes_it_held(cluster):
    """The chaos harness (tests/test_chaos.py) through RayVectorEnv: hosts SIGKILLed between an
    episode's two steps (each episode the host held: env_error), tools hanging past their
    timeout, a failed policy; every other episode equals the clean run's, observation for
    observation."""
    from benchmax_gym.core.outcomes import FAILURES, SCORED
    from benchmax_gym.testing import chaos

    def ray_envs(fn, num_envs, num_hosts, step_timeout):
        return RayVectorEnv(fn, num_envs, num_hosts=num_hosts, autoreset_mode="Disabled", step_timeout=step_timeout,
                            actor_options=HOST)

    episodes = chaos.plan(12, tasks=6, kill=0.1, tool_timeout=0.1, model_error=0.1, seed=3)
    answer = chaos.answers(6)
    faulty = chaos.run_vector(episodes, answer, num_envs=4, num_workers=2, vector=ray_envs, tool_timeout=2.0)
    clean = chaos.run_vector(episodes, answer, num_envs=4, num_workers=2, vector=ray_envs, inject=False, tool_timeout=2.0)
    assert set(faulty["results"]) == set(clean["results"]) == set(range(12))
    assert faulty["restarts"] == sum(e.fault == "kill" for e in episodes) >= 1
    assert {e for e, o in faulty["expected"].items() if o == "env_error"} > {
        e for e, ep in enumerate(episodes) if ep.fault == "kill"}
    for index, result in faulty["results"].items():
        expected = faulty["expected"].get(index)
        if expected is not None:
            assert result["outcome"] == expected and result["reward"] is None and not result["signal"]
        else:
            assert result["outcome"] == SCORED and result["signal"]
            assert {k: result[k] for k in ("reward", "components", "observations")} == \
                {k: clean["results"][index][k] for k in ("reward", "components", "observations")}
    assert all(o in FAILURES for o in faulty["expected"].values())
