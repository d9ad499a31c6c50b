"""A stdio transport for the SDK's ``Client`` that reads a server's output in linear time, with a
size limit per message.

Why not the SDK's own ``stdio_client``: its reader joins the whole pending line to every 64 KB
chunk it reads, so one 50 MB tool result takes about 100 s to arrive (quadratic) and the call can
only end in a timeout and a server restart, losing the server's state. This reader keeps chunks
in a list; a message over the limit is dropped as it streams past (memory stays bounded) and its
request gets a JSON-RPC error at once, so the call fails with a clear message and the server
lives on. Everything above the byte stream (parsing, the session) is the SDK's.

A server's whole process tree goes with it: it starts in its own session and process group, its
environment carries a marker, and stopping it kills the group, every process below it and every
process that carries the marker (a daemon that started its own session and left the tree).

The server's stderr is captured, not passed to ours (a chatty or crashing server could flood the
user's terminal): its last few KB are kept in a :class:`StderrTail` for error messages, and each
chunk is logged at debug level.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import subprocess
import uuid

import anyio
import mcp_types as types
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

_KEEP = 512  # bytes kept from each end of a dropped message, to find its request id
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')
_GRACE_S = 2.0  # a server gets this long to exit after its stdin closes, then it is killed
_STDERR_DRAIN_S = 1.0  # after the server exits, how long to wait for the rest of its stderr
MARKER = "BENCHMAX_MCP_SERVER"  # in a server's environment (its children inherit it): whose tree to kill

log = logging.getLogger(__name__)


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when it is gone: a pid with another
    start time is another process, which is never killed."""
    stat = _stat(pid)
    return stat[1] if stat else None


def _stat(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[19])  # ppid, starttime
    except (OSError, ValueError, IndexError):
        return None


def tree(root: int | None, born: int | None, marker: bytes | None = None) -> dict[int, int]:
    """Every process below ``root`` (by parent links, sessions regardless; only while ``root`` is
    still the process that started at ``born``) and, given ``marker``, every process whose
    environment holds it: pid -> start time, for :func:`kill_processes`."""
    table = {int(e): st for e in os.listdir("/proc") if e.isdigit() and (st := _stat(int(e))) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, int] = {}
    todo = [root] if root is not None and born is not None and table.get(root, (0, None))[1] == born else []
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid not in found:
                found[pid] = table[pid][1]
                todo.append(pid)
    if marker is not None:
        for pid, (_, started) in table.items():
            if pid not in found and pid != os.getpid():
                with suppress(OSError):
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if marker in f.read().split(b"\0"):
                            found[pid] = started
    return found


def kill_processes(found: dict[int, int]) -> None:
    """SIGKILL each process of ``found`` that is still the one seen (same pid, same start time)."""
    for pid, started in found.items():
        if start_time(pid) == started:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)


class StderrTail:
    """The last ``limit`` bytes a server wrote to stderr (memory stays bounded however much it writes);
    ``redact`` blanks its credentials out of what is shown or logged."""

    def __init__(self, limit: int = 4096, redact: Callable[[str], str] = lambda text: text):
        self.limit = limit
        self.redact = redact
        self.size = 0
        self._tail = bytearray()

    def add(self, data: bytes) -> None:
        self.size += len(data)
        self._tail += data
        if len(self._tail) > 2 * self.limit:  # trim now and then: linear in what is written
            del self._tail[: -self.limit]

    def text(self) -> str:
        """The tail as text (``...`` in front when earlier output was dropped), or ``""``."""
        text = self.redact(bytes(self._tail[-self.limit:]).decode("utf-8", "replace").strip())
        return f"...{text}" if text and self.size > self.limit else text

    def describe(self) -> str:
        """A sentence for an error message: what the server said last on stderr, if anything."""
        text = self.text()
        return f"; its stderr ended with:\n{text}" if text else ""


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # the session surfaces it; the connection goes on
        return exc


_JUNK_TRIES = 8  # places a message may start after text a server printed before it on its line


def _after_junk(line: bytes) -> tuple[bytes, SessionMessage] | None:
    """The message in ``line`` after text the server printed before it without a newline (a
    progress bar's ``50%... ``, a ``\r``): that text and the message share one line, which would
    otherwise leave the call waiting out its timeout and the server killed. Tried from each of the
    first few ``{`` only, and only when the whole line is not a message."""
    start = 0
    for _ in range(_JUNK_TRIES):
        start = line.find(b"{", start + 1)
        if start == -1:
            return None
        message = _parse(line[start:])
        if isinstance(message, SessionMessage):
            return line[start:], message
    return None


