"""benchmax/MCP-v0 against servers that misbehave in ways the other MCP tests do not cover: a URL
token that must reach the server but no log line, short credentials quoted back, an input schema
too large to check, a tool list that changes when the server restarts, and an event stream that
asks the client to wait an hour before reconnecting."""

import http.server
import json
import logging
import sys
import textwrap
import threading
from urllib.parse import parse_qs, urlparse

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tools import ToolSchemaError


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def make(server, **kwargs):
    return gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": "do it"}], reward=lambda completion: 0.0,
                    **kwargs)


class Handler(http.server.BaseHTTPRequestHandler):
    """Just enough streamable HTTP (handshake era, JSON replies) for three tools: ``whoami``
    says whether the URL's ``api_key`` arrived and quotes its ``X-Api-Key`` header back in an
    error; ``resumable`` answers with an event stream that ends before the answer, asking the
    client to reconnect after ``retry:`` ms, and the reconnection (a GET with Last-Event-ID)
    gets the answer."""

    protocol_version = "HTTP/1.1"
    line_end, retry = "\n", "3600000"
    pending = None  # the id of the call the resumed stream answers

    def log_message(self, *args):
        pass

    def reply(self, body, content_type="application/json", status=200):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def stream(self, *fields):
        nl = Handler.line_end
        self.reply("".join(f"{field}{nl}" for field in fields).encode() + nl.encode(), "text/event-stream")

    def do_GET(self):  # noqa: N802
        if self.headers.get("Last-Event-ID") != "e1" or Handler.pending is None:
            return self.reply(b"", status=405)
        answer = {"jsonrpc": "2.0", "id": Handler.pending,
                  "result": {"content": [{"type": "text", "text": "resumed " + "r" * 200_000}]}}
        self.stream("id: e2", "event: message", "data: " + json.dumps(answer))

    def do_DELETE(self):  # noqa: N802
        self.reply(b"")

    def do_POST(self):  # noqa: N802
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mid, method = msg.get("id"), msg.get("method")
        answer = lambda out: self.reply(json.dumps({"jsonrpc": "2.0", "id": mid, **out}).encode())  # noqa: E731
        if mid is None:
            return self.reply(b"", status=202)
        if method == "initialize":
            return answer({"result": {"protocolVersion": msg["params"]["protocolVersion"],
                                      "capabilities": {"tools": {}}, "serverInfo": {"name": "misbehaving", "version": "0"}}})
        if method == "tools/list":
            tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ("whoami", "resumable")]
            return answer({"result": {"tools": tools}})
        if method != "tools/call":
            return answer({"error": {"code": -32601, "message": f"no {method}"}})
        if msg["params"]["name"] == "whoami":
            key = parse_qs(urlparse(self.path).query).get("api_key")
            header = self.headers.get("X-Api-Key")
            said = (f"api_key {'arrived' if key == ['tok-s3cret-2'] else 'missing'}; refused X-Api-Key: {header}, "
                    f"{{'x-api-key': '{header}'}}; a tab about an abbey")
            return answer({"result": {"content": [{"type": "text", "text": said}], "isError": True}})
        Handler.pending = mid
        self.stream("id: e1", f"retry: {Handler.retry}", "data: ")  # a priming event, then the stream ends


@pytest.fixture
def url(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 directly, never through a proxy
    Handler.pending = None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    server.shutdown()
    server.server_close()
    thread.join(5)


# -- 1. a URL's query token -----------------------------------------------------------------------

def test_a_url_query_token_reaches_the_server_but_no_log_line_even_at_debug(url, caplog):
    """httpx2 logs each request's URL at INFO and the SDK its endpoint at DEBUG: the token was in both."""
    caplog.set_level(logging.DEBUG)
    env = make({"url": url + "?api_key=tok-s3cret-2&page=2", "headers": {"X-Api-Key": "key-s3cret-4"}})
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("whoami"))
    env.close()
    assert info["error"] == "tool_error" and "api_key arrived" in obs, obs  # sent with every request
    assert "HTTP Request: POST" in caplog.text  # (the log this is about was on)
    assert "tok-s3cret-2" not in caplog.text and "key-s3cret-4" not in caplog.text


