"""TRL on several processes when one process raises outside generation (an env's reset or step, a
reward function): every process stops with that process's error, none waits forever at the
gather the failing process never reached. A real two-process GRPOTrainer on CPU (gloo, loopback
only): ``trl_two_processes.py OUT_DIR failures``."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each of the two processes' three runs raised (``failures<k>.json``), process 1's env
    raising: in ``reset`` (the trainer's own generation), in ``step`` (a generate of its own), in
    ``Env.reward`` (``environment_factory``). Both processes must end within 120 s."""
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
    procs = [subprocess.Popen([sys.executable, str(script), str(out), "failures"], cwd=root, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    logs = []
    try:
        for p in procs:
            try:
                logs.append(p.communicate(timeout=120)[0])
            except subprocess.TimeoutExpired:
                pytest.fail("a process still waits after 120 s: it hangs at a gather")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    # Each process writes what it raised before it exits; its exit status is not what is tested
    # (gloo's teardown after a failed collective aborted once in ~50 launches, results written).
    missing = [r for r in range(2) if not (out / f"failures{r}.json").exists()]
    assert not missing, "\n".join(log[-3000:] for log in logs)
    return [json.loads((out / f"failures{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("run, call", [("reset", "reset"), ("step", "step"), ("reward", "step")])
def test_every_process_raises_the_failing_processs_error(raised, run, call):
    """reset: process 0 is on to the first round's gather (the trainer's generation, in lock-step);
    step: to the group gather (a generate of its own); reward: Env.reward's group gather. Each
    process raises an error naming process 1 and its own message; on process 1 the original
    exception is its cause."""
    zero, one = raised[0][run], raised[1][run]
    message = f"{call}: the task store at 10.0.0.7 is unreachable"
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed"
        assert "process 1 " in error["message"] and f"ConnectionError: {message}" in error["message"]
        assert "process 0 " not in error["message"]
    assert one["cause"] == message and zero["cause"] is None
