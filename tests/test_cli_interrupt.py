"""Ctrl-C early in a command (the command line read, ``--import``, its imports, gym.make) is the
same one line and exit status 130 as Ctrl-C while episodes run, never a KeyboardInterrupt traceback.

The moment is not a delay after start (on a loaded machine that lands anywhere, and a SIGINT before
the interpreter has installed its handler kills any Python program with -2): the child reports each
import as it ends (``PYTHONPROFILEIMPORTTIME``) and the test interrupts it right after a chosen one,
or the child interrupts itself from an ``--import`` module.

The servers (``mcp-serve``, ``openenv-serve``) end the same way, their sessions cleaned up; and a
second Ctrl-C while the first one's cleanup runs (an environment whose close takes a while, the
second Ctrl-C sent once it says it is closing) still ends with that one line and status 130."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snooping  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(sys.executable), "benchmax-gym")  # the installed console script
ENV = "benchmax/Math-v0"
COMMANDS = {  # each runs until interrupted
    "run": ["run", ENV, "--episodes", "1000000", "--quiet"],
    "eval": ["eval", ENV, "--policy", "solver", "--tasks", "0:1000000", "--env-arg", "python_tool=false",
             "--quiet", "--no-plots"],
}


def interrupted(tmp_path, args, after_import=None, timeout=120):
    """Start the console script with ``args``, SIGINT its process group (as Ctrl-C in a terminal)
    right after the module ``after_import`` is imported (else it interrupts itself), and return
    its exit status and its stderr without the import report."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    if after_import:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    proc = subprocess.Popen([sys.executable, SCRIPT, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True)
    said = []
    try:
        if after_import:
            for line in proc.stderr:
                said.append(line)
                if line.startswith("import time:") and line.rpartition("|")[2].strip() == after_import:
                    os.killpg(proc.pid, signal.SIGINT)
                    break
            else:
                pytest.fail(f"{after_import} was never imported: {''.join(said)[-3000:]}")
        said.append(proc.communicate(timeout=timeout)[1])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(said)
    return proc.returncode, [x for x in err.splitlines() if x.strip() and not x.startswith("import time:")]


@pytest.mark.skipif(not os.path.isfile(SCRIPT), reason="benchmax-gym is not installed beside this python")
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("moment", [
    "benchmax_gym.data.commands",  # the command line being read (main builds its parser)
    "benchmax_gym.envs.math.rubric",  # the environment being made
    "--import",  # a module of the user's, imported first
])
def test_ctrl_c_while_a_command_starts_is_one_line_and_status_130(tmp_path, command, moment):
    args = [*COMMANDS[command], *(["--out", str(tmp_path / "run")] if command == "eval" else [])]
    if moment == "--import":
        (tmp_path / "ctrl_c_now.py").write_text("import os, signal\nos.killpg(os.getpgrp(), signal.SIGINT)\n")
        code, said = interrupted(tmp_path, ["--import", "ctrl_c_now", *args])
    else:
        code, said = interrupted(tmp_path, args, after_import=moment)
    assert code == 130 and not any("Traceback" in x or "Error" in x for x in said), (code, said[-40:])
    assert len(said) == 1 and said[0].startswith("interrupted"), said[-40:]


# Ctrl-C landing in a library's code that turns it into another error, or loses it: Python 3.11
# re-raises a KeyboardInterrupt from a ``__set_name__`` (a dataclass field's) as RuntimeError;
# multiprocess and dill read their version under a bare ``except:`` whose fallback fails with
# ImportError, which multiprocess catches for dill's (the Ctrl-C lost, the command running on).
# Each module says when it has pressed Ctrl-C (a test whose moment never came proves nothing).
PRESS = "open('pressed', 'w').close(); os.kill(os.getpid(), signal.SIGINT)"
AT_IMPORT_OF = """
import os, signal, sys

class PressCtrlC:  # the moment the command's own imports reach {module!r}
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            {press}
        return None

sys.meta_path.insert(0, PressCtrlC())
"""
CTRL_C_IN_A_LIBRARY = {
    "__set_name__": f"""
import os, signal

class Field:
    def __set_name__(self, owner, name):
        {PRESS}  # (raised at the next line of Python: here)

class Record:
    value = Field()
""",
    "bare except": f"""
import os, signal, time

try:
    {PRESS}
    time.sleep(5)
except:  # noqa: E722
    import a_fallback_module_that_is_not_there  # noqa: F401
""",
    "multiprocess's version": AT_IMPORT_OF.format(module="multiprocess.__info__", press=PRESS),
    "dill's version": AT_IMPORT_OF.format(module="dill.__info__", press=PRESS),
}


