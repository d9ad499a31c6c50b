"""benchmax/MCP-v0 through gym.make against real SDK servers: a tool argument named ``episode``,
a reward's call past its timeout, configurations that fail at make, the server's whole process
tree gone at close, and a timed-out call that returns soon after its timeout."""

import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import psutil
import pytest

import benchmax_gym  # noqa: F401

SERVER = textwrap.dedent('''
    import subprocess, sys, time
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("lifecycle")
    SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]
    QUIET = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @server.tool()
    def echo_episode(episode: str) -> str:
        """Echo an argument that happens to be named episode."""
        return f"got episode={episode!r}"

    @server.tool()
    def nap(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "rested"

    @server.tool()
    def nap_then_mark(seconds: float, path: str) -> str:
        """Sleep, then leave a file at path (as a server left to finish its call would)."""
        time.sleep(seconds)
        open(path, "w").close()
        return "rested"

    count = [0]

    @server.tool()
    def bump() -> int:
        """Count calls (state that a restart loses)."""
        count[0] += 1
        return count[0]

    @server.tool()
    def daemon_child() -> int:
        """A child in a session of its own (outside the server's process group)."""
        return subprocess.Popen(SLEEPER, start_new_session=True, **QUIET).pid

    @server.tool()
    def orphan() -> int:
        """A grandchild in a session of its own whose parent exits at once (reparented away)."""
        code = ("import subprocess, sys; print(subprocess.Popen(%r, start_new_session=True, stdin=subprocess.DEVNULL, "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)" % (SLEEPER,))
        return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)

    from mcp.types import CallToolResult, TextContent

    @server.tool()
    def grade_down() -> CallToolResult:
        """A grading backend gone, its text quoting the answer (a benchmax mcp-serve failure's form)."""
        return CallToolResult(content=[TextContent(type="text", text="grader down; expected 'SECRET-4417'")],
                              is_error=True, meta={"benchmax/outcome": "tool_unavailable"})

    server.run()
''')


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(running(p) for p in pids)


@pytest.fixture
def server(tmp_path):
    path = tmp_path / "lifecycle_server.py"
    path.write_text(SERVER)
    return {"command": sys.executable, "args": [str(path)]}


def make(server, **kwargs):
    kwargs.setdefault("reward", lambda completion: 0.0)
    return gym.make("benchmax/MCP-v0", server=server, tasks=[{"prompt": "p"}], **kwargs)


# -- 1. a tool argument named episode ---------------------------------------------------------


def test_a_tool_argument_named_episode_reaches_the_server_intact(server):
    seen = []

    def reward(client):
        seen.append(client.call_tool("echo_episode", {"episode": "from the reward"}))
        return 1.0

    env = make(server, reward=reward)
    obs, info = env.reset(seed=0)
    tool = next(t for t in info["tools"] if t["function"]["name"] == "echo_episode")
    assert "episode" in tool["function"]["parameters"]["properties"]  # the model sees it
    obs, _, _, _, info = env.step(call("echo_episode", episode="ep-42"))
    assert info["error"] is None and "got episode='ep-42'" in obs
    _, reward, terminated, _, info = env.step("done")
    assert terminated and reward == 1.0 and "reward_errors" not in info
    assert seen == ["got episode='from the reward'"]
    env.close()


# -- 2. a reward's call past tool_timeout -----------------------------------------------------


@pytest.mark.parametrize("swallowed", [False, True])
def test_a_reward_call_past_its_timeout_fails_the_episode_naming_the_tool(server, swallowed, caplog):
    def reward(client):
        try:
            client.call_tool("nap", {"seconds": 30})
        except Exception:
            if not swallowed:
                raise
        return 1.0  # never a reward: the server it read is gone

    env = make(server, reward=reward, tool_timeout=1)
    env.reset(seed=0)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        _, reward, terminated, truncated, info = env.step("done")
    assert time.monotonic() - start < 60  # a hang guard (the nap answers after 30 s: reward 1.0, caught below)
    assert math.isnan(reward) and truncated and not terminated and info["outcome"] == "tool_timeout"
    assert env.unwrapped.episode_record()["reward"] is None
    said = caplog.text
    assert "'nap'" in said and "timed out after 1 s" in said
    # the reason reaches the trainer (info), not the model (the observation)
    assert "'nap'" in info["outcome_detail"] and "timed out after 1 s" in info["outcome_detail"]
    assert "nap" not in "".join(m["content"] or "" for m in info["messages"])
    env.reset(seed=1)  # a fresh server for the next episode
    obs, _, _, _, info = env.step(call("bump"))
    assert info["error"] is None and "1" in obs
    env.close()