def _answers(line: bytes, outstanding: dict[str, types.RequestId]) -> types.RequestId | None:
    """The request that ``line``, which the SDK could not read, answers: a JSON object with
    that request's ``id`` and no ``method`` (Python's parser reads what the SDK's may not)."""
    try:
        obj = json.loads(line.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or "method" in obj or not isinstance(obj.get("id"), (int, str)):
        return None
    return outstanding.get(str(obj["id"]))


class _Oversized:
    """What is kept of a message too big to deliver: its size and both ends."""

    def __init__(self, parts: list[bytes]):
        joined = b"".join(parts)
        self.size = len(joined)
        self.head, self.tail = joined[:_KEEP], joined[-_KEEP:]

    def add(self, data: bytes) -> None:
        self.size += len(data)
        self.tail = (self.tail + data)[-_KEEP:]

    def request_id(self, outstanding: dict[str, types.RequestId]) -> types.RequestId | None:
        """The id of the request this answers: the only one waiting, or one named at either end."""
        if len(outstanding) == 1:
            return next(iter(outstanding.values()))
        for end in (self.head, self.tail):
            for raw in _ID.findall(end):
                key = raw.decode("utf-8", "replace").strip('"')
                if key in outstanding:
                    return outstanding[key]
        return None


@asynccontextmanager
async def stdio_transport(
    server: StdioServerParameters, max_message_bytes: int, on_spawn: Callable[[int], None] = lambda pid: None,
    stderr: StderrTail | None = None,
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream]]:
    """Start ``server`` in its own session and yield the SDK's (read, write) message streams.

    ``on_spawn(pid)`` learns the server's process id (its process group's id too) at once;
    ``stderr`` collects the tail of what the server writes there (complete once this exits).
    """
    stderr = stderr if stderr is not None else StderrTail()
    command = shutil.which(server.command) or server.command
    token = uuid.uuid4().hex
    process = await anyio.open_process(
        [command, *server.args],
        env=get_default_environment() | (server.env or {}) | {MARKER: token},
        cwd=server.cwd,
        stderr=subprocess.PIPE,  # read into ``stderr``, never passed to ours
        start_new_session=True,  # its own process group: the whole tree is killed at the end
    )
    born = start_time(process.pid)
    on_spawn(process.pid)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    outstanding: dict[str, types.RequestId] = {}  # requests sent and not yet answered

    async def deliver(line: bytes) -> None:
        message = _parse(line)
        if isinstance(message, Exception) and (found := _after_junk(line)) is not None:
            log.debug("MCP server %s wrote text before a message on its line: %r", server.command,
                      stderr.redact(line[: len(line) - len(found[0])].decode("utf-8", "replace")[:200]))
            line, message = found
        if isinstance(message, Exception) and (request_id := _answers(line, outstanding)) is not None:
            # An answer the SDK cannot read (nested too deep, bad UTF-8): its call fails now, not
            # at its timeout, which would stop the server and lose its state.
            reason = (str(message).splitlines()[1:2] or [type(message).__name__])[0].split(" [type=")[0].strip()
            message = SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"the server's reply could not be read: {reason}")))
        if isinstance(message, SessionMessage) and isinstance(
            message.message, (types.JSONRPCResponse, types.JSONRPCError)
        ):
            outstanding.pop(str(message.message.id), None)
        await to_session.send(message)

    async def refuse(big: _Oversized) -> None:
        request_id = big.request_id(outstanding)
        if request_id is None:
            return  # a notification, or nothing we asked for: nobody is waiting on it
        outstanding.pop(str(request_id), None)
        text = (f"the server's reply was {big.size / 1e6:.1f} MB, over the {max_message_bytes / 1e6:g} MB "
                f"limit for one message; it was dropped")
        error = types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                   error=types.ErrorData(code=types.INTERNAL_ERROR, message=text))
        await to_session.send(SessionMessage(error))

    read_done = anyio.Event()
    marker = f"{MARKER}={token}".encode()

    async def read() -> None:
        try:
            await read_messages()
        finally:
            read_done.set()

    async def read_messages() -> None:
        parts: list[bytes] = []
        size = 0
        big: _Oversized | None = None
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with to_session:
                async for chunk in process.stdout:
                    start = 0
                    while (end := chunk.find(b"\n", start)) != -1:
                        piece = chunk[start:end]
                        start = end + 1
                        if big is None and size + len(piece) <= max_message_bytes:
                            await deliver(b"".join(parts) + piece if parts else piece)
                        else:
                            big = big or _Oversized(parts)
                            big.add(piece)
                            await refuse(big)
                        parts, size, big = [], 0, None
                    rest = chunk[start:]
                    if big is not None:
                        big.add(rest)
                    elif rest:
                        parts.append(rest)
                        size += len(rest)
                        if size > max_message_bytes:
                            big, parts, size = _Oversized(parts), [], 0

    stderr_done = anyio.Event()

    async def read_stderr() -> None:
        try:
            with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stderr:
                    stderr.add(chunk)
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug("MCP server %s stderr: %s", server.command,
                                  stderr.redact(chunk.decode("utf-8", "replace")[:2000]))
        finally:
            stderr_done.set()

    async def watch() -> None:
        """A server that fails (exits non-zero, or by a signal) while a process it started holds
        its stdout open: its output never ends, and a call would wait out its timeout to be told
        the server timed out. Once its output has had its moment to drain, the processes that
        carry its marker go too, which ends the output: the call fails at once with the server's
        last words. (One that exits 0 may have left a child to serve in its place: left alone.)"""
        if await process.wait() == 0:
            return
        with anyio.move_on_after(_STDERR_DRAIN_S):
            await read_done.wait()
        if not read_done.is_set():
            kill_processes(tree(None, None, marker))

    async def write() -> None:
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with from_session:
                async for message in from_session:
                    if isinstance(message.message, types.JSONRPCRequest):
                        outstanding[str(message.message.id)] = message.message.id
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())
        await to_session.aclose()  # the server stopped reading: end the session, do not hang it

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        tasks.start_soon(read_stderr)
        tasks.start_soon(watch)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, born, marker)
                with anyio.move_on_after(_STDERR_DRAIN_S):  # its last words, for the error message
                    await stderr_done.wait()
            tasks.cancel_scope.cancel()
            await read_stream.aclose()
            await write_stream.aclose()


async def _stop(process: anyio.abc.Process, born: int | None, marker: bytes) -> None:
    """Close stdin, give the server a grace period, then kill its process group and every process
    it started (seen before it exits: an orphan's parent link is gone)."""
    started = tree(process.pid, born, marker)
    with suppress(Exception):
        await process.stdin.aclose()
    with anyio.move_on_after(_GRACE_S):
        await process.wait()
    if process.returncode is None:
        with suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        with anyio.move_on_after(_GRACE_S):
            await process.wait()
    kill_processes(started | tree(None, None, marker))  # (and any it started meanwhile)
    with suppress(Exception):
        await process.aclose()
