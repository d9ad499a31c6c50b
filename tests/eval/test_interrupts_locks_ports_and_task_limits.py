"""The eval command and API, round 5: Ctrl-C at any moment of a many-worker eval is one line
(the fork server and the workers never see it), the run directory is held by the API as well as
the CLI, a server's port in use names --port, and ``--tasks N`` builds only the tasks it needs."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from benchmax_gym.testing.openai_server import FakeChatServer

ENV = "benchmax/Math-v0"
CLI = [sys.executable, "-m", "benchmax_gym"]


def answer(body):
    return {"content": "\\boxed{0}"}


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}


def wait_for(condition, what, proc=None):
    """Poll ``condition`` (a state, not a duration: the deadline only stops a hung test)."""
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        assert proc is None or proc.poll() is None, f"the eval ended before: {what}"
        time.sleep(0.02)


def _processes() -> dict[int, tuple[int, str, int]]:
    """``{pid: (parent pid, state, session id)}`` of every process (from /proc)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    state, ppid, _, session = f.read().rpartition(")")[2].split()[:4]
            except OSError:
                continue
            table[int(name)] = (int(ppid), state, int(session))
    return table


def descendants(pid: int) -> set[int]:
    table, found, todo = _processes(), set(), [pid]
    while todo:
        parent = todo.pop()
        children = {p for p, (ppid, _, _) in table.items() if ppid == parent}
        todo += children - found
        found |= children
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def fork_server(pid: int) -> int | None:
    """The fork server ``pid`` started (its workers, forked from it, show its command line too)."""
    children = [p for p, (ppid, _, _) in _processes().items() if ppid == pid]
    return next((p for p in children if "multiprocess.forkserver" in cmdline(p)), None)


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


INTERRUPTED = re.compile(r"interrupted: (?:no episode done|(\d+)/40 done(?: \((\d+) in flight recorded as cancelled: "
                         r"resuming runs them again\))?); rerun the same command to resume")


# -- 1. Ctrl-C at any moment of eval --workers N ------------------------------------------------------


@pytest.mark.parametrize("moment", ["started", "fork server", "workers forked"])  # mid-run: test_eval_cli.py
def test_ctrl_c_at_any_moment_of_a_many_worker_eval_is_the_same_one_line(tmp_path, moment):
    """Ctrl-C reaches the whole process group (the fork server and the workers too). While the
    fork server imported its preload it died of it, and the parent's next worker start failed
    with a bare EOFError traceback; right after start it was a KeyboardInterrupt traceback."""
    out = tmp_path / "run"
    args = ["eval", ENV, "--model", "test-model", "--tasks", "40", "--concurrency", "4", "--workers", "2",
            "--out", str(out), "--env-arg", "python_tool=false", "--quiet", "--no-plots"]
    if moment == "started":  # as soon as the command has read its arguments: --import runs first
        (tmp_path / "ctrl_c_now.py").write_text("import os, signal\nos.killpg(os.getpgrp(), signal.SIGINT)\n")
        args = ["--import", "ctrl_c_now", *args]
    with FakeChatServer(answer, latency=0.5) as server:
        proc = subprocess.Popen([*CLI, *args, "--base-url", server.url], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**clean_env(), "PYTHONPATH": str(tmp_path)},
                                start_new_session=True)  # its own group, as a terminal's foreground job
        try:
            if moment == "fork server":  # while it imports its preload
                wait_for(lambda: fork_server(proc.pid), "the fork server started", proc)
            elif moment == "workers forked":
                wait_for(lambda: (server_pid := fork_server(proc.pid)) and descendants(server_pid),
                         "a worker forked", proc)
            if moment != "started":
                os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole group
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err and "Error" not in err, err[-3000:]
    said = err.strip()
    found = INTERRUPTED.fullmatch(said)
    assert found and len(said.splitlines()) == 1, said[-3000:]
    records = [json.loads(line) for line in lines(out / "rollouts.jsonl")]  # what was written is kept, whole
    cancelled = [r for r in records if r["outcome"] == "cancelled"]
    if found[1] is not None:
        assert int(found[1]) == len(records) - len(cancelled) and int(found[2] or 0) == len(cancelled)
    else:
        assert not records
    if moment == "started":
        assert not out.exists()  # nothing was started: nothing left behind
    # nothing it started goes on running (the fork server, the workers: all in its session)
    wait_for(lambda: not [p for p, (_, state, session) in _processes().items()
                          if session == proc.pid and state not in "ZX"], "its processes ended")


# -- 2. the run directory is held by the API, not only by the CLI -----------------------------------


def test_two_api_callers_into_one_run_directory_the_second_is_refused(tmp_path):
    """Two callers of :func:`evaluate` writing one run directory at once each ran every pair: the
    run held every episode twice and could no longer be read. The second is refused, naming it."""
    import threading

    from benchmax_gym.eval import EvalError, evaluate, load_run

    out = tmp_path / "run"
    started, release, result = threading.Event(), threading.Event(), {}

    def policy(obs, info):  # the first caller's episodes wait until told
        if threading.current_thread() is first:
            started.set()
            release.wait(120)
        return "\\boxed{0}"

    settings = {"env_kwargs": {"python_tool": False}, "tasks": 3, "concurrency": 1, "out": out}
    first = threading.Thread(target=lambda: result.update(run=evaluate(ENV, policy, **settings)))
    first.start()
    try:
        assert started.wait(120), "the first eval never started an episode"
        with pytest.raises(EvalError, match=f"^--out {re.escape(str(out))}: another eval is writing this run now"):
            evaluate(ENV, policy, **settings)
    finally:
        release.set()
        first.join(120)
    assert result["run"].summary["episodes"] == 3
    run, records = load_run(out)  # (it could not be read: pairs recorded twice)
    assert sorted((r["task_index"], r["sample"]) for r in records) == [(0, 0), (1, 0), (2, 0)]
    # held only while written: the next caller resumes it (nothing left to run)
    assert evaluate(ENV, policy, **settings).summary["episodes"] == 3


