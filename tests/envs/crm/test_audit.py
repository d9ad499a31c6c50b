"""CRM audit: answers in another correct form or hedged, hostile look-up keys, episode isolation,
and task generation and org loading safe from another episode's query at its heap bound."""

import ctypes
import json
import threading
import time

import _sqlite3
import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import Task
from benchmax_gym.envs.crm import tools
from benchmax_gym.envs.crm.service import amount_text

GUARD = 60  # seconds: a hang guard only


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("crm-cache"))


@pytest.fixture(scope="module")
def service(cache):
    env = gym.make("benchmax/CRM-Service-v0", cache_dir=cache, task_args={"task_types": ["refund_request"]})
    yield env
    env.close()


def call(env, name, **arguments):
    return env.unwrapped.format.render_calls([(name, arguments)])


def dump(con):
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    return {t: con.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall() for t in tables}


# -- grading ------------------------------------------------------------------------------------


def test_a_refund_amount_written_with_digit_groups_is_stated(service):
    """The solver's episode, its refunded amount told as "$1,142.97" (was: statements 0.0)."""
    tasks = service.unwrapped.tasks
    index = next(i for i in range(100) if tasks[i].answer["refunds"]
                 and float(next(iter(tasks[i].answer["refunds"].values()))) >= 1000)
    (amount,) = tasks[index].answer["refunds"].values()
    solver = service.unwrapped.reference_solver()
    obs, info = service.reset(options={"task_index": index})
    while True:
        action = solver(obs, info)
        if amount in action and "<" not in action:  # what it says to the customer
            action = action.replace(amount, f"${float(amount):,.2f}")
            assert f"{float(amount):,.2f}" != amount and amount not in action
        obs, reward, terminated, truncated, info = service.step(action)
        if terminated or truncated:
            break
    assert info["reward_components"] == {"resolved": 1.0, "state": 1.0, "statements": 1.0}
    assert amount_text(float(amount)) == amount


def status_reply(cache, text):
    env = gym.make("benchmax/CRM-Service-v0", cache_dir=cache, task_args={"task_types": ["case_status"]})
    env.reset(options={"task_index": 0})
    number, status = env.unwrapped.episode.task.answer["statements"]
    _, _, terminated, _, info = env.step(text.format(number=number, status=status))
    env.close()
    assert terminated
    return info["reward_components"]["statements"]


@pytest.mark.parametrize("guess", ["Your case {number} is New, Working or Escalated.",
                                   "Case {number}: status **{status}** (or New/Escalated/Working)."])
def test_listing_the_statuses_is_a_guess_not_the_status(cache, guess):
    assert status_reply(cache, guess) == 0.0  # was 1.0: the right number and every status
    assert status_reply(cache, "Your case {number} is {status}; our team is working on it, and you will hear "
                               "from us once it is closed.") == 1.0


def test_a_list_answer_in_lines_or_with_a_trailing_comma_matches_and_a_longer_list_does_not(cache):
    org = gym.make("benchmax/CRM-v0", cache_dir=cache, org_size=200).unwrapped.org
    agents = [r[0] for r in org.pristine.execute("SELECT Id FROM User ORDER BY Id LIMIT 3")]
    task = Task("pair", "Which two agents are first by Id?", agents[:2], metadata={"reward_metric": "exact_match"})
    env = gym.make("benchmax/CRM-v0", tasks=[task], cache_dir=cache, org_size=200)

    def reward(answer):
        env.reset(seed=0)
        return env.step(f"<answer>{answer}</answer>")[1]

    assert reward(f"\n- {agents[1]}\n- {agents[0]}\n") == 1.0  # was 0.0
    assert reward(f"{agents[0]}, {agents[1]},") == 1.0  # was 0.0
    assert reward(f"{agents[0]}; {agents[1]}") == 1.0  # was 0.0
    assert reward(f"{agents[1]}, {agents[0]}") == 1.0
    assert reward(", ".join(agents)) == 0.0 and reward(agents[0]) == 0.0
    assert reward(f"{agents[0]} or {agents[1]}") == 0.0
    env.close()


# -- hostile arguments --------------------------------------------------------------------------


def test_a_lone_surrogate_in_a_key_is_not_found_not_a_crash(service):
    """JSON's "\\ud800" escape gives a string SQLite cannot take (was: "tool 'get_case' failed:
    UnicodeEncodeError ...")."""
    service.reset(options={"task_index": 0})
    con = service.unwrapped.episode.state["db"].con
    before = dump(con)
    number = con.execute("SELECT CaseNumber FROM \"Case\" WHERE Status = 'Working' LIMIT 1").fetchone()[0]
    for name, arguments, says in [
        ("get_case", {"case_id": "\ud800"}, "no Case with Id"),
        ("get_live_chat_transcript", {"case_id": "500\udfff"}, "no Case with Id"),
        ("get_order_history", {"contact_id": "\ud800"}, "no Contact with Id"),
        ("update_case", {"case_id": "\ud800", "status": "Working"}, "no Case with Id"),
        ("update_case", {"case_id": number, "owner_id": "005\ud800"}, "no active User"),
        ("issue_refund", {"case_id": "\ud800", "amount": 1}, "no Case with Id"),
    ]:
        obs, _, _, _, info = service.step(call(service, name, **arguments))
        assert info["error"] == "tool_error" and says in obs and "Unicode" not in obs, (name, obs)
    assert dump(con) == before


