"""A hostile or broken model endpoint (issue #27 item 11), served by the loopback OpenAI-compatible
server and met through the real openai SDK: a reply dripped a byte at a time or streamed forever
is cut off at the request's timeout, a huge one at the size limit, a malformed one fails its own
episode only, and a key echoed back by the server is never recorded."""

import json
import threading
import time

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.eval import ChatPolicy, evaluate
from benchmax_gym.eval.policies import Turn
from benchmax_gym.testing.openai_server import FakeChatServer

ENV = "benchmax/Math-v0"
ENV_KWARGS = {"python_tool": False}
KEY = "sk-test-0123456789abcdef"


def within(seconds, fn):
    """``fn()``, failing the test if it runs past ``seconds`` (before the fix, a dripping reply
    held its episode for as long as the server kept dripping)."""
    box = {}
    thread = threading.Thread(target=lambda: box.update(value=fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return box["value"]


def answer(body):
    return {"content": "\\boxed{0}"}


# the client's timeout: what cuts the drip; room for the next episode's reply on a loaded machine
@pytest.mark.parametrize("fault, timeout, says", [({"drip": 0.1}, 3.0, "no whole reply within 3 s"),
                                                  ({"endless": True}, 30.0, "over the limit of 1048576 bytes"),
                                                  ({"huge": 2 << 20}, 30.0, "over the limit of 1048576")])
def test_a_dripping_endless_or_huge_reply_fails_its_episode_in_time(tmp_path, fault, timeout, says):
    with FakeChatServer(answer, faults=[fault]) as server:
        policy = ChatPolicy("test-model", base_url=server.url, timeout=timeout, max_retries=0,
                            max_reply_bytes=1 << 20)
        start = time.monotonic()
        result = within(90, lambda: evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=2, concurrency=1,
                                             preflight=False, out=tmp_path / "run"))
        seconds = time.monotonic() - start
    first, second = result.records
    assert says in first["error"] and first["reward"] is None and not first["success"]
    assert second["error"] is None  # the run went on
    assert seconds < 60  # bounded generously: before, the drip held the episode for 10 minutes
    assert result.summary["failed_episodes"] == 1 and result.summary["scored_episodes"] == 1


def test_malformed_replies_fail_only_their_episodes_and_are_left_out_of_the_mean(tmp_path):
    def completion(**change):
        reply = {"id": "x", "object": "chat.completion", "model": "test-model",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "\\boxed{0}"},
                              "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        for path, value in change.items():
            *parents, last = path.split("__")
            target = reply
            for part in parents:
                target = target[int(part)] if part.isdigit() else target[part]
            target[int(last) if last.isdigit() else last] = value
        return {"body": reply}

    faults = [completion(usage__prompt_tokens="many"), completion(choices__0__message__content=5),
              completion(choices__0__message__tool_calls="call it"), completion(choices__0="x"),
              completion(choices__0__finish_reason=["stop"]), None]
    says = ["usage.prompt_tokens", "message.content", "message.tool_calls", "choices[0]", "finish_reason"]
    with FakeChatServer(answer, faults=faults) as server:
        policy = ChatPolicy("test-model", base_url=server.url, max_retries=0)
        result = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=6, concurrency=1, preflight=False,
                          out=tmp_path / "run")
    for record, field in zip(result.records, says):
        assert record["error"].startswith("the endpoint's reply is malformed: " + field), record["error"]
        assert record["reward"] is None
    assert result.records[5]["error"] is None
    assert result.summary["failed_episodes"] == 5 and result.summary["scored_episodes"] == 1
    assert result.summary["mean_reward"]["value"] == result.records[5]["reward"]  # failures are no zeros
    assert any("left out" in note for note in result.summary["notes"])


def test_an_env_that_raises_fails_its_episode_and_the_run_goes_on():
    calls = []

    def bad_then_good(obs, info):
        calls.append(1)
        return Turn(action=12345) if len(calls) == 1 else "\\boxed{0}"  # an int: the env's step raises

    result = evaluate(ENV, bad_then_good, env_kwargs=ENV_KWARGS, tasks=3, concurrency=1)
    assert result.records[0]["error"].startswith("the env's step raised")
    assert [r["error"] for r in result.records[1:]] == [None, None]


def test_a_key_echoed_by_the_server_is_not_recorded(tmp_path):
    with FakeChatServer(answer, api_key=KEY, faults=[{"echo_headers": True}] * 2) as server:
        policy = ChatPolicy("test-model", base_url=server.url, api_key=KEY, native_tools=False)
        result = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=2, concurrency=1, preflight=False,
                          out=tmp_path / "run")
    text = (tmp_path / "run" / "rollouts.jsonl").read_text()
    assert "authorization" in text.lower() and "Bearer ***" in text
    assert KEY not in text and KEY not in json.dumps(result.records)


def test_a_placeholder_key_is_not_blotted_out_of_the_models_reply(tmp_path):
    """Servers without auth take any key (vLLM's ``EMPTY``, ``x``): blotting such a key out of
    replies would turn ``\\boxed{4}`` into ``\\bo***ed{4}`` and mark right answers wrong."""
    def boxed(body):
        return {"content": "So the result is \\boxed{4}."}

    with FakeChatServer(boxed) as server:
        policy = ChatPolicy("test-model", base_url=server.url, api_key="x", native_tools=False)
        result = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=1, concurrency=1, preflight=False,
                          out=tmp_path / "run")
    assert "\\boxed{4}" in json.dumps(result.records)
    assert ChatPolicy("m", api_key=KEY).scrub(f"quoted {KEY}") == "quoted ***"
