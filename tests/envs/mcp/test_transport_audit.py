"""benchmax/MCP-v0 against servers that fail as users meet them, over real stdio subprocesses and
real streamable-HTTP servers on 127.0.0.1: text printed before a reply on its line, a server that
dies while a process it started holds its stdout, or dies listing its tools, a call past its
timeout on an HTTP server, an env closed from inside its own loop, crashes and hangs with no
process left behind, per-episode isolation, and a server dying inside a vector worker."""

import asyncio
import gc
import json
import math
import subprocess
import sys
import textwrap
import uuid

import gymnasium as gym
import psutil
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.envs.mcp.stdio import MARKER

# A server written with the SDK: each tool fails the way its name says; ``count`` keeps state in memory.
SERVER = textwrap.dedent('''
    import os, subprocess, sys, time
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("audit")
    COUNT = [0]
    if "--helper" in sys.argv:  # a helper process that inherits the server's stdout and stderr
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    if "--die-listing" in sys.argv:
        async def list_tools(*args, **kwargs):
            print("listing failed: schema directory /opt/tools is missing", file=sys.stderr, flush=True)
            os._exit(4)
        server.list_tools = list_tools

    @server.tool()
    def count() -> str:
        COUNT[0] += 1
        return str(COUNT[0])

    @server.tool()
    def crash() -> str:
        print("fatal: the disk is on fire", file=sys.stderr, flush=True)
        os._exit(7)

    @server.tool()
    def hang() -> str:
        time.sleep(300)
        return "woke"

    @server.tool()
    def refuse() -> str:
        raise ToolError("no such city: Atlantis")

    if "--http" in sys.argv:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[-1]))
    else:
        server.run()
''')

# A server that speaks JSON-RPC by hand and, like a progress bar, prints text with no newline
# before each reply: the text and the reply share one line of its stdout.
PROGRESS_SERVER = textwrap.dedent('''
    import json, sys
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        if msg["method"] == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "progress", "version": "1"}}
        elif msg["method"] == "tools/list":
            sys.stdout.write("loading {plugins}... ")
            result = {"tools": [{"name": "fetch", "inputSchema": {"type": "object"}}]}
        elif msg["method"] == "tools/call":
            sys.stdout.write("Downloading 50%\\rDownloading 100%\\r")
            result = {"content": [{"type": "text", "text": "fetched " + str(msg["params"]["arguments"])}]}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\\n")
        sys.stdout.flush()
''')


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def count(completion):  # a module-level reward: vector workers pickle it
    return 0.0


@pytest.fixture
def script(tmp_path):
    """A server entry whose processes carry this test's tag: :func:`servers_alive` finds them
    (and not those of tests running beside it)."""
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "progress_server.py").write_text(PROGRESS_SERVER)
    return lambda name="server.py", *args: {"command": sys.executable, "args": [str(tmp_path / name), *args],
                                            "env": {TAG: TAGS[-1]}}


TAG = "BENCHMAX_MCP_AUDIT_TEST"
TAGS = [uuid.uuid4().hex]


@pytest.fixture(autouse=True)
def fresh_tag():
    TAGS.append(uuid.uuid4().hex)


def make(server, **kwargs):
    return gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": "p"}], reward=count, max_turns=50,
                    **kwargs)


def servers_alive():
    """Every live process of this test's servers (a server, or a process it started)."""
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        try:
            environ = proc.info["environ"] or {}
            if MARKER in environ and environ.get(TAG) == TAGS[-1] and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return sorted(found)


def test_text_printed_before_a_reply_on_its_line_is_skipped_and_the_call_answers(script):
    """A server printing progress with no newline puts it on its reply's line: the reply still
    answers its call (not a wait until the timeout, then a killed server and tool_timeout)."""
    env = make(script("progress_server.py"), tool_timeout=10, init_timeout=10)
    obs, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["fetch"]
    for n in range(2):
        obs, reward, terminated, truncated, info = env.step(call("fetch", n=n))
        assert info["error"] is None and not (terminated or truncated), obs
        assert f"fetched {{'n': {n}}}" in obs
    env.close()


def test_a_server_that_dies_while_its_helper_holds_its_stdout_fails_the_call_at_once_with_its_words(script):
    """The helper keeps the server's stdout open, so its output never ends: the call must still
    fail as a crash (tool_unavailable, its stderr quoted), not wait out tool_timeout, and neither
    the server nor its helper may be left behind."""
    env = make(script("server.py", "--helper"), tool_timeout=60)
    env.reset(seed=0)
    assert len(servers_alive()) == 2  # the server and its helper
    obs, reward, terminated, truncated, info = env.step(call("crash"))
    assert info["error"] == "tool_unavailable" and math.isnan(reward) and truncated, obs
    assert "fatal: the disk is on fire" in obs and "it was restarted" in obs
    env.close()
    assert servers_alive() == []


