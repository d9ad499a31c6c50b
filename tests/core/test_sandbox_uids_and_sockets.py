"""The sandbox between episodes and against the host's kernel memory: each episode's uid is its
own on the whole host (root hosts), socket buffers are bounded where no cgroup counts them, and
an episode that ends while its call starts ends that call. Real sandboxes, real processes."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time

import pytest

import benchmax_gym
from benchmax_gym.core import sandbox as sandbox_module
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, SandboxLimits, _Pool

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="episodes get uids of their own only on root hosts")
CODE_PATH = os.path.dirname(os.path.dirname(benchmax_gym.__file__))  # the code under test


def _python(script: str, *args: str, user=(), **kwargs) -> subprocess.Popen:
    """This interpreter running ``script`` with the code under test (as ``user``: a setpriv prefix)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": "/tmp", "PYTHONPATH": CODE_PATH}
    return subprocess.Popen([*user, sys.executable, "-c", script, *args], env=env, cwd="/", text=True, **kwargs)


# Holds N sandboxes' uids, forks a child that opens N more while the parent's are open, and
# writes each process's uids to a file of its own; both hold theirs until stdin closes.
HOLD_UIDS = r"""
import json, os, sys
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, _Pool
n, out = int(sys.argv[1]), sys.argv[2]
pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)  # no server: the uids are the point
boxes = [Sandbox(pool=pool) for _ in range(n)]
child = os.fork()
if child == 0:
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
    boxes = [Sandbox(pool=pool) for _ in range(n)]
with open(f"{out}/{os.getpid()}.tmp", "w") as f:
    json.dump([box.uid for box in boxes], f)
os.rename(f"{out}/{os.getpid()}.tmp", f"{out}/{os.getpid()}.json")
sys.stdin.read()
for box in boxes:
    box.close()
pool.shut_down()
if child:
    os.waitpid(child, 0)
"""


@ROOT_ONLY
def test_concurrent_episodes_in_several_processes_never_share_a_uid(tmp_path):
    """Each root-host episode's code runs as a uid picked for it; a random pick of 800,000 made
    two of 3,600 episodes open at once (three workers, each with a forked child) share one
    almost surely, and with it their process limit. Now a uid is held by one open sandbox on
    the host at a time."""
    processes = [_python(HOLD_UIDS, "600", str(tmp_path), stdin=subprocess.PIPE) for _ in range(3)]
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.json"))) < 6 and time.monotonic() < deadline:
            assert all(p.poll() is None for p in processes), [p.returncode for p in processes]
            time.sleep(0.05)
        held = [json.loads(path.read_text()) for path in tmp_path.glob("*.json")]
        assert len(held) == 6
        uids = [uid for uids in held for uid in uids]
        assert len(uids) == 3600 and all(uid >= 200_000 for uid in uids)
        shared = {uid for uid in uids if uids.count(uid) > 1}
        assert not shared, f"uids held by two open sandboxes at once: {sorted(shared)}"
    finally:
        for p in processes:
            p.stdin.close()
        for p in processes:
            assert p.wait(timeout=120) == 0


TAKE_ONE = r"""
import os, sys
from benchmax_gym.core import sandbox
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, _Pool
sandbox.EPISODE_UIDS = range(int(sys.argv[1]), int(sys.argv[2]))
pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
try:
    print(Sandbox(pool=pool).uid)
except OSError as exc:
    print(exc)
pool.shut_down()
"""


@ROOT_ONLY
def test_a_uid_is_held_until_its_episode_ends_and_no_longer(monkeypatch):
    """Two uids to give: two open episodes hold them against this process, another process and a
    forked child, and a closed episode's uid is given again."""
    first = 2_000_000 + 2 * secrets.randbelow(1_000_000)  # a pair no other test uses
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", range(first, first + 2))
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
    try:
        one, two = Sandbox(pool=pool), Sandbox(pool=pool)
        assert {one.uid, two.uid} == {first, first + 1}
        with pytest.raises(OSError, match="is in use"):
            Sandbox(pool=pool)
        other = _python(TAKE_ONE, str(first), str(first + 2), stdout=subprocess.PIPE).communicate(timeout=60)[0]
        assert "is in use" in other, other
        child = os.fork()
        if child == 0:  # a fork of a process holding both: its copies are not its own
            status = 3
            forked_pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
            try:
                Sandbox(pool=forked_pool)
                status = 1
            except OSError as exc:
                status = 0 if "is in use" in str(exc) else 2
            finally:
                forked_pool.shut_down()
                os._exit(status)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        freed = one.uid
        one.close()
        other = _python(TAKE_ONE, str(first), str(first + 2), stdout=subprocess.PIPE).communicate(timeout=60)[0]
        assert other.strip() == str(freed), other  # another process gets it once its episode ended
        three = Sandbox(pool=pool)
        assert three.uid == freed
        three.close()
        two.close()
    finally:
        pool.shut_down()


