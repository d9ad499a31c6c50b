"""Tools the engine's tests share: an inline one, a threaded one that sleeps, an async one."""

import asyncio
import time

from benchmax_gym.core import tool


@tool(inline=True)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


@tool
def nap(seconds: float) -> str:
    """Sleep (in a thread), then say so."""
    time.sleep(seconds)
    return "rested"


@tool
async def anap(seconds: float) -> str:
    """Sleep asynchronously."""
    await asyncio.sleep(seconds)
    return "rested"
