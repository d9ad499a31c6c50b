"""A server that echoes its credentials in a successful result: the model sees ``***`` in their
place (it may write what it sees anywhere), and every other value as it is. Errors were already
redacted; a normal result showed the server's Authorization header, its URL's token or its
credential-named env variable as they were."""

import json
import sys
import textwrap

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

ECHO_SERVER = textwrap.dedent('''
    import os, sys
    from mcp.server.mcpserver import Context, MCPServer
    from mcp_types import CallToolResult

    server = MCPServer("echo")
    ENV = ("WEATHER_API_KEY", "GITHUB_TOKEN", "UNITS")
    HEADERS = ("authorization", "x-api-key", "cookie", "x-region")

    def seen(ctx):
        request = ctx.request_context.request
        if request is None:  # stdio: its environment
            return {name: os.environ.get(name) for name in ENV}
        return {"query": request.url.query, **{name: request.headers.get(name) for name in HEADERS}}

    @server.tool()
    def whoami(ctx: Context) -> str:
        """What this server was sent, as text."""
        return "; ".join(f"{name}: {value}" for name, value in seen(ctx).items())

    @server.tool()
    def whoami_structured(ctx: Context) -> CallToolResult:
        """What this server was sent, as structured content only."""
        return CallToolResult(content=[], structured_content=seen(ctx))

    if len(sys.argv) > 1:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
''')


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def observations(server):
    env = gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": "who am I?"}], reward=lambda completion: 0.0)
    try:
        env.reset(seed=0)
        shown = []
        for tool in ("whoami", "whoami_structured"):
            obs, _, _, _, info = env.step(call(tool))
            assert info["error"] is None, obs  # a successful result
            shown.append(obs.split("\n", 1)[1].rsplit("\n", 1)[0])  # (inside <tool_response>)
        return shown
    finally:
        env.close()


@pytest.fixture
def echo_server(tmp_path):
    path = tmp_path / "echo_server.py"
    path.write_text(ECHO_SERVER)
    return str(path)


@pytest.fixture
def no_proxy(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 directly, never through a proxy


def test_an_http_servers_echoed_credential_headers_and_url_token_are_hidden_and_other_headers_shown(
        echo_server, http_server, no_proxy):
    url = http_server(lambda port: [sys.executable, echo_server, str(port)])
    text, structured = observations({"url": url + "?api_key=tok-s3cret-2&page=2", "headers": {
        "Authorization": "Bearer bear-s3cret-1", "X-Api-Key": "ab", "Cookie": "sid=cookie-s3cret-3",
        "X-Region": "us-east-1"}})  # (X-Region is no credential: blanking it would garble the result)
    seen = {"query": "api_key=***&page=2", "authorization": "***", "x-api-key": "***", "cookie": "***",
            "x-region": "us-east-1"}  # (the short key too: it follows its name)
    assert text == "; ".join(f"{name}: {value}" for name, value in seen.items()), text
    assert json.loads(structured) == seen, structured


def test_an_http_servers_echoed_basic_auth_from_the_urls_password_is_hidden(echo_server, http_server, no_proxy):
    """The URL's ``user:password`` goes out as ``Basic base64(user:password)``, as readable as the password."""
    url = http_server(lambda port: [sys.executable, echo_server, str(port)])
    for obs in observations({"url": url.replace("//", "//me:pw-s3cret-4@"), "headers": {"X-Region": "eu-west-2"}}):
        assert "Basic ***" in obs and "eu-west-2" in obs, obs  # (base64 of me:pw-s3cret-4 was shown)


def test_a_stdio_servers_echoed_credential_named_env_values_are_hidden_and_others_shown(echo_server):
    # (the quotes: the structured content is shown as JSON, which writes them \")
    env = {"WEATHER_API_KEY": "wx-\"s3cret\"-5", "GITHUB_TOKEN": "gh", "UNITS": "metric"}
    text, structured = observations({"command": sys.executable, "args": [echo_server], "env": env})
    assert text == "WEATHER_API_KEY: ***; GITHUB_TOKEN: ***; UNITS: metric", text
    assert json.loads(structured) == {"WEATHER_API_KEY": "***", "GITHUB_TOKEN": "***", "UNITS": "metric"}, structured
