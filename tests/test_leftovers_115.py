"""Leftovers from audits: a simulated user's huge reply is cut (in the transcript too) and its
sync ``reply()`` closes its client; an oversized model reply is never retried; a mixture's
member whose close raises is named in the log while the others still close."""

import asyncio
import logging

import gymnasium as gym
import psutil
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym import register_tool_env
from benchmax_gym.core.users import STOP, LLMUser, UserUsage
from benchmax_gym.eval import ChatPolicy, evaluate
from benchmax_gym.eval.policies import PolicyError
from benchmax_gym.testing.openai_server import FakeChatServer


def lookup(city: str) -> str:
    """Look up a city's country.

    Args:
        city: the city's English name
    """
    return {"Lima": "Peru"}.get(city, "unknown")


def rambler(body):
    """A user model that answers with 50,000 characters, then 5,000 more before its stop token."""
    if body["messages"][-1]["content"].startswith("Which city"):
        return {"content": "I am in Lima. " + "x" * 50_000}
    return {"content": "y" * 5_000 + f" {STOP}"}


def test_a_huge_user_reply_is_cut_in_the_transcript_and_in_what_is_sent_back():
    with FakeChatServer(rambler) as server:
        user = LLMUser(model="test-model", base_url=server.url, api_key="k", max_reply_chars=1_000)
        if "leftovers115/Rambler-v0" not in gym.registry:
            register_tool_env("leftovers115/Rambler-v0", tools=[lookup], rubric=[lambda completion: 0.0], user=user,
                              tasks=[{"prompt": "Which country am I in?", "answer": "Peru"}])
        env = gym.make("leftovers115/Rambler-v0")
        env.reset(seed=0)
        obs, _, terminated, _, info = env.step("Which city are you in?")
        said = info["messages"][-1]["content"]
        assert not terminated and len(said) <= 1_000 and said.startswith("I am in Lima. x")
        assert "[truncated: " in said and obs.startswith(said)
        assert env.unwrapped.episode.messages[-1]["content"] == said  # the transcript holds the cut reply
        _, _, terminated, _, info = env.step("Anything else?")  # the stop token after the cut still ends it
        last = env.unwrapped.episode.messages[-1]
        env.close()
        sent = server.requests
    assert terminated and last["role"] == "user" and len(last["content"]) <= 1_000 and "[truncated: " in last["content"]
    assert len(sent) == 2 and {"role": "assistant", "content": said} in sent[1]["messages"]
    with pytest.raises(ValueError, match="max_reply_chars must be a positive int"):
        LLMUser(model="test-model", max_reply_chars=0)


def test_the_sync_reply_closes_its_connection():
    """``reply()`` runs on a loop of its own: before, each call left that loop's client, and its
    connection to the endpoint, open."""
    with FakeChatServer(lambda body: {"content": "I am in Lima."}) as server:
        user = LLMUser(model="test-model", base_url=server.url, api_key="k")
        for _ in range(2):
            assert user.reply([{"role": "assistant", "content": "Where are you?"}], None, UserUsage()) == "I am in Lima."
        process = psutil.Process()
        connections = (getattr(process, "net_connections", None) or process.connections)(kind="tcp")
        open_to_server = [c for c in connections if c.raddr and c.raddr.port == server.port]
        assert open_to_server == []
        assert len(server.requests) == 2


def answer(body):
    return {"content": "\\boxed{0}"}


def test_an_oversized_reply_is_not_retried_and_fails_with_its_own_message(tmp_path):
    """The SDK's path: openai 1.x retries whatever its HTTP client raises, so a reply over the
    size cap was fetched again and again (the same request gets the same reply) and then
    reported as an ``APIConnectionError``."""
    limit = 1 << 16
    says = f"the endpoint's reply is over the limit of {limit} bytes"
    with FakeChatServer(answer, fault_for=lambda body: {"huge": 1 << 17}) as server:
        policy = ChatPolicy("test-model", base_url=server.url, max_retries=2, max_reply_bytes=limit, transport="sdk")
        result = evaluate("benchmax/Math-v0", policy, env_kwargs={"python_tool": False}, tasks=1, preflight=False,
                          out=tmp_path / "run")
        (record,) = result.records
        assert record["outcome"] == "model_error" and record["error"] == says and record["reward"] is None
        assert len(server.requests) == 1

        async def over_httpx():  # the simulated user's client (httpx, not aiohttp)
            client = policy.client(aiohttp=False)
            try:
                with pytest.raises(PolicyError) as raised:
                    await client.post("/chat/completions", body={"model": "test-model", "messages": []}, cast_to=object)
            finally:
                await client.close()
            return str(raised.value)

        assert asyncio.run(over_httpx()) == says and len(server.requests) == 2


class _Member(gym.Env):
    """A member that counts its closes; ``fail``: its close raises (a user's env with a bug)."""

    observation_space = action_space = benchmax_gym.UnicodeText(100)
    closed: list[str] = []

    def __init__(self, name="ok", fail=False):
        self.name, self.fail = name, fail

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "go", {"task_id": "0"}

    def step(self, action):
        return "done", 0.0, True, False, {}

    def close(self):
        _Member.closed.append(self.name)
        if self.fail:
            raise RuntimeError("the member's close broke")


def test_a_member_whose_close_raises_is_logged_by_name_and_the_others_still_close(caplog):
    gym.register("leftovers115/CloseRaises-v0", entry_point=_Member, kwargs={"name": "bad", "fail": True},
                 disable_env_checker=True)
    gym.register("leftovers115/Closes-v0", entry_point=_Member, disable_env_checker=True)
    try:
        mix = gym.make("benchmax/Mix-v0", members={"leftovers115/CloseRaises-v0": 0.5, "leftovers115/Closes-v0": 0.5},
                       disable_env_checker=True)
        for member in ("CloseRaises-v0", "Closes-v0"):
            mix.reset(seed=0, options={"member": member})
        _Member.closed.clear()
        with caplog.at_level(logging.WARNING, logger="benchmax_gym.mix"):
            mix.close()
    finally:
        gym.registry.pop("leftovers115/CloseRaises-v0", None)
        gym.registry.pop("leftovers115/Closes-v0", None)
    assert sorted(_Member.closed) == ["bad", "ok"]
    (warned,) = [r for r in caplog.records if r.name == "benchmax_gym.mix"]
    assert "CloseRaises-v0" in warned.getMessage() and "the member's close broke" in warned.getMessage()


def test_a_reply_over_the_cap_drops_one_generated_question_not_the_run():
    """`tasks from-corpus --model`: an oversized reply raised a PolicyError out of the gather of
    every request, ending the run; other failed requests are counted and skipped."""
    from benchmax_gym.data.questions import ModelGenerator

    with FakeChatServer(answer, fault_for=lambda body: {"huge": 1 << 17}) as server:
        generator = ModelGenerator("test-model", base_url=server.url, max_retries=0)
        policy = ChatPolicy("test-model", base_url=server.url, max_retries=0, max_reply_bytes=1 << 16)

        async def ask():
            client = policy.client()
            try:
                return await generator._ask(client, policy, "test-model", "a question, please", asyncio.Semaphore(1))
            finally:
                await client.close()

        assert asyncio.run(ask()) is None
    assert generator.errors == {"PolicyError": 1}
