"""The warm process behind every sandbox of one worker process (standard library only; runs as a
script, and the host imports it for a helper).

It imports the families' common modules once, then serves requests, one JSON line each on stdin:
``{"id", "code", "timeout", "episode", "uid", "limits"}``, answered (in any order: calls of
different episodes overlap) with one JSON line carrying the same ``id``. Each request is served by
a fresh fork, so nothing of one call survives into another but the episode's files:

* at level ``bubblewrap`` the server runs inside bubblewrap (no network, read-only system files, a
  scrubbed environment) and sees every episode's directory under ``/sandbox/episodes``. Per call
  its *zygote* (forked once after the preload, before any request: it never holds another
  episode's data) forks a child that unshares new mount, PID and IPC namespaces and forks the
  call's *monitor*: the new PID namespace's init, which enters the episode's network namespace,
  mounts that episode's workspace at ``/workspace`` and its own directory at ``/tmp``, a fresh
  ``/dev/shm`` and ``/proc``, hides ``/sandbox/episodes`` and ``/sandbox/cgroup`` and makes
  everything else read-only, loads the seccomp filter, and forks the code's process, which joins
  the call's cgroup (where the host gave cgroups). The code thus sees only its own episode's
  files and its own processes, and the kernel kills everything in the namespace when the monitor
  exits;
* at level ``rlimits`` (opted into: no isolation) the monitor is a plain fork working in the
  episode's directory.

The monitor forks the code's process, which drops to the episode's unprivileged uid (root hosts)
or drops every capability (elsewhere), sets the resource limits and runs the code; the monitor
collects its capped stdout/stderr, enforces the wall-clock timeout by killing the whole process
tree, sweeps away anything the code left running, and writes one JSON line to the server. The
server, its monitors and the host channel are non-dumpable and out of the code's reach: the code's
process keeps none of their descriptors, and (bubblewrap) cannot see or signal them.

Configuration comes as the first line on stdin: the level, where episode directories are, modules to
preload, ``sys.path`` (inside bubblewrap the interpreter runs with ``-S`` at a neutral path), the
seccomp program, how many processes this uid already runs outside (the base of the process
limit), and the parent cgroups to make each call's cgroup under (or none).

On non-root hosts the same script, run with ``--hold-mounts``, holds the user and mount namespace
where the episodes' tmpfs are mounted, and with ``--enter`` starts the server inside it.
"""

import collections
import gc
import json
import os
import re
import resource
import selectors
import signal
import sys
import time
import traceback

# Exit statuses the child uses to say which limit it hit (the code itself may also exit with them,
# which only mislabels its own failure).
EXIT_MEMORY, EXIT_FILE_SIZE, EXIT_PROCESSES = 120, 121, 122


EPISODE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Where no cgroup counts a call's memory, nothing counts its socket buffers (nor pipes'): they
# are bounded through the descriptors that hold them, at most this many per process, each
# socket's buffers at the host's defaults (setsockopt cannot raise them, see the seccomp filter)
# or, for TCP, at TCP_BUFFERS a direction (its own sysctls in the episode's network namespace):
# 128 x 256 KiB = 32 MiB a process, memory_mb / max_processes at the default limits.
MAX_FILES_WITHOUT_CGROUP = 128
TCP_BUFFERS = "4096 65536 131072"  # net.ipv4.tcp_rmem and tcp_wmem: min, initial, max bytes
GRACE = 5.0  # seconds past a call's timeout before the server kills a monitor that did not answer
# Set by configure() when it runs as the server (the host imports this module for its helpers).
CONFIG: dict = {}
ISOLATED = False
EPISODES = ""
MAX_CALLS = 8  # calls at once; more wait their turn (each holds two processes)
SPARE_MONITORS = 2


def configure():
    """Read the configuration: the first line on stdin (not the command line: /proc/PID/cmdline
    is readable inside), and nothing past it."""
    global ISOLATED, EPISODES, MAX_CALLS
    data = bytearray()
    while not data.endswith(b"\n"):  # a byte at a time: no request is read with it (see zygote())
        chunk = os.read(0, 1)
        if not chunk:
            sys.exit(0)
        data += chunk
    CONFIG.update(json.loads(data))
    if CONFIG.get("path"):
        sys.path[:] = CONFIG["path"]
    ISOLATED = CONFIG["level"] == "bubblewrap"
    EPISODES = CONFIG["episodes"]
    MAX_CALLS = CONFIG.get("max_calls", MAX_CALLS)


PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 4, 38, 22, 24, 47
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 1, 2, 4, 32, 4096, 16384, 1 << 19
_libc = []


def libc():
    if not _libc:
        import ctypes

        _libc.append(ctypes.CDLL(None, use_errno=True))
    return _libc[0]


def check(rc, what):
    if rc != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def set_dumpable(value):
    libc().prctl(PR_SET_DUMPABLE, value, 0, 0, 0)


