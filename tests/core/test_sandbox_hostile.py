"""Model code as an attacker of the machine: kernel resources one call could take from the whole
host (not only from its own limits). Each attack runs as real code in a real sandbox, and the
sandbox must serve a normal call right after."""

import pytest

from benchmax_gym.core.sandbox import Sandbox, SandboxLimits


TCP_FLOOD = r"""
import socket
server = socket.create_server(('127.0.0.1', 0), backlog=512)
held, queued = [], 0
try:
    while queued < 400 << 20 and len(held) < 1000:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        client.connect(server.getsockname())
        held.append((client, server.accept()[0]))  # accepted, never read
        client.setblocking(False)
        try:
            while True:
                queued += client.send(b'x' * (1 << 20))
        except BlockingIOError:
            pass
except OSError as exc:
    print('stopped:', exc)
print('QUEUED_MIB', queued >> 20)
"""


def test_tcp_buffers_count_against_the_memory_limit(bubblewrap):
    """Cgroup v1 counts TCP buffers only once they have a limit of their own: 76 loopback
    connections nobody read queued 600 MiB under memory_mb=256 (host memory, up to the machine's
    tcp_mem, where every TCP socket on the host starts to starve). Now they stay near memory_mb."""
    with Sandbox(limits=SandboxLimits(timeout=20, memory_mb=128)) as box:
        if box._pool.cgroups is None:
            pytest.skip("no cgroup per call here: memory_mb is per process and socket buffers are not counted")
        result = box.run(TCP_FLOOD)
        queued = int(result.stdout.split("QUEUED_MIB")[-1])
        assert queued < 256, result.text
        assert box.run("print('ok')").stdout == "ok\n"


def test_a_call_cannot_take_the_machines_ptys(bubblewrap):
    """ptys come from one pool for the whole machine (kernel.pty.max, 4096 less 1024 kept for the
    host's own terminals): one call held all 3,071 until it ended, and every container and other
    sandbox call on the machine got ENOSPC. Each call's /dev/pts now holds at most 32."""
    code = ("import os\nfds = []\ntry:\n    while len(fds) < 200:\n"
            "        fds.append(os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY))\n"
            "except OSError as exc:\n    print('stopped:', exc.strerror)\nprint('PTYS', len(fds))")
    with Sandbox(limits=SandboxLimits(timeout=20)) as box:
        result = box.run(code)
        assert result.error is None and int(result.stdout.split("PTYS")[-1]) <= 32, result.text
        result = box.run("import os, pty\nm, s = pty.openpty()\nos.write(s, b'hi\\n')\nprint(os.read(m, 8))")
        assert result.error is None and result.stdout == "b'hi\\r\\n'\n", result.text


def test_a_crash_never_starts_a_core_dump_helper_on_the_host(bubblewrap):
    """Where core_pattern pipes to a program (apport, systemd-coredump: common defaults), the kernel
    ignores RLIMIT_CORE 0 and starts a root helper on the host for every crash, so a fork-and-crash
    loop was a host denial of service; it skips piping only at 1 (too small for a core file too).
    The code runs with RLIMIT_CORE 1, which it cannot raise; a crash is still reported."""
    with Sandbox(limits=SandboxLimits(timeout=20)) as box:
        result = box.run("import resource; print(resource.getrlimit(resource.RLIMIT_CORE))")
        assert result.stdout == "(1, 1)\n", result.text
        result = box.run("import resource; resource.setrlimit(resource.RLIMIT_CORE, (2, 2))")
        assert "not allowed to raise maximum limit" in result.text, result.text
        assert box.run("import ctypes; ctypes.string_at(0)").text == "killed by signal SIGSEGV"
