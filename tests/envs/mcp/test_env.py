"""benchmax/MCP-v0 against real MCP servers: the bundled one, a PyPI one, HTTP, and broken ones."""

import asyncio
import gc
import json
import math
import os
import re
import signal
import sys
import textwrap
import time

import gymnasium as gym
import psutil
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.envs.mcp.stdio import MARKER
from benchmax_gym.testing import aplay, play

EXAMPLE = [sys.executable, "-m", "benchmax_gym.envs.mcp.example_server"]


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"



def server_processes():
    """The live MCP servers this process's envs started (their environment carries the marker;
    under xdist, other modules' tests leave processes of their own, such as eval's fork server)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and MARKER in p.environ():
                found.append(p)
        except psutil.Error:  # (gone meanwhile)
            pass
    return found


@pytest.fixture(autouse=True, scope="module")
def no_orphans():
    """After every environment of this module is closed, no server process is left."""
    yield
    deadline = time.monotonic() + 10
    while server_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_processes() == []


@pytest.fixture(scope="module")
def example_env():
    env = gym.make("benchmax/MCP-v0")
    yield env
    env.close()


@pytest.mark.parametrize("tool_format", ["hermes", "json", "openai", "xml"])
def test_bundled_example_solved_in_every_format(tool_format):
    env = gym.make("benchmax/MCP-v0", tool_format=tool_format)
    solver = env.unwrapped.reference_solver()
    for seed in range(3):
        p = play(env, solver, seed=seed)
        reward, info = p.reward, p.info
        assert reward == 1.0 and info["reward_components"] == {"answer": 1.0, "note": 1.0}
    env.close()


def test_reward_reads_server_state_through_the_client(example_env):
    obs, info = example_env.reset(seed=5)
    task = example_env.unwrapped.episode.task
    assert [t["function"]["name"] for t in info["tools"]] == ["add_note", "list_notes", "read_note", "calculate"]
    _, reward, terminated, _, info = example_env.step(f"<answer>{task.answer['value']}</answer>")
    assert terminated and info["reward_components"] == {"answer": 1.0, "note": 0.0} and reward == 0.5


def test_episodes_get_fresh_working_directories(example_env):
    example_env.reset(seed=0)
    example_env.step(call("add_note", title="secret", text="from episode one"))
    obs, *_ = example_env.step(call("list_notes"))
    assert "secret" in obs
    example_env.reset(seed=1)
    obs, *_ = example_env.step(call("list_notes"))
    assert "secret" not in obs


def test_server_errors_are_tool_errors(example_env):
    example_env.reset(seed=0)
    obs, _, terminated, _, info = example_env.step(call("read_note", title="missing"))
    assert info["error"] == "tool_error" and "no note titled 'missing'" in obs and not terminated
    obs, _, _, _, info = example_env.step(call("calculate", expression=12))
    assert info["error"] == "bad_arguments"  # checked against the server's input schema first


def test_restart_isolation_starts_a_fresh_process():
    others = {p.pid for p in server_processes()}
    env = gym.make("benchmax/MCP-v0", isolation="restart")
    env.reset(seed=0)
    first = {p.pid for p in server_processes()} - others
    env.reset(seed=1)
    second = {p.pid for p in server_processes()} - others
    assert first and second and not first & second
    env.close()


def test_bundled_example_solved_through_the_async_api():
    # The example's note reward is a sync function calling the live client from inside astep.
    env = gym.make("benchmax/MCP-v0")
    for seed in range(2):
        p = asyncio.run(aplay(env, seed=seed))  # a new event loop each time
        assert p.reward == 1.0 and p.info["reward_components"] == {"answer": 1.0, "note": 1.0}
    env.close()


def test_sync_and_async_calls_share_one_episode_and_one_server():
    env = gym.make("benchmax/MCP-v0")
    api = env.unwrapped
    asyncio.run(api.areset(seed=0))
    asyncio.run(api.astep(call("add_note", title="kept", text="across loops")))
    obs, _, _, _, info = api.step(call("read_note", title="kept"))
    assert info["error"] is None and "across loops" in obs
    assert api.connections["server"].starts == 1  # the server state was never lost
    env.close()


def test_sync_api_inside_a_running_event_loop():
    # A notebook cell or an async trainer calling the plain Gymnasium API.
    async def main():
        env = gym.make("benchmax/MCP-v0")
        p = play(env, seed=0)
        reward, info = p.reward, p.info
        env.close()
        return reward

    assert asyncio.run(main()) == 1.0


def test_vector_rollouts_each_env_with_its_own_server():
    # Two workers, two MCP envs each: a worker's event loop steps both envs' servers at once.
    envs = gym.make_vec("benchmax/MCP-v0", num_envs=4, num_workers=2)
    envs.reset(seed=0)
    envs.step(tuple(call("add_note", title=f"env{i}", text=f"note of {i}") for i in range(4)))
    obs, *_ = envs.step(tuple([call("list_notes")] * 4))
    for i, seen in enumerate(obs):
        assert f"env{i}" in seen and not any(f"env{j}" in seen for j in range(4) if j != i)
    # The example's note reward (a sync function calling the live client) runs in the worker,
    # whose event loop holds the sessions: it must query the server, not fail.
    _, _, terminated, _, infos = envs.step(("<answer>0</answer>",) * 4)
    assert terminated.all() and "reward_errors" not in infos
    assert infos["_reward_components"].all() and (infos["reward_components"]["note"] == 0.0).all()
    envs.close()


def test_closing_one_env_leaves_the_others_servers_alone():
    first, second = gym.make("benchmax/MCP-v0"), gym.make("benchmax/MCP-v0")
    first.reset(seed=0)
    second.reset(seed=0)
    first.close()
    obs, _, _, _, info = second.step(call("calculate", expression="6*7"))
    assert info["error"] is None and "42" in obs
    assert second.unwrapped.connections["server"].starts == 1
    second.close()


def test_an_env_dropped_without_close_takes_its_server_and_directory_with_it():
    others = {p.pid for p in server_processes()}
    env = gym.make("benchmax/MCP-v0")
    env.reset(seed=0)
    root = env.unwrapped._root
    assert {p.pid for p in server_processes()} - others and root.is_dir()
    del env
    gc.collect()
    deadline = time.monotonic() + 10
    while {p.pid for p in server_processes()} - others and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not {p.pid for p in server_processes()} - others
    assert not root.exists()


def test_third_party_server_from_pypi_over_stdio():
    """mcp-server-time (the MCP project's reference time server), installed from PyPI."""

    def converted(completion, client):
        raw = client.call_tool("convert_time", {"source_timezone": "Europe/London", "time": "12:00",
                                                "target_timezone": "Asia/Tokyo"})
        return float(json.loads(raw)["target"]["datetime"][11:16] in completion)

    task = {"prompt": "It is 12:00 in London. What time is it in Tokyo? Answer HH:MM.",
            "solution": {"calls": [["convert_time", {"source_timezone": "Europe/London", "time": "12:00",
                                                      "target_timezone": "Asia/Tokyo"}]]}}
    env = gym.make("benchmax/MCP-v0", server={"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
                   tasks=[task], reward=converted)
    obs, info = env.reset(seed=0)
    assert {t["function"]["name"] for t in info["tools"]} >= {"get_current_time", "convert_time"}
    obs, _, _, _, info = env.step(call("convert_time", **task["solution"]["calls"][0][1]))
    assert info["error"] is None and "Asia/Tokyo" in obs
    tokyo = json.loads(obs.split("\n", 1)[1].rsplit("\n", 1)[0])["target"]["datetime"][11:16]
    _, reward, terminated, _, _ = env.step(f"It is {tokyo} in Tokyo.")
    assert terminated and reward == 1.0
    env.close()


def test_mcp_servers_config_file_with_name_collisions(tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "left": {"command": EXAMPLE[0], "args": EXAMPLE[1:]},
        "right": {"command": EXAMPLE[0], "args": EXAMPLE[1:]},
        "clock": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
    }}))
    env = gym.make("benchmax/MCP-v0", server=str(config), tasks=[{"prompt": "p"}], reward=lambda completion: 0.0)
    obs, info = env.reset(seed=0)
    names = {t["function"]["name"] for t in info["tools"]}
    assert {"left__add_note", "right__add_note", "get_current_time"} <= names and "add_note" not in names
    env.step(call("left__add_note", title="n", text="only left"))
    obs, *_ = env.step(call("right__list_notes"))
    assert "n" in obs  # both run in the episode's directory
    env.close()


