"""CRM-Service: a reply that names every open case's number is a guess, not the statement of the
customer's case."""

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

ID = "benchmax/CRM-Service-v0"


@pytest.fixture(scope="module")
def env():
    env = gym.make(ID)
    yield env
    env.close()


def status_task(env):
    tasks = env.unwrapped.tasks
    return next(i for i in range(60) if not tasks[i].answer["Case"] and tasks[i].answer["statements"] != ["verify"])


def reply(env, index, text):
    env.reset(options={"task_index": index})
    _, _, terminated, _, info = env.step(text)
    assert terminated
    return info["reward_components"]


def test_listing_every_open_case_number_earns_nothing(env):
    index = status_task(env)
    number, status = env.unwrapped.tasks[index].answer["statements"]
    numbers = [n for (n,) in env.unwrapped.org.pristine.execute(
        "SELECT CaseNumber FROM \"Case\" WHERE Status IN ('New', 'Working', 'Escalated') ORDER BY CaseNumber")]
    assert number in numbers and len(numbers) > 10
    # without asking the customer anything: every open case, every open status (was resolved 1.0)
    got = reply(env, index, f"Your case is one of {', '.join(numbers)}; its status is New, Working or Escalated.")
    assert got == {"resolved": 0.0, "state": 1.0, "statements": 0.0}
    other = next(n for n in numbers if n != number)
    assert reply(env, index, f"Your case {number} (not {other}) is {status}.")["statements"] == 0.0


def test_the_right_case_number_with_the_customers_order_number_still_counts(env):
    index = status_task(env)
    task = env.unwrapped.tasks[index]
    number, status = task.answer["statements"]
    order = task.private["user"]["facts"]["order number"]
    got = reply(env, index, f"Your case {number} about order {order}, placed for $12.50, is {status}.")
    assert got == {"resolved": 1.0, "state": 1.0, "statements": 1.0}
