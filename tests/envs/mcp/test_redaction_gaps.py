"""A credential a server writes back in another form (JSON- or repr-escaped, percent-encoded,
base64, alone or as ``base64(user:<key>)``) is as readable as the credential: it is ``***`` in
results, errors and the tool listing. Before, only the credential as it was (and JSON-escaped,
non-ASCII kept) was blanked. And a credential nothing finds by its name or shape (a path segment
of letters only, a stdio server's argument) can be named in the server's ``secrets``."""

import base64
import inspect
import json
import logging
import sys
import textwrap
import urllib.parse

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

# quotes, a backslash, non-ASCII, a space, + / ~ ?: each escaping writes it differently (its base64 has a +)
KEY = 'wx-"s3cret"\\ké+/9 ~~?'
TOKEN = "gh-tok_4f9Q2kLm3Zp8Rt4VbXw7Y"  # (JSON-escapes to itself: its base64 in a JSON blob is its own)
PATH_TOKEN = "AbCdEfGhIjKlMnOpQrSt"  # letters only: no heuristic takes it for a token


def forms(key, token):
    """How a server may write its credentials back (the same function runs in the server)."""
    raw = key.encode()
    return {
        "json": json.dumps(key),  # (\\" \\\\ \\u00e9: Python's default)
        "repr": repr(key),
        "bytes": repr(raw),
        "percent": urllib.parse.quote(key, safe=""),
        "path": urllib.parse.quote(key),
        "query": urllib.parse.urlencode({"k": key}),
        "base64": base64.b64encode(raw).decode(),
        "base64url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        # as basic auth, after a user of each length mod 3 (the key's alignment in the base64 differs)
        **{f"basic{n}": base64.b64encode(b"u" * n + b":" + raw).decode() for n in range(3)},
        "blob": base64.urlsafe_b64encode(json.dumps({"api_key": token, "region": "eu"}).encode()).decode(),
    }


FORMS_SERVER = textwrap.dedent('''
    import base64, json, os, urllib.parse
    from mcp.server.mcpserver import MCPServer
    from mcp_types import CallToolResult, TextContent

    KEY, TOKEN = os.environ["WEATHER_API_KEY"], os.environ["GITHUB_TOKEN"]
''') + inspect.getsource(forms) + textwrap.dedent('''
    server = MCPServer("forms")
    SHOWN = forms(KEY, TOKEN)

    @server.tool(description=f"Weather. Sends its key as {SHOWN['base64']} or {SHOWN['percent']}.")
    def weather(city: str, key: str = SHOWN["repr"]) -> str:
        return f"sunny in {city}"

    @server.tool()
    def echo() -> str:
        """Every form of the credentials, a line each, and a value that is none."""
        return "\\n".join([f"{name}: {value}" for name, value in SHOWN.items()] + ["units: metric"])

    @server.tool()
    def fail() -> CallToolResult:
        """An error that quotes them."""
        text = "refused: " + ", ".join(SHOWN.values())
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)

    server.run()
''')

DECLARED_SERVER = textwrap.dedent('''
    import base64, sys
    from mcp.server.mcpserver import Context, MCPServer

    TOKEN = sys.argv[-1]
    if sys.argv[1] == "fail":
        sys.exit(f"refused token {TOKEN}")  # (to stderr, which a start's error quotes)
    server = MCPServer("declared")

    @server.tool(description=f"Calls home with {TOKEN}.")
    def whoami(ctx: Context) -> str:
        """Where this server was called, and its token."""
        request = ctx.request_context.request
        where = request.url.path if request is not None else "stdio"
        return f"at {where} with {TOKEN} ({base64.b64encode(TOKEN.encode()).decode()})"

    if sys.argv[1] == "http":
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]),
                   streamable_http_path=f"/mcp/{TOKEN}")
    else:
        server.run()
''')


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def make(server, **kwargs):
    return gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": "weather?"}], reward=lambda completion: 0.0,
                    **kwargs)


@pytest.fixture
def script(tmp_path):
    def write(source):
        path = tmp_path / "server.py"
        path.write_text(source)
        return str(path)
    return write


