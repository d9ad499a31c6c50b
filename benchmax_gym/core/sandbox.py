"""The one sandbox for model-written code.

Every tool that runs code the model wrote (Math's ``python``, Excel's ``run_python``) goes
through :class:`Sandbox`. Each episode has its own workspace; the process that runs code is shared:
one warm server per process (per level and set of preloaded modules, started by the first call
that needs it, stopped when the last environment or sandbox using it closes) that has the families'
common modules imported and, per call, forks a fresh child in new namespaces holding only that
episode's files. So a call costs milliseconds, not an interpreter start plus ``import openpyxl``,
and a thousand environments cost one server per worker process, not a process each; calls of
one episode see each other only through its workspace (and its ``/tmp``) files.

What the code can and cannot do, at level ``bubblewrap`` (the default where it works):

* files: it sees its episode's workspace (read-write, mounted at ``/workspace``), the episode's
  private writable ``/tmp``, a fresh ``/dev/shm``, and read-only system and Python directories -
  nothing of the host's other files, no answer files, no other episode's workspace (they are
  hidden in its mount namespace);
* network: none (a network namespace of its own per episode, loopback only; connecting anywhere
  fails, and nothing of another episode's sockets shows in ``/proc/net``);
* memory: each call's process is forked from a zygote forked before any request, so nothing of
  another episode's code, output or waiting requests is in its memory (frames, objects);
* processes: a PID namespace of its own per call (``/proc`` shows only the call's processes), whose
  init is the call's monitor, so the kernel drops any SIGKILL/SIGSTOP the code sends it, and kills
  everything in the namespace when the call ends; the monitor and the server are non-dumpable, so
  code running as the same uid (non-root hosts, where no second uid can be had without a setuid
  helper) cannot read their memory or open their file descriptors, the code's process never holds
  a channel, and the server cannot be seen at all. On root hosts the code also runs as the
  episode's own unprivileged uid, also its gid (no other open sandbox on the host has it: each
  holds a lock on its uid in ``/run/benchmax-gym-uids.lock``, released when the episode ends;
  none that ``/etc/passwd``, ``/etc/group``, ``/etc/subuid`` or ``/etc/subgid`` gives to a user, a
  group or a user's own namespaces, such as rootless containers'; from 200,000-999,999, then, once
  none of those is free (users' subuid blocks fill it), 1879048192-2147352575, or from the bands
  ``BENCHMAX_SANDBOX_UIDS`` names). Containers that share the host's uids but each have a ``/run``
  of their own coordinate only through a lock file they all see: set ``BENCHMAX_GYM_UID_LOCK`` to
  its path (a root-owned file on a directory mounted into each of them); elsewhere it drops every
  capability;
* system calls: a seccomp filter refuses what normal code never needs (io_uring, keyctl, bpf,
  perf_event_open, ptrace, mount, new namespaces, kernel modules, sockets of families other than
  unix, inet, inet6 and netlink, setting another process's resource limits, ...);
* host layout: the interpreter and its packages appear at neutral paths (``/sandbox/python``,
  ``/sandbox/venv``), not at their host paths (``/proc/self/mountinfo`` still names these two bind
  sources: the kernel shows a bind mount's source directory; the server's source, episodes and
  cgroups show no host path);
* limits per call: wall-clock timeout that kills the whole process tree (anything the code
  leaves running is swept away after every call), CPU seconds, memory and number of processes of
  the call as a whole (a cgroup per call where one can be made; elsewhere ``memory_mb /
  max_processes`` of address space each, no ``memfd_create`` or SysV shared memory, a
  ``/dev/shm`` of one such share, and socket buffers, which no per-process limit counts, bounded
  through their descriptors: 128 a process, each socket's buffers at the host's defaults
  (``setsockopt`` cannot raise them; ``net.core.wmem_default``, 208 KiB on most hosts) or, for
  TCP, 128 KiB a direction: about ``memory_mb`` in all at the default limits, but it grows with
  ``max_processes`` and the host's defaults, and pipes' pages are bounded the same way),
  size of any file written,
  workspace quota (workspace and ``/tmp`` together: a tmpfs per episode, so writes stop during the
  call - on non-root hosts mounted in a user namespace of the sandbox's own, whose files the host
  reaches through ``/proc/PID/root`` of the process holding it; where neither can be had,
  checked after the call), and stdout/stderr capped with a visible marker;
* environment: scrubbed - no inherited variables, so no API keys or tokens.

Levels: ``bubblewrap`` (bubblewrap from Debian's ``bubblewrap`` package, detected at run time);
``rlimits`` (only the resource limits, the scrubbed environment and a private working directory
and ``TMPDIR``: no file-system or network isolation, used only when asked for explicitly with
``mode="rlimits"``; on root hosts the code runs as the episode's own uid, and every process of
that uid is killed after each call and when the episode ends, even one that left the call's
session; on non-root hosts it runs as the host's own user: it can read the host process's
environment (``/proc/PID/environ``: API keys), files and other episodes' workspaces, signal the
host, and, where no cgroup holds the call, leave a process running past it); ``unavailable`` (no
bubblewrap and no opt-in: model code is refused).
``benchmax-gym doctor`` prints the level this machine supports.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import json
import logging
import math
import numbers
import os
import queue
import re
import secrets
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmax_gym.core.sandbox_server import kill_uid, user_process_count
from benchmax_gym.core.outcomes import DEADLINE, ENV_ERROR, TOOL_UNAVAILABLE
from benchmax_gym.core.tempdirs import owned_tempdir
from benchmax_gym.core.tools import Tool, ToolError, ToolFailure, tool
from benchmax_gym.core.warn import warn

log = logging.getLogger(__name__)

# A sandbox dropped without close() is closed by the garbage collector, which runs finalizers in
# whichever thread allocates at that moment: one holding a sandbox lock that the close takes too
# (reserving a uid, starting a pool's server, writing to it) waited for itself for ever. While a
# thread holds one (:func:`_critical`), closes that reach it are kept, and run once it lets go.
_HOLDING = threading.local()


@contextlib.contextmanager
def _critical(lock: Any):
    """``lock`` held; a sandbox close or pool release this thread meets meanwhile (a finalizer)
    waits until the outermost such lock is let go (:func:`_when_free`)."""
    depth = getattr(_HOLDING, "depth", 0)
    # Raised before the lock is taken and put back once it is let go: a collection in between
    # (as ``with`` acquires, or releases) found depth 0 and ran a close that took this same lock.
    _HOLDING.depth = depth + 1
    try:
        with lock:
            yield
    finally:
        _HOLDING.depth = depth
        if depth == 0:  # (also when the body raised: a close kept meanwhile is not lost)
            _run_kept()


def _run_kept() -> None:
    """Run the closes kept while this thread held a sandbox lock; one that fails is logged (as
    the collector would say it) and the others still run."""
    later = getattr(_HOLDING, "later", None)
    while later:
        try:
            later.pop(0)()
        except Exception:
            log.exception("a sandbox close kept for when its thread let go of a lock failed")


def _when_free(fn: Any) -> bool:
    """Keep ``fn`` for when this thread holds no sandbox lock; False when it holds none (run it now)."""
    if not getattr(_HOLDING, "depth", 0):
        return False
    _HOLDING.__dict__.setdefault("later", []).append(fn)
    return True


BUBBLEWRAP, RLIMITS, UNAVAILABLE = "bubblewrap", "rlimits", "unavailable"
MODES = ("auto", BUBBLEWRAP, RLIMITS)
SERVER = Path(__file__).with_name("sandbox_server.py")
SANDBOX_WORKSPACE = "/workspace"
#: calls one server runs at once (each holds a monitor and the code's process); more wait their turn
MAX_CONCURRENT_CALLS = max(8, 4 * (os.cpu_count() or 1))
EXIT_MEMORY, EXIT_FILE_SIZE, EXIT_PROCESSES = 120, 121, 122  # as in sandbox_server.py


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits. ``timeout`` is wall-clock seconds; sizes are MiB."""

    timeout: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024
    max_processes: int = 32
    max_file_mb: int = 64
    workspace_mb: int = 256
    max_output_chars: int = 20_000

    def __post_init__(self):
        """Refuse what would break every call (NaN, inf, a bool) here, naming the limit; sizes and
        counts are whole numbers (``512.0`` from a JSON or YAML config becomes ``512``)."""
        for name, value in asdict(self).items():
            if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0
                    or not isinstance(value, numbers.Integral) and not math.isfinite(value)):
                raise ValueError(f"sandbox limit {name} must be a finite positive number, got {value!r}")
            if name == "timeout":
                object.__setattr__(self, name, float(value))
                continue
            if not isinstance(value, numbers.Integral) and not float(value).is_integer():
                raise ValueError(f"sandbox limit {name} must be a whole number, got {value!r}")
            object.__setattr__(self, name, int(value))

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> "SandboxLimits":
        try:
            return cls(**(values or {}))
        except TypeError as exc:
            raise ValueError(f"sandbox_limits: {exc}; the limits are {list(cls.__dataclass_fields__)}") from None


@dataclass
class ExecResult:
    """What one run produced. ``error`` is ``None`` or a stable code for ``info["error"]``."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    error_override: str | None = None
    #: a failure of the sandbox, not of the code (core.outcomes): it ends the episode
    outcome: str | None = None

    @property
    def error(self) -> str | None:
        if self.error_override:
            return self.error_override
        if self.timed_out or self.signal == signal.SIGXCPU:
            return "tool_timeout"
        if self.exit_code == EXIT_MEMORY:
            return "memory_limit"
        if self.exit_code == EXIT_FILE_SIZE:
            return "file_size_limit"
        if self.exit_code == EXIT_PROCESSES:
            return "process_limit"
        if self.signal or self.exit_code:
            return "tool_error"
        return None

    @property
    def text(self) -> str:
        """The result as the model reads it: status line, then stdout and stderr."""
        if self.timed_out:
            status = f"timed out after {self.seconds:.1f} s; the process and its children were killed"
        elif self.signal:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else self.signal
            status = f"killed by signal {name}" + (" (CPU time limit)" if self.signal == signal.SIGXCPU else "")
        else:
            status = f"exit code {self.exit_code}"
        parts = [status]
        for name, text, dropped in (("stdout", self.stdout, self.stdout_dropped_bytes),
                                    ("stderr", self.stderr, self.stderr_dropped_bytes)):
            if text or dropped:
                marker = f"\n...[{name} truncated: {dropped} more bytes not shown]" if dropped else ""
                parts.append(f"{name}:\n{text.rstrip()}{marker}")
        return "\n".join(parts + self.notes)


@dataclass(frozen=True)
class SandboxConfig:
    """How a family's episodes get their sandbox: ``mode``, per-call ``limits``, modules to
    ``preload``, and the ``level`` that mode gets on this machine (``unavailable``: no sandbox
    is started, and the tool that needed one was left out)."""

    mode: str = "auto"
    limits: SandboxLimits = SandboxLimits()
    preload: tuple[str, ...] = ()
    level: str = ""

    def __post_init__(self):
        if not self.level:
            object.__setattr__(self, "level", resolve_level(self.mode))


class SandboxUnavailable(RuntimeError):
    """No isolation is available and running without it was not asked for."""


class SandboxFilesLost(OSError):
    """The process holding a non-root pool's mounts died (killed: the OOM killer, say), and with it
    the host's view of the pool's episodes' files: those episodes cannot go on (a call's result
    says so as the environment's failure); new episodes get a new pool."""