# -- 2. short credentials -------------------------------------------------------------------------

def test_a_short_header_value_is_blanked_where_it_follows_its_name_and_nowhere_else(url):
    """A value under 4 characters was never blanked; blanking every 'ab' would garble the message."""
    env = make({"url": url, "headers": {"X-Api-Key": "ab"}})
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("whoami"))
    env.close()
    assert info["error"] == "tool_error"
    assert "refused X-Api-Key: ***, {'x-api-key': '***'}; a tab about an abbey" in obs, obs


@pytest.mark.parametrize("server, message, shown", [
    ({"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer xy"}},
     "got Authorization: Bearer xy, i.e. token xy (Bearer xy)", "got Authorization: ***, i.e. token xy (***)"),
    ("http://127.0.0.1:9/mcp?token=q1&x=q1", "denied token=q1 (x=q1)", "denied token=*** (x=q1)"),
    ("http://me:pw@127.0.0.1:9/mcp", "login me:pw failed; pwd ok", "login me:*** failed; pwd ok"),
])
def test_short_credentials_in_a_servers_words_are_blanked_after_their_names(server, message, shown):
    spec = make(server).unwrapped.connections["server"].spec
    assert spec.redact(message) == shown


# -- 3. an input schema too large to check --------------------------------------------------------

SCHEMA_SERVER = textwrap.dedent('''
    import asyncio, sys
    import mcp_types as types
    import mcp.server.stdio
    from mcp.server.lowlevel.server import Server

    count = int(sys.argv[1])  # arguments of the "wide" tool, each about 150 characters of schema
    wide = {"type": "object", "properties": {f"arg_{i}": {"type": "string", "description": "x" * 100,
                                                          "enum": ["a", "b", "c"]} for i in range(count)}}

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name="small", input_schema={"type": "object"}),
                                            types.Tool(name="wide", input_schema=wide)])

    async def call_tool(ctx, params):
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"called {params.name}")])

    server = Server("schemas", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main():
        async with mcp.server.stdio.stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    asyncio.run(main())
''')


def test_an_input_schema_too_large_to_check_fails_the_reset_naming_the_tool_and_server(tmp_path):
    """Checking a 1.5 MB schema against its metaschema held the reset for about 6 s."""
    path = tmp_path / "schema_server.py"
    path.write_text(SCHEMA_SERVER)
    env = make({"mcpServers": {"big": {"command": sys.executable, "args": [str(path), "10000"]}}})
    with pytest.raises(ToolSchemaError) as raised:
        env.reset(seed=0)
    env.close()
    message = str(raised.value)
    assert "tool 'wide' of the MCP server 'big': its input schema is 1," in message, message
    assert "over the 256,000 that are checked" in message, message


def test_an_input_schema_under_the_limit_is_checked_and_used(tmp_path):
    path = tmp_path / "schema_server.py"
    path.write_text(SCHEMA_SERVER)
    env = make({"command": sys.executable, "args": [str(path), "100"]})
    env.reset(seed=0)
    assert "called wide" in env.step(call("wide", arg_0="a"))[0]
    _, _, _, _, info = env.step(call("wide", arg_0="z"))
    assert info["error"] == "bad_arguments"  # checked against the whole schema
    env.close()


# -- 4. a restarted server lists its tools anew ---------------------------------------------------

# Its tools are named for how many times it has started (counted in a file next to it).
STARTS_SERVER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from mcp.server.mcpserver import MCPServer

    count = Path(__file__).with_suffix(".starts")
    starts = int(count.read_text()) + 1 if count.exists() else 1
    count.write_text(str(starts))
    server = MCPServer("starts")

    @server.tool(name=f"tool_v{starts}")
    def tool() -> str:
        return f"run {starts}"

    @server.tool()
    def crash() -> str:
        os._exit(3)

    @server.tool()
    def hang() -> str:
        time.sleep(600)

    server.run()