@pytest.mark.skipif(not os.path.isfile(SCRIPT), reason="benchmax-gym is not installed beside this python")
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("library", sorted(CTRL_C_IN_A_LIBRARY))
def test_ctrl_c_a_library_turns_into_another_error_or_loses_is_still_one_line_and_status_130(tmp_path, command,
                                                                                             library):
    args = [*COMMANDS[command], *(["--out", str(tmp_path / "run")] if command == "eval" else [])]
    (tmp_path / "ctrl_c_in_a_library.py").write_text(CTRL_C_IN_A_LIBRARY[library])
    code, said = interrupted(tmp_path, ["--import", "ctrl_c_in_a_library", *args], timeout=60)
    assert (tmp_path / "pressed").exists()
    assert code == 130 and len(said) == 1 and said[0].startswith("interrupted"), (code, said[-40:])


# -- the servers, and a second Ctrl-C while the first one's cleanup runs ----------------------------

# An environment whose close takes a while once the test has pressed Ctrl-C (the flag file exists,
# so the servers' first environment, made and closed at start, closes at once): the moment its
# cleanup is known to be under way, said on stderr, for the test's second Ctrl-C.
SLOW_CLOSE = """
import os, sys, time
import gymnasium as gym

class SlowClose(gym.Wrapper):
    def step(self, action):
        if not getattr(self, "played", False):
            self.played = True
            print("slow-close: playing", file=sys.stderr, flush=True)
        return super().step(action)

    def close(self):
        if os.path.exists("ctrl-c-sent"):
            print("slow-close: closing", file=sys.stderr, flush=True)
            time.sleep(3)
        super().close()

gym.register("SlowClose/Math-v0", entry_point=lambda **kw: SlowClose(gym.make("benchmax/Math-v0", **kw)),
             disable_env_checker=True, order_enforce=False)
"""

MCP_HTTP_CLIENT = """
import asyncio, sys
from mcp import Client

async def main():
    async with Client(sys.argv[1], mode="legacy") as client:
        result = await client.call_tool("python", {"code": "print(6 * 7)"})
        print("called", result.content[0].text.replace(chr(10), " "), flush=True)
        if len(sys.argv) > 2:  # then a call that runs until the server ends it
            await client.call_tool("python", {"code": sys.argv[2]})
        await asyncio.to_thread(sys.stdin.readline)  # the session stays open

asyncio.run(main())
"""

OPENENV_CLIENT = """
import json, sys
import gymnasium as gym
import benchmax_gym

env = gym.make("benchmax/OpenEnv-v0", base_url=sys.argv[1])
env.reset(seed=0)
call = {"name": "python", "arguments": {"code": "print(6 * 7)"}}
print("called", env.step(f"<tool_call>{json.dumps(call)}</tool_call>")[0].replace(chr(10), " "), flush=True)
sys.stdin.readline()  # the session stays open
"""

SERVERS = {
    "mcp-serve stdio": ["mcp-serve"],
    "mcp-serve http": ["mcp-serve", "--transport", "http", "--port", "0"],
    "openenv-serve": ["openenv-serve", "--port", "0"],
}


def _rpc(proc, message):
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    proc.stdin.flush()


