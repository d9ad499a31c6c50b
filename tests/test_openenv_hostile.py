"""`openenv-serve` against hostile or buggy clients: web pages, oversized bodies, messages OpenEnv
cannot read, refusals a trainer would score, a client gone mid-step. Real servers on 127.0.0.1."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_openenv import CALC, _workspaces, call, serve_cli, served, until  # noqa: E402, F401  (fixtures)
from openenv.core.generic_client import GenericEnvClient  # noqa: E402  (after test_openenv: without its web UI)


def ws_url(url):
    return url.replace("http://", "ws://", 1) + "/ws"


async def ask(socket, message):
    await socket.send(message)
    return json.loads(await socket.recv())


def test_a_web_page_can_neither_open_a_session_nor_reach_the_server_by_rebinding(serve_cli):
    """A browser lets any page open a WebSocket to 127.0.0.1 (sending the page's Origin), and a
    page can rebind its own name to 127.0.0.1: neither reaches a loopback server's sandbox."""
    server = serve_cli("openenv-serve", "benchmax/Math-v0", "--env-arg", "python_tool=false")
    port = server.url.rsplit(":", 1)[1]

    async def main():
        with pytest.raises(InvalidStatus) as page:
            async with connect(ws_url(server.url), origin="http://evil.example"):
                pass
        async with connect(ws_url(server.url), origin=f"http://localhost:{port}") as local:  # a local page
            said = await ask(local, json.dumps({"type": "reset", "data": {"seed": 0}}))
        return page.value.response.status_code, said

    status, said = asyncio.run(main())
    assert status == 403 and said["type"] == "observation"
    rebound = httpx.post(server.url + "/reset", json={"seed": 0}, headers={"Host": f"evil.example:{port}"}, timeout=30)
    assert rebound.status_code == 403 and "web pages" in rebound.text
    assert httpx.post(server.url + "/reset", json={"seed": 0}, timeout=30).status_code == 200


def test_an_http_request_body_is_bounded(served):
    """OpenEnv's app holds a whole body in memory, several times over (300 MB took 1 GB); a body
    past 16 MiB (a WebSocket message's bound) is refused as it streams in."""
    url = served("benchmax/Math-v0", {"python_tool": False})

    def body(size):
        yield b'{"action": {"text": "'
        for _ in range(size // 65536):
            yield b"a" * 65536
        yield b'"}}'

    with httpx.Client(base_url=url, timeout=120) as http:
        big = http.post("/step", content=body(17 << 20), headers={"Content-Type": "application/json"})
        small = http.post("/step", content=body(1 << 20), headers={"Content-Type": "application/json"})
    assert big.status_code == 413
    assert small.status_code == 200 and small.json()["observation"]["info"]["error"] == "reset_needed"


def test_a_refusal_that_says_done_has_no_reward(served):
    """A client records a done step's reward as the episode's: a refusal graded nothing."""
    url = served("benchmax/Math-v0", {"python_tool": False})
    http_step = httpx.post(url + "/step", json={"action": {"text": CALC}}, timeout=60).json()

    async def main():
        async with GenericEnvClient(base_url=url) as client:
            await client.reset(seed=0)
            bad = await client.step({})
            ended = await client.step({"text": "\\boxed{1}"})
            after = await client.step({"text": CALC})
            return bad, ended, after

    bad, ended, after = asyncio.run(main())
    assert http_step["done"] is True and http_step["reward"] is None
    assert bad.observation["info"]["error"] == "bad_action" and not bad.done
    assert bad.reward == 0.0  # a turn that goes on, as in-process
    assert ended.done and ended.reward is not None
    assert after.observation["info"]["error"] == "reset_needed" and after.done and after.reward is None


def test_a_message_openenv_cannot_read_is_answered_and_the_session_goes_on(served):
    url = served("benchmax/Math-v0", {"python_tool": False})
    unreadable = ["[1, 2]", '"reset"', "null", b'{"type": "state"}', "[" * 100_000 + "]" * 100_000, "1" * 5000]

    async def main():
        async with connect(ws_url(url), max_size=None) as socket:
            await ask(socket, json.dumps({"type": "reset", "data": {"seed": 0}}))
            answers = [await ask(socket, message) for message in unreadable]
            step = await ask(socket, json.dumps({"type": "step", "data": {"text": CALC}}))
            state = await ask(socket, json.dumps({"type": "state"}))
            return answers, step, state

    answers, step, state = asyncio.run(main())
    for message, answer in zip(unreadable, answers):
        assert answer["type"] == "error" and answer["data"]["code"] == "INVALID_JSON", (message[:20], answer)
    assert "binary" in answers[3]["data"]["message"] and "got list" in answers[0]["data"]["message"]
    assert "42" in step["data"]["observation"]["text"] and state["data"]["step_count"] == 1


def test_an_episode_id_that_is_not_text_is_refused_and_the_state_still_reads(served):
    url = served("benchmax/Math-v0", {"python_tool": False})

    async def main():
        async with GenericEnvClient(base_url=url) as client:
            with pytest.raises(RuntimeError, match="episode_id must be a string"):
                await client.reset(seed=0, episode_id={"a": 1})
            await client.reset(seed=0, episode_id="mine")
            return await client.state()

    assert asyncio.run(main())["episode_id"] == "mine"


MID_STEP_CLIENT = """
import json, os, sys
from websockets.sync.client import connect
with connect(sys.argv[1]) as socket:
    socket.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
    socket.recv()
    socket.send(json.dumps({"type": "step", "data": {"text": sys.argv[2]}}))
    print("stepping", flush=True)
    sys.stdin.readline()
    os._exit(0)  # gone while its step runs
"""


def test_a_client_gone_mid_step_is_freed_without_a_server_traceback(serve_cli):
    server = serve_cli("openenv-serve", "benchmax/Math-v0")
    code = call("python", code="import time; time.sleep(4); print(1)")
    client = subprocess.Popen([sys.executable, "-c", MID_STEP_CLIENT, ws_url(server.url), code],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().startswith("stepping")
    assert until(lambda: server.descendants(), 60)  # the sandbox runs the step's code
    assert _workspaces(server.proc.pid)  # (the server's process holds no other episode)
    client.stdin.write("\n")
    client.stdin.flush()
    client.wait(60)
    assert until(lambda: not _workspaces(server.proc.pid), 60)  # its environment closed once the step ended
    with httpx.Client(timeout=30) as http:  # the server goes on (and has logged what it would)
        assert http.post(server.url + "/reset", json={"seed": 0}).status_code == 200
    assert not until(lambda: "Traceback" in "".join(server.lines), 2), "".join(server.lines)[-3000:]


def test_a_reset_that_raises_the_unexpected_is_named_to_the_client_and_the_session_goes_on(serve_cli):
    """A plugin env's reset raising a KeyError (test_serve_hostile's ResetRaises: every other
    reset) reached a WebSocket client as `'task_index 7 ...'` (a MemoryError or a bare `raise
    Boom()`: as an empty message), and HTTP /reset as `Internal Server Error` with a traceback in
    the server's log; now each names the env's error, the session plays on, and the server logs
    one line per failed reset."""
    tests = Path(__file__).resolve().parent
    server = serve_cli("openenv-serve", "test_serve_hostile:hostile/ResetRaises-v0",
                       env={"PYTHONPATH": f"{tests}:{tests.parent}"})  # (its first reset, the probe, plays)
    error = "KeyError: task_index 7 is not in the table"
    said = f"the environment failed to reset: {error}"

    async def main():
        async with connect(ws_url(server.url)) as socket:
            failed = await ask(socket, json.dumps({"type": "reset", "data": {"seed": 0}}))
            again = await ask(socket, json.dumps({"type": "reset", "data": {"seed": 0}}))  # the same session
            return failed, again

    failed, again = asyncio.run(main())
    assert failed == {"type": "error", "data": {"message": said, "code": "EXECUTION_ERROR"}}
    assert again["type"] == "observation" and "math problem" in again["data"]["observation"]["text"]
    http = httpx.post(server.url + "/reset", json={"seed": 0, "task_index": 99}, timeout=30)
    assert http.status_code == 500 and http.json() == {"detail": said}
    env = gym.make("benchmax/OpenEnv-v0", base_url=server.url)
    with pytest.raises(RuntimeError, match=said):
        env.reset(seed=0, options={"task_index": 99})
    env.close()
    logged = lambda: [line for line in server.lines if "reset failed" in line]  # noqa: E731
    assert until(lambda: len(logged()) == 3), "".join(server.lines)[-3000:]
    assert all(f"test_serve_hostile:hostile/ResetRaises-v0: a session's reset failed: {error}" in line
               for line in logged()), logged()
    assert "Traceback" not in "".join(server.lines)
