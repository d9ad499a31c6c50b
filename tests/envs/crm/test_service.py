"""benchmax/CRM-Service-v0 (issue 31): a simulated customer holds the facts, the agent works the
org under the policy, the reward needs the right final org AND the required statements."""

import json
import math

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.users import STOP
from benchmax_gym.envs.crm.service import REPLACEMENT, scripted_customer
from benchmax_gym.testing import aplay, play
from benchmax_gym.testing.openai_server import FakeChatServer

ID = "benchmax/CRM-Service-v0"
ASK = "What is your order number, and what is the email address on the order?"


@pytest.fixture(scope="module")
def env():
    env = gym.make(ID)
    yield env
    env.close()


def kinds(env, n=60):
    """Task indices by kind: an eligible refund, a refused one, a customer who cannot be verified,
    a status question."""
    found = {}
    for i in range(n):
        answer = env.unwrapped.tasks[i].answer
        kind = ("unverified" if answer["statements"] == ["verify"] else "status" if not answer["Case"]
                else "refund" if answer["refunds"] else "replacement")
        found.setdefault(kind, i)
    assert set(found) == {"status", "refund", "replacement", "unverified"}
    return found


def call(env, name, **arguments):
    return env.unwrapped.format.render_calls([(name, arguments)])


def run(env, index, actions):
    """Reset to task ``index`` and step ``actions``; the last info."""
    env.reset(options={"task_index": index})
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return terminated, info


def target(env, index):
    task = env.unwrapped.tasks[index]
    (case_id,) = task.answer["Case"] or [None]
    return task, case_id


def test_the_solver_reaches_1_on_every_kind_of_task_sync_and_async(env):
    for index in range(40):
        played = play(env, options={"task_index": index})
        assert played.terminated and played.info["reward_components"] == {"resolved": 1.0, "state": 1.0,
                                                                          "statements": 1.0}, index
        assert played.observations[1].startswith("My order number is")  # asked, then told
    kinds(env)
    async_env = gym.make(ID)
    played = asyncio_play(async_env, 3)
    assert played.reward == 1.0
    async_env.close()


def asyncio_play(env, index):
    import asyncio

    return asyncio.run(aplay(env, options={"task_index": index}))


def test_the_customers_facts_are_asked_for_and_their_private_part_never_shown(env):
    checked = 0
    for index in range(12):
        obs, info = env.reset(options={"task_index": index})
        private = env.unwrapped.episode.task.private["user"]
        shown = obs + json.dumps(info, default=str)
        assert private["facts"]["order number"] not in shown and private["facts"]["email"] not in shown
        answer = env.unwrapped.episode.task.answer  # the refund, the case number: found, never given
        secrets = [*answer["refunds"].values(), *(s for s in answer["statements"] if s.isdigit()), *answer["Case"]]
        checked += len(secrets)
        assert not [s for s in secrets if s in shown]
        played = play(env, options={"task_index": index})
        record = json.dumps([played.observations, played.infos, env.unwrapped.episode_record()], default=str)
        assert private["goal"] not in record
    assert checked


def test_a_refund_outside_the_policy_a_wrong_amount_or_a_silent_agent_earns_0(env):
    found = kinds(env)
    task, case_id = target(env, found["replacement"])
    _, info = run(env, found["replacement"], [ASK, call(env, "issue_refund", case_id=case_id, amount=1.0),
                                              "Refunds are only possible within 30 days; a replacement is coming."])
    assert info["reward_components"]["state"] == 0.0 and info["reward_components"]["resolved"] == 0.0
    task, case_id = target(env, found["refund"])
    amount = float(task.answer["refunds"][case_id])
    _, info = run(env, found["refund"], [ASK, call(env, "issue_refund", case_id=case_id, amount=amount - 1),
                                         f"I have refunded {amount - 1:.2f}."])
    assert info["reward_components"] == {"resolved": 0.0, "state": 0.0, "statements": 0.0}
    _, info = run(env, found["refund"], [ASK, call(env, "issue_refund", case_id=case_id, amount=amount),
                                         "It is done."])
    assert info["reward_components"] == {"resolved": 0.0, "state": 1.0, "statements": 0.0}  # AND, not OR
    _, info = run(env, found["refund"], [ASK, call(env, "issue_refund", case_id=case_id, amount=amount),
                                         f"I have refunded {amount:.2f}."])
    assert info["reward_components"] == {"resolved": 1.0, "state": 1.0, "statements": 1.0}


