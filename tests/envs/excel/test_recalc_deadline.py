"""A model's formulas are recalculated in a process of their own, killed at the deadline: a formula
that spends its time inside one C call (``re`` backtracking on COUNTIF's wildcards, holding the
interpreter lock) or that never reaches a check of the deadline cannot keep a worker's CPU, memory
or interpreter lock after its tool call (or grade) returned; one that needs too much memory is a
clear error; and the recalculation process does not outlive the process that uses it."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import openpyxl
import pytest

import benchmax_gym
from benchmax_gym.envs.excel import recalc
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import _compute, recalculate

# Python's re turns COUNTIF's wildcards into ".*a.*a...b": on 64 letters it backtracks for minutes
# in one C call that holds the interpreter lock (no deadline check runs, no thread can give up).
WILDCARD = '=COUNTIF({},"*a*a*a*a*a*a*a*a*b")'


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def to_bytes(wb) -> bytes:
    buffer = io.BytesIO()
    wb.save(buffer)
    return buffer.getvalue()


def small_env(tmp_path, **kwargs):
    """Excel-v0 on one task whose answer is 6 at Sheet!E1 (Sheet!A1:A3 holds 1, 2, 3)."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet"
    ws["A1"], ws["A2"], ws["A3"] = 1, 2, 3
    wb.save(tmp_path / "in.xlsx")
    ws["E1"] = 6
    wb.save(tmp_path / "answer.xlsx")
    spec = {"workbook": str(tmp_path / "answer.xlsx"), "position": "'Sheet'!E1"}
    files = {"workbook.xlsx": str(tmp_path / "in.xlsx")}
    task = benchmax_gym.Task("t", "Fill E1.", answer=spec, solution=spec, files=files)
    env = gym.make("benchmax/Excel-v0", tasks=[task], python_tool=False, **kwargs)
    env.reset(seed=0)
    return env


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` and that still run."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def nothing_runs_on(threads_before: set[threading.Thread]) -> None:
    """No recalculation thread (started since ``threads_before``) and no call's process is left
    running."""
    assert not [t.name for t in set(threading.enumerate()) - threads_before if t.name == "excel-deadline"]
    worker = recalc._worker
    assert worker is not None and worker.proc.poll() is None
    # (an earlier call's process, killed as its result came, may take a moment to be reaped)
    assert wait_for(lambda: children(worker.proc.pid) == [], limit=5)


def wait_for(predicate, limit=60.0):
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


# --------------------------------------------------------------------------- the deadline


def test_one_c_call_past_the_deadline_is_a_tool_timeout_and_leaves_nothing_running(tmp_path):
    env = small_env(tmp_path, tool_timeout=2)
    cells = {"A1": "a" * 64, "B1": WILDCARD.format("A1")}
    obs, _, _, _, info = env.step(call("write_cells", sheet="Sheet", cells=cells))
    assert info["error"] is None, obs
    threads, started = set(threading.enumerate()), time.monotonic()
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="B1"))
    assert info["error"] == "tool_timeout" and "took over 2 s" in obs, obs
    assert time.monotonic() - started < 60  # a hang guard: the call held the interpreter lock for minutes
    nothing_runs_on(threads)
    # the episode goes on, and the next recalculation has the machine to itself
    obs, _, _, _, info = env.step(call("write_cells", sheet="Sheet", cells={"B1": "=LEN(A1)+SUM(A2:A3)"}))
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="B1"))
    assert info["error"] is None and "B1: =LEN(A1)+SUM(A2:A3) -> 69" in obs, obs
    env.close()


def test_work_that_never_reaches_a_check_stops_at_the_deadline():
    """COUNTIF over 200 such cells returned at the deadline, but its thread ran on for ~20 s
    (taking the interpreter lock from the next call, which took 9 s instead of 0.02)."""
    wb = openpyxl.Workbook()
    ws = wb.active
    for row in range(1, 201):
        ws[f"A{row}"] = "a" * 35
    ws["B1"] = WILDCARD.format("A1:A200")
    answer = openpyxl.Workbook()
    answer.active["B1"] = 200
    threads = set(threading.enumerate())
    result = grade(to_bytes(wb), to_bytes(answer), "B1", time_limit=1)
    assert result.cells == 0.0 and any("took over 1 s" in note for note in result.notes), result.notes
    nothing_runs_on(threads)
    ws["B1"] = "=COUNTIF(A1:A200,A1)"
    assert grade(to_bytes(wb), to_bytes(answer), "B1", time_limit=30).solved


# --------------------------------------------------------------------------- memory


def long_texts(rows=50, width=10_000):
    """Each pair of 50 texts of 10,000 characters joined: ~50 MB to recalculate."""
    cells = {f"A{row}": f'=REPT(CHAR({65 + row % 26}),{width})' for row in range(1, rows + 1)}
    cells["B1"] = f"=SUMPRODUCT(LEN(A1:A{rows}&TRANSPOSE(A1:A{rows})))"
    return cells


def test_formulas_that_need_too_much_memory_are_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(recalc, "RECALC_MEMORY_BYTES", 30 * 2**20)
    env = small_env(tmp_path, tool_timeout=30)
    obs, _, _, _, info = env.step(call("write_cells", sheet="Sheet", cells=long_texts()))
    assert info["error"] is None, obs
    threads = set(threading.enumerate())
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="B1"))
    assert info["error"] == "workbook_too_large", obs
    assert "the workbook's formulas need more than 30 MB of memory" in obs, obs
    nothing_runs_on(threads)
    env.close()


def test_the_memory_error_is_the_callers_limit_not_a_silent_error_value(monkeypatch):
    """``formulas`` makes a function's MemoryError the cell's #VALUE!: the limit must still show."""
    wb = openpyxl.Workbook()
    for key, value in long_texts().items():
        wb.active[key] = value
    assert recalculate(to_bytes(wb), ranges=[("Sheet", "B1")], time_limit=60) == {("Sheet", "B1"): 50_000_000}
    monkeypatch.setattr(recalc, "RECALC_MEMORY_BYTES", 30 * 2**20)
    with pytest.raises(recalc.MemoryLimitExceeded, match="need more than 30 MB of memory"):
        recalculate(to_bytes(wb), ranges=[("Sheet", "B1")], time_limit=60)
    answer = openpyxl.Workbook()
    answer.active["B1"] = 50_000_000
    result = grade(to_bytes(wb), to_bytes(answer), "B1", time_limit=60)
    assert result.cells == 0.0, result
    assert any("need more than 30 MB of memory" in note for note in result.notes), result.notes


def test_a_call_killed_from_outside_is_a_clear_error_not_an_eof():
    """As the kernel's out-of-memory killer would: the caller says what happened."""
    wb = openpyxl.Workbook()
    wb.active["A1"] = "a" * 3000
    wb.active["B1"] = WILDCARD.format("A1")  # runs until killed
    data = to_bytes(wb)
    assert wait_for(lambda: children(recalc._the_worker().proc.pid) == [], limit=5)
    outcome = []

    def run():
        try:
            outcome.append(recalculate(data, time_limit=120))
        except Exception as exc:  # noqa: BLE001 - what the caller sees
            outcome.append(exc)

    caller = threading.Thread(target=run)
    threads = set(threading.enumerate())
    caller.start()
    assert wait_for(lambda: children(recalc._worker.proc.pid))
    os.kill(children(recalc._worker.proc.pid)[0], signal.SIGKILL)
    caller.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], recalc.MemoryLimitExceeded), outcome
    assert "killed (SIGKILL)" in str(outcome[0]) and "out of memory" in str(outcome[0])
    nothing_runs_on(threads)
    wb.active["B1"] = "=LEN(A1)"
    assert recalculate(to_bytes(wb), time_limit=30) == {("Sheet", "B1"): 3000}


# --------------------------------------------------------------------------- the worker's life


def test_the_worker_stops_when_its_process_dies(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "import io, sys, openpyxl\n"
        "from benchmax_gym.envs.excel import recalc\n"
        "wb = openpyxl.Workbook(); wb.active['A1'] = 'a' * 3000\n"
        f"wb.active['B1'] = {WILDCARD.format('A1')!r}\n"
        "buffer = io.BytesIO(); wb.save(buffer)\n"
        "print(recalc._the_worker().proc.pid, flush=True)\n"
        "recalc.recalculate(buffer.getvalue(), time_limit=600)\n"
    )
    root = Path(benchmax_gym.__file__).resolve().parents[1]
    user = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        worker = int(user.stdout.readline())
        assert wait_for(lambda: children(worker))  # the call is running
        call_process = children(worker)[0]
    finally:
        user.kill()  # as an OOM kill or a crash would: no atexit, no finally
        user.wait()
        user.stdout.close()
    assert wait_for(lambda: not alive(worker) and not alive(call_process)), "the worker outlived its process"


def run_script(script: Path) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter of its own, importing this checkout's package."""
    root = Path(benchmax_gym.__file__).resolve().parents[1]
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_the_worker_stops_when_the_last_env_closes(tmp_path):
    """Closing the envs leaves no process behind (the contract): the last Excel env of the
    process to close stops the worker at once, not after its idle time (60 s). (In a process of
    its own: this one's other tests may hold Excel envs.)"""
    script = tmp_path / "envs.py"
    script.write_text(
        "import time, gymnasium as gym, benchmax_gym\n"
        "from benchmax_gym.envs.excel import recalc\n"
        "first, second = gym.make('benchmax/Excel-v0'), gym.make('benchmax/Excel-v0')\n"
        "import io, openpyxl\n"
        "wb = openpyxl.Workbook(); wb.active['A1'] = 2; wb.active['A2'] = '=A1*21'\n"
        "buffer = io.BytesIO(); wb.save(buffer)\n"
        "assert recalc.recalculate(buffer.getvalue(), time_limit=30) == {('Sheet', 'A2'): 42}\n"
        "worker = recalc._worker.proc\n"
        "first.close(); time.sleep(0.5)\n"
        "print(worker.poll() is None)\n"
        "second.close()\n"
        "print(worker.poll() is not None, flush=True)\n"
    )
    out = run_script(script)
    assert out.returncode == 0, out.stderr[-3000:]
    held, stopped = out.stdout.split()
    assert held == "True", "the worker stopped while an env still held it"
    assert stopped == "True", "the worker outlived the last env"


def test_the_worker_works_for_a_process_with_many_open_files(tmp_path):
    """A vector worker or a test runner may hold over 1,024 descriptors: the worker's channel
    then has a number past select()'s FD_SETSIZE, and the worker died at its first wait."""
    script = tmp_path / "busy.py"
    script.write_text(
        "import io, os, openpyxl, resource\n"
        "from benchmax_gym.envs.excel import recalc\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))\n"
        "held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]\n"
        "wb = openpyxl.Workbook(); wb.active['A1'] = 2; wb.active['A2'] = '=A1*21'\n"
        "buffer = io.BytesIO(); wb.save(buffer)\n"
        "print(recalc.recalculate(buffer.getvalue(), time_limit=60))\n"
    )
    out = run_script(script)
    assert out.returncode == 0 and out.stdout.strip() == "{('Sheet', 'A2'): 42.0}", out.stderr[-3000:]


def test_a_grader_whose_worker_cannot_start_fails_the_episode_never_scores_0(tmp_path, monkeypatch):
    """The recalculation's machinery failing is not the model's doing: the episode ends
    env_error with no reward (it graded 0, 'output workbook could not be read')."""
    recalc.stop_recalc_worker()
    env = small_env(tmp_path, tool_timeout=30)
    try:
        env.step(call("write_cells", sheet="Sheet", cells={"E1": "=SUM(A1:A3)"}))
        monkeypatch.setattr(recalc, "_BOOT", "import sys; sys.exit(3)")
        _, reward, terminated, truncated, info = env.step("<answer>done</answer>")
        assert info["outcome"] == "env_error" and reward != reward, (reward, info.get("outcome_detail"))
        assert "the recalculation worker did not start" in info["outcome_detail"]
    finally:
        monkeypatch.undo()
        env.close()


# --------------------------------------------------------------------------- the ordinary path


def test_spreadsheetbench_workbooks_recalculate_as_they_did_in_process(shared_data):
    """Values and notes (formulas' warnings, unparsable formulas, external references) are those
    of the recalculation in the caller's own process."""
    temporary = re.compile(r"benchmax-excel-[^/]+")  # where the workbook was copied to be read
    for task in ("10452", "208-20", "48799", "532-24"):
        folder = shared_data / "spreadsheetbench" / "spreadsheet" / task
        data = (folder / f"1_{task}_answer.xlsx").read_bytes()
        wb = openpyxl.load_workbook(io.BytesIO(data))
        formats = {(ws.title, c.coordinate): c.number_format for ws in wb.worksheets
                   for row in ws.iter_rows() for c in row if c.data_type == "f"}
        here = _compute(data, "auto", formats, wb.epoch)
        apart = _compute(data, "auto", formats, wb.epoch, time_limit=30)
        assert formats and apart[0] == here[0], task
        assert [temporary.sub("X", n) for n in apart[1]] == [temporary.sub("X", n) for n in here[1]], task
