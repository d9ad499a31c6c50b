"""Model-written code is hostile: every attack runs as real code through Math-v0's python tool,
must fail, and the sandbox must serve a normal call right after. No mocks of the isolation."""

import gc
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import psutil
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, SandboxLimits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import snooping  # noqa: E402


@pytest.fixture
def env(bubblewrap):
    env = gym.make("benchmax/Math-v0", tool_timeout=3, sandbox_limits={"memory_mb": 512, "max_output_chars": 5000})
    obs, info = env.reset(seed=0)
    assert info["sandbox"] == BUBBLEWRAP
    yield env
    env.close()


def run_python(env, code):
    action = '<tool_call>' + json.dumps({"name": "python", "arguments": {"code": code}}) + '</tool_call>'
    obs, reward, terminated, truncated, info = env.step(action)
    assert not terminated and env.observation_space.contains(obs)
    return obs, info


def assert_still_serves(env):
    obs, info = run_python(env, "print(6 * 7)")
    assert info["error"] is None and "stdout:\n42" in obs


def sandbox_processes():
    """Sandboxes started by this test process (bubblewrap, which forks its own init inside)."""
    return [p for p in psutil.Process().children() if p.name() == "bwrap"]


def test_normal_call_and_workspace_persistence(env):
    obs, info = run_python(env, "open('notes.txt', 'w').write('kept'); x = 5; print('hello')")
    assert info["error"] is None and obs.startswith("<tool_response>\nexit code 0\nstdout:\nhello")
    obs, info = run_python(env, "print(open('notes.txt').read()); print('x' in globals())")
    assert "kept\nFalse" in obs  # files persist between calls, Python state does not


def test_the_codes_traceback_shows_its_own_frames_as_python_file_py_would(env):
    """The model read the sandbox server's own frame first (``File "/sandbox/server.py", line 298,
    in run_child``) in every traceback: noise, and a glimpse of the runner. A syntax error shows
    no traceback at all, as Python shows it."""
    obs, info = run_python(env, "def f():\n    return 1 / 0\nf()")
    assert "exit code 1" in obs and "server.py" not in obs and "run_child" not in obs, obs
    assert 'Traceback (most recent call last):\n  File "<code>", line 3, in <module>\n' in obs, obs
    assert 'File "<code>", line 2, in f' in obs and "ZeroDivisionError: division by zero" in obs
    obs, info = run_python(env, "def f(:\n    pass")
    assert "Traceback" not in obs and 'File "<code>", line 1' in obs and "SyntaxError" in obs, obs


def test_cannot_read_files_outside_the_workspace(env, tmp_path):
    secret = tmp_path / "answer.txt"
    secret.write_text("THE-GROUND-TRUTH")
    other = Sandbox()  # another episode's workspace
    (other.workspace / "their.txt").write_text("OTHER-EPISODE")
    try:
        for path in (secret, other.workspace / "their.txt", "/etc/shadow", os.path.expanduser("~/.bashrc")):
            obs, info = run_python(env, f"print(open({str(path)!r}).read())")
            assert info["error"] == "tool_error", path
            assert "THE-GROUND-TRUTH" not in obs and "OTHER-EPISODE" not in obs
        obs, _ = run_python(env, f"import os; print(os.path.exists({str(tmp_path)!r}), sorted(os.listdir('/')))")
        assert "False" in obs and "'work'" not in obs
    finally:
        other.close()
    assert_still_serves(env)