@functools.lru_cache(maxsize=1)
def bubblewrap_status() -> tuple[bool, str]:
    """Whether the real sandbox works here - bubblewrap starts the server with this interpreter and
    it runs one call in a fresh namespace - and why not if it does not (what ``doctor`` and the
    warnings show)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False, "bwrap not found (install Debian's bubblewrap package)"
    pool = _Pool(BUBBLEWRAP, ())
    try:
        with Sandbox(limits=SandboxLimits(timeout=20), pool=pool) as box:
            result = box.run("print('ok')")
        if result.stdout != "ok\n":
            detail = " ".join((pool.errors or result.text).split())  # one line: doctor's table
            return False, f"the sandbox cannot start here: {detail[:300]}"
    except OSError as exc:
        return False, f"the sandbox cannot start here: {exc}"
    finally:
        pool.shut_down()
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    return True, f"{version} at {bwrap}"


# -- seccomp filter: refuse the system calls normal code never needs ----------------------------

# name: (x86_64, aarch64) numbers
_BLOCKED_SYSCALLS = {
    "ptrace": (101, 117), "syslog": (103, 116), "acct": (163, 89), "pivot_root": (155, 41),
    "mount": (165, 40), "umount2": (166, 39), "swapon": (167, 224), "swapoff": (168, 225),
    "reboot": (169, 142), "init_module": (175, 105), "delete_module": (176, 106),
    "finit_module": (313, 273), "quotactl": (179, 60), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "add_key": (248, 217), "request_key": (249, 218),
    "keyctl": (250, 219), "unshare": (272, 97), "setns": (308, 268), "perf_event_open": (298, 241),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "bpf": (321, 280),
    "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "pidfd_getfd": (438, 438), "mount_setattr": (442, 442),
}
_ARCHES = {"x86_64": (0, 0xC000003E, 56), "aarch64": (1, 0xC00000B7, 220)}  # column, AUDIT_ARCH, clone
_CLONE3 = 435
_CLONE_NEW_NAMESPACES = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
# memory no address space limit counts (refused where no cgroup caps the call): memfd_create, and
# SysV shared memory (a detached segment is no process's address space; shmget alone would do, as
# the call's IPC namespace starts empty)
_UNCOUNTED_MEMORY = {"memfd_create": (319, 279), "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195)}
_SOCKET_CALLS = ((41, 198), (53, 199))  # socket, socketpair
_SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK: all normal code uses
# setsockopt, and its SOL_SOCKET options that raise a socket's buffers past the host's defaults
# (SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE): a no-op where no cgroup counts them
_SETSOCKOPT, _SOL_SOCKET, _BUFFER_OPTIONS = (54, 208), 1, (7, 8, 32, 33)
# prlimit64 may set only the caller's own limits (pid 0) or read anyone's (no new limit): where
# the code runs as its monitor's uid (non-root hosts) it lowered the monitor's memory limit, the
# monitor failed, and the call became the sandbox's failure (no reward) instead of the code's
_PRLIMIT64 = (302, 261)


@functools.lru_cache(maxsize=2)
def seccomp_filter(cgroup: bool = True) -> bytes | None:
    """The classic-BPF program bubblewrap loads with ``--seccomp`` (None on other architectures):
    the calls above fail with EPERM, ``clone`` with a new-namespace flag too, ``clone3`` with
    ENOSYS (its flags are behind a pointer; libc then falls back to ``clone``), ``prlimit64``
    setting another process's limits with EPERM, and so does any call through a foreign ABI
    (x32, i386). Sockets of any family but those in
    ``_SOCKET_FAMILIES`` fail with EAFNOSUPPORT (AF_VSOCK reaches the VM's host). Without a
    ``cgroup`` capping the call's memory, ``memfd_create`` and SysV shared memory (``shmget``,
    ``shmat``, ``shmctl``) fail too: their pages are not address space, so no per-process limit
    counts them (i386's ``ipc`` multiplexer is a foreign ABI, refused above); nor are socket
    buffers, so setting their size succeeds without effect: a socket keeps the host's default
    (``net.core.wmem_default``, 208 KiB on most hosts), as the kernel itself silently caps the
    size at ``net.core.wmem_max`` (4 MiB and more on some hosts, for each of a call's sockets)."""
    import platform
    import struct

    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    column, audit_arch, clone = arch
    eperm, enosys, eafnosupport, allow = 0x00050000 | 1, 0x00050000 | 38, 0x00050000 | 97, 0x7FFF0000
    no_op = 0x00050000  # SECCOMP_RET_ERRNO with errno 0: the call returns 0 and does nothing
    blocked = [numbers[column] for numbers in _BLOCKED_SYSCALLS.values()]
    if not cgroup:
        blocked += [numbers[column] for numbers in _UNCOUNTED_MEMORY.values()]
    prog: list = [(0x20, 0, 0, 4), (0x15, 1, 0, audit_arch), (0x06, 0, 0, eperm),
                  (0x20, 0, 0, 0)]  # arch check, then load the number
    if column == 0:
        prog.append((0x35, "deny", 0, 0x40000000))  # x32 ABI
    prog += [(0x15, "deny", 0, number) for number in blocked]
    prog += [(0x15, "enosys", 0, _CLONE3)]
    prog += [(0x15, "family", 0, numbers[column]) for numbers in _SOCKET_CALLS]
    prog += [(0x15, "prlimit", 0, _PRLIMIT64[column])]
    if not cgroup:
        prog += [(0x15, "sockopt", 0, _SETSOCKOPT[column])]
    prog += [(0x15, 0, "allow", clone), (0x20, 0, 0, 16), (0x45, "deny", "allow", _CLONE_NEW_NAMESPACES),
             "family", (0x20, 0, 0, 16)]  # clone: args[0], low 32 bits; socket: args[0], the family
    prog += [(0x15, "allow", 0, family) for family in _SOCKET_FAMILIES]
    prog += [(0x06, 0, 0, eafnosupport)]
    prog += ["prlimit", (0x20, 0, 0, 16), (0x15, "allow", 0, 0),  # args[0], the pid: 0, itself
             (0x20, 0, 0, 32), (0x15, 0, "deny", 0), (0x20, 0, 0, 36), (0x15, "allow", "deny", 0)]  # args[2]: NULL
    if not cgroup:  # setsockopt: args[1], the level, then args[2], the option
        prog += ["sockopt", (0x20, 0, 0, 24), (0x15, 0, "allow", _SOL_SOCKET), (0x20, 0, 0, 32)]
        prog += [(0x15, "no_op", 0, option) for option in _BUFFER_OPTIONS]
    prog += ["allow", (0x06, 0, 0, allow), "deny", (0x06, 0, 0, eperm),
             "enosys", (0x06, 0, 0, enosys), "no_op", (0x06, 0, 0, no_op)]
    labels, code = {}, []
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)
    out = b""
    for i, (op, jt, jf, k) in enumerate(code):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        out += struct.pack("=HBBI", op, jt, jf, k)
    return out


# -- cgroups: one per call caps the memory and processes of the call as a whole -----------------


def _cgroup_mounts() -> dict[str, str]:
    """Where this process's own cgroups are: ``{"memory": dir, "pids": dir}`` (v1 hierarchies) and
    ``{"unified": dir}`` (v2), from /proc/self/cgroup and the cgroup mounts showing their root."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else ["unified"]:
                own[name] = path
    found = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            root, point, fstype, options = fields[3], fields[4], fields[dash + 1], fields[dash + 3].split(",")
            if fstype == "cgroup2":
                names = ["unified"]
            elif fstype == "cgroup":
                names = [o for o in options if o in ("memory", "pids")]
            else:
                continue
            for name in names:
                path = own.get(name)
                if path is not None and (path + "/").startswith(root.rstrip("/") + "/") and name not in found:
                    found[name] = os.path.join(point, path[len(root.rstrip("/")):].lstrip("/"))
    return found


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _make_cgroup_parents() -> tuple[dict[str, str] | None, str]:
    """Make this pool's parent cgroups (the server makes one per call under them): ``({"memory",
    "pids"} or {"unified"}: dirs, words)``, or ``(None, why not)``."""
    try:
        mounts = _cgroup_mounts()
    except (OSError, ValueError) as exc:
        return None, f"cannot read this process's cgroups ({exc})"
    for parent in mounts.values():  # what pools of processes killed before closing left behind
        for entry in _quietly_list(parent):
            pid = entry.name.split("-")[2] if entry.name.startswith("benchmax-gym-") else ""
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                _remove_cgroups({"stale": entry.path})
    name = f"benchmax-gym-{os.getpid()}-{secrets.token_hex(4)}"  # its owner, to sweep it if killed
    why = []
    if "memory" in mounts and "pids" in mounts:  # v1 (or hybrid): one hierarchy each
        made = {}
        try:
            for key in ("memory", "pids"):
                os.mkdir(os.path.join(mounts[key], name), 0o755)
                made[key] = os.path.join(mounts[key], name)
            _write(os.path.join(made["memory"], "memory.limit_in_bytes"), str(1 << 40))
            _write(os.path.join(made["pids"], "pids.max"), "max")
            return made, "cgroup v1"
        except OSError as exc:
            why.append(f"cgroup v1: {exc.strerror or exc}")
            _remove_cgroups(made)
    if "unified" in mounts:
        parent = mounts["unified"]
        made = {}
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as f:
                if not {"memory", "pids"} <= set(f.read().split()):
                    raise OSError(f"memory and pids controllers not available in {parent}")
            with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                if not {"memory", "pids"} <= set(f.read().split()):
                    _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
            os.mkdir(os.path.join(parent, name), 0o755)
            made["unified"] = os.path.join(parent, name)
            _write(os.path.join(made["unified"], "cgroup.subtree_control"), "+memory +pids")
            return made, "cgroup v2"
        except OSError as exc:
            why.append(f"cgroup v2: {exc.strerror or exc}")
            _remove_cgroups(made)
    return None, "; ".join(why) or "no memory and pids cgroup controllers mounted"


def _remove_cgroups(dirs: dict[str, str] | None, wait: float = 0.0) -> bool:
    """Remove these cgroups and the per-call ones under them (retrying up to ``wait`` seconds
    while killed processes leave them). True when all are gone."""
    deadline = time.monotonic() + wait
    while True:
        left = False
        for path in (dirs or {}).values():
            for entry in _quietly_list(path):
                if entry.is_dir(follow_symlinks=False):
                    left |= not _quietly(os.rmdir, entry.path)
            left |= os.path.isdir(path) and not _quietly(os.rmdir, path)
        if not left or time.monotonic() >= deadline:
            return not left
        time.sleep(0.01)


def _quietly_list(path: str) -> list[os.DirEntry]:
    try:
        return list(os.scandir(path))
    except OSError:
        return []


@functools.lru_cache(maxsize=1)
def memory_mechanism() -> tuple[bool, str]:
    """Whether a cgroup per call caps a call's memory and processes together here, and how the
    memory limit works (what ``doctor`` shows)."""
    dirs, how = _make_cgroup_parents()
    if dirs is not None:
        _remove_cgroups(dirs)
        return True, (f"a cgroup per call ({how}) caps the call's processes together (memory_mb, "
                      "max_processes; memfd and tmpfs pages included)")
    return False, (f"per process only ({how}): each process's new address space is capped at "
                   "memory_mb / max_processes, memfd_create and SysV shared memory are refused, "
                   "/dev/shm holds one such share, and socket buffers (uncounted) are bounded through "
                   "128 descriptors a process, each socket at the host's default buffer size (TCP: 128 KiB)")


def resolve_level(mode: str) -> str:
    """The level a sandbox in ``mode`` gets on this machine (``unavailable`` if none)."""
    if mode not in MODES:
        raise ValueError(f"sandbox must be one of {MODES}, got {mode!r}")
    if mode == RLIMITS:
        return RLIMITS
    ok, _ = bubblewrap_status()
    return BUBBLEWRAP if ok else UNAVAILABLE


def _workspace_root() -> Path:
    """The parent of episode workspaces: traversable (the code's unprivileged uid must reach its
    own workspace) but not listable; each workspace is itself closed to other users. Anyone may
    take its name in the temp dir first (another user, code at level ``rlimits``): a symlink or a
    directory not this user's is refused (its owner could swap the pools made in it)."""
    root = Path(tempfile.gettempdir()) / f"benchmax-gym-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o711)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise OSError(exc.errno, f"{root} is a symlink or not a directory: someone else made it "
                      "(remove it, or set TMPDIR elsewhere)") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{root} belongs to uid {os.fstat(fd).st_uid}, not to this user: "
                          "someone else made it (remove it, or set TMPDIR elsewhere)")
        os.fchmod(fd, 0o711)
    finally:
        os.close(fd)
    return root


