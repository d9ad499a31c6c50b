"""Rewards for MCP-v0: the user's functions (which may ask for a live ``client`` to the episode's
server) and the bundled example's, which checks the server's state as well as the answer."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from benchmax_gym.core.rubric import RewardFn, Rubric, final_answer
from benchmax_gym.core.tools import ToolError


class ServerClient:
    """What reward functions get as ``client``: call the episode's tools before teardown.

    ``client.call_tool(name, arguments)`` returns the result text (sync); ``await
    client.acall_tool(...)`` inside async reward functions. A tool error raises ``ToolError``.
    """

    def __init__(self, env: Any):
        self._env = env

    async def acall_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        tool = self._env.toolset.tools.get(name)
        if tool is None:
            raise ToolError(f"no tool named {name!r}; the tools are {list(self._env.toolset.tools)}")
        return await tool.fn(episode=None, **(arguments or {}))  # the call reaches the server's loop itself

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        return self._env.aio.run(self.acall_tool(name, arguments), self._env.tool_timeout)

    @property
    def tools(self) -> list[str]:
        return list(self._env.toolset.tools)


def example_answer(completion: str, answer: dict) -> float:
    """The last ``<answer>`` is the value (the shared rule, :func:`final_answer`; no tag, 0)."""
    return float(final_answer(completion) == answer["value"])


def example_note(answer: dict, client: ServerClient) -> float:
    try:
        return float(client.call_tool("read_note", {"title": answer["note_title"]}) == answer["note_text"])
    except ToolError:
        return 0.0


def example_progress(answer: dict, tool_calls: list, tool_results: list) -> tuple[list[str], int]:
    """The example's dense signal (``dense_rewards=True``): the note saved with the right title
    and text (``add_note`` answered ``saved note ...``), and a ``calculate`` result equal to the
    answer. Each pays once. Your own server's dense signal is a per-turn component of your
    ``reward`` (``RewardFn(..., per_turn=True)``, or :func:`~benchmax_gym.core.rubric.milestones`)."""
    reached = []
    for call, text in zip(tool_calls, tool_results):
        args = call.get("arguments") or {}
        if (call["name"] == "add_note" and str(text).startswith("saved note")
                and args.get("title") == answer["note_title"] and args.get("text") == answer["note_text"]):
            reached.append("note")
        elif call["name"] == "calculate" and str(text).strip() == answer["value"]:
            reached.append("value")
    return reached, 2


def _with_client(funcs: list | Rubric) -> Rubric:
    """A rubric offering ``client``, each sync function that takes it run in a thread.

    A sync function blocks while its ``client.call_tool`` waits for the server; run inline in
    the event loop that holds the server's session (a vector worker's), it could never finish.
    A :class:`Rubric` keeps its tree (combinators, per-turn leaves, shaping).
    """
    rubric = funcs._with_context(("client",)) if isinstance(funcs, Rubric) else Rubric(funcs, context=("client",))
    return rubric.map_leaves(
        lambda f: f._copy(fn=_in_a_thread(f.fn)) if "client" in f.params and not f.is_async else f)


def _in_a_thread(fn: Callable) -> Callable:
    @functools.wraps(fn)  # keeps the signature: the rubric reads which arguments it wants
    async def run(**kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, **kwargs)

    return run


def example_rubric() -> Rubric:
    """``answer`` and ``note`` (the server really holds the note), half the reward each."""
    return _with_client([("answer", example_answer, 0.5), ("note", example_note, 0.5)])


def user_rubric(reward: Rubric | Callable | list | tuple) -> Rubric:
    if isinstance(reward, Rubric):
        return _with_client(reward)
    return _with_client(list(reward) if isinstance(reward, (list, tuple)) else [reward])
