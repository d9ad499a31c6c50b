"""What the library leaves in the temp directory after faults it claims to handle."""
import json
import os
import shutil
import signal
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


HELD_EPISODE_SCRIPT = """
import json, sys

import gymnasium as gym

import benchmax_gym  # noqa: F401

env = gym.make(sys.argv[2], **json.loads(sys.argv[3]))  # (no sandbox: its workspace is a temp folder)
env.reset(seed=0)
print("open", flush=True)
if sys.argv[1] == "hold":
    sys.stdin.readline()  # an episode open until this process is killed
env.close()
"""


def _workspaces(tmp, kind="excel"):
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(f"benchmax-{kind}-"))


@pytest.mark.parametrize("env_id, kwargs, kind", [("benchmax/Excel-v0", {"python_tool": False}, "excel"),
                                                  ("benchmax/MCP-v0", {}, "mcp")], ids=["excel", "mcp"])
def test_a_process_killed_mid_episode_leaves_its_workspace_only_until_the_next_one(tmp_path, tmp, env_id, kwargs,
                                                                                    kind):
    """A process with an Excel or MCP-v0 episode open SIGKILLed (the OOM killer, a timed-out job's
    kill) left its `benchmax-excel-*/workbook.xlsx` or `benchmax-mcp-*/workspace` for good, one more
    per kill; now the next process to open an episode removes it, and leaves a live process's
    workspace alone."""
    script = tmp_path / "held.py"
    script.write_text(HELD_EPISODE_SCRIPT)
    env = {**os.environ, "TMPDIR": str(tmp)}
    args = [sys.executable, str(script), "hold", env_id, json.dumps(kwargs)]
    held = [subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    try:
        for proc in held:
            assert proc.stdout.readline() == "open\n"
        before = _workspaces(tmp, kind)
        assert len(before) == 2, before
        held[0].kill()
        held[0].wait()
        assert _workspaces(tmp, kind) == before  # (nothing of the killed process removes it)
        args[2] = "once"
        out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        live = [name for name in before if f"-p{held[1].pid}-" in name]
        assert _workspaces(tmp, kind) == live and len(live) == 1, (_workspaces(tmp, kind), before)
    finally:
        for proc in held:
            proc.kill()
            proc.wait()


KILLED_RECALC_WORKER_SCRIPT = """
import os, signal, tempfile, threading, time

from benchmax_gym.envs.excel import recalc
from benchmax_gym.core.tempdirs import owned_tempdir

failed = []
started = threading.Event()  # the call's process forked and its pid answered: a kill from here on is mid-call
start = recalc._Worker.start
recalc._Worker.start = lambda worker: (start(worker), started.set())[0]


def call():
    try:
        recalc.run_in_process(time.sleep, (120,), 240, "a long call")
    except Exception as exc:
        failed.append(exc)


thread = threading.Thread(target=call)
thread.start()
started.wait()  # (a kill before the worker answers the fork is a worker gone idle: the call starts a fresh one)
assert [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("benchmax-excel-")]  # the call's own folder
os.kill(recalc._worker.proc.pid, signal.SIGKILL)  # the worker killed mid-call (the OOM killer)
thread.join()
print(type(failed[0]).__name__, failed[0])
recalc.stop_recalc_worker()  # the caller reaps its dead worker (as a next call would, before it starts one)
print(len([n for n in os.listdir(tempfile.gettempdir()) if n.startswith("benchmax-excel-")]))  # (no new worker swept)
print(recalc.run_in_process(abs, (-3,), 60, "the next call"))
recalc.stop_recalc_worker()
"""


def test_a_recalculation_worker_killed_mid_call_leaves_no_folder(tmp_path, tmp):
    """The recalculation worker makes a folder per call and removes it as it reaps the call; the
    worker SIGKILLed mid-call (its calls die with it) left that folder for good. Now its caller,
    which started it, removes what it owned once it has reaped it; the next call runs as ever."""
    script = tmp_path / "killed_worker.py"
    script.write_text(KILLED_RECALC_WORKER_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "TMPDIR": str(tmp)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["RecalcUnavailable the recalculation worker stopped during a long call", "0", "3"], \
        out.stdout + out.stderr[-3000:]
    assert _workspaces(tmp) == []


KILLED_INSIDE_SCRIPT = """
import os, signal, sys

import openpyxl, io
from benchmax_gym.envs.excel import recalc
from benchmax_gym.core.tempdirs import owned_tempdir

if sys.argv[1] == "sweep":
    print(owned_tempdir("excel").name)
    raise SystemExit
die = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)  # (the OOM killer, mid-work)
wb = openpyxl.Workbook()
wb.active["A1"] = "=1+1"
buffer = io.BytesIO()
wb.save(buffer)
if sys.argv[1] == "formulas":  # the recalculation in this process: the worker's warm-up, a trusted file
    recalc._solve = die
    recalc._formulas_values(buffer.getvalue(), {("Sheet", "A1")})
else:  # LibreOffice's recalculation
    recalc.soffice_executable = lambda: "/bin/true"
    recalc._run_soffice = die
    recalc._libreoffice_values(buffer.getvalue(), {("Sheet", "A1")})
"""


@pytest.mark.parametrize("where", ["formulas", "libreoffice"])
def test_a_process_killed_inside_a_recalculations_own_folder_leaves_it_only_until_the_next_one(tmp_path, tmp, where):
    """The worker's warm-up and a recalculation in the caller's own process (``formulas``), and
    LibreOffice's, worked in a ``TemporaryDirectory``: a kill inside it left the folder for good.
    Now it is named for its process, and the next process to make one removes it."""
    script = tmp_path / "killed_inside.py"
    script.write_text(KILLED_INSIDE_SCRIPT)
    env = {**os.environ, "TMPDIR": str(tmp)}
    killed = subprocess.run([sys.executable, str(script), where], capture_output=True, text=True, env=env, timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    left = _workspaces(tmp)
    assert len(left) == 1, left  # (the killed process's; nothing of it removes it)
    sweep = subprocess.run([sys.executable, str(script), "sweep"], capture_output=True, text=True, env=env, timeout=240)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert _workspaces(tmp) == [sweep.stdout.strip()]