@pytest.fixture
def no_proxy(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 directly, never through a proxy


def test_credentials_written_back_escaped_percent_encoded_or_in_base64_are_hidden_everywhere(script):
    shown = forms(KEY, TOKEN)
    assert len(set(shown.values()) | {KEY}) == len(shown) + 1  # (each form differs from the key and the others)
    env = make({"command": sys.executable, "args": [script(FORMS_SERVER)],
                "env": {"WEATHER_API_KEY": KEY, "GITHUB_TOKEN": TOKEN, "UNITS": "metric"}})
    try:
        obs, info = env.reset(seed=0)
        listing = obs + json.dumps(info["tools"], ensure_ascii=False)
        weather = next(t["function"] for t in info["tools"] if t["function"]["name"] == "weather")
        assert weather["description"] == "Weather. Sends its key as ***== or ***.", weather  # (its padding stays)
        assert weather["parameters"]["properties"]["key"]["default"] == "'***'", weather
        echoed, _, _, _, info = env.step(call("echo"))
        assert info["error"] is None, echoed
        failed, _, _, _, info = env.step(call("fail"))
        assert info["error"] is not None and 'refused: "***", ' in failed, failed
    finally:
        env.close()
    for seen in (listing, echoed, failed):
        leaked = [name for name, form in shown.items() if form in seen]
        assert not leaked and KEY not in seen and TOKEN not in seen, (leaked, seen)
    lines = dict(line.split(": ", 1) for line in echoed.split("\n") if ": " in line)
    assert lines["units"] == "metric" and set(lines) == {*shown, "units"}, echoed  # (nothing else blanked)
    for name in shown:  # each form is ***, but for its quotes and the few characters that mix in the bits around it
        left, _, right = lines[name].partition("***")
        most = (20, 28) if name == "blob" else (4, 4)  # (the blob's JSON around the token stays, in base64)
        assert len(left) <= most[0] and len(right.rstrip("=")) <= most[1], (name, lines[name])


def test_a_declared_secret_in_a_urls_path_connects_and_is_hidden_from_the_listing_results_and_logs(
        script, http_server, no_proxy, caplog):
    caplog.set_level(logging.DEBUG)
    path = script(DECLARED_SERVER)
    url = http_server(lambda port: [sys.executable, path, "http", str(port), PATH_TOKEN]) + f"/{PATH_TOKEN}"
    env = make({"url": url, "secrets": [PATH_TOKEN]})
    try:
        obs, info = env.reset(seed=0)  # (the server answers at /mcp/<token> only)
        assert PATH_TOKEN not in obs + json.dumps(info["tools"]) and "Calls home with ***." in obs, obs
        obs, _, _, _, info = env.step(call("whoami"))
        assert info["error"] is None and "at /mcp/*** with *** (***" in obs and PATH_TOKEN not in obs, obs
        assert repr(env.unwrapped.connections["server"].spec).endswith("/mcp/***')")
    finally:
        env.close()
    # No URL logged shows it (httpx2 logs each request's at INFO)
    assert "/mcp/***" in caplog.text and f"/{PATH_TOKEN}" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and PATH_TOKEN in r.getMessage()]


def test_a_declared_secret_in_a_stdio_servers_args_is_hidden_from_results_and_its_failing_starts_error(script):
    path = script(DECLARED_SERVER)
    env = make({"command": sys.executable, "args": [path, "stdio", PATH_TOKEN], "secrets": [PATH_TOKEN]})
    try:
        env.reset(seed=0)
        obs, _, _, _, info = env.step(call("whoami"))
        assert info["error"] is None and "at stdio with *** (***" in obs and PATH_TOKEN not in obs, obs
    finally:
        env.close()
    env = make({"command": sys.executable, "args": [path, "fail", PATH_TOKEN], "secrets": [PATH_TOKEN]})
    with pytest.raises(RuntimeError) as raised:
        env.reset(seed=0)
    env.close()
    assert "refused token ***" in str(raised.value) and PATH_TOKEN not in str(raised.value), str(raised.value)


@pytest.mark.parametrize("server, shown", [
    # 40 digits (a long word stays)
    ("ftp://127.0.0.1/modelcontextprotocol/v1/1234567890123456789012345678901234567890/sse",
     "ftp://127.0.0.1/modelcontextprotocol/v1/***/sse"),
    ("ftp://127.0.0.1/mcp/abcdefghijklmnopqrstuvwxyzabcdefgh", "ftp://127.0.0.1/mcp/***"),  # 34 letters
    ({"url": f"ftp://127.0.0.1/mcp/{PATH_TOKEN}/sse", "secrets": [PATH_TOKEN]}, "ftp://127.0.0.1/mcp/***/sse"),
    ({"url": f"ftp://127.0.0.1/mcp/sse?k=x{PATH_TOKEN}", "secrets": [PATH_TOKEN]}, "ftp://127.0.0.1/mcp/sse?k=x***"),
])
def test_a_long_all_letter_or_digit_or_declared_path_token_is_hidden_in_a_bad_urls_error(server, shown):
    with pytest.raises(ValueError) as raised:
        make(server)
    assert f"{shown!r}" in str(raised.value), str(raised.value)


@pytest.mark.parametrize("secrets, why", [
    ("s3cret-value", "'secrets' must be a list of strings, got str"),
    (["long-enough", "abc"], "'secrets' must be strings of at least 4 characters"),
    (["long-enough", 1234], "entries [1] are not"),
])
def test_bad_secrets_fail_at_make_naming_the_key_without_their_values(secrets, why):
    with pytest.raises(ValueError) as raised:
        make({"command": sys.executable, "args": ["-c", "pass"], "secrets": secrets})
    assert why in str(raised.value) and "s3cret-value" not in str(raised.value), str(raised.value)
    assert "long-enough" not in str(raised.value) and "abc" not in str(raised.value)