def mount(source, target, fstype, flags, data=None):
    check(libc().mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def remount_read_only(path):
    """Make the mount at ``path`` read-only, keeping the flags it has (a user namespace may not
    clear flags its mounts were made with)."""
    kept = os.statvfs(path).f_flag & (2 | 4 | 8 | 1024 | 2048 | 4096)  # ST_ = MS_ NOSUID NODEV NOEXEC *ATIME
    mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


_SECCOMP = []


def seccomp_program():
    """The host's classic-BPF filter (built by ``sandbox.seccomp_filter``) as the ``sock_fprog``
    prctl takes, built once in the server (not in every call's fresh fork)."""
    if not _SECCOMP and CONFIG.get("seccomp"):
        import ctypes

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        program = bytes.fromhex(CONFIG["seccomp"])
        buf = ctypes.create_string_buffer(program)
        _SECCOMP.append((SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p)), buf))
    return _SECCOMP[0][0] if _SECCOMP else None


def load_seccomp():
    import ctypes

    program = seccomp_program()
    if program is not None:
        check(libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        check(libc().prctl(PR_SET_SECCOMP, 2, ctypes.byref(program), 0, 0), "seccomp")


def drop_capabilities():
    """Give up every capability for good: ambient, bounding set, then effective/permitted/inheritable
    (a process of the sandbox's user namespace holds them all, and the code must hold none)."""
    import ctypes

    lib = libc()
    lib.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    for cap in range(64):  # needs CAP_SETPCAP (the user namespace's); EINVAL past the last one
        if lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    check(lib.capset(header, data), "capset")


def preload():
    for name in CONFIG.get("preload", []):
        try:
            __import__(name)
        except Exception:  # a missing optional module only makes calls slower
            pass


def user_process_count(uid):
    """Processes of ``uid`` visible here (the base of RLIMIT_NPROC, which counts them all; the host
    uses this too)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            count += int(line.split()[1]) == uid
                            break
            except (OSError, ValueError):
                pass
    return count


def kill_uid(uid):
    """Kill every process running as ``uid`` (an episode's own: no other process has it) until a
    look finds none not yet killed. Where no PID namespace or cgroup holds a call (level
    ``rlimits`` on a root host without cgroups), this is what ends a process that left the
    call's session (a double fork with ``setsid``): it outlived the call and the episode, raced
    the host's walks of the workspace, and could read the files of a later episode given that uid.
    Each process is signalled through a pidfd opened before its owner is read: a pid reused
    meanwhile is never signalled."""
    killed = set()
    for _ in range(1000):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in killed or int(entry.name) == os.getpid():
                continue
            try:
                handle = os.pidfd_open(int(entry.name))
            except OSError:
                continue
            try:
                with open(f"/proc/{entry.name}/status") as f:
                    ids = next((line.split()[1:5] for line in f if line.startswith("Uid:")), [])
                if str(uid) in ids:
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
                    killed.add(int(entry.name))
                    found = True
            except (OSError, ValueError):
                pass
            finally:
                os.close(handle)
        if not found:
            return


# -- the code's process ------------------------------------------------------------------------


STATUS_FD = 1023  # where the code's process reports how the code ended (see run_child)


def run_child(request, nproc, write_out, write_err, write_status, in_cgroup=False):
    """In the forked child: limits, identity, then the code. Never returns.

    When the code ends, the process reports its exit status on ``STATUS_FD`` and closes its output
    before exiting: tearing down a copy of a large warm process takes milliseconds, and the call
    need not wait for it (a process killed by a signal reports nothing: the monitor then waits)."""
    limits = request["limits"]
    me = os.getpid()  # the code's forks run on through this function too: only this process reports
    gc.enable()
    try:
        if in_cgroup:  # the OOM killer takes the code's processes, never the monitor that reports
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(write_out, 1)
        os.dup2(write_err, 2)
        os.dup2(write_status, STATUS_FD)
        os.closerange(3, STATUS_FD)
        os.closerange(STATUS_FD + 1, 65536)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes fail with EFBIG instead
        signal.signal(signal.SIGINT, signal.default_int_handler)
        mb = 1024 * 1024
        for which, value in (
            (resource.RLIMIT_CPU, limits["cpu_seconds"]),
            (resource.RLIMIT_AS, limits["memory_mb"] * mb if in_cgroup else
             CONFIG.get("base_as", 0) + limits["memory_mb"] * mb // limits["max_processes"]),
            (resource.RLIMIT_FSIZE, limits["max_file_mb"] * mb),
            (resource.RLIMIT_NPROC, nproc),
            # 1, not 0: a core_pattern that pipes to a program (apport, systemd-coredump) ignores
            # 0 and starts a root helper on the host for each crash; the kernel skips piping at 1,
            # which is also too small for a core file
            (resource.RLIMIT_CORE, 1),
        ):
            resource.setrlimit(which, (value, value))
        if not in_cgroup:  # nothing counts socket buffers: each descriptor may hold a socket's
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            files = MAX_FILES_WITHOUT_CGROUP if hard == resource.RLIM_INFINITY else min(MAX_FILES_WITHOUT_CGROUP, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        uid = request.get("uid")
        if uid is not None:  # root hosts: the episode's own unprivileged uid
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        if ISOLATED:
            drop_capabilities()
        if ISOLATED:
            set_dumpable(1)  # the channel is closed; the code may see its own /proc entries
        os.chdir("/workspace" if ISOLATED else os.path.join(EPISODES, "ep-" + request["episode"], "workspace"))
        os.environ["HOME"] = os.getcwd()
        if not ISOLATED:  # the episode's own /tmp (bubblewrap mounts it at /tmp): temp files made at
            # level rlimits landed in the host's /tmp, outlived the episode and were there for the next
            os.environ["TMPDIR"] = os.path.join(EPISODES, "ep-" + request["episode"], "tmp")
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin = open(0, "r", closefd=False)
        sys.argv = ["<code>"]
    except BaseException:
        os.write(2, traceback.format_exc().encode())
        os._exit(125)
    status = 0
    try:
        exec(compile(request["code"], "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # (as `python file.py` shows it: from the code's own frames, not this one)
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        status = 1
        if isinstance(exc, MemoryError):
            status = EXIT_MEMORY
        elif isinstance(exc, OSError) and exc.errno in (27, 28, 122):  # EFBIG, ENOSPC, EDQUOT
            status = EXIT_FILE_SIZE
        elif isinstance(exc, BlockingIOError) and exc.errno == 11:  # EAGAIN from fork
            status = EXIT_PROCESSES
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    try:
        if os.getpid() == me:
            os.write(STATUS_FD, b"%d" % (status & 0xFF))
        for fd in (1, 2, STATUS_FD):
            os.close(fd)
    except OSError:
        pass
    os._exit(status & 0xFF)


# -- the call's monitor ------------------------------------------------------------------------


def kill_all(child):
    """Kill what the call left behind: its process group, and as init of the call's PID namespace
    every other process in it (grandchildren that called setsid included). Once SIGKILL is
    pending a process never runs again, so the result may go out before they are reaped."""
    try:
        os.killpg(child, signal.SIGKILL)
    except OSError:
        pass
    if os.getpid() == 1:
        try:
            os.kill(-1, signal.SIGKILL)  # everything but init
        except OSError:
            pass


def reap():
    """Collect exited children; True once none is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def sweep(child):
    """``kill_all`` until nothing is left, reaping."""
    for _ in range(1000):
        kill_all(child)
        if reap():
            return
        time.sleep(0.001)


def loopback_up():
    """The call's own network namespace has only a loopback device, down: bring it up (as
    bubblewrap does), so code may talk to itself over 127.0.0.1 and to nothing else."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH22x", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS: UP LOOPBACK RUNNING


def new_network():
    """A network namespace with only a loopback device, up, held by a descriptor (no process needs
    to live in it). One per episode, made at its first call and closed when it ends: nothing of
    another episode's sockets (``/proc/net/tcp``'s TIME_WAIT entries) can reach its calls. Not one
    per call: network namespaces cost milliseconds of kernel work each and serialise on a global lock."""
    ready_read, ready_write = os.pipe()
    hold_read, hold_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(ready_write, 0)
            os.dup2(hold_read, 1)
            os.closerange(2, 65536)  # it holds nothing of the server's
            ready_write, hold_read = 0, 1
            check(libc().unshare(CLONE_NEWNET), "unshare")
            loopback_up()
            set_dumpable(1)  # so that the server may open its /proc/PID/ns/net
            os.write(ready_write, b"1")
            os.read(hold_read, 1)
        finally:
            os._exit(0)
    for fd in (ready_write, hold_read):
        os.close(fd)
    try:
        if os.read(ready_read, 1) != b"1":
            raise OSError("could not make a network namespace")
        return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        for fd in (ready_read, hold_write):
            os.close(fd)
        os.waitpid(pid, 0)


def outer_pid():
    """This process's pid in the server's PID namespace (where /proc still is)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    raise OSError("no NSpid in /proc/self/status")


def prepare_namespace():
    """In the monitor, init of fresh namespaces, before it knows its episode: a fresh /proc, /dev/shm
    and /dev/pts, /dev read-only, nothing propagating back."""
    mount("none", "/", None, MS_REC | MS_SLAVE)  # an episode's tmpfs mounted later still arrives
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    # ptys come from one pool for the whole machine (kernel.pty.max): a call may take a few, not all
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID, "newinstance,ptmxmode=0666,mode=620,max=32")
    remount_read_only("/dev")


