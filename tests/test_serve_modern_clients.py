"""`mcp-serve --transport http` and the SDK's default client: it probes the modern stateless protocol
first (``mode="auto"``), which has no session; the server must steer it to the initialize handshake
so that every client still gets its own environment."""

import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_MODERN_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_serve import serve, text  # noqa: E402, F401  (the fixture: an `mcp-serve --transport http` process)


def test_default_clients_each_get_their_own_environment(serve):
    """Parallel RL episodes on default clients: one's writes must not reach another's workbook."""
    served = serve("benchmax/Excel-v0", "--env-arg", "python_tool=false")

    async def main():
        async with Client(served.url) as a, Client(served.url) as b, Client(served.url, mode="legacy") as old:
            sheet = json.loads(text(await a.call_tool("list_sheets", {})))[0]["name"]
            wrote = await a.call_tool("write_cells", {"sheet": sheet, "cells": {"Z1": "only in client A"}})
            cell = {"sheet": sheet, "range": "Z1"}
            return wrote, *[await c.call_tool("read_range", cell) for c in (a, b, old)]

    wrote, mine, theirs, legacy = asyncio.run(asyncio.wait_for(main(), 120))
    assert not wrote.is_error and "only in client A" in text(mine)
    for other in (theirs, legacy):
        assert not other.is_error and "empty" in text(other) and "only in client A" not in text(other)


def test_a_client_pinned_to_the_modern_protocol_is_told_why_and_auth_comes_first(serve):
    served = serve("benchmax/Math-v0", "--env-arg", "python_tool=false", "--auth-token", "s3cret")

    def client(mode):
        http = create_mcp_http_client(headers={"Authorization": "Bearer s3cret"})
        return http, Client(streamable_http_client(served.url, http_client=http), mode=mode)

    async def main():
        http, pinned = client(LATEST_MODERN_VERSION)
        with pytest.raises(Exception) as refused:
            async with http, pinned:
                await pinned.list_tools()
        http, default = client("auto")
        async with http, default:
            return refused.value, await default.call_tool("calculator", {"expression": "6*7"})

    refused, ok = asyncio.run(asyncio.wait_for(main(), 120))
    said = " ".join(str(e) for e in leaves(refused))
    assert "one environment" in said and "initialize handshake" in said, said
    assert text(ok) == "42"

    def post(token):  # a modern-era request, as the SDK sends it
        body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": LATEST_MODERN_VERSION, **({"Authorization": f"Bearer {token}"} if token else {})}
        request = urllib.request.Request(served.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=30)
        return answer.value.code, json.loads(answer.value.read())

    status, body = post(None)
    assert status == 401 and "jsonrpc" not in body  # no token: nothing about the protocol
    status, body = post("s3cret")
    assert status == 400 and body["error"]["code"] == -32022
    assert body["error"]["data"]["supported"] == list(HANDSHAKE_PROTOCOL_VERSIONS)


def leaves(exc):
    """The exceptions inside (nested) exception groups: the SDK's task groups wrap the client's error."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]