def test_the_api_makes_the_run_directory_and_removes_it_when_refused_before_writing(tmp_path):
    from benchmax_gym.eval import EvalError, evaluate

    out = tmp_path / "new" / "run"
    with pytest.raises(EvalError, match="--tasks"):
        evaluate(ENV, "solver", tasks="abc", out=out)
    assert not any(tmp_path.iterdir())  # the folders it made, empty, are gone
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(EvalError, match=f"^--out {re.escape(str(a_file / 'run'))}: cannot make the run directory "
                                        r"\(.*Not a directory\)"):
        evaluate(ENV, "solver", tasks=2, out=a_file / "run")


# -- 3. a server's port in use: one line naming --port -----------------------------------------------


@pytest.mark.parametrize("command", [["mcp-serve", ENV, "--transport", "http"], ["openenv-serve", ENV]])
def test_a_port_in_use_is_one_line_naming_the_port_and_the_option(command):
    """uvicorn said ``ERROR: [Errno 98] error while attempting to bind on address (...)`` and
    exited 3: no option named, another exit status than every other bad argument's."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([*CLI, *command, "--port", str(port)], capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL)
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    said = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert said[0].startswith(f"benchmax-gym: error: --port {port}: the port is in use on 127.0.0.1"), said[0]
    assert "choose another with --port" in said[0]


def test_serve_api_refuses_a_port_in_use_before_making_the_env():
    import socket

    from benchmax_gym.serve import ListenError, serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f"^--port {port}: the port is in use"):  # (not the env's error:
            serve("benchmax/Math-v0", "http", port=port, env_kwargs={"tasks": []})  # no tasks, it was never made)


# -- 4. --tasks N builds only the tasks it needs -----------------------------------------------------


def qa_file(path, n, blank=None):
    """A question/answer file (``tasks="hf"``); record ``blank`` has a blank answer, which fails
    the env's make when that task is built."""
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
    if blank is not None:
        rows[blank]["answer"] = " "
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"tasks": "hf", "task_args": {"dataset": str(path)}, "python_tool": False}


def test_tasks_n_builds_only_the_first_n_tasks_of_a_file_the_same_ones(tmp_path):
    """Every env of the eval (here in two worker processes too) built every task of the file
    before the first N were taken: a large file cost seconds and memory in each. A task past the
    first N that cannot be built shows it: only the whole file fails."""
    import gymnasium as gym

    from benchmax_gym.eval import EvalError, evaluate

    whole = gym.make(ENV, **qa_file(tmp_path / "clean.jsonl", 200)).unwrapped.tasks
    kwargs = qa_file(tmp_path / "qa.jsonl", 200, blank=150)
    with pytest.raises(ValueError, match="qa.jsonl' line 151: "):
        gym.make(ENV, **kwargs)  # the whole file builds task 150
    result = evaluate(ENV, "solver", env_kwargs=kwargs, tasks=5, concurrency=2, workers=2, out=tmp_path / "run")
    assert [r["task_id"] for r in result.records] == [whole[i].id.replace("clean", "qa") for i in range(5)] \
        == [f"qa-{i}" for i in range(5)]
    assert all(r["outcome"] == "scored" and r["success"] for r in result.records)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["env_kwargs"] == kwargs  # as given
    sliced = evaluate(ENV, "solver", env_kwargs=kwargs, tasks="2:5")
    assert [r["task_id"] for r in sliced.records] == ["qa-2", "qa-3", "qa-4"]
    # the source's own limit still bounds what there is
    limited = {**kwargs, "task_args": {**kwargs["task_args"], "limit": 3}}
    with pytest.raises(EvalError, match="within the 3 tasks"):
        evaluate(ENV, "solver", env_kwargs=limited, tasks=5)
    with pytest.raises(ValueError, match="qa.jsonl' line 151: "):
        evaluate(ENV, "solver", env_kwargs=kwargs, tasks="all")  # every task: built, as before


def test_a_run_recorded_with_the_whole_sources_task_set_still_resumes(tmp_path):
    """A run written before eval cut sources recorded the task set of the whole file; its
    resume is not refused as if the tasks had changed (and tasks that did change still are)."""
    import gymnasium as gym

    from benchmax_gym.eval import EvalError, evaluate

    kwargs = qa_file(tmp_path / "qa.jsonl", 20)
    out = tmp_path / "run"
    evaluate(ENV, "solver", env_kwargs=kwargs, tasks=3, out=out)
    whole = gym.make(ENV, **kwargs).unwrapped.tasks.content_hash()
    saved = json.loads((out / "run.json").read_text())
    assert saved["task_set"] != whole  # the run's: its 3 tasks'
    (out / "run.json").write_text(json.dumps({**saved, "task_set": whole}))
    rollouts = out / "rollouts.jsonl"
    rollouts.write_text("".join(line + "\n" for line in lines(rollouts)[:2]))
    resumed = evaluate(ENV, "solver", env_kwargs=kwargs, tasks=3, out=out)
    assert [r["task_id"] for r in resumed.records] == ["qa-0", "qa-1", "qa-2"]
    assert json.loads((out / "run.json").read_text())["task_set"] == whole  # (its own, kept)
    (out / "run.json").write_text(json.dumps({**saved, "task_set": "sha256:" + "0" * 32}))
    with pytest.raises(EvalError, match="over other tasks"):
        evaluate(ENV, "solver", env_kwargs=kwargs, tasks=3, out=out)
