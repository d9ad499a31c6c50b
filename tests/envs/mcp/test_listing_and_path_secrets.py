"""A server's credentials never reach the model through its tool listing, and a token in an HTTP
URL's path (``https://host/mcp/<token>``, as hosted servers hand out) is a credential like a
query's: it connects, and is ``***`` in the listing, results, errors and logs. Before, a
description or schema default quoting the key went into the prompt and ``info["tools"]`` as it
was, and a path token was shown everywhere (httpx2 logs every request's URL at INFO)."""

import json
import logging
import sys
import textwrap

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

KEY = "wx-9fQ2kLm3Zp8Rt4VbXw7Y"  # (letters and digits mixed in a long run: a path segment like it is a token)

LEAKY_SERVER = textwrap.dedent('''
    import os, sys
    from mcp.server.mcpserver import Context, MCPServer

    KEY = sys.argv[2] if len(sys.argv) > 2 else os.environ["WEATHER_API_KEY"]  # HTTP: its path's token
    server = MCPServer("leaky")

    @server.tool(description=f"Today's weather in a city; uses key {KEY} (Authorization: Bearer {KEY}).")
    def weather(city: str, key: str = KEY) -> str:
        return f"sunny in {city}, " + ("with the server's key" if key == KEY else "with another key")

    @server.tool(name=f"by_{KEY}", description="A tool named after the key.")
    def by_key() -> str:
        return "called by its name"

    @server.tool()
    def whereami(ctx: Context) -> str:
        """The path this server was called at."""
        return f"called at {ctx.request_context.request.url.path}"

    if len(sys.argv) > 1:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]),
                   streamable_http_path=f"/mcp/{KEY}")
    else:
        server.run()
''')


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def make(server, **kwargs):
    return gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": "weather?"}], reward=lambda completion: 0.0,
                    **kwargs)


@pytest.fixture
def leaky_server(tmp_path):
    path = tmp_path / "leaky_server.py"
    path.write_text(LEAKY_SERVER)
    return str(path)


@pytest.fixture
def no_proxy(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 directly, never through a proxy


def assert_listing_hidden(env, obs, info):
    """The key is in no part of the prompt or ``info``; the tools show ``***`` where it was, and work."""
    assert KEY not in obs and KEY not in json.dumps(info, default=str), obs
    tools = {t["function"]["name"]: t["function"] for t in info["tools"]}
    assert set(tools) == {"weather", "by____", "whereami"}, tools  # (by_***, in a name's characters)
    weather = tools["weather"]
    assert weather["description"] == "Today's weather in a city; uses key *** (Authorization: Bearer ***).", weather
    assert weather["parameters"]["properties"]["key"]["default"] == "***", weather
    assert weather["parameters"]["required"] == ["city"]
    obs, _, _, _, info = env.step(call("weather", city="Oslo"))  # (the server's default still applies)
    assert info["error"] is None and "sunny in Oslo, with the server's key" in obs, obs
    obs, _, _, _, info = env.step(call("by____"))
    assert info["error"] is None and "called by its name" in obs, obs


def test_a_listing_that_quotes_a_stdio_servers_env_key_is_shown_without_it_and_its_tools_still_work(leaky_server):
    env = make({"command": sys.executable, "args": [leaky_server], "env": {"WEATHER_API_KEY": KEY}})
    try:
        obs, info = env.reset(seed=0)
        assert_listing_hidden(env, obs, info)
    finally:
        env.close()


def test_a_url_path_token_connects_and_is_hidden_from_the_listing_results_and_logs(
        leaky_server, http_server, no_proxy, caplog):
    caplog.set_level(logging.DEBUG)
    url = http_server(lambda port: [sys.executable, leaky_server, str(port), KEY]) + f"/{KEY}"
    env = make(url)
    try:
        obs, info = env.reset(seed=0)  # (the server answers at /mcp/<KEY> only: the real path is used)
        assert_listing_hidden(env, obs, info)
        obs, _, _, _, info = env.step(call("whereami"))
        assert info["error"] is None and "called at /mcp/***" in obs and KEY not in obs, obs
    finally:
        env.close()
    # No URL logged shows the token (httpx2 logs each request's at INFO); the SDK's debug log of the
    # messages themselves (the listing, the calls of by_<KEY>) is the server's, as it sent them.
    assert "/mcp/***" in caplog.text and f"/{KEY}" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and KEY in r.getMessage()]


def test_an_unreachable_servers_path_token_is_hidden_in_its_error_and_the_logs(caplog):
    caplog.set_level(logging.DEBUG)
    env = make(f"http://127.0.0.1:9/mcp/{KEY}/sse?page=2", init_timeout=30)  # (port 9: nothing listens)
    with pytest.raises(RuntimeError) as raised:
        env.reset(seed=0)
    env.close()
    assert str(raised.value).startswith("MCP server 'server' (http://127.0.0.1:9/mcp/***/sse?page=2) failed to start")
    assert KEY not in str(raised.value) and KEY not in caplog.text


@pytest.mark.parametrize("path, shown", [
    ("/mcp", "/mcp"),
    ("/v1/sse", "/v1/sse"),
    ("/api/v2/streamable-http/", "/api/v2/streamable-http/"),
    ("/tenants/acme-2024-production/mcp", "/tenants/acme-2024-production/mcp"),
    ("/@smithery/server-github/mcp", "/@smithery/server-github/mcp"),
    ("/repos/modelcontextprotocol/servers", "/repos/modelcontextprotocol/servers"),
    ("/mcp/3f2a9c1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b/sse", "/mcp/***/sse"),  # a UUID
    ("/api/mcp/s/MmE0YzQ3ZjEtN2Y2Ni00ZDJmLWIxYzM%3D/mcp", "/api/mcp/s/***/mcp"),  # base64, percent-encoded
    ("/u/0123456789abcdef0123456789abcdef", "/u/***"),  # hex
    (f"/mcp/{KEY}/", "/mcp/***/"),
])
def test_a_bad_url_is_named_with_only_its_token_like_path_segments_hidden(path, shown):
    """Ordinary paths are shown as they are; a UUID, or a segment with a long run of letters and
    digits mixed, is a credential."""
    with pytest.raises(ValueError) as raised:
        make("ftp://127.0.0.1" + path)
    assert f"'ftp://127.0.0.1{shown}'" in str(raised.value), str(raised.value)