def test_a_change_the_customer_did_not_ask_for_earns_0(env):
    found = kinds(env)
    task = env.unwrapped.tasks[found["status"]]
    number, status = task.answer["statements"]
    closed = call(env, "update_case", case_id=number, status="Closed", resolution=REPLACEMENT)
    _, info = run(env, found["status"], [ASK, closed, f"Your case {number} is {status}."])
    assert info["reward_components"] == {"resolved": 0.0, "state": 0.0, "statements": 1.0}
    task, case_id = target(env, found["replacement"])
    other = env.unwrapped.tasks[found["refund"]]
    (other_case,) = other.answer["Case"]
    _, info = run(env, found["replacement"], [
        ASK, call(env, "update_case", case_id=case_id, status="Closed", resolution=REPLACEMENT),
        call(env, "issue_refund", case_id=other_case, amount=1.0),  # someone else's case: collateral
        "Refunds are only possible within 30 days of the order date; a replacement is on its way."])
    assert info["reward_components"]["state"] == 0.0


def test_issue_refund_refuses_what_it_cannot_do_and_leaves_the_case_as_it_was(env):
    found = kinds(env)
    task, case_id = target(env, found["refund"])
    amount = float(task.answer["refunds"][case_id])
    env.reset(options={"task_index": found["refund"]})
    for bad in (amount + 1, 0, -5):
        _, _, _, _, info = env.step(call(env, "issue_refund", case_id=case_id, amount=bad))
        assert info["error"] == "tool_error" and "at most" in info["messages"][0]["content"]
    _, _, _, _, info = env.step(call(env, "query", sql=f"UPDATE \"Case\" SET Status = 'Closed' WHERE Id = '{case_id}'"))
    assert info["error"] == "tool_error" and "read-only" in info["messages"][0]["content"]
    assert env.unwrapped.episode.state["db"].touched == set()
    env.step(call(env, "issue_refund", case_id=case_id, amount=amount))
    _, _, _, _, info = env.step(call(env, "issue_refund", case_id=case_id, amount=amount))
    assert info["error"] == "tool_error" and "closed" in info["messages"][0]["content"]


def test_the_scripted_customer_answers_questions_about_its_facts_only(env):
    task = env.unwrapped.tasks[0]
    facts = task.private["user"]["facts"]

    def says(text):
        return scripted_customer([{"role": "user", "content": task.prompt}, {"role": "assistant", "content": text}],
                                 task)

    assert says(ASK) == f"My order number is {facts['order number']}. My email is {facts['email']}."
    assert says("Your email is on file. What is your order number?") == f"My order number is {facts['order number']}."
    assert says("What went wrong?").startswith("The problem is:")
    assert says("The order number is noted. Anything else?").endswith(STOP)  # not a question about a fact
    assert says("<tool_call>What is your password?</tool_call>").endswith(STOP)


def _llm_customer(body):
    """A model playing the customer from its system prompt (the facts), on a loopback server."""
    system = body["messages"][0]["content"]
    facts = json.loads(system[system.index("{"):])["facts"]
    if body["messages"][-1]["content"].rstrip().endswith("?"):
        return {"content": f"My order number is {facts['order number']}. My email is {facts['email']}."}
    return {"content": f"Thanks! {STOP}"}


def test_an_llm_customer_on_request_plays_the_same_tasks_and_is_counted():
    with FakeChatServer(_llm_customer) as server:
        env = gym.make(ID, user="llm", user_args={"model": "test-model", "base_url": server.url, "api_key": "k",
                                                  "price": (0.5, 1.5)})
        played = play(env, options={"task_index": 2})
        env.close()
        sent = server.requests
    assert played.reward == 1.0 and played.info["user"]["calls"] == 2 and played.info["user"]["cost"] > 0
    assert "goal" in sent[0]["messages"][0]["content"] and sent[0]["messages"][-1]["content"] == (
        "I can help with that. " + ASK)


def test_an_llm_customer_whose_endpoint_is_down_fails_the_episode_not_the_reward():
    with FakeChatServer(_llm_customer, faults=[{"status": 503}] * 2) as server:
        env = gym.make(ID, user="llm", user_args={"model": "test-model", "base_url": server.url, "max_retries": 1})
        env.reset(options={"task_index": 0})
        _, reward, terminated, truncated, info = env.step(ASK)
        env.close()
    assert math.isnan(reward) and truncated and info["outcome"] == "model_error"


@pytest.mark.parametrize("kwargs, match", [
    ({"user": "robot"}, "user must be one of"),
    ({"user": "llm"}, "user_args"),
    ({"user_args": {"model": "m"}}, "user_args apply only"),
    ({"user": "llm", "user_args": {"model": "m", "temprature": 1}}, "temprature"),
    ({"task_args": {"task_types": ["refund"]}}, "task_types"),
])
def test_bad_arguments_fail_at_make_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gym.make(ID, **kwargs)