''')


@pytest.mark.parametrize("how", ["crash", "hang", "restart isolation"])
def test_a_server_that_starts_again_has_its_tools_listed_again(tmp_path, how):
    path = tmp_path / "starts_server.py"
    path.write_text(STARTS_SERVER)
    isolation = "restart" if how == "restart isolation" else "shared"
    env = make({"command": sys.executable, "args": [str(path)]}, tool_timeout=3, isolation=isolation)
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["tool_v1", "crash", "hang"]
    if how != "restart isolation":
        _, _, _, truncated, info = env.step(call(how))
        assert truncated and info["outcome"] == {"crash": "tool_unavailable", "hang": "tool_timeout"}[how], info
    obs, info = env.reset(seed=0)
    new = env.unwrapped.connections["server"].starts
    assert new == 2 and [t["function"]["name"] for t in info["tools"]] == [f"tool_v{new}", "crash", "hang"], obs
    assert f"run {new}" in env.step(call(f"tool_v{new}"))[0]
    env.close()


# -- 5. an event stream's retry: -------------------------------------------------------------------

@pytest.mark.parametrize("line_end, retry", [("\n", "3600000"), ("\r", "3600000"), ("\r\n", "9" * 30)],
                         ids=["LF", "CR", "CRLF-30-digits"])
def test_an_event_streams_huge_retry_is_capped_and_the_call_resumes(url, line_end, retry, monkeypatch):
    """The SDK slept the server's whole retry: (an hour) before reconnecting, so the call could
    only time out, which stops the server and loses its state."""
    monkeypatch.setattr(Handler, "line_end", line_end)
    monkeypatch.setattr(Handler, "retry", retry)
    env = make(url, tool_timeout=60, max_tool_output_chars=1_000_000)
    env.reset(seed=0)
    obs, _, terminated, truncated, info = env.step(call("resumable"))
    assert not (terminated or truncated) and info.get("error") is None, obs
    assert obs.count("r" * 1000) and "resumed " + "r" * 200_000 in obs  # the resumed answer, whole
    assert env.unwrapped.connections["server"].starts == 1
    env.close()


# -- a stdio server's credentials in its own last words -------------------------------------------

KEY_SERVER = textwrap.dedent('''
    import os, sys
    from mcp.server.mcpserver import MCPServer

    if sys.argv[1] == "at start":
        sys.exit(f"401 Unauthorized: invalid API key {os.environ['WEATHER_API_KEY']!r}")
    server = MCPServer("keyed")

    @server.tool()
    def weather() -> str:
        print(f"AuthError: key={os.environ['WEATHER_API_KEY']} was revoked", file=sys.stderr, flush=True)
        os._exit(1)

    server.run()
''')


@pytest.mark.parametrize("when", ["at start", "mid-episode"])
def test_a_stdio_server_printing_its_api_key_as_it_dies_is_quoted_without_it(tmp_path, caplog, when):
    """Its stderr is quoted in the error (the reset's, or the observation of the call that
    crashed it) and logged at DEBUG: a credential-named env value went into both."""
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "key_server.py"
    path.write_text(KEY_SERVER)
    env = make({"command": sys.executable, "args": [str(path), when],
                "env": {"WEATHER_API_KEY": "wx-s3cret-5", "UNITS": "metric"}})
    if when == "at start":
        with pytest.raises(RuntimeError) as raised:
            env.reset(seed=0)
        said = str(raised.value)
        assert "invalid API key '***'" in said, said
    else:
        env.reset(seed=0)
        said, _, _, _, info = env.step(call("weather"))
        assert info["outcome"] == "tool_unavailable" and "AuthError: key=*** was revoked" in said, said
    env.close()
    assert "wx-s3cret-5" not in said and "wx-s3cret-5" not in caplog.text