def test_streamable_http_server(http_server):
    url = http_server(lambda port: [*EXAMPLE, "--http", str(port)])
    env = gym.make("benchmax/MCP-v0", server=url,
                   tasks=[{"prompt": "compute"}], reward=lambda completion: float("391" in completion))
    env.reset(seed=0)
    obs, *_ = env.step(call("calculate", expression="17*23"))
    assert "391" in obs
    _, reward, *_ = env.step("391")
    assert reward == 1.0
    env.close()


BROKEN = textwrap.dedent('''
    import os, sys, time
    from mcp.server.mcpserver import MCPServer
    mode = sys.argv[1]
    if mode == "hang":
        print("waiting for a licence server that never answers", file=sys.stderr, flush=True)
        time.sleep(600)
    if mode == "garbage":
        print("this is not JSON-RPC", flush=True)
    if mode == "fail":
        sys.exit("KeyError: 'WEATHER_API_KEY' is not set (give it in the server's env)")
    if mode == "once":  # starts once; every later start fails (a port still held, say)
        marker = __file__ + ".started"
        if os.path.exists(marker):
            sys.exit("OSError: [Errno 98] address already in use: 127.0.0.1:7777")
        open(marker, "w").close()
    server = MCPServer("broken")

    @server.tool()
    def crash() -> str:
        """Say why on stderr, then exit the whole server."""
        print("fatal: the index file is corrupt", file=sys.stderr, flush=True)
        os._exit(1)

    @server.tool()
    def shout(megabytes: int) -> str:
        """Flood stderr, then answer."""
        line = "noise " * 20 + "\\n"
        for _ in range(megabytes * 1_000_000 // len(line)):
            sys.stderr.write(line)
        sys.stderr.flush()
        return "done shouting"

    @server.tool()
    def huge(megabytes: int) -> str:
        """A big result."""
        return "x" * (megabytes * 1_000_000)

    @server.tool()
    def ping() -> str:
        """Answer pong."""
        return "pong"

    @server.tool()
    def nap(seconds: float) -> str:
        """Sleep, then answer when it slept (time.monotonic: one clock for every process here)."""
        start = time.monotonic()
        time.sleep(seconds)
        return f"rested from {start} to {time.monotonic()}"

    bumps = [0]

    @server.tool()
    def bump() -> int:
        """Count calls (state that a restart would lose)."""
        bumps[0] += 1
        return bumps[0]

    server.run()
''')


