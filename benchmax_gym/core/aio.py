"""An environment's own event loop, for async tools and resources behind the sync Gymnasium API.

Each environment's async resources (an MCP session, a benchmax env's rollouts) live on one
private loop. ``reset``/``step`` drive that loop in the calling thread while they wait, so a tool
call costs no cross-thread wake-up (handing each call to a loop running in another thread cost
0.1-0.2 ms per call on a small machine, more than MCP's whole overhead budget). The async API
(``areset``/``astep``, awaited on the caller's loop) reaches the private loop by driving it in a
helper thread; code already running on the private loop awaits directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import pickle
import signal
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

# Threads that drive private loops for callers that cannot (their thread already runs a loop).
# Each drive holds one thread for the call's duration; many envs may step concurrently.
_helpers = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="benchmax-gym-loop")
_create_lock = threading.Lock()


def run_sync(coroutine: Any) -> Any:
    """Run ``coroutine`` to its end from sync code: ``asyncio.run`` here, or in a thread of its own
    when this thread already runs a loop (a notebook). Its result is kept off asyncio's main task:
    on the main thread the runner puts back the SIGINT handler with ``signal.signal``, which looks
    the old handler (a partial holding the task) up in an enum and, failing, formats ``repr`` of
    it, result included (an eval's every record: 0.15 s per 2,560 episodes, growing with them)."""
    box: list[Any] = []

    async def main() -> None:
        box.append(await coroutine)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(main())
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, main()).result()
    return box[0]


def _fresh_after_fork() -> None:
    # A forked child has none of the parent's threads: a pool that believes it has idle workers
    # would never run anything, and a lock held by a parent thread would never be released.
    global _helpers, _create_lock
    _helpers = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="benchmax-gym-loop")
    _create_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_after_fork)


@contextlib.contextmanager
def _signals_wake(loop: asyncio.AbstractEventLoop):
    """While the main thread drives ``loop``, a signal wakes it wherever the kernel delivers it.

    Ctrl-C is delivered to any thread of the process; Python only runs its handler in the main
    thread, and a main thread asleep in the loop's ``select`` would not notice until the loop's
    next timer (an hour away, say). The loop's own self-pipe as the signal wake-up fd (as asyncio's
    ``add_signal_handler`` does) makes it wake and raise ``KeyboardInterrupt`` at once. A wake-up fd
    someone else set is left alone.
    """
    sock = getattr(loop, "_csock", None)  # selector loops' self-pipe (write end)
    old = -2
    if sock is not None and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            old = signal.set_wakeup_fd(sock.fileno(), warn_on_full_buffer=False)
            if old != -1:
                signal.set_wakeup_fd(old)
    try:
        yield
    finally:
        if old == -1:
            signal.set_wakeup_fd(-1)