ENDPOINT = {"model": "m", "base_url": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize("key, value, says", [
    ("timeout", "x", "timeout must be a positive number up to .* seconds, got 'x'"),
    ("timeout", -1, "timeout must be a positive number up to .* seconds, got -1"),
    ("max_retries", -3, "max_retries must be an int from 0 to 100, got -3"),
    ("base_url", 5, r"base_url 5: expected http\(s\)://HOST\[:PORT\]/v1"),
    ("base_url", "not a url", r"base_url 'not a url': expected http\(s\)://HOST\[:PORT\]/v1"),
    ("base_url", "http://127.0.0.1:abc/v1", r"base_url .*: not a valid URL \(its port is not a number\)"),
    ("instructions", 5, "instructions must be text"),
    ("temperature", math.nan, "temperature must be a finite number, 0 or more, got nan"),
    ("extra_body", 5, "extra_body must be a dict, got 5"),
])
def test_bad_llm_user_arguments_fail_at_make_naming_user_args_and_the_key(key, value, says):
    """Each made fine and failed every episode (env_error/model_error, a traceback logged):
    a TypeError, the SDK's ValueError, httpx's "Invalid type for url"; a NaN temperature as "the
    user simulator's reply is not valid JSON"; extra_body=5 a bare AttributeError at make."""
    with pytest.raises(ValueError, match=f"^user_args: {says}"):
        gym.make(ID, user="llm", user_args={**ENDPOINT, key: value})


def test_the_cli_names_a_bad_user_arg_in_one_line():
    """It printed a traceback for every episode and exited 0 with "errors 0"."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from cli_in_process import run_in_process

    out = run_in_process("run", ID, "--env-arg", "user=llm", "--env-arg",
                         'user_args={"model":"m","base_url":"http://127.0.0.1:9/v1","timeout":"x"}')
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"benchmax-gym: error: cannot make {ID}: user_args: timeout must be a positive number up to "
        f"{__import__('threading').TIMEOUT_MAX:g} seconds, got 'x'"]


def test_an_llm_customer_answers_in_vector_workers():
    """The simulator travels to worker processes (pickled, the key with it, never its clients)."""
    with FakeChatServer(_llm_customer) as server:
        envs = gym.make_vec(ID, num_envs=2, user="llm",
                            user_args={"model": "test-model", "base_url": server.url, "api_key": "k"})
        try:
            envs.reset(seed=0, options={"task_index": 0})
            obs, _, terminated, truncated, info = envs.step([ASK, ASK])
        finally:
            envs.close()
    assert all(o.startswith("My order number is") for o in obs) and not (terminated.any() or truncated.any())
    assert list(info["user"]["calls"]) == [1, 1] and len(server.requests) == 2


def test_eval_records_and_totals_what_the_llm_customer_cost():
    from benchmax_gym.eval import evaluate

    with FakeChatServer(_llm_customer) as server:
        kwargs = {"user": "llm", "user_args": {"model": "test-model", "base_url": server.url, "api_key": "k",
                                                "price": (1.0, 1.0)}}
        result = evaluate(ID, "solver", env_kwargs=kwargs, tasks=2, k=1, concurrency=2)
    assert [r["success"] for r in result.records] == [True, True]
    assert [r["user"]["calls"] for r in result.records] == [2, 2]
    total = result.run["usage"]["user"]
    assert total["calls"] == 4 and total["cost"] == pytest.approx(sum(r["user"]["cost"] for r in result.records))


def test_a_customer_who_cannot_be_verified_gets_nothing_changed(env):
    found = kinds(env)
    index = found["unverified"]
    task = env.unwrapped.tasks[index]
    env.reset(options={"task_index": index})
    _, _, _, _, info = env.step(ASK)
    given = info["messages"][0]["content"]
    assert task.private["user"]["facts"]["email"] in given  # not the order's: the agent must check
    order = task.private["user"]["facts"]["order number"]
    rows = env.unwrapped.episode.state["db"].rows(
        'SELECT c.Id, ROUND(i.UnitPrice * i.Quantity, 2) AS total FROM "Order" o JOIN OrderItem i ON i.OrderId = o.Id '
        "JOIN \"Case\" c ON c.OrderItemId__c = i.Id WHERE o.OrderNumber = ? AND c.Status != 'Closed'", (order,))
    refund = call(env, "issue_refund", case_id=rows[0]["Id"], amount=rows[0]["total"])
    _, info = run(env, index, [ASK, refund, f"I have refunded {rows[0]['total']:.2f}; I could not verify you first."])
    assert info["reward_components"] == {"resolved": 0.0, "state": 0.0, "statements": 0.0}  # (a claimed refund)
    _, info = run(env, index, [ASK, "I am sorry, I cannot verify your identity, so I cannot change anything."])
    assert info["reward_components"]["resolved"] == 1.0
