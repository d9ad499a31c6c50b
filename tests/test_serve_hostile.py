"""`mcp-serve` against a client that sends a session's calls all at once (the official SDK client).
The server imports this module for its environment (``test_serve_hostile:hostile/Hold-v0``)."""

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

from mcp import Client

from benchmax_gym import register_tool_env

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from test_serve import serve  # noqa: E402, F401  (the fixture: an `mcp-serve --transport http` process)

_inside: list[str] = []
_count = threading.Lock()


def hold(label: str) -> str:
    """Hold the environment a moment; say how many calls were inside it at once.

    Args:
        label: which call this is
    """
    with _count:
        _inside.append(label)
        together = len(_inside)
    time.sleep(0.3)  # (a blocking tool: it runs on a thread)
    with _count:
        _inside.remove(label)
    return str(together)


register_tool_env("hostile/Hold-v0", tools=[hold], tasks=[{"prompt": "p", "answer": "a"}],
                  rubric=lambda completion, answer: 0.0)


def test_a_sessions_concurrent_calls_run_one_at_a_time(serve):
    """A step runs a turn's calls one after another; a session's concurrent calls must too: they
    would race on its state, and each would hold one of the process's tool threads while it
    waits (hundreds from one client starve every other session's tools)."""
    served = serve("test_serve_hostile:hostile/Hold-v0",
                   env={"PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])})

    async def main():
        async with Client(served.url, mode="legacy") as client:
            return await asyncio.gather(*(client.call_tool("hold", {"label": str(i)}) for i in range(4)))

    results = asyncio.run(main())
    assert [(r.is_error, r.content[0].text) for r in results] == [(False, "1")] * 4


# -- a plugin env whose reset raises what the server does not expect -----------------------------

import gymnasium as gym  # noqa: E402
import pytest  # noqa: E402

from cli_in_process import run_in_process  # noqa: E402


class Boom(Exception):
    """A plugin's own exception class."""


FAILURES = {"KeyError": (KeyError("task_index 7 is not in the table"), "KeyError: task_index 7 is not in the table"),
            "MemoryError": (MemoryError(), "MemoryError"),
            "RecursionError": (RecursionError("maximum recursion depth exceeded"),
                               "RecursionError: maximum recursion depth exceeded"),
            "Boom": (Boom(), "Boom")}
_resets = [0]


class ResetRaises(gym.Wrapper):
    """Math-v0 whose reset raises ``fail``: every other one (the server's first, its probe, plays),
    or every one with ``always``."""

    def __init__(self, env, fail="KeyError", always=False):
        super().__init__(env)
        self.fail, self.always = fail, always

    def reset(self, *, seed=None, options=None):
        _resets[0] += 1
        if self.always or _resets[0] % 2 == 0 or (options or {}).get("task_index") == 99:
            raise FAILURES[self.fail][0]
        return self.env.reset(seed=seed, options=options)


RAISES = "hostile/ResetRaises-v0"
if RAISES not in gym.registry:
    gym.register(RAISES, entry_point=lambda fail="KeyError", always=False, **kwargs: ResetRaises(
        gym.make("benchmax/Math-v0", python_tool=False, **kwargs), fail, always))


def test_a_session_whose_reset_raises_is_told_why_and_the_others_play_on(serve):
    """A plugin's reset raising a KeyError reached the client as `the environment failed to
    start: 'task_index 7 ...'` (a MemoryError or a bare `raise Boom()`: as nothing at all), and
    the server said nothing; now the client and one line of the server's log name it."""
    served = serve(f"test_serve_hostile:{RAISES}", env={"PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])})

    async def main():
        async with Client(served.url, mode="legacy") as first:
            failed = await first.call_tool("calculator", {"expression": "6*7"})
            async with Client(served.url, mode="legacy") as second:
                played = await second.call_tool("calculator", {"expression": "6*7"})
            return failed, played

    failed, played = asyncio.run(main())
    said = "\n".join(block.text for block in failed.content)
    assert failed.is_error and said == "the environment failed to start: KeyError: task_index 7 is not in the table"
    assert failed.meta == {"benchmax/outcome": "env_error"}
    assert not played.is_error and played.content[0].text == "42"
    deadline = time.monotonic() + 30  # (the server's stderr is read by a thread)
    while not any("task_index 7" in line for line in served.lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    logged = [line for line in served.lines if "task_index 7" in line]
    assert len(logged) == 1 and "a session's environment failed to start: KeyError: task_index 7" in logged[0]
    assert "Traceback" not in "".join(served.lines)


@pytest.mark.parametrize("command", ["mcp-serve", "openenv-serve"])
@pytest.mark.parametrize("fail", list(FAILURES))
def test_a_first_reset_that_raises_the_unexpected_is_one_line(command, fail):
    """Each server resets its env once before serving: a KeyError, a MemoryError, a RecursionError
    or the plugin's own exception class there ended the command in a traceback."""
    transport = ["--transport", "http"] if command == "mcp-serve" else []
    out = run_in_process(command, RAISES, *transport, "--port", "0", "--env-arg", f"fail={fail}",
                         "--env-arg", "always=true")  # (registered in this process, above)
    assert out.returncode == 1 and out.stderr == f"benchmax-gym: error: cannot start {RAISES}: {FAILURES[fail][1]}\n", \
        out.stderr
