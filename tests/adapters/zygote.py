"""A warm interpreter that forks the two processes of a launched TRL group (see
:func:`launch.start_ranks`): ``python zygote.py FD``, its control socket on descriptor ``FD``.

Every two-process TRL test launches ``python SCRIPT OUT ARGS`` twice, and each such process spends
~5 s of CPU importing torch, transformers and TRL before it does anything: ten launches paid that
twenty times. This process imports them once (single-threaded Python; native threads of torch and
jemalloc carry fork handlers, as for PyTorch's own forked DataLoader workers), then forks a child
per rank that runs the script as ``__main__`` with its own argv, environment, working directory
and log: from there on it is the same process a fresh interpreter would be, imports done.

Requests are JSON (one per SOCK_SEQPACKET message): ``{"argv", "env", "cwd", "log"}`` starts a
child and is answered with its pid; ``{"status": pid}`` with its exit code (a negative signal
number, as ``subprocess`` gives it) or null while it runs. The end of the socket (the test's
process gone) kills every child still running; a child also dies with this process
(``PR_SET_PDEATHSIG``)."""

import atexit
import ctypes
import json
import os
import runpy
import signal
import socket
import sys
import threading
import traceback


def _warm() -> None:
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401

    import benchmax_gym.adapters.trl  # noqa: F401
    import benchmax_gym.testing.tokenizers  # noqa: F401


def _run(request: dict) -> int:
    """In the forked child: the script as ``python argv...`` would run it; its exit code."""
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as ``python script`` puts it
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # what interpreter exit does: wait for non-daemon threads, then atexit
    atexit._run_exitfuncs()
    return code


def main(fd: int) -> None:
    control = socket.socket(fileno=fd)
    _warm()
    libc = ctypes.CDLL(None, use_errno=True)
    children: dict[int, int | None] = {}

    def reap() -> None:
        for pid, status in list(children.items()):
            if status is None:
                done, wait_status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children[pid] = os.waitstatus_to_exitcode(wait_status)

    control.send(b"ready")
    try:
        while True:
            message = control.recv(1 << 20)
            if not message:
                return  # the test's process is gone
            request = json.loads(message)
            reap()
            if "status" in request:
                control.send(json.dumps(children.get(request["status"])).encode())
                continue
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    control.close()
                    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: this zygote gone, so is the rank
                    code = _run(request)
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children[pid] = None
            control.send(str(pid).encode())
    finally:
        for pid, status in children.items():
            if status is None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


if __name__ == "__main__":
    main(int(sys.argv[1]))