@pytest.fixture
def broken_server(tmp_path):
    path = tmp_path / "broken_server.py"
    path.write_text(BROKEN)
    return lambda mode: {"command": sys.executable, "args": [str(path), mode]}


def make_broken(spec, **kwargs):
    return gym.make("benchmax/MCP-v0", server=spec, tasks=[{"prompt": "p"}], reward=lambda completion: 0.0, **kwargs)


def test_missing_command_fails_at_make():
    with pytest.raises(ValueError, match="no-such-mcp-server"):
        gym.make("benchmax/MCP-v0", server={"command": "no-such-mcp-server"}, tasks=[{"prompt": "p"}], reward=len)


def test_server_that_hangs_on_initialize(broken_server):
    env = make_broken(broken_server("hang"), init_timeout=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish initialize within 2 s"):
        env.reset(seed=0)
    assert time.monotonic() - start < 60  # a hang guard: the server never answers
    env.close()


def test_server_that_fails_to_start_says_why(broken_server, capfd):
    env = make_broken(broken_server("fail"))
    with pytest.raises(RuntimeError, match="failed to start") as raised:
        env.reset(seed=0)
    assert "WEATHER_API_KEY" in str(raised.value)  # the server's own words, not just 'Connection closed'
    env.close()
    assert "WEATHER_API_KEY" not in capfd.readouterr().err  # captured, not passed to our stderr


def test_server_that_hangs_on_initialize_shows_its_stderr(broken_server):
    env = make_broken(broken_server("hang"), init_timeout=2)
    with pytest.raises(RuntimeError, match="licence server"):
        env.reset(seed=0)
    env.close()


def test_server_crash_mid_episode_shows_its_stderr(broken_server):
    env = make_broken(broken_server("once"))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("crash"))
    # It dies saying why; the restart fails saying why: both are shown. Not the model's failure:
    # the episode ends ungraded (issue 29).
    assert info["error"] == info["outcome"] == "tool_unavailable" and math.isnan(reward) and truncated and not terminated
    assert "the index file is corrupt" in obs and "address already in use" in obs
    env.close()


