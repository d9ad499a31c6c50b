"""benchmax/MCP-v0 against servers that answer in every shape MCP allows, and some it does not:
every content kind, replies that are not MCP or cannot be read, tool names the call formats
cannot carry, names shared across servers, tool lists over several pages, requests the client
must refuse, and secrets in a server's configuration."""

import json
import sys
import textwrap

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.formats import get_format


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


# A server written with the SDK's low-level Server: it sends whatever it is told to.
SDK_SERVER = textwrap.dedent('''
    import asyncio, base64, json, sys
    import mcp_types as types
    import mcp.server.stdio
    from mcp.server.lowlevel.server import Server

    names, page = json.loads(sys.argv[1]), int(sys.argv[2])
    BIG = base64.b64encode(bytes(3_000_000)).decode()
    text = lambda t: [types.TextContent(type="text", text=t)]
    image = types.ImageContent(type="image", data=BIG, mime_type="image/png")
    audio = types.AudioContent(type="audio", data=BIG, mime_type="audio/wav")
    RESULTS = {
        "image": lambda: types.CallToolResult(content=[image]),
        "audio": lambda: types.CallToolResult(content=[audio]),
        "text_resource": lambda: types.CallToolResult(content=[types.EmbeddedResource(type="resource",
            resource=types.TextResourceContents(uri="file:///a.txt", text="the resource's text"))]),
        "blob_resource": lambda: types.CallToolResult(content=[types.EmbeddedResource(type="resource",
            resource=types.BlobResourceContents(uri="file:///a.bin", blob=BIG))]),
        "link": lambda: types.CallToolResult(
            content=[types.ResourceLink(type="resource_link", uri="file:///b.txt", name="b")]),
        "empty": lambda: types.CallToolResult(content=[]),
        "structured": lambda: types.CallToolResult(content=[], structured_content={"temp": 21.5, "unit": "C"}),
        "structured_and_text": lambda: types.CallToolResult(content=text("21.5 C"), structured_content={"temp": 21.5}),
        "error_text": lambda: types.CallToolResult(content=text("no such city"), is_error=True),
        "error_empty": lambda: types.CallToolResult(content=[], is_error=True),
    }

    async def list_tools(ctx, params):
        start = int(params.cursor) if params and params.cursor else 0
        tools = [types.Tool(name=n, input_schema={"type": "object"}) for n in names[start:start + page]]
        more = start + page < len(names)
        return types.ListToolsResult(tools=tools, next_cursor=str(start + page) if more else None)

    async def call_tool(ctx, params):
        if params.name in RESULTS:
            return RESULTS[params.name]()
        return types.CallToolResult(content=text(f"called {params.name}"))

    server = Server("sdk", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main():
        async with mcp.server.stdio.stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    asyncio.run(main())
''')

CONTENT_KINDS = ["image", "audio", "text_resource", "blob_resource", "link", "empty", "structured",
                 "structured_and_text", "error_text", "error_empty"]


@pytest.fixture
def sdk_server(tmp_path):
    path = tmp_path / "sdk_server.py"
    path.write_text(SDK_SERVER)
    return lambda names, page=1000: {"command": sys.executable, "args": [str(path), json.dumps(names), str(page)]}


def make(server, **kwargs):
    return gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": "p"}], reward=lambda completion: 0.0,
                    max_turns=50, **kwargs)


def test_every_content_kind_reaches_the_observation_as_text_without_its_data(sdk_server):
    env = make(sdk_server(CONTENT_KINDS))
    env.reset(seed=0)
    seen = {}
    for kind in CONTENT_KINDS:
        obs, _, terminated, truncated, info = env.step(call(kind))
        seen[kind] = (info["error"], info["messages"][0]["content"])
        assert not (terminated or truncated) and len(obs) < 300 and "AAAA" not in obs  # no 4 MB of base64
    assert seen["image"] == (None, "[image: image/png, 4000000 base64 characters]")
    assert seen["audio"] == (None, "[audio: audio/wav, 4000000 base64 characters]")
    assert seen["text_resource"] == (None, "the resource's text")
    assert seen["blob_resource"] == (None, "[resource: file:///a.bin]")
    assert seen["link"] == (None, "[resource: file:///b.txt]")
    assert seen["empty"] == (None, "")
    assert seen["structured"] == (None, '{"temp": 21.5, "unit": "C"}')  # structured content when there is no text
    assert seen["structured_and_text"] == (None, "21.5 C")
    assert seen["error_text"][0] == "tool_error" and "no such city" in seen["error_text"][1]
    assert seen["error_empty"][0] == "tool_error" and "'error_empty' reported an error" in seen["error_empty"][1]
    env.close()


