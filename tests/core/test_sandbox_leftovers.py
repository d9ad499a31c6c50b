"""What a sandbox leaves behind when things go wrong around it: a non-root pool's mount helper
outliving its owner through a forked child, episodes of a pool whose helper was killed, and the
uid of a sandbox that failed to start. Real sandboxes run by uid 65534 (setpriv when the tests run
as root), real processes, real uid locks."""

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core import sandbox as sandbox_module
from benchmax_gym.core.sandbox import RLIMITS, Sandbox

sys.path.insert(0, str(Path(__file__).parent))
from test_sandbox_uids_and_sockets import ROOT_ONLY, _as_nobody, _python  # noqa: E402

# Two pools (the shared one and a private one), a forked child (a DataLoader worker, say) that
# lives on, the private pool shut down while the child lives, then it waits to be killed.
FORK_THEN_END = r"""
import json, os, time
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, SandboxLimits, _Pool
limits = SandboxLimits(timeout=60, workspace_mb=16)
shared = Sandbox(limits=limits)
private_pool = _Pool(BUBBLEWRAP, ())
private = Sandbox(limits=limits, pool=private_pool)
assert shared.run("print(1)").stdout == "1\n" and private.run("print(2)").stdout == "2\n"
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
private.close()
private_pool.shut_down()
print(json.dumps([shared._pool.mounts.proc.pid, private_pool.mounts.proc.returncode, child]), flush=True)
time.sleep(120)
"""


def _state(pid: int) -> str:
    """A process's state letter ('' once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""


def test_a_forked_child_does_not_keep_its_parents_mount_helper_alive(bubblewrap):
    """A forked child inherited the write end of the pipe whose closing ends a non-root pool's
    mount helper: a pool shut down while the child lived waited 10 s for its helper and then
    killed it, and a parent killed outright left its helper (its namespace, the episodes' tmpfs
    and files) alive for as long as the child ran. Now the child lets go of its copy at once."""
    owner = _python(FORK_THEN_END, user=_as_nobody(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True)  # the owner and its forked child: one group to clean up
    try:
        line = owner.stdout.readline()
        assert line, owner.communicate(timeout=60)[1][-3000:]
        helper, private_helper_status, child = json.loads(line)
        assert private_helper_status == 0  # ended by its stdin closing, not killed (-9) after a wait
        owner.kill()
        owner.wait(timeout=60)
        deadline = time.monotonic() + 60
        while _state(helper) not in ("", "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(helper) in ("", "Z"), "the mount helper outlived its owner"
        assert _state(child) not in ("", "Z")  # while the forked child still runs
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait(timeout=60)
        owner.stdout.close()
        owner.stderr.close()


# An episode of Math-v0 whose pool's mount helper is killed after its first call (as the OOM
# killer would): what the host then does with the episode's files, and what its next call becomes.
HELPER_KILLED_MID_EPISODE = r"""
import json, math, os, signal
import gymnasium as gym
import benchmax_gym
env = gym.make("benchmax/Math-v0", tool_timeout=60)
env.reset(seed=0)
python = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
first = env.step(python)[0]
box = env.unwrapped.episode.state["sandbox"]
helper = box._pool.mounts.proc.pid
os.kill(helper, signal.SIGKILL)
os.waitid(os.P_PID, helper, os.WEXITED | os.WNOWAIT)  # (dead, not reaped: as the pool finds it)
try:
    box.put_file("more.txt", b"from the host")
    put = None
except Exception as exc:
    put = [type(exc).__name__, isinstance(exc, FileNotFoundError), str(exc)]
obs, reward, terminated, truncated, info = env.step(python)
recorded = env.unwrapped.episode_record()["reward"] if "outcome" in info else "episode goes on"
print(json.dumps(["42" in first, put, info.get("outcome"), info.get("outcome_detail", obs), math.isnan(reward),
                  truncated, recorded]))
