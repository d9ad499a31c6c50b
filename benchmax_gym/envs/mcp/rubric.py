"""Rewards for MCP-v0: the user's functions (which may ask for a live ``client`` to the episode's
server) and the bundled example's, which checks the server's state as well as the answer."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from benchmax_gym.core.outcomes import TOOL_TIMEOUT, RewardFailure
from benchmax_gym.core.rubric import RewardFn, Rubric, final_answer
from benchmax_gym.core.tools import ToolError, ToolFailure

log = logging.getLogger(__name__)


class ServerClient:
    """What reward functions get as ``client``: call the episode's tools before teardown.

    ``client.call_tool(name, arguments)`` returns the result text (sync); ``await
    client.acall_tool(...)`` inside async reward functions. A tool error raises ``ToolError``; a
    call that fails for a reason not the model's (past ``tool_timeout``, a server gone) raises
    :class:`RewardFailure` with its outcome: the episode ends ungraded, even if the function
    caught it (``failure`` keeps it), since a failure is never a reward. Its message (which
    ``info["outcome_detail"]`` carries) names the tool and the timeout or outcome only: the
    server's own text (a grading tool's may quote the answer, a crashed server's stderr anything)
    goes to the log.
    """

    def __init__(self, env: Any):
        self._env = env
        self.failure: RewardFailure | None = None

    async def acall_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        tool = self._env.toolset.tools.get(name)
        if tool is None:
            raise ToolError(f"no tool named {name!r}; the tools are {list(self._env.toolset.tools)}")
        try:
            return await tool.fn(**(arguments or {}))  # the call reaches the server's loop itself
        except ToolFailure as exc:
            if self.failure is None:
                log.warning("the reward's call of MCP tool %r failed (%s): %s", name, exc.outcome, exc)
                why = (f"timed out after {self._env.tool_timeout:g} s" if exc.outcome == TOOL_TIMEOUT
                       else f"failed ({exc.outcome})")
                self.failure = RewardFailure(f"the reward's call of tool {name!r} {why}", exc.outcome)
            raise self.failure from None

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        # No timeout of its own: the call times itself out (``tool_timeout``) and stops the server.
        return self._env.aio.run(self.acall_tool(name, arguments))

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
    """A rubric offering ``client``, each function that takes it checked by :func:`_checked`.

    A :class:`Rubric` keeps its tree (combinators, per-turn leaves, shaping).
    """
    rubric = funcs._with_context(("client",)) if isinstance(funcs, Rubric) else Rubric(funcs, context=("client",))
    return rubric.map_leaves(lambda f: f._copy(fn=_checked(f.fn)) if "client" in f.params else f)


def _checked(fn: Callable) -> Callable:
    """``fn``, async, raising its client's failure (a call past its timeout) whatever it returned.

    A sync function runs in a thread: it blocks while its ``client.call_tool`` waits for the
    server, and run inline in the event loop that holds the server's session (a vector worker's),
    it could never finish.
    """

    @functools.wraps(fn)  # keeps the signature: the rubric reads which arguments it wants
    async def run(**kwargs: Any) -> Any:
        client = kwargs.get("client")
        try:
            return await fn(**kwargs) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, **kwargs)
        finally:
            if isinstance(client, ServerClient) and client.failure is not None:
                raise client.failure

    return run


def example_rubric() -> Rubric:
    """``answer`` and ``note`` (the server really holds the note), half the reward each."""
    return _with_client([("answer", example_answer, 0.5), ("note", example_note, 0.5)])


def user_rubric(reward: Rubric | Callable | list | tuple) -> Rubric:
    if isinstance(reward, Rubric):
        return _with_client(reward)
    return _with_client(list(reward) if isinstance(reward, (list, tuple)) else [reward])
