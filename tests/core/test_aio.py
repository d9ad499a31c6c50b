"""An environment's own event loop: driven by whichever thread waits, never left undriven."""

import asyncio
import multiprocessing
import os
import signal
import threading
import time

import pytest

from benchmax_gym.core.aio import OwnLoop


async def where_and_what(value, delay=0.0):
    await asyncio.sleep(delay)
    return threading.get_ident(), value


async def sleep_until_cancelled(cancelled: threading.Event, seconds: float = 3600):
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        cancelled.set()
        raise


def test_sync_callers_drive_the_loop_in_their_own_thread():
    own = OwnLoop()
    thread, value = own.run(where_and_what(7))
    assert thread == threading.get_ident() and value == 7  # no hop to another thread
    own.close()


def test_state_on_the_loop_survives_between_calls():
    own = OwnLoop()

    async def open_queue():
        q = asyncio.Queue()
        await q.put("kept")
        return q

    q = own.run(open_queue())
    assert own.run(q.get()) == "kept"  # a loop-bound object opened in one call, used in the next
    own.close()


def test_timeout_cancels_the_coroutine():
    own = OwnLoop()
    cancelled = threading.Event()

    with pytest.raises(TimeoutError):
        own.run(sleep_until_cancelled(cancelled), timeout=0.05)
    assert cancelled.is_set()
    own.close()


def test_sync_call_from_inside_a_running_loop_drives_elsewhere():
    own = OwnLoop()

    async def notebook_cell():  # a sync API used inside an async program (Jupyter, a trainer)
        return own.run(where_and_what("ok"))

    thread, value = asyncio.run(notebook_cell())
    assert value == "ok" and thread != threading.get_ident()
    own.close()


def test_blocking_call_from_inside_the_own_loop_is_a_clear_error():
    own = OwnLoop()

    async def reenter():
        return own.run(where_and_what(1))

    with pytest.raises(RuntimeError, match="await it instead"):
        own.run(reenter())
    own.close()


def test_async_callers_reach_the_loop_from_any_loop_and_keep_its_state():
    own = OwnLoop()
    q = own.run(_make_queue())
    asyncio.run(own.arun(q.put("from one asyncio.run")))
    assert asyncio.run(own.arun(q.get())) == "from one asyncio.run"  # a second, separate loop
    assert own.run(_size(q)) == 0
    own.close()


async def _make_queue():
    return asyncio.Queue()


async def _size(q):
    return q.qsize()


def test_cancelling_an_async_caller_cancels_the_coroutine_on_the_own_loop():
    own = OwnLoop()
    cancelled = threading.Event()

    async def caller():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(own.arun(sleep_until_cancelled(cancelled)), 0.1)

    asyncio.run(caller())
    assert cancelled.wait(5)
    own.close()


def test_a_call_handed_to_a_driver_that_stops_first_still_finishes():
    # Thread A drives the loop for a short call; thread B arrives meanwhile with a longer one.
    # A stops when its call is done; B must then drive the loop itself, not wait forever.
    own = OwnLoop()
    results = {}

    def call(name, delay):
        results[name] = own.run(where_and_what(name, delay))

    a = threading.Thread(target=call, args=("a", 0.2))
    a.start()
    time.sleep(0.05)
    b = threading.Thread(target=call, args=("b", 0.5))
    b.start()
    a.join(5)
    b.join(5)
    assert results["a"][1] == "a" and results["b"][1] == "b"


def test_many_threads_at_once():
    own = OwnLoop()
    out = []

    def worker(i):
        out.append(own.run(where_and_what(i, 0.01 * (i % 5)))[1])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(out) == list(range(16))
    own.close()


def _child(own, q):
    async def main():
        return await own.arun(where_and_what("child"))

    q.put(asyncio.run(main())[1])


def test_a_forked_child_gets_a_working_loop_and_helpers():
    own = OwnLoop()
    asyncio.run(own.arun(where_and_what("parent")))  # the parent now has a loop and helper threads
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(own, q))
    p.start()
    assert q.get(timeout=20) == "child"
    p.join(10)
    own.close()