# -- a tmpfs per episode: its size and entries are capped while the code writes ------------------

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_SHARED, _MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 4, 4096, 1 << 20, 2, 8


@functools.lru_cache(maxsize=1)
def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    import ctypes

    if _libc().mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                     data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _detach(path: str) -> bool:
    """Detach the mount at ``path``, never at where a symlink there points (a workspace's)."""
    return _libc().umount2(str(path).encode(), _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0


# Detaching a tmpfs takes its mount off the tree at once, then waits in the kernel for an RCU grace
# period before it returns (0.6 ms of wall time, 0.06 ms of CPU, an episode on an idle 2-CPU host;
# more on a loaded one), on the episode's close. A thread of this process's own makes that call,
# and the close returns as soon as the mount is off the tree (the host, the server and its calls
# see the empty directory under it): what it checked before it went on is still true when it
# does (no path reaches the old files, so its uid may be another episode's), only the kernel's
# freeing of the pages comes later, as it already did for a mount a process still held.
_DETACHER: "tuple[int, queue.SimpleQueue, threading.Thread] | None" = None
_DETACHER_LOCK = threading.Lock()


def _detaching(jobs: "queue.SimpleQueue") -> None:
    while True:
        path, slot = jobs.get()
        try:
            slot[1] = _detach(path)
        finally:
            slot[0].set()


def _detach_off_path(path: Path, below: Path) -> bool:
    """Detach the tmpfs mounted at ``path`` (on the directory ``below`` holds): True once it is
    off the tree (``path`` is ``below``'s file system again), False where the detach failed."""
    global _DETACHER
    try:
        dev = os.lstat(below).st_dev
        watch = os.open("/proc/self/mounts", os.O_RDONLY | os.O_CLOEXEC)  # POLLPRI: the mounts changed
    except OSError:
        return _detach(str(path))
    try:
        with _critical(_DETACHER_LOCK):  # (a close a finalizer runs meanwhile waits: it takes this lock too)
            if _DETACHER is None or _DETACHER[0] != os.getpid():
                jobs: queue.SimpleQueue = queue.SimpleQueue()
                thread = threading.Thread(target=_detaching, args=(jobs,), name="benchmax-sandbox-detach", daemon=True)
                thread.start()
                _DETACHER = (os.getpid(), jobs, thread)
            _, jobs, thread = _DETACHER
        if threading.current_thread() is thread or sys.is_finalizing():  # (a finalizer that ran on it cannot
            return _detach(str(path))  # wait for itself; nor a close at exit, when threads no longer run)
        slot: list = [threading.Event(), None]
        jobs.put((str(path), slot))
        poller = select.poll()
        poller.register(watch, select.POLLPRI)
        while not slot[0].is_set():
            try:
                if os.lstat(path).st_dev == dev:
                    return True
            except OSError:
                break  # (not looked at: wait for the detach's own answer)
            poller.poll(10)  # woken by any change of this namespace's mounts (10 ms: a guard)
        slot[0].wait()
        return bool(slot[1])
    finally:
        os.close(watch)


class _UserMounts:
    """Where a non-root host mounts its pools' and episodes' tmpfs: a user and mount namespace of
    the user's own, held by a helper process (``sandbox_server.hold_mounts``) that makes the
    mounts asked of it. This process reaches their files through ``/proc/PID/root`` of the helper
    (:meth:`view`), and the server runs in that namespace (``--enter``). The helper is this
    process's child and is only reaped by :meth:`close`, so its pid names no other process.

    It lives while its stdin is open: only this process may hold that pipe's write end, so a
    forked child lets go of its copy at once (:meth:`after_fork`); else the helper, its tmpfs and
    the episodes' files outlived this process for as long as a forked worker ran."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [_interpreter(), "-I", "-S", "-B", str(SERVER), "--hold-mounts"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True, close_fds=True)
        self._pipes = (self.proc.stdin.fileno(), self.proc.stdout.fileno())
        _HELPERS.add(self)
        if self.proc.stdout.readline() != b"ready\n":
            self.close()
            why = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
            raise OSError(f"no user and mount namespace for the tmpfs: {why[-1] if why else 'its helper died'}")
        self.proc.stderr.close()  # it writes nothing more there (its stderr is /dev/null now)

    def _ask(self, request: list) -> None:
        with _critical(self.lock):
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
                answer = self.proc.stdout.readline().decode(errors="replace").strip()
            except (OSError, ValueError):
                answer = ""
        if answer != "ok":
            raise OSError(answer or "the helper holding the sandbox's mounts is gone")

    def mount(self, source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        self._ask([source, str(target), fstype, flags, data])

    def detach(self, path) -> bool:
        try:
            self._ask(["detach", str(path)])
            return True
        except OSError:
            return False

    def view(self, path: Path) -> Path:
        """``path`` of the helper's namespace (absolute), as this process reaches it."""
        return Path(f"/proc/{self.proc.pid}/root{path}")

    def gone(self) -> bool:
        """Whether the helper has exited (killed: the host no longer reaches the files through it).
        Not reaped here (``WNOWAIT``): its pid names no other process while a path uses it."""
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # (reaped already)
            return True

    def after_fork(self) -> None:
        """In a forked child: point the copies of the helper's pipes at /dev/null. Their numbers
        stay open (the copied file objects close them some day: a closed number could be another
        file's by then), and no Python lock is taken (another thread of the parent may have held it)."""
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            for fd in self._pipes:
                os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)

    def close(self) -> None:
        """End the helper; its tmpfs go with the last process in its namespace (the server's)."""
        _HELPERS.discard(self)  # (first: its pipes' numbers are not this helper's once closed)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


#: the helpers this process started and has not closed (a forked child lets go of their pipes)
_HELPERS: "weakref.WeakSet[_UserMounts]" = weakref.WeakSet()


def _user_mounts() -> _UserMounts | None:
    """A namespace to mount tmpfs in (non-root hosts), or None where the kernel refuses one."""
    try:
        return _UserMounts()
    except OSError as exc:
        log.info("no tmpfs workspaces (%s): the quota is checked after each call", exc)
        return None