def enter_episode(episode, limits=None):
    """Then only this episode's files: its workspace at /workspace and its own /tmp, every other
    episode hidden, the rest read-only; then the seccomp filter. With ``limits`` (no cgroup: no
    limit counts tmpfs pages or socket buffers) ``/dev/shm`` shrinks to one process's share of
    ``memory_mb``, and TCP's buffers to ``TCP_BUFFERS``."""
    if limits is not None:
        share = limits["memory_mb"] * 1024 * 1024 // limits["max_processes"]
        mount("tmpfs", "/dev/shm", None, MS_REMOUNT | MS_NOSUID | MS_NODEV,
              f"size={max(min(share, 64 << 20), 1 << 20)}")  # size=0 would be no limit at all
        # nor socket buffers: TCP's, sysctls of the episode's network namespace (this one, since
        # setns; net.core's are the host's), top out at TCP_BUFFERS (the code cannot change them)
        for name in ("tcp_rmem", "tcp_wmem"):
            with open(f"/proc/sys/net/ipv4/{name}", "w") as f:
                f.write(TCP_BUFFERS)
    mount(f"{EPISODES}/ep-{episode}/workspace", "/workspace", None, MS_BIND | MS_REC)
    mount(f"{EPISODES}/ep-{episode}/tmp", "/tmp", None, MS_BIND | MS_REC)
    mount("tmpfs", EPISODES, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=000")
    if CONFIG.get("cgroups"):
        mount("tmpfs", "/sandbox/cgroup", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=000")
    remount_read_only("/")
    load_seccomp()


def make_cgroup():
    """A call's own cgroup (one per hierarchy), capping its processes' memory and number together;
    None where the host gave none (then each process has its own share, see run_child). Made by
    the server with the spare monitor, which joins it before its request comes (moving a process
    between cgroups waits for an RCU grace period: ~10 ms on a busy machine, off the call's path);
    its limits are set when the request comes; removed once empty."""
    dirs = CONFIG.get("cgroups")
    if not dirs:
        return None
    name = "call-" + os.urandom(8).hex()
    try:
        for parent in dirs.values():
            os.mkdir(f"{parent}/{name}", 0o755)
    except OSError:
        remove_cgroup(name)
        raise
    return name


def limit_cgroup(name, limits):
    """Set the call's limits: ``memory_mb`` (no swap) and ``max_processes`` (and its monitor).
    Cgroup v1 counts TCP buffers only once they have a limit of their own (loopback connections
    held 600 MiB past a 256 MiB ``memory_mb``): they get ``memory_mb`` too (v2 counts them with the rest)."""
    memory, pids = limits["memory_mb"] << 20, limits["max_processes"] + 1
    files = {"memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory),
                        ("memory.kmem.tcp.limit_in_bytes", memory)],
             "pids": [("pids.max", pids)],
             "unified": [("memory.max", memory), ("memory.swap.max", 0), ("pids.max", pids)]}
    for key, parent in CONFIG["cgroups"].items():
        for file, value in files[key]:
            path = f"{parent}/{name}/{file}"
            if file.startswith("pids") or file in ("memory.limit_in_bytes", "memory.max") or os.path.exists(path):
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, b"%d" % value)
                finally:
                    os.close(fd)


