"""benchmax/MCP-v0 against servers that list too much, change their tools mid-session, answer
over HTTP with what cannot be read, or are configured with credentials: the task stays whole in
the first observation, a vanished tool fails clearly and the next reset lists the new tools, an
unreadable HTTP reply fails its call at once, and no error message quotes a secret."""

import http.server
import json
import logging
import sys
import textwrap
import threading

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

TASK = "THE TASK: add 2 and 3, then reply with the sum. " + "Keep every word of this task. " * 20


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def make(server, prompt=TASK, **kwargs):
    return gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": prompt}], reward=lambda completion: 0.0,
                    **kwargs)


# -- 1. what a server lists cannot push the task out of the first observation ----------------------

LISTING_SERVER = textwrap.dedent('''
    import asyncio, json, sys
    import mcp_types as types
    import mcp.server.stdio
    from mcp.server.lowlevel.server import Server

    description_chars, count, wide = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "wide"
    tools = [types.Tool(name=f"tool_{i}", description="d" * description_chars, input_schema={"type": "object"})
             for i in range(count)]
    if wide:  # 400 arguments, each with a description: a schema of about 60,000 characters
        properties = {f"arg_{i}": {"type": "integer", "description": "x" * 100} for i in range(400)}
        tools.append(types.Tool(name="wide", description="Many arguments.",
                                input_schema={"type": "object", "properties": properties, "required": ["arg_0"]}))

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx, params):
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"called {params.name}")])

    server = Server("listing", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main():
        async with mcp.server.stdio.stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    asyncio.run(main())
''')


@pytest.fixture
def listing_server(tmp_path):
    path = tmp_path / "listing_server.py"
    path.write_text(LISTING_SERVER)
    return lambda chars, count, wide=False: {"command": sys.executable,
                                             "args": [str(path), str(chars), str(count), "wide" if wide else "-"]}


def test_a_megabyte_description_and_schema_are_cut_with_a_marker_and_the_task_stays_whole(listing_server):
    """A 1.2 MB description pushed the task out of the (1,000,000-character) observation; now each
    description and schema is cut with a marker, and calls are still checked against the whole
    schema (``arg_0`` is required and an integer, though the prompt shows little of it)."""
    env = make(listing_server(1_200_000, 1, wide=True))
    obs, info = env.reset(seed=0)
    assert obs.endswith(TASK) and len(obs) < 50_000
    tool, wide = (t["function"] for t in info["tools"])
    assert tool["description"].startswith("ddd") and "[truncated: " in tool["description"]
    assert len(json.dumps(wide["parameters"])) <= 8_000 and "[input schema cut: " in wide["parameters"]["description"]
    assert wide["parameters"]["properties"]["arg_0"] == {"type": "integer"}
    assert wide["parameters"]["required"] == ["arg_0"]
    _, _, _, _, info = env.step(call("wide", arg_1=1))
    assert info["error"] == "bad_arguments" and "arg_0" in info["messages"][0]["content"]
    assert "called wide" in env.step(call("wide", arg_0=7, arg_399=1))[0]
    env.close()


def test_thousands_of_tools_are_listed_up_to_a_bound_that_the_prompt_names(listing_server):
    env = make(listing_server(100, 3000), max_observation_chars=60_000)
    obs, info = env.reset(seed=0)
    listed = [t["function"]["name"] for t in info["tools"]]
    assert obs.endswith(TASK) and len(obs) <= 60_000
    assert 0 < len(listed) < 3000 and listed == [f"tool_{i}" for i in range(len(listed))]
    assert f"[{3000 - len(listed)} more tools of the MCP servers are not listed" in obs
    assert "called tool_0" in env.step(call("tool_0"))[0]
    env.close()


def test_a_long_task_is_kept_whole_and_the_system_prompt_is_cut_instead(listing_server):
    """Tools within every bound, and a task that fills most of the observation: the system
    prompt gives way, not the task."""
    task = "THE TASK " + "word " * 6_000 + "THE END"
    env = make(listing_server(3_000, 5), prompt=task, max_observation_chars=40_000)
    obs, info = env.reset(seed=0)
    assert obs.endswith(task) and len(obs) <= 40_000 and "[truncated: " in obs
    assert info["messages"][-1]["content"] == task
    env.close()


# -- 2. a server whose tool list changes mid-session ---------------------------------------------