def test_an_episodes_code_cannot_signal_another_episodes_processes(bubblewrap):
    """Two episodes' calls at once: the second kills everything it can name (every pid, and -1);
    the first's process and its child run on (a PID namespace per call), and on root hosts the two
    ran as different uids."""
    with Sandbox(limits=SandboxLimits(timeout=30)) as first, Sandbox(limits=SandboxLimits(timeout=30)) as second:
        if os.geteuid() == 0:
            assert first.uid != second.uid
        results = []
        victim = ("import os, subprocess, time\n"
                  "child = subprocess.Popen(['sleep', '30'])\n"
                  "open('started', 'w').close()\n"
                  "time.sleep(3)\n"
                  "print('child alive:', child.poll() is None, 'uid:', os.getuid())")
        thread = threading.Thread(target=lambda: results.append(first.run(victim)))
        thread.start()
        deadline = time.monotonic() + 60
        while not (first.workspace / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        attack = ("import os, signal\n"
                  "killed = 0\n"
                  "for pid in range(2, 1 << 16):\n"
                  "    if pid != os.getpid():\n"
                  "        try:\n"
                  "            os.kill(pid, signal.SIGKILL)\n"
                  "            killed += 1\n"
                  "        except OSError:\n"
                  "            pass\n"
                  "try:\n"
                  "    os.kill(-1, signal.SIGKILL)\n"
                  "except OSError:\n"
                  "    pass\n"
                  "print('uid:', os.getuid(), 'signalled:', killed)")
        attacked = second.run(attack)
        thread.join(timeout=60)
        assert attacked.error is None and "signalled: 0" in attacked.stdout, attacked.text
        assert results and results[0].error is None, results
        assert "child alive: True" in results[0].stdout, results[0].text
        if os.geteuid() == 0:
            assert f"uid: {first.uid}\n" in results[0].stdout and f"uid: {second.uid} " in attacked.stdout


# Fills AF_UNIX socket pairs and TCP connections nobody reads, asking for the largest buffers,
# and reports what it queued (each stops at 400 MiB, to spare the machine where nothing bounds it).
SOCKET_FLOOD = r"""
import socket
def fill(sock):
    sock.setblocking(False)
    sent = 0
    try:
        while True:
            sent += sock.send(b'x' * (1 << 20))
    except (BlockingIOError, OSError):
        return sent

held, queued = [], 0
try:
    while queued < 400 << 20:
        pair = socket.socketpair()
        held.append(pair)
        for sock in pair:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
            queued += fill(sock)
except OSError as exc:
    print('unix stopped:', exc)
print('UNIX_MIB', queued >> 20)
for pair in held:
    for sock in pair:
        sock.close()
server = socket.create_server(('127.0.0.1', 0), backlog=512)
held, queued = [], 0
try:
    while queued < 400 << 20:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
        client.connect(server.getsockname())
        accepted = server.accept()[0]
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        held.append((client, accepted))
        queued += fill(client)
except OSError as exc:
    print('tcp stopped:', exc)
print('TCP_MIB', queued >> 20)
"""

# What normal code does with sockets and files must still work there.
NORMAL_SOCKETS = r"""
import os, socket, threading
a, b = socket.socketpair()
a.sendall(b'hello'); print(b.recv(5))
server = socket.create_server(('127.0.0.1', 0))
def echo():
    conn = server.accept()[0]
    got = b''
    while len(got) < 4 << 20:
        got += conn.recv(1 << 20)
    conn.sendall(got[-8:])
thread = threading.Thread(target=echo); thread.start()
client = socket.create_connection(server.getsockname())
client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # accepted (it may do nothing)
client.sendall(b'y' * (4 << 20)); print(client.recv(8)); thread.join()
files = [open(f'f{i}', 'w') for i in range(100)]
print('open files:', len(files))
"""

SOCKETS_AS_NON_ROOT = r"""
import json, os, sys
from benchmax_gym.core.sandbox import BUBBLEWRAP, Sandbox, SandboxLimits, _Pool
pool = _Pool(BUBBLEWRAP, (), cgroups=False)  # as where the user has no cgroup delegated
with Sandbox(limits=SandboxLimits(timeout=60, memory_mb=256, max_processes=8), pool=pool) as box:
    print(json.dumps([os.geteuid(), box.run(sys.argv[1]).text, box.run(sys.argv[2]).text]))
pool.shut_down()
"""


def _check_socket_results(flood: str, normal: str) -> None:
    unix = int(flood.split("UNIX_MIB")[-1].split()[0])
    tcp = int(flood.split("TCP_MIB")[-1].split()[0])
    assert unix < 128 and tcp < 128, flood  # half of memory_mb: HEAD queued 400 MiB of each, more if let
    assert "b'hello'" in normal and "b'yyyyyyyy'" in normal and "open files: 100" in normal, normal


def test_socket_buffers_are_bounded_where_no_cgroup_counts_them(bubblewrap):
    """A root host that cannot make a cgroup per call (and every non-root host, below): the
    address-space limit does not count socket buffers, and socket pairs and unread loopback
    connections queued 400 MiB (as much as the attack asked) under memory_mb=256. Now buffers
    keep the host's default size, TCP's stop at 128 KiB, and a process holds 128 descriptors."""
    pool = _Pool(BUBBLEWRAP, (), cgroups=False)
    try:
        with Sandbox(limits=SandboxLimits(timeout=60, memory_mb=256, max_processes=8), pool=pool) as box:
            _check_socket_results(box.run(SOCKET_FLOOD).text, box.run(NORMAL_SOCKETS).text)
    finally:
        pool.shut_down()


def _as_nobody() -> list[str]:
    """The prefix that runs this interpreter as uid/gid 65534 (nothing when not root); skips,
    saying why, where that user cannot run it."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed: cannot run the sandbox as a non-root user")
    probe = subprocess.run([*prefix, sys.executable, "-c", f"import sys; sys.path.insert(0, {CODE_PATH!r}); "
                            "import benchmax_gym"], capture_output=True, text=True, cwd="/")
    if probe.returncode:
        pytest.skip(f"uid 65534 cannot run this interpreter and the code under test: {probe.stderr.strip()[-300:]}")
    return prefix


def test_socket_buffers_are_bounded_on_a_non_root_host(bubblewrap):
    """The same attack from an unprivileged host user: no cgroup, and the code runs as that user."""
    proc = _python(SOCKETS_AS_NON_ROOT, SOCKET_FLOOD, NORMAL_SOCKETS, user=_as_nobody(),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    uid, flood, normal = json.loads(out.splitlines()[-1])
    assert uid != 0
    _check_socket_results(flood, normal)


def test_an_episode_that_ends_as_its_call_starts_ends_that_call(bubblewrap):
    """Closing a sandbox right after another thread started its call: the cancel could reach the
    server before the request (the call was marked running before it was sent), or before the
    server had read the call's monitor's pid (its kill then did nothing); either way the call ran
    to its timeout, and close() waited for it. Now the call ends when the episode does."""
    outcomes = []
    for delay in [0, 0.0005, 0.001, 0.002, 0.005] * 4:
        box = Sandbox(limits=SandboxLimits(timeout=5))
        assert box.run("print(1)").stdout == "1\n"  # the server is up
        results = []

        def call():
            try:
                results.append(box.run("import time\ntime.sleep(60)"))
            except RuntimeError as exc:  # closed before the call began: it never ran
                results.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(delay)
        box.close()
        thread.join(timeout=60)
        assert results, "the call did not return"
        result = results[0]
        if isinstance(result, RuntimeError):
            assert "closed" in str(result)
            continue
        outcomes.append(result.text)
        assert "the episode ended" in result.text and not result.timed_out, (delay, result.text)
    assert outcomes  # most calls started before their episode ended
