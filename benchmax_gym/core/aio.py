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
import gc
import logging
import os
import pickle
import queue
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

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


# The garbage collector runs finalizers (a dropped env's async teardown, a dropped env's loop
# closing) in whichever thread allocates at that moment, whatever that thread holds: inside an
# executor's submit (its locks), an env's loop being made, a sandbox lock. Driving an env's loop
# waits for its current driver, runs code that may take any lock, and hopping to a helper thread
# takes the executor's locks: a finalizer that did either could wait for its own thread for ever.
# So during a collection run() and close() wait for nothing: they put the work on ``_later``
# (SimpleQueue.put never blocks and is safe in a finalizer) and return; the porter thread,
# started outside any collection, does the work in order. The collecting thread never waits for
# the porter, so the porter only ever waits for threads that are free to go on.
_collecting: list[int | None] = [None]  # the thread the collector runs in now (one at a time)
_later: queue.SimpleQueue = queue.SimpleQueue()
_porter_lock = threading.Lock()
_porter_pid = 0  # the process whose porter runs (a forked child starts its own)


def _note_collection(phase: str, info: dict[str, Any]) -> None:
    _collecting[0] = threading.get_ident() if phase == "start" else None


def _in_collection() -> bool:
    return _collecting[0] == threading.get_ident()


def _start_porter() -> None:
    """Start this process's porter, unless it runs, or this is a finalizer: a thread's start
    takes ``threading``'s own locks, which the collecting thread may hold (the next call starts
    it then, and it finds what was queued meanwhile)."""
    global _porter_pid
    pid = os.getpid()
    if _porter_pid == pid or _in_collection() or not _porter_lock.acquire(blocking=False):
        return
    try:
        if _porter_pid != pid:
            try:
                threading.Thread(target=_port, name="benchmax-gym-finalizers", daemon=True).start()
            except RuntimeError:  # (the interpreter is exiting: finalizers do their work in place)
                return
            _porter_pid = pid
            if _note_collection not in gc.callbacks:  # (a forked child has its parent's)
                gc.callbacks.append(_note_collection)
    finally:
        _porter_lock.release()


def _port() -> None:
    """The porter: what finalizers queued (``_later``), one at a time, in the order they came."""
    while True:
        fn, args = _later.get()
        try:
            fn(*args)
        except Exception:
            log.warning("a dropped environment's cleanup failed", exc_info=True)
        del fn, args  # (not kept alive until the next one comes)


def _fresh_after_fork() -> None:
    # A forked child has none of the parent's threads: a pool that believes it has idle workers
    # would never run anything, and a lock held by a parent thread would never be released.
    # What the parent's finalizers queued is the parent's to run.
    global _helpers, _create_lock, _later, _porter_lock
    _helpers = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="benchmax-gym-loop")
    _create_lock = threading.Lock()
    _later, _porter_lock, _collecting[0] = queue.SimpleQueue(), threading.Lock(), None


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
        _start_porter()

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
            _start_porter()
            # made before the lock is taken: a finalizer that runs while they are made (they
            # allocate) may make another env's loop; under the lock nothing allocates
            fresh, cond, pid = asyncio.new_event_loop(), threading.Condition(), os.getpid()
            with _create_lock:
                if self._loop is loop:
                    self._cond, self._driving, self._adopted = cond, False, False
                    self._loop, self._pid, fresh = fresh, pid, None
            if fresh is not None:  # another thread made it first
                fresh.close()
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

        ``timeout`` cancels the coroutine and raises :class:`TimeoutError` when exceeded. From a
        finalizer the collector runs, it is queued for the porter and returns None at once.
        """
        if timeout is not None:
            coro = asyncio.wait_for(coro, timeout)
        if _in_collection():
            _later.put((self._drive, (coro,)))
            return None
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
        """Cancel what is left on the loop and close it (a later call opens a fresh one). From a
        finalizer the collector runs, the porter does it."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._pid != os.getpid():
            return
        if self._adopted:  # its owner closes it
            self._loop, self._adopted = None, False
            return
        running = asyncio._get_running_loop()
        if running is loop:
            return  # closed from inside itself: nothing can run it to a clean end; the GC will
        if _in_collection():
            _later.put((self._close, (loop,)))
        elif running is not None:
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


