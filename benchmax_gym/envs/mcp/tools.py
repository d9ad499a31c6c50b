"""MCP servers as toolsets, through the official ``mcp`` SDK.

A :class:`ServerSpec` says how to reach a server (a stdio command or a streamable-HTTP URL);
:func:`parse_servers` reads every accepted form, including the common ``mcpServers`` config file.
A :class:`Connection` keeps one live client session on its environment's own event loop (the
SDK's context managers must be entered and left in one task, so a holder task owns them), and
tools from ``list_tools`` become :class:`~benchmax_gym.core.tools.Tool` objects whose calls go
through ``call_tool``. A crashed server is restarted, one stuck past the timeout is killed (a new
one starts at the next reset), and either failure ends the episode (core.outcomes).

What a server lists reaches the model's prompt bounded: a description over
:data:`MAX_DESCRIPTION_CHARS` and an input schema over :data:`MAX_SCHEMA_CHARS` are cut with a
visible marker (:func:`shown_schema`; calls are still checked against the whole schema), and
the environment lists tools only up to a total (:func:`listed_tools`), so the task is never
pushed out of the first observation. A server's credentials (a URL's password or token, its
headers' values) never appear in an error message, nor those named as credentials (a URL's, the
``Authorization`` or ``X-Api-Key`` header's, an ``API_KEY`` env variable's, and those a server
entry lists as ``secrets``) in a successful result or in the tool listing the model is shown
(names, descriptions, schemas), written as they are or escaped, percent-encoded or in base64 (see
http_transport.py).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import logging
import os
import re
import shutil
import signal
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from benchmax_gym.core.aio import OwnLoop
from benchmax_gym.core.checks import url_fault
from benchmax_gym.core.outcomes import FAILURES, TOOL_TIMEOUT, TOOL_UNAVAILABLE
from benchmax_gym.core.tools import Tool, ToolError, ToolFailure, ToolSchemaError, truncate
from benchmax_gym.envs.mcp.http_transport import (
    MIN_FREE_TEXT_SECRET, credentials_of, http_transport, redact, secrets_of, shown_url,
)
from benchmax_gym.envs.mcp.stdio import StderrTail, kill_processes, start_time, stdio_transport, tree

log = logging.getLogger(__name__)

WORKSPACE = "{workspace}"  # placeholder in args/env/cwd, replaced by the episode's directory


@dataclass(frozen=True)
class ServerSpec:
    """How to reach one MCP server: ``command`` (+ ``args``, ``env``, ``cwd``) or ``url`` (+
    ``headers``, sent with every request: ``{"Authorization": "Bearer ..."}``); ``declared_secrets``
    (its entry's ``secrets``): credentials no heuristic finds (in ``args``, a path segment),
    hidden like the rest."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    declared_secrets: tuple[str, ...] = ()

    def __repr__(self) -> str:  # (the dataclass's would show the URL's and the headers' credentials)
        where = f"url={shown_url(self.url, self.declared_secrets)!r}" if self.url else f"command={self.command!r}"
        return f"ServerSpec(name={self.name!r}, {where})"

    @functools.cached_property
    def secrets(self) -> tuple[tuple[str, str], ...]:
        """The credentials in the URL, headers and environment, which :meth:`redact` blanks out of a
        message (a stdio server's stderr, quoted when it fails, may print its API key)."""
        return secrets_of(self.url, self.headers, self.env, self.declared_secrets)

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)

    @functools.cached_property
    def credentials(self) -> tuple[tuple[str, str], ...]:
        """The credentials :meth:`redact_result` blanks out of a successful result: the URL's, the
        environment's and the credential-named headers' (``Authorization``, ``Cookie``, ``X-Api-Key``)."""
        return credentials_of(self.url, self.headers, self.env, self.declared_secrets)

    def redact_result(self, text: str) -> str:
        """A successful result's text, without the credentials a server may echo (``Authorization: ***``):
        the model may write what it sees anywhere. Other header values stay (``X-Region: us-east-1``)."""
        return redact(text, self.credentials) if self.credentials else text

    @property
    def called(self) -> str:
        """The server as error messages name it: ``'name'``, and its URL, credentials hidden."""
        return f"{self.name!r} ({shown_url(self.url, self.declared_secrets)})" if self.url else repr(self.name)

    def target(self, workspace: Path, max_message_bytes: int, on_spawn: Callable[[int], None],
               stderr: StderrTail) -> Any:
        """What the SDK's ``Client`` connects to: our streamable-HTTP or stdio transport (see
        http_transport.py and stdio.py)."""
        if self.url:
            return http_transport(self.url, self.headers, max_message_bytes, self.declared_secrets)
        fill = lambda text: text.replace(WORKSPACE, str(workspace))  # noqa: E731
        params = StdioServerParameters(
            command=self.command,
            args=[fill(a) for a in self.args],
            env={k: fill(v) for k, v in self.env.items()} or None,
            cwd=fill(self.cwd) if self.cwd else str(workspace),
        )
        return stdio_transport(params, max_message_bytes, on_spawn, stderr)


_HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")


def _url(name: str, url: Any, declared: tuple[str, ...] = ()) -> str:
    """A streamable-HTTP URL, checked at make (:func:`~benchmax_gym.core.checks.url_fault`: a
    host, a port from 1 to 65535): anything else failed only when the server started (a port
    past 65535 as ``connect(): port must be 0-65535``). Shown with its credentials hidden."""
    fault = url_fault(url)
    if fault is not None:
        shown = repr(shown_url(url, declared)) if isinstance(url, str) else type(url).__name__
        raise ValueError(f"server {name!r}: 'url' must be an http:// or https:// URL with a host, got {shown}"
                         + ("" if fault.startswith("expected") else f": {fault}"))
    return url


def _command(name: str, command: str) -> str:
    """Fail at make, naming the server, for a command that cannot be run (not at the first reset)."""
    if shutil.which(command) is not None:
        return command
    path = Path(command)
    if path.is_dir():
        raise ValueError(f"server {name!r}: command {command!r} is a directory")
    if path.is_file() and os.sep in command:
        raise ValueError(f"server {name!r}: command {command!r} is not executable")
    raise ValueError(f"server {name!r}: command {command!r} was not found")


def _declared_secrets(name: str, secrets: Any) -> tuple[str, ...]:
    """A server entry's ``secrets``: the strings its messages, results and listing never show, for
    a credential nothing else finds (in ``args``, a path segment like ``AbCdEfGhIjKlMnOpQrSt``). At
    least :data:`MIN_FREE_TEXT_SECRET` characters: each is blanked wherever it appears."""
    if not isinstance(secrets, list):
        raise ValueError(f"server {name!r}: 'secrets' must be a list of strings, got {type(secrets).__name__}")
    bad = [n for n, s in enumerate(secrets) if not isinstance(s, str) or len(s) < MIN_FREE_TEXT_SECRET]
    if bad:  # (by position: the values are secrets)
        raise ValueError(f"server {name!r}: 'secrets' must be strings of at least {MIN_FREE_TEXT_SECRET} characters "
                         f"(a shorter one would be blanked out of ordinary text); entries {bad[:5]} are not "
                         "(their values are not shown)")
    return tuple(secrets)


