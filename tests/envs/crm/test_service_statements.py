"""CRM-Service: a required statement is told, not matched in passing. The unverified customer's was
the word "verify" ("Let me verify that for you" scored 1 though the customer was never told they
cannot be verified); a status is a common word ("I am working on it" said "Working")."""

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

ID = "benchmax/CRM-Service-v0"
ASK = "What is your order number, and what is the email address on the order?"


@pytest.fixture(scope="module")
def env():
    env = gym.make(ID)
    yield env
    env.close()


def first_task(env, wanted):
    tasks = env.unwrapped.tasks
    return next(i for i in range(80) if wanted(tasks[i].answer))


def graded(env, index, *replies):
    """The reward components after asking for the facts, then ``replies`` (nothing changed)."""
    env.reset(options={"task_index": index})
    for action in (ASK, *replies):
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return info["reward_components"]


@pytest.mark.parametrize("reply, paid", [
    ("Let me verify that for you.", 0.0),
    ("I have verified your identity.", 0.0),
    ("I could not verify you at first, but I have verified your identity now.", 0.0),  # a hedge
    ("I cannot verify your identity. Actually, you are now verified.", 0.0),
    ("Can't I verify you some other way?", 0.0),  # a question
    ("I am sorry, I cannot verify your identity, so I cannot change anything.", 1.0),
    ("Unfortunately I'm unable to confirm your identity: the email doesn't match the one on the order.", 1.0),
    ("That email does not match our records, so I won't be able to make changes.", 1.0),
])
def test_an_unverified_customer_must_be_told_they_cannot_be_verified(env, reply, paid):
    index = first_task(env, lambda a: a["statements"] == ["verify"])
    assert graded(env, index, reply) == {"resolved": paid, "state": 1.0, "statements": paid}


def test_a_status_counts_only_where_the_case_is_told_not_in_passing(env):
    index = first_task(env, lambda a: not a["Case"] and a["statements"] != ["verify"])
    number, status = env.unwrapped.tasks[index].answer["statements"]
    for passing in (f"Your case is {number}. Is it {status}?",  # asked, not told
                    f"Your case is {number}. {status} things take time, thank you."):
        assert graded(env, index, passing)["statements"] == 0.0, passing
    for telling in (f"Your case is {number}. Its status is {status}.", f"Case {number}: {status.lower()}."):
        assert graded(env, index, telling) == {"resolved": 1.0, "state": 1.0, "statements": 1.0}, telling