LAST_WORD_LOST = 75
"""A worker's exit status when its last message to the parent (the error that stopped it, its
run's end) could not be delivered: the parent was not reading, or was gone. Its gist went to the
worker's stderr instead; the parent says so rather than that the worker ended without a word."""


class Undelivered(OSError):
    """An ``Outbox`` could not write all it held (see :meth:`Outbox.flush`)."""


def say_last_word_lost(who: str, gist: str, why: BaseException | str) -> None:
    """One line on stderr: the last message ``who`` could not deliver, its gist, and why."""
    first = gist.strip().splitlines()[0] if gist.strip() else "(empty)"
    if len(first) > 500:
        first = first[:500] + "..."
    try:
        os.write(2, f"{who} (pid {os.getpid()}): its last message to the parent could not be delivered "
                    f"({why}): {first}\n".encode("utf-8", "replace"))
    except OSError:  # (no stderr either)
        pass


class Outbox:
    """A worker's messages to its parent, written without ever blocking the worker's loop: what
    the connection cannot take now waits here and goes out as it drains, while the loop still
    reads commands. A vector worker blocked writing results its parent has not read yet, while
    the parent blocks writing it a command, would wait for ever (a ready-first caller sending big
    actions while big results wait); an eval worker blocked on its records stalls every episode
    it holds. Frames are the connection's own (``multiprocessing``'s length prefix; a Ray host's
    sealed frames). ``loop`` may be None where only :meth:`flush` writes (a worker whose loop
    never ran)."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop | None):
        self.conn, self.loop = conn, loop
        self.seal = getattr(conn, "seal", None)
        self.left = bytearray()
        try:
            self.sock = socket.socket(fileno=os.dup(conn.fileno()))  # (its own handle: MSG_DONTWAIT per send)
        except OSError:  # not a socket (a plain pipe): blocking writes, as the connection makes them
            self.sock = None

    def send(self, message: Any) -> None:
        self.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def _frame(self, body: bytes) -> bytes:
        if self.seal is not None:
            body = self.seal(body)
        return frame_header(len(body)) + body

    def send_bytes(self, body: bytes) -> None:
        """A message already pickled. ``OSError``: the parent is gone (found when nothing waits)."""
        if self.sock is None:
            self.conn.send_bytes(body)
            return
        frame = self._frame(body)
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

    def flush(self, timeout: float = 10.0, last_word: bytes | None = None) -> None:
        """Write what still waits, then ``last_word`` (a message already pickled) if given,
        blocking up to ``timeout`` seconds in all (the loop has stopped), and let go of this
        handle. ``Undelivered``: not all of it went (the parent did not read in time, or is
        gone); the connection's write side is then shut down, so the parent reads the end of the
        stream, never a frame torn here that a later write on the connection would go on with
        (its bytes read as the rest of this one: garbage, or a wait for bytes never coming)."""
        if self.sock is None:
            if last_word is not None:
                try:
                    self.conn.send_bytes(last_word)
                except OSError as exc:
                    raise Undelivered(f"the last message could not be written: {type(exc).__name__}: {exc}") from exc
            return
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_writer(self.sock.fileno())
        if last_word is not None:
            self.left += self._frame(last_word)
        total, sent, failure = len(self.left), 0, None
        if self.left:
            blocking = os.get_blocking(self.sock.fileno())
            deadline = time.monotonic() + timeout
            try:
                with memoryview(self.left) as view:
                    while sent < total:
                        self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                        sent += self.sock.send(view[sent:])
            except OSError as exc:  # (a timeout, or the parent gone)
                failure = exc
            finally:  # (the timeout made the socket non-blocking, and the connection with it: they
                # share one open file; the worker's last word, written to a parent not reading yet,
                # failed (EAGAIN) and the parent saw the worker end "without a word")
                os.set_blocking(self.sock.fileno(), blocking)
            self.left.clear()
        try:
            if failure is not None:
                with contextlib.suppress(OSError):  # (the parent gone: nothing to end)
                    self.sock.shutdown(socket.SHUT_WR)  # (the socket itself: the connection's too)
                raise Undelivered(f"{total - sent} of {total} bytes to the parent could not be "
                                  f"written within {timeout:g} s: {type(failure).__name__}: {failure}") from failure
        finally:
            self.sock.close()