def test_cannot_see_host_processes(env):
    obs, info = run_python(env, "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    pids = json.loads(obs.split("stdout:\n")[1].split("\n")[0])
    assert os.getpid() not in pids and len(pids) <= 4
    obs, info = run_python(env, f"print(open('/proc/{os.getpid()}/environ').read())")
    assert info["error"] == "tool_error"
    assert_still_serves(env)


def test_cannot_write_outside_the_workspace(env, tmp_path):
    target = tmp_path / "planted.txt"
    obs, info = run_python(env, f"open({str(target)!r}, 'w').write('pwned')")
    assert info["error"] == "tool_error" and not target.exists()
    for path in ("/usr/pwned", "/tmp/../usr/lib/pwned"):
        obs, info = run_python(env, f"open({path!r}, 'w').write('x')")
        assert info["error"] == "tool_error"
    run_python(env, "open('/tmp/scratch', 'w').write('private tmp')")  # allowed, but private
    assert not os.path.exists("/tmp/scratch")
    assert_still_serves(env)


def test_no_network(env):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    obs, info = run_python(env, code)
    thread = threading.Thread(target=accept)
    thread.start()
    thread.join()
    server.close()
    assert info["error"] == "tool_error" and "connected" not in obs.split("stderr")[0]
    assert not accepted
    obs, info = run_python(env, "import urllib.request; urllib.request.urlopen('http://pypi.org', timeout=2)")
    assert info["error"] == "tool_error"
    assert_still_serves(env)


def test_infinite_loop_times_out(env):
    obs, info = run_python(env, "while True: pass")
    assert info["error"] == "tool_timeout" and "timed out" in obs
    assert_still_serves(env)


def test_huge_allocation_hits_the_memory_limit(env):
    obs, info = run_python(env, "x = bytearray(8 * 1024 ** 3)")
    assert info["error"] == "memory_limit" and "MemoryError" in obs
    assert_still_serves(env)


def test_fork_bomb_is_contained(env):
    obs, info = run_python(env, "import os\nwhile True:\n    os.fork()")
    assert info["error"] in ("process_limit", "tool_timeout")
    assert_still_serves(env)
    obs, _ = run_python(env, "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert int(obs.split("stdout:\n")[1].split("\n")[0]) <= 4  # nothing left running


def test_the_exit_status_is_the_codes_own_process_not_its_forks(env):
    """Forks of the code run on through the same exit path: their statuses used to be appended to
    the code's (a fork bomb's 122 read as exit code 138, a tool_error instead of process_limit)."""
    code = ("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        raise SystemExit(3)\n"
            "time.sleep(0.3)\nraise SystemExit(7)")
    obs, info = run_python(env, code)
    assert info["error"] == "tool_error" and obs.splitlines()[1] == "Error: exit code 7", obs


def test_huge_file_hits_the_file_size_limit(env):
    code = "f = open('big.bin', 'wb')\nfor _ in range(2048):\n    f.write(b'0' * 1024 * 1024)"
    obs, info = run_python(env, code)
    assert info["error"] == "file_size_limit" and "File too large" in obs
    workspace = env.unwrapped.episode.state["sandbox"].workspace
    assert (workspace / "big.bin").stat().st_size <= 64 * 1024 * 1024
    assert_still_serves(env)


def test_workspace_quota(bubblewrap):
    with Sandbox(limits=SandboxLimits(max_file_mb=8, workspace_mb=20)) as box:
        code = "for i in range(5):\n    open(f'f{i}.bin', 'wb').write(b'0' * 7 * 1024 * 1024)"
        result = box.run(code)
        assert result.error == "file_size_limit" and "quota" in result.text
        assert sum(p.stat().st_size for p in box.workspace.iterdir()) <= 20 * 1024 * 1024
        assert box.run("print('ok')").stdout == "ok\n"


def test_huge_output_is_truncated_with_a_marker(env):
    obs, info = run_python(env, "print('x' * 100_000_000)")
    assert info["error"] is None
    assert "[stdout truncated: " in obs and len(obs) < 12_000
    assert_still_serves(env)


def test_environment_is_scrubbed(env, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-from-parent")
    env.reset(seed=1)  # a new episode starts its sandbox with this variable set in the parent
    obs, info = run_python(env, "import os; print(sorted(os.environ)); print(os.environ.get('OPENAI_API_KEY'))")
    assert "sk-secret" not in obs and "None" in obs
    assert_still_serves(env)


def test_cannot_kill_the_parent(env):
    code = "import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print(pid, e)"
    obs, info = run_python(env, code)
    assert "Operation not permitted" in obs
    assert_still_serves(env)
    obs, info = run_python(env, f"import os; os.kill({os.getpid()}, 9)")
    assert info["error"] == "tool_error"  # the host process is not even visible
    assert_still_serves(env)


def test_background_processes_do_not_survive_the_call(env):
    code = (
        "import os, subprocess\n"
        "subprocess.Popen(['sleep', '1000'])\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(1000)\n"
        "print('spawned')"
    )
    obs, info = run_python(env, code)
    assert "spawned" in obs
    obs, _ = run_python(env, "import os; print([open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit()])")
    assert "sleep" not in obs and "1000" not in obs


def test_close_and_gc_leave_no_process(bubblewrap):
    env = gym.make("benchmax/Math-v0")
    env.reset(seed=0)
    run_python(env, "print(1)")
    assert len(sandbox_processes()) == 1
    env.reset(seed=1)  # the previous episode's sandbox is gone, a new one is up
    run_python(env, "print(1)")
    assert len(sandbox_processes()) == 1
    env.close()
    assert sandbox_processes() == []

    env = gym.make("benchmax/Math-v0")
    env.reset(seed=0)
    run_python(env, "print(1)")
    del env
    gc.collect()
    assert sandbox_processes() == []


def test_interpreter_exit_leaves_no_process(bubblewrap, tmp_path):
    code = (
        "import gymnasium as gym, benchmax_gym, json\n"
        "env = gym.make('benchmax/Math-v0')\n"
        "env.reset(seed=0)\n"
        "obs, *_ = env.step('<tool_call>' + json.dumps({'name': 'python', 'arguments': {'code': 'print(1)'}}) + '</tool_call>')\n"
        "import os; print(os.getpid())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    leftovers = [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "bwrap"
                 and any("server.py" in c for c in (p.info["cmdline"] or []))]
    assert not [p for p in leftovers if p.ppid() == int(out.stdout.split()[-1])]


def test_rlimits_level_only_when_asked(tmp_path):
    env = gym.make("benchmax/Math-v0", sandbox="rlimits", tool_timeout=3)
    obs, info = env.reset(seed=0)
    assert info["sandbox"] == "rlimits"
    obs, info = run_python(env, "print(sum(range(5)))")
    assert "stdout:\n10" in obs
    obs, info = run_python(env, "while True: pass")
    assert info["error"] == "tool_timeout"
    env.close()


def test_without_bubblewrap_the_python_tool_is_left_out():
    code = (
        "import warnings, gymnasium as gym, benchmax_gym\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    env = gym.make('benchmax/Math-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(info['sandbox'], [t['function']['name'] for t in info['tools']])\n"
        "print([(w.filename, w.lineno) for w in caught if 'python tool is left out' in str(w.message)])\n"
    )
    no_bwrap = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # bwrap is not on this PATH
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=no_bwrap)
    assert out.returncode == 0, out.stderr
    # (at the user's gym.make line, not Gymnasium's registration.py)
    assert out.stdout.splitlines() == ["unavailable ['calculator']", "[('<string>', 4)]"]


def test_bad_sandbox_configuration_fails_at_make():
    with pytest.raises(ValueError, match="sandbox must be one of"):
        gym.make("benchmax/Math-v0", sandbox="docker")
    with pytest.raises(ValueError, match="memory_mb"):
        gym.make("benchmax/Math-v0", sandbox_limits={"memory_mb": 0})
    with pytest.raises(ValueError, match="sandbox_limits.*colour"):
        gym.make("benchmax/Math-v0", sandbox_limits={"colour": 1})


def test_put_file_gives_the_code_a_writable_file(bubblewrap):
    with Sandbox() as box:
        box.put_file("data/input.txt", b"from the host")
        result = box.run("p = 'data/input.txt'; t = open(p).read(); open(p, 'w').write(t.upper()); print(t)")
        assert result.error is None and result.stdout == "from the host\n"
        assert (box.workspace / "data" / "input.txt").read_text() == "FROM THE HOST"
        with pytest.raises(ValueError, match="outside the workspace"):
            box.put_file("../escape.txt", b"x")


# -- the issue's items: each through Math-v0's python tool, each failed before its fix ---------

def test_tmp_is_private_writable_and_kept_for_the_episode(env):
    obs, info = run_python(env, "open('/tmp/scratch', 'w').write('private tmp'); print(open('/tmp/scratch').read())")
    assert info["error"] is None and "stdout:\nprivate tmp" in obs
    obs, info = run_python(env, "print(open('/tmp/scratch').read())")
    assert info["error"] is None and "stdout:\nprivate tmp" in obs
    assert not os.path.exists("/tmp/scratch")


def test_no_host_paths_inside(env):
    code = ("import os, sys\n"
            "print(open('/proc/1/cmdline').read().replace('\\0', ' '))\n"
            "print(os.environ, sys.path, sys.executable, sys.prefix, os.listdir('/'), os.listdir('/sandbox'))")
    obs, info = run_python(env, code)
    assert info["error"] is None
    workspace = str(env.unwrapped.episode.state["sandbox"].workspace)
    host = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))}
    for path in host | {workspace, os.getcwd(), "/work/", "/root", "'work'"}:
        assert path not in obs, path
    assert "/sandbox/python" in obs


