"""OpenEnv both ways (``benchmax_gym/openenv.py``): our environments behind OpenEnv's own server,
driven by OpenEnv's own client classes and by ``benchmax/OpenEnv-v0``; OpenEnv's Connect4 example
environment (``tests/openenv_connect4``, run as OpenEnv runs it) played through the gym API."""

import asyncio
import http.server
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import httpx
import numpy as np
import psutil
import pytest
import uvicorn
from gymnasium.utils.env_checker import check_env

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.eval import aevaluate
from benchmax_gym.openenv import Client, _require, build_app
from benchmax_gym.testing import play

_require()  # openenv.core as benchmax-gym loads it: without its Gradio web UI (~3 s of every test process's collection)
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from test_contract import BUILTIN, CUSTOM, OFFLINE, policy_for  # noqa: E402

import snooping  # noqa: E402
from cli_in_process import run_in_process  # noqa: E402

CLI = [sys.executable, "-m", "benchmax_gym.cli"]


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


CALC = call("calculator", expression="6*7")


def norm(value):
    """As it travels: JSON types."""
    return json.loads(json.dumps(value, default=str))


class InThread:
    """Our app (``build_app``) on a free loopback port, uvicorn in a thread of this process."""

    def __init__(self, env_id, env_kwargs=None, **options):
        app = build_app(env_id, env_kwargs, **options)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture
def served():
    started = []

    def start(env_id, env_kwargs=None, **options):
        started.append(InThread(env_id, env_kwargs, **options))
        return started[-1].url

    yield start
    for server in started:
        server.close()