def test_server_stderr_flood_is_captured_and_bounded(broken_server, capfd):
    env = make_broken(broken_server("ok"), tool_timeout=120)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("shout", megabytes=20))
    assert info["error"] is None and "done shouting" in obs
    assert len(capfd.readouterr().err) < 10_000  # 20 MB went to the server's log tail, not to ours
    obs, _, _, _, info = env.step(call("crash"))
    assert "the index file is corrupt" in obs and len(obs) < 10_000  # only the tail of its stderr
    env.close()


def test_server_that_prints_garbage_still_serves(broken_server):
    env = make_broken(broken_server("garbage"))
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("ping"))
    assert info["error"] is None and "pong" in obs
    env.close()


def test_server_that_exits_mid_episode_ends_it_and_is_restarted(broken_server):
    """Its state is gone, so the episode cannot go on as it was: ``tool_unavailable``, ungraded;
    the restarted server serves the next episode."""
    env = make_broken(broken_server("ok"))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("crash"))
    assert info["outcome"] == "tool_unavailable" and "restarted" in obs and truncated and not terminated
    assert math.isnan(reward) and env.unwrapped.episode_record()["reward"] is None
    env.reset(seed=1)
    obs, _, _, _, info = env.step(call("ping"))
    assert info["error"] is None and "pong" in obs
    env.close()


def test_a_killed_server_process_ends_the_episode_with_tool_unavailable(broken_server):
    env = make_broken(broken_server("ok"))
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("bump"))
    assert info["error"] is None
    for connection in env.unwrapped.connections.values():
        for pid in list(connection.pids):
            os.kill(pid, signal.SIGKILL)  # the injected fault: its process is gone
    _, reward, terminated, truncated, info = env.step(call("bump"))
    assert info["outcome"] == "tool_unavailable" and math.isnan(reward) and truncated and not terminated
    env.close()


def test_a_server_tool_past_its_timeout_ends_the_episode_with_tool_timeout(broken_server):
    env = make_broken(broken_server("ok"), tool_timeout=0.5)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(call("nap", seconds=30))
    assert info["outcome"] == "tool_timeout" and math.isnan(reward) and truncated and not terminated
    env.close()


def test_big_results_are_capped(broken_server):
    env = make_broken(broken_server("ok"), max_tool_output_chars=1000, tool_timeout=60)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("huge", megabytes=2))
    assert info["error"] is None and len(info["messages"][0]["content"]) <= 1000 and "[truncated" in obs
    env.close()


