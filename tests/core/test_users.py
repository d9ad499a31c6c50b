"""Simulated users (issue 31): a third party who answers replies without a tool call, ends the
episode when done, fails as an outcome, and whose private instructions never reach the model."""

import asyncio
import json
import math
import re

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym import register_tool_env
from benchmax_gym.core.users import STOP, LLMUser, UserReply
from benchmax_gym.testing import aplay, play
from benchmax_gym.testing.openai_server import FakeChatServer

SECRET = "the-password-is-7f3a"  # what only the user knows, never the model


def lookup(city: str) -> str:
    """Look up a city's country.

    Args:
        city: the city's English name
    """
    return {"Lima": "Peru", "Oslo": "Norway"}.get(city, "unknown")


def answered(messages, answer) -> float:
    """1.0 when the agent told the user the answer."""
    return float(any(m["role"] == "assistant" and answer in str(m.get("content")) for m in messages))


def traveller(conversation, task):
    """Names their city when asked; done when told anything else."""
    if conversation[-1]["content"].rstrip().endswith("?"):
        return f"I am in {task.private['user']['city']}."
    return None


TASK = {"prompt": "Which country am I in?", "answer": "Peru", "user": {"city": "Lima", "note": SECRET}}
CALL = '<tool_call>{"name": "lookup", "arguments": {"city": "Lima"}}</tool_call>'


def register(env_id, user, **defaults):
    if env_id not in gym.registry:
        register_tool_env(env_id, tools=[lookup], tasks=[TASK], rubric=[answered], user=user,
                          system_prompt="Help the traveller.", **defaults)
    return env_id