env.close()
"""


def test_an_episode_whose_mount_helper_died_fails_as_the_environments_failure(bubblewrap):
    """Episodes already running in a pool whose mount helper was killed lost the host's view of
    their files: their next call raised a bare FileNotFoundError under /proc/PID/root out of the
    tool, which the engine scored as the model's tool error. Now the call ends the episode as the
    environment's failure (env_error, no reward), saying the mount helper died, and the host's
    own file operations raise SandboxFilesLost saying so."""
    proc = _python(HELPER_KILLED_MID_EPISODE, user=_as_nobody(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    first_ok, put, outcome, detail, reward_nan, truncated, recorded = json.loads(out.splitlines()[-1])
    assert first_ok
    assert outcome == "env_error" and "mount helper" in detail, (outcome, detail)
    assert reward_nan and truncated and recorded is None
    assert put is not None and put[:2] == ["SandboxFilesLost", False] and "mount helper" in put[2], put


@ROOT_ONLY
def test_a_sandbox_refused_before_its_start_began_gives_back_its_uid(monkeypatch):
    """The uid was reserved before the arguments were read: ``Sandbox(preload=None)`` raised a
    TypeError with the uid still locked for the process's life (a band of one then had none
    left). Now nothing is held when the start fails, wherever it fails."""
    first = 4_000_000 + secrets.randbelow(1_000_000)  # a uid no other test uses (the lock file is shared)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", range(first, first + 1))
    monkeypatch.setattr(sandbox_module, "ID_FILES", {})
    with pytest.raises(TypeError):
        Sandbox(mode=RLIMITS, preload=None)
    with Sandbox(mode=RLIMITS, preload=("leftovers_probe",)) as box:
        assert box.uid == first


# The same, in an Excel-v0 episode whose next step only reads the workbook (no code runs): the
# host reads the sandbox's files itself, and a file it cannot find was the model's doing.
HELPER_KILLED_BEFORE_A_READ = r"""
import json, math, os, signal
import gymnasium as gym
import benchmax_gym
env = gym.make("benchmax/Excel-v0", tool_timeout=60)
env.reset(seed=0)
box = env.unwrapped.episode.state["sandbox"]
helper = box._pool.mounts.proc.pid
os.kill(helper, signal.SIGKILL)
os.waitid(os.P_PID, helper, os.WEXITED | os.WNOWAIT)
read = '<tool_call>{"name": "list_sheets", "arguments": {}}</tool_call>'
obs, reward, terminated, truncated, info = env.step(read)
print(json.dumps([info.get("outcome"), info.get("outcome_detail", obs), math.isnan(reward), truncated]))
env.close()
"""


def test_an_excel_episode_whose_mount_helper_died_fails_at_its_next_read(bubblewrap):
    """Excel's tools and grader read the workbook from the host, not through the sandbox's server:
    after the helper died, a read failed as the model's tool error (the workbook "no longer
    exists") and the episode went on to be graded 0. Now the step ends it as the environment's
    failure."""
    proc = _python(HELPER_KILLED_BEFORE_A_READ, user=_as_nobody(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    outcome, detail, reward_nan, truncated = json.loads(out.splitlines()[-1])
    assert outcome == "env_error" and "mount helper" in detail, (outcome, detail)
    assert reward_nan and truncated


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_walking_or_removing_a_workspace_closes_every_descriptor(tmp_path):
    """The walk closed every directory's descriptor but the root's: each episode's close (and
    each quota check) leaked one, so a long `benchmax-gym run` of a sandboxed env ended in
    "Too many open files" after ~1,000 episodes."""
    from benchmax_gym.core.sandbox import _workspace_usage, remove_tree

    before = _open_fds()
    for i in range(20):
        root = tmp_path / f"ws{i}"
        (root / "a" / "b").mkdir(parents=True)
        (root / "a" / "b" / "f.txt").write_text("x")
        assert _workspace_usage(root) > 0
        remove_tree(root)
        assert not root.exists()
    assert _open_fds() <= before


def test_episodes_of_a_sandboxed_env_hold_no_descriptor_after_they_end():
    env = gym.make("benchmax/Math-v0")
    env.reset(seed=0)
    before = _open_fds()
    for seed in range(1, 41):
        env.reset(seed=seed)  # the previous episode's sandbox closes
    assert _open_fds() <= before
    env.close()


def test_a_sandbox_the_collector_closes_while_this_thread_holds_a_sandbox_lock_closes_after_it():
    """The garbage collector runs finalizers in whichever thread allocates: a thread reserving a
    uid (its lock held) that collected a dropped env's episode closed its sandbox right there,
    and the close waited for that same lock for ever (a CI run hung in verl's tests: reset ->
    Sandbox() -> reserve -> gc -> finalizer -> Sandbox.close -> release). The close now waits
    until the thread lets go, then runs."""
    import gc
    import threading

    env = gym.make("benchmax/Math-v0")
    env.reset(seed=0)
    box = env.unwrapped.episode.state["sandbox"]
    seen = {}

    def reserving():
        nonlocal env
        with sandbox_module._critical(sandbox_module._UIDS.lock):  # as reserve() holds it
            env = None  # the env and its episode dropped without close()
            gc.collect()
            seen["closed while held"] = box._closed
        seen["closed after"] = box._closed

    worker = threading.Thread(target=reserving, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the close waited for the lock its own thread held"
    assert seen == {"closed while held": False, "closed after": True}
    assert box.uid is None or box.uid not in sandbox_module._UIDS.held  # its uid given back


# A pool without a tmpfs (where none can be mounted) holds its episodes' files in its own folder:
# this process writes some, closing a directory's modes as model code may, and is killed.
KILLED_WITH_A_POOL = r"""
import os, signal, sys
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, SandboxLimits, _Pool
pool = _Pool(BUBBLEWRAP, (), tmpfs=False)
if sys.argv[1] == "sweep":
    print(pool.dir, flush=True)
    pool.shut_down()
    raise SystemExit