def _spec(name: str, entry: Any) -> ServerSpec:
    if isinstance(entry, str):
        if not entry.startswith(("http://", "https://")):
            raise ValueError(f"server {name!r}: a string must be a streamable-HTTP URL, got {shown_url(entry)!r}")
        return ServerSpec(name=name, url=_url(name, entry))
    if not isinstance(entry, Mapping):
        raise ValueError(f"server {name!r} must be a dict with 'command' or 'url', got {type(entry).__name__}")
    unknown = set(entry) - {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "secrets"}
    if unknown:
        raise ValueError(f"server {name!r}: unknown keys {sorted(unknown)}")
    for key in ("type", "transport"):  # mcpServers files may name the transport: two are spoken here
        kind = entry.get(key)
        if kind is not None and kind not in ("stdio", *_HTTP_TYPES):
            raise ValueError(f"server {name!r}: {key} {kind!r} is not supported; use 'stdio' with a 'command' "
                             f"or streamable HTTP ('http') with a 'url'")
        if kind is not None and (kind == "stdio") == bool(entry.get("url")):
            raise ValueError(f"server {name!r}: {key} {kind!r} does not fit its "
                             f"{'url' if entry.get('url') else 'command'}")
    declared = _declared_secrets(name, entry.get("secrets", []))
    headers = entry.get("headers", {})
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in headers.items()):
        raise ValueError(f"server {name!r}: 'headers' must be a dict of strings to strings "
                         "(their values are not shown)")
    if entry.get("url"):
        return ServerSpec(name=name, url=_url(name, entry["url"], declared), headers=dict(headers),
                          declared_secrets=declared)
    if headers:
        raise ValueError(f"server {name!r}: 'headers' are for a streamable-HTTP server's 'url'; "
                         "a stdio server takes 'env'")
    command = entry.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError(f"server {name!r} needs a 'command' (stdio) or a 'url' (streamable HTTP)")
    args = entry.get("args", [])
    env = entry.get("env", {})
    cwd = entry.get("cwd")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"server {name!r}: 'args' must be a list of strings")
    if not isinstance(env, Mapping):
        raise ValueError(f"server {name!r}: 'env' must be a dict of strings to strings, got {type(env).__name__}")
    bad = [k for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))]
    if bad:  # named by key: the values are often secrets, which an error message ends up in logs with
        raise ValueError(f"server {name!r}: 'env' must be a dict of strings to strings; the entries "
                         f"{', '.join(repr(k) for k in bad[:5])} are not (their values are not shown)")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"server {name!r}: 'cwd' must be a string, got {type(cwd).__name__}")
    if cwd and WORKSPACE not in cwd and not Path(cwd).is_dir():  # ("{workspace}" only exists at reset)
        raise ValueError(f"server {name!r}: 'cwd' {cwd!r} is not an existing directory")
    return ServerSpec(name=name, command=_command(name, command), args=tuple(args), env=dict(env), cwd=cwd or None,
                      declared_secrets=declared)


def parse_servers(server: Any) -> list[ServerSpec]:
    """A stdio dict, a URL, an ``{"mcpServers": {...}}`` dict or the path of such a JSON file."""
    if isinstance(server, (str, os.PathLike)) and not str(server).startswith(("http://", "https://")):
        path = Path(server)
        if not path.is_file():
            raise ValueError(f"server: {shown_url(str(server))!r} is neither a URL nor an existing mcpServers "
                             "JSON file")
        try:
            server = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"server: {path} is not valid JSON: {exc}") from None
    if isinstance(server, Mapping) and "mcpServers" in server:
        servers = server["mcpServers"]
        if not isinstance(servers, Mapping) or not servers:
            raise ValueError("server: 'mcpServers' must map at least one name to a server")
        return [_spec(str(name), entry) for name, entry in servers.items()]
    return [_spec("server", server)]


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # MCP's advice for tool names: every tool-call format carries these


def _clean(name: str) -> str:
    """``name`` if it is a plain tool name, else with every other character as ``_``, cut to 128."""
    return name if _NAME.fullmatch(name) else (re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:128] or "tool")


def exposed_names(listed: Mapping[str, Sequence[str]]) -> dict[tuple[str, str], str]:
    """The name the model calls each ``(server, tool)`` by: the tool's own where the tool-call
    formats can carry it (a name with ``>``, ``<``, spaces or newlines cannot be written in every
    one) and no other server has it; ``server__tool`` where two servers share it; characters
    outside ``[A-Za-z0-9_.-]`` become ``_``; a name still taken gets ``_2``, ``_3``... A server
    listing one name twice fails the reset, naming it."""
    shared = Counter(n for names in listed.values() for n in {_clean(x) for x in names})
    wanted: dict[tuple[str, str], str] = {}
    for server, names in listed.items():
        for name in names:
            if (server, name) in wanted:
                raise RuntimeError(f"MCP server {server!r} lists two tools named {name!r}")
            wanted[server, name] = _clean(f"{server}__{name}" if shared[_clean(name)] > 1 else name)
    taken: set[str] = set()
    exposed: dict[tuple[str, str], str] = {}
    for key in sorted(wanted, key=lambda k: wanted[k] != k[1]):  # names kept as they are first
        base = name = wanted[key]
        n = 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        exposed[key] = name
    return {key: exposed[key] for key in wanted}  # (in the servers' order)


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as text: text blocks, then structured content when there is no text."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data)} base64 characters]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource: {res.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _kill_tree(pid: int, born: int | None) -> None:
    """Kill a stdio server's process group (its own session) and every process below it, while
    ``pid`` is still that server (``born``: its start time; a reaped pid may be another's now)."""
    if born is None or start_time(pid) != born:
        return
    found = tree(pid, born)
    with suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    kill_processes({pid: born, **found})


