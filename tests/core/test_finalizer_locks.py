"""Finalizers the garbage collector runs in a thread that holds a lock their work takes too.

The collector runs finalizers (a dropped env's episode teardown, a dropped env's loop closing, a
dropped Excel env's claim on the recalculation worker) in whichever thread allocates at that
moment; one that holds a lock the finalizer's work takes, or that the work waits for, waited for
itself for ever. Each test drops an env (in a reference cycle: only the collector frees it, as
most envs are) while a thread is where such a lock is held, and collects there, under a hang guard.
"""

import asyncio
import concurrent.futures.thread
import gc
import multiprocessing
import os
import threading
import time
import weakref

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.core import ListTasks, Rubric, Task, ToolEnv, Toolset, tool
from benchmax_gym.core.aio import OwnLoop, Outbox
from benchmax_gym.envs.excel import recalc


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _env_with_an_async_teardown(torn_down: list, cycle: bool = True) -> ToolEnv:
    async def teardown(state):
        await asyncio.sleep(0)
        torn_down.append(state)

    env = ToolEnv(tasks=ListTasks([Task("t0", "Say hi.", "hi")]), toolset=Toolset([add]),
                  rubric=Rubric([lambda completion, answer: 1.0]), setup=lambda task, episode: "state",
                  teardown=teardown)
    env.reset(seed=0)
    if cycle:
        env.cycle = env  # freed by the collector only
    return env


def _in_a_thread(body) -> None:
    """``body()`` in a thread of its own; its error raised here; a hang fails after 60 s."""
    errors = []

    def run():
        try:
            body()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the finalizer waited for a lock its own thread held"
    if errors:
        raise errors[0]


def _eventually(condition) -> bool:
    """Whether ``condition()`` comes true within 60 s (a hang guard; work queued by a finalizer)."""
    deadline = time.monotonic() + 60
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


@pytest.mark.parametrize("freed", ["at once", "by the collector"])
def test_an_async_teardown_that_runs_while_this_thread_makes_an_event_loop_runs(freed, monkeypatch):
    """A thread making an env's event loop (it allocates) ran a dropped env's episode teardown:
    the async teardown needed a loop of its own, made under the same lock, and waited for ever."""
    torn_down = []
    env = _env_with_an_async_teardown(torn_down, cycle=freed == "by the collector")
    real = asyncio.new_event_loop

    def making():
        nonlocal env
        env = None  # dropped without close()
        gc.collect()  # (the collector runs as the new loop allocates)
        return real()

    monkeypatch.setattr(asyncio, "new_event_loop", making)

    def body():
        loop = OwnLoop()
        assert loop.run(asyncio.sleep(0, "ran")) == "ran"
        loop.close()

    _in_a_thread(body)
    assert _eventually(lambda: torn_down == ["state"])


def test_an_async_teardown_the_collector_runs_inside_an_executors_submit_on_a_running_loop_runs():
    """Any executor's submit (``run_in_executor``, say) holds the executors' shared lock while it
    allocates; a dropped env's async teardown collected there, in a thread running a loop, hopped
    to a helper thread through a submit of its own and waited for that lock for ever."""
    torn_down = []
    env = _env_with_an_async_teardown(torn_down)

    async def main():
        nonlocal env
        with concurrent.futures.thread._global_shutdown_lock:  # as ThreadPoolExecutor.submit holds it
            env = None
            gc.collect()

    _in_a_thread(lambda: asyncio.run(main()))
    assert _eventually(lambda: torn_down == ["state"])


def test_a_dropped_loop_the_collector_closes_inside_an_executors_submit_on_a_running_loop_closes():
    """An OpenEnv env dropped without close() closes its loop from a finalizer (as openenv.py
    registers it); collected inside a submit on another loop, that close waited for ever."""
    own = OwnLoop()
    stopped = []

    async def session():  # a connection's task, left running on the env's loop
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.append(True)

    async def start():
        asyncio.get_running_loop().create_task(session())
        await asyncio.sleep(0)

    own.run(start())
    holder = type("Env", (), {})()
    holder.cycle = holder
    weakref.finalize(holder, own.close)

    async def main():
        nonlocal holder
        with concurrent.futures.thread._global_shutdown_lock:
            holder = None
            gc.collect()

    _in_a_thread(lambda: asyncio.run(main()))
    assert _eventually(lambda: stopped == [True] and own._loop is None)