class ServerInUse:
    """A server command started as from a terminal (its own process group; TMPDIR, the working
    directory and ``--import slow_close`` in ``tmp_path``), with one client session open whose
    environment ran python: a sandbox process and a workspace folder to be cleaned up."""

    def __init__(self, tmp_path, server, *client_args):
        (tmp_path / "slow_close.py").write_text(SLOW_CLOSE)
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]), "TMPDIR": str(self.tmp)}
        args = ["--import", "slow_close", SERVERS[server][0], "SlowClose/Math-v0", *SERVERS[server][1:]]
        self.proc = subprocess.Popen([sys.executable, SCRIPT, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True)
        self.client = None
        self.lines, self.said = [], queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()  # (a full pipe would block the server)
        try:
            self._open_a_session(server, env, client_args)
        except BaseException:
            self.close()
            raise

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            self.said.put(line)

    def wait_for(self, text, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.said.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"never said {text!r}: {''.join(self.lines)[-3000:]}") from None
            if text in line:
                return line

    def _open_a_session(self, server, env, client_args):
        if server == "mcp-serve stdio":  # the test is the client, over the server's stdin and stdout
            _rpc(self.proc, {"id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
            assert '"id":1' in self.proc.stdout.readline()
            _rpc(self.proc, {"method": "notifications/initialized"})
            _rpc(self.proc, {"id": 2, "method": "tools/call", "params": {"name": "python",
                                                                        "arguments": {"code": "print(6 * 7)"}}})
            called = self.proc.stdout.readline()
        else:
            self.url = re.search(r"listening on (\S+)", self.wait_for("listening on"))[1]
            client = MCP_HTTP_CLIENT if server == "mcp-serve http" else OPENENV_CLIENT
            self.client = subprocess.Popen([sys.executable, "-c", client, self.url, *client_args], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, env=env)
            called = self.client.stdout.readline()
        assert "42" in called, (called, "".join(self.lines)[-3000:])

    def descendants(self):
        """Its live descendant processes (each session's sandbox, its processes)."""
        alive = set()
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.add(p.pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def workspaces(self):
        return [p for p in self.tmp.rglob("*") if p.name.startswith(("benchmax-sandbox-", "ep-"))]

    def ctrl_c(self):
        os.killpg(self.proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole group

    def close(self):
        for proc in (self.proc, self.client):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def _alive(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _until(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)
    return predicate()


@pytest.mark.skipif(not os.path.isfile(SCRIPT), reason="benchmax-gym is not installed beside this python")
@pytest.mark.parametrize("server", sorted(SERVERS))
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_a_server_with_one_line_status_130_and_nothing_left(tmp_path, server, presses):
    """A server (MCP over stdio or HTTP, OpenEnv) stops on Ctrl-C as every command does: its
    sessions' environments closed (their sandboxes and workspaces gone), one line, status 130.
    They ended with status 0, so a supervisor could not tell an interrupt from a clean end; a
    second Ctrl-C while the first one's cleanup ran (an environment closing) printed tracebacks
    (uvicorn's app shutdown cancelled, the stdio server's task groups) or ended with status 1."""
    snooping.need_bubblewrap()
    if server == "openenv-serve":
        pytest.importorskip("openenv")
    served = ServerInUse(tmp_path, server)
    try:
        sandboxes = served.descendants()
        assert sandboxes and served.workspaces()  # what its cleanup must remove
        (tmp_path / "ctrl-c-sent").touch()
        served.ctrl_c()
        if presses == 2:
            served.wait_for("slow-close: closing")
            served.ctrl_c()
        served.proc.wait(timeout=120)
    finally:
        served.close()
    said = [x for x in "".join(served.lines).splitlines()
            if x.strip() and "listening on" not in x and not x.startswith("slow-close:")]
    assert served.proc.returncode == 130 and not any("Traceback" in x or "Error" in x for x in said), \
        (served.proc.returncode, said[-40:])
    assert len(said) == 1 and said[0].startswith("interrupted"), said[-40:]
    if presses == 1:  # (a second Ctrl-C may cut the cleanup short)
        assert _until(lambda: not _alive(sandboxes)), _alive(sandboxes)
        assert not served.workspaces()


def _refused(url):
    import socket
    from urllib.parse import urlsplit

    try:
        socket.create_connection((urlsplit(url).hostname, urlsplit(url).port), timeout=5).close()
    except OSError:
        return True
    return False


@pytest.mark.skipif(not os.path.isfile(SCRIPT), reason="benchmax-gym is not installed beside this python")
def test_a_second_ctrl_c_while_the_http_server_waits_for_a_call_still_closes_its_sessions(tmp_path):
    """The first Ctrl-C waits for the calls in flight (uvicorn's graceful end); a second one stops
    that wait, and uvicorn skipped the app's own shutdown then: the sessions' environments were
    never closed and the app's cancelled shutdown was logged as a traceback, status 0."""
    snooping.need_bubblewrap()
    served = ServerInUse(tmp_path, "mcp-serve http", "open('in-flight', 'w').close()\nimport time\ntime.sleep(60)")
    try:
        sandboxes = served.descendants()
        assert _until(lambda: any(p.name == "in-flight" for p in served.tmp.rglob("*")), 60)  # (its workspace)
        served.ctrl_c()
        assert _until(lambda: _refused(served.url), 60)  # it stopped listening: it is waiting for the call
        served.ctrl_c()
        served.proc.wait(timeout=120)
    finally:
        served.close()
    said = [x for x in "".join(served.lines).splitlines() if x.strip() and "listening on" not in x]
    assert served.proc.returncode == 130 and not any("Traceback" in x or "Error" in x for x in said), \
        (served.proc.returncode, said[-40:])
    assert len(said) == 1 and said[0].startswith("interrupted"), said[-40:]
    assert _until(lambda: not _alive(sandboxes)), _alive(sandboxes)
    assert not served.workspaces()


@pytest.mark.skipif(not os.path.isfile(SCRIPT), reason="benchmax-gym is not installed beside this python")
def test_a_second_ctrl_c_while_run_closes_its_env_is_still_one_line_and_status_130(tmp_path):
    """``run`` said "interrupted" as it caught the first Ctrl-C, then closed its environment; a
    second Ctrl-C during that close said it again."""
    (tmp_path / "slow_close.py").write_text(SLOW_CLOSE)
    (tmp_path / "ctrl-c-sent").touch()  # (its one environment is closed only once interrupted)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    proc = subprocess.Popen([sys.executable, SCRIPT, "--import", "slow_close", "run", "SlowClose/Math-v0",
                             "--episodes", "1000000", "--quiet", "--env-arg", "python_tool=false"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env, start_new_session=True)
    said = []
    try:
        for line in proc.stderr:
            said.append(line)
            if line.startswith(("slow-close: playing", "slow-close: closing")):
                os.killpg(proc.pid, signal.SIGINT)
                if "closing" in line:
                    break
        said.append(proc.communicate(timeout=120)[1])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = [x for x in "".join(said).splitlines() if x.strip() and not x.startswith("slow-close:")]
    assert proc.returncode == 130 and not any("Traceback" in x or "Error" in x for x in said), (proc.returncode, said)
    assert said == ["interrupted"], said


def test_main_called_in_process_gives_the_callers_ctrl_c_back_after_an_interrupted_command(tmp_path):
    """A notebook or script calling ``main()`` in its own process: after a command ends on
    Ctrl-C (130), the caller's next Ctrl-C is its own KeyboardInterrupt again, not the end of
    the whole process with status 130."""
    (tmp_path / "stop_here.py").write_text("raise KeyboardInterrupt\n")
    code = f"""if True:
        import os, signal, sys
        from benchmax_gym.cli import main
        before, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
        status = main({["--import", "stop_here"] + COMMANDS["run"]!r})
        back = signal.getsignal(signal.SIGINT) is before and sys.unraisablehook is hook
        print("status", status, "handler back", back, flush=True)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            import time; time.sleep(5)
            print("no KeyboardInterrupt")
        except KeyboardInterrupt:
            print("the caller's KeyboardInterrupt")
        """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert done.stdout.splitlines() == ["status 130 handler back True", "the caller's KeyboardInterrupt"], \
        (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.returncode == 0
    assert done.stderr.strip().splitlines()[-1] == "interrupted"


# A loaded machine: the main thread runs on only 0.3 s after it starts a thread (the Ctrl-C sent
# again from a thread came while the hook that started it was still running, where it was dropped).
SLOW_THREAD_START = """
import threading, time
_start = threading.Thread.start
def start(self):
    _start(self)
    time.sleep(0.3)
threading.Thread.start = start
"""


@pytest.mark.skipif(not os.path.isfile(SCRIPT), reason="benchmax-gym is not installed beside this python")
@pytest.mark.parametrize("machine", ["idle", "loaded"])
def test_ctrl_c_that_lands_in_a_finalizer_still_ends_the_command(tmp_path, machine):
    """Ctrl-C while a dropped object's finalizer runs (an env or episode garbage-collected, its
    cleanup running): Python prints what a finalizer raises and drops it, and the command went on
    as if Ctrl-C never came (status 0, an "Exception ignored" traceback). It ends the command."""
    (tmp_path / "stop_in_cleanup.py").write_text(
        (SLOW_THREAD_START if machine == "loaded" else "") +
        "import os, signal, time, weakref\n"
        "class Workspace: pass\n"
        "def cleanup():\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C pressed while this cleanup runs\n"
        "    time.sleep(3)  # (it lands here)\n"
        "workspace = Workspace()\n"
        "weakref.finalize(workspace, cleanup)\n"
        "del workspace\n")
    status, said = interrupted(tmp_path, ["--import", "stop_in_cleanup", "run", ENV, "--episodes", "2", "--quiet"])
    assert status == 130 and said == ["interrupted"], (status, said)