# A handshake-era server written by hand: it announces its change with
# notifications/tools/list_changed, and (badly) still runs a tool it no longer lists.
LEGACY_CHANGING = textwrap.dedent('''
    import json, sys
    listed = ["doomed", "swap"]
    for line in sys.stdin:
        msg = json.loads(line)
        mid, method = msg.get("id"), msg.get("method")
        if mid is None:
            continue
        if method == "initialize":
            out = {"result": {"protocolVersion": msg["params"]["protocolVersion"],
                              "capabilities": {"tools": {"listChanged": True}},
                              "serverInfo": {"name": "legacy", "version": "0"}}}
        elif method == "tools/list":
            out = {"result": {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in listed]}}
        elif method == "tools/call":
            name = msg["params"]["name"]
            if name == "swap":
                listed = ["swap", "extra"]
                sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}) + "\\n")
            text = {"swap": "swapped", "doomed": "still here", "extra": "extra here"}[name]
            out = {"result": {"content": [{"type": "text", "text": text}]}}
        else:
            out = {"error": {"code": -32601, "message": "no " + str(method)}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, **out}) + "\\n")
        sys.stdout.flush()
''')

# A 2026-era server on the SDK: its change reaches the subscriptions/listen stream.
MODERN_CHANGING = textwrap.dedent('''
    import warnings
    warnings.simplefilter("ignore")
    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("modern")

    def extra() -> str:
        """Added by swap."""
        return "extra here"

    @server.tool()
    def doomed() -> str:
        """Removed by swap."""
        return "still here"

    @server.tool()
    async def swap(ctx: Context) -> str:
        """Remove doomed, add extra."""
        server.remove_tool("doomed")
        server.add_tool(extra)
        await ctx.notify_tools_changed()
        return "swapped"

    server.run()
''')


@pytest.mark.parametrize("source", [LEGACY_CHANGING, MODERN_CHANGING], ids=["handshake-era", "2026-era"])
def test_a_changed_tool_list_fails_a_vanished_tool_clearly_and_the_next_reset_lists_the_new_tools(tmp_path, source):
    path = tmp_path / "changing_server.py"
    path.write_text(source)
    env = make({"command": sys.executable, "args": [str(path)]})
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["doomed", "swap"]
    assert "swapped" in env.step(call("swap"))[0]
    obs, _, terminated, truncated, info = env.step(call("doomed"))
    assert info["error"] == "tool_error" and not (terminated or truncated), obs
    assert "'doomed' is gone" in obs and "no longer lists it" in obs and "still here" not in obs
    obs, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["swap", "extra"] and '"extra"' in obs
    assert "extra here" in env.step(call("extra"))[0]
    assert env.unwrapped.connections["server"].starts == 1  # the same server all along
    env.close()


# -- 3 and 4. a loopback HTTP server that answers calls with what cannot be read -----------------

class GarbageHandler(http.server.BaseHTTPRequestHandler):
    """Just enough streamable HTTP to initialize and list tools; each tool answers its call in
    its own broken way, except ``count``, which counts, and ``whoami``, which quotes the
    credentials it was sent in an error."""

    protocol_version = "HTTP/1.1"
    calls = 0
    TOOLS = ["count", "text", "not_json", "other_id", "notification", "sse_garbage", "sse_cut", "huge", "whoami"]

    def log_message(self, *args):
        pass

    def reply(self, body, content_type="application/json", status=200):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - no stream for server-initiated messages
        self.reply(b"", status=405)

    def do_DELETE(self):  # noqa: N802
        self.reply(b"")

    def do_POST(self):  # noqa: N802
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mid, method = msg.get("id"), msg.get("method")
        answer = lambda out: self.reply(json.dumps({"jsonrpc": "2.0", "id": mid, **out}).encode())  # noqa: E731
        if mid is None:
            return self.reply(b"", status=202)
        if method == "initialize":
            return answer({"result": {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                                      "serverInfo": {"name": "garbage", "version": "0"}}})
        if method == "tools/list":
            return answer({"result": {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in self.TOOLS]}})
        if method != "tools/call":
            return answer({"error": {"code": -32601, "message": f"no {method}"}})
        name = msg["params"]["name"]
        if name == "count":
            GarbageHandler.calls += 1
            return answer({"result": {"content": [{"type": "text", "text": f"count {GarbageHandler.calls}"}]}})
        if name == "whoami":
            said = f"refused: {self.headers.get('Authorization')} / {self.headers.get('X-Api-Key')}"
            return answer({"result": {"content": [{"type": "text", "text": said}], "isError": True}})
        if name == "text":
            return self.reply(b"upstream proxy error", "text/plain")
        if name == "not_json":
            return self.reply(b"{not json")
        if name == "other_id":
            return self.reply(json.dumps({"jsonrpc": "2.0", "id": 999, "result": {"content": []}}).encode())
        if name == "notification":
            return self.reply(json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                          "params": {"level": "info", "data": "working"}}).encode())
        if name == "sse_garbage":
            return self.reply(b"event: message\ndata: not json at all\n\n", "text/event-stream")
        if name == "sse_cut":
            cut = b'event: message\ndata: {"jsonrpc": "2.0", "id": ' + str(mid).encode()  # and no more
            return self.reply(cut, "text/event-stream")
        if name == "huge":
            return answer({"result": {"content": [{"type": "text", "text": "x" * 50_000}]}})