def _share_pool_dir(path: Path, mounts: _UserMounts | None = None) -> bool:
    """Make a pool's directory a shared tmpfs (root hosts: in the host's mount namespace; elsewhere
    in ``mounts``'), so that the episodes' tmpfs mounted under it later reach the server already
    running on it (bubblewrap's copy is its slave), and the code's mountinfo shows no host path
    for it (a bind mount shows its source's)."""
    if mounts is None and os.geteuid() != 0:
        return False
    mount, detach = (mounts.mount, mounts.detach) if mounts else (_mount, _detach)
    try:
        mount("tmpfs", str(path), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=711")
    except OSError as exc:
        log.info("no tmpfs workspaces (%s): the quota is checked after each call", exc)
        return False
    try:
        mount("none", str(path), None, _MS_SHARED)
        return True
    except OSError as exc:
        log.info("no tmpfs workspaces (%s): the quota is checked after each call", exc)
        detach(str(path))
        return False


_POOL_MOUNT = re.compile(r"^(.*/benchmax-gym-\d+/benchmax-sandbox-p(\d+)-[^/]+)(/|$)")  # (tempdirs names it)


def _sweep_stale_pools() -> None:
    """Detach what pools of processes that died without closing (SIGKILL, SIGTERM) left mounted,
    wherever their temp root was (a worker's, a test's): their tmpfs hold the dead episodes' files."""
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return
    stale = set()
    for point in points:
        match = _POOL_MOUNT.match(point)
        if match and not os.path.exists(f"/proc/{match.group(2)}"):
            stale.add(match.group(1))
    for pool in stale:
        for point in sorted((p for p in points if p == pool or p.startswith(pool + "/")), key=len, reverse=True):
            _detach(point)
        remove_tree(Path(pool))


def _episode_tmpfs(path: Path, limits: "SandboxLimits", mounts: _UserMounts | None = None) -> bool:
    """Mount the episode's tmpfs (in ``mounts``' namespace on non-root hosts): ``workspace_mb``
    for its workspace and ``/tmp`` together, and one entry per 4 KiB of it (an empty file, a
    link or a FIFO costs at least a block)."""
    try:
        (mounts.mount if mounts else _mount)(
            "tmpfs", str(path), "tmpfs", _MS_NOSUID | _MS_NODEV,
            f"size={limits.workspace_mb}m,nr_inodes={max(64, limits.workspace_mb * 256)},mode=711")
        return True
    except OSError as exc:
        log.warning("no tmpfs for a sandbox workspace (%s): the quota is checked after each call", exc)
        return False


@functools.lru_cache(maxsize=1)
def disk_mechanism() -> tuple[bool, str]:
    """Whether episodes get a tmpfs each here (the quota then holds during the call), and words."""
    probe = Path(tempfile.mkdtemp(prefix="probe-", dir=_workspace_root()))
    mounts = _user_mounts() if os.geteuid() != 0 else None
    try:
        if _share_pool_dir(probe, mounts):
            if mounts is None:
                _detach(str(probe))
            where = (" in a user namespace of the sandbox's own (not root: the host reaches its files through "
                     "/proc/PID/root of the process holding it)") if mounts else ""
            return True, (f"a tmpfs per episode{where} (size=workspace_mb, one entry per 4 KiB of it, workspace "
                          "and /tmp together) stops writes during the call")
        why = "mounting a tmpfs failed" if os.geteuid() == 0 or mounts else "not root, and no user namespace"
        return False, (f"checked after each call ({why}: no tmpfs per episode); files the call wrote past "
                       "workspace_mb are deleted, every entry counting at least 4 KiB")
    finally:
        if mounts is not None:
            mounts.close()
        remove_tree(probe)


def isolation_report() -> list[tuple[str, str]]:
    """What ``doctor`` says about the sandbox's limits and what the code can still see."""
    python = ", ".join(host for host, _ in _python_layout()[0])
    return [
        ("sandbox memory", memory_mechanism()[1]),
        ("sandbox disk", disk_mechanism()[1]),
        ("sandbox network", "a network namespace per episode (loopback only), closed when it ends"),
        ("sandbox mountinfo", "the code's /proc/self/mountinfo names the host directories bound for "
                              f"Python ({python}): "
                              "the kernel shows a bind mount's source directory, and copying the interpreter and its "
                              "packages into each server would cost seconds and hundreds of MiB; workspaces, "
                              "episodes and the server's source appear at neutral paths, cgroups by their owner's pid"
                              + ("" if disk_mechanism()[0] else " (episodes not: they are not tmpfs here)")),
        ("sandbox uid", _uid_report()),
    ]


def _uid_report() -> str:
    """Which uid the code runs as, and on root hosts the bands, how many of their uids are free
    and where the reservations are kept."""
    if os.geteuid() != 0:
        return "the user's own (a second uid needs a setuid helper); the monitor and server are shielded instead"
    lock = os.environ.get(UID_LOCK_ENV) or "/run/benchmax-gym-uids.lock"
    try:
        bands = _uid_bands()
        given = _given_ids(ID_FILES)
    except (OSError, ValueError) as exc:
        return f"none can be picked: {exc}"
    free = ", then ".join(f"{_band_text(band)} ({sum(map(len, _free_uids(given, band)))} free)" for band in bands)
    chosen = (f"set by {UID_BANDS_ENV}" if os.environ.get(UID_BANDS_ENV, "").strip()
              else f"other bands: set {UID_BANDS_ENV}=first-last")
    return (f"an unprivileged uid per open sandbox, from {free}: free of the ids /etc/passwd, group, subuid "
            f"and subgid give away ({chosen}); reserved host-wide in {lock} "
            f"(containers with their own /run: set {UID_LOCK_ENV})")


#: the bands of unprivileged uids episodes' code runs as on root hosts, one uid per open sandbox on
#: the host, tried in order (a bare range is one band). The first lies in useradd's subordinate-id
#: pool (a 65,536 block per user from SUB_UID_MIN 100,000): 14 users with /etc/subuid blocks
#: (rootless podman or docker) fill it. The second is a range systemd's UID/GID table
#: (https://systemd.io/UIDS-GIDS/) lists as unused: above its container range 524288-1879048191
#: (nspawn's and nsresourced's allocations), below its foreign range 0x7FFE0000-0x7FFEFFFF (meson's
#: foreign-uid-base) and below 2^31, where it says programs and even setfsuid() mishandle ids;
#: ``_uid_bands`` keeps it above the top of useradd's pool as /etc/login.defs sets it
EPISODE_UIDS = (range(200_000, 1_000_000), range(0x7000_0000, 0x7FFE_0000))
#: SUB_UID_MAX and SUB_GID_MAX there top useradd's pool (600,100,000 where unset): the bands after
#: the first start above them, so no block useradd hands out later meets an open episode's uid
LOGIN_DEFS = "/etc/login.defs"
SUBID_MAX_DEFAULT = 600_100_000
#: replaces ``EPISODE_UIDS`` on hosts that differ: ``first-last[,first-last...]``, inclusive, tried
#: in order (still less the ids ``ID_FILES`` give away); read whenever a uid is picked
UID_BANDS_ENV = "BENCHMAX_SANDBOX_UIDS"
#: where the host gives ids away; an episode's uid (also its gid) is none of them: sharing a uid
#: with a user or a user's namespaces (a rootless container's) shares their process limit and files
#: (tests point it at files of their own)
ID_FILES = {"passwd": "/etc/passwd", "group": "/etc/group", "subuid": "/etc/subuid", "subgid": "/etc/subgid"}
#: names the host-wide lock file (default ``/run/benchmax-gym-uids.lock``): containers sharing the
#: host's uids but not its /run set it to a file on a directory they all mount
UID_LOCK_ENV = "BENCHMAX_GYM_UID_LOCK"


def _band_text(band: range) -> str:
    return f"{band.start}-{band.stop - 1}"


def _uid_bands() -> list[range]:
    """The bands episode uids come from, in order: ``$BENCHMAX_SANDBOX_UIDS``'s, else
    ``EPISODE_UIDS``' with each band after the first above useradd's subordinate-id pool."""
    spec = os.environ.get(UID_BANDS_ENV, "").strip()
    if spec:
        return _parse_uid_bands(spec)
    if isinstance(EPISODE_UIDS, range):
        return [EPISODE_UIDS]
    first, *later = EPISODE_UIDS
    floor = _subid_pool_top(LOGIN_DEFS) + 1
    return [first] + [band for band in (range(max(b.start, floor), b.stop) for b in later) if band]


def _parse_uid_bands(spec: str) -> list[range]:
    """``first-last[,first-last...]`` as bands, or an error naming the variable that set it."""
    bands = []
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            band = range(int(first), int(last) + 1) if dash else range(0)
        except ValueError:
            band = range(0)
        where = f"{UID_BANDS_ENV}={spec!r}: {part.strip()!r}"
        if not band:
            raise ValueError(f"{where} is not a band first-last of uids, first <= last "
                             f"(e.g. {UID_BANDS_ENV}=1879048192-2147352575, or several joined by commas)")
        if band.start < 1000:
            raise ValueError(f"{where} starts below 1000: uid 0 is root and the ids under 1000 are the system's")
        if band.stop > 2**31:
            raise ValueError(f"{where} goes past 2147483647: programs (even setfsuid()) mishandle ids of 2^31 and above")
        bands.append(band)
    return bands


#: parsed id files and login.defs by (path, how parsed): (the file's identity and change stamps, what it gives)
_PARSED: dict[tuple[str, str], tuple[tuple[int, ...], Any]] = {}
#: a file changed less than this long before it was read may change again with the same stamps
#: (timestamps tick coarsely): its parse is not kept (git's "racily clean" index entries, likewise)
_RACY_NS = 2_000_000_000


def _stamps(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _parsed(path: str, kind: str, parse) -> Any:
    """``parse(text)`` of the file at ``path`` (read as ``kind``), read again only when the file
    changed: an episode picks its uid off every id the host gives away, users added while this
    process runs too, and a stat costs a fraction of a read and parse. A file replaced (a new inode: useradd renames its
    new copy into place) or written (its size, mtime or ctime) is read again, as is one changed
    too lately for its stamps to tell a second change. Errors are raised as ``open`` raises them."""
    kept = _PARSED.get((path, kind))
    if kept is not None:
        try:
            if _stamps(os.stat(path)) == kept[0]:
                return kept[1]
        except OSError:
            pass  # (gone or unreadable now: open says which)
    with open(path, encoding="utf-8", errors="replace") as f:
        st = os.fstat(f.fileno())  # the stamps of what is read (it may have been replaced since the stat)
        value = parse(f.read())
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > _RACY_NS:
        _PARSED[(path, kind)] = (_stamps(st), value)
    else:
        _PARSED.pop((path, kind), None)
    return value


def _parse_login_defs(text: str) -> int:
    """SUB_UID_MAX / SUB_GID_MAX of login.defs' text, at least shadow's default."""
    tops = [SUBID_MAX_DEFAULT]
    for line in text.splitlines():
        fields = line.split("#")[0].split()
        if len(fields) == 2 and fields[0] in ("SUB_UID_MAX", "SUB_GID_MAX"):
            try:
                tops.append(int(fields[1], 0))
            except ValueError:
                continue  # a malformed value sets nothing (useradd ignores it too)
    return max(tops)


def _subid_pool_top(path: str) -> int:
    """The highest subordinate uid or gid useradd hands out: SUB_UID_MAX / SUB_GID_MAX of
    ``path`` (login.defs), shadow's default where it sets neither or cannot be read."""
    try:
        return _parsed(path, "login.defs", _parse_login_defs)
    except OSError:
        return SUBID_MAX_DEFAULT


def _parse_id_file(kind: str, text: str) -> tuple[range, ...]:
    """The ids one ``ID_FILES`` file of ``kind`` gives away, from its text."""
    given = []
    for line in text.splitlines():
        fields = line.split(":")
        try:
            if kind in ("subuid", "subgid"):  # name-or-uid:first:count
                given.append(range(int(fields[1]), int(fields[1]) + int(fields[2])))
            else:  # passwd: name:x:uid:gid:...; group: name:x:gid:members
                given += [range(int(i), int(i) + 1) for i in fields[2:4 if kind == "passwd" else 3]]
        except (IndexError, ValueError):
            continue  # a comment or a malformed line names no id
    return tuple(given)


def _given_ids(files: dict[str, str]) -> list[range]:
    """The ids ``files`` (``ID_FILES``' kinds) give to users, groups and users' subordinate ranges.
    A missing file gives none; one that cannot be read is an error (its ranges would be used)."""
    given = []
    for kind, path in files.items():
        try:
            given += _parsed(path, kind, functools.partial(_parse_id_file, kind))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise OSError(f"cannot read {path} to keep sandbox uids off its ids: {exc.strerror or exc}") from None
    return given


def _free_uids(given: list[range], band: range) -> list[range]:
    """``band`` less every id in ``given``, as ordered ranges."""
    free, next_uid = [], band.start
    for taken in sorted((r for r in given if r), key=lambda r: r.start):
        if taken.start > next_uid:
            free.append(range(next_uid, min(taken.start, band.stop)))
        next_uid = max(next_uid, taken.stop)
        if next_uid >= band.stop:
            break
    if next_uid < band.stop:
        free.append(range(next_uid, band.stop))
    return [r for r in free if r]


def _givers(bands: list[range]) -> list[str]:
    """The ``ID_FILES`` that give away ids of ``bands`` (for the error that none is left)."""
    def meets(r: range) -> bool:
        return any(r.start < band.stop and band.start < r.stop for band in bands)

    return [path for kind, path in ID_FILES.items() if any(map(meets, _given_ids({kind: path})))]


def _rotated(free: list[range], start: int):
    """Every uid of ``free`` once, from its ``start``-th on, wrapping around."""
    first, last = [], []
    for r in free:
        if 0 <= start < len(r):
            first.append(r[start:])
            last.append(r[:start])
        else:
            (last if start >= len(r) else first).append(r)
        start -= len(r)
    return (uid for r in first + last for uid in r)


class _UidReservations:
    """The episode uids this process holds, each a write lock on one byte (at the uid's offset)
    of a root-only file that every process on the host locks: while an episode is open no other
    sandbox, in this process or another, runs code as its uid (random picks collided: two
    episodes then shared their process limit and their files' owner). Open file description
    locks (F_OFD_SETLK): one descriptor per process however many episodes it holds, and the
    kernel drops them when the process dies, a killed one too. A forked child reopens the file
    (see ``_forget_pools_after_fork``): through the parent's description its locks would be the
    parent's own, and never conflict with them."""

    def __init__(self):
        self.fd: int | None = None
        self.held: set[int] = set()
        self.lock = threading.Lock()

    @staticmethod
    def _open() -> int:
        """The host's lock file: ``$BENCHMAX_GYM_UID_LOCK`` if set, else /run's (the same for every
        process, whatever its TMPDIR), else the temp directory's; refused unless it is root's own
        regular file."""
        chosen = os.environ.get(UID_LOCK_ENV)
        paths = [chosen] if chosen else [os.path.join(d, "benchmax-gym-uids.lock") for d in ("/run", tempfile.gettempdir())]
        why = []
        for path in paths:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                why.append(f"{path}: {exc.strerror}")
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o077:
                return fd
            os.close(fd)
            why.append(f"{path}: not root's own file (mode 600)")
        raise OSError(f"no file to reserve sandbox uids in ({'; '.join(why)})"
                      + (f"; {UID_LOCK_ENV} names it" if chosen else ""))

    def _lock(self, uid: int, kind: int) -> bool:
        import fcntl
        import struct

        try:  # struct flock: type, whence, start, length, pid (0: the description's own lock)
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, struct.pack("@hhqqi4x", kind, os.SEEK_SET, uid, 1, 0))
            return True
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise

    def reserve(self) -> int:
        """A uid no open sandbox on this host holds and the host gives no user, group or
        subordinate range, from the first band that has one, from a random start (processes
        seldom meet)."""
        import fcntl

        with _critical(self.lock):
            bands = _uid_bands()
            if self.fd is None:
                self.fd = self._open()
            given = _given_ids(ID_FILES)
            total = 0
            for band in bands:
                free = _free_uids(given, band)
                count = sum(len(r) for r in free)
                total += count
                if not count:
                    continue
                for uid in _rotated(free, secrets.randbelow(count)):
                    if uid not in self.held and self._lock(uid, fcntl.F_WRLCK):
                        self.held.add(uid)
                        return uid
            names = " and ".join(map(_band_text, bands))
            if not total:
                raise OSError(f"no sandbox uid is free: {', '.join(_givers(bands) or ID_FILES.values())} give every "
                              f"id of {names} to users, groups or their namespaces; set {UID_BANDS_ENV}=first-last "
                              "to a band of uids they leave free")
        raise OSError(f"every sandbox uid ({names}, {total} not given to users, groups or their namespaces) is in "
                      f"use; set {UID_BANDS_ENV}=first-last[,first-last...] for more")

    def release(self, uid: int) -> None:
        """Give ``uid`` back: its episode's processes and files are gone."""
        import fcntl

        with _critical(self.lock):
            if uid in self.held:
                self._lock(uid, fcntl.F_UNLCK)
                self.held.discard(uid)

    def after_fork(self) -> None:
        """In a forked child: the parent's locks stay the parent's (its description, shared until
        this copy closes); the child holds none and reopens the file when it needs one."""
        if self.fd is not None:
            _quietly(os.close, self.fd)
        self.fd, self.held, self.lock = None, set(), threading.Lock()


_UIDS = _UidReservations()


def _own_workspace(workspace: Path, uid: int | None) -> None:
    """Give a fresh workspace to the uid its code will run as (root hosts), else to this user."""
    if uid is None:
        os.chmod(workspace, 0o700)
        return
    os.chown(workspace, uid, 0)  # group root, so the capability-less server can enter it too
    os.chmod(workspace, 0o770)


@functools.lru_cache(maxsize=1)
def _interpreter() -> str:
    """The base installation's ``pythonX.Y`` (a venv's packages come through ``sys.path``), else
    the binary this process runs, resolved: ``sys.executable`` may hold ``..``, be a venv's copy
    or a symlink into a directory this user cannot reach."""
    candidates = [os.path.join(os.path.realpath(sys.base_prefix), "bin", "python%d.%d" % sys.version_info[:2])]
    try:
        candidates.append(os.readlink("/proc/self/exe"))
    except OSError:
        pass
    candidates.append(os.path.realpath(sys.executable))
    return next((c for c in candidates if os.access(c, os.X_OK)), candidates[-1])


@functools.lru_cache(maxsize=1)
def _python_layout() -> tuple[tuple[tuple[str, str], ...], str, dict[str, str]]:
    """Where this interpreter appears inside the sandbox, at neutral paths rather than the host's:
    ``(binds (host, inside), executable inside, environment)``. Host paths are resolved first
    (``..``, symlinks), so what is bound is what is executed."""
    base = os.path.realpath(sys.base_prefix)
    binds = [(base, "/sandbox/python")]
    venv = os.path.realpath(sys.prefix)
    if venv != base:
        binds.append((venv, "/sandbox/venv"))
    exe = _interpreter()
    if _inside(exe, binds) is None:  # an interpreter outside its prefix: bind its directory
        binds.append((os.path.dirname(exe), "/sandbox/bin"))
    env = {}
    libdir = sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and _inside(libdir, binds):
        env["LD_LIBRARY_PATH"] = _inside(libdir, binds)  # its RUNPATH names the host path
    return tuple(binds), _inside(exe, binds), env


def _inside(path: str, binds) -> str | None:
    real = os.path.realpath(path)
    for host, dest in sorted(binds, key=lambda b: -len(b[0])):
        if real == host or real.startswith(host.rstrip("/") + "/"):
            return dest + real[len(host.rstrip("/")):]
    return None


def _spawn(level: str, episodes: Path, preload: tuple[str, ...],
           cgroups: dict[str, str] | None = None, mounts: _UserMounts | None = None) -> subprocess.Popen:
    """Start the server for the episodes under ``episodes`` (requests on stdin, JSON lines on
    stdout, its own errors - bubblewrap's included - on a captured stderr, never the user's), in
    ``mounts``' namespace if given (where the episodes' tmpfs are)."""
    inside = level == BUBBLEWRAP
    root = os.geteuid() == 0
    config = {
        "level": level,
        "episodes": "/sandbox/episodes" if inside else str(episodes),
        "preload": list(preload),
        "nproc_base": 0 if root else user_process_count(os.getuid()),
        "seccomp": (seccomp_filter(cgroup=cgroups is not None) or b"").hex() if inside else "",
        "max_calls": MAX_CONCURRENT_CALLS,
        "cgroups": ({key: f"/sandbox/cgroup/{key}" for key in cgroups} if inside else cgroups) if cgroups else None,
    }
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp",
           "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if inside:
        binds, exe, extra_env = _python_layout()
        config["path"] = [p for p in (_inside(p, binds) for p in sys.path if p) if p]
        argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session", "--as-pid-1",
                "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if root:  # the code runs as each episode's own uid; the server keeps what it needs to get there
            argv += ["--cap-drop", "ALL"] + [a for cap in ("SYS_ADMIN", "SETUID", "SETGID", "KILL", "NET_ADMIN")
                                              for a in ("--cap-add", f"CAP_{cap}")]
        else:  # the code drops these capabilities of the sandbox's own user namespace
            argv += ["--unshare-user", "--cap-add", "ALL"]
        argv += ["--tmpfs", "/tmp", "--dir", "/workspace"]
        for path in ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc/ld.so.cache", "/etc/localtime",
                     "/etc/alternatives"):
            argv += ["--ro-bind-try", path, path]
        argv += ["--perms", "0755", "--dir", "/sandbox"]  # bwrap would create it closed (0700)
        for host, dest in binds:
            argv += ["--ro-bind", host, dest]
        for key, path in (cgroups or {}).items():  # the monitors hide it from the code
            argv += ["--bind", path, f"/sandbox/cgroup/{key}"]
        source_read, source_write = os.pipe()  # the server's source as data: no host path in mountinfo
        source = SERVER.read_bytes()
        if len(source) >= 65536:
            raise OSError("sandbox_server.py no longer fits a pipe's buffer")
        os.write(source_write, source)
        os.close(source_write)
        pass_fds = (source_read,)
        argv += ["--perms", "0444", "--ro-bind-data", str(source_read), "/sandbox/server.py",
                 "--bind", str(episodes), "/sandbox/episodes",
                 "--proc", "/proc", "--dev", "/dev", "--chdir", "/", "--clearenv"]
        for key, value in {**env, **extra_env}.items():
            argv += ["--setenv", key, value]
        argv += [exe, "-I", "-S", "-B", "/sandbox/server.py"]
    else:
        config["path"] = [os.path.realpath(p) for p in sys.path if p]
        argv = [_interpreter(), "-I", "-S", "-B", str(SERVER)]
        pass_fds = ()
    if mounts is not None:
        argv = [_interpreter(), "-I", "-S", "-B", str(SERVER), "--enter", str(mounts.proc.pid), *argv]
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=str(episodes), env=env, start_new_session=True, close_fds=True, pass_fds=pass_fds,
        )
    finally:
        for fd in pass_fds:
            os.close(fd)
    try:  # the configuration is its first line of input (a pipe holds it until it starts)
        proc.stdin.write((json.dumps(config) + "\n").encode())
        proc.stdin.flush()
    except OSError:
        pass  # it died at once: the caller reports its stderr
    return proc


