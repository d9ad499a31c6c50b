"""Finalizers the garbage collector runs in a thread that holds a lock their work takes too.

The collector runs finalizers (a dropped env's episode release, a dropped env's loop closing) in
whichever thread allocates at that moment; one that holds a lock the finalizer's work takes
waited for itself for ever. Each test drops an env (in a reference cycle: only the collector
frees it) while a thread is where such a lock is held, and collects there, with a hang guard.
"""

import asyncio
import gc
import threading

from benchmax_gym.core import ListTasks, Rubric, Task, ToolEnv, Toolset, tool
from benchmax_gym.core.aio import OwnLoop


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _env_with_an_async_teardown(torn_down: list) -> ToolEnv:
    async def teardown(state):
        torn_down.append(state)

    env = ToolEnv(tasks=ListTasks([Task("t0", "Say hi.", "hi")]), toolset=Toolset([add]),
                  rubric=Rubric([lambda completion, answer: 1.0]), setup=lambda task, episode: "state",
                  teardown=teardown)
    env.reset(seed=0)
    env.cycle = env  # freed by the collector only, as most envs are
    return env


def _in_a_thread(body) -> None:
    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the finalizer waited for a lock its own thread held"


def test_an_async_teardown_the_collector_runs_while_this_thread_makes_an_event_loop_runs():
    """A thread making an env's event loop (it allocates) collected a dropped env's episode:
    its async teardown needed a loop too, made under the same lock, and waited for ever."""
    torn_down = []
    env = _env_with_an_async_teardown(torn_down)
    real = asyncio.new_event_loop

    def making():
        nonlocal env
        env = None  # dropped without close()
        gc.collect()  # (the collector runs as the new loop allocates)
        return real()

    def body():
        asyncio.new_event_loop = making
        try:
            loop = OwnLoop()
            assert loop.run(asyncio.sleep(0, "ran")) == "ran"
            loop.close()
        finally:
            asyncio.new_event_loop = real

    _in_a_thread(body)
    assert torn_down == ["state"]