# -- isolation ----------------------------------------------------------------------------------


def test_two_envs_never_see_each_others_writes_and_reset_restores_the_org_exactly(cache):
    one, two = (gym.make("benchmax/CRM-v0", cache_dir=cache, org_size=200) for _ in range(2))
    one.reset(seed=0)
    two.reset(seed=0)
    pristine = dump(one.unwrapped.org.pristine)
    con = one.unwrapped.episode.state["db"].con
    case_id = con.execute("SELECT Id FROM \"Case\" WHERE Status = 'Working' LIMIT 1").fetchone()[0]
    obs, *_ = one.step(call(one, "update_case", case_id=case_id, status="Closed", resolution="Refund issued"))
    assert "updated" in obs and dump(con) != pristine
    obs, *_ = two.step(call(two, "get_case", case_id=case_id))
    assert json.loads(obs.split("\n")[1])["Status"] == "Working"
    assert dump(two.unwrapped.episode.state["db"].con) == pristine == dump(two.unwrapped.org.pristine)
    one.reset(seed=1)
    assert dump(one.unwrapped.episode.state["db"].con) == pristine
    one.close()
    two.close()


# -- the heap bound -----------------------------------------------------------------------------

needs_bound = pytest.mark.skipif(tools._HEAP is None, reason="this SQLite build exports no heap functions")
NEAR = 32_000  # less than a task's SQL or an org's load needs
GROW = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10000000) "
        "SELECT COUNT(DISTINCT near(n) || hex(zeroblob(1000)) || n) FROM r")


class Run(threading.Thread):
    """``work()`` in a thread of its own; ``outcome()`` its value or the exception it raised."""

    def __init__(self, work):
        super().__init__(daemon=True)
        self.work, self.value, self.error = work, None, None
        self.start()

    def run(self):
        try:
            self.value = self.work()
        except BaseException as exc:  # (the test's to see)
            self.error = exc

    def outcome(self):
        self.join(GUARD)
        assert not self.is_alive(), "hang"
        return self.value if self.error is None else self.error


@needs_bound
def test_tasks_and_orgs_are_made_while_another_episodes_query_holds_the_heap_bound(cache, tmp_path):
    lib = ctypes.CDLL(_sqlite3.__file__)
    used, hard = lib.sqlite3_memory_used, lib.sqlite3_hard_heap_limit64
    used.restype = hard.restype = ctypes.c_int64
    hard.argtypes = [ctypes.c_int64]
    types = {"task_types": ["knowledge_qa", "named_entity_disambiguation"]}
    twins = [(gym.make("benchmax/CRM-v0", cache_dir=cache, org_size=200, task_args=types),
              gym.make("benchmax/CRM-Service-v0", cache_dir=cache, org_size=200)) for _ in range(2)]
    (crm, service), (crm_twin, service_twin) = twins  # (the twins' own statement caches hold the tasks' SQL)
    expected = {"crm": [crm_twin.unwrapped.tasks[i] for i in range(3)],
                "service": [service_twin.unwrapped.tasks[i] for i in range(3)]}
    hostile = gym.make("benchmax/CRM-v0", cache_dir=cache, org_size=200, query_timeout=GUARD, tool_timeout=GUARD)
    hostile.reset(seed=0)
    reached, go = threading.Event(), threading.Event()

    def near(_):
        if not reached.is_set() and hard(-1) and hard(-1) - used() < NEAR:
            reached.set()
            go.wait(GUARD)
        return ""

    hostile.unwrapped.episode.state["db"].con.create_function("near", 1, near)
    grow = Run(lambda: hostile.step(call(hostile, "query", sql=GROW)))
    try:
        assert reached.wait(GUARD)
        parts = {"crm": lambda: [crm.unwrapped.tasks[i] for i in range(3)],
                 "service": lambda: [service.unwrapped.tasks[i] for i in range(3)],
                 "loaded": lambda: gym.make("benchmax/CRM-v0", cache_dir=cache, org_size=200),  # a cached org
                 "built": lambda: gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path), org_size=200)}  # a new one
        work, deadline = {}, time.monotonic() + GUARD
        for name, part in parts.items():  # one at a time, each once the last failed or waits for the bound
            work[name] = Run(part)
            while sum(not w.is_alive() for w in work.values()) + tools._HEAP._waiting < len(work):
                assert time.monotonic() < deadline and grow.is_alive(), "hang"
                time.sleep(0.005)
    finally:
        go.set()
    obs, _, _, _, info = grow.outcome()
    assert "needed more than 256 MB" in obs  # the hostile query's own verdict
    done = {name: w.outcome() for name, w in work.items()}
    # was: a MemoryError out of each (the task's SQL, the org's load, the org's build)
    assert {name: type(value).__name__ for name, value in done.items() if isinstance(value, BaseException)} == {}
    assert {name: done[name] for name in expected} == expected  # the same tasks as without the bound
    orgs = [dump(env.unwrapped.org.pristine) for env in (done["loaded"], done["built"], crm)]
    assert orgs[0] == orgs[1] == orgs[2]
    for env in (crm, service, crm_twin, service_twin, hostile, done["loaded"], done["built"]):
        env.close()