def test_a_reply_without_a_call_goes_to_the_user_who_answers_and_ends_the_episode():
    env = gym.make(register("users/Travel-v0", traveller))
    obs, info = env.reset(seed=0)
    assert obs.endswith("Which country am I in?") and "sent to the user" in env.unwrapped.system_prompt
    obs, reward, terminated, truncated, info = env.step("Which city are you in?")
    assert obs == "I am in Lima." and (reward, terminated, truncated) == (0.0, False, False)
    assert info["messages"] == [{"role": "user", "content": "I am in Lima."}] and info["user"]["calls"] == 1
    obs, *_ = env.step(CALL)
    assert "Peru" in obs
    obs, reward, terminated, truncated, info = env.step("You are in Peru.")
    assert terminated and not truncated and reward == 1.0 and info["outcome"] == "scored"
    assert info["user"]["calls"] == 2 and env.unwrapped.episode_record()["user"]["calls"] == 2
    roles = [m["role"] for m in env.unwrapped.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    env.close()


def test_the_user_sees_only_the_conversation_never_tools_system_or_engine_notes():
    seen = []

    def user(conversation, task):
        seen.append([dict(m) for m in conversation])
        return "Go on?"

    env = gym.make(register("users/Seen-v0", user, max_turns=4))
    env.reset(seed=0)
    env.step(CALL)
    env.step('<tool_call>{"name": "lookup", "arguments": ')  # a parse error: an engine note to the model
    env.step("Which city?")
    assert seen == [[{"role": "user", "content": "Which country am I in?"},
                     {"role": "assistant", "content": "Which city?"}]]
    _, _, terminated, truncated, info = env.step("Still there?")
    assert truncated and not terminated and info["outcome"] == "truncated"  # the turn limit ends a chat
    assert info["reward_components"] == {"answered": 0.0}
    env.close()


@pytest.mark.parametrize("ending, words", [(None, None), (STOP, None), (f"Thanks, bye. {STOP}", "Thanks, bye."),
                                           (UserReply("Bye.", done=True), "Bye.")])
def test_every_way_a_user_ends_the_conversation(ending, words):
    """The last words before the stop token are kept in the transcript."""
    def user(conversation, task):
        return ending

    env = gym.make(register(f"users/End{abs(hash(repr(ending))) % 10**6}-v0", user))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("You are in Peru.")
    assert terminated and reward == 1.0 and info["outcome"] == "scored"
    last = env.unwrapped.messages[-1]
    assert (last == {"role": "user", "content": words}) if words else last["role"] == "assistant"
    env.close()


def broken(conversation, task):
    raise KeyError("oops")


def test_a_scripted_user_that_raises_ends_the_episode_as_env_error_never_a_reward():
    env = gym.make(register("users/Broken-v0", broken))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("Hello?")
    assert math.isnan(reward) and truncated and not terminated and info["outcome"] == "env_error"
    assert info["reward_components"] == {} and env.unwrapped.episode_record()["reward"] is None
    env.close()


def _customer_model(body):
    """An LLM customer on a loopback server: knows the city from its system prompt."""
    system, last = body["messages"][0]["content"], body["messages"][-1]
    assert last["role"] == "user"  # the agent's words reach the simulator as the user's
    if last["content"].endswith("?"):
        return {"content": "I am in " + re.search(r'"city": "(\w+)"', system).group(1) + "."}
    return {"content": f"Thank you. {STOP}"}


def test_an_llm_user_over_an_endpoint_is_counted_costed_and_its_instructions_stay_private():
    with FakeChatServer(_customer_model, api_key="sk-test-secret") as server:
        user = LLMUser(model="test-model", base_url=server.url, api_key="sk-test-secret", price=(1.0, 2.0))
        env = gym.make(register("users/LLM-v0", user))
        replies = ["Which city are you in?", CALL, "You are in Peru."]
        played = play(env, lambda obs, info: replies[info["turn"]], seed=0)
        record = env.unwrapped.episode_record()
        env.close()
        sent = server.requests
    assert played.terminated and played.reward == 1.0 and played.observations[1] == "I am in Lima."
    assert len(sent) == 2 and SECRET in sent[0]["messages"][0]["content"]
    assert [m["role"] for m in sent[1]["messages"]] == ["system", "assistant", "user", "assistant", "user"]
    assert not any("tool_response" in str(m) or "Peru" in str(m) for m in sent[1]["messages"][:-1])
    usage = played.info["user"]
    assert usage["calls"] == 2 and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["cost"] == pytest.approx((usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 2.0) / 1e6)
    shown = json.dumps([played.observations, played.infos, record], default=str)
    assert SECRET not in shown and "sk-test-secret" not in shown


def test_an_llm_user_whose_endpoint_fails_ends_the_episode_as_model_error(caplog):
    faults = [{"status": 500, "message": "boom sk-test-secret"}] * 3
    with FakeChatServer(_customer_model, faults=faults) as server:
        user = LLMUser(model="test-model", base_url=server.url, api_key="sk-test-secret", max_retries=2)
        env = gym.make(register("users/Down-v0", user))
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("Which city are you in?")
        record = env.unwrapped.episode_record()
        env.close()
    assert math.isnan(reward) and truncated and not terminated and info["outcome"] == "model_error"
    assert record["reward"] is None and info["user"]["calls"] == 1 and len(server.requests) == 3
    assert info["outcome_detail"].startswith("the simulated user could not answer:") and "InternalServerError" in info["outcome_detail"]
    assert "sk-test-secret" not in json.dumps([obs, info, record]) + caplog.text


def test_sync_async_and_worker_processes_play_the_same_conversation():
    env_id = register("users/Travel-v0", traveller)
    replies = ["Which city are you in?", CALL, "You are in Peru."]

    def policy(obs, info):
        return replies[info["turn"]]

    runs = []
    for runner in ("sync", "async"):
        env = gym.make(env_id)
        played = play(env, policy, seed=0) if runner == "sync" else asyncio.run(aplay(env, policy, seed=0))
        runs.append((played.observations, played.reward, env.unwrapped.messages))
        env.close()
    assert runs[0] == runs[1]
    envs = gym.make_vec(env_id, num_envs=2)
    try:
        envs.reset(seed=0)
        obs = [envs.step([r, r])[0] for r in replies]
        assert list(obs[0]) == ["I am in Lima."] * 2
        _, rewards, terminated, _, info = envs.step(["x", "x"])  # (autoreset: the next episode's first step)
    finally:
        envs.close()


def test_a_bad_user_fails_at_registration_or_make_naming_it():
    with pytest.raises(TypeError, match="user must be"):
        register_tool_env("users/Bad-v0", tools=[lookup], tasks=[TASK], rubric=[answered], user=3)
    from benchmax_gym.core import ListTasks, Rubric, Task, ToolEnv, Toolset

    with pytest.raises(TypeError, match="user must be"):
        ToolEnv(tasks=ListTasks([Task("t", "hi")]), toolset=Toolset([lookup]), rubric=Rubric([answered]), user="x")
    with pytest.raises(ValueError, match="model"):
        LLMUser(model="")


def test_an_llm_user_slower_than_the_episodes_deadline_ends_it_with_deadline():
    with FakeChatServer(_customer_model, latency=3.0) as server:
        user = LLMUser(model="test-model", base_url=server.url, api_key="k")
        env = gym.make(register("users/Slow-v0", user), episode_timeout=0.5)
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step("Which city are you in?")
        env.close()
    assert math.isnan(reward) and truncated and info["outcome"] == "deadline"


def test_a_simulator_with_only_an_async_reply_is_awaited_sync_and_async():
    from benchmax_gym.core.users import UserSimulator

    class Echo(UserSimulator):
        async def areply(self, conversation, task, usage):
            usage.calls += 1
            await asyncio.sleep(0)
            return None if "bye" in conversation[-1]["content"] else "You said: " + conversation[-1]["content"]

    env = gym.make(register("users/Echo-v0", Echo()))
    for run in (lambda p: play(env, p, seed=0), lambda p: asyncio.run(aplay(env, p, seed=0))):
        played = run(lambda obs, info: ["hello?", "You are in Peru, bye."][info["turn"]])
        assert played.observations[1] == "You said: hello?" and played.reward == 1.0
    env.close()