@pytest.mark.parametrize("tool, arguments, outcome, says", [
    ("nap", {"seconds": 30}, "tool_timeout", "the reward's call of tool 'nap' timed out after 1 s"),
    ("grade_down", {}, "tool_unavailable", "the reward's call of tool 'grade_down' failed (tool_unavailable)"),
])
def test_a_failed_reward_call_says_why_in_info_never_the_servers_text_nor_to_the_model(server, tool, arguments,
                                                                                        outcome, says, caplog):
    """info["outcome_detail"] names the tool and the timeout or outcome; the server's own text (a
    grading tool's may quote the answer) goes to the log only, and the model sees none of it."""
    def graded(client):
        return float(client.call_tool(tool, arguments) == "pass")

    # 1 s where the timeout is the case; else room, so a loaded machine's slow call is not timed out first
    env = make(server, reward=graded, tool_timeout=1 if outcome == "tool_timeout" else 30)
    env.reset(seed=0)
    with caplog.at_level(logging.WARNING):
        obs, reward, _, truncated, info = env.step("done")
    assert math.isnan(reward) and truncated and info["outcome"] == outcome
    assert info["outcome_detail"] == f"a reward could not score: {says}"
    assert "SECRET-4417" not in json.dumps(info) and ("SECRET-4417" in caplog.text) == (tool == "grade_down")
    said = json.dumps([obs, info["messages"]])  # what this step showed the model (tool names are in its prompt)
    assert tool not in said and "timed out" not in said and "could not score" not in said
    assert "SECRET" not in json.dumps(env.unwrapped.messages)
    env.close()


@pytest.mark.parametrize("info_keys", [None, ["error"]])  # (outcome and outcome_detail always come)
def test_a_reward_call_past_its_timeout_says_why_through_a_vector_env(server, info_keys):
    def graded(client):
        client.call_tool("nap", {"seconds": 30})
        return 1.0

    envs = gym.make_vec("benchmax/MCP-v0", num_envs=2, num_workers=1, server=server, tasks=[{"prompt": "p"}],
                        reward=graded, tool_timeout=1, info_keys=info_keys)
    try:
        envs.reset(seed=0)
        obs, rewards, _, truncated, infos = envs.step(("done", "done"))
    finally:
        envs.close()
    assert truncated.all() and all(math.isnan(r) for r in rewards) and infos["_outcome_detail"].all()
    assert list(infos["outcome_detail"]) == ["a reward could not score: the reward's call of tool 'nap' "
                                             "timed out after 1 s"] * 2
    assert not any("nap" in o for o in obs)


# -- 3. configurations that fail at make ------------------------------------------------------