def remove_cgroup(name):
    """True once the call's cgroups are gone (they stay while a killed process is still exiting)."""
    gone = True
    for parent in (CONFIG.get("cgroups") or {}).values():
        try:
            os.rmdir(f"{parent}/{name}")
        except FileNotFoundError:
            pass
        except OSError:
            gone = False
    return gone


def kill_cgroup(name):
    """Kill every process in the call's cgroup: at level ``rlimits`` no PID namespace ends what
    left the call's process group (a double fork with ``setsid``). A process with SIGKILL pending
    never forks again, so this ends once a look finds none it has not killed."""
    path = f"{next(iter(CONFIG['cgroups'].values()))}/{name}"
    try:
        fd = os.open(f"{path}/cgroup.kill", os.O_WRONLY)  # cgroup v2, Linux 5.14 on: at once
        try:
            os.write(fd, b"1")
            return
        finally:
            os.close(fd)
    except OSError:
        pass
    killed = set()
    for _ in range(1000):
        try:
            with open(f"{path}/cgroup.procs") as f:
                pids = {int(pid) for pid in f.read().split()} - killed
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            kill(pid)
        killed |= pids


def join_cgroup(name):
    """In the monitor, before its request (and before the cgroups are hidden): join the call's
    cgroups, so the code's process starts in them; returns a descriptor to read the OOM kill
    count from. The code's processes volunteer first for the OOM killer (see run_child)."""
    dirs = CONFIG["cgroups"]
    for parent in dirs.values():
        fd = os.open(f"{parent}/{name}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    events = (f"{dirs['memory']}/{name}/memory.oom_control" if "memory" in dirs
              else f"{dirs['unified']}/{name}/memory.events")
    return os.open(events, os.O_RDONLY | os.O_CLOEXEC)


