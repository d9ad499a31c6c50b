"""The parent's side of a worker's connection: messages over a pipe (``_Process``) or, in
``ray_vector``, an env host's socket, and how a lost worker is reported."""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from benchmax_gym.core.sandbox import remove_tree

from .worker import _in_own_tmp

def readable(conns: list[Any], timeout: float | None) -> list[Any]:
    """The connections with something to read (a message, or the end of a dead peer's stream),
    waiting up to ``timeout`` seconds (``None``: until one has). ``multiprocessing``'s ``wait``
    does this too, but builds a selector per call: tens of microseconds, several times a step."""
    poller = select.poll()
    by_fd = {}
    for conn in conns:
        by_fd[conn.fileno()] = conn
        poller.register(conn.fileno(), select.POLLIN)
    ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return [by_fd[fd] for fd, _ in poller.poll(ms)]



class WorkerLost(RuntimeError):
    """A worker is gone (its process died, its Ray actor or node was lost); says why."""


class _Channel:
    """Messages over a ``multiprocessing`` connection: a worker's pipe, or an env host's socket.

    A transport handle (``_Process`` here, ``_RayHost`` in ``ray_vector``) offers
    ``send(message)``, ``recv(timeout)`` for one message, ``recv_ready()`` for all that arrived,
    ``alive()``, ``close()`` (ask it to stop), ``join(timeout)`` and ``kill()``; its vector env's
    ``_wait`` blocks until some of them have messages. Both raise :class:`WorkerLost` for a dead
    worker, with ``lost_reason()``.
    """

    conn: Any
    crashed: str | None = None  # the worker's own error, when it reported one as it stopped

    def lost_reason(self) -> str:
        raise NotImplementedError

    def send(self, message: Any) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            raise WorkerLost(self.lost_reason()) from None

    def recv(self, timeout: float | None = None) -> Any:
        if not readable([self.conn], timeout):
            raise TimeoutError
        return self._read()

    def _read(self) -> Any:
        try:
            data = self.conn.recv_bytes()
        except (EOFError, OSError):
            raise WorkerLost(self.lost_reason()) from None
        try:
            message = pickle.loads(data)
        except Exception as exc:  # a value that pickled in the worker but does not unpickle here (an
            # exception whose __init__ takes other arguments): its results are lost, the worker is
            # restarted (else the envs it held would wait for ever)
            self.crashed = (f"its results could not be read in the parent: {type(exc).__name__}: {exc} "
                            "(a value that pickled in the worker but does not unpickle here?)")
            raise WorkerLost(self.crashed) from None
        if message[0] == "crashed":  # the worker's own error, as it stops
            self.crashed = f"the worker failed: {message[1]}"
            raise WorkerLost(self.crashed)
        return message

    def recv_ready(self) -> list[Any]:
        """The messages waiting (called once the connection is readable: the first is there)."""
        out = [self._read()]
        while readable([self.conn], 0):
            out.append(self._read())
        return out

    def close(self) -> None:
        try:
            self.send(("close", None))
        except WorkerLost:
            pass


class _Process(_Channel):
    """The pipe transport: the parent's handle on one worker process."""

    def __init__(self, ctx, env_fns: dict[int, Callable[[], gym.Env]], mode: AutoresetMode, fresh: bool,
                 keep: tuple[str, ...] | None = None):
        parent, child = ctx.Pipe()
        self.conn = parent
        self.tmp = tempfile.mkdtemp(prefix="benchmax-worker-")  # removed by kill()
        os.chmod(self.tmp, 0o711)  # a sandbox's unprivileged uid must reach its workspace inside
        self.process = ctx.Process(target=_in_own_tmp, args=(self.tmp, child, env_fns, mode.value, fresh, keep),
                                   daemon=True)
        self.process.start()
        self.pid = self.process.pid
        child.close()

    def lost_reason(self) -> str:
        self.process.join(timeout=5)
        return self.crashed or f"the worker process exited (code {self.process.exitcode})"

    def alive(self) -> bool:
        return self.process.is_alive()

    def join(self, timeout: float) -> None:
        self.process.join(timeout=timeout)

    def kill(self) -> None:
        """Kill the worker and delete its temp root (what a dead worker's envs never cleaned up)."""
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(timeout=10)
        self.conn.close()
        remove_tree(Path(self.tmp))  # model code may have left deep trees and closed modes