class Connection:
    """One live client session to one server, owned by a task on the environment's own loop.

    The server's process is remembered when it starts and killed, with its children, whenever
    the connection closes: a server still busy (say, writing a huge result) can outlive the
    SDK's own shutdown, and no server may outlive its environment. ``stderr`` keeps the tail of
    what the current (or last) server process wrote there, for error messages.

    A changing tool list (MCP's ``listChanged``): ``changes`` counts the server's word that its
    tools changed (``notifications/tools/list_changed``, or a ``subscriptions/listen`` event on
    a 2026-era connection). The environment lists the tools again at its next reset (an
    episode keeps the tools its prompt showed), and :meth:`still_lists` tells a call whether
    the server still lists its tool, so a tool removed mid-episode fails with a clear error.
    """

    def __init__(self, spec: ServerSpec, init_timeout: float, aio: OwnLoop, max_message_bytes: int):
        self.spec = spec
        self.init_timeout = init_timeout
        self.aio = aio
        self.max_message_bytes = max_message_bytes
        self.client: Client | None = None
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self.starts = 0
        self.pids: dict[int, int | None] = {}  # the stdio server's pid -> its start time
        self.stderr = StderrTail(redact=spec.redact)
        self.changes = 0  # the server's announcements that its tool list changed
        self._listed: tuple[int, set[str]] | None = None  # (changes, the names it listed then)
        _LIVE.add(self)

    def _spawned(self, pid: int) -> None:
        self.pids[pid] = start_time(pid)

    async def _notified(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.changes += 1

    async def _listen(self, client: Client, listening: asyncio.Event) -> None:
        """Count a 2026-era server's tool-list events (sent only to a ``subscriptions/listen``)."""
        try:
            async with client.listen(tools_list_changed=True) as events:
                listening.set()
                async for _ in events:
                    self.changes += 1
        except Exception as exc:  # refused, or the connection ended: calls find out for themselves
            log.debug("MCP server %s: no tool-list events (%s)", self.spec.name, self.spec.redact(_describe(exc)))
        finally:
            listening.set()

    async def _hold(self, workspace: Path, ready: asyncio.Future) -> None:
        listener = None
        try:
            target = self.spec.target(workspace, self.max_message_bytes, self._spawned, self.stderr)
            async with Client(target, message_handler=self._notified) as client:
                tools = client.server_capabilities.tools
                if tools is not None and tools.list_changed and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    listening = asyncio.Event()
                    listener = asyncio.get_running_loop().create_task(self._listen(client, listening))
                    await listening.wait()  # subscribed before a call can change the list (or refused;
                    # a server that never answers fails the start at init_timeout)
                self.client = client
                if not ready.done():
                    ready.set_result(None)
                await self._stop.wait()
                if listener is not None:
                    listener.cancel()
                    await asyncio.gather(listener, return_exceptions=True)
        except BaseException as exc:  # failed to start, or the server went away
            if not ready.done():
                ready.set_exception(exc)
        finally:
            if listener is not None:
                listener.cancel()
            self.client = None

    async def start(self, workspace: Path) -> None:
        """Start the server (in ``workspace``) and finish MCP's initialize, or raise clearly."""
        await self.aio.arun(self._start(workspace))

    async def _start(self, workspace: Path) -> None:
        await self._close()
        self.starts += 1
        self.stderr = StderrTail(redact=self.spec.redact)
        self._stop = asyncio.Event()
        ready = asyncio.get_running_loop().create_future()
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read even if nobody waits
        self._task = asyncio.get_running_loop().create_task(self._hold(workspace, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.init_timeout)
        except asyncio.TimeoutError:
            self._task.cancel()  # never initialized: nothing to close gracefully
            await self._close()
            raise RuntimeError(self.spec.redact(
                f"MCP server {self.spec.called} did not finish initialize within {self.init_timeout:g} s"
                f"{self.stderr.describe()}"
            )) from None
        except Exception as exc:
            await self._close()  # the server has exited: its stderr is complete
            raise RuntimeError(self.spec.redact(
                f"MCP server {self.spec.called} failed to start: {_describe(exc)}{self.stderr.describe()}"
            )) from None

    @property
    def alive(self) -> bool:
        return self.client is not None and self._task is not None and not self._task.done()

    async def list_tools(self) -> list[Any]:
        """The server's tools, every page, within ``init_timeout`` and ``MAX_TOOL_PAGES`` pages: a
        server that never answers, or pages for ever, fails the reset naming it."""

        async def go():
            tools, cursor = [], None
            for _ in range(MAX_TOOL_PAGES):
                page = await self.client.list_tools(cursor=cursor) if cursor else await self.client.list_tools()
                tools += page.tools
                cursor = getattr(page, "next_cursor", None)
                if not cursor:
                    return tools
            raise RuntimeError(f"MCP server {self.spec.called} listed its tools in over {MAX_TOOL_PAGES} pages")

        changes = self.changes
        try:
            tools = await self.aio.arun(asyncio.wait_for(go(), self.init_timeout))
        except (asyncio.TimeoutError, TimeoutError):
            raise RuntimeError(f"MCP server {self.spec.called} did not list its tools within {self.init_timeout:g} s "
                               "(init_timeout)") from None
        except (MCPError, ValidationError) as exc:  # an error answer, or a list that is not MCP's
            said = ""
            if isinstance(exc, MCPError) and _connection_lost(exc):  # it died listing: its last words
                await self.close()  # (the server has exited: its stderr is complete)
                said = self.stderr.describe()
            raise RuntimeError(self.spec.redact(
                f"MCP server {self.spec.called} could not list its tools: {_short(exc)}{said}")) from None
        self._listed = (changes, {t.name for t in tools})
        return tools

    async def still_lists(self, name: str) -> bool:
        """Whether the server still lists tool ``name``: asked again only after it announced a
        change (a listing that fails says yes, and the call itself finds out)."""
        if self._listed is None or self._listed[0] != self.changes:
            try:
                await self.list_tools()
            except Exception as exc:
                log.debug("MCP server %s: listing its tools again failed: %s", self.spec.name,
                          self.spec.redact(str(exc)))
                return True
        return name in self._listed[1]

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        if not self.alive:
            raise ConnectionError("the server is not running")
        return await self.aio.arun(self.client.call_tool(name, arguments, read_timeout_seconds=timeout))

    async def close(self, kill: bool = False) -> None:
        """End the session and the server; ``kill``: at once, without the grace period a server gets
        to exit (one stuck in a call would only run it out)."""
        await self.aio.arun(self._close(kill))

    async def _close(self, kill: bool = False) -> None:
        if kill:
            for pid, born in self.pids.items():
                _kill_tree(pid, born)
        task, self._task = self._task, None
        if task is not None:
            if self._stop is not None:
                self._stop.set()
            try:
                await asyncio.wait_for(task, 5)
            except (asyncio.TimeoutError, Exception):
                task.cancel()
        pids, self.pids = self.pids, {}
        for pid, born in pids.items():
            _kill_tree(pid, born)


def _short(exc: MCPError | ValidationError) -> str:
    """An error answer's message, or a pydantic error in one line (not its whole dump)."""
    if isinstance(exc, MCPError):
        return _one_line(exc.message)
    first = exc.errors()[0]
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"not a valid {exc.title}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}{more}"


def _describe(exc: BaseException) -> str:
    """The innermost message of an exception group, which is what the user needs to see."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


_LIVE: "weakref.WeakSet[Connection]" = weakref.WeakSet()


def kill_servers(connections) -> None:
    """Kill the server processes of ``connections`` (for an environment that was never closed)."""
    for connection in list(connections):
        for pid, born in list(connection.pids.items()):
            _kill_tree(pid, born)


atexit.register(lambda: kill_servers(_LIVE))  # no server outlives the interpreter


_CONNECTION_LOST = (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT)
MAX_TOOL_PAGES = 1000


def _connection_lost(exc: MCPError) -> bool:
    """Whether ``exc`` is the SDK's own word that the connection closed or the call timed out:
    its codes are in the range servers use for their own errors, which are answers like any."""
    return exc.code in _CONNECTION_LOST and (exc.message == "Connection closed" or "timed out" in exc.message.lower())


def _one_line(message: str) -> str:
    """An error message in one line: the SDK's ``Failed to parse ...: 1 validation error for ...``
    followed by pydantic's dump becomes its first problem (as stdio.py words an unreadable reply)."""
    lines = message.splitlines()
    if len(lines) < 2 or "validation error" not in lines[0]:
        return message
    reason = next((x for x in lines[1:] if x.startswith(" ")), lines[1]).split(" [type=")[0].strip()
    return f"{lines[0].partition(': ')[0]}: {reason}" if ": " in lines[0] else reason


MAX_DESCRIPTION_CHARS = 4_000  # of one tool's description, in the prompt
MAX_SCHEMA_CHARS = 8_000  # of one tool's input schema as JSON, in the prompt
# of one tool's input schema as JSON, checked against its metaschema (which takes about 4 s a
# megabyte: a 1.5 MB schema held a reset for 6 s); a larger one fails the reset, naming the tool
MAX_CHECKED_SCHEMA_CHARS = 256_000
MAX_TOOL_LIST_CHARS = 200_000  # of the whole tool list in the prompt (at most half the observation)
_SCHEMA_TEXT_CHARS = 200  # of each text in a schema too long to show whole


def _size(schema: Any) -> int:
    return len(json.dumps(schema, ensure_ascii=False))


def _cut_texts(value: Any) -> Any:
    """``value`` with every string over ``_SCHEMA_TEXT_CHARS`` cut, with a marker (keys kept)."""
    if isinstance(value, str):
        return truncate(value, _SCHEMA_TEXT_CHARS)
    if isinstance(value, dict):
        return {k: _cut_texts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_texts(v) for v in value]
    return value


def shown_schema(schema: dict[str, Any], limit: int = MAX_SCHEMA_CHARS) -> dict[str, Any]:
    """The input schema the model is shown, within ``limit`` characters of JSON: the schema
    itself when it fits; else with each long text cut; else each argument with its type only,
    as many as fit, and a description saying what was cut. Only what is shown changes: calls are
    still checked against the whole schema."""
    if _size(schema) <= limit:
        return schema
    short = _cut_texts(schema)
    if _size(short) <= limit:
        return short
    arguments = schema.get("properties") or {}
    kept: dict[str, Any] = {}
    shown = {"type": "object", "description": "", "properties": kept}
    size = _size(shown) + 200  # (room for the description)
    for key, sub in arguments.items():
        kind = sub.get("type") if isinstance(sub, dict) else None
        entry = {"type": kind} if isinstance(kind, str) else {}
        size += _size({key: entry})  # (an upper bound of what it adds)
        if size > limit:
            break
        kept[key] = entry
    required = [r for r in schema.get("required") or [] if r in kept]
    if required:
        shown["required"] = required
    shown["description"] = (f"[input schema cut: its {_size(schema)} characters are over the {limit} shown; "
                            f"the types of {len(kept)} of its {len(arguments)} arguments are left]")
    return shown


def _redacted(value: Any, redact: Callable[[str], str]) -> Any:
    """A listed schema with ``redact`` applied to every string in it, keys included (a default, an
    example or a description may quote a credential the server was given)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: _redacted(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, redact) for v in value]
    return value


def listed_tools(tools: list[Tool], limit: int) -> tuple[list[Tool], int]:
    """The tools, in order, whose schemas fit in ``limit`` characters together, and how many
    more there are: a prompt that lists thousands of tools would push the task out."""
    total = 0
    for n, tool in enumerate(tools):
        total += _size(tool.schema) + 1
        if total > limit:
            return tools[:n], len(tools) - n
    return tools, 0


def mcp_tool(env: Any, server: ServerSpec, remote: Any, name: str) -> Tool:
    """A toolset entry for ``remote`` (an MCP ``Tool``) of ``server``, exposed to the model as ``name``."""

    async def call(**arguments: Any) -> str:  # the model's arguments only: an MCP tool may have one named episode
        try:
            return await _call(arguments)
        except (ToolError, ToolFailure) as exc:  # (a server's own error text may quote the credentials it was sent)
            said = server.redact(str(exc))
            if said == str(exc):
                raise
            if isinstance(exc, ToolFailure):
                raise ToolFailure(said, exc.outcome) from None
            raise ToolError(said, exc.code) from None

    async def _call(arguments: dict[str, Any]) -> str:
        connection: Connection = env.connections[server.name]
        if connection.changes and not await connection.still_lists(remote.name):
            raise ToolError(f"tool {name!r} is gone: the MCP server {server.name!r} changed its tool list during this "
                            "episode (notifications/tools/list_changed) and no longer lists it; the new list is "
                            "shown from the next reset")
        try:
            result = await connection.call(remote.name, arguments, env.tool_timeout)  # the SDK enforces the timeout
        except Exception as exc:
            if isinstance(exc, MCPError) and not _connection_lost(exc) and connection.alive:
                # An error answer (an unknown tool, an oversized or unreadable reply): the server keeps its state.
                raise ToolError(f"the MCP server {server.name!r} answered {name!r} with an error: "
                                f"{_one_line(exc.message)}") from None
            if isinstance(exc, ValidationError) and connection.alive:
                # An answer that is not MCP's (an unknown content type): the connection is fine.
                raise ToolError(f"the MCP server {server.name!r} answered {name!r} with a result that is "
                                f"{_short(exc)}") from None
            # Either way below, the server's state is gone and the episode cannot go on as it was:
            # a failure that is not the model's (core.outcomes), which ends it.
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or "timed out" in str(exc).lower():
                # Still busy past the timeout (a stdio stream is in order, so nothing else gets
                # through until it finishes): killed at once, not given a grace period to run out,
                # and started afresh at the next reset, not while this step waits.
                await connection.close(kill=True)
                stopped = (f"the session with the MCP server {server.name!r} was closed and a new one opens at the "
                           "next reset" if server.url else  # (a server we do not run keeps its state, or not)
                           f"the MCP server {server.name!r} was stopped (its state is lost) and starts afresh at "
                           "the next reset")
                raise ToolFailure(f"tool {name!r} timed out after {env.tool_timeout:g} s; {stopped}",
                                  TOOL_TIMEOUT) from None
            # A crashed server: start it again at once, to report a restart that fails too.
            await connection.close(kill=True)  # gone already, or past answering: no grace period
            said = connection.stderr.describe()  # a crashed server's last words
            try:
                await connection.start(env.workspace)
            except RuntimeError as failed:
                raise ToolFailure(f"the MCP server {server.name!r} failed during {name!r} ({_describe(exc)}){said}"
                                  f"\n{'Reconnecting to' if server.url else 'Restarting'} it failed: {failed}",
                                  TOOL_UNAVAILABLE) from None
            raise ToolFailure(
                f"the MCP server {server.name!r} failed during {name!r} ({_describe(exc)}); "
                f"{'a new session was opened' if server.url else 'it was restarted'}{said}", TOOL_UNAVAILABLE) from None
        text = result_text(result)
        if result.is_error:
            outcome = (result.meta or {}).get("benchmax/outcome")  # a benchmax mcp-serve's failure (issue 29)
            if outcome in FAILURES:
                raise ToolFailure(text or f"tool {name!r} failed", outcome)
            raise ToolError(text or f"tool {name!r} reported an error")
        return server.redact_result(text)

    # The listing reaches the model's prompt: no credential the server was given may show in it.
    description = truncate(server.redact_result(remote.description or name), MAX_DESCRIPTION_CHARS)
    try:
        size = _size(remote.input_schema)
    except (TypeError, ValueError, RecursionError):  # (nested too deep to check in any case)
        size = None
    if size is None or size > MAX_CHECKED_SCHEMA_CHARS:
        said = "nested too deeply to read" if size is None else f"{size:,} characters of JSON"
        raise ToolSchemaError(f"tool {name!r} of the MCP server {server.name!r}: its input schema is {said}, over "
                              f"the {MAX_CHECKED_SCHEMA_CHARS:,} that are checked (schemas of that size are not "
                              "meant for a model's prompt)")
    try:
        tool = Tool.from_schema(name, description, remote.input_schema, call, wants_episode=False,
                                wants_state=False, lenient=getattr(env, "lenient_schemas", False))
    except ToolSchemaError as exc:  # which server's, when there are several (its error may quote the schema)
        raise ToolSchemaError(server.redact(f"{exc} (a tool of the MCP server {server.name!r})")) from None
    shown = _redacted(tool.parameters, server.redact_result) if server.credentials else tool.parameters
    tool.parameters = shown_schema(shown)  # (its validation keeps the whole schema, as the server listed it)
    tool.self_timed = True  # the call times itself out and stops the server before answering
    return tool

