"""CRM-Service: a required statement is one told to the customer. An amount, "30 days" or
"replacement" in a question counted ("Would you like a replacement?" said that one is on its
way), and an aside inside "I cannot, unfortunately, verify your identity" hid that the customer
cannot be verified."""

import pytest

from tests.envs.crm.test_service_statements import env, first_task, graded  # noqa: F401 - env: the fixture


def refund_task(env):
    return first_task(env, lambda a: a["refunds"])


def replacement_task(env):
    return first_task(env, lambda a: a["statements"][-1:] == ["replacement"])


def test_an_amount_asked_about_is_not_stated(env):
    index = refund_task(env)
    amount = env.unwrapped.tasks[index].answer["statements"][0]
    assert graded(env, index, f"Would a refund of ${amount} work for you?")["statements"] == 0.0
    assert graded(env, index, f"A refund of ${amount} is on its way. Anything else?")["statements"] == 1.0


@pytest.mark.parametrize("reply, said", [
    ("Refunds are only possible within 30 days of the order. Would you like a replacement?", 0.0),
    ("Did you order it more than 30 days ago? A replacement is on its way.", 0.0),
    ("Would you like a replacement, since it is past 30 days?", 0.0),
    ("Refunds are only possible within 30 days of the order, so a replacement is on its way.", 1.0),
])
def test_the_30_day_rule_and_the_replacement_count_only_when_told(env, reply, said):
    assert graded(env, replacement_task(env), reply)["statements"] == said


@pytest.mark.parametrize("reply, paid", [
    ("I cannot, unfortunately, verify your identity.", 1.0),
    ("I am sorry: I cannot \u2014 with this email \u2014 verify your identity.", 1.0),
    ("I'm not able to, at this time, confirm your identity, so I cannot change anything.", 1.0),
    ("I could not verify you at first, but I have, happily, verified your identity.", 0.0),  # a hedge still
    ("Let me, quickly, verify that for you.", 0.0),
    ("I cannot, however, verify your identity with that email.", 1.0),
    ("I'm afraid I can't \u2014 though \u2014 confirm who you are.", 1.0),
    ("I could not verify you at first, however, I have verified your identity now.", 0.0),  # a hedge still
    ("I cannot, however, help: you are verified.", 0.0),  # a claim of the opposite still
])
def test_an_aside_inside_cannot_verify_is_read_past(env, reply, paid):
    index = first_task(env, lambda a: a["statements"] == ["verify"])
    assert graded(env, index, reply) == {"resolved": paid, "state": 1.0, "statements": paid}


@pytest.mark.parametrize("offer, said", [
    (", anything else?", 1.0),
    (" - is there anything else I can help you with today?", 1.0),
    ("; can I help with anything else?", 1.0),
])
def test_a_statement_ending_in_a_closing_offer_is_told(env, offer, said):
    """Agents close with an offer in the same sentence: "I refunded $59.99, anything else?" stated
    the refund (it was read as a question, and a correct agent scored 0). A sentence that opens as
    a question stays one: "Would a refund of $59.99 work, anything else?" refunds nothing."""
    index = refund_task(env)
    amount = env.unwrapped.tasks[index].answer["statements"][0]
    assert graded(env, index, f"A refund of ${amount} is on its way{offer}")["statements"] == said
    assert graded(env, index, f"Would a refund of ${amount} work for you{offer}")["statements"] == 0.0


def test_a_refusal_ending_in_a_closing_offer_is_told():
    """(Through the statement check itself: a reply ending in a question keeps the simulated
    customer talking, so the episode is not graded at that turn.)"""
    from benchmax_gym.envs.crm.service import statement_made

    reply = "I'm sorry, I cannot verify your identity with that email, is there anything else I can do for you?"
    assert statement_made("verify", ["verify"], reply)
    assert not statement_made("verify", ["verify"], "Can I verify you with another email, anything else?")