# A server that speaks JSON-RPC by hand: it sends what the SDK's servers refuse to.
RAW_SERVER = textwrap.dedent('''
    import json, sys
    mode, count = sys.argv[1], [0]
    deep = {}
    for _ in range(300):
        deep = {"a": deep}
    NAMES = ("video", "no_content", "deep", "bad_utf8", "bump")
    TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in NAMES]
    if mode == "string_schema":
        TOOLS[0]["inputSchema"] = {"type": "string"}
    if mode == "deep_schema":
        TOOLS[0]["inputSchema"] = {"type": "object", "properties": {"a": deep}}
    if mode == "dict_type":
        TOOLS[0]["inputSchema"] = {"type": "object", "properties": {"a": {"type": "dict"}}}
    RESULTS = {"video": {"content": [{"type": "video", "data": "AAAA"}]}, "no_content": {},
               "deep": {"content": [{"type": "text", "text": "deep"}], "structuredContent": deep}}
    for line in sys.stdin:
        msg = json.loads(line)
        mid, method = msg.get("id"), msg.get("method")
        if mid is None:
            continue
        if method == "initialize":
            out = {"result": {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                              "serverInfo": {"name": "raw", "version": "0"}}}
        elif method == "tools/list":
            out = {"result": {"tools": TOOLS}}
        elif method == "tools/call" and msg["params"]["name"] == "bad_utf8":
            sys.stdout.buffer.write(b'{"jsonrpc": "2.0", "id": %d, "result": {"content": '
                                    b'[{"type": "text", "text": "\\xff\\xfe"}]}}\\n' % mid)
            sys.stdout.flush()
            continue
        elif method == "tools/call" and msg["params"]["name"] == "bump":
            count[0] += 1
            out = {"result": {"content": [{"type": "text", "text": f"count {count[0]}"}]}}
        elif method == "tools/call":
            out = {"result": RESULTS[msg["params"]["name"]]}
        else:
            out = {"error": {"code": -32601, "message": "no " + str(method)}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, **out}) + "\\n")
        sys.stdout.flush()
''')


@pytest.fixture
def raw_server(tmp_path):
    path = tmp_path / "raw_server.py"
    path.write_text(RAW_SERVER)
    return lambda mode: {"command": sys.executable, "args": [str(path), mode]}


def test_a_reply_that_is_not_mcp_or_cannot_be_read_is_a_tool_error_and_the_server_keeps_its_state(raw_server):
    """An unknown content type, a result without content, JSON nested deeper than the SDK reads,
    bytes that are not UTF-8: the call's tool_error at once (they were taken for a crashed
    server, restarted with its state lost, or waited out to the timeout and the server killed),
    in one line, and the same server goes on."""
    env = make(raw_server("ok"), tool_timeout=5)
    env.reset(seed=0)
    assert "count 1" in env.step(call("bump"))[0]
    says = {"video": "not a valid CallToolResult: content.0", "no_content": "not a valid CallToolResult: content",
            "deep": "could not be read: Invalid JSON: recursion limit exceeded", "bad_utf8": "could not be read"}
    for n, (tool, said) in enumerate(says.items(), start=2):
        obs, reward, terminated, truncated, info = env.step(call(tool))
        assert info["error"] == "tool_error" and said in obs and not (terminated or truncated), obs
        assert "input_value" not in obs and "validation error" not in obs  # not pydantic's dump
        assert f"count {n}" in env.step(call("bump"))[0]  # the same process, its state kept
    assert env.unwrapped.connections["server"].starts == 1
    env.close()


@pytest.mark.parametrize("mode, says", [
    ("string_schema", "^MCP server 'catalogue' could not list its tools: not a valid ListToolsResult: "
                      "tools.0.inputSchema.type: Input should be 'object'$"),
    ("deep_schema", "^MCP server 'catalogue' could not list its tools: the server's reply could not be read: "
                    "Invalid JSON: recursion limit exceeded"),  # (it waited out init_timeout)
    ("dict_type", r"^tool 'video': .* unknown type 'dict'.* \(a tool of the MCP server 'catalogue'\)$"),
])
def test_a_tool_list_that_is_not_mcp_fails_the_reset_naming_the_server(raw_server, mode, says):
    env = make({"mcpServers": {"catalogue": raw_server(mode)}}, init_timeout=20)
    with pytest.raises((RuntimeError, ValueError), match=says):
        env.reset(seed=0)
    env.close()


