"""The parent's side of a worker's connection: messages over a pipe (``_Process``) or, in
``ray_vector``, an env host's socket, and how a lost worker is reported."""

from __future__ import annotations

import functools
import marshal
import math
import os
import pickle
import select
import signal
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from benchmax_gym.core.aio import LAST_WORD_LOST, frame_header
from benchmax_gym.core.sandbox import remove_tree

from .worker import _in_own_tmp

# A peer that ended its side of the connection, or is gone (POLLRDHUP: Linux's; elsewhere only a
# peer gone shows, so a worker that heard close is told from a stuck one only by its exit)
_ENDED = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR | select.POLLNVAL
HEARS_CLOSE = hasattr(select, "POLLRDHUP")


#: the longest wait a vector env's argument may ask (``step_timeout``, ``recv``'s ``timeout``...):
#: poll(2) takes an int of milliseconds, at most 2**31 - 1 (about 24.8 days), and a longer wait
#: raised OverflowError at the first one (inf and ``10**30`` too); rounded down to about 23 days
WAIT_MAX_S = 2_000_000.0


def ended(fds: list[int], timeout: float) -> set[int]:
    """The descriptors among ``fds`` whose peer ended its side (a worker that heard ``close``:
    ``worker._answer_close``) or is gone, within ``timeout`` seconds: nothing is read, so another
    thread may be reading them meanwhile."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, _ENDED)
    ms = max(0, math.ceil(timeout * 1000))
    return {fd for fd, events in poller.poll(ms) if events & _ENDED}


def readable(conns: list[Any], timeout: float | None) -> list[Any]:
    """The connections with something to read (a message, or the end of a dead peer's stream),
    waiting up to ``timeout`` seconds (``None``: until one has). ``multiprocessing``'s ``wait``
    does this too, but builds a selector per call: tens of microseconds, several times a step.
    A connection may be given as its file descriptor (an int: no ``fileno()`` call per wait)."""
    poller = select.poll()
    by_fd = {}
    for conn in conns:
        fd = conn if type(conn) is int else conn.fileno()
        by_fd[fd] = conn
        poller.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return [by_fd[fd] for fd, _ in poller.poll(ms)]



_PICKLE = pickle.PROTO[0]  # the first byte of every message pickled (protocol 2 or later)


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
    # how a message is pickled: a Ray host's with cloudpickle (a fresh process: what ``__main__``
    # defines travels by value), a local worker's (``_Process.send``) with pickle
    dumps: Callable[[Any], bytes] = staticmethod(functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL))

    def lost_reason(self) -> str:
        raise NotImplementedError

    def send(self, message: Any) -> None:
        try:
            self.conn.send_bytes(self.dumps(message))
        except (BrokenPipeError, OSError):
            raise WorkerLost(self.lost_reason()) from None

    def recv(self, timeout: float | None = None) -> Any:
        if not self.has_message() and not readable([self.conn], timeout):
            raise TimeoutError
        return self._read()

    def has_message(self) -> bool:
        """Whether a whole message is already read ahead here (its connection's readiness does
        not show it)."""
        return False

    def _frame(self) -> Any:
        """The next message's bytes (``EOFError`` or ``OSError``: the worker's end of the stream)."""
        return self.conn.recv_bytes()

    def _read(self) -> Any:
        try:
            data = self._frame()
        except (EOFError, OSError):
            raise WorkerLost(self.lost_reason()) from None
        try:
            if data[0] != _PICKLE:  # a column batch in marshal's format, sent as its own bytes (worker.emit_to)
                return "batch", marshal.loads(data)
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

    def fileno(self) -> int | None:
        """The connection's descriptor (None once closed, or never opened)."""
        return self.conn.fileno()


_LENGTH, _LONG_LENGTH = struct.Struct("!i"), struct.Struct("!Q")  # multiprocessing's frame header
_READ_AHEAD = 1 << 16  # a handle's first read buffer: a message up to this size comes in one read with its header
_KEPT_BUFFER = 1 << 20  # a read buffer up to this size is kept for the next message (a bigger one is not)


