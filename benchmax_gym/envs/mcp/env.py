"""``benchmax/MCP-v0``: any MCP server's tools as a Gymnasium environment."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmax_gym.core.checks import boolean, positive_number, positive_up_to
from benchmax_gym.core.env import Episode, ToolEnv
from benchmax_gym.core.rubric import Rubric
from benchmax_gym.core.tasks import Task, TaskSource
from benchmax_gym.core.tempdirs import owned_tempdir
from benchmax_gym.core.tools import Toolset, truncate
from benchmax_gym.envs.mcp.rubric import ServerClient, example_progress, example_rubric, user_rubric
from benchmax_gym.envs.mcp.solver import MCPSolver
from benchmax_gym.envs.mcp.tasks import example_tasks, user_tasks
from benchmax_gym.envs.mcp.tools import (
    MAX_TOOL_LIST_CHARS, Connection, exposed_names, kill_servers, listed_tools, mcp_tool, parse_servers,
)

log = logging.getLogger(__name__)

EXAMPLE_SERVER = {"command": sys.executable, "args": ["-m", "benchmax_gym.envs.mcp.example_server"]}
SYSTEM_PROMPT = "You are an assistant with tools. Use them to complete the task, then reply without a tool call."
ISOLATION = ("shared", "restart")


class MCPEnv(ToolEnv):
    """The tools of one or more MCP servers, with your tasks and reward functions.

    Args:
        server: a stdio server ``{"command", "args", "env", "cwd"}`` (``"{workspace}"`` in args,
            env or cwd becomes the episode's directory; by default it is the server's cwd), a
            streamable-HTTP URL, an ``{"mcpServers": {...}}`` dict or the path of such a JSON
            file (tools are prefixed ``server__`` when two servers share a name; see
            :func:`~benchmax_gym.envs.mcp.tools.exposed_names`). Default: the
            bundled notes/calculator example server. Its credentials (a URL's password, token-like
            query values and path segments, credential-named headers and env variables, and the
            strings an entry lists as ``"secrets"``) are sent but shown as ``***``, also escaped,
            percent-encoded or in base64: in errors, logged URLs, results and the tool listing.
        tasks: a list of task dicts (``prompt``, ``answer``, ``solution``...), a JSON/JSONL
            file, or a TaskSource. Default: the bundled example tasks.
        reward: a reward function, a list of them, or a Rubric. Functions may ask for
            ``completion``, ``answer``, ``task``, ``messages``, ``episode`` and ``client`` (a live
            client to the episode's server, used before it is torn down). A component marked
            ``per_turn=True`` is your dense signal: scored after every step (``tool_calls``,
            ``tool_results``, ``state``), its value is that step's reward.
        isolation: ``"shared"`` (default): one server process for the environment's life, its
            working directory emptied between episodes; ``"restart"``: a fresh server process for
            every episode (for servers that keep state in memory).
        init_timeout: seconds a server may take to start and answer MCP's initialize.
        max_message_mb: a server's message (stdio) or reply (HTTP) over this size is dropped as it
            arrives and its call becomes a tool error (the server keeps running); smaller results
            are cut to ``max_tool_output_chars`` as usual.
        system_prompt: the instructions before the tools (a generic one by default).
        lenient_schemas: read a server's non-standard schema types (``dict``, ``float``,
            ``tuple``, ``any``) as standard ones, with a warning (see ``Tool.from_schema``); by
            default a tool whose schema is invalid fails the first reset (when the servers list
            their tools), naming it.
        **engine_kwargs: the engine's options (``max_turns``, ``tool_timeout``, ...).

    Servers start at the first reset (their tools are only known then). A call to a server that
    crashed (restarted) or overran ``tool_timeout`` (killed; a fresh one starts at the next reset)
    ends the episode ungraded (``tool_unavailable``, ``tool_timeout``).

    The prompt lists the tools within bounds, so the task is always in the first observation
    whole: a description or schema too long is cut with a marker (see ``tools.shown_schema``),
    the list stops at ``tools.MAX_TOOL_LIST_CHARS`` or half of ``max_observation_chars`` (the
    prompt says how many tools were left out; they cannot be called), and a system prompt that
    would still crowd the task out is cut instead of the task.

    A server whose tool list changes (MCP's ``listChanged``: it sends
    ``notifications/tools/list_changed``) keeps the episode's tools as its prompt showed them; a
    call of one it no longer lists is a tool error saying so, and the next reset lists the tools
    anew (``info["tools"]`` and the prompt show the new list), as it does for a server that
    started again (a new process may list other tools).
    """

    def __init__(
        self,
        server: Any = None,
        tasks: str | os.PathLike | Sequence[Any] | TaskSource | None = None,
        reward: Rubric | Callable | list | None = None,
        *,
        isolation: str = "shared",
        init_timeout: float = 30.0,
        max_message_mb: float = 16.0,
        system_prompt: str | None = None,
        max_turns: int = 10,
        lenient_schemas: bool = False,
        **engine_kwargs: Any,
    ):
        self.lenient_schemas = boolean("lenient_schemas", lenient_schemas)  # (bool("false") was True)
        example = server is None
        if example and (tasks is not None or reward is not None):
            raise ValueError("tasks and reward need a server=; without one the bundled example runs")
        if not example and (tasks is None or reward is None):
            raise ValueError("with server=, give tasks= and reward= too")
        if isolation not in ISOLATION:
            raise ValueError(f"isolation must be one of {ISOLATION}, got {isolation!r}")
        init_timeout = positive_number("init_timeout", init_timeout)
        max_message_bytes = int(positive_up_to(1e9, " MB")("max_message_mb", max_message_mb) * 1e6)  # (int(inf) raised)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string or None, got {system_prompt!r:.80}")
        specs = parse_servers(EXAMPLE_SERVER if example else server)
        self._example = example
        self._unlisted = 0  # tools left out of the prompt's list (over its bound)
        # (a number was "'int' object is not iterable", naming no argument)
        if not example and not isinstance(tasks, (TaskSource, str, os.PathLike, Iterable)):
            raise ValueError(f"tasks must be a list of task dicts, a JSON/JSONL file or a TaskSource, "
                             f"got {tasks!r:.80}")
        source = example_tasks() if example else user_tasks(tasks)
        try:
            rubric = example_rubric() if example else user_rubric(reward)
        except (TypeError, ValueError) as exc:  # ("not a reward function: 5" named no argument)
            raise (ValueError if isinstance(exc, ValueError) else TypeError)(f"reward: {exc}") from None
        super().__init__(
            tasks=source,
            toolset=Toolset(),  # filled in when the servers are up
            rubric=rubric,
            system_prompt=SYSTEM_PROMPT if system_prompt is None else system_prompt,
            max_turns=max_turns,
            **engine_kwargs,
        )
        self.isolation = isolation
        self.connections = {spec.name: Connection(spec, init_timeout, self.aio, max_message_bytes) for spec in specs}
        # An environment dropped without close() takes its servers with it when collected.
        weakref.finalize(self, kill_servers, tuple(self.connections.values()))
        self._root = owned_tempdir("mcp")  # (a process killed with it: the next one to make one removes it)
        weakref.finalize(self, _remove_in, os.getpid(), self._root)  # close() does it; so does dropping the env
        self.workspace = self._root / "workspace"
        self._started = False
        self._listed_at: dict[str, tuple[int, int]] = {}  # each server's (changes, starts) when its tools were listed

    # -- servers ---------------------------------------------------------------------------------

    async def _start_servers(self) -> None:
        for connection in self.connections.values():
            await connection.start(self.workspace)
        await self._list_tools()
        self._started = True

    async def _list_tools(self) -> None:
        """Ask every server for its tools and make them the env's, the prompt's list bounded."""
        self._listed_at = {name: (c.changes, c.starts) for name, c in self.connections.items()}
        listed = {name: await c.list_tools() for name, c in self.connections.items()}
        # (a name is shown, and is what the model calls: without the server's credentials, as all it lists)
        named = {name: [self.connections[name].spec.redact_result(t.name) for t in tools]
                 for name, tools in listed.items()}
        exposed = exposed_names(named)
        tools = [mcp_tool(self, self.connections[name].spec, t, exposed[name, shown])
                 for name, remote in listed.items() for t, shown in zip(remote, named[name])]
        limit = min(MAX_TOOL_LIST_CHARS, self.max_observation_chars // 2)
        shown, self._unlisted = listed_tools(tools, limit)
        if self._unlisted:
            log.warning("MCP-v0: the servers list %d tools; the %d that fit in %d characters of prompt are used, "
                        "%d are left out", len(tools), len(shown), limit, self._unlisted)
        toolset = Toolset()
        for tool in shown:
            toolset.add(tool)
        self.set_toolset(toolset)

    def build_system_prompt(self, family_prompt: str, tools_in_prompt: bool) -> str:
        prompt = super().build_system_prompt(family_prompt, tools_in_prompt)
        if self._unlisted and tools_in_prompt:
            prompt += (f"\n\n[{self._unlisted} more tools of the MCP servers are not listed: the list is over its "
                       "limit of characters]")
        return prompt

    def task_messages(self, task: Task) -> list[dict[str, Any]]:
        """The opening messages, the system prompt cut (with a marker) where it and the task
        would not fit in ``max_observation_chars`` together: the task is never the part cut."""
        messages = super().task_messages(task)
        if messages and messages[0]["role"] == "system":
            rest = sum(len(str(m.get("content") or "")) + 2 for m in messages[1:])
            room = self.max_observation_chars - rest
            if len(messages[0]["content"]) > room > 0:
                messages[0]["content"] = truncate(messages[0]["content"], room)
        return messages

    def _fresh_workspace(self) -> None:
        """Empty the directory in place: a running server's cwd must stay the same directory."""
        self.workspace.mkdir(parents=True, exist_ok=True)
        for entry in self.workspace.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    async def aopen_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        self._fresh_workspace()
        if not self._started:
            await self._start_servers()
        else:
            for connection in self.connections.values():
                if self.isolation == "restart" or not connection.alive:
                    await connection.start(self.workspace)
            if any((c.changes, c.starts) != self._listed_at.get(name) for name, c in self.connections.items()):
                await self._list_tools()  # a server said its tools changed, or is a new process (restarted)
        episode.state["workspace"] = self.workspace

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        self.aio.run(self.aopen_episode(episode, options))

    def reward_context(self, episode: Episode) -> dict[str, Any]:
        return {"client": ServerClient(self)}

    def dense_signal(self):
        """``dense_rewards=True`` for the bundled example (:func:`~benchmax_gym.envs.mcp.rubric.example_progress`).
        With your own server, put a per-turn component in ``reward`` instead."""
        return example_progress if self._example else None

    def reference_solver(self) -> MCPSolver:
        return MCPSolver(self)

    def close(self):
        self._end_episode()
        if self._closing_inside_own_loop():
            # From a task on the loop the sessions live on (a vector worker replacing a broken env):
            # nothing here can wait for them. The servers die now; their sessions end as tasks.
            kill_servers(tuple(self.connections.values()))
            loop = asyncio.get_running_loop()
            for connection in self.connections.values():
                task = loop.create_task(connection._close(kill=True))  # (on this loop: close() would hop)
                _CLOSING.add(task)
                task.add_done_callback(_CLOSING.discard)
        else:
            for connection in self.connections.values():
                try:
                    self.aio.run(connection.close(), 30)
                except Exception:
                    pass
        super().close()  # closes the loop the sessions lived on
        shutil.rmtree(self._root, ignore_errors=True)

    def _closing_inside_own_loop(self) -> bool:
        """Whether close() runs in a task on the env's own loop (a blocking wait there would never end)."""
        try:
            return asyncio.get_running_loop() is self.aio.loop
        except RuntimeError:  # no loop runs here (or the one adopted was closed)
            return False


_CLOSING: set[asyncio.Task] = set()  # sessions ending after close() from inside their loop (kept from the GC)


def _remove_in(pid: int, root: Path) -> None:
    """Delete the env's directory, in the process that made it only (not in a forked child)."""
    if os.getpid() == pid:
        shutil.rmtree(root, ignore_errors=True)
