"""TRL on several processes when one process raises where the others wait at a gather (an env's
reset or step, a reward function, a value that cannot be pickled for a gather): every process
stops with that process's error, none waits forever at the gather the failing process never
reached. A real two-process GRPOTrainer on CPU (gloo, loopback only), one launch for every test
here: ``trl_two_processes.py OUT_DIR failures``."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each of the two processes' runs raised (``failures<k>.json``, written after each run:
    a run that hangs leaves the earlier ones'). The launch may take minutes on a loaded machine; it
    is stopped once nothing new appears in its folder (a run starting or ending) for 120 s."""
    out = tmp_path_factory.mktemp("trl-failures")
    root = Path(__file__).resolve().parents[2]
    lo = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), "lo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
            "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": lo, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    script = Path(__file__).with_name("trl_two_processes.py")
    logs = [out / f"log{r}" for r in range(2)]
    procs = []
    for r, log in enumerate(logs):
        with log.open("w") as stdout:
            procs.append(subprocess.Popen([sys.executable, str(script), str(out), "failures"], cwd=root,
                                          stdout=stdout, stderr=subprocess.STDOUT,
                                          env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}))
    try:
        seen, last = set(), time.monotonic()
        while any(p.poll() is None for p in procs):
            now = {path.name for path in out.iterdir()}
            if now - seen:
                seen, last = seen | now, time.monotonic()
            elif time.monotonic() - last > 120:
                break  # a hang: the tests of the runs that never ended fail
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    # Each process writes what it raised before it exits; its exit status is not what is tested
    # (gloo's teardown after a failed collective aborted once in ~50 launches, results written).
    missing = [r for r in range(2) if not (out / f"failures{r}.json").exists()]
    assert not missing, "\n".join(log.read_text()[-3000:] for log in logs)
    return [json.loads((out / f"failures{r}.json").read_text()) for r in range(2)]


def _both(raised, run):
    """What each process's ``run`` raised; a run a process never ended hung."""
    assert all(run in r for r in raised), f"run {run!r} never ended on every process: a process hangs at a gather"
    return raised[0][run], raised[1][run]


@pytest.mark.parametrize("run, call", [("reset", "reset"), ("step", "step"), ("reward", "step")])
def test_every_process_raises_the_failing_processs_error(raised, run, call):
    """reset: process 0 is on to the first round's gather (the trainer's generation, in lock-step);
    step: to the group gather (a generate of its own); reward: Env.reward's group gather. Each
    process raises an error naming process 1 and its own message; on process 1 the original
    exception is its cause."""
    zero, one = _both(raised, run)
    message = f"{call}: the task store at 10.0.0.7 is unreachable"
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed"
        assert "process 1 " in error["message"] and f"ConnectionError: {message}" in error["message"]
        assert "process 0 " not in error["message"]
    assert one["cause"] == message and zero["cause"] is None


@pytest.mark.parametrize("run", ["judge", "env_judge"])
def test_a_reward_function_raising_on_one_process_stops_every_process(raised, run):
    """The user's own reward function (passed with the env's: TRLRollout's, Env.reward) raises on
    process 1 only, where process 0 is on to TRL's gather of the rewards. Both raise an error
    naming process 1, its exception and the function; on process 1 the original exception is its
    cause. With environment_factory it raises at the second step (Env.reward sees the trainer at
    the first): the first step trains as before, on both."""
    zero, one = _both(raised, run)
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed"
        assert "process 1 raised ConnectionError: the judge at 10.0.0.7 is unreachable (reward function 'judge')" \
            in error["message"]
        assert "process 0 " not in error["message"]
    assert one["cause"] == "the judge at 10.0.0.7 is unreachable" and zero["cause"] is None
    if run == "env_judge":
        for rank in range(2):
            assert [c["step"] for c in raised[rank]["judge_calls"] if c["environments"]] == [0, 1]


def test_a_record_that_cannot_be_pickled_stops_every_process_naming_it(raised):
    """Process 1's record of group b (split over the processes: scored on process 0) holds a lock:
    process 1 cannot send it to the group gather process 0 waits at. Both raise an error naming
    process 1 and where the value it could not send is; on process 1 the pickling error is its
    cause."""
    zero, one = _both(raised, "unsendable")
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed"
        assert "process 1 raised TypeError: could not send the payload['samples'][0].record['trace'] (lock)" \
            in error["message"]
        assert "cannot pickle '_thread.lock' object" in error["message"]
        assert "process 0 " not in error["message"]
    assert "cannot pickle '_thread.lock' object" in one["cause"] and zero["cause"] is None
