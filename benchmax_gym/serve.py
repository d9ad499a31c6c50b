"""Every toolset as an MCP server: ``benchmax-gym mcp-serve ENV_ID [--transport stdio|http]``.

Any MCP client or agent framework can then use a family's tools (Math's calculator and sandboxed
python, Excel's workbook tools, CRM's database tools, ...). Each MCP session gets its own
environment, reset once at its first tool call: its own workspace, workbook, database copy or
sandbox, so sessions never see each other's changes; its calls run one at a time, as a step runs
them. The server's instructions are the environment's system prompt.

A call that fails for a reason that is not the model's (the sandbox died, a backend is down, a
tool timed out: :mod:`benchmax_gym.core.outcomes`) is an error result whose ``_meta`` carries
``{"benchmax/outcome": name}``; an MCP-v0 episode run on the server ends with that outcome.

Sessions: over stdio the session is the process. Over HTTP it is the ``mcp-session-id`` of the
initialize-handshake era; its environment is closed (sandbox killed, workspace deleted) when the
session ends: the client's DELETE, or ``idle_timeout`` seconds with no request in flight (a
client that vanished without a DELETE), or the server's shutdown. At most ``max_sessions`` are
open at once; one more is refused with HTTP 503 "Too many open sessions" until one ends. The
modern stateless protocol has no session, so HTTP does not serve it (:class:`HandshakeOnly`): the
SDK's default ``Client`` (``mode="auto"``) falls back to the handshake and gets a session of its
own; a client pinned to a modern version is refused with the reason. An environment
that fails to start fails the call that started it (an error result saying why, outcome
``env_error``) and is not kept: the session's next call tries again.

HTTP binds to 127.0.0.1 unless told otherwise, and there takes no request from a web page (a
``Host`` or ``Origin`` that is not loopback: 403); ``auth_token`` (or ``BENCHMAX_GYM_MCP_TOKEN``)
makes every request need ``Authorization: Bearer <token>`` (401 without it).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import logging
import os
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

import gymnasium as gym
import mcp_types as types
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp.server.lowlevel import Server

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.core.checks import COUNT_MAX
from benchmax_gym.core.outcomes import ENV_ERROR, FAILURES

TOKEN_ENV = "BENCHMAX_GYM_MCP_TOKEN"
#: the ``_meta`` key of a tool result that failed for a reason not the model's (core.outcomes)
OUTCOME_META = "benchmax/outcome"
_ENV_KEY = "benchmax_gym.env"  # where a session's environment (a future of it) lives in its connection state
log = logging.getLogger(__name__)

#: exceptions whose message says what failed by itself (ours, and the ones an env raises to say it
#: cannot start); any other is named with its type
_PLAIN = (RuntimeError, ValueError, TypeError, OSError, ImportError, gym.error.Error)


def error_line(exc: BaseException) -> str:
    """What an environment raised, as one line for a client and the server's log: its message, led
    by its type's name unless it is a plain start failure (a KeyError said only ``'task'``, quoted;
    a MemoryError or a bare ``raise Boom()`` said nothing at all)."""
    message = str(exc.args[0]) if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
    message = " ".join(message.split())
    plain = type(exc).__module__.startswith("benchmax_gym") or (
        isinstance(exc, _PLAIN) and not isinstance(exc, RecursionError)
        and type(exc).__module__ in ("builtins", "gymnasium.error"))
    if plain and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def start_failure(exc: Exception) -> Exception:
    """The first environment a server makes (its probe) failed: what it raised as it is when it is
    a plain start failure (the CLI says a bad argument or an env that cannot start by its type),
    else a RuntimeError naming it (a plugin's KeyError or its own exception class ended the CLI in
    a traceback)."""
    if isinstance(exc, _PLAIN) and not isinstance(exc, RecursionError):
        return exc
    return RuntimeError(error_line(exc))


class SessionEnvs:
    """One reset environment per MCP session, closed when the session ends.

    A session's environment lives in its SDK connection's ``state`` and is closed by the
    connection's ``exit_stack``, which the SDK unwinds however the session ends (DELETE, idle
    timeout, shutdown). Requests without a session id (stdio's one connection, an in-process
    client) share one environment, closed by :meth:`close`.
    """

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], seed: int | None):
        self.env_id, self.env_kwargs, self.seed = env_id, env_kwargs, seed
        self.live: dict[gym.Env, asyncio.Lock] = {}  # made and not yet closed: its calls' turn
        self._lock = threading.Lock()
        self._shared: asyncio.Future | None = None

    def make(self) -> gym.Env:
        env = gym.make(self.env_id, **self.env_kwargs)
        self.live[env] = asyncio.Lock()
        try:
            env.reset(seed=self.seed)
        except BaseException:
            self._close(env)
            raise
        return env

    def _close(self, env: gym.Env) -> None:
        with self._lock:  # a session's release and the server's shutdown may race: close once
            if self.live.pop(env, None) is None:
                return
        env.close()

    async def for_request(self, ctx: Any) -> gym.Env:
        """The request's session's environment, made at its first call. A failed start is not
        kept: the next call tries again (a flaky server start must not fail a session for ever)."""
        connection = _connection(ctx)
        if connection is None or connection.session_id is None:  # stdio (one client), or in-process
            made = self._shared
            if made is None:
                made = self._shared = asyncio.ensure_future(asyncio.to_thread(self.make))
            try:
                return await asyncio.shield(made)
            except Exception:
                if self._shared is made:
                    self._shared = None  # the next call tries again
                raise
        made = connection.state.get(_ENV_KEY)
        if made is None:  # a reset may start a sandbox or a server: off the event loop
            made = connection.state[_ENV_KEY] = asyncio.ensure_future(asyncio.to_thread(self.make))
            connection.exit_stack.push_async_callback(self._release, made)
        try:
            return await asyncio.shield(made)
        except Exception:
            if connection.state.get(_ENV_KEY) is made:
                del connection.state[_ENV_KEY]  # the next call tries again
            raise

    def turn(self, env: gym.Env) -> asyncio.Lock:
        """An environment's calls run one at a time, as a step runs a turn's: a session's
        concurrent calls would race on its state, and each hold one of the process's tool
        threads while it waits for the sandbox (hundreds at once starve every other session)."""
        return self.live.get(env) or asyncio.Lock()

    async def _release(self, made: asyncio.Future) -> None:
        """The session ended: close its environment (in a thread; the SDK bounds the wait)."""
        try:
            env = await made
        except Exception:
            return
        await asyncio.to_thread(self._close, env)

    def close(self) -> None:
        """Close every environment still open (the server is stopping)."""
        for env in list(self.live):
            try:
                self._close(env)
            except Exception:
                pass


def _connection(ctx: Any) -> Any:
    """The SDK's per-connection object (``state``, ``exit_stack``, ``session_id``). The low-level
    request context reaches it only through its session until the SDK's Context rework lands."""
    return getattr(getattr(ctx, "session", None), "_connection", None)


