"""The warm process inside an episode's sandbox (standard library only; runs as a script).

It imports the family's common modules once, then serves one request per line on stdin:
``{"id": int, "code": str, "timeout": float}``, each answered with its ``id``. For each request it
forks a fresh child that drops to an unprivileged uid (root hosts), sets resource limits, runs the
code in the workspace and exits; the server collects its capped stdout/stderr, enforces the
wall-clock timeout by killing the child's whole process tree, sweeps away anything the code left
running, and answers one JSON line on stdout.

Calls are thus isolated from each other except through the workspace files, and a crash, a
hang or a fork bomb in the code never takes the server down.

Configuration comes as one JSON argument: uid/gid to drop to (or null), limits, modules to
preload, the workspace path, ``sys.path`` (inside bubblewrap the interpreter runs with ``-S`` at a
neutral path), and whether this server owns its PID namespace: it is then that namespace's init,
so every other process in it belongs to model code, and the kernel drops the SIGKILL/SIGSTOP code
sends it. The server is non-dumpable (code running as the same uid cannot read its memory or open
its descriptors, hence cannot write into the host channel), and the code's process keeps none of
its descriptors.
"""

import json
import os
import resource
import selectors
import signal
import sys
import time
import traceback

# Exit statuses the child uses to say which limit it hit (the code itself may also exit with them,
# which only mislabels its own failure).
EXIT_MEMORY, EXIT_FILE_SIZE, EXIT_PROCESSES = 120, 121, 122
CONFIG = json.loads(sys.argv[1])
LIMITS = CONFIG["limits"]
if CONFIG.get("path"):
    sys.path[:] = CONFIG["path"]
PR_SET_DUMPABLE = 4
_libc = []


def set_dumpable(value):
    if not _libc:
        import ctypes

        _libc.append(ctypes.CDLL(None).prctl)
    _libc[0](PR_SET_DUMPABLE, value, 0, 0, 0)


def preload():
    for name in CONFIG.get("preload", []):
        try:
            __import__(name)
        except Exception:  # a missing optional module only makes calls slower
            pass


def run_child(code, write_out, write_err):
    """In the forked child: limits, identity, then the code. Never returns."""
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(write_out, 1)
        os.dup2(write_err, 2)
        os.closerange(3, 1024)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes fail with EFBIG instead
        signal.signal(signal.SIGINT, signal.default_int_handler)
        mb = 1024 * 1024
        for which, value in (
            (resource.RLIMIT_CPU, LIMITS["cpu_seconds"]),
            (resource.RLIMIT_AS, LIMITS["memory_mb"] * mb),
            (resource.RLIMIT_FSIZE, LIMITS["max_file_mb"] * mb),
            (resource.RLIMIT_NPROC, CONFIG["nproc"]),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(which, (value, value))
        if CONFIG.get("uid") is not None:
            os.setgroups([])
            os.setgid(CONFIG["gid"])
            os.setuid(CONFIG["uid"])
        if CONFIG.get("own_pid_namespace"):
            set_dumpable(1)  # the channel is closed; the code may see its own /proc entries
        os.chdir(CONFIG["workspace"])
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin = open(0, "r", closefd=False)
        sys.argv = ["<code>"]
    except BaseException:
        os.write(2, traceback.format_exc().encode())
        os._exit(125)
    status = 0
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        traceback.print_exc()
        status = 1
        if isinstance(exc, MemoryError):
            status = EXIT_MEMORY
        elif isinstance(exc, OSError) and exc.errno == 27:  # EFBIG
            status = EXIT_FILE_SIZE
        elif isinstance(exc, BlockingIOError) and exc.errno == 11:  # EAGAIN from fork
            status = EXIT_PROCESSES
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status & 0xFF)


def sweep(child):
    """Kill what the call left behind: its process group, and as init of our own PID namespace
    every other process in it (grandchildren that called setsid included)."""
    try:
        os.killpg(child, signal.SIGKILL)
    except OSError:
        pass
    if os.getpid() != 1:
        return
    for _ in range(1000):
        try:
            os.kill(-1, signal.SIGKILL)  # everything but init
        except OSError:
            pass
        if reap():
            return
        time.sleep(0.001)


def reap():
    """Collect exited children; True once none is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def serve_one(request):
    code = request["code"]
    timeout = float(request.get("timeout", LIMITS["timeout"]))
    cap = LIMITS["max_output_chars"]
    read_out, write_out = os.pipe()
    read_err, write_err = os.pipe()
    start = time.monotonic()
    child = os.fork()
    if child == 0:
        os.close(read_out)
        os.close(read_err)
        run_child(code, write_out, write_err)
    os.close(write_out)
    os.close(write_err)
    buffers = {read_out: bytearray(), read_err: bytearray()}
    dropped = {read_out: 0, read_err: 0}
    sel = selectors.DefaultSelector()
    for fd in buffers:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = start + timeout
    timed_out = False
    status = None
    exited_at = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = status is None
            break
        if sel.get_map():
            events = sel.select(min(deadline - now, 0.02))
        else:
            events = []
            time.sleep(min(deadline - now, 0.002))
        for key, _ in events:
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(key.fd)
                continue
            room = max(cap * 4 - len(buffers[key.fd]), 0)  # bytes; decoded and cut to chars later
            buffers[key.fd] += chunk[:room]
            dropped[key.fd] += len(chunk) - min(room, len(chunk))
        if status is None:
            pid, raw = os.waitpid(child, os.WNOHANG)
            if pid:
                status, exited_at = raw, time.monotonic()
        # Done when the code exited and its output is drained - or, if something it started
        # still holds the pipes open, shortly after it exited (the sweep ends those).
        if status is not None and (not sel.get_map() or time.monotonic() - exited_at > 0.05):
            break
    sweep(child)
    if status is None:
        try:
            _, status = os.waitpid(child, 0)
        except ChildProcessError:
            status = 0
    reap()
    sel.close()
    for fd in buffers:
        os.close(fd)
    result = {"timed_out": timed_out, "seconds": time.monotonic() - start}
    result["exit_code"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    result["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    for name, fd in (("stdout", read_out), ("stderr", read_err)):
        text = buffers[fd].decode("utf-8", errors="backslashreplace")
        extra = dropped[fd]
        if len(text) > cap:
            extra += len(text[cap:].encode("utf-8", errors="backslashreplace"))
            text = text[:cap]
        result[name] = text
        result[name + "_dropped_bytes"] = extra
    return result


def main():
    if CONFIG.get("own_pid_namespace"):
        set_dumpable(0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as init, a signal without handler never arrives
    # The channel to the host gets a descriptor of its own; fd 1 goes to stderr (the host keeps it
    # for error messages), so whatever a preloaded module prints cannot corrupt the protocol.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    preload()
    os.chdir(CONFIG["workspace"])

    def reply(message):
        try:
            out.write(json.dumps(message) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):  # the host is gone (the episode ended): leave quietly
            os._exit(0)

    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        request = {}
        try:
            request = json.loads(line)
            result = serve_one(request)
        except Exception:
            result = {"internal_error": traceback.format_exc()}
        result["id"] = request.get("id") if isinstance(request, dict) else None
        reply(result)


if __name__ == "__main__":
    main()