def test_an_async_teardown_the_collector_runs_while_another_thread_drives_its_loop_waits_for_nothing():
    """The finalizer waited for the thread driving the env's loop, which waited for a lock the
    collecting thread held: neither went on."""
    torn_down, lock, driving = [], threading.Lock(), threading.Event()
    env = _env_with_an_async_teardown(torn_down)
    aio = env.aio

    async def needs_the_lock():
        driving.set()
        with lock:  # (blocking the loop: its driver waits here)
            return "done"

    outcome = []
    driver = threading.Thread(target=lambda: outcome.append(aio.run(needs_the_lock())), daemon=True)

    def body():
        nonlocal env
        with lock:
            driver.start()
            assert driving.wait(60)
            env = None
            gc.collect()

    _in_a_thread(body)
    driver.join(60)
    assert outcome == ["done"]
    assert _eventually(lambda: torn_down == ["state"])


@pytest.mark.parametrize("others_hold_it", [True, False])
def test_a_dropped_excel_envs_claim_the_collector_releases_while_this_thread_starts_the_worker(
        others_hold_it, monkeypatch):
    """The recalculation worker starts under a lock (it allocates); a dropped Excel env's claim
    released there (the last one stops the worker) took the same lock and waited for ever."""
    recalc.stop_recalc_worker()
    keep = gym.make("benchmax/Excel-v0", python_tool=False) if others_hold_it else None
    env = gym.make("benchmax/Excel-v0", python_tool=False)
    env.unwrapped.cycle = env.unwrapped  # freed by the collector only
    holders = recalc._holders
    real = recalc._Worker

    def starting():
        nonlocal env
        env = None
        gc.collect()
        return real()

    monkeypatch.setattr(recalc, "_Worker", starting)
    started = []
    _in_a_thread(lambda: started.append(recalc._the_worker()))  # (on a hang, cleaning up would hang too)
    try:
        assert recalc._holders == holders - 1
        # the call that started it has its worker, whether or not anyone still claims one
        assert started[0] is recalc._worker and started[0].proc.poll() is None
    finally:
        if keep is not None:
            keep.close()
        recalc.stop_recalc_worker()


def test_a_workers_last_word_after_its_outbox_flushed_waits_for_a_parent_still_reading():
    """An eval worker flushes the records its parent has not read yet, then sends its last word
    through the same connection. The flush's timeout made the shared socket non-blocking: with the
    parent still reading, the last word failed (EAGAIN, dropped) and the parent saw the worker
    end "without a word" (test_eval's busy-parent test failed now and then)."""
    parent, child = multiprocessing.Pipe()

    async def play():  # a record bigger than the socket holds: the rest waits in the outbox
        outbox = Outbox(child, asyncio.get_running_loop())
        outbox.send_bytes(b"r" * 2_000_000)
        return outbox

    outbox = asyncio.run(play())
    assert outbox.left
    read = []
    reader = threading.Thread(target=lambda: read.append(len(parent.recv_bytes())), daemon=True)
    reader.start()
    outbox.flush(timeout=60)
    reader.join(60)
    assert read == [2_000_000]
    assert os.get_blocking(child.fileno()), "the flush left the worker's connection non-blocking"

    sent = []  # the last word, bigger than the socket holds, to a parent that reads it later

    def last_word():
        try:
            child.send_bytes(b"d" * 4_000_000)
            sent.append("sent")
        except OSError as exc:
            sent.append(exc)
            child.close()  # (the parent's read ends)

    sender = threading.Thread(target=last_word, daemon=True)
    sender.start()
    try:
        got = parent.recv_bytes() if parent.poll(60) else None
    except EOFError:
        got = None
    sender.join(60)
    assert sent == ["sent"] and got == b"d" * 4_000_000
    parent.close()
    child.close()