def test_seccomp_refuses_what_normal_code_never_needs(env):
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def err(rc): return ctypes.get_errno() if rc == -1 else 'ALLOWED'\n"
        "import platform\n"
        "print('io_uring', err(libc.syscall(425, 8, ctypes.create_string_buffer(120))))\n"  # same number on both
        "print('keyctl', err(libc.syscall(250 if platform.machine() == 'x86_64' else 219, 0, -1, 0)))\n"
        "print('userns', err(libc.unshare(0x10000000)))\n"
        "import os\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(w, b'forked'); os._exit(0)\n"
        "os.waitpid(pid, 0); print(os.read(r, 6).decode())\n"
        "import threading, subprocess, sys, numpy, openpyxl\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())\n"
        "wb = openpyxl.Workbook(); wb.active['A1'] = int(numpy.arange(5).sum()); wb.save('w.xlsx')\n"
        "print('A1', openpyxl.load_workbook('w.xlsx').active['A1'].value)\n"
    )
    obs, info = run_python(env, code)
    assert info["error"] is None, obs
    assert "io_uring 1\nkeyctl 1\nuserns 1\nforked\nthread\n42\nA1 10" in obs


def test_quota_holds_whatever_the_timestamps_say(bubblewrap):
    env = gym.make("benchmax/Math-v0", tool_timeout=10, sandbox_limits={"max_file_mb": 8, "workspace_mb": 20})
    env.reset(seed=0)
    try:
        workspace = env.unwrapped.episode.state["sandbox"].workspace
        for call in range(5):
            code = (f"import os\nfor i in range(3):\n    name = 'c{call}_' + str(i)\n"
                    "    open(name, 'wb').write(b'0' * 7 * 1024 * 1024)\n"
                    "    os.utime(name, (946684800, 946684800))  # back to 2000")
            obs, info = run_python(env, code)
            assert info["error"] == "file_size_limit" and "quota" in obs
            assert sum(p.stat().st_size for p in workspace.iterdir()) <= 20 * 1024 * 1024
        assert_still_serves(env)
    finally:
        env.close()


def test_deep_directories_neither_break_calls_nor_cleanup(env):
    workspace = env.unwrapped.episode.state["sandbox"].workspace
    code = ("import os\nfor i in range(1500):\n    os.mkdir('d' * 200)\n    os.chdir('d' * 200)\n"
            "open('leaf.bin', 'wb').write(b'x' * 1000)\nos.chmod('.', 0)\nprint('deep')")
    obs, info = run_python(env, code)
    assert "stdout:\ndeep" in obs
    assert_still_serves(env)
    obs, info = run_python(env, "print('still here')")
    assert "still here" in obs
    env.reset(seed=1)  # the old workspace goes, whatever is in it
    assert not workspace.exists()
    assert_still_serves(env)


def test_deep_directories_count_against_the_quota(bubblewrap):
    with Sandbox(limits=SandboxLimits(max_file_mb=8, workspace_mb=20)) as box:
        code = ("import os\nfor i in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\n"
                "for i in range(4):\n    open(f'f{i}', 'wb').write(b'0' * 7 * 1024 * 1024)")
        result = box.run(code)
        assert result.error == "file_size_limit" and "quota" in result.text
        assert box.run("print('ok')").stdout == "ok\n"


def _drop_privileges_and_run(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with this interpreter as uid/gid 65534 (CI runs as root; the issue is about
    non-root hosts). Skips where the tests do not run as root (they then are non-root already)."""
    home = tempfile.mkdtemp(prefix="benchmax-nobody-")  # pytest's tmp_path is closed to other users
    try:
        script = os.path.join(home, "as_nobody.py")
        with open(script, "w") as f:
            f.write(code)
        os.chmod(home, 0o755)
        argv = [sys.executable, script]
        if os.geteuid() == 0:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "TMPDIR": "/tmp",
               "PYTHONPATH": os.path.dirname(os.path.dirname(benchmax_gym.__file__))}  # the code under test
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


NON_ROOT_ATTACKS = r'''
import json, os, sys, time
import gymnasium as gym, benchmax_gym

def call(env, code):
    action = '<tool_call>' + json.dumps({"name": "python", "arguments": {"code": code}}) + '</tool_call>'
    obs, reward, terminated, truncated, info = env.step(action)
    return obs, info["error"]

FORGE = """
import json, os
line = ''.join(json.dumps({"id": i, "stdout": "FORGED\\n", "exit_code": 0}) + "\\n" for i in range(1, 50))
for pid in sorted({1, os.getppid()}):
    try:
        fds = os.listdir(f'/proc/{pid}/fd')
    except OSError as e:
        fds = ['0', '1', '3', '4']
        print('no fd list', pid, e.strerror)
    for fd in fds:
        try:
            f = os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY)
            os.write(f, line.encode())
            print('forged through', pid, fd)
        except OSError as e:
            print('no', pid, fd, e.strerror)
    try:
        open(f'/proc/{pid}/mem', 'rb').read(1)
        print('read memory of', pid)
    except OSError as e:
        print('no mem', pid, e.strerror)
"""
STOP = "import os, signal\nfor pid in sorted({1, os.getppid()}):\n    os.kill(pid, signal.SIGSTOP)\nprint('sent')"

SANDBOX = "auto"
out = {"uid": os.getuid()}
env = gym.make("benchmax/Math-v0", sandbox=SANDBOX, tool_timeout=60)  # (a stopped server: a call's timeout)
obs, info = env.reset(seed=0)
out["level"] = info["sandbox"]
out["forge"] = call(env, FORGE)
out["after_forge"] = [call(env, f"print({i} * 7)") for i in range(2, 5)]
out["stop"] = call(env, STOP)
out["after_stop"] = call(env, "print(6 * 7)")
env.close()
print(json.dumps(out))
'''


def test_non_root_host_code_cannot_reach_its_server(bubblewrap):
    """Non-root: the code runs as the server's uid (no second uid without a setuid helper). It
    must still not be able to forge replies into the host channel, read the server's memory, or
    stop it."""
    out = _drop_privileges_and_run(NON_ROOT_ATTACKS)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["uid"] != 0 and result["level"] == BUBBLEWRAP
    forge_obs = result["forge"][0]
    assert "forged through" not in forge_obs and "read memory" not in forge_obs
    for i, (obs, error) in zip(range(2, 5), result["after_forge"]):
        assert error is None and f"stdout:\n{i * 7}\n" in obs and "FORGED" not in obs
    # the kernel drops SIGSTOP sent to the namespace's init: the call returns (a stopped server
    # would time it out, an error) and so does the next one
    obs, error = result["stop"]
    assert error is None and "sent" in obs, (error, obs)
    obs, error = result["after_stop"]
    assert error is None and "stdout:\n42\n" in obs, (error, obs)
    assert "Traceback" not in out.stderr


LOWER_THE_MONITORS_LIMITS = r'''
import json
from benchmax_gym.core.sandbox import Sandbox, SandboxLimits
CODE = """
import resource, sys
print('monitor', resource.prlimit(1, resource.RLIMIT_AS))  # reading another's limits: allowed
try:
    resource.prlimit(1, resource.RLIMIT_AS, (1 << 20, 1 << 20))
    print('lowered')
except OSError as exc:
    print('refused', exc.errno)
resource.prlimit(0, resource.RLIMIT_NOFILE, (64, 64))
print('own', resource.getrlimit(resource.RLIMIT_NOFILE))
for i in range(100):
    print('x' * 1000)
    print('y' * 1000, file=sys.stderr)