def build_server(env_id: str, env_kwargs: dict[str, Any] | None = None, seed: int | None = 0) -> Server:
    """A low-level MCP server exposing ``env_id``'s tools, one environment per session."""
    sessions = SessionEnvs(env_id, dict(env_kwargs or {}), seed)
    try:
        probe = sessions.make()  # what the tools are (MCP-v0 only knows once its servers are up)
    except Exception as exc:
        if (said := start_failure(exc)) is exc:
            raise
        raise said from exc
    base = probe.unwrapped
    tools = [
        types.Tool(name=s["function"]["name"], description=s["function"]["description"],
                   input_schema=s["function"]["parameters"])
        for s in base.tool_schemas
    ]
    instructions = base._family_prompt
    sessions._close(probe)

    async def on_list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            made = await sessions.for_request(ctx)
        except Exception as exc:  # its environment failed to start: say why (not "Internal server error"),
            outcome = getattr(exc, "outcome", None)  # and log one line (the traceback at debug level)
            said = error_line(exc)
            log.warning("benchmax-gym mcp-serve: %s: a session's environment failed to start: %s", env_id, said,
                        exc_info=log.isEnabledFor(logging.DEBUG))
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"the environment failed to start: {said}")],
                is_error=True, meta={OUTCOME_META: outcome if outcome in FAILURES else ENV_ERROR})
        env = made.unwrapped
        async with sessions.turn(made):
            result = await env.toolset.arun(
                params.name, dict(params.arguments or {}), episode=env.episode,
                timeout=env.tool_timeout, max_chars=env.max_tool_output_chars,
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.content)], is_error=result.error is not None,
            # a failure that is not the model's (issue 29) says so: an episode run on it ends with it
            meta={OUTCOME_META: result.outcome} if result.outcome else None,
        )

    server = Server(f"benchmax-gym {env_id}", instructions=instructions,
                    on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    server.sessions = sessions  # closed by serve() on the way out
    return server


def serve(env_id: str, transport: str = "stdio", *, host: str = "127.0.0.1", port: int = 8000,
          env_kwargs: dict[str, Any] | None = None, seed: int | None = 0, idle_timeout: float = 600.0,
          max_sessions: int = 64, auth_token: str | None = None) -> None:
    """Run the server until interrupted (stdio: until the client closes stdin).

    HTTP options: ``idle_timeout`` (seconds a session may have no request in flight before it
    and its environment are closed), ``max_sessions`` (open at once), ``auth_token`` (a bearer
    token every request must carry; default: the ``BENCHMAX_GYM_MCP_TOKEN`` variable, if set).
    """
    if transport not in ("stdio", "http"):
        raise ValueError(f"transport must be 'stdio' or 'http', got {transport!r}")
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or not 0 < max_sessions <= COUNT_MAX:
        raise ValueError(f"max_sessions must be a positive int up to {COUNT_MAX:,}, got {max_sessions!r}")
    if not isinstance(idle_timeout, (int, float)) or not 0 < idle_timeout < float("inf"):
        raise ValueError(f"idle_timeout must be a positive number of seconds, got {idle_timeout!r}")
    auth_token = auth_token if auth_token is not None else os.environ.get(TOKEN_ENV) or None
    sockets = listen(host, port) if transport == "http" else None  # a port in use: before the env is made
    try:
        server = build_server(env_id, env_kwargs, seed)
    except BaseException:
        for sock in sockets or ():
            sock.close()
        raise
    try:
        if transport == "stdio":
            _run_stdio(server)
        else:
            _run_http(server, host, port, idle_timeout, max_sessions, auth_token, sockets)
    finally:
        server.sessions.close()


def _run_stdio(server: Server) -> None:
    from mcp.server.stdio import stdio_server

    wire = os.dup(0)  # the client's lines; fd 0 reads nothing while serving (a child must not take them)
    null = os.open(os.devnull, os.O_RDONLY)
    saved = os.dup(0)
    os.dup2(null, 0)
    os.close(null)

    async def main() -> None:
        async with stdio_server(stdin=_StdinLines(wire)) as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        asyncio.run(main())
    finally:
        os.dup2(saved, 0)
        os.close(saved)


class _StdinLines:
    """The client's lines for the SDK's stdio transport, read by a daemon thread. The SDK reads
    stdin in a worker thread it waits for: stopped (Ctrl-C) while the client kept stdin open, the
    server hung until the client's next line, and exit waited on the thread too. ``fd`` is left
    open: the thread may still be blocked on it."""

    def __init__(self, fd: int):
        self.loop, self.lines = asyncio.get_running_loop(), asyncio.Queue()
        threading.Thread(target=self._read, args=(fd,), daemon=True, name="mcp-stdin").start()

    def _read(self, fd: int) -> None:
        stream = open(fd, encoding="utf-8", errors="replace", closefd=False)
        for line in itertools.chain(stream, [None]):  # (None: the end of the client's stdin)
            try:
                self.loop.call_soon_threadsafe(self.lines.put_nowait, line)
            except RuntimeError:  # the server is gone
                return

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self.lines.get()
        if line is None:
            raise StopAsyncIteration
        return line


def _run_http(server: Server, host: str, port: int, idle_timeout: float, max_sessions: int,
              auth_token: str | None, sockets: list | None = None) -> None:
    app = server.streamable_http_app(host=host, session_idle_timeout=idle_timeout, max_sessions=max_sessions)
    run_http_app(HandshakeOnly(app), host, port, auth_token, "mcp-serve", "/mcp", sockets=sockets)


class HandshakeOnly:
    """ASGI wrapper of the MCP app: only the initialize-handshake era, whose sessions each get
    their own environment. The modern stateless protocol has no session, so the SDK would serve
    every client of it from one environment (client B reads client A's writes). Its requests
    (an ``MCP-Protocol-Version`` header that is not a handshake version, which the SDK routes to its
    modern handler) get the JSON-RPC error -32022 naming the handshake versions as the supported
    ones: the SDK's default ``Client`` (``mode="auto"``) then falls back to ``initialize``, and a
    client pinned to a modern version is told why it is refused. Behind :class:`BearerToken`."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            asked = [v.decode("latin-1") for k, v in scope["headers"] if k == b"mcp-protocol-version"]
            refused = next((v for v in asked if v not in HANDSHAKE_PROTOCOL_VERSIONS), None)
            if refused is not None:
                from starlette.responses import JSONResponse

                error = types.ErrorData(
                    code=types.UNSUPPORTED_PROTOCOL_VERSION,
                    message=f"protocol version {refused!r} is not served here: this server keeps one environment "
                            "(workspace, sandbox) per MCP session, and only the initialize handshake opens a "
                            "session; connect with the handshake (the SDK's Client: mode='auto' or 'legacy')",
                    data=types.UnsupportedProtocolVersionErrorData(
                        supported=list(HANDSHAKE_PROTOCOL_VERSIONS), requested=refused).model_dump(mode="json"))
                body = types.JSONRPCError(jsonrpc="2.0", id=None, error=error)  # (the body is not read)
                return await JSONResponse(body.model_dump(mode="json", by_alias=True), status_code=400)(
                    scope, receive, send)
        await self.app(scope, receive, send)


class ListenError(OSError):
    """The server cannot listen where it was told (the port in use, a host not of this machine):
    its message names the option to change (``--port``, ``--host``)."""


def listen(host: str, port: int) -> list[Any]:
    """Sockets listening on ``host:port``, one per address the host resolves to, as uvicorn (asyncio's
    ``create_server``) binds them: bound here so that a port in use is a :class:`ListenError`
    naming ``--port`` (uvicorn logs a message of its own that names no option, and exits 3), and
    listening at once: a socket only bound (SO_REUSEADDR) let another server take the port while
    the environment was made, and uvicorn's own listen then failed with a traceback. An empty
    ``host`` is refused: it listened on every interface (a ``--host "$HOST"`` with the variable unset)."""
    import errno
    import socket

    if not host.strip():  # ("$HOST" unset: the wildcard, every interface, with no word of it)
        raise ListenError(f"--host {host!r}: name an address to listen on (127.0.0.1, this machine only; 0.0.0.0 "
                          "or :: for every interface)")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"--host {host}: cannot listen there ({exc.strerror})") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen()  # (connections wait in the backlog until uvicorn serves them)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"--port {port}: the port is in use on {host} (another server listens there); choose "
                              "another with --port, or --port 0 for any free one") from None
        if exc.errno == errno.EACCES:
            raise ListenError(f"--port {port}: not allowed here ({exc.strerror}); choose another with --port") from None
        raise ListenError(f"--host {host}: cannot listen there ({exc.strerror})") from None
    return sockets


HEADER_TIMEOUT = 10.0  # seconds a new connection has to send its first request's headers
MAX_HEADERLESS = 128  # connections still sending them; one more closes the oldest


def headers_first(protocol_class: type[asyncio.Protocol], timeout: float = HEADER_TIMEOUT,
                  limit: int = MAX_HEADERLESS) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol behind a guard against slowloris: the token is checked only once a
    request's headers are in, so until then a connection must cost little. A new connection has
    ``timeout`` seconds in all to send its first request's headers (the end of the headers,
    a blank line, seen in the bytes as they arrive), and at most ``limit`` connections wait for
    theirs at once (a new one beyond that closes the oldest): half-open connections can neither
    pile up nor take the file descriptors a client with the token needs. A refused request closes
    its connection (:class:`BearerToken`), so a later request cannot trickle either."""
    waiting: dict[Guarded, None] = {}  # oldest first

    class Guarded(asyncio.Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.inner = protocol_class(*args, **kwargs)
            self.transport: asyncio.Transport | None = None
            self.timer: asyncio.TimerHandle | None = None
            self.tail = b""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.transport = transport
            if len(waiting) >= limit:
                next(iter(waiting)).drop()
            waiting[self] = None
            self.timer = asyncio.get_running_loop().call_later(timeout, self.drop)
            self.inner.connection_made(transport)

        def drop(self) -> None:
            self.settled()
            self.transport.abort()

        def settled(self) -> None:
            waiting.pop(self, None)
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

        def data_received(self, data: bytes) -> None:
            if self.timer is not None:
                seen = self.tail + data
                if b"\r\n\r\n" in seen:
                    self.settled()
                else:
                    self.tail = seen[-3:]
            self.inner.data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.settled()
            self.inner.connection_lost(exc)

        def eof_received(self) -> bool | None:
            return self.inner.eof_received()

        def pause_writing(self) -> None:
            self.inner.pause_writing()

        def resume_writing(self) -> None:
            self.inner.resume_writing()

    return Guarded


def run_http_app(app: Any, host: str, port: int, auth_token: str | None, command: str, path: str = "",
                 sockets: list | None = None) -> None:
    """Serve an ASGI app with uvicorn until interrupted (``mcp-serve``, ``openenv-serve``): behind
    :class:`BearerToken` when there is a token (a warning when there is none off loopback),
    :class:`LocalOnly` on loopback, and :func:`headers_first`, and saying where it listens on
    stderr once the socket is open, so scripts can wait for it. ``sockets``: bound by
    :func:`listen` (by default here: a port in use is a :class:`ListenError`)."""
    import uvicorn
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    if _is_loopback(host):
        app = LocalOnly(app)
    if auth_token:
        app = BearerToken(app, auth_token)
    elif not _is_loopback(host):
        print(f"warning: serving on {host} with no --auth-token: anyone who can reach it can run the tools",
              file=sys.stderr, flush=True)

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname()[1] if self.servers else port
                shown = f"[{host}]" if ":" in host else host
                print(f"benchmax-gym {command}: listening on http://{shown}:{bound}{path}", file=sys.stderr, flush=True)

        def handle_exit(self, sig, frame) -> None:
            # from Ctrl-C on, a response cut short is the interrupt's doing (one may end before
            # shutdown() begins: an MCP session's event stream); removed below
            for name in _CUT_BY_SHUTDOWN:
                logging.getLogger(name).addFilter(_not_cut_by_shutdown)
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            for name in _CUT_BY_SHUTDOWN:  # (removed below)
                logging.getLogger(name).addFilter(_not_cut_by_shutdown)
            await super().shutdown(sockets)
            if self.force_exit:  # a second Ctrl-C: uvicorn stops waiting for open connections and skips the app's
                await self.lifespan.shutdown()  # shutdown, which closes the sessions' environments (their
                # sandboxes, workspaces); its task, cancelled at exit, was logged as a traceback

    http = headers_first(import_from_string(HTTP_PROTOCOLS["auto"]))
    if sockets is None:
        sockets = listen(host, port)
    try:
        colors = False if os.environ.get("NO_COLOR") else None  # (None: uvicorn's, on a terminal; NO_COLOR: none)
        Announcing(uvicorn.Config(app, host=host, port=port, log_level="warning", http=http,
                                  use_colors=colors)).run(sockets=sockets)
    finally:
        for name in _CUT_BY_SHUTDOWN:
            logging.getLogger(name).removeFilter(_not_cut_by_shutdown)
        for sock in sockets:
            sock.close()


# what a logger says of a response the server's end cut short (an MCP session's event stream,
# ended with its session; a call in flight when a second Ctrl-C stopped the wait for it)
_CUT_BY_SHUTDOWN = {"uvicorn.error": "ASGI callable returned without completing response.",
                    "mcp.shared.jsonrpc_dispatcher": "gave up: transport write blocked"}


def _not_cut_by_shutdown(record: logging.LogRecord) -> bool:
    """No error of the server's: Ctrl-C says one line."""
    return not record.getMessage().endswith(_CUT_BY_SHUTDOWN.get(record.name, "\0"))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class LocalOnly:
    """ASGI wrapper of a server on loopback: its clients are this machine's programs, not the web
    pages its browser opens. A browser lets any page open a WebSocket to 127.0.0.1 (CORS does not
    cover them) and sends the page's ``Origin``; a page can also rebind its own name to 127.0.0.1
    (its ``Host`` then names it). A request or handshake whose ``Host`` or ``Origin`` is not a
    loopback name is refused with 403."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope["headers"])
            host, origin = headers.get(b"host"), headers.get(b"origin")
            if not (_names_loopback(b"//" + host if host is not None else None)
                    and _names_loopback(origin)):
                from starlette.responses import JSONResponse

                response = JSONResponse(
                    {"error": "forbidden", "error_description": "this server takes requests from programs on "
                     "this machine only, not from web pages (Host and Origin must be loopback)"}, status_code=403,
                    headers={"Connection": "close"} if scope["type"] == "http" else None)
                return await _refuse(scope, receive, send, response)
        await self.app(scope, receive, send)


def _names_loopback(url: bytes | None) -> bool:
    """A header naming no host (none sent), or one that names a loopback host."""
    if url is None:
        return True
    try:
        return _is_loopback(urlsplit(url.decode("latin-1")).hostname or "")
    except ValueError:
        return False


async def _refuse(scope, receive, send, response: Any) -> None:
    """Answer an HTTP request, or refuse a WebSocket handshake before it is accepted."""
    if scope["type"] == "http":
        await response(scope, receive, send)
        return
    from starlette.websockets import WebSocket

    socket = WebSocket(scope, receive, send)
    if "websocket.http.response" in scope.get("extensions", {}):
        await socket.send_denial_response(response)
    else:  # a server without the denial extension answers 403
        await socket.close(code=1008)


class BearerToken:
    """ASGI wrapper: every HTTP request and WebSocket handshake needs ``Authorization: Bearer
    <token>`` (compared in constant time), else 401 with ``WWW-Authenticate: Bearer`` (a WebSocket
    handshake is refused before it is accepted)."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                from starlette.responses import JSONResponse

                response = JSONResponse(
                    {"error": "invalid_token",
                     "error_description": "this server needs an 'Authorization: Bearer <token>' header"},
                    status_code=401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"',
                                              **({"Connection": "close"} if scope["type"] == "http" else {})},
                )
                return await _refuse(scope, receive, send, response)
        await self.app(scope, receive, send)
