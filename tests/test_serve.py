"""`benchmax-gym mcp-serve`: our toolsets driven by the official SDK client, as any agent would."""

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

CLI = [sys.executable, "-m", "benchmax_gym.cli"]

sys.path.insert(0, str(Path(__file__).resolve().parent))
import snooping  # noqa: E402
from cli_in_process import run_in_process  # noqa: E402


def text(result):
    return "\n".join(block.text for block in result.content)


def test_stdio_math_tools():
    async def main():
        async with Client(StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp-serve", "benchmax/Math-v0"])) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            ok = await client.call_tool("calculator", {"expression": "6*7"})
            bad = await client.call_tool("calculator", {"expression": 7})
            return names, ok, bad

    names, ok, bad = asyncio.run(main())
    assert names[0] == "calculator"
    assert text(ok) == "42" and not ok.is_error
    assert bad.is_error and "bad arguments" in text(bad)


@pytest.fixture
def excel_server(http_server):
    return http_server(lambda port: [*CLI, "mcp-serve", "benchmax/Excel-v0", "--transport", "http",
                                     "--port", str(port), "--env-arg", "python_tool=false"])


def test_http_sessions_get_separate_workspaces(excel_server):
    # Sessions (mcp-session-id) exist in the initialize-handshake era, which the server keeps every
    # client to (tests/test_serve_modern_clients.py: default clients fall back to it).
    async def main():
        async with Client(excel_server, mode="legacy") as first, Client(excel_server, mode="legacy") as second:
            sheets = json.loads(text(await first.call_tool("list_sheets", {})))
            sheet = sheets[0]["name"]
            wrote = await first.call_tool("write_cells", {"sheet": sheet, "cells": {"Z1": "only in session one"}})
            mine = await first.call_tool("read_range", {"sheet": sheet, "range": "Z1"})
            theirs = await second.call_tool("read_range", {"sheet": sheet, "range": "Z1"})
            return wrote, mine, theirs

    wrote, mine, theirs = asyncio.run(main())
    assert not wrote.is_error
    assert "only in session one" in text(mine)
    assert "only in session one" not in text(theirs) and "empty" in text(theirs)


def test_http_default_client_works(excel_server):
    """The SDK's default client (``mode="auto"``) probes the modern protocol, is refused, and
    works through the handshake it falls back to."""
    async def main():
        async with Client(excel_server) as client:
            return [t.name for t in (await client.list_tools()).tools], await client.call_tool("list_sheets", {})

    names, sheets = asyncio.run(main())
    assert names == ["list_sheets", "read_range", "write_cells"] and not sheets.is_error


def test_unknown_env_id_is_a_clear_error():
    out = subprocess.run([*CLI, "mcp-serve", "benchmax/Nope-v0"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "benchmax-gym list" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "env_id, tool, arguments, expect",
    [
        ("benchmax/CRM-v0", "query", {"sql": 'SELECT COUNT(*) AS open_cases FROM "Case"'}, "open_cases"),
        ("benchmax/Wikipedia-v0", "search", {"query": "Paris", "limit": 3}, "Paris"),
    ],
)
def test_every_family_serves_its_tools(env_id, tool, arguments, expect):
    from benchmax_gym.serve import build_server

    server = build_server(env_id)

    async def main():
        async with Client(server) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            return names, await client.call_tool(tool, arguments)

    try:
        names, result = asyncio.run(main())
    finally:
        server.sessions.close()
    assert tool in names and not result.is_error and expect in text(result)


# -- mcp-serve --transport http: its URL, session lifetimes, a session cap, a bearer token ----------

URL = re.compile(r"http://127\.0\.0\.1:\d+/mcp")
PYTHON = {"code": "print(6 * 7)"}


class Served:
    """An `mcp-serve --transport http --port 0` process: its printed URL and its stderr so far."""

    def __init__(self, *args, env=None, timeout=60, max_files=None):
        def limit_files():  # (in the server's process only)
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))

        self.proc = subprocess.Popen([*CLI, "mcp-serve", *args, "--transport", "http", "--port", "0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, preexec_fn=limit_files if max_files else None)
        self.lines, self.urls = [], queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()  # a full pipe would block the server
        try:
            self.url = self.urls.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise AssertionError(f"no URL on stderr within {timeout} s; stderr: {''.join(self.lines)[-2000:]}")

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if (found := URL.search(line)) is not None:
                self.urls.put(found.group())

    def sandboxes(self):
        """Live descendant processes (each session's environment runs a sandbox for python)."""
        alive = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        return alive

    def wait_for(self, count, timeout=60):
        deadline = time.monotonic() + timeout
        while len(self.sandboxes()) != count and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(self.sandboxes())

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def serve():
    started = []

    def start(*args, **kwargs):
        started.append(Served(*args, **kwargs))
        return started[-1]

    yield start
    for served in started:
        served.close()


async def use_python(url, **kwargs):
    async with Client(url, mode="legacy", **kwargs) as client:
        result = await client.call_tool("python", PYTHON)
        assert "42" in text(result), text(result)


def test_http_prints_its_url_once_listening(serve):
    served = serve("benchmax/Math-v0", "--env-arg", "python_tool=false")
    assert sum(bool(URL.search(line)) for line in served.lines) == 1

    async def main():
        async with Client(served.url, mode="legacy") as client:
            return await client.call_tool("calculator", {"expression": "6*7"})

    assert text(asyncio.run(main())) == "42"


def test_http_frees_a_sessions_environment_when_the_session_ends(serve):
    served = serve("benchmax/Math-v0")
    idle = len(served.sandboxes())
    for _ in range(6):  # one after another: each one's sandbox is gone once it closes (DELETE)
        asyncio.run(use_python(served.url))
        assert served.wait_for(idle) == idle

    async def together():
        async with Client(served.url, mode="legacy") as a, Client(served.url, mode="legacy") as b:
            for client in (a, b):
                await client.call_tool("python", PYTHON)
            return len(served.sandboxes())

    assert asyncio.run(together()) > idle
    assert served.wait_for(idle) == idle


def test_http_a_session_never_sees_another_sessions_code_or_output(serve):
    """Every session's python calls share the server's one sandbox server: a call's code must not
    find another session's code or output in its memory, neither after that session's call nor
    while it runs. Before issue 27 item 1 the code's frames reached the server's main loop and
    ``finish()``, which held the other session's last code and output."""
    snooping.need_bubblewrap()
    served = serve("benchmax/Math-v0")

    async def main():
        async with Client(served.url, mode="legacy") as a, Client(served.url, mode="legacy") as b:
            def python(client):
                async def run(code):
                    result = await client.call_tool("python", {"code": code})
                    assert not result.is_error, text(result)
                    return text(result)
                return run

            return await snooping.two_episodes(python(a), python(b))

    assert asyncio.run(asyncio.wait_for(main(), 240)) == {"after": [], "during": []}


CLIENT_THEN_VANISH = """
import asyncio, os, sys
from mcp import Client

async def main():
    async with Client(sys.argv[1], mode="legacy") as client:
        await client.call_tool("python", {"code": "print(1)"})
        print("called", flush=True)
        os._exit(0)  # gone without ending its session (no DELETE)

asyncio.run(main())
"""


def test_http_frees_an_abandoned_sessions_environment_after_the_idle_timeout(serve):
    served = serve("benchmax/Math-v0", "--idle-timeout", "2")
    idle = len(served.sandboxes())
    out = subprocess.run([sys.executable, "-c", CLIENT_THEN_VANISH, served.url], capture_output=True, text=True,
                         timeout=120)
    assert "called" in out.stdout, out.stderr
    assert served.wait_for(idle) == idle


def test_http_session_cap_is_a_clear_error(serve):
    served = serve("benchmax/Math-v0", "--env-arg", "python_tool=false", "--max-sessions", "2")

    async def main():
        async with Client(served.url, mode="legacy") as a, Client(served.url, mode="legacy") as b:
            await a.list_tools()
            await b.list_tools()
            with pytest.raises(Exception) as refused:
                async with Client(served.url, mode="legacy") as c:
                    await c.list_tools()
        async with Client(served.url, mode="legacy") as c:  # room again once they ended
            ok = await c.call_tool("calculator", {"expression": "1+1"})
        return refused.value, ok

    refused, ok = asyncio.run(main())
    assert "Too many open sessions" in repr(refused) or "Too many open sessions" in str(refused)
    assert text(ok) == "2"


def test_http_bearer_token(serve):
    served = serve("benchmax/Math-v0", "--env-arg", "python_tool=false", env={"BENCHMAX_GYM_MCP_TOKEN": "s3cret"})
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()

    def status(token):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(served.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert status(None) == 401 and status("wrong") == 401 and status("s3cret") == 200

    async def main(token):
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(served.url, http_client=http), mode="legacy") as client:
            return await client.call_tool("calculator", {"expression": "6*7"})

    assert text(asyncio.run(main("s3cret"))) == "42"
    with pytest.raises(Exception):
        asyncio.run(main("wrong"))


def initialize_status(url, token, timeout=30):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_half_open_connections_do_not_starve_a_client_with_the_token(serve):
    """Slowloris: 400 connections that send part of their headers and stop, against a server
    allowed 256 open files (the token is checked only once headers are in). The oldest half-open
    ones are closed as new ones come, so a client with the token is served all the same."""
    import socket

    served = serve("benchmax/Math-v0", "--env-arg", "python_tool=false", "--auth-token", "s3cret", max_files=256)
    port = int(served.url.rsplit(":", 1)[1].split("/")[0])
    half_open = []
    try:
        for _ in range(400):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            half_open.append(sock)
        assert initialize_status(served.url, "s3cret") == 200
        open_now = 0
        for sock in half_open:
            sock.settimeout(0.01)
            try:
                open_now += sock.recv(1) != b""
            except TimeoutError:
                open_now += 1
            except OSError:
                pass
        from benchmax_gym.serve import MAX_HEADERLESS

        assert open_now <= MAX_HEADERLESS
    finally:
        for sock in half_open:
            sock.close()


def test_a_connection_gets_a_deadline_for_its_headers_and_a_refused_one_is_closed():
    """In-process, on a real uvicorn with a 1 s header deadline: a peer that trickles its headers
    is cut off at the deadline (not reset by each byte), one that sends them in time is served,
    and a request refused for its token closes the connection (no second request to trickle)."""
    import socket

    import uvicorn
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    from benchmax_gym.serve import BearerToken, headers_first

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(BearerToken(app, "s3cret"), host="127.0.0.1", port=0, log_level="warning",
                            http=headers_first(import_from_string(HTTP_PROTOCOLS["auto"]), timeout=1.0))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and server.servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        trickler = socket.create_connection(("127.0.0.1", port), timeout=10)
        sent = 0
        trickle = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"x" * 100  # never ends its headers
        try:
            for byte in trickle:
                trickler.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)
        except OSError:
            pass
        trickler.close()
        assert sent < len(trickle)  # cut off (after about 1 s), though each byte came within 0.1 s of the last

        good = socket.create_connection(("127.0.0.1", port), timeout=10)
        good.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\r\n\r\n")
        assert good.recv(1000).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # past the header deadline: a connection with its headers in is left alone
        good.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\r\n\r\n")
        assert good.recv(1000).startswith(b"HTTP/1.1 200")
        good.close()

        refused = socket.create_connection(("127.0.0.1", port), timeout=10)
        refused.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while chunk := refused.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower()
        refused.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_http_auth_token_flag_and_bad_options(serve):
    served = serve("benchmax/Math-v0", "--env-arg", "python_tool=false", "--auth-token", "flag-token")
    request = urllib.request.Request(served.url, data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    for bad, says in ((["--max-sessions", "0"], "--max-sessions"), (["--idle-timeout", "-1"], "--idle-timeout")):
        # (the CLI's main in this process: the words and status; a fresh process's are test_unknown_env_id's)
        out = run_in_process("mcp-serve", "benchmax/Math-v0", "--transport", "http", *bad)
        assert out.returncode != 0 and says in out.stderr and "Traceback" not in out.stderr, (bad, out.stderr)


def test_a_failure_that_is_not_the_models_travels_as_its_outcome(tmp_path):
    """Issue 29 over MCP: live Wikipedia failing past its retries is ``tool_unavailable`` in the
    result's ``_meta``; MCP-v0 playing that server ends its episode with it (reward NaN); a model's
    own mistake (an unknown article) stays a plain tool error, with no outcome."""
    import math

    import gymnasium as gym

    import benchmax_gym
    from benchmax_gym.envs.wikipedia.tasks import encyclopedia
    from benchmax_gym.serve import OUTCOME_META, build_server
    from benchmax_gym.testing.mediawiki import MediaWikiStub

    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps([{"Question": "Where does the Limmat flow?", "Answer": "Zürich"}]))
    live = {"backend": "live", "tasks": "bamboogle", "task_args": {"dataset": str(questions)}}
    with MediaWikiStub(encyclopedia(0, 50).records) as wiki:
        server = build_server("benchmax/Wikipedia-v0", {**live, "backend_args": {"api_url": wiki.api_url, "max_retries": 0}})

        async def main():
            async with Client(server) as client:
                missing = await client.call_tool("get_article", {"title": "No Such Article Here"})
                wiki.fail_next = [(503, {})] * 3
                failed = await client.call_tool("get_article", {"title": "Paris"})
                return missing, failed

        try:
            missing, failed = asyncio.run(main())
        finally:
            server.sessions.close()
        assert missing.is_error and not (missing.meta or {}).get(OUTCOME_META)
        assert failed.is_error and failed.meta[OUTCOME_META] == "tool_unavailable" and "unavailable" in text(failed)

    # MCP-v0 over a served family: the outcome ends the episode on the consumer's side
    with MediaWikiStub(encyclopedia(0, 50).records) as wiki:
        backend_args = json.dumps({"api_url": wiki.api_url, "max_retries": 0})
        spec = {"command": CLI[0], "args": [*CLI[1:], "mcp-serve", "benchmax/Wikipedia-v0", "--env-arg", "backend=live",
                                            "--env-arg", f"backend_args={backend_args}", "--env-arg", "tasks=bamboogle",
                                            "--env-arg", f"task_args.dataset={questions}"],
                "env": {"PYTHONPATH": str(Path(benchmax_gym.__file__).resolve().parents[1])}}  # this code, not an installed one
        env = gym.make("benchmax/MCP-v0", server=spec, tasks=[{"prompt": "p"}], reward=lambda completion: 0.0)
        try:
            env.reset(seed=0)
            wiki.fail_next = [(503, {})] * 3
            obs, reward, terminated, truncated, info = env.step(
                '<tool_call>{"name": "get_article", "arguments": {"title": "Paris"}}</tool_call>')
            assert info["outcome"] == "tool_unavailable", obs
            assert math.isnan(reward) and truncated and not terminated
        finally:
            env.close()


# -- a session's environment that fails to start --------------------------------------------------

FLAKY_SERVER = """
import os, sys
from mcp.server.mcpserver import MCPServer

count = os.path.join(os.path.dirname(os.path.abspath(__file__)), "starts")
n = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(n + 1))
if n == 1:  # the first start (mcp-serve's probe) works, the second fails, the third works again
    sys.exit("transient: backend warming up")
server = MCPServer("flaky")

@server.tool()
def ping() -> str:
    return "pong"

server.run()
"""

FLAKY_ENV = """
import os, sys
import gymnasium as gym

here = os.path.dirname(os.path.abspath(__file__))
gym.register("me/Flaky-v0", entry_point="benchmax_gym.envs.mcp.env:MCPEnv", kwargs=dict(
    server={"command": sys.executable, "args": [os.path.join(here, "flaky_server.py")]},
    tasks=[{"prompt": "p"}], reward=lambda completion: 0.0))
"""


def test_stdio_a_failed_environment_start_is_reported_and_the_next_call_tries_again(tmp_path):
    """A flaky start fails the one call it happens in, with its own message and an outcome: it is
    not kept as the session's environment (every later call failed the same way)."""
    from benchmax_gym.serve import OUTCOME_META

    (tmp_path / "flaky_server.py").write_text(FLAKY_SERVER)
    (tmp_path / "flakyenv.py").write_text(FLAKY_ENV)

    async def main():
        params = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "--import", "flakyenv", "mcp-serve", "me/Flaky-v0"],
                                       cwd=str(tmp_path))
        async with Client(params) as client:
            return [await client.call_tool("ping", {}) for _ in range(3)]

    failed, *later = asyncio.run(main())
    assert failed.is_error and "transient: backend warming up" in text(failed), text(failed)
    assert failed.meta[OUTCOME_META] == "env_error"
    assert [(r.is_error, text(r)) for r in later] == [(False, "pong"), (False, "pong")]
    assert (tmp_path / "starts").read_text() == "3"