class _Process(_Channel):
    """The pipe transport: the parent's handle on one worker process.

    Messages go straight through the pipe's file descriptor, framed as ``multiprocessing``'s
    ``Connection`` frames them (what the worker's connection and ``Outbox`` read and write): its
    pure-Python ``send_bytes``/``recv_bytes`` (a ``BytesIO`` and a copy per message) cost the
    parent microseconds per worker per lock-step batch, serially. A read takes whatever has
    arrived, up to its buffer: a message with its header in one system call, not two (what came
    after it waits in the buffer for the next read, ``has_message``)."""

    def __init__(self, ctx, env_fns: dict[int, Callable[[], gym.Env]], mode: AutoresetMode, fresh: bool,
                 keep: tuple[str, ...] | None = None):
        parent, child = ctx.Pipe()
        self.conn = parent
        self.tmp = tempfile.mkdtemp(prefix="benchmax-worker-")  # removed by kill()
        os.chmod(self.tmp, 0o711)  # a sandbox's unprivileged uid must reach its workspace inside
        self.process = ctx.Process(target=_in_own_tmp, args=(self.tmp, os.getpid(), child, env_fns, mode.value, fresh,
                                                             keep), daemon=True)
        self.process.start()
        self.pid = self.process.pid
        child.close()
        self._reads(parent.fileno())

    def _reads(self, fd: int) -> None:
        """Messages go through ``fd``, the connection's descriptor, read with a buffer of its own."""
        self.fd = fd  # (-1 once killed: never a descriptor number reused since)
        self._buffer = bytearray(_READ_AHEAD)
        self._at = self._end = 0  # what was read past the last message: _buffer[_at:_end]

    def send(self, message: Any) -> None:
        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        n, header = len(body), frame_header(len(body))
        try:
            fd = self.fd
            sent = os.writev(fd, (header, body))
            if sent < len(header) + n:  # (a signal cut the write short)
                rest = memoryview(header + body)[sent:]
                while rest:
                    rest = rest[os.write(fd, rest):]
        except OSError:
            raise WorkerLost(self.lost_reason()) from None

    def _frame(self) -> memoryview:
        """The next message, in a buffer this handle keeps (valid until its next read)."""
        buffer, at, end = self._buffer, self._at, self._end
        if at == end:  # (nothing read ahead: the common case)
            at = 0
            end = os.readv(self.fd, (buffer,))
            if not end:
                raise EOFError
        if end - at < 4:
            at, end = self._fill(at, end, 4)
        head, n = 4, _LENGTH.unpack_from(buffer, at)[0]
        if n < 0:
            if n != -1:
                raise OSError(f"a message of length {n}")
            if end - at < 12:
                at, end = self._fill(at, end, 12)
            head, n = 12, _LONG_LENGTH.unpack_from(buffer, at + 4)[0]
        stop = at + head + n
        if stop <= end:  # (all of it here)
            self._at, self._end = (stop, end) if stop < end else (0, 0)
            return memoryview(buffer)[at + head:stop]
        old, size, got = buffer, head + n, end - at
        if size > len(buffer):  # (doubled: messages that grow a little each step are not a new buffer each)
            buffer = bytearray(max(size, min(2 * len(buffer), _KEPT_BUFFER)))
            if len(buffer) <= _KEPT_BUFFER:
                self._buffer = buffer
        if buffer is not old or at:
            buffer[:got] = old[at:end]
        self._at = self._end = 0
        view = memoryview(buffer)
        while got < size:  # (the rest only: nothing past this message)
            more = os.readv(self.fd, (view[got:size],))
            if not more:
                raise OSError("got end of file during message")
            got += more
        return view[head:size]

    def _fill(self, at: int, end: int, need: int) -> tuple[int, int]:
        """The buffer's unread bytes moved to its start and read on to at least ``need`` bytes
        (a header cut short): their new bounds."""
        buffer = self._buffer
        buffer[:end - at] = buffer[at:end]
        at, end = 0, end - at
        view = memoryview(buffer)
        while end < need:
            more = os.readv(self.fd, (view[end:],))
            if not more:
                raise OSError("got end of file during message")
            end += more
        self._at, self._end = at, end
        return at, end

    def recv_ready(self) -> list[Any]:
        """The messages waiting: the one the pipe showed and those read ahead with it. Any that
        come later make the pipe readable again, for the caller's next wait (no poll per worker
        per batch here)."""
        out = [self._read()]
        while self.has_message():
            out.append(self._read())
        return out

    def has_message(self) -> bool:
        at, end = self._at, self._end
        if end - at < 4:
            return False
        n = _LENGTH.unpack_from(self._buffer, at)[0]
        if n == -1:
            return end - at >= 12 and end - at >= 12 + _LONG_LENGTH.unpack_from(self._buffer, at + 4)[0]
        return end - at >= 4 + n  # (a bad length: read, and its error said)

    exitcode: int | None = None  # (once killed: the process object is closed)

    def lost_reason(self) -> str:
        try:
            if self.fd != -1:
                self.process.join(timeout=5)
                self.exitcode = self.process.exitcode
        except ValueError:  # (killed meanwhile, by a close() in another thread)
            pass
        if self.crashed:
            return self.crashed
        if self.exitcode == LAST_WORD_LOST:
            return (f"the worker process exited (code {self.exitcode}): its last message could not be "
                    "delivered; see its stderr")
        return f"the worker process exited (code {self.exitcode})"

    def fileno(self) -> int | None:
        return None if self.fd == -1 else self.fd

    def alive(self) -> bool:
        try:
            return self.fd != -1 and self.process.is_alive()
        except ValueError:  # (killed meanwhile)
            return False

    def join(self, timeout: float) -> None:
        try:
            if self.fd != -1:
                self.process.join(timeout=timeout)
        except ValueError:  # (killed meanwhile)
            pass

    def kill(self) -> None:
        """Kill the worker, delete its temp root (what a dead worker's envs never cleaned up) and
        release its descriptors (the pipe, and the process's sentinel: a closed vector env that
        is still referenced held two per worker). Again: nothing to do."""
        if self.fd == -1:
            return
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(timeout=10)
        self.fd = -1
        self.conn.close()
        self.exitcode = self.process.exitcode
        if self.exitcode is not None:  # (else still dying: its sentinel goes with the object)
            self.process.close()
        remove_tree(Path(self.tmp))  # model code may have left deep trees and closed modes
