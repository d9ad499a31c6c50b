"""A SubprocVectorEnv whose process is killed (SIGKILL, the OOM killer) leaves no worker and no
workspace: a forked worker held the parent's end of its own pipe (and its siblings'), so the
parent's death never showed as the end of its input and it waited for ever, with its envs' temp
root (and an Excel env's workbook in it). A fork server's socket and its ``pymp-*`` directory,
which the killed parent would have removed at its exit, go too."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, signal, sys
import gymnasium as gym
import psutil
import benchmax_gym
from benchmax_gym.wrappers import SubprocVectorEnv

envs = SubprocVectorEnv(sys.argv[1], 2, num_workers=2, context=sys.argv[2])
envs.reset(seed=0)
print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]), flush=True)  # (workers, a fork server)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def tmp():
    """An empty temp directory for the run, its path short enough for a fork server's socket."""
    path = Path(tempfile.mkdtemp(prefix="bmx-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_of_a_killed_parent_stop_and_leave_no_workspace(tmp, context):
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", SCRIPT, "benchmax/Excel-v0", context], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == -9, out.stderr[-2000:]
    workers = [psutil.Process(pid) for pid in json.loads(out.stdout.splitlines()[-1]) if psutil.pid_exists(pid)]
    _, alive = psutil.wait_procs(workers, timeout=30)
    for p in alive:  # (not left running for the rest of the suite)
        p.kill()
    assert not alive, f"{[p.name() for p in alive]} still running after their parent was killed"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in tmp.iterdir() if p.name.startswith("benchmax-")]:
        time.sleep(0.1)
    assert not [p.name for p in tmp.iterdir()]  # (nor a fork server's pymp-* and its socket)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polled (no pidfd)"])
def test_a_workers_loop_stops_when_its_owner_ends(monkeypatch, pidfd):
    """The watch itself, where the platform has a pidfd and where it has not (then polled): the
    loop runs until the owner process ends, then stops."""
    import asyncio

    from benchmax_gym.wrappers import worker

    if not pidfd:
        def no_pidfd(pid):
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
        monkeypatch.setattr(worker, "OWNER_POLL_S", 0.05)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    loop = asyncio.new_event_loop()
    try:
        fd = worker._watch_owner(loop, owner.pid)
        assert (fd is not None) == pidfd
        loop.call_later(0.3, lambda: (owner.kill(), owner.wait()))  # (running until then; reaped, as a
        # dead vector env's process is by its own parent)
        loop.call_later(30, loop.stop)  # (a hang guard)
        started = time.monotonic()
        loop.run_forever()
        owner.wait()
        assert time.monotonic() - started < 20, "the loop ran on after its owner ended"
    finally:
        owner.kill()
        owner.wait()
        loop.close()
        if pidfd and fd is not None:
            os.close(fd)