class OwnLoop:
    """A private event loop, driven by whichever thread waits on it.

    The loop only runs while someone waits on it; between calls its tasks (a session's reader,
    say) are paused and their pipes and sockets simply buffer. A thread that wants the loop while
    another drives it hands its coroutine over, and takes over the driving if the other thread
    stops first: no call is ever left on a loop nobody runs.

    A host that runs one loop for the environment's whole life (a vector worker) can
    :meth:`adopt` it instead: the async API then needs no hop at all.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._cond = threading.Condition()
        self._driving = False
        self._adopted = False

    def adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Live on ``loop``, which its owner keeps for this environment's whole life (and runs).

        Only before the environment's first async work that is still alive: resources opened on
        another loop cannot move. A loop of its own that ran to completion and holds no task (an
        environment that listed its tools at construction) is closed and replaced.
        """
        old = self._loop
        if old is not None and old is not loop and self._pid == os.getpid():
            if self._driving or old.is_running() or asyncio.all_tasks(old):
                raise RuntimeError("adopt() must come before the environment's first async work")
            old.close()
        self._loop, self._pid, self._adopted = loop, os.getpid(), True

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        # A forked child has none of its parent's loop's threads or tasks: it starts afresh.
        loop = self._loop
        if loop is None or loop.is_closed() or self._pid != os.getpid():
            if self._adopted and self._pid == os.getpid():
                raise RuntimeError("the event loop this environment was given (adopt) has been closed")
            with _create_lock:
                if self._loop is loop:
                    self._cond, self._driving, self._adopted = threading.Condition(), False, False
                    self._loop, self._pid = asyncio.new_event_loop(), os.getpid()
            loop = self._loop
        return loop

    def _take(self, wait_for: concurrent.futures.Future | None = None) -> bool:
        """Become the driver (True), or return False once ``wait_for`` is done."""
        with self._cond:
            while self._driving:
                if wait_for is None:
                    return False
                if wait_for.done():
                    return False
                self._cond.wait()
            self._driving = True
            return True

    def _release(self) -> None:
        with self._cond:
            self._driving = False
            self._cond.notify_all()

    def _drive(self, coro: Any) -> Any:
        loop = self.loop
        if self._adopted and loop.is_running():  # its owner runs it: hand the call over
            return asyncio.run_coroutine_threadsafe(coro, loop).result()
        if self._take():
            task = None
            try:
                task = loop.create_task(coro)
                with _signals_wake(loop):
                    return loop.run_until_complete(task)
            except BaseException:
                if task is not None and not task.done():  # Ctrl-C while waiting: the call is abandoned,
                    task.cancel()  # so cancel it now rather than let it run on at the next call
                    with contextlib.suppress(BaseException):
                        loop.run_until_complete(task)
                raise
            finally:
                self._release()
        return self._until_done(self._start(coro)[0])  # the current driver runs it

    def _start(self, coro: Any) -> tuple[concurrent.futures.Future, Callable[[], None]]:
        """Make ``coro`` a task on the loop from any thread: its outcome, and a thread-safe cancel.

        The outcome is only settled when the task has really finished (a cancelled task included),
        so whoever drives the loop until then lets the coroutine clean up.
        """
        loop = self.loop
        outcome: concurrent.futures.Future = concurrent.futures.Future()
        tasks: list[asyncio.Task] = []

        def settle(task: asyncio.Task) -> None:
            if task.cancelled():
                outcome.cancel()
            elif task.exception() is not None:
                outcome.set_exception(task.exception())
            else:
                outcome.set_result(task.result())

        def start() -> None:
            tasks.append(loop.create_task(coro))
            tasks[0].add_done_callback(settle)

        loop.call_soon_threadsafe(start)
        return outcome, lambda: loop.call_soon_threadsafe(lambda: tasks[0].cancel())  # after start()

    def _until_done(self, handed: concurrent.futures.Future) -> Any:
        """Wait for a coroutine handed to the loop; drive the loop ourselves whenever nobody does."""
        loop = self.loop

        def wake(_: Any) -> None:
            with self._cond:
                self._cond.notify_all()

        handed.add_done_callback(wake)
        while not handed.done():
            if self._take(wait_for=handed):
                try:
                    if not handed.done():
                        loop.run_until_complete(asyncio.wrap_future(handed, loop=loop))
                finally:
                    self._release()
        return handed.result()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on this loop and return its result, from synchronous code.

        ``timeout`` cancels the coroutine and raises :class:`TimeoutError` when exceeded.
        """
        if timeout is not None:
            coro = asyncio.wait_for(coro, timeout)
        running = asyncio._get_running_loop()
        if running is None:
            return self._drive(coro)
        if running is self._loop:
            coro.close()
            raise RuntimeError("a blocking call from inside this environment's own event loop; await it instead")
        return _helpers.submit(self._drive, coro).result()  # this thread runs another loop: drive ours elsewhere

    async def arun(self, coro: Any) -> Any:
        """Await ``coro`` on this loop from any event loop; cancelling the caller cancels it."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        if self._adopted and self.loop.is_running():
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))
        outcome, cancel = self._start(coro)
        _helpers.submit(self._until_done, outcome)
        try:
            return await asyncio.shield(asyncio.wrap_future(outcome))
        except asyncio.CancelledError:
            cancel()  # the helper keeps driving until the coroutine has handled it
            raise

    def close(self) -> None:
        """Cancel what is left on the loop and close it (a later call opens a fresh one)."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._pid != os.getpid():
            return
        if self._adopted:  # its owner closes it
            self._loop, self._adopted = None, False
            return
        running = asyncio._get_running_loop()
        if running is loop:
            return  # closed from inside itself: nothing can run it to a clean end; the GC will
        if running is not None:
            _helpers.submit(self._close, loop).result()  # this thread runs another loop
        else:
            self._close(loop)

    def _close(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._take(wait_for=_DONE):
            return  # being driven elsewhere right now: leave it to the GC
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            if self._loop is loop:
                self._loop = None
        finally:
            self._release()


_DONE: concurrent.futures.Future = concurrent.futures.Future()
_DONE.set_result(None)


def frame_header(n: int) -> bytes:
    """``multiprocessing``'s length prefix of an ``n``-byte message (its ``Connection`` frames)."""
    return struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)


class Outbox:
    """A worker's messages to its parent, written without ever blocking the worker's loop: what
    the connection cannot take now waits here and goes out as it drains, while the loop still
    reads commands. A vector worker blocked writing results its parent has not read yet, while
    the parent blocks writing it a command, would wait for ever (a ready-first caller sending big
    actions while big results wait); an eval worker blocked on its records stalls every episode
    it holds. Frames are the connection's own (``multiprocessing``'s length prefix; a Ray host's
    sealed frames)."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop):
        self.conn, self.loop = conn, loop
        self.seal = getattr(conn, "seal", None)
        self.left = bytearray()
        try:
            self.sock = socket.socket(fileno=os.dup(conn.fileno()))  # (its own handle: MSG_DONTWAIT per send)
        except OSError:  # not a socket (a plain pipe): blocking writes, as the connection makes them
            self.sock = None

    def send(self, message: Any) -> None:
        self.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def send_bytes(self, body: bytes) -> None:
        """A message already pickled. ``OSError``: the parent is gone (found when nothing waits)."""
        if self.sock is None:
            self.conn.send_bytes(body)
            return
        if self.seal is not None:
            body = self.seal(body)
        frame = frame_header(len(body)) + body
        if self.left:
            self.left += frame
            self._drain()  # (what it takes now: a loop that seldom turns still moves its messages on)
            return
        try:
            sent = self.sock.send(frame, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent < len(frame):
            self.left += memoryview(frame)[sent:]
            self.loop.add_writer(self.sock.fileno(), self._drain)

    def _drain(self) -> None:
        try:
            sent = self.sock.send(self.left, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:  # the parent is gone (the loop hears it on the read side and stops)
            sent = len(self.left)
        del self.left[:sent]
        if not self.left:
            self.loop.remove_writer(self.sock.fileno())

    def flush(self, timeout: float = 10.0) -> None:
        """Write what still waits, blocking up to ``timeout`` (the loop has stopped)."""
        if self.sock is None:
            return
        if self.left:
            if not self.loop.is_closed():
                self.loop.remove_writer(self.sock.fileno())
            try:
                self.sock.settimeout(timeout)
                self.sock.sendall(self.left)
            except OSError:
                pass
            self.left.clear()
        self.sock.close()