"""
with Sandbox(limits=SandboxLimits(timeout=20)) as box:
    r = box.run(CODE)
    print(json.dumps([r.stdout[:300], r.text[:300], r.error, r.outcome]))
'''


def test_non_root_host_code_cannot_lower_its_monitors_limits(bubblewrap):
    """Non-root: the code runs as its monitor's uid, and prlimit needs no more than that: code
    lowered the monitor's memory limit, the monitor failed collecting its output, and the call
    ended as the sandbox's failure (env_error, no reward) rather than the code's. prlimit now
    sets only the caller's own limits; reading any is still allowed."""
    out = _drop_privileges_and_run(LOWER_THE_MONITORS_LIMITS)
    assert out.returncode == 0, out.stderr
    stdout, text, error, outcome = json.loads(out.stdout.splitlines()[-1])
    assert outcome is None and error is None, (text, out.stderr[-2000:])
    assert "refused 1\n" in stdout and "own (64, 64)\n" in stdout and "monitor (" in stdout, text


def test_host_detects_a_desynchronised_channel():
    """At the ``rlimits`` level (no isolation, opted into) non-root code can write into the host
    channel; the request ids catch the forged replies and the sandbox starts afresh."""
    out = _drop_privileges_and_run(NON_ROOT_ATTACKS.replace("sandbox=SANDBOX", 'sandbox="rlimits"'))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["level"] == "rlimits"
    obs, error = result["forge"]
    assert error == "tool_error" and "out of step" in obs and "FORGED" not in obs  # the forgery got in ...
    for i, (obs, error) in zip(range(2, 5), result["after_forge"]):
        assert error is None and f"stdout:\n{i * 7}\n" in obs and "FORGED" not in obs  # ... and was caught