def test_fifty_megabyte_result_is_a_tool_error_and_the_server_keeps_its_state(broken_server):
    # The message is dropped as it streams in (over max_message_mb, 16 by default): the call
    # fails with a clear error at once, not by timeout, and the same server process goes on.
    env = make_broken(broken_server("ok"), tool_timeout=60)
    env.reset(seed=0)
    assert "1" in env.step(call("bump"))[0]
    obs, _, terminated, _, info = env.step(call("huge", megabytes=50))
    assert info["error"] == "tool_error" and not terminated
    assert "MB, over the 16 MB limit" in obs
    obs, _, _, _, info = env.step(call("bump"))
    assert info["error"] is None and "2" in obs  # not restarted: its state survived
    assert env.unwrapped.connections["server"].starts == 1
    env.close()


def test_results_under_the_message_limit_arrive_and_are_cut(broken_server):
    env = make_broken(broken_server("ok"), max_message_mb=40, max_tool_output_chars=500, tool_timeout=60)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("huge", megabytes=12))
    assert info["error"] is None and "[truncated: 11999" in obs
    env.close()


def test_one_worker_waits_on_its_envs_servers_at_once(broken_server):
    # Two envs in one worker, each calling a tool that takes 0.6 s: the worker's event loop
    # waits on both servers together (one after the other, the second nap would start as the first ended).
    envs = gym.make_vec("benchmax/MCP-v0", num_envs=2, num_workers=1, server=broken_server("ok"),
                        tasks=[{"prompt": "p"}], reward=lambda completion: 0.0)
    envs.reset(seed=0)
    envs.step((call("ping"),) * 2)
    obs, *_ = envs.step((call("nap", seconds=0.6),) * 2)
    envs.close()
    naps = [re.search(r"rested from (\S+) to (\S+)", o) for o in obs]
    assert all(naps), obs
    starts, ends = zip(*((float(n[1]), float(n[2])) for n in naps))
    assert max(starts) < min(ends), obs  # the two naps overlapped


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"tasks": [{"prompt": "p"}]}, "need a server"),
        ({"server": {"command": sys.executable}}, "give tasks= and reward="),
        ({"server": {"url": "http://x"}, "tasks": [{"no": 1}], "reward": len}, "prompt"),
        ({"server": "nope.json", "tasks": [{"prompt": "p"}], "reward": len}, "nope.json"),
        ({"isolation": "sometimes"}, "isolation"),
        ({"max_message_mb": 0}, "max_message_mb"),
        ({"init_timeout": "soon"}, "init_timeout"),
        ({"server": {"command": sys.executable, "colour": 1}, "tasks": [{"prompt": "p"}], "reward": len}, "colour"),
    ],
)
def test_bad_configuration_fails_at_make(kwargs, says):
    with pytest.raises((ValueError, TypeError), match=says):
        gym.make("benchmax/MCP-v0", **kwargs)


_RAW_SERVER = '''
import json, sys
mode = sys.argv[1]
for line in sys.stdin:
    msg = json.loads(line)
    mid, method = msg.get("id"), msg.get("method")
    if mid is None:
        continue
    if method == "initialize":
        out = {"result": {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                          "serverInfo": {"name": "raw", "version": "0"}}}
    elif method == "tools/list":
        if mode == "never_lists":
            continue
        out = {"result": {"tools": [{"name": "t", "inputSchema": {"type": "object"}}], "nextCursor": "again"}}
    else:
        out = {"error": {"code": -32601, "message": "no " + str(method)}}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, **out}) + "\\n")
    sys.stdout.flush()
'''


