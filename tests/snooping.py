"""Model code that looks for another episode's marker from inside the sandbox (issue 27 item 1),
shared by the sandbox test and the tests through ``openenv-serve`` and ``mcp-serve``.

The probe walks every frame above it (``f_locals`` and ``f_globals``) and every object the
collector knows, with what they refer to. Markers reach it reversed, so that no code string holds
them. It also looks for a marker of its own, kept in its caller's variables, and the tests require
that it finds that one both in a frame and through the collector: a probe that sees nothing proves
nothing."""

import asyncio
import json
import os
import re

PROBE = """
import gc, json, sys

def probe(needles):
    found = {{name: set() for name in needles}}
    def look(value, where):
        if isinstance(value, (str, bytes, bytearray)) and not any(value is n for n in needles.values()):
            text = value if isinstance(value, str) else bytes(value).decode('latin-1')
            for name, needle in needles.items():
                if needle in text:
                    found[name].add(where)
    def shown(value):
        try:
            return repr(value)[:1_000_000]
        except Exception:
            return ''
    frame = sys._getframe().f_back  # its own frame holds the needles
    while frame is not None:
        for scope, names in (('locals', frame.f_locals), ('globals', frame.f_globals)):
            for name, value in list(names.items()):
                look(shown(value), 'frame ' + frame.f_code.co_name + ' ' + scope + ' ' + name)
        frame = frame.f_back
    for obj in gc.get_objects():
        for value in [obj, *gc.get_referents(obj)]:
            look(value, 'gc ' + type(obj).__name__)
    return {{name: sorted(where) for name, where in found.items()}}

def holder():
    mine = ''.join(reversed({own!r}))
    kept = [mine]
    return probe({{'other': {other!r}[::-1], 'own': {own!r}[::-1]}})

print('SNOOP', json.dumps(holder()))
"""


def marker(episode: str) -> str:
    return f"EPISODE-{episode}-" + os.urandom(6).hex()


def leave(marker: str, then: str = "") -> str:
    """An episode's code that prints its marker and leaves it in its variables and a file."""
    return f"secret = {marker!r}\nprint(secret)\nopen('m.txt', 'w').write(secret)\n{then}"


def snoop(other: str, own: str) -> str:
    """Code that looks for ``other`` (another episode's marker) and for ``own`` (kept by itself)."""
    return PROBE.format(other=other[::-1], own=own[::-1])


def leaks(output: str) -> list[str]:
    """Where the probe saw the other episode's marker, from the code's output; fails unless it
    saw its own marker in a frame and in the collector's objects."""
    found = re.search(r"^SNOOP (\{.*\})$", output, re.M)
    assert found, output[-3000:]
    where = json.loads(found.group(1))
    assert any(w.startswith("frame holder locals") for w in where["own"]), where
    assert any(w.startswith("gc ") for w in where["own"]), where
    return where["other"]


async def two_episodes(a, b) -> dict[str, list[str]]:
    """Episode A leaves its marker; B looks for it right after, then again while A's next call
    runs. ``a`` and ``b`` run code in their episode (async, code -> output). Returns where B saw
    A's marker each time (the tests want nowhere)."""
    other, own = marker("A"), marker("B")
    left = await a(leave(other))
    after = await b(snoop(other, own))
    running = asyncio.create_task(a(leave(other, "import time; time.sleep(1.5)")))
    await asyncio.sleep(0.5)
    during = await b(snoop(other, own))
    ran = await running
    assert other in left and other in ran, (left, ran)
    return {"after": leaks(after), "during": leaks(during)}


def need_bubblewrap() -> None:
    """Math's python tool needs bubblewrap: skip without it, except on CI, which must run these."""
    import pytest

    from benchmax_gym.core.sandbox import bubblewrap_status

    ok, why = bubblewrap_status()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the full sandbox level: {why}")
        pytest.skip(f"bubblewrap is not usable here ({why}); `apt-get install bubblewrap` to run these")
