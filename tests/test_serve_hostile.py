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