def oom_kills(fd):
    for line in os.pread(fd, 4096, 0).decode().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def monitor(request, nproc, cgroup=None):
    """Run one call in a fresh child and return its result (what the host reads); the caller
    sweeps up after sending it."""
    limits = request["limits"]
    timeout = float(request.get("timeout", limits["timeout"]))
    cap = limits["max_output_chars"]
    read_out, write_out = os.pipe()
    read_err, write_err = os.pipe()
    read_status, write_status = os.pipe()
    start = time.monotonic()
    child = os.fork()
    if child == 0:
        for fd in (read_out, read_err, read_status):
            os.close(fd)
        run_child(request, nproc, write_out, write_err, write_status, cgroup is not None)
    for fd in (write_out, write_err, write_status):
        os.close(fd)
    buffers = {read_out: bytearray(), read_err: bytearray()}
    dropped = {read_out: 0, read_err: 0}
    reported = bytearray()
    sel = selectors.DefaultSelector()
    for fd in (read_out, read_err, read_status):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    exit_fd = os.pidfd_open(child)  # readable once the code's process is gone: no polling
    sel.register(exit_fd, selectors.EVENT_READ)
    deadline = start + timeout
    timed_out = False
    status = None  # a wait status
    ended_at = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = status is None
            break
        # once the code ended: only what is left in the pipes (50 ms for what still holds them)
        wait = deadline - now if status is None else ended_at + 0.05 - now
        # the exit last: a reported status is there before the process is torn down
        for key, _ in sorted(sel.select(max(wait, 0)), key=lambda event: event[0].fd == exit_fd):
            if key.fd == exit_fd:
                _, status = os.waitpid(child, 0)
                ended_at = ended_at or time.monotonic()
                sel.unregister(exit_fd)
                continue
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if key.fd == read_status:
                if chunk:
                    reported = (reported + chunk)[:8]  # only what the code's process wrote counts
                    continue
                sel.unregister(read_status)
                if reported.isdigit() and status is None:  # the code ended and its output is closed
                    status, ended_at = (int(reported) & 0xFF) << 8, time.monotonic()
                continue
            if not chunk:
                sel.unregister(key.fd)
                continue
            room = max(cap * 4 - len(buffers[key.fd]), 0)  # bytes; decoded and cut to chars later
            buffers[key.fd] += chunk[:room]
            dropped[key.fd] += len(chunk) - min(room, len(chunk))
        # Done when the code ended and its output is drained - or, if something it started still
        # holds the pipes open, shortly after it ended (the sweep ends those).
        if status is not None and (not ({read_out, read_err} & set(sel.get_map()))
                                   or time.monotonic() - ended_at > 0.05):
            break
    kill_all(child)
    if not ISOLATED and request.get("uid") is not None:  # no PID namespace ends what left the session
        kill_uid(request["uid"])
    sel.close()
    for fd in (*buffers, read_status, exit_fd):
        os.close(fd)
    result = {"timed_out": timed_out, "seconds": time.monotonic() - start}
    if cgroup is not None and oom_kills(cgroup):
        result["oom"] = True
    if status is None:
        status = signal.SIGKILL  # timed out: killed
    result["exit_code"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    result["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    for name, fd in (("stdout", read_out), ("stderr", read_err)):
        text, extra = cut_output(bytes(buffers[fd]), cap)
        result[name] = text
        result[name + "_dropped_bytes"] = dropped[fd] + extra
    return result, child


def cut_output(data, cap):
    """``(text, bytes left out)``: ``data`` decoded, a byte that is not UTF-8 shown as ``\\xNN``,
    cut to ``cap`` characters (never inside such an escape). What is left out is counted in the
    code's bytes, not in the escapes' four characters each."""
    text = data.decode("utf-8", errors="backslashreplace")
    if len(text) <= cap:
        return text, 0
    raw = data.decode("utf-8", errors="surrogateescape")  # the same, one character per bad byte
    end, before = None, 0  # where the shown text ends in raw, and the bad bytes before it
    for bad in re.finditer("[\udc80-\udcff]", raw):  # shown as 4 characters each
        if bad.start() + 3 * before + 4 > cap:  # its escape does not fit
            end = min(bad.start(), cap - 3 * before)
            break
        before += 1
    if end is None:
        end = cap - 3 * before
    shown = raw[:end].encode("utf-8", errors="surrogateescape")
    return shown.decode("utf-8", errors="backslashreplace"), len(data) - len(shown)


ZYGOTE = []  # the server's end of its socket to the zygote


def start_zygote():
    """Fork the zygote: the process every call's monitor is forked from. It is forked once, after
    the preload and before the first request is read, and it only ever reads "fork a monitor"
    and answers with the monitor's two channel ends, so its memory - and
    so the code's - never holds another episode's request, result or queue (a monitor forked from
    the server's loop inherited its frames: ``sys._getframe().f_back`` reached them)."""
    import socket

    server_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:
        try:
            os.dup2(zygote_end.fileno(), 3)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the host's request channel
            os.closerange(4, 65536)
            zygote(socket.socket(fileno=3))
        finally:
            os._exit(0)
    zygote_end.close()
    ZYGOTE.append(server_end)


def zygote(sock):
    """The zygote's loop: per message, fork a monitor (``serve_call``) and pass back the server's
    end of its request socket and the read end of its result pipe. Never returns."""
    import socket

    signal.signal(signal.SIGCHLD, lambda *_: reap())  # forks that exit (the monitors are reparented)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 256, 1)
        except OSError:
            os._exit(0)
        if not message:  # the server is gone
            os._exit(0)
        for fd in fds:
            os.close(fd)
        cgroup = message[1:].decode() or None  # the name of the call's cgroup, if any
        request_read, request_write = (s.detach() for s in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
        result_read, result_write = os.pipe()
        if os.fork() == 0:
            try:
                os.close(request_write)
                os.close(result_read)
                serve_call(request_read, result_write, cgroup)
            finally:
                os._exit(1)  # a fork never returns into the zygote's loop
        for fd in (request_read, result_write):
            os.close(fd)
        try:
            socket.send_fds(sock, [b"m"], [request_write, result_read])
        except OSError:
            os._exit(0)
        os.close(request_write)
        os.close(result_read)


def new_monitor():
    """A call's monitor from the zygote, ready before its request comes (the server keeps one
    spare, so a call does not wait for forks, namespaces and cgroups): ``(request socket, result
    pipe, cgroup name or None)``. The monitor writes its pid, then, once it has served the one
    request it reads, its result."""
    import socket

    cgroup = make_cgroup()
    sock = ZYGOTE[0]
    sock.send(b"n" + (cgroup or "").encode())
    _, fds, _, _ = socket.recv_fds(sock, 16, 2)
    if len(fds) != 2:
        raise OSError("the zygote is gone")
    request_write, result_read = fds
    os.set_blocking(result_read, False)
    return request_write, result_read, cgroup


def send_request(fd, data, network):
    """Send the request, with the episode's network namespace (a descriptor) if it has one.
    Raises OSError only if nothing reached the monitor (then another may be sent it): the
    monitor closes its end as soon as it has read the request, and one more ``send`` (even of
    nothing: ``sendall(b"")`` sends) would then fail after a delivery, running the call twice."""
    import socket

    sock = socket.socket(fileno=fd)
    try:
        sent = socket.send_fds(sock, [data[:65536]], [network]) if network is not None else sock.send(data[:65536])
        try:
            if sent < len(data):
                sock.sendall(data[sent:])
        except OSError:
            pass  # the monitor has part of it: it fails the call, which is never run twice
    finally:
        sock.close()


def read_request(fd):
    """``(request, network namespace descriptor or None)``; None for a spare the server let go."""
    import socket

    sock = socket.socket(fileno=fd)
    data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
    while data and not data.endswith(b"\n"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    sock.close()
    if not data.endswith(b"\n"):
        return None
    return json.loads(data), (fds[0] if fds else None)


def serve_call(request_fd, result_fd, cgroup_name=None):
    """In the fork: become (bubblewrap: create, in new namespaces) the call's monitor, then serve
    the request read from ``request_fd``. Never returns."""
    child = None
    gc.disable()  # short-lived: nothing to collect, and a pass would copy pages it shares
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # nothing of the server's channel is kept
        import fcntl  # out of the way of 3 and 4 first: either may be one of these
        request_fd, result_fd = (fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (request_fd, result_fd))
        os.dup2(request_fd, 3)
        os.dup2(result_fd, 4)
        os.closerange(5, 65536)
        request_fd, result_fd = 3, 4
        if ISOLATED:
            try:
                check(libc().unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
                pid = os.fork()  # the monitor: init of the new PID namespace
            except BaseException:
                os.write(result_fd, b"0\n")  # no monitor
                raise
            if pid:
                os._exit(0)  # the monitor is reparented to the server, which reaps it
            os.write(result_fd, b"%d\n" % outer_pid())  # before anything it writes after
            set_dumpable(0)  # the code runs as this uid (non-root hosts): no /proc/1/fd, no memory
            prepare_namespace()
        else:  # as before: at this level nothing shields the monitor from the code
            set_dumpable(1)
            os.write(result_fd, b"%d\n" % os.getpid())
        cgroup = join_cgroup(cgroup_name) if cgroup_name else None
        request, network = read_request(request_fd) or (None, None)
        if request is None:
            os._exit(0)
        if ISOLATED:  # the episode's own network namespace: nothing of another episode's sockets
            if network is None:
                raise OSError("no network namespace for the call")
            check(libc().setns(network, CLONE_NEWNET), "setns")
            os.close(network)
        if ISOLATED:
            enter_episode(request["episode"], None if cgroup_name else request["limits"])
        result, child = monitor(request, request["nproc"], cgroup)
    except BaseException:
        result = {"internal_error": traceback.format_exc()}
    data = json.dumps(result).encode() + b"\n"
    try:
        while data:
            data = data[os.write(result_fd, data):]
        os.close(result_fd)  # the result is out: the rest need not delay it
    finally:
        if child is not None:
            sweep(child)
        os._exit(0)


def process_limit(request):
    """RLIMIT_NPROC for the call: the processes its uid already has, plus its allowance."""
    allowance = request["limits"]["max_processes"]
    if request.get("uid") is not None:
        return allowance  # its own uid: only its own processes count
    if ISOLATED:  # this user namespace's processes (kernel >= 5.14) and, before, the host's
        return CONFIG["nproc_base"] + len([p for p in os.listdir("/proc") if p.isdigit()]) + allowance
    return user_process_count(os.getuid()) + allowance


# -- the server --------------------------------------------------------------------------------


class Call:
    __slots__ = ("id", "episode", "data", "monitor", "deadline", "eof", "cancelled", "cgroup")

    def __init__(self, request_id, episode, deadline, cgroup):
        self.id, self.episode, self.data, self.monitor, self.deadline = request_id, episode, b"", None, deadline
        self.eof = self.cancelled = False
        self.cgroup = cgroup


def kill(pid):
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)  # the monitor: the kernel then kills its whole namespace
        except OSError:
            pass


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def main():
    configure()
    set_dumpable(0)  # never model code's: its memory and descriptors stay out of reach
    if ISOLATED:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as init, a signal without handler never arrives
    # The channel to the host gets a descriptor of its own; fd 1 goes to stderr (the host keeps it
    # for error messages), so whatever a preloaded module prints cannot corrupt the protocol.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    preload()
    seccomp_program()
    with open("/proc/self/status") as f:  # what every call's process starts with (shared pages)
        CONFIG["base_as"] = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    # Every call forks from here: keep the collector off what is already loaded, or its first
    # full pass in a fork touches (and so copies) every page of it.
    gc.freeze()
    start_zygote()

    def reply(message):
        try:
            out.write(json.dumps(message) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):  # the host is gone: leave quietly
            os._exit(0)

    reply({"ready": True, "pid": os.getpid()})
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    os.set_blocking(0, False)
    wake_read, wake_write = os.pipe()  # a byte per SIGCHLD: monitors are reaped as they exit
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(wake_read, selectors.EVENT_READ)
    pending = b""
    calls = {}  # result pipe fd -> Call
    queue = collections.deque()  # requests waiting for one of the max_calls slots
    networks = {}  # episode -> its network namespace (a descriptor), until the host says it ended
    doomed = [entry.name for parent in (CONFIG.get("cgroups") or {}).values()  # a previous server's
              for entry in os.scandir(parent) if entry.is_dir()]  # ended calls' cgroups, removed when empty

    # Monitors (and a network namespace for a new episode) ready before the calls that need them:
    # two monitors, so that back-to-back calls never wait for one to fork, unshare and join its cgroup.
    spare = [new_monitor() for _ in range(SPARE_MONITORS)]
    spare_networks = [new_network()] if ISOLATED else []

    def let_go(request_fd, read_fd, cgroup):
        """A monitor that will serve nothing: it exits when its request socket closes unread."""
        for fd in (request_fd, read_fd):
            if fd is not None:
                os.close(fd)
        if cgroup:
            doomed.append(cgroup)

    def dispatch(request):
        """Hand ``request`` to a monitor. Whatever goes wrong here (a request the host should not
        have sent, a monitor that cannot start) fails this request alone, with its own message,
        and lets its monitor go: a queued request is dispatched from ``finish``, outside
        ``handle``'s guard, where an exception ended the server and every other episode's call."""
        taken = None
        try:
            request["nproc"] = process_limit(request)
            data = json.dumps(request).encode() + b"\n"
            network = None
            if ISOLATED:
                network = networks.get(request["episode"])
                if network is None:
                    network = networks[request["episode"]] = spare_networks.pop() if spare_networks else new_network()
            deadline = time.monotonic() + float(request.get("timeout", 10)) + GRACE
            for attempt in range(2):
                taken = list(spare.pop() if spare and not attempt else new_monitor())  # request, result, cgroup
                try:
                    if taken[2]:
                        limit_cgroup(taken[2], request["limits"])
                    request_fd, taken[0] = taken[0], None  # send_request closes the request socket
                    send_request(request_fd, data, network)  # the monitor reads it once its namespaces are ready
                    break
                except OSError:  # a spare that died: a fresh monitor
                    if attempt:
                        raise
                    let_go(*taken)
                    taken = None
            _, read_fd, cgroup = taken
            calls[read_fd] = Call(request.get("id"), request["episode"], deadline, cgroup)
            sel.register(read_fd, selectors.EVENT_READ)
        except Exception:
            if taken is not None and taken[1] not in calls:
                let_go(*taken)
            reply({"id": request.get("id"), "internal_error": traceback.format_exc()})

    def finish(fd, call, result):
        sel.unregister(fd)
        os.close(fd)
        del calls[fd]
        if ISOLATED and call.monitor:
            kill(call.monitor)  # nothing of the call lingers into the episode's next one
        elif call.cgroup:
            kill_cgroup(call.cgroup)  # nor at level rlimits where a cgroup holds the call
        if call.cgroup:  # removed once its processes are gone
            doomed.append(call.cgroup)
        result["id"] = call.id
        reply(result)
        while queue and len(calls) < MAX_CALLS:
            request = queue.popleft()
            reply({"id": request.get("id"), "started": True})
            dispatch(request)
        try:
            while len(spare) < SPARE_MONITORS and not queue:  # made while the model reads this result
                spare.insert(0, new_monitor())  # the oldest is used first: it is ready
            if ISOLATED and not spare_networks and not queue:
                spare_networks.append(new_network())
        except Exception:  # no spare this time: the next call makes its own, or fails alone
            traceback.print_exc()

    def result_of(call):
        lines = call.data.split(b"\n")
        try:
            if len(lines) != 3 or lines[2] or call.monitor == -1:
                raise ValueError("not the monitor's pid and one result line")
            result = json.loads(lines[1])
            if not isinstance(result, dict):
                raise ValueError("not an object")
            if call.monitor == 0 and "internal_error" not in result:
                raise ValueError("a result without a monitor")
        except ValueError as exc:
            # Only the monitor writes this pipe: anything else means the code reached it (level
            # rlimits, where nothing shields the monitor). Its result is not trusted.
            result = {"out_of_step": f"{exc}: {bytes(call.data[:300])!r}"}
        return {"cancelled": True} if call.cancelled else result

    def handle(request):
        if "forget" in request:  # the episode ended: its network namespace goes
            network = networks.pop(request["forget"], None)
            if network is not None:
                os.close(network)
            return
        if "cancel" in request:  # the episode ended while its call ran or waited
            for call in calls.values():
                if call.episode == request["cancel"]:
                    call.cancelled = True
                    kill(call.monitor)
            for queued in [q for q in queue if q.get("episode") == request["cancel"]]:
                queue.remove(queued)
                reply({"id": queued.get("id"), "cancelled": True})
            return
        if not EPISODE_NAME.match(str(request.get("episode"))):
            raise ValueError(f"bad episode name {request.get('episode')!r}")
        if len(calls) < MAX_CALLS:
            dispatch(request)
        else:
            queue.append(request)
            reply({"id": request.get("id"), "queued": True})

    while True:
        now = time.monotonic()
        wait = min([c.deadline for c in calls.values()], default=now + 1.0) - now
        if doomed:
            doomed[:] = [name for name in doomed if not remove_cgroup(name)]
            wait = min(wait, 0.02)
        for key, _ in sel.select(max(0.0, min(wait, 1.0)) if calls or doomed else None):
            if key.fd == wake_read:
                try:
                    while os.read(wake_read, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            if key.fd == 0:
                try:
                    chunk = os.read(0, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    for call in calls.values():  # the host is gone: so are its calls (and the spare)
                        kill(call.monitor)
                    return
                pending += chunk
                while b"\n" in pending:
                    line, _, pending = pending.partition(b"\n")
                    request = {}
                    try:
                        request = json.loads(line)
                        handle(request)
                    except Exception:
                        reply({"id": request.get("id") if isinstance(request, dict) else None,
                               "internal_error": traceback.format_exc()})
                continue
            call = calls.get(key.fd)
            if call is None:
                continue
            try:
                chunk = os.read(key.fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                call.eof = True
            else:
                call.data += chunk
                if len(call.data) > 1 << 26:  # far beyond what a monitor writes
                    call.data, call.eof = b"", True
            if call.monitor is None and b"\n" in call.data:
                try:
                    call.monitor = int(call.data.split(b"\n", 1)[0])
                except ValueError:
                    call.monitor = -1
                if call.cancelled:  # its episode ended before this pid was read (the same read as its request)
                    kill(call.monitor)
        while True:  # reap the forks, the monitors (reparented to this init) and any orphan
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        now = time.monotonic()
        for fd, call in list(calls.items()):
            if call.eof:
                finish(fd, call, result_of(call))
            elif now > call.deadline:  # the monitor stopped answering: kill it and its namespace
                kill(call.monitor)
                finish(fd, call, {"internal_error": "the call's monitor stopped answering and was killed"})


# -- non-root hosts: a user and mount namespace of the user's own, for the episodes' tmpfs ----------

CLONE_NEWUSER, MS_SHARED, MNT_DETACH = 0x10000000, 1 << 20, 2


def hold_mounts():
    """``--hold-mounts``: where the host user may not mount, hold a user and mount namespace of
    its own in which it may, so that episodes get a tmpfs each (their size holds while the code
    writes) as on root hosts. The host reaches their files through ``/proc/PID/root`` of this
    process and starts the server in here (``--enter``). Mounts what the host asks, a JSON line
    each on stdin (``mount``'s arguments, or ``["detach", target]``), answering ``ok`` or the
    error; exits when stdin closes, and the tmpfs go once no server is in the namespace either."""
    uid, gid = os.getuid(), os.getgid()
    check(libc().unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    mount("none", "/", None, MS_REC | MS_SLAVE)  # nothing mounted here reaches the host
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the host reads errors only until it is ready
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request[0] == "detach":
                check(libc().umount2(request[1].encode(), MNT_DETACH), f"umount {request[1]}")
            else:
                mount(*request)
            print("ok", flush=True)
        except Exception as exc:  # a bad request is answered, never fatal: the tmpfs would go
            print(str(exc).replace("\n", " ") or type(exc).__name__, flush=True)


def enter_mounts(pid, argv):
    """``--enter PID ARGV...``: run ARGV (the server) in the namespaces ``hold_mounts`` holds
    (process ``PID``), where the episodes' tmpfs are."""
    for name, flag in (("user", CLONE_NEWUSER), ("mnt", CLONE_NEWNS)):
        fd = os.open(f"/proc/{int(pid)}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        check(libc().setns(fd, flag), f"entering the sandbox's {name} namespace (setns)")
        os.close(fd)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--hold-mounts"]:
        hold_mounts()
    elif sys.argv[1:2] == ["--enter"]:
        enter_mounts(sys.argv[2], sys.argv[3:])
    else:
        main()