def _bad_configs(tmp_path):
    script = tmp_path / "not_executable.py"
    script.write_text("print('hi')\n")
    script.chmod(0o644)
    python = {"command": sys.executable, "args": ["-c", "pass"]}
    return [
        ({**python, "cwd": str(tmp_path / "missing")}, "'cwd'.*not an existing directory"),
        ({**python, "cwd": 5}, "'cwd' must be a string"),
        ({**python, "env": {"KEY": None}}, "'env' must be a dict of strings"),
        ({**python, "env": {"PORT": 8080}}, "'env' must be a dict of strings"),
        ({**python, "env": ["KEY=1"]}, "'env' must be a dict of strings"),
        ({"command": str(script)}, "not_executable.py' is not executable"),
        ({"command": str(tmp_path)}, "is a directory"),
        ({"url": "http://127.0.0.1:9/sse", "type": "sse"}, "type 'sse' is not supported"),
        ({"url": "http://127.0.0.1:9/sse", "transport": "websocket"}, "transport 'websocket' is not supported"),
        ({"url": "http://127.0.0.1:9/mcp", "type": "stdio"}, "type 'stdio' does not fit its url"),
        ({**python, "type": "http"}, "type 'http' does not fit its command"),
        ({"url": "ftp://127.0.0.1/mcp"}, "'url' must be an http:// or https:// URL"),
        ({"url": "http://"}, "'url' must be an http:// or https:// URL"),
        # (each made fine and failed at reset: "connect(): port must be 0-65535", InvalidURL)
        ({"url": "http://127.0.0.1:99999/mcp"}, r"'url' must be .*: not a valid URL \(Port out of range 0-65535\)"),
        ({"url": "http://127.0.0.1:abc/mcp"}, r"'url' must be .*: not a valid URL \(its port is not a number\)"),
        ({"url": "http://127.0.0.1:0/mcp"}, r"'url' must be .*: not a valid URL \(port 0: a port is 1-65535\)"),
    ]


@pytest.mark.parametrize("case", range(16))
def test_a_bad_server_configuration_fails_at_make_naming_the_server_and_argument(tmp_path, case):
    entry, says = _bad_configs(tmp_path)[case]
    with pytest.raises(ValueError, match=says) as raised:
        make({"mcpServers": {"weather": entry}})
    assert "server 'weather'" in str(raised.value)


def test_a_good_configuration_with_transport_types_makes_and_runs(server, tmp_path):
    env = make({"mcpServers": {"local": {**server, "type": "stdio", "cwd": "{workspace}", "env": {"X": "1"}},
                               "remote": {"url": "http://127.0.0.1:9/mcp", "type": "http"}}})
    env.close()  # (the remote one is never reached: servers start at reset)
    env = make({**server, "transport": "stdio", "cwd": str(tmp_path)})
    env.reset(seed=0)
    assert "1" in env.step(call("bump"))[0]
    env.close()


# -- 4. close() takes the server's whole process tree -----------------------------------------


def test_close_kills_the_servers_daemons_and_nothing_else(server):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    env = make(server, tool_timeout=30)
    env.reset(seed=0)
    pids = []
    try:
        for tool in ("daemon_child", "orphan"):
            obs, _, _, _, info = env.step(call(tool))
            assert info["error"] is None
            pids.append(int(obs.split("\n")[1]))
        assert all(running(p) for p in pids)
        env.close()
        assert gone_within(pids)
        assert running(bystander.pid)  # an unrelated process in its own session lives on
    finally:
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        bystander.kill()
        bystander.wait()


# -- 5. a timed-out call returns soon after its timeout ---------------------------------------


def test_a_timed_out_call_returns_soon_after_its_timeout_and_the_next_episode_gets_a_fresh_server(server, tmp_path):
    env = make(server, tool_timeout=3)  # (3 s: room for each bump on a loaded machine)
    env.reset(seed=0)
    connection = env.unwrapped.connections["server"]
    assert "1" in env.step(call("bump"))[0]
    assert "2" in env.step(call("bump"))[0]
    old = list(connection.pids)
    mark = tmp_path / "the nap ended"
    # 4.5 s: past the timeout, within the 2 s grace a closing server gets (from 3 s to 5 s)
    obs, reward, terminated, truncated, info = env.step(call("nap_then_mark", seconds=4.5, path=str(mark)))
    assert info["outcome"] == "tool_timeout" and math.isnan(reward) and truncated and not terminated
    assert "timed out after 3 s" in obs
    assert gone_within(old)  # the stuck server is gone at once
    # killed at the timeout, not left the grace period to finish its call, nor restarted while the step waited
    assert not mark.exists(), "the timed-out call's server ran on past its timeout"
    assert connection.starts == 1
    env.reset(seed=1)
    obs, _, _, _, info = env.step(call("bump"))
    assert info["error"] is None and "1" in obs  # a fresh server: the old state is gone
    assert connection.starts == 2
    env.close()
