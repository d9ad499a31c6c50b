"""Starting the servers and commands: the port a server is given is held from its first moment
(another server cannot take it while the environment is made), and bad input met while
starting is one line naming the argument."""

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import benchmax_gym

CLI = [sys.executable, "-m", "benchmax_gym"]
ROOT = os.path.dirname(os.path.dirname(benchmax_gym.__file__))  # (this checkout's, in a subprocess run elsewhere)

GATED_ENV = '''
"""benchmax/Math-v0 whose making waits until the test says so (it announces that it is making)."""
import os, time
import gymnasium as gym

def make(**kwargs):
    open(os.environ["GATE"] + ".making", "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["GATE"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return gym.make("benchmax/Math-v0", python_tool=False).unwrapped

gym.register("gated/Math-v0", entry_point=make)
'''


def wait_for(condition, what, proc):
    deadline = time.monotonic() + 120  # (only stops a hung test)
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        assert proc.poll() is None, f"the server ended before: {what}: {proc.stderr.read()[-3000:]}"
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", [["mcp-serve", "gated/Math-v0", "--transport", "http"],
                                     ["openenv-serve", "gated/Math-v0"]], ids=["mcp-serve", "openenv-serve"])
def test_a_server_holds_its_port_from_the_start_another_cannot_take_it_while_the_env_is_made(tmp_path, command):
    """The port was only bound (mcp-serve) or checked and let go (openenv-serve) while the
    environment was made: another server (SO_REUSEADDR, as uvicorn's) took it meanwhile, and
    mcp-serve died of uvicorn's failed listen with a traceback, openenv-serve said the port was
    in use only after making everything. Now it listens from the start."""
    (tmp_path / "gated_env.py").write_text(GATED_ENV)
    gate = tmp_path / "gate"
    for _ in range(3):  # (a port found free and let go may be taken by another test's server first)
        port = free_port()
        proc = subprocess.Popen([*CLI, "--import", "gated_env", *command, "--port", str(port)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path, env={**os.environ, "GATE": str(gate),
                                                   "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])})
        deadline = time.monotonic() + 120  # (only stops a hung test)
        while not os.path.exists(f"{gate}.making") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is None:
            break
        said = proc.stderr.read()
        assert "the port is in use" in said, f"the server ended before the env was made: {said[-3000:]}"
    assert proc.poll() is None, "three ports were taken before the server could listen on them"
    lines: queue.Queue = queue.Queue()
    try:
        wait_for(lambda: os.path.exists(f"{gate}.making"), "the env is being made", proc)
        other = socket.socket()
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with other, pytest.raises(OSError) as refused:  # another server starting on that port now
            other.bind(("127.0.0.1", port))
            other.listen()
        assert refused.value.errno == 98  # EADDRINUSE: the port is ours
        gate.touch()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr] + [lines.put(None)],
                         daemon=True).start()
        said = []
        while (line := lines.get(timeout=120)) is not None:
            said.append(line)
            if "listening on" in line:
                break
        assert re.search(rf"listening on http://127\.0\.0\.1:{port}\b", "".join(said)), "".join(said)[-3000:]
        assert "Traceback" not in "".join(said)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- bad flags of eval and compare: one line naming the flag, before anything runs -------------------

ENV = "benchmax/Math-v0"
EVAL = ["eval", ENV, "--tasks", "2", "--env-arg", "python_tool=false", "--quiet", "--no-plots"]


def run_cli(*args, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**clean, "PYTHONPATH": ROOT, **(env or {})})


def assert_one_line(out, says):
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    said = out.stderr.strip().splitlines()
    assert len(said) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert said[0].startswith("benchmax-gym: error: ") and says in said[0], said[0]


@pytest.mark.parametrize("flags, says", [
    (["--temperature", "nan"], "--temperature must be a finite number, 0 or more, got nan"),
    (["--temperature", "inf"], "--temperature must be a finite number, 0 or more, got inf"),
    (["--temperature", "-0.5"], "--temperature must be a finite number, 0 or more, got -0.5"),
    (["--top-p", "0"], "--top-p must be a positive number up to 1, got 0"),
    (["--top-p", "1.5"], "--top-p must be a positive number up to 1, got 1.5"),
])
def test_sampling_settings_a_server_cannot_take_are_refused_naming_the_flag(tmp_path, flags, says):
    """nan and inf cannot be sent as JSON: every episode of the run failed as a model error (exit 0);
    a negative temperature or a top-p outside (0, 1] failed at a real server the same way."""
    from benchmax_gym.testing.openai_server import FakeChatServer

    with FakeChatServer(lambda body: {"content": "\\boxed{0}"}) as server:
        out = run_cli(*EVAL, "--model", "test-model", "--base-url", server.url, "--out", str(tmp_path / "run"), *flags)
    assert_one_line(out, says)
    assert not (tmp_path / "run").exists()


def test_sampling_flags_with_a_policy_are_refused_not_ignored(tmp_path):
    """(They were silently ignored: a solver baseline that looked like a sampled run.)"""
    out = run_cli(*EVAL, "--policy", "solver", "--temperature", "0.7", "--max-tokens", "64",
                  "--out", str(tmp_path / "run"))
    assert_one_line(out, "--temperature, --max-tokens: for --model only (--policy solver calls no model)")
    assert not (tmp_path / "run").exists()

@pytest.mark.parametrize("url, says", [
    ("http://[::1/v1", "--base-url http://[::1/v1: not a valid URL"),
    ("http://127.0.0.1:99999/v1", "--base-url http://127.0.0.1:99999/v1: not a valid URL (Port out of range"),
    ("ftp://127.0.0.1/v1", "--base-url ftp://127.0.0.1/v1: expected http(s)://HOST[:PORT]/v1"),
    ("http://127.0.0.1:0/v1", "--base-url http://127.0.0.1:0/v1: not a valid URL (port 0: a port is 1-65535)"),
])
def test_a_malformed_base_url_is_one_line_naming_the_flag(tmp_path, url, says):
    """An unclosed IPv6 bracket or a port past 65535 raised in the HTTP client (InvalidURL,
    an OverflowError in an exception group): a traceback, exit 1."""
    assert_one_line(run_cli(*EVAL, "--model", "m", "--base-url", url, "--out", str(tmp_path / "run")), says)


def test_a_malformed_openai_base_url_variable_is_named(tmp_path):
    out = run_cli(*EVAL, "--model", "m", "--out", str(tmp_path / "run"), env={"OPENAI_BASE_URL": "http://[::1/v1"})
    assert_one_line(out, "$OPENAI_BASE_URL http://[::1/v1: not a valid URL")


def test_compare_names_a_negative_seed(tmp_path):
    """numpy's ``expected non-negative integer`` named no flag."""
    from benchmax_gym.eval import evaluate

    for name in ("a", "b"):
        evaluate(ENV, "solver", env_kwargs={"python_tool": False}, tasks=2, out=tmp_path / name)
    out = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--seed", "-1")
    assert_one_line(out, "--seed must be 0 or more, got -1")