def test_interpreter_path_with_dotdot_and_doctor(bubblewrap, tmp_path):
    """`../repo/.venv/bin/python script.py`: what is bound must be what is executed, and a
    working sandbox is what `doctor` reports; nothing reaches the user's stderr."""
    dotted = os.path.relpath(sys.executable, tmp_path)  # ../../..
    assert dotted.startswith("..")
    code = (
        "import gymnasium as gym, benchmax_gym, json, sys\n"
        "assert '..' in sys.executable, sys.executable\n"
        "env = gym.make('benchmax/Math-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(info['sandbox'])\n"
        "print(env.step('<tool_call>' + json.dumps({'name': 'python', 'arguments': {'code': 'print(6 * 7)'}}) + '</tool_call>')[0])\n"
    )
    out = subprocess.run([dotted, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("bubblewrap\n") and "stdout:\n42" in out.stdout
    assert out.stderr == ""
    doctor = subprocess.run([dotted, "-m", "benchmax_gym.cli", "doctor"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    line = next(l for l in doctor.stdout.splitlines() if l.startswith("sandbox"))
    assert doctor.returncode == 0 and line.split()[1] == "bubblewrap", doctor.stdout


def test_a_sandbox_that_cannot_start_is_reported(tmp_path):
    """bubblewrap is there but the sandbox cannot run (here: a bwrap on PATH that breaks only the
    real server command, as a broken interpreter layout would): `doctor`, the warning at make and
    info["sandbox"] say so, with bubblewrap's own message - even when its stdout closes well before
    the message arrives on stderr (the reader used to give up on the first end it saw)."""
    wrapper = tmp_path / "bwrap"
    wrapper.write_text('#!/bin/sh\ncase "$*" in *server.py*) exec 1>&-; sleep 0.3; '
                       'exec /usr/bin/bwrap --ro-bind /no-such-dir-xyz /x "$@";; esac\n'
                       'exec /usr/bin/bwrap "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    code = (
        "import warnings, gymnasium as gym, benchmax_gym\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    env = gym.make('benchmax/Math-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(info['sandbox'])\n"
        "print([str(w.message) for w in caught])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("unavailable\n") and "no-such-dir-xyz" in out.stdout
    doctor = subprocess.run([sys.executable, "-m", "benchmax_gym.cli", "doctor"], capture_output=True, text=True,
                            timeout=120, env=env)
    line = next(l for l in doctor.stdout.splitlines() if l.startswith("sandbox"))
    assert "unavailable" in line and "no-such-dir-xyz" in line


def test_ending_episodes_while_the_sandbox_starts_is_silent(bubblewrap):
    """Episodes that end while their sandbox boots (resets in a quick loop, then exit) write
    nothing to the user's stderr."""
    code = (
        "import time, gymnasium as gym, benchmax_gym\n"
        "env = gym.make('benchmax/Excel-v0')\n"
        "for i in range(12):\n"
        "    env.reset(seed=i)\n"
        "    time.sleep(0.01 * (i % 4))\n"
        "env.reset(seed=99)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_what_a_preloaded_module_prints_neither_corrupts_the_channel_nor_reaches_the_user():
    code = (
        "from benchmax_gym.core.sandbox import Sandbox\n"
        "with Sandbox(mode='rlimits', preload=('this',)) as box:\n"  # `import this` prints the Zen
        "    print(box.run('print(6 * 7)').stdout, end='')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "42\n" and out.stderr == ""


# -- one server per process, shared by every episode ------------------------------------------

def test_the_server_starts_at_the_first_call_and_is_shared_by_every_episode(bubblewrap):
    envs = [gym.make("benchmax/Math-v0") for _ in range(3)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
        assert sandbox_processes() == []  # a reset starts nothing
        for env in envs:
            obs, info = run_python(env, "print(6 * 7)")
            assert info["error"] is None and "stdout:\n42" in obs
        assert len(sandbox_processes()) == 1  # one server for all of them
        for i, env in enumerate(envs):
            env.reset(seed=10 + i)  # new episodes keep the server warm
        assert len(sandbox_processes()) == 1
        server = sandbox_processes()[0]
        # at rest: the server, its zygote and two spare monitors (the last call's monitor may still be exiting)
        def alive():
            found = []
            for p in server.children(recursive=True):
                try:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
                except psutil.NoSuchProcess:
                    pass
            return found

        # A loaded machine (parallel test workers) is slow to settle, and a process may start or end
        # between two looks (a spare's short-lived fork): the assertion reads the look that ended the wait.
        deadline = time.monotonic() + 60
        while len(found := alive()) > 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(found) <= 4, [(p.pid, p.ppid(), p.status()) for p in found if p.is_running()]
    finally:
        for env in envs:
            env.close()
    assert sandbox_processes() == []


def test_episodes_sharing_a_server_never_see_each_others_files_or_processes(bubblewrap):
    first, second = (gym.make("benchmax/Math-v0", tool_timeout=5) for _ in range(2))
    try:
        first.reset(seed=0)
        second.reset(seed=1)
        plant = ("import os, subprocess\n"
                 "for d in ('.', '/tmp', '/dev/shm'):\n"
                 "    open(os.path.join(d, 'FIRST-SECRET'), 'w').write('FIRST-SECRET')\n"
                 "subprocess.Popen(['sleep', '77'])\n"
                 "print(os.getcwd())")
        obs, info = run_python(first, plant)
        assert info["error"] is None and "/workspace" in obs
        look = ("import os\n"
                "print(os.listdir('.'), os.listdir('/tmp'), os.listdir('/dev/shm'))\n"
                "print([open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit()])\n"
                "for d in ('/sandbox/episodes', '/sandbox'):\n"
                "    try:\n"
                "        print(d, sorted(os.listdir(d)))\n"
                "    except OSError as e:\n"
                "        print(d, 'refused', e.errno)")
        finished = []

        def slow_first():  # a call of the first episode runs while the second one looks
            finished.append(run_python(first, "import time, subprocess\nsubprocess.Popen(['sleep', '88'])\ntime.sleep(2)"))

        thread = threading.Thread(target=slow_first)
        thread.start()
        time.sleep(0.5)
        obs, info = run_python(second, look)
        thread.join()
        assert info["error"] is None, obs
        assert "FIRST-SECRET" not in obs and "sleep" not in obs and "77" not in obs and "88" not in obs
        assert "/sandbox/episodes refused" in obs and "ws-" not in obs
        assert finished and finished[0][1]["error"] is None
        obs, info = run_python(first, "import os; print(sorted(os.listdir('.')), os.listdir('/tmp'))")
        assert obs.count("FIRST-SECRET") == 2  # its own files stay its own, call after call
    finally:
        first.close()
        second.close()


def test_an_episode_that_ends_during_its_call_leaves_nothing(bubblewrap):
    env = gym.make("benchmax/Math-v0", tool_timeout=30)
    env.reset(seed=0)
    box = env.unwrapped.episode.state["sandbox"]
    run_python(env, "print(1)")
    results = []
    thread = threading.Thread(target=lambda: results.append(
        box.run("import time\nopen('started', 'w').write('1')\ntime.sleep(60)")))
    thread.start()
    for _ in range(600):  # (a hang guard of a minute)
        if (box.workspace / "started").exists():
            break
        time.sleep(0.1)
    env.reset(seed=1)  # ends the episode whose call still runs
    thread.join(timeout=90)  # a hang guard (the call's own timeout is 30 s)
    assert not thread.is_alive() and "the episode ended" in results[0].notes, results  # not its timeout
    assert not box.workspace.exists() and not box.tmp.exists()
    server = sandbox_processes()[0]
    deadline = time.monotonic() + 60  # the call's processes are gone (a spare monitor may be starting)
    while len(found := server.children(recursive=True)) > 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(found) <= 4, [p.cmdline() for p in found]  # (the look that ended the wait: a spare may fork next)
    env.close()


def test_excel_code_finds_openpyxl_numpy_and_pandas_already_imported(bubblewrap):
    env = gym.make("benchmax/Excel-v0")
    env.reset(seed=0)
    try:
        action = '<tool_call>' + json.dumps({"name": "run_python", "arguments": {"code": (
            "import sys\nprint([m for m in ('openpyxl', 'numpy', 'pandas') if m in sys.modules])\n"
            "import pandas\nprint(pandas.DataFrame({'a': [1, 2]}).a.sum())")}}) + '</tool_call>'
        obs, _, _, _, info = env.step(action)
        assert info["error"] is None, obs
        assert "['openpyxl', 'numpy', 'pandas']\n3" in obs
    finally:
        env.close()


# -- issue 27: one episode never sees another; limits hold for the whole call ------------------------


def test_an_episode_never_sees_another_episodes_requests_or_results(bubblewrap):
    """Each call's monitor comes from a zygote forked before any request, so nothing of another
    episode's code, output or waiting requests is in the code's memory: before, walking
    sys._getframe().f_back reached the server's ``finish()`` with the previous call's result."""
    boxes = [Sandbox(limits=SandboxLimits(timeout=20)) for _ in range(4)]
    try:
        other, own = snooping.marker("A"), snooping.marker("B")
        result = boxes[0].run(snooping.leave(other))
        assert other in result.stdout
        # across episodes: the next call of another episode, right after
        result = boxes[1].run(snooping.snoop(other, own))
        assert result.error is None, result.text
        assert snooping.leaks(result.stdout) == []
        # concurrent episodes: others' calls run and wait in the queue while one looks
        threads = [threading.Thread(target=box.run, args=(snooping.leave(other, "import time; time.sleep(1.5)"),))
                   for box in boxes[2:]]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        result = boxes[1].run(snooping.snoop(other, own))
        for thread in threads:
            thread.join()
        assert result.error is None, result.text
        assert snooping.leaks(result.stdout) == []
    finally:
        for box in boxes:
            box.close()


def test_seccomp_refuses_socket_families_normal_code_never_uses(env):
    """AF_VSOCK reaches the host of a VM: only unix, inet, inet6 and netlink sockets are made."""
    code = ("import socket\n"
            "for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, 40, 17, 38, 9):\n"
            "    kind = socket.SOCK_RAW if family in (16, 17) else socket.SOCK_DGRAM if family == 9 else socket.SOCK_STREAM\n"
            "    try:\n"
            "        socket.socket(family, kind).close(); print(family, 'made')\n"
            "    except OSError as e:\n"
            "        print(family, 'refused', e.errno)\n"
            "try:\n"
            "    socket.socketpair(40); print('pair made')\n"
            "except OSError as e:\n"
            "    print('pair refused', e.errno)\n"
            "a, b = socket.socketpair(); a.close(); b.close(); print('unix pair made')")
    obs, info = run_python(env, code)
    assert info["error"] is None, obs
    for family in (1, 2, 10, 16):
        assert f"{family} made" in obs, obs
    for family in (40, 17, 38, 9):  # AF_VSOCK, AF_PACKET, AF_ALG, AF_X25
        assert f"{family} refused 97" in obs, obs
    assert "pair refused 97" in obs and "unix pair made" in obs


# Eight processes each try to hold 100 MiB (touched) at once, then as many memfds of 64 MiB as
# they can: under memory_mb=256 at most two may hold theirs together, and memfds count too.
MEMORY_ATTACK = r"""
import mmap, os, time
r, w = os.pipe()
kids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        try:
            held = [mmap.mmap(-1, 4 << 20) for _ in range(25)]
            for m in held:
                m.write(b'x' * (4 << 20))
            os.write(w, b'%d\n' % os.getpid())
        except BaseException:
            pass
        time.sleep(4)
        os._exit(0)
    kids.append(pid)
os.close(w)
time.sleep(3)
os.set_blocking(r, False)
try:
    done = {int(x) for x in os.read(r, 1 << 20).split()}
except BlockingIOError:
    done = set()
alive = {pid for pid in kids if os.waitpid(pid, os.WNOHANG) == (0, 0)}
print('HOLDING', len(done & alive) * 100, flush=True)
fds, wrote = [], 0
try:
    for i in range(16):
        fd = os.memfd_create(f'm{i}')
        for _ in range(16):
            os.write(fd, b'x' * (4 << 20)); wrote += 4
        fds.append(fd)
except OSError as e:
    print('MEMFD refused', e.errno, flush=True)
print('MEMFD', wrote)
"""


def _memory_attack(box):
    result = box.run(MEMORY_ATTACK)
    holding = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("HOLDING")]
    memfd = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("MEMFD ") and line.split()[1].isdigit()]
    return result, holding, memfd


def test_the_memory_limit_holds_for_the_call_as_a_whole(bubblewrap):
    """Before, every process had its own ``memory_mb`` (8 forks held 800 MiB under 256) and memfd
    pages counted nowhere. A cgroup per call caps them together where this machine allows (CI:
    it must); elsewhere each process gets ``memory_mb / max_processes`` and memfds are refused."""
    from benchmax_gym.core.sandbox import _Pool, memory_mechanism

    limits = SandboxLimits(timeout=20, memory_mb=256, max_processes=16)
    for cgroups in (True, False):
        pool = _Pool(BUBBLEWRAP, (), cgroups=cgroups)
        if cgroups and pool.cgroups is None:
            assert not os.environ.get("CI"), memory_mechanism()
            continue
        try:
            with Sandbox(limits=limits, pool=pool) as box:
                result, holding, memfd = _memory_attack(box)
                assert holding and holding[0] <= 256, result.text
                if cgroups:  # memfds are allowed, and counted: the writer is killed
                    assert result.error == "memory_limit" and "for the call's processes together" in result.text
                    assert not memfd or memfd[0] < 256, result.text
                else:
                    assert "MEMFD refused 1" in result.stdout and memfd == [0], result.text
                assert box.run("print('ok')").stdout == "ok\n"
        finally:
            pool.shut_down()
        for path in (pool.cgroups or {}).values():
            assert not os.path.exists(path)  # every call's cgroup, and the pool's, are removed


def test_the_memory_limit_holds_for_the_call_as_a_whole_on_a_non_root_host(bubblewrap):
    """The same attack from an unprivileged host user (no cgroup to write: per-process shares)."""
    out = _drop_privileges_and_run(
        "import json\nfrom benchmax_gym.core.sandbox import Sandbox, SandboxLimits\n"
        f"MEMORY_ATTACK = {MEMORY_ATTACK!r}\n"
        "with Sandbox(limits=SandboxLimits(timeout=20, memory_mb=256, max_processes=16)) as box:\n"
        "    r = box.run(MEMORY_ATTACK)\n"
        "    print(json.dumps([r.stdout, r.text, box.run('print(1)').stdout]))\n")
    assert out.returncode == 0, out.stderr
    stdout, text, after = json.loads(out.stdout.splitlines()[-1])
    holding = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("HOLDING")]
    assert holding and holding[0] <= 256, text
    assert "MEMFD refused 1" in stdout or "for the call's processes together" in text, text
    assert after == "1\n"


# Writes 4 MiB chunks into many files (workspace and /tmp) and makes empty files, links and FIFOs,
# reporting what it got written while it ran (the post-call check used to come only after it).
DISK_ATTACK = r"""
import os
wrote = 0
try:
    for i in range(200):
        with open(('/tmp/' if i % 2 else '') + f'big{i}', 'wb') as f:
            for _ in range(2):
                f.write(b'x' * (2 << 20)); f.flush(); wrote += 2
except OSError as e:
    print('DATA stopped', e.errno)
print('DATA', wrote, flush=True)
for name in ('big%d' % i for i in range(200)):
    for d in ('', '/tmp/'):
        try:
            os.unlink(d + name)
        except OSError:
            pass
made = 0
try:
    for i in range(60000):
        kind = i % 3
        name = f'e{i}'
        if kind == 0:
            open(name, 'w').close()
        elif kind == 1:
            os.symlink('nowhere', name)
        else:
            os.mkfifo(name)
        made += 1
except OSError as e:
    print('ENTRIES stopped', e.errno)
print('ENTRIES', made, flush=True)
"""


def test_the_workspace_quota_holds_during_the_call(bubblewrap):
    """Root hosts: a tmpfs per episode (workspace and /tmp together) with ``size=`` and
    ``nr_inodes=``: the call cannot write past the quota nor make more than one entry per 4 KiB of
    it. Before, a call wrote 800 MiB under 20 and made 60,000 free entries."""
    if os.geteuid() != 0:
        pytest.skip("tmpfs workspaces need a root host (elsewhere the quota is checked after each call)")
    with Sandbox(limits=SandboxLimits(timeout=60, max_file_mb=8, workspace_mb=20)) as box:
        assert box.tmpfs
        result = box.run(DISK_ATTACK)
        lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
        assert "DATA stopped 28" in result.stdout and int(lines["DATA"]) <= 20, result.text
        assert "ENTRIES stopped 28" in result.stdout and int(lines["ENTRIES"]) <= 20 * 256, result.text
        assert box.run("import os; print(len(os.listdir('.')))").stdout.strip() == lines["ENTRIES"]
        assert box.run("import os\nfor n in os.listdir('.'):\n    os.unlink(n)\nopen('f', 'w').write('ok')\n"
                       "print(open('f').read())").stdout == "ok\n"  # room again once the code deletes


def test_empty_entries_count_against_the_quota_where_it_is_checked_after_the_call(bubblewrap):
    """Without a tmpfs (non-root hosts), each entry counts at least a block: 60,000 empty files,
    links and FIFOs no longer fit in 20 MiB for free (each later call walked them)."""
    from benchmax_gym.core.sandbox import _Pool

    pool = _Pool(BUBBLEWRAP, (), tmpfs=False)
    try:
        with Sandbox(limits=SandboxLimits(timeout=60, max_file_mb=8, workspace_mb=20), pool=pool) as box:
            assert not box.tmpfs
            result = box.run(DISK_ATTACK.replace("range(200)", "range(0)"))
            assert result.error == "file_size_limit" and "quota" in result.text
            assert box._usage() <= 20 << 20
    finally:
        pool.shut_down()


def test_episodes_never_share_a_network_namespace(bubblewrap):
    """Network namespaces were pooled across episodes: the next episode read the TIME_WAIT
    sockets (ports, addresses) the last one left in /proc/net/tcp. Now each episode has its own."""
    first, second = (Sandbox(limits=SandboxLimits(timeout=20)) for _ in range(2))
    try:
        leave = ("import socket\nserver = socket.create_server(('127.0.0.1', 0))\nport = server.getsockname()[1]\n"
                 "client = socket.create_connection(('127.0.0.1', port))\nconn, _ = server.accept()\n"
                 "client.sendall(b'x'); conn.recv(1); client.close(); conn.close(); server.close()\n"
                 "print('PORT %04X' % port)")
        look = "print(open('/proc/net/tcp').read())"
        result = first.run(leave)
        port = result.stdout.split()[-1]
        assert result.error is None and len(port) == 4, result.text
        assert f":{port} " in first.run(look).stdout  # its own calls share its namespace
        result = second.run(look)
        assert result.error is None and f":{port} " not in result.stdout, result.stdout
        first.close()  # an ended episode's namespace goes; the next ones get fresh ones
        third = Sandbox(limits=SandboxLimits(timeout=20))
        try:
            assert f":{port} " not in third.run(look).stdout
        finally:
            third.close()
    finally:
        first.close()
        second.close()


def test_mountinfo_names_no_host_path_but_the_pythons_and_doctor_says_why(bubblewrap):
    """The server's source, workspaces, episodes and cgroups were bound from host paths that
    /proc/self/mountinfo names; they now come as data, tmpfs and neutral names. The interpreter
    and its packages are still bound (the kernel shows a bind's source): ``doctor`` says so."""
    from benchmax_gym.core.sandbox import _workspace_root, isolation_report

    with Sandbox() as box:
        result = box.run("print(open('/proc/self/mountinfo').read())")
        pool = str(box._pool.dir)
    assert result.error is None, result.text
    assert os.path.join(os.path.dirname(os.path.dirname(benchmax_gym.__file__)), "benchmax_gym") not in result.stdout
    assert "sandbox_server" not in result.stdout
    if os.geteuid() == 0:  # a tmpfs per pool and per episode (elsewhere the episodes' directory shows)
        assert str(_workspace_root()) not in result.stdout and pool not in result.stdout
        assert " /workspace /workspace " in result.stdout
    report = dict(isolation_report())
    assert {"sandbox memory", "sandbox disk", "sandbox network", "sandbox mountinfo", "sandbox uid"} <= set(report)
    assert os.path.realpath(sys.base_prefix) in report["sandbox mountinfo"]
    if os.geteuid() == 0:  # where the reservations are, and how containers share them
        assert "/run/benchmax-gym-uids.lock" in report["sandbox uid"] and "BENCHMAX_GYM_UID_LOCK" in report["sandbox uid"]


def test_each_call_runs_exactly_once(bubblewrap):
    """The monitor closes its request socket as soon as it has read the request; a send after
    that failed, and the server gave the call to a second monitor: it ran twice."""
    from benchmax_gym.core.sandbox import _Pool

    for _ in range(4):  # a new server's first calls are where it showed most
        pool = _Pool(BUBBLEWRAP, ())
        boxes = [Sandbox(limits=SandboxLimits(timeout=20), pool=pool) for _ in range(4)]
        try:
            for _ in range(3):
                for box in boxes:
                    result = box.run("import os, time\nopen('runs', 'a').write('x')\ntime.sleep(0.1)")
                    assert result.error is None, result.text
            assert [box.run("print(open('runs').read())").stdout for box in boxes] == ["xxx\n"] * 4
        finally:
            for box in boxes:
                box.close()
            pool.shut_down()


def test_a_killed_hosts_tmpfs_are_swept_by_the_next_pool(bubblewrap, tmp_path):
    """Root hosts mount a tmpfs per pool and per episode; a host killed before closing leaves them
    mounted (in its own temp root, wherever that was): the next pool on the machine detaches them."""
    from benchmax_gym.core.sandbox import _Pool

    if os.geteuid() != 0:
        pytest.skip("tmpfs workspaces are for root hosts")
    code = ("import os, signal\nfrom benchmax_gym.core.sandbox import Sandbox\nbox = Sandbox()\n"
            "box.run(\"open('f', 'w').write('x')\")\nprint(box._pool.dir, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    pool_dir = out.stdout.strip()
    assert pool_dir.startswith(str(tmp_path)), out.stderr

    def mounted():
        with open("/proc/self/mountinfo") as f:
            return [line.split()[4] for line in f if pool_dir in line]

    assert len(mounted()) == 2  # the pool's and its episode's
    def stale_cgroups(pool):
        return [name for path in (pool.cgroups or {}).values() for name in os.listdir(os.path.dirname(path))
                if name.startswith("benchmax-gym-") and name.split("-")[2].isdigit()
                and not os.path.exists(f"/proc/{name.split('-')[2]}")]

    deadline = time.monotonic() + 60
    while True:  # its cgroups go once its server's processes are gone (they die with it, in ms)
        pool = _Pool(BUBBLEWRAP, ())
        pool.shut_down()
        if not stale_cgroups(pool) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert mounted() == [] and not os.path.exists(pool_dir)
    assert stale_cgroups(pool) == []


# -- review: limits that no per-process cap counted, quotas, bad limits, counts ----------------------

# SysV shared memory detached once written is no process's address space, nor is a /dev/shm file
# written with write(): where no cgroup caps the call, each must stay within memory_mb.
SHM_ATTACK = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
held = 0
for i in range(128):  # 512 MiB of segments, each detached once written
    shmid = libc.shmget(0, 4 << 20, 0o1000 | 0o600)
    if shmid < 0:
        print('SHMGET refused', ctypes.get_errno(), flush=True)
        break
    addr = libc.shmat(shmid, None, 0)
    ctypes.memset(addr, 1, 4 << 20)
    libc.shmdt(addr)
    held += 4
print('SHM', held, flush=True)
wrote = 0
try:
    with open('/dev/shm/fill', 'wb') as f:
        for i in range(128):
            f.write(b'x' * (1 << 20)); f.flush(); wrote += 1
except OSError as e:
    print('DEVSHM stopped', e.errno)
print('DEVSHM', wrote)
"""


def test_shared_memory_counts_against_the_memory_limit(bubblewrap):
    """Before, where no cgroup caps the call (non-root hosts), SysV segments held 1 GiB under
    memory_mb=256 and /dev/shm took 64 MiB more. Now shmget is refused there (as memfd_create is)
    and /dev/shm holds one process's share; with a cgroup, both are allowed and counted."""
    from benchmax_gym.core.sandbox import _Pool

    limits = SandboxLimits(timeout=20, memory_mb=256, max_processes=16)
    for cgroups in (False, True):
        pool = _Pool(BUBBLEWRAP, (), cgroups=cgroups)
        if cgroups and pool.cgroups is None:
            pool.shut_down()
            continue
        try:
            with Sandbox(limits=limits, pool=pool) as box:
                result = box.run(SHM_ATTACK)
                lines = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines())
                if cgroups:
                    assert result.error == "memory_limit" and int(lines.get("SHM", 0)) < 256, result.text
                else:
                    assert lines["SHMGET refused"] == "1" and lines["SHM"] == "0", result.text
                    assert lines["DEVSHM stopped"] == "28" and int(lines["DEVSHM"]) <= 256 // 16, result.text
                assert box.run("print('ok')").stdout == "ok\n"
        finally:
            pool.shut_down()


def test_directories_count_against_the_quota_and_go_where_it_is_checked_after_the_call(bubblewrap):
    """Without a tmpfs (non-root hosts) empty directories counted against the quota but were never
    deleted: each call added 20,000 more. Now the call's newest entries go, directories included
    (emptied first), until the workspace fits again; what was there before the call stays."""
    from benchmax_gym.core.sandbox import _Pool

    pool = _Pool(BUBBLEWRAP, (), tmpfs=False)
    code = ("import os\nfor i in range(3000):\n    os.mkdir(f'd{CALL}_{i}')\n"
            "os.makedirs('/'.join(['n%d' % CALL] * 40))\n"
            "for depth in range(1, 41):\n    open('/'.join(['n%d' % CALL] * depth + ['f']), 'w').write('x')\n"
            "for i in range(500):\n    os.mkdir(f'/tmp/t{CALL}_{i}')\nprint('made')")
    try:
        with Sandbox(limits=SandboxLimits(timeout=60, workspace_mb=4), pool=pool) as box:
            assert not box.tmpfs
            box.put_file("kept/data.txt", b"from the host")
            for call in range(3):
                result = box.run(code.replace("CALL", str(call)))
                assert result.error == "file_size_limit" and "quota" in result.text, result.text
                assert box._usage() <= 4 << 20
                assert len(os.listdir(box.workspace)) + len(os.listdir(box.tmp)) <= 1024
            assert (box.workspace / "kept" / "data.txt").read_bytes() == b"from the host"
            assert box.run("print('ok')").stdout == "ok\n"
    finally:
        pool.shut_down()


def test_limits_are_whole_finite_numbers_named_when_not():
    """``512.0`` (JSON, YAML) made every call fail (a float shifted in the server) and leaked its
    monitor; NaN failed every call and inf never timed out. Integral floats now become ints; the
    rest is refused at construction, naming the limit."""
    import math

    limits = SandboxLimits(memory_mb=512.0, max_processes=16.0, timeout=3)
    assert (limits.memory_mb, limits.max_processes, limits.timeout) == (512, 16, 3.0)
    assert type(limits.memory_mb) is int and type(limits.timeout) is float
    for name, value in (("timeout", math.nan), ("timeout", math.inf), ("memory_mb", math.nan),
                        ("max_processes", math.inf), ("memory_mb", 512.5), ("cpu_seconds", True),
                        ("workspace_mb", "64"), ("max_output_chars", -1)):
        with pytest.raises(ValueError, match=f"sandbox limit {name} must be"):
            SandboxLimits(**{name: value})
    with pytest.raises(ValueError, match="timeout"):
        gym.make("benchmax/Math-v0", sandbox_limits={"timeout": math.nan})


def test_a_request_the_server_cannot_start_fails_alone(bubblewrap, monkeypatch):
    """A request the server could not hand to a monitor (here limits the host now refuses, sent
    anyway) left its monitor waiting forever; queued, it raised in ``finish`` and killed the server
    with every other episode's call. Now it alone fails, as the sandbox's error."""
    from benchmax_gym.core import sandbox
    from benchmax_gym.core.outcomes import ENV_ERROR
    from benchmax_gym.core.sandbox import _Pool

    monkeypatch.setattr(sandbox, "MAX_CONCURRENT_CALLS", 1)  # the second call waits in the queue
    pool = _Pool(BUBBLEWRAP, ())
    good, bad, other = (Sandbox(limits=SandboxLimits(timeout=20), pool=pool) for _ in range(3))
    object.__setattr__(bad.limits, "max_processes", "32")  # what SandboxLimits refuses
    try:
        assert good.run("print(1)").stdout == "1\n"
        server = psutil.Process(pool.server().proc.pid)
        out = {}

        def run(name, box, code):
            out[name] = box.run(code)

        threads = [threading.Thread(target=run, args=("good", good, "import time; time.sleep(2); print('good')")),
                   threading.Thread(target=run, args=("bad", bad, "print('bad')")),
                   threading.Thread(target=run, args=("other", other, "print('other')"))]
        for thread in threads:
            thread.start()
            time.sleep(0.5)
        for thread in threads:
            thread.join()
        assert out["good"].stdout == "good\n" and out["other"].stdout == "other\n", out
        assert out["bad"].outcome == ENV_ERROR and "bad" not in out["bad"].stdout
        for _ in range(5):  # not queued: each failed call let its monitor go
            assert bad.run("print('bad')").outcome == ENV_ERROR
        assert good.run("print(2)").stdout == "2\n" and pool.restarts == 0
        # settled: its init, the zygote and two spare monitors, for half a second on end (while the
        # spares are made, a moment's count passes through lower and higher numbers)
        deadline, settled_since = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            if len(server.children(recursive=True)) > 4:
                settled_since = None
            elif settled_since is None:
                settled_since = time.monotonic()
            elif time.monotonic() - settled_since > 0.5:
                break
            time.sleep(0.02)
        assert len(server.children(recursive=True)) <= 4, [p.cmdline() for p in server.children(recursive=True)]
    finally:
        for box in (good, bad, other):
            box.close()
        pool.shut_down()


def test_the_truncation_marker_counts_the_codes_bytes(bubblewrap):
    """Bytes that are not UTF-8 are shown as ``\\xff`` (four characters each); the marker counted
    the escapes' characters: 100,000 bytes claimed 320,000 more."""
    with Sandbox(limits=SandboxLimits(max_output_chars=5000)) as box:
        result = box.run("import os\nos.write(1, b'\\xff' * 100_000)\nos.write(2, 'é€'.encode() * 50_000)")
        assert len(result.stdout) <= 5000 and result.stdout == "\\xff" * 1250
        assert result.stdout_dropped_bytes == 100_000 - 1250
        assert result.stderr == "é€" * 2500 and result.stderr_dropped_bytes == 5 * 50_000 - 5 * 2500


def test_a_setsid_process_does_not_outlive_its_call_at_the_rlimits_level():
    """At level ``rlimits`` nothing but the process group was killed: a double fork with setsid
    survived the call. Where a cgroup holds the call, everything in it is killed."""
    marker = str(7_000_000 + secrets.randbelow(1_000_000))
    code = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        os.closerange(0, 1024)\n"
            f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\nprint('done')")

    def survivors():
        return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", marker]]

    try:
        with Sandbox(mode="rlimits", limits=SandboxLimits(timeout=5)) as box:
            if box._pool.cgroups is None:
                pytest.skip("no cgroup here: at level rlimits a process that leaves the call's session survives it")
            assert box.run(code).stdout == "done\n"
            deadline = time.monotonic() + 60
            while survivors() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert survivors() == []
    finally:
        for process in survivors():
            process.kill()
