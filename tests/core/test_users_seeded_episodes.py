"""A seeded env replays its LLM user's requests, seeds included: the episode's seed comes from
``reset(seed=...)`` (and the episodes reset after it, as a vector env's autoreset does)."""

import gymnasium as gym

import benchmax_gym  # noqa: F401
from benchmax_gym import register_tool_env
from benchmax_gym.core.users import LLMUser
from benchmax_gym.testing.openai_server import FakeChatServer
from tests.core.test_users_judges_leftovers import answered, lookup


def customer(body):
    return {"content": "I am in Lima."}


def seeds_sent(env, server, seed="none"):
    """The seeds one two-turn episode's user requests carry (``seed``: reset's, or no argument)."""
    before = len(server.requests)
    env.reset() if seed == "none" else env.reset(seed=seed)
    env.step("Which city are you in?")
    env.step("And which street?")
    return [body.get("seed") for body in server.requests[before:]]


def test_a_seeded_env_replays_its_llm_users_seeds_and_an_unseeded_one_sends_none():
    with FakeChatServer(customer) as server:
        user = LLMUser(model="test-model", base_url=server.url, api_key="k", temperature=1.0)
        register_tool_env("seeded/Travel-v0", tools=[lookup], tasks=[{"prompt": "Where am I?"}], rubric=[answered],
                          user=user)
        env = gym.make("seeded/Travel-v0")
        unseeded = seeds_sent(env, server)
        first, after = seeds_sent(env, server, 3), seeds_sent(env, server)
        again, after_again = seeds_sent(env, server, 3), seeds_sent(env, server)
        other = seeds_sent(env, server, 4)
        env.close()
    assert unseeded == [None, None]
    assert all(type(s) is int for s in first + after) and len(set(first + after)) == 4
    assert (again, after_again) == (first, after) and other != first
