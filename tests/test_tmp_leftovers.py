"""What the library leaves in the temp directory after faults it claims to handle."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.eval.test_eval import ORPHAN_SCRIPT, _lines


@pytest.fixture
def tmp():
    """An empty temp directory for the run, short enough a path for its sockets (a run's
    ``tmp_path`` under pytest-xdist is past AF_UNIX's 108 bytes: the fork server cannot start)."""
    path = Path(tempfile.mkdtemp(prefix="bmx-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_eval_parent_killed_mid_run_leaves_no_pymp_directory(tmp_path, tmp):
    """An eval parent SIGKILLed (an OOM kill) with ``workers=2``: once its fork server and
    workers have stopped, nothing of the run is left in the temp directory (each such run left
    a ``pymp-*`` directory holding the fork server's socket, one more for every crash)."""
    script = tmp_path / "orphans.py"
    script.write_text(ORPHAN_SCRIPT)
    calls = tmp_path / "calls"
    run = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stderr=subprocess.DEVNULL,
                           env={**os.environ, "BMX_TEST_CALLS": str(calls), "TMPDIR": str(tmp)})
    try:
        children = []
        for _ in range(1200):  # (a hang guard: the workers start in moments)
            if len({line.split()[0] for line in _lines(calls)}) >= 2:
                children = psutil.Process(run.pid).children(recursive=True)
                break
            time.sleep(0.1)
        assert any(p.pid == int(line.split()[0]) for p in children for line in _lines(calls))
        assert list(tmp.glob("pymp-*")), "the run's fork server socket is where this test looks"
    finally:
        run.kill()
        run.wait()
    gone, alive = psutil.wait_procs(children, timeout=60)
    for proc in alive:
        proc.kill()
    assert not alive, "the run's processes outlived it"
    assert [p.name for p in tmp.iterdir()] == []


KILLED_WORKER_SCRIPT = """
import os, signal

from benchmax_gym.eval import evaluate


def answer(obs, info):  # an eval worker killed mid-episode, its workbook copied (as by the OOM killer)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    try:
        evaluate("benchmax/Excel-v0", answer, env_kwargs={"python_tool": False}, tasks=2, workers=2)
    except RuntimeError as exc:
        print(exc)
"""


def test_an_eval_worker_killed_mid_episode_leaves_no_workspace(tmp_path, tmp):
    """``workers=2`` and a worker killed with an Excel episode open (the OOM killer, or the
    parent's kill of a worker that did not stop within 10 s of a Ctrl-C): the run says so, and
    the copies of the workbooks that worker made are removed (each stayed in the temp directory
    as ``benchmax-excel-*/workbook.xlsx``)."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED_WORKER_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "TMPDIR": str(tmp)})
    assert "an eval worker failed" in out.stdout and "exited (status -9)" in out.stdout, out.stdout + out.stderr[-3000:]
    assert [p.name for p in tmp.rglob("*") if p.name.startswith("benchmax-")
            and not p.name.startswith("benchmax-gym-")] == []