class _Server:
    """One server process and the calls waiting on it. A reader thread hands each reply to its
    call by request id (ids are random: a forged reply cannot match one); a reply for no call
    means something other than the server wrote the channel, and the server is not trusted again."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.pending: dict[int, list] = {}  # request id -> [event, reply]
        self.ready = threading.Event()  # set when it is ready, or when it died first
        self.ok = False
        self.dead = False
        self.errors = ""  # the tail of what it wrote to stderr
        self.finished = threading.Event()  # set once both its streams are read to the end
        self.write_lock = threading.Lock()
        threading.Thread(target=self._read, name="benchmax-sandbox-reader", daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        streams = {self.proc.stdout.fileno(): "out", self.proc.stderr.fileno(): "err"}
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                for key, _ in sel.select():
                    try:
                        chunk = os.read(key.fd, 1 << 20)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fd)
                        if streams[key.fd] == "out":  # the server is gone (its calls' stragglers may hold stderr)
                            self._fail_all("lost")
                    elif streams[key.fd] == "err":
                        self.errors = (self.errors + chunk.decode(errors="replace"))[-4000:]
                    else:
                        buffer += chunk
                        while b"\n" in buffer:
                            line, _, buffer = buffer.partition(b"\n")
                            if not self._dispatch(line):
                                self.kill()
        self._fail_all("lost")
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        self.finished.set()

    def _dispatch(self, line: bytes) -> bool:
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            log.error("sandbox reply channel garbled; restarting the sandbox")
            self._fail_all("out_of_step")
            return False
        if reply.get("ready") and not self.ready.is_set():
            self.ok = True
            self.ready.set()
            return True
        request_id = reply.get("id") if isinstance(reply.get("id"), int) else None
        slot = self.pending.get(request_id)
        if slot is None:
            # Only the server writes this channel; a reply for no call means something else did.
            log.error("sandbox reply channel out of step (a reply for no call); restarting the sandbox")
            self._fail_all("out_of_step")
            return False
        if reply.get("queued") or reply.get("started"):  # waiting for a free slot / out of the queue
            slot[2] = "queued" if reply.get("queued") else time.monotonic()
            return True
        del self.pending[request_id]
        slot[1] = reply
        slot[0].set()
        return True

    def _fail_all(self, why: str) -> None:
        self.dead = True
        self.ready.set()
        for slot in list(self.pending.values()):
            slot[1] = {why: True}
            slot[0].set()
        self.pending.clear()

    def call(self, request: dict[str, Any], wait: float, sent=None) -> dict[str, Any]:
        """Send ``request`` (its ``id`` is set here), call ``sent()`` once it is written, and wait
        up to ``wait`` seconds for the reply."""
        request_id = secrets.randbits(62)
        slot = [threading.Event(), None, time.monotonic()]  # done, reply, when it started ("queued")
        with _critical(self.write_lock):
            if self.dead:
                return {"lost": True}
            self.pending[request_id] = slot
            try:
                self.proc.stdin.write((json.dumps({**request, "id": request_id}) + "\n").encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                self.pending.pop(request_id, None)
                return {"lost": True}
        if sent is not None:
            sent()
        while not slot[0].wait(1.0):
            if slot[2] != "queued" and time.monotonic() > slot[2] + wait:
                self.pending.pop(request_id, None)
                return {"lost": True}
        return slot[1]

    def cancel(self, request: dict[str, Any]) -> None:
        with _critical(self.write_lock):
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def kill(self) -> None:
        self.dead = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("sandbox server %s did not exit after SIGKILL", self.proc.pid)
        try:
            self.proc.stdin.close()  # stdout and stderr are the reader's to close
        except OSError:
            pass


class _Pool:
    """What the sandboxes of one level and preload share in one process: the directory holding
    their episodes' files, and the server (started by the first call, restarted when it dies,
    killed with the directory when the last user lets go)."""

    def __init__(self, level: str, preload: tuple[str, ...], cgroups: bool = True, tmpfs: bool = True):
        self.level, self.preload, self.pid = level, preload, os.getpid()
        self.cgroups = _make_cgroup_parents()[0] if cgroups and memory_mechanism()[0] else None
        root = _workspace_root()
        if os.geteuid() == 0:
            _sweep_stale_pools()
        # (named for this process: the pool of one killed unmounted, or with no tmpfs at all, holding
        # its episodes' files, is removed by the next process to make a pool here)
        self.dir = owned_tempdir("sandbox", dir=root)
        os.chmod(self.dir, 0o711)  # the episodes' own uids (root hosts) must reach their workspaces
        # non-root hosts mount in a user namespace of their own, and reach the files through it
        self.mounts = _user_mounts() if tmpfs and os.geteuid() != 0 else None
        self.tmpfs = tmpfs and _share_pool_dir(self.dir, self.mounts)  # episodes then get a tmpfs each
        if self.mounts is not None and not self.tmpfs:
            self.mounts.close()
            self.mounts = None
        self.files = self.mounts.view(self.dir) if self.mounts else self.dir  # self.dir as this process reaches it
        self.users = 0
        self.restarts = 0
        self._server: _Server | None = None
        self._lock = threading.Lock()

    @property
    def errors(self) -> str:
        return self._server.errors.strip() if self._server else ""

    def server(self) -> _Server:
        """The running server, started (or restarted) if need be."""
        with _critical(self._lock):
            server = self._server
            if server is None or server.dead or server.proc.poll() is not None:
                if server is not None:
                    server.kill()
                    self.restarts += 1
                server = self._server = _Server(_spawn(self.level, self.dir, self.preload, self.cgroups, self.mounts))
            return server

    def forget(self, episode: str) -> None:
        """Tell the running server an episode ended (its network namespace goes)."""
        server = self._server
        if server is not None and not server.dead and self.pid == os.getpid():
            server.cancel({"forget": episode})

    def detach(self, path: Path) -> bool:
        """Detach the tmpfs at ``path`` (a path of the namespace it was mounted in)."""
        return (self.mounts.detach if self.mounts else _detach)(str(path))

    def detach_episode(self, path: Path) -> bool:
        """Detach an episode's tmpfs at ``path``, the kernel's wait after it off the caller's time
        where this process mounted it (root hosts: :func:`_detach_off_path`)."""
        if self.mounts is not None or self.pid != os.getpid():
            return self.detach(path)
        return _detach_off_path(path, self.dir)

    def restart(self, server: _Server) -> None:
        """Kill ``server`` (hung, or its channel no longer trusted); the next call starts another."""
        server.kill()

    def shut_down(self) -> None:
        with _critical(self._lock):
            server, self._server = self._server, None
        if server is not None and self.pid == os.getpid():
            server.kill()
        if self.pid == os.getpid():
            _remove_cgroups(self.cgroups, wait=2.0)
            if self.mounts is not None:  # its namespace, tmpfs and all, goes with its helper (the server is gone)
                self.mounts.close()
            elif self.tmpfs:
                _detach(str(self.dir))
        remove_tree(self.dir)


_POOLS: dict[tuple[str, tuple[str, ...]], _Pool] = {}
_POOLS_LOCK = threading.Lock()


def _acquire(level: str, preload: tuple[str, ...]) -> _Pool:
    with _critical(_POOLS_LOCK):
        pool = _POOLS.get((level, preload))
        # (a pool whose mounts' helper was killed cannot give new episodes files the host reaches:
        # a new one does; the old one's users still let it go)
        if pool is None or pool.pid != os.getpid() or (pool.mounts is not None and pool.mounts.gone()):
            pool = _POOLS[(level, preload)] = _Pool(level, preload)
        pool.users += 1
        return pool


def _release(pool: _Pool) -> None:
    if pool.pid != os.getpid():  # a forked child's copy: the parent's to stop
        return
    if _when_free(lambda: _release(pool)):  # (a finalizer, in a thread holding a sandbox lock)
        return
    with _critical(_POOLS_LOCK):
        pool.users -= 1
        if pool.users > 0:
            return
        if _POOLS.get((pool.level, pool.preload)) is pool:
            del _POOLS[(pool.level, pool.preload)]
    pool.shut_down()


class SandboxLease:
    """Keeps the shared server of ``(level, preload)`` alive between episodes (an environment holds
    one from its first sandboxed episode until it closes). ``release()`` is idempotent."""

    def __init__(self, level: str, preload: tuple[str, ...]):
        self._pool: _Pool | None = _acquire(level, tuple(preload))

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            _release(pool)


def _forget_pools_after_fork() -> None:
    """A forked child starts with no server of its own, nor uid; the parent's stay the parent's,
    and the parent's mount helpers end with the parent (not with its last forked child)."""
    global _DETACHER, _DETACHER_LOCK
    _POOLS.clear()
    _UIDS.after_fork()
    _DETACHER, _DETACHER_LOCK = None, threading.Lock()  # (the parent's thread is not the child's)
    for helper in list(_HELPERS):
        helper.after_fork()


