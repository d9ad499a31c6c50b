"""`benchmax-gym mcp-serve`: our toolsets driven by the official SDK client, as any agent would."""

import asyncio
import json
import subprocess
import sys

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

CLI = [sys.executable, "-m", "benchmax_gym.cli"]


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
    # Sessions (mcp-session-id) exist in the initialize-handshake era; the modern stateless
    # protocol has none, so its requests share one environment (documented).
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


def test_http_modern_stateless_client_works(excel_server):
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
    from benchmax_gym.envs.mcp.serve import build_server

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