def test_a_server_that_dies_listing_its_tools_fails_the_reset_with_its_words(script):
    env = make(script("server.py", "--die-listing"))
    with pytest.raises(RuntimeError, match="could not list its tools: Connection closed; its stderr ended with:\n"
                                           "listing failed: schema directory /opt/tools is missing"):
        env.reset(seed=0)
    env.close()
    assert servers_alive() == []


def test_an_env_closed_from_inside_its_own_loop_stops_its_servers_at_once(script):
    """As a vector worker does when it replaces a broken env: close() from a task on the loop
    the env adopted cannot wait for its sessions, and must still not leave the server running."""

    async def main():
        env = make(script())
        env.unwrapped.aio.adopt(asyncio.get_running_loop())
        await env.unwrapped.areset(seed=0)
        assert len(servers_alive()) == 1
        env.close()
        for _ in range(100):  # (the server is killed in close(); a dead process may take a moment to go)
            if not servers_alive():
                break
            await asyncio.sleep(0.05)
        assert servers_alive() == []
        for _ in range(200):  # the sessions end as tasks (in moments; up to 10 s on a loaded machine)
            if asyncio.all_tasks() == {asyncio.current_task()}:
                break
            await asyncio.sleep(0.05)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_crashes_hangs_and_error_results_end_as_documented_and_leave_no_process(script):
    """One stdio server: its own error is a tool_error and the episode goes on; a crash is
    tool_unavailable with its last words (restarted); a hang is tool_timeout (killed); and after a
    crash, an env dropped without close() takes its server with it."""
    env = make(script(), tool_timeout=2)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("refuse"))
    assert info["error"] == "tool_error" and "no such city: Atlantis" in obs and not (terminated or truncated)
    obs, reward, terminated, truncated, info = env.step(call("hang"))
    assert info["error"] == "tool_timeout" and math.isnan(reward) and truncated
    assert "timed out after 2 s; the MCP server 'server' was stopped" in obs and servers_alive() == []
    env.reset()
    obs, reward, terminated, truncated, info = env.step(call("crash"))
    assert info["error"] == "tool_unavailable" and math.isnan(reward) and truncated
    assert "fatal: the disk is on fire" in obs
    assert len(servers_alive()) == 1  # restarted
    del env
    gc.collect()
    assert servers_alive() == []


def test_episodes_and_envs_share_a_servers_memory_only_as_documented(script):
    """``shared``: one process for the env's life, whose memory carries over between episodes;
    ``restart``: a fresh process every episode; two envs never share a process."""
    shared, other, restarted = make(script()), make(script()), make(script(), isolation="restart")
    try:
        seen = []
        for _ in range(2):
            for env in (shared, other, restarted):
                env.reset(seed=0)
            seen.append([env.step(call("count"))[0] for env in (shared, shared, other, restarted)])
        assert [[o.split()[1] for o in row] for row in seen] == [["1", "2", "1", "1"], ["3", "4", "2", "1"]]
    finally:
        for env in (shared, other, restarted):
            env.close()


def test_an_http_servers_timeout_and_crash_say_what_happened_to_it(script, http_server):
    """The env does not run an HTTP server: a call past its timeout closes the session (the
    server keeps its memory, and says so by counting on), and a server gone cannot be reconnected
    to: tool_unavailable, saying so."""
    url = http_server(lambda port: [sys.executable, *script()["args"], "--http", str(port)])
    env = make(url, tool_timeout=2)
    env.reset(seed=0)
    assert env.step(call("count"))[0].split()[1] == "1"
    obs, reward, terminated, truncated, info = env.step(call("hang"))
    assert info["error"] == "tool_timeout" and math.isnan(reward) and truncated
    assert "timed out after 2 s; the session with the MCP server 'server' was closed" in obs
    assert "state is lost" not in obs
    env.reset()
    assert env.step(call("count"))[0].split()[1] == "2"  # a new session, the same server
    obs, reward, terminated, truncated, info = env.step(call("crash"))
    assert info["error"] == "tool_unavailable" and math.isnan(reward) and truncated
    assert "Reconnecting to it failed" in obs and "failed to start" in obs
    env.close()


def test_a_server_dying_inside_a_vector_worker_surfaces_its_words(script):
    envs = gym.make_vec("benchmax/MCP-v0", num_envs=2, num_workers=1, server=script(), tasks=[{"prompt": "p"}],
                        reward=count, tool_timeout=2)
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, infos = envs.step((call("crash"), call("count")))
        assert list(infos["error"]) == ["tool_unavailable", None]
        assert math.isnan(rewards[0]) and truncated[0] and not truncated[1]
        assert "fatal: the disk is on fire" in obs[0] and obs[1].split()[1] == "1"
        obs, rewards, terminated, truncated, infos = envs.step((call("count"), call("hang")))
        assert list(infos["error"]) == [None, "tool_timeout"] and "timed out after 2 s" in obs[1]
    finally:
        envs.close()
    assert servers_alive() == []