box = Sandbox(limits=SandboxLimits(timeout=60), pool=pool)
result = box.run("import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x' * 1000)\nos.chmod('a', 0)\nprint('ok')")
assert result.stdout == "ok\n", result
print(pool.dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("user", ["host", "nobody"])
def test_a_process_killed_with_a_pool_leaves_its_folder_only_until_the_next_pool(bubblewrap, user):
    """A process killed with a sandbox pool (SIGKILL, the OOM killer) left its ``sandbox-*`` folder
    in the temp root for good, with its episodes' files where no tmpfs held them (one more per kill;
    the sweep saw only pools still mounted). Now the next process to make a pool there removes it."""
    prefix = _as_nobody() if user == "nobody" else []
    temp = Path(tempfile.mkdtemp(prefix="bmx-"))  # (not under pytest's folder: the sandbox's user must reach it)
    os.chmod(temp, 0o777)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": str(temp),
           "PYTHONPATH": os.path.dirname(os.path.dirname(benchmax_gym.__file__))}

    def run(kind):
        return subprocess.run([*prefix, sys.executable, "-c", KILLED_WITH_A_POOL, kind], capture_output=True,
                              text=True, env=env, cwd="/", timeout=240)

    try:
        killed = run("kill")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        left = Path(killed.stdout.strip())
        assert left.parent.parent == temp and left.name.startswith("benchmax-sandbox-p")
        assert left.is_dir() and os.listdir(left)  # (its episode's folder: nothing of the killed process removes it)
        sweep = run("sweep")
        assert sweep.returncode == 0, sweep.stderr[-3000:]
        assert not left.exists()
        assert os.listdir(left.parent) == []  # (the sweeping pool's own folder went at its shut-down)
    finally:
        sandbox_module.remove_tree(temp)