os.register_at_fork(after_in_child=_forget_pools_after_fork)


_MAX_DEPTH = 128  # deeper directories are moved up to the workspace's top level when walked


def _walk(root: Path, visit=None, remove: bool = False) -> None:
    """Visit every entry under ``root`` as ``visit(parts, stat)``, or delete them all: iterative,
    one directory fd per level (any name length), never following a symlink, opening up modes
    the code closed. A directory nested deeper than ``_MAX_DEPTH`` is moved up to ``root`` first.
    Mounts under ``root`` are not walked; deleting detaches them (root hosts' tmpfs)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        root_fd = os.open(root, flags)
    except OSError:
        return
    stack: list[tuple[int, tuple[str, ...], list[str]]] = []
    try:
        root_dev = os.fstat(root_fd).st_dev
        stack.append((root_fd, (), _listdir(root_fd)))
        moved = 0
        while stack:
            fd, parts, names = stack[-1]
            if not names:
                stack.pop()
                os.close(fd)  # (the root's too: it leaked one descriptor a walk, an episode's close)
                if stack and remove:
                    _quietly(os.rmdir, parts[-1], dir_fd=stack[-1][0])
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != root_dev and stat.S_ISDIR(st.st_mode):  # a mount (a pool's or episode's tmpfs)
                if not remove or not _detach(f"/proc/self/fd/{fd}/{name}"):
                    continue  # not walked into, not counted: another file system
                try:  # a worker killed with its sandboxes leaves them; what is under them goes with them
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
            if visit is not None:
                visit(parts + (name,), st)
            if not stat.S_ISDIR(st.st_mode):
                if remove:
                    _quietly(os.unlink, name, dir_fd=fd)
                continue
            if len(stack) > _MAX_DEPTH:
                moved += 1
                target = f".deep-{secrets.token_hex(4)}-{moved}"
                if _quietly(os.rename, name, target, src_dir_fd=fd, dst_dir_fd=root_fd):
                    stack[0][2].append(target)
                continue
            if st.st_mode & 0o700 != 0o700:
                _chmod_directory(fd, name, st.st_mode & 0o7777 | 0o700)
            try:
                child = os.open(name, flags, dir_fd=fd)
            except OSError:
                continue
            stack.append((child, parts + (name,), _listdir(child)))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _chmod_directory(dir_fd: int, name: str, mode: int) -> None:
    """Set the mode of the directory ``name`` in ``dir_fd``, never of what a symlink put there
    since it was looked at points to: ``chmod`` follows one, and code swapping the directory for
    a link to a host file just after the host's look had the host (root) open that file up."""
    try:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        _quietly(os.chmod, f"/proc/self/fd/{handle}", mode)
    finally:
        os.close(handle)