class Served:
    """A process: `benchmax-gym openenv-serve ... --port 0` (or ``command`` with ``url``, the
    pattern of the line that names its URL), its URL read from stderr."""

    URL = re.compile(r"benchmax-gym openenv-serve: listening on (http://127\.0\.0\.1:\d+)")

    def __init__(self, *args, env=None, cwd=None, timeout=120, command=None, url=None):
        self.URL = url or self.URL
        self.proc = subprocess.Popen(command or [*CLI, *args, "--port", "0"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=cwd)
        self.lines, self.urls = [], queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            self.url = self.urls.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise AssertionError(f"no URL within {timeout} s; stderr: {''.join(self.lines)[-3000:]}") from None

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if (found := self.URL.search(line)) is not None:
                self.urls.put(found.group(1))

    def descendants(self):
        alive = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def serve_cli():
    started = []

    def start(*args, **kwargs):
        started.append(Served(*args, **kwargs))
        return started[-1]

    yield start
    for server in started:
        server.close()


def until(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# -- the round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_served_and_consumed_plays_exactly_as_in_process(env_id, served):
    kwargs = {"task_args": OFFLINE[env_id]} if env_id in OFFLINE else {}
    direct = gym.make(env_id, **kwargs)
    alone = play(direct, policy_for(direct), seed=3)
    actions = list(direct.unwrapped.episode.actions)
    remote = gym.make("benchmax/OpenEnv-v0", base_url=served(env_id, kwargs))
    through = play(remote, lambda obs, info: actions[info["turn"]], seed=3)
    try:
        assert through.observations == alone.observations
        assert norm(through.infos) == norm(alone.infos)
        assert (through.reward, through.terminated, through.truncated) == (alone.reward, alone.terminated,
                                                                            alone.truncated)
        assert norm(remote.unwrapped.messages) == norm(direct.unwrapped.messages)
        assert remote.unwrapped.episode_record() == norm(direct.unwrapped.episode_record())
        assert remote.unwrapped.chat_messages("hf") == norm(direct.unwrapped.chat_messages("hf"))
        assert through.reward == alone.reward > 0
    finally:
        direct.close()
        remote.close()


@pytest.mark.parametrize("late", [False, True])
def test_the_outcome_travels_and_a_failure_is_no_reward_on_either_side(served, late):
    """Issue 29 across the wire: the finished episode's ``outcome`` arrives as the env gave it, and
    a failed episode (here: past its ``episode_timeout``) is NaN in ``step`` and ``None`` in the
    record on the consumer's side exactly as in process."""
    import math

    kwargs = {"python_tool": False, "episode_timeout": 2.0 if late else 60}  # (on time: room for a loaded machine)
    direct = gym.make("benchmax/Math-v0", **kwargs)
    remote = gym.make("benchmax/OpenEnv-v0", base_url=served("benchmax/Math-v0", kwargs))
    try:
        ends = []
        for env in (direct, remote):
            env.reset(seed=3)
            if late:
                time.sleep(2.5)
            ends.append(env.step("\\boxed{1}"))
        (obs_d, reward_d, term_d, trunc_d, info_d), (obs_r, reward_r, term_r, trunc_r, info_r) = ends
        assert (obs_r, term_r, trunc_r, info_r["outcome"]) == (obs_d, term_d, trunc_d, info_d["outcome"])
        assert norm(remote.unwrapped.episode_record()) == norm(direct.unwrapped.episode_record())
        if late:
            assert info_r["outcome"] == "deadline" and math.isnan(reward_r) and math.isnan(reward_d) and trunc_r
            assert remote.unwrapped.episode_record()["reward"] is None
        else:
            assert info_r["outcome"] == "scored" and reward_r == reward_d
    finally:
        direct.close()
        remote.close()


def test_the_trainer_adapters_play_an_openenv_server_token_exactly(served):
    """A TokenSession (what every trainer adapter uses) on benchmax/OpenEnv-v0 gives the ids it
    gives in-process: the served env's transcript is the same, so is its rendering."""
    from benchmax_gym.adapters import ChatTemplate, TokenSession
    from benchmax_gym.testing.tokenizers import play_tokens, tiny_tokenizer

    chat = ChatTemplate(tiny_tokenizer("qwen2.5"))
    direct = TokenSession(gym.make("benchmax/Math-v0"), chat)
    play_tokens(direct, seed=5)
    actions = direct.env.unwrapped.episode_record()["actions"]
    remote = TokenSession(gym.make("benchmax/OpenEnv-v0", base_url=served("benchmax/Math-v0", {})), chat)
    play_tokens(remote, lambda obs, info: actions[info["turn"]], seed=5)
    try:
        assert remote.episode.prompt_ids == direct.episode.prompt_ids
        assert remote.episode.completion_ids == direct.episode.completion_ids
        assert remote.episode.reward == direct.episode.reward == 1.0
    finally:
        direct.close()
        remote.close()


def test_openai_format_takes_the_assistant_message_as_a_dict(served):
    url = served("benchmax/Math-v0", {"tool_format": "openai"})
    solved = gym.make("benchmax/Math-v0", tool_format="openai")
    play(solved, seed=1)
    actions = [json.loads(a) if a.startswith("{") else a for a in solved.unwrapped.episode.actions]
    assert any(isinstance(a, dict) for a in actions)
    direct = gym.make("benchmax/Math-v0", tool_format="openai")
    remote = gym.make("benchmax/OpenEnv-v0", base_url=url)
    policy = lambda obs, info: actions[info["turn"]]  # noqa: E731
    alone, through = play(direct, policy, seed=1), play(remote, policy, seed=1)
    assert through.observations == alone.observations and norm(through.infos) == norm(alone.infos)
    assert through.reward == alone.reward == 1.0
    for env in (solved, direct, remote):
        env.close()


# -- OpenEnv's own clients against our server ------------------------------------------------------


def test_concurrent_sessions_never_see_each_others_workbook(served):
    url = served("benchmax/Excel-v0", {"python_tool": False})
    count = 4
    barrier = asyncio.Barrier(count)

    async def session(i):
        async with GenericEnvClient(base_url=url) as client:
            first = await client.reset(seed=0, task_index=0)
            sheets = await client.step({"text": call("list_sheets")})
            sheet = json.loads(sheets.observation["messages"][0]["content"])[0]["name"]
            await client.step({"text": call("write_cells", sheet=sheet, cells={"Z1": f"written by session {i}"})})
            await barrier.wait()  # every session has written before any reads
            read = await client.step({"text": call("read_range", sheet=sheet, range="Z1")})
            state = await client.state()
            return first.observation["text"], read.observation["messages"][0]["content"], state

    async def main():
        return await asyncio.wait_for(asyncio.gather(*(session(i) for i in range(count))), 120)

    results = asyncio.run(main())
    assert len({first for first, _, _ in results}) == 1  # the same task in every session
    for i, (_, read, state) in enumerate(results):
        assert f"written by session {i}" in read
        assert not any(f"session {j}" in read for j in range(count) if j != i)
        assert state["step_count"] == 3 and state["task_index"] == 0 and state["env_id"] == "benchmax/Excel-v0"
    assert len({state["episode_id"] for _, _, state in results}) == count


def test_a_malformed_action_is_an_observation_and_the_session_goes_on(served):
    url = served("benchmax/Math-v0", {"python_tool": False})

    async def main():
        async with GenericEnvClient(base_url=url) as client:
            await client.reset(seed=0)
            unparsable = await client.step({"text": "<tool_call>{not json</tool_call>"})
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                await client.step({"txt": "a field the action does not have"})
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                await client.step({"text": 5})
            neither = await client.step({})
            wrong_kind = await client.step({"message": {"role": "assistant", "content": "hi"}})
            ok = await client.step({"text": CALC})
            return unparsable, neither, wrong_kind, ok, await client.state()

    unparsable, neither, wrong_kind, ok, state = asyncio.run(main())
    assert unparsable.observation["info"]["error"] == "parse_error" and not unparsable.done
    assert "could not parse your tool call" in unparsable.observation["text"]
    assert neither.observation["info"]["error"] == "bad_action" and not neither.done
    assert "exactly one of text" in neither.observation["text"]
    assert wrong_kind.observation["info"]["error"] == "bad_action" and "tool_format" in wrong_kind.observation["text"]
    assert "42" in ok.observation["text"] and ok.observation["info"]["turn"] == 2 and not ok.done
    assert state["step_count"] == 2  # the refused ones never reached the environment


def test_http_reset_previews_a_task_and_http_step_points_to_the_websocket(served):
    url = served("benchmax/Math-v0", {"python_tool": False})
    direct = gym.make("benchmax/Math-v0", python_tool=False)
    expected, expected_info = direct.reset(seed=3, options={"task_index": 5})
    direct.close()
    with httpx.Client(base_url=url, timeout=60) as http:
        reset = http.post("/reset", json={"seed": 3, "task_index": 5}).json()
        step = http.post("/step", json={"action": {"text": CALC}}).json()
        invalid = http.post("/step", json={"action": {"txt": 1}})
        state, metadata = http.get("/state").json(), http.get("/metadata").json()
        schema = http.get("/schema").json()
    assert reset["observation"]["text"] == expected and reset["done"] is False
    assert reset["observation"]["info"]["task_id"] == expected_info["task_id"]
    assert [t["function"]["name"] for t in reset["observation"]["tools"]] == ["calculator"]
    assert step["done"] is True and step["observation"]["info"]["error"] == "reset_needed"
    assert "/ws" in step["observation"]["text"]
    assert invalid.status_code == 422
    assert state["episode_id"] is None and state["step_count"] == 0  # a fresh environment's: no episode
    assert metadata["name"] == "benchmax/Math-v0" and "calculator" in metadata["description"]
    assert schema["action"]["title"] == "BenchmaxGymAction"


def test_sessions_beyond_max_sessions_are_refused_until_one_closes(served):
    url = served("benchmax/Math-v0", {"python_tool": False}, max_sessions=2)
    envs = [gym.make("benchmax/OpenEnv-v0", base_url=url) for _ in range(3)]
    envs[0].reset(seed=0)
    envs[1].reset(seed=1)
    with pytest.raises(ConnectionError, match=r"no free session.*CAPACITY_REACHED"):
        envs[2].reset(seed=2)
    envs[0].close()
    assert until(lambda: _resets(envs[2]))
    for env in envs[1:]:
        env.close()


def _resets(env):
    try:
        env.reset(seed=2)
        return True
    except ConnectionError:
        return False


def test_an_idle_session_is_freed_and_a_reset_opens_a_new_one(served):
    url = served("benchmax/Math-v0", {"python_tool": False}, idle_timeout=3)  # (a reset and a step: well within)
    env = gym.make("benchmax/OpenEnv-v0", base_url=url)
    obs, _ = env.reset(seed=0)
    time.sleep(9)  # OpenEnv's reaper looks every max(timeout / 4, 5) seconds
    _, reward, terminated, truncated, info = env.step(CALC)  # the episode is gone with its session: not a 0
    assert info["outcome"] == "tool_unavailable" and "idle" in info["outcome_detail"] and reward != reward
    assert truncated and not terminated
    assert env.reset(seed=0)[0] == obs
    assert "42" in env.step(CALC)[0]
    env.close()


def _workspaces(pid):
    """The episode workspaces process `pid` holds (other tests, run alongside, hold theirs)."""
    from benchmax_gym.core.sandbox import _workspace_root

    pattern = f"benchmax-sandbox-p{pid}-*/ep-*"  # an episode: its workspace and /tmp
    for _ in range(20):
        try:
            return set(_workspace_root().glob(pattern))
        except FileNotFoundError:  # (a sandbox removed while it was listed)
            time.sleep(0.05)
    return set(_workspace_root().glob(pattern))


def test_stopping_the_server_closes_its_open_sessions():
    """Its session's environment is closed: the episode's sandbox workspace is removed (the warm
    sandbox server itself is shared by the process's environments and outlives any one)."""
    server = InThread("benchmax/Math-v0")
    before = _workspaces(os.getpid())
    env = gym.make("benchmax/OpenEnv-v0", base_url=server.url)
    env.reset(seed=0)
    assert "42" in env.step(call("python", code="print(6 * 7)"))[0]
    started = _workspaces(os.getpid()) - before
    assert started  # the session's sandbox workspace
    server.close()
    assert until(lambda: not (_workspaces(os.getpid()) & started))
    env.close()


VANISHING_CLIENT = """
import json, os, sys
from openenv.core.generic_client import GenericEnvClient
client = GenericEnvClient(base_url=sys.argv[1]).sync()
client.connect()
client.reset(seed=0, task_index=0)
step = client.step({"text": sys.argv[2]})
print("mid-episode", json.dumps(step.observation["messages"][0]["content"]), flush=True)
sys.stdin.readline()
os._exit(0)  # gone without closing its session
"""


def test_a_client_that_vanishes_mid_episode_has_its_environment_freed(serve_cli, tmp_path):
    server = serve_cli("openenv-serve", "benchmax/Excel-v0", "--max-sessions", "1", env={"TMPDIR": str(tmp_path)})
    idle = set(server.descendants())

    def workspaces():
        return [p for p in tmp_path.rglob("*") if p.is_dir() and p.name.startswith(("benchmax-excel-", "ep-"))]

    client = subprocess.Popen([sys.executable, "-c", VANISHING_CLIENT, server.url, call("run_python", code="print(6*7)")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = client.stdout.readline()
    assert line.startswith("mid-episode") and "42" in line, line
    assert workspaces() and set(server.descendants()) - idle  # its workbook's folder, its sandbox
    client.stdin.write("\n")
    client.stdin.flush()
    client.wait(60)
    assert until(lambda: not workspaces() and not set(server.descendants()) - idle, 60)
    env = gym.make("benchmax/OpenEnv-v0", base_url=server.url)  # its one session is free again
    assert env.reset(seed=0)[1]["task_id"]
    env.close()


def test_bearer_token_is_required_of_every_client(serve_cli, monkeypatch):
    server = serve_cli("openenv-serve", "benchmax/Math-v0", "--env-arg", "python_tool=false",
                       env={"BENCHMAX_GYM_OPENENV_TOKEN": "s3cret"})
    monkeypatch.delenv("BENCHMAX_GYM_OPENENV_TOKEN", raising=False)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 401
    assert httpx.get(server.url + "/health", headers={"Authorization": "Bearer s3cret"}, timeout=30).status_code == 200
    with pytest.raises(ConnectionError, match="401"):
        GenericEnvClient(base_url=server.url).sync().connect()  # OpenEnv's client sends no header
    with pytest.raises(ConnectionError, match="401"):
        Client(server.url, auth_token="wrong").sync().connect()
    with pytest.raises(ConnectionError, match=r"base_url='http://127.*auth_token"):
        gym.make("benchmax/OpenEnv-v0", base_url=server.url)
    with pytest.raises(ConnectionError, match="refused"):
        gym.make("benchmax/OpenEnv-v0", base_url=server.url, auth_token="wrong")
    env = gym.make("benchmax/OpenEnv-v0", base_url=server.url, auth_token="s3cret")
    env.reset(seed=0)
    assert "42" in env.step(CALC)[0]
    env.close()
    monkeypatch.setenv("BENCHMAX_GYM_OPENENV_TOKEN", "s3cret")  # the variable, for the consumer too
    env = gym.make("benchmax/OpenEnv-v0", base_url=server.url)
    env.reset(seed=0)
    env.close()


def test_a_session_never_sees_another_sessions_code_or_output(serve_cli):
    """Every session's python calls share the server's one sandbox server: a call's code must not
    find another session's code or output in its memory, neither after that session's call nor
    while it runs. Before issue 27 item 1 the code's frames reached the server's main loop and
    ``finish()``, which held the other session's last code and output."""
    snooping.need_bubblewrap()
    server = serve_cli("openenv-serve", "benchmax/Math-v0")

    async def main():
        async with GenericEnvClient(base_url=server.url) as a, GenericEnvClient(base_url=server.url) as b:
            await a.reset(seed=0)
            await b.reset(seed=1)

            def python(client):
                async def run(code):
                    step = await client.step({"text": call("python", code=code)})
                    assert step.observation["info"]["error"] is None, step.observation["text"]
                    return step.observation["text"]
                return run

            return await snooping.two_episodes(python(a), python(b))

    assert asyncio.run(asyncio.wait_for(main(), 240)) == {"after": [], "during": []}


def test_user_registered_ids_serve_from_the_cli_with_import(serve_cli):
    server = serve_cli("--import", "matrix_envs", "openenv-serve", "matrix/Notes-v0", cwd=TESTS)
    env = gym.make("benchmax/OpenEnv-v0", base_url=server.url)
    played = play(env, lambda obs, info: [call("write_note", text="42"), "<answer>42</answer>"][info["turn"]], seed=0)
    assert played.observations[1].count("saved") == 1 and played.reward == 1.0 and played.terminated
    env.close()


def test_openenv_serve_bad_input_is_one_line():
    """The first case in a fresh process (whatever importing OpenEnv prints is in its one line too);
    the others through the CLI's ``main`` in this process (a start costs ~1.5 CPU-s)."""
    for args, says in ((["benchmax/Nope-v0"], "benchmax-gym list"), (["benchmax/Math-v0", "--max-sessions", "0"],
                       "--max-sessions"), (["benchmax/Math-v0", "--env-arg", "max_turns=0"], "max_turns")):
        argv = ["openenv-serve", *args, "--port", "0"]  # (any free port: the default, 8000, may be a parallel test's)
        if args == ["benchmax/Nope-v0"]:
            out = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120)
        else:
            out = run_in_process(*argv)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1


# -- benchmax/OpenEnv-v0 in every runner ------------------------------------------------------------


def test_the_consumer_passes_check_env_and_runs_in_make_vec(served):
    url = served("benchmax/Math-v0", {"python_tool": False})
    env = gym.make("benchmax/OpenEnv-v0", base_url=url)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()
    envs = gym.make_vec("benchmax/OpenEnv-v0", num_envs=4, num_workers=2, base_url=url)
    direct = gym.make_vec("benchmax/Math-v0", num_envs=4, vectorization_mode="sync", python_tool=False)
    obs, _ = envs.reset(seed=0)
    assert list(obs) == list(direct.reset(seed=0)[0]) and len(set(obs)) == 4
    obs, reward, terminated, truncated, infos = envs.step(np.array([CALC] * 4, dtype=object))
    assert all("42" in o for o in obs) and not terminated.any() and not truncated.any()
    envs.close()
    direct.close()


def test_eval_scores_a_policy_through_the_consumer(served):
    url = served("matrix/Geo-v0")

    def policy(obs, info):
        return call("country", city="Lima") if info["turn"] == 0 else "<answer>Peru</answer>"

    result = asyncio.run(aevaluate("benchmax/OpenEnv-v0", policy, env_kwargs={"base_url": url}, tasks=1, k=3))
    assert [r["reward"] for r in result.records] == [1.0] * 3 and not any(r["error"] for r in result.records)
    assert result.records[0]["messages"][-1] == {"role": "assistant", "content": "<answer>Peru</answer>"}
    assert result.records[0]["task_id"] == gym.make("matrix/Geo-v0").reset(seed=0)[1]["task_id"]


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:abc", "not a valid URL (its port is not a number)"),
    ("ws://127.0.0.1:70000", "not a valid URL (Port out of range 0-65535)"),
    ("http://127.0.0.1:0", "not a valid URL (port 0: a port is 1-65535)"),
])
def test_a_base_url_with_a_bad_port_fails_at_make_naming_it(url, says):
    """It passed (a scheme and a host) and failed in httpx with ``InvalidURL: Invalid port: 'abc'``,
    naming no argument: a 52-line traceback on the command line."""
    with pytest.raises(ValueError) as raised:
        gym.make("benchmax/OpenEnv-v0", base_url=url)
    assert str(raised.value).startswith(f"base_url must be an OpenEnv server's http:// or ws:// URL, got {url!r}: {says}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cli_in_process import run_in_process

    out = run_in_process("run", "benchmax/OpenEnv-v0", "--env-arg", f"base_url={url}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and says in out.stderr, out.stderr


def test_a_bad_base_url_fails_at_make_naming_it(tmp_path, refused_port):
    closed = refused_port
    with pytest.raises(ConnectionError, match=rf"no OpenEnv server answers at base_url='http://127.0.0.1:{closed}'"):
        gym.make("benchmax/OpenEnv-v0", base_url=f"http://127.0.0.1:{closed}")
    with pytest.raises(ValueError, match="base_url must be"):
        gym.make("benchmax/OpenEnv-v0", base_url="ftp://127.0.0.1:21")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ValueError, match="is not an OpenEnv server: GET /schema answered HTTP 404"):
            gym.make("benchmax/OpenEnv-v0", base_url=f"http://127.0.0.1:{other.server_address[1]}")
    finally:
        other.shutdown()
        other.server_close()


def test_server_side_options_are_refused_naming_where_they_go(served):
    with pytest.raises(TypeError, match="--env-arg"):
        gym.make("benchmax/OpenEnv-v0", base_url=served("benchmax/Math-v0"), tool_format="openai")


MISSING_EXTRA = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name == "openenv" or name.startswith("openenv."):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Missing())
import gymnasium as gym
import benchmax_gym
gym.make("benchmax/Math-v0").close()
assert "openenv" not in sys.modules
try:
    gym.make("benchmax/OpenEnv-v0", base_url="http://127.0.0.1:9")
except ImportError as exc:
    print(exc)
from benchmax_gym.cli import main
main(["openenv-serve", "benchmax/Math-v0", "--port", "0"])  # (any free port: not one a parallel test holds)
"""


def test_without_the_extra_the_base_install_works_and_says_what_to_install():
    out = subprocess.run([sys.executable, "-c", MISSING_EXTRA], capture_output=True, text=True, timeout=120)
    assert "pip install 'benchmax-gym[openenv]'" in out.stdout
    assert out.returncode == 2 and "pip install 'benchmax-gym[openenv]'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


# -- one of OpenEnv's own example environments, through the gym API ----------------------------------


@pytest.fixture
def connect4():
    """OpenEnv's example as OpenEnv runs it, on a port uvicorn picks (a port found free and closed
    first could be a parallel test's by the time uvicorn bound it)."""
    server = Served(command=[sys.executable, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1", "--port", "0"],
                    url=re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)"), cwd=TESTS / "openenv_connect4")
    try:
        assert until(lambda: _healthy(server.url), 120), "no answer"
        yield server.url
    finally:
        server.close()


def _healthy(url):
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_openenvs_connect4_example_plays_through_the_gym_api(connect4):
    env = gym.make("benchmax/OpenEnv-v0", base_url=connect4)
    assert env.unwrapped.action_field == "column" and not env.unwrapped.ours
    obs, info = env.reset(seed=0)
    assert json.loads(obs) == {"board": [[0] * 7] * 6, "legal_actions": list(range(7))}
    obs, reward, terminated, truncated, info = env.step("left")  # not a column: refused, the game goes on
    assert info["error"] == "bad_action" and "column" in obs and not terminated
    for move in "0101010":  # player 1 fills column 0 first
        obs, reward, terminated, truncated, info = env.step(move)
    assert terminated and not truncated and reward == 1.0
    assert json.loads(obs)["board"][2][0] == 1 and info["turn"] == 8
    assert env.unwrapped.messages[-2] == {"role": "assistant", "content": "0"}
    other = gym.make("benchmax/OpenEnv-v0", base_url=connect4)  # Connect4 serves one session at a time
    with pytest.raises(ConnectionError, match="SUPPORTS_CONCURRENT_SESSIONS"):
        other.reset()
    env.close()
    assert until(lambda: _resets(other))
    other.close()
    with pytest.raises(ValueError, match=r"action_field='row' is not a field.*\['column'\]"):
        gym.make("benchmax/OpenEnv-v0", base_url=connect4, action_field="row")


def test_openenv_loads_without_its_gradio_web_ui_which_stays_importable():
    """openenv.core's package imports its Gradio web UI (5-7 s of openenv-serve's start) though the
    server never uses it; we hold it back, and its names still resolve on first use."""
    code = ("import sys; from benchmax_gym.openenv import _classes, serve; _classes()\n"
            "from openenv.core.env_server.http_server import create_app\n"
            "import openenv.core\n"
            "assert 'gradio' not in sys.modules, 'gradio imported'\n"
            "assert openenv.core.GenericEnvClient.__name__ == 'GenericEnvClient'\n"
            "assert openenv.core.create_web_interface_app.__name__ == 'create_web_interface_app'\n"
            "from openenv.core.env_server import WebInterfaceManager\n"
            "assert 'gradio' in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