@pytest.mark.parametrize("mode, init_timeout, says", [
    ("never_lists", 3, "did not list its tools within 3 s"),
    ("pages_for_ever", 45, "listed its tools in over 1000 pages"),  # (the page cap, long before the timeout,
])                                                                   # however loaded the machine)
def test_a_server_that_never_finishes_listing_its_tools_fails_the_reset_naming_it(tmp_path, mode, init_timeout, says):
    script = tmp_path / "raw.py"
    script.write_text(_RAW_SERVER)
    env = gym.make("benchmax/MCP-v0", server={"command": sys.executable, "args": [str(script), mode]},
                   tasks=[{"prompt": "p"}], reward=lambda completion: 0.0, init_timeout=init_timeout)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=says):
            env.reset(seed=0)
        assert time.monotonic() - start < 60  # a hang guard: the server never stops listing
    finally:
        env.close()


def test_a_servers_own_error_answer_with_a_reserved_code_is_a_tool_error(tmp_path):
    """-32000/-32001 are also the SDK's codes for a lost connection or a timeout: a live server
    answering with them keeps its state, and the call is the model's tool_error."""
    script = tmp_path / "errcode.py"
    script.write_text(textwrap.dedent('''
        from mcp.server.mcpserver import MCPServer
        from mcp.shared.exceptions import MCPError
        server = MCPServer("errcode")
        count = [0]
        @server.tool()
        def bump() -> int:
            """Count calls."""
            count[0] += 1
            return count[0]
        @server.tool()
        def query(code: int) -> str:
            """Fail with a JSON-RPC error of the given code."""
            raise MCPError(code=code, message=f"database is locked (code {code})")
        server.run()
    '''))
    env = gym.make("benchmax/MCP-v0", server={"command": sys.executable, "args": [str(script)]},
                   tasks=[{"prompt": "p"}], reward=lambda completion: 0.0, tool_timeout=10)
    env.reset(seed=0)
    conn = env.unwrapped.connections["server"]
    assert "1" in env.step(call("bump"))[0]
    for n, code in enumerate((-32602, -32000, -32001), start=2):
        obs, reward, terminated, truncated, info = env.step(call("query", code=code))
        assert info["error"] == "tool_error" and "database is locked" in obs and not truncated
        assert str(n) in env.step(call("bump"))[0]  # the same server, its state kept
    assert conn.starts == 1
    env.close()


@pytest.mark.parametrize(
    "given, says",
    [
        ("dir", r"tasks '.*' is a directory"),
        ("binary.jsonl", r"tasks '.*binary.jsonl' line 1: not UTF-8"),
        ("binary.json", r"tasks '.*binary.json': not UTF-8"),
        ("object.json", r"tasks '.*object.json' must hold a JSON array of task dicts.*got a JSON dict"),
        ("dict", r"tasks must be a list of task dicts, a JSON/JSONL file or a TaskSource, got a dict"),
        ("twice.jsonl", r"tasks '.*twice.jsonl' line 1 and line 2 share the id 'a'"),
    ],
)
def test_a_bad_tasks_file_or_type_names_tasks_and_what_is_wrong(tmp_path, given, says):
    """(A non-UTF-8 file was a bare UnicodeDecodeError, a directory "no such file", a dict's keys
    read as its tasks.)"""
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe{}\n")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe[]")
    (tmp_path / "object.json").write_text('{"prompt": "x"}')
    (tmp_path / "twice.jsonl").write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    tasks = {"dir": str(tmp_path), "dict": {"prompt": "x"}}.get(given, str(tmp_path / given))
    with pytest.raises(ValueError, match=says):
        gym.make("benchmax/MCP-v0", server={"url": "http://x"}, tasks=tasks, reward=len)


def test_a_tasks_file_of_json_lines_or_a_json_array_is_read(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"id": "a", "prompt": "x"}\n\n{"id": "b", "prompt": "y"}\n')
    (tmp_path / "t.json").write_text('[{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}]')
    for name in ("t.jsonl", "t.json"):
        env = gym.make("benchmax/MCP-v0", server={"url": "http://x"}, tasks=str(tmp_path / name),
                       reward=lambda completion: 0.0)
        assert [t.id for t in env.unwrapped.tasks.tasks] == ["a", "b"]
        env.close()