def _listdir(fd: int) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _quietly(fn, *args, **kwargs) -> bool:
    try:
        fn(*args, **kwargs)
        return True
    except OSError:
        return False


def _usage(st: os.stat_result) -> int:
    """Bytes an entry counts against the quota: its size or its blocks, whichever is larger, and at
    least one block (an empty file, a link or a FIFO is not free: each costs a walk)."""
    return max(st.st_size if stat.S_ISREG(st.st_mode) else 0, st.st_blocks * 512, 4096)


def _workspace_usage(root: Path) -> int:
    total = 0

    def add(parts, st):
        nonlocal total
        total += _usage(st)

    _walk(root, add)
    return total


def remove_tree(root: Path) -> None:
    """Delete a workspace whatever model code made of it (any depth, modes, names, links).
    Iterative: 1,500 nested directories once broke a recursive walk."""
    _walk(root, remove=True)
    _quietly(os.rmdir, root)


class Sandbox:
    """One episode's sandbox: a workspace (and a private ``/tmp``), and calls that run code in it
    through the process's shared server (started by the first call that needs one).

    Args:
        mode: ``"auto"`` (bubblewrap, else refuse), ``"bubblewrap"`` (same, stated), or
            ``"rlimits"`` (explicit opt-in to run model code with resource limits only).
        limits: per-call :class:`SandboxLimits`.
        preload: modules the warm server imports once (``("openpyxl",)`` for Excel); sandboxes
            with the same level and preload share a server.
        pool: internal: a private server instead of the process's shared one (``doctor``'s probe).

    Example::

        with Sandbox(preload=("math",)) as box:
            print(box.run("print(2 ** 10)").text)     # exit code 0 / stdout: 1024
    """

    def __init__(self, *, mode: str = "auto", limits: SandboxLimits | None = None, preload: tuple[str, ...] = (),
                 pool: _Pool | None = None):
        self.level = pool.level if pool is not None else resolve_level(mode)
        if self.level == UNAVAILABLE:
            raise SandboxUnavailable(
                f"cannot run model code: {bubblewrap_status()[1]}. Install bubblewrap, or pass "
                "sandbox='rlimits' to run it with resource limits only (no file-system or network isolation)."
            )
        self.limits = limits or SandboxLimits()
        self.preload = tuple(preload)
        self._owned_pool = pool is None  # a lease on the shared pool, released at close
        self._pool, self.tmpfs, made, self.uid = pool, False, False, None
        try:
            # root hosts: the episode's code runs as an unprivileged uid of its own (its process limit
            # then counts only its own processes), held until it closes; taken first: it may be refused
            self.uid = _UIDS.reserve() if os.geteuid() == 0 else None
            if self._pool is None:
                self._pool = _acquire(self.level, self.preload)
            self._pid = os.getpid()
            self.name = secrets.token_hex(8)
            self._mountpoint = self._pool.dir / f"ep-{self.name}"  # the episode's tmpfs, or a directory
            self._dir = self._pool.files / f"ep-{self.name}"  # the same, as this process reaches it
            self._dir.mkdir(mode=0o700)
            made = True
            os.chmod(self._dir, 0o711 if os.geteuid() == 0 else 0o700)  # root: the episode's uid passes through
            self.tmpfs = self._pool.tmpfs and _episode_tmpfs(self._mountpoint, self.limits, self._pool.mounts)
            self.workspace = self._dir / "workspace"
            self.tmp = self._dir / "tmp"
            self.workspace.mkdir(mode=0o700)
            self.tmp.mkdir(mode=0o700)
            _own_workspace(self.workspace, self.uid)
            if self.uid is not None:
                os.chown(self.tmp, self.uid, self.uid)
        except BaseException:  # what the start took goes back: a failed start held its uid for the
            self._closed = True  # process's life (and the shared server's lease, and its directory)
            if made:
                if self.tmpfs:
                    self._pool.detach(self._mountpoint)
                remove_tree(self._dir)
            if self.uid is not None:
                _UIDS.release(self.uid)
            if self._owned_pool and self._pool is not None:
                _release(self._pool)
            raise
        self._lock = threading.Lock()
        self._closed = False
        self._running: tuple[_Server, int] | None = None
        _LIVE.add(self)

    @property
    def restarts(self) -> int:
        """How often the shared server was restarted (it died, hung, or its channel was forged)."""
        return self._pool.restarts

    def put_file(self, name: str, source: str | os.PathLike | bytes) -> Path:
        """Place a file (copied from a path, or given as bytes) in the workspace, owned so that
        the code may change it. ``name`` is relative to the workspace and may not escape it: it
        is opened one component at a time, following no link (the workspace may lie behind
        ``/proc/PID/root``, out of which resolving a path would step)."""
        parts = Path(os.path.normpath(name)).parts if name else ()
        if not parts or os.path.isabs(name) or parts[0] in (".", ".."):
            raise ValueError(f"{name!r} is outside the workspace")
        fds: list[int] = []
        try:
            try:
                fds.append(os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
                for part in parts[:-1]:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fds[-1])
                    fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
                fds.append(os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                                   | os.O_CLOEXEC, 0o666, dir_fd=fds[-1]))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
                    raise ValueError(f"{name!r} is outside the workspace (through a link) or not a file") from None
                if exc.errno == errno.ENOENT:
                    self._check_files()
                raise
            with open(fds[-1], "wb", closefd=False) as target:
                if isinstance(source, bytes):
                    target.write(source)
                else:
                    with open(source, "rb") as f:
                        shutil.copyfileobj(f, target)
            if self.uid is not None:
                for fd in fds[1:]:
                    os.fchown(fd, self.uid, self.uid)
        finally:
            for fd in fds:
                os.close(fd)
        return self.workspace.joinpath(*parts)

    def close(self) -> None:
        """End the episode's call if one runs, delete its workspace and ``/tmp``, and let go of the
        shared server (stopped when nothing else uses it)."""
        if self._closed or self._pid != os.getpid():
            return
        if _when_free(self.close):  # (a finalizer, in a thread holding a sandbox lock)
            return
        self._closed = True
        running = self._running
        if running is not None:  # another thread's call is out: end it before the files go
            server, request_id = running
            server.cancel({"cancel": self.name})
        with self._lock:  # run() returns as soon as the server says the call ended (or, not yet
            pass  # sent, it ends it itself, or sends none: see sent() in run())
        if self.uid is not None and self._pool.level == RLIMITS:  # a cancelled call's monitor was
            kill_uid(self.uid)  # killed, sweeping nothing: what the code left running goes before its files
        self._pool.forget(self.name)
        if self.tmpfs:
            self._pool.detach_episode(self._mountpoint)  # its pages go with the last mount of it (a call's copy)
        remove_tree(self._dir)
        if self.uid is not None:  # its processes and files are gone: another episode may have it
            _UIDS.release(self.uid)
        if self._owned_pool:
            _release(self._pool)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- running code -----------------------------------------------------------------------------

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` in a fresh child of the warm server; never raises for what the code does."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        timeout = min(float(timeout or self.limits.timeout), self.limits.timeout)
        with self._lock:
            if self._closed:
                raise RuntimeError("the sandbox is closed")
            if self._pid != os.getpid():
                raise RuntimeError("the sandbox belongs to the process that opened it")
            try:
                return self._call(code, timeout)
            except SandboxFilesLost as exc:  # not the code's doing (unless it could reach the helper)
                log.error("%s", exc)
                return ExecResult(error_override="tool_error", notes=[str(exc)], outcome=self._not_the_codes(ENV_ERROR))

    def _call(self, code: str, timeout: float) -> ExecResult:
        """``run``'s call, under its lock; raises :class:`SandboxFilesLost`."""
        self._check_files()
        server = self._pool.server()
        if not server.ready.wait(60) or not server.ok:
            server.finished.wait(2.0)  # its stdout closed first: bubblewrap's message may be unread
            why = self._pool.errors
            log.error("the sandbox failed to start: %s", why or "no message")
            self._pool.restart(server)
            return ExecResult(notes=["the sandbox failed to start" + (f": {why}" if why else "")],
                              error_override="tool_error", outcome=TOOL_UNAVAILABLE)
        if self._closed:  # close() came while the server started: nothing is sent
            return ExecResult(error_override="tool_error", notes=["the episode ended"])
        started = time.monotonic()
        before = self._statvfs() if self.tmpfs else None
        request = {"code": code, "timeout": timeout, "episode": self.name, "uid": self.uid,
                   "limits": asdict(self.limits)}

        def sent():  # running once the request is out: a cancel sent before it would find no call
            self._running = (server, 0)
            if self._closed:  # close() came first and found nothing running to cancel
                server.cancel({"cancel": self.name})

        try:
            reply = server.call(request, timeout + 10.0, sent)  # the server enforces timeout; then grace
        finally:
            self._running = None
        seconds = time.monotonic() - started
        if reply.get("lost"):
            # The server itself hung or died: kill it all; the next call starts afresh.
            self._pool.restart(server)
            return ExecResult(timed_out=True, seconds=seconds, outcome=self._not_the_codes(TOOL_UNAVAILABLE),
                              notes=["the sandbox stopped responding and was restarted"])
        if reply.get("out_of_step"):
            log.error("sandbox reply channel out of step; its result was discarded (%s)", reply["out_of_step"])
            # only code that escaped isolation writes the channel (rlimits level): the model's doing
            return ExecResult(seconds=seconds, error_override="tool_error",
                              notes=["the sandbox's reply channel was out of step; the result was discarded"])
        if reply.get("cancelled"):
            return ExecResult(seconds=seconds, error_override="tool_error", notes=["the episode ended"])
        if reply.get("oom"):  # the call's cgroup hit memory_mb: the kernel killed a process
            reply["exit_code"], reply["signal"] = EXIT_MEMORY, None
            reply.setdefault("notes", []).append(
                f"memory limit of {self.limits.memory_mb} MiB for the call's processes together "
                "exceeded: a process was killed")
        if "internal_error" in reply:
            log.error("sandbox server error: %s", reply["internal_error"])
            return ExecResult(timed_out=True, seconds=seconds, outcome=self._not_the_codes(ENV_ERROR),
                              notes=["the sandbox failed to run the code"])
        result = ExecResult(**{k: reply[k] for k in ExecResult.__dataclass_fields__ if k in reply})
        if self.tmpfs:  # the kernel held the quota during the call: say so if this call spent it
            st = self._statvfs()
            if (st.f_bavail == 0 and (st.f_bfree < before.f_bfree or result.exit_code == EXIT_FILE_SIZE)
                    or st.f_favail == 0 and (st.f_ffree < before.f_ffree or result.exit_code == EXIT_FILE_SIZE)):
                result.notes.append(f"workspace quota of {self.limits.workspace_mb} MiB (files and "
                                    f"{st.f_files} entries, /tmp included) is full: delete files to write more")
                result.error_override = "file_size_limit"
        elif self._usage() > self.limits.workspace_mb * 1024 * 1024:
            self._enforce_quota(started)
            result.notes.append(f"workspace quota of {self.limits.workspace_mb} MiB exceeded: files written by this call were deleted")
            result.error_override = "file_size_limit"
        return result

    def _not_the_codes(self, outcome: str) -> str | None:
        """``outcome`` for a server that died or failed under isolated code, which cannot reach
        it; None at the ``rlimits`` level, where the code itself can kill its server: a model must
        not escape a bad reward by breaking its sandbox (it is then the model's error, scored)."""
        return outcome if self._pool.level == BUBBLEWRAP else None

    def files_lost(self) -> tuple[str, str] | None:
        """``(outcome, why)`` when the host no longer reaches this episode's files (its pool's
        mount helper died) and that is not the code's doing: the engine then ends the episode as
        the environment's failure, whatever tool or grader would next read its files (an Excel
        read, the grader's look at the workbook) and fail as the model's error. None otherwise (at
        the ``rlimits`` level, where the code could kill the helper itself: its failure is scored)."""
        if self._closed or self._pid != os.getpid():  # (no episode of this process's to fail)
            return None
        try:
            self._check_files()
        except SandboxFilesLost as exc:
            outcome = self._not_the_codes(ENV_ERROR)
            return (outcome, str(exc)) if outcome else None
        return None

    def _check_files(self) -> None:
        """Raise :class:`SandboxFilesLost` if the host no longer reaches the episode's files (the
        helper holding its pool's mounts died), where a file operation would fail with a bare
        FileNotFoundError under ``/proc/PID/root``."""
        mounts = self._pool.mounts
        if mounts is not None and mounts.gone():
            raise SandboxFilesLost(
                f"the sandbox's mount helper (pid {mounts.proc.pid}) died, and with it the host's view of "
                "this episode's files: the episode cannot go on (new episodes get a new sandbox)")

    def _statvfs(self) -> os.statvfs_result:
        try:
            return os.statvfs(self._dir)
        except FileNotFoundError:
            self._check_files()
            raise

    def _usage(self) -> int:
        if self.tmpfs:
            st = self._statvfs()
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        return _workspace_usage(self.workspace) + _workspace_usage(self.tmp)

    def _enforce_quota(self, since: float) -> None:
        """Delete entries changed during the call that broke the quota, newest first. Change time,
        not modification time: code can set the latter (``os.utime``), never the former.
        Directories count too (each an entry, like an empty file) and go once empty: a directory
        still holding newer entries is retried after them, deepest first (its children are gone
        by then, or are older than the call and it stays)."""
        cutoff = time.time() - (time.monotonic() - since) - 1
        changed, total = [], 0

        for root in (self.workspace, self.tmp):
            def collect(parts, st, root=root):
                nonlocal total
                total += _usage(st)
                if st.st_ctime >= cutoff:
                    changed.append((st.st_ctime, _usage(st), root, parts, stat.S_ISDIR(st.st_mode)))

            _walk(root, collect)
        quota = self.limits.workspace_mb * 1024 * 1024
        not_empty = []
        for entry in sorted(changed, key=lambda c: c[:2], reverse=True):
            if total <= quota:
                return
            _, size, root, parts, is_dir = entry
            if _unlink_at(root, parts, is_dir):
                total -= size
            elif is_dir:
                not_empty.append(entry)
        for _, size, root, parts, is_dir in sorted(not_empty, key=lambda c: len(c[3]), reverse=True):
            if total <= quota:
                return
            if _unlink_at(root, parts, is_dir):
                total -= size


def _unlink_at(root: Path, parts: tuple[str, ...], directory: bool = False) -> bool:
    """Unlink ``root/parts...`` (``directory``: remove it if empty) one directory at a time (no
    symlink followed, any path length)."""
    fds = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        (os.rmdir if directory else os.unlink)(parts[-1], dir_fd=fds[-1])
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


_LIVE: "weakref.WeakSet[Sandbox]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """No sandbox process outlives the interpreter (bubblewrap's --die-with-parent covers crashes)."""
    for box in list(_LIVE):
        box.close()
    for pool in list(_POOLS.values()):  # held by environments' leases
        if pool.pid == os.getpid():
            pool.shut_down()


def python_tool(name: str = "python", description: str | None = None) -> Tool:
    """The tool that runs model-written Python in the episode's sandbox.

    Its result is the exit status, stdout and stderr; a timeout or a limit hit is a tool error
    whose code (``tool_timeout``, ``memory_limit``, ``file_size_limit``, ``process_limit``,
    ``tool_error``) lands in ``info["error"]``.
    """

    def run(code: str, episode) -> str:
        box: Sandbox | None = episode.state.get("sandbox") if episode is not None else None
        if box is None:
            raise ToolError("no sandbox is running for this episode")
        timeout = None
        if episode.deadline is not None:  # the call may not run past the episode's deadline
            timeout = episode.deadline - time.monotonic()
            if timeout <= 0:
                raise ToolFailure("the episode's time limit has passed", DEADLINE)
        result = box.run(code, timeout)
        if result.outcome:  # the sandbox failed, not the code
            raise ToolFailure(result.text, result.outcome)
        if result.timed_out and timeout is not None and timeout < box.limits.timeout:
            raise ToolFailure(f"the episode's time limit ran out during the call\n{result.text}", DEADLINE)
        if result.error:
            raise ToolError(result.text, code=result.error)
        return result.text

    run.__doc__ = description or (
        "Run Python 3 code in a fresh, isolated process and return its exit status, stdout and stderr.\n\n"
        "Print what you want to see. Files written in the current directory persist between calls; "
        "nothing else does. There is no network access.\n\n"
        "Args:\n    code: the Python source to run"
    )
    return tool(run, name=name, self_timed=True)


def sandboxed_python(
    env_id: str,
    *,
    enabled: bool,
    mode: str,
    limits: dict[str, Any] | None,
    timeout: float,
    preload: tuple[str, ...],
    name: str = "python",
    description: str | None = None,
) -> tuple[list[Tool], SandboxConfig | None]:
    """What a family needs to offer a python tool: ``(tools, sandbox config)``.

    Without an isolation level (no bubblewrap and no explicit ``mode="rlimits"``) the tool is
    left out with a warning and the config's level is ``unavailable``; bad modes and limits
    raise ``ValueError`` naming the argument, at ``gym.make``.
    """
    if not enabled:
        return [], None
    config = SandboxConfig(mode=mode, limits=SandboxLimits.from_dict({"timeout": timeout, **(limits or {})}),
                           preload=preload)
    if config.level == UNAVAILABLE:
        warn(f"{env_id}: the {name} tool is left out: {bubblewrap_status()[1]}. Install bubblewrap, "
             "or pass sandbox='rlimits' to run model code with resource limits only.")
        return [], config
    return [python_tool(name, description)], config