@pytest.fixture
def garbage_url(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 directly, never through a proxy
    GarbageHandler.calls = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GarbageHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.parametrize("tool, says", [
    ("text", "its content type is 'text/plain', not JSON or an event stream: b'upstream proxy error'"),
    ("not_json", "it is not JSON (Expecting property name enclosed in double quotes"),
    ("other_id", "it does not answer this request"),  # (the SDK waited for the answer to the timeout)
    ("notification", "it is the server's 'notifications/message' message, not an answer to the call"),
    ("sse_garbage", "Failed to parse SSE message: Invalid JSON: expected ident at line 1 column 2"),
    ("sse_cut", "SSE stream ended without a response"),
    ("huge", "it is over the 0.01 MB limit for one message; it was dropped"),
])
def test_an_unreadable_http_reply_fails_its_call_at_once_in_one_line_and_the_server_keeps_its_state(
        garbage_url, tool, says):
    env = make(garbage_url, tool_timeout=60, max_message_mb=0.01)
    env.reset(seed=0)
    assert "count 1" in env.step(call("count"))[0]
    obs, _, terminated, truncated, info = env.step(call(tool))
    assert info["error"] == "tool_error" and not (terminated or truncated), obs  # not tool_timeout
    assert says in obs and "validation error" not in obs and "input_value" not in obs, obs
    assert len(info["messages"][0]["content"].splitlines()) == 1, obs
    assert "count 2" in env.step(call("count"))[0]  # the same session, its state kept
    assert env.unwrapped.connections["server"].starts == 1
    env.close()


# -- 4. credentials in a server's configuration --------------------------------------------------

SECRETS = ("pw-s3cret-1", "tok-s3cret-2", "hdr-s3cret-3", "key-s3cret-4")


def assert_no_secret(text):
    assert not any(secret in text for secret in SECRETS), text


@pytest.mark.parametrize("server, shown", [
    ("http://user:pw-s3cret-1@/mcp", "'http://user:***@/mcp'"),  # no host
    ("http://pw-s3cret-1@[::1/mcp?token=tok-s3cret-2", "'http://***@[::1/mcp?token=***'"),  # not parseable
    ({"url": "ftp://user:pw-s3cret-1@127.0.0.1/mcp?access_token=tok-s3cret-2&page=2"},
     "'ftp://user:***@127.0.0.1/mcp?access_token=***&page=2'"),
    ("ftp://user:pw-s3cret-1@127.0.0.1/mcp", "'ftp://user:***@127.0.0.1/mcp'"),
    ("http://user:pw-s3cret-1@127.0.0.1:99999/mcp", "'http://user:***@127.0.0.1:99999/mcp': not a valid URL"),
    ("http://user:pw-s3cret-1/mcp", "'http://user:***/mcp': not a valid URL"),  # (its @host left out: no port)
])
def test_a_bad_url_fails_at_make_naming_it_without_its_credentials(server, shown):
    with pytest.raises(ValueError) as raised:
        make(server)
    assert shown in str(raised.value)
    assert_no_secret(str(raised.value))


def test_a_server_that_cannot_be_reached_is_named_without_its_credentials_in_errors_and_logs(caplog):
    caplog.set_level(logging.DEBUG)
    url = "http://user:pw-s3cret-1@127.0.0.1:9/mcp?token=tok-s3cret-2&page=2"  # (port 9: nothing listens)
    server = {"mcpServers": {"remote": {"url": url, "headers": {"Authorization": "Bearer hdr-s3cret-3"}}}}
    env = make(server, init_timeout=30)
    with pytest.raises(RuntimeError) as raised:
        env.reset(seed=0)
    env.close()
    message = str(raised.value)
    assert message.startswith("MCP server 'remote' (http://user:***@127.0.0.1:9/mcp?token=***&page=2) failed to start")
    assert_no_secret(message)
    assert not any(s in caplog.text for s in ("pw-s3cret-1", "hdr-s3cret-3"))  # (nor in the SDK's debug log)


def test_configured_headers_are_sent_and_a_server_quoting_them_back_is_redacted(garbage_url):
    headers = {"Authorization": "Bearer hdr-s3cret-3", "X-Api-Key": "key-s3cret-4"}
    server = {"mcpServers": {"remote": {"url": garbage_url, "type": "http", "headers": headers}}}
    env = make(server)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("whoami"))
    assert info["error"] == "tool_error" and "refused: *** / ***" in obs, obs  # sent (not None), and not shown
    assert_no_secret(obs)
    env.close()


def test_headers_are_checked_at_make_without_showing_their_values(tmp_path):
    with pytest.raises(ValueError, match="'headers' must be a dict of strings to strings") as raised:
        make({"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer hdr-s3cret-3", "X-Retries": 3}})
    assert_no_secret(str(raised.value))
    with pytest.raises(ValueError, match="'headers' are for a streamable-HTTP server's 'url'"):
        make({"command": sys.executable, "headers": {"Authorization": "Bearer hdr-s3cret-3"}})