def test_close_cancels_what_is_left_and_a_later_call_opens_a_fresh_loop():
    own = OwnLoop()
    cancelled = threading.Event()

    async def start_background():
        asyncio.get_running_loop().create_task(sleep_until_cancelled(cancelled))
        await asyncio.sleep(0)

    own.run(start_background())
    first = own.loop
    own.close()
    assert cancelled.is_set() and first.is_closed()
    assert own.run(where_and_what(3))[1] == 3 and own.loop is not first
    own.close()


def test_an_adopted_loop_is_used_where_it_runs_and_never_closed_by_us():
    # A vector worker's loop runs for the environment's whole life: calls from it need no hop,
    # and calls from other threads are handed to it.
    host = asyncio.new_event_loop()
    runner = threading.Thread(target=host.run_forever)
    runner.start()
    own = OwnLoop()
    own.adopt(host)

    async def from_inside():
        return await own.arun(where_and_what("in"))

    inside = asyncio.run_coroutine_threadsafe(from_inside(), host).result(5)
    assert inside == (runner.ident, "in")
    assert own.run(where_and_what("sync")) == (runner.ident, "sync")
    assert asyncio.run(own.arun(where_and_what("other loop"))) == (runner.ident, "other loop")
    own.close()
    assert not host.is_closed() and host.is_running()
    host.call_soon_threadsafe(host.stop)
    runner.join(5)
    host.close()


def test_adopt_replaces_a_finished_loop_but_never_live_work():
    """An env that ran async work at construction (a benchmax BaseEnv listing its tools) can
    still be adopted by a vector worker; one with a live task on its loop cannot."""
    own = OwnLoop()
    own.run(where_and_what(1))  # ran to completion: nothing lives on it
    other = asyncio.new_event_loop()
    own.adopt(other)
    assert own.loop is other
    own.close()

    async def start_background():
        asyncio.get_running_loop().create_task(asyncio.sleep(60))  # a session's reader, say

    busy = OwnLoop()
    busy.run(start_background())
    with pytest.raises(RuntimeError, match="before the environment's first async work"):
        busy.adopt(other)
    other.close()
    busy.close()


@pytest.fixture
def ctrl_c_raises():
    """Python's own Ctrl-C handler, whatever this process inherited (a shell's background job
    starts with SIGINT ignored, and Python then installs none)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_cancels_the_abandoned_call_and_the_loop_goes_on(ctrl_c_raises):
    own = OwnLoop()
    cancelled, started = threading.Event(), threading.Event()

    def interrupt_once_asleep():  # (a fixed delay could fire before the call runs, on a loaded machine)
        if started.wait(60):
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)

    async def call():
        started.set()
        await sleep_until_cancelled(cancelled)

    threading.Thread(target=interrupt_once_asleep, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        own.run(call())
    assert cancelled.is_set()  # not left to run on at the next call
    assert own.run(where_and_what(5))[1] == 5
    own.close()


def test_ctrl_c_delivered_to_another_thread_still_interrupts_at_once(ctrl_c_raises):
    """The kernel may hand a process's SIGINT to any thread; the main thread asleep in the loop
    must still wake (not at the loop's next timer, here an hour away) and raise."""
    own = OwnLoop()
    cancelled, stop, woken_by_guard = threading.Event(), threading.Event(), threading.Event()
    bystander = threading.Thread(target=stop.wait)
    bystander.start()
    started = threading.Event()

    def interrupt_once_asleep():  # (a fixed delay could fire before the loop runs, on a loaded machine)
        if started.wait(60):
            time.sleep(0.2)  # (the loop is then asleep in its selector)
            signal.pthread_kill(bystander.ident, signal.SIGINT)

    threading.Thread(target=interrupt_once_asleep, daemon=True).start()

    async def sleeping():
        started.set()
        await sleep_until_cancelled(cancelled)

    def hang_guard():  # a main thread that never woke: interrupt it directly, and say so
        woken_by_guard.set()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    guard = threading.Timer(60, hang_guard)
    guard.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            own.run(sleeping())  # (an hour)
    finally:
        guard.cancel()
        stop.set()
        bystander.join()
    assert not woken_by_guard.is_set(), "the SIGINT another thread took did not wake the loop"
    assert cancelled.is_set()
    assert signal.set_wakeup_fd(-1) == -1  # the wake-up fd was put back as it was
    own.close()