@pytest.mark.parametrize("tool_format", ["hermes", "xml", "openai"])
def test_tool_names_the_call_formats_cannot_carry_are_renamed_and_reach_their_tool(sdk_server, tool_format):
    names = ["get weather", "x>y", "a\nb", "</tool_call>", "", "list.files-v2"]
    env = make(sdk_server(names), tool_format=tool_format)
    _, info = env.reset(seed=0)
    exposed = [t["function"]["name"] for t in info["tools"]]
    assert exposed == ["get_weather", "x_y", "a_b", "__tool_call_", "tool", "list.files-v2"]
    fmt = get_format(tool_format)
    for shown, remote in zip(exposed, names):
        _, _, _, _, info = env.step(fmt.render_calls([(shown, {})]))
        assert info["error"] is None and info["messages"][0]["content"] == f"called {remote}", (shown, info)
    env.close()


def test_tool_names_shared_across_servers_never_clash(sdk_server):
    """``left`` has a tool named like the prefixed name of its other one: both are kept, the
    tool's own name first; one server listing a name twice fails the reset naming it."""
    env = make({"mcpServers": {"left": sdk_server(["x", "left__x"]), "right": sdk_server(["x", "y"])}})
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["left__x_2", "left__x", "right__x", "y"]
    for shown, said in [("left__x", "called left__x"), ("left__x_2", "called x"), ("right__x", "called x")]:
        assert said in env.step(call(shown))[0]
    env.close()
    env = make({"mcpServers": {"twice": sdk_server(["x", "x"])}})
    with pytest.raises(RuntimeError, match="MCP server 'twice' lists two tools named 'x'"):
        env.reset(seed=0)
    env.close()


def test_many_tools_over_several_pages_are_all_seen(sdk_server):
    names = [f"tool_{i}" for i in range(25)]
    env = make(sdk_server(names, page=10))
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == names
    assert "called tool_24" in env.step(call("tool_24"))[0]
    env.close()


ASKING_SERVER = textwrap.dedent('''
    import warnings
    warnings.simplefilter("ignore")
    import mcp_types as types
    from mcp.server.mcpserver import Context, MCPServer
    from pydantic import BaseModel

    server = MCPServer("asking")

    class Name(BaseModel):
        name: str

    @server.tool()
    async def sample(ctx: Context) -> str:
        """Ask the client's model."""
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))
        return f"sampled {await ctx.session.create_message([message], max_tokens=5)}"

    @server.tool()
    async def elicit(ctx: Context) -> str:
        """Ask the user."""
        return f"elicited {await ctx.elicit('your name?', Name)}"

    @server.tool()
    async def roots(ctx: Context) -> str:
        """Ask for the client's roots."""
        return f"roots {await ctx.session.list_roots()}"

    @server.tool()
    async def chatter(n: int, ctx: Context) -> str:
        """Log, report progress and announce a changed tool list, n times each."""
        for i in range(n):
            await ctx.log("info", "working " + "." * 200)
            await ctx.report_progress(i, n)
            await ctx.session.send_tool_list_changed()
        return "done chattering"

    server.run()
''')


def test_requests_for_sampling_elicitation_and_roots_are_refused_and_chatter_is_ignored(tmp_path):
    path = tmp_path / "asking_server.py"
    path.write_text(ASKING_SERVER)
    env = make({"command": sys.executable, "args": [str(path)]}, tool_timeout=60)
    _, info = env.reset(seed=0)
    for tool in ("sample", "elicit", "roots"):
        obs, _, terminated, truncated, info = env.step(call(tool))
        assert info["error"] == "tool_error" and not (terminated or truncated), obs  # refused, not hung
    obs, _, _, _, info = env.step(call("chatter", n=2000))
    assert info["error"] is None and "done chattering" in obs and "working" not in obs
    env.close()


def test_a_secret_in_a_servers_env_is_not_in_its_configuration_error():
    with pytest.raises(ValueError, match=r"server 'server': 'env' .* 'PORT'") as raised:
        gym.make("benchmax/MCP-v0", server={"command": sys.executable, "env": {"API_KEY": "sk-live-123", "PORT": 8080}},
                 tasks=[{"prompt": "p"}], reward=lambda completion: 0.0)
    assert "sk-live-123" not in str(raised.value) and "8080" not in str(raised.value)
