"""A CRM ``query``'s heap bound is SQLite's process-wide hard heap limit: while one episode's query
nears it, every other SQLite allocation in the process fails too. Episodes run side by side in
one process (eval's threads, a vector worker mixing CRM with Wikipedia), so another episode's
look-up, query, search or grading must never pay for it (a failure turned into a reward).

Episode A's query grows SQLite's heap for real (a DISTINCT over ~2 KB values built in the
query); ``hold(...)``, a function the test adds to a connection, stops a query at a chosen moment
(its first row, or once the heap is within ``NEAR`` bytes of the limit) until the test lets it go."""

import ctypes
import json
import threading
import time

import _sqlite3
import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import ListTasks, Task
from benchmax_gym.envs.crm import tools

if tools._HEAP is None:
    pytest.skip("this SQLite build exports no heap functions: no heap bound", allow_module_level=True)

_lib = ctypes.CDLL(_sqlite3.__file__)  # the SQLite Python's sqlite3 runs on
_used, _hard, _soft = _lib.sqlite3_memory_used, _lib.sqlite3_hard_heap_limit64, _lib.sqlite3_soft_heap_limit64
_used.restype = _hard.restype = _soft.restype = ctypes.c_int64
_hard.argtypes = _soft.argtypes = [ctypes.c_int64]

NEAR = 32_000  # less than any look-up, search or sort below needs (each takes 40 kB and more)
GUARD = 60  # seconds: a hang guard only
GROW = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10000000) "
        "SELECT COUNT(DISTINCT {holds} hex(zeroblob(1000)) || n) FROM r")


def near_the_limit():
    limit = _hard(-1)
    return bool(limit) and limit - _used() < NEAR


class Hold:
    """``name(x)`` in a query: the first call where ``when()`` holds says so and waits for ``go``."""

    def __init__(self, env, name, when=lambda: True):
        self.when, self.reached, self.go = when, threading.Event(), threading.Event()
        env.unwrapped.episode.state["db"].con.create_function(name, 1, self)

    def __call__(self, _):
        if not self.reached.is_set() and self.when():
            self.reached.set()
            self.go.wait(GUARD)
        return ""


class Step(threading.Thread):
    """``env.step(action)`` in a thread of its own."""

    def __init__(self, env, action):
        super().__init__(daemon=True)
        self.env, self.action, self.result = env, action, None
        self.start()

    def run(self):
        self.result = self.env.step(self.action)

    def outcome(self):
        self.join(GUARD)
        assert self.result is not None, "the step did not finish"
        obs, reward, _, _, info = self.result
        return obs, reward, info


def call(env, tool_name, **args):
    return env.unwrapped.format.render_calls([(tool_name, args)])


def wait_until(condition):
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, "hang"
        time.sleep(0.005)


def failed_or_waiting(steps):
    """Each step either finished (it failed at once: the old behaviour) or waits for the bound to lift."""
    return lambda: sum(not s.is_alive() for s in steps) + getattr(tools._HEAP, "_waiting", 0) >= len(steps)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("crm-cache"))


def crm(cache, **kwargs):
    env = gym.make("benchmax/CRM-v0", cache_dir=cache, org_size=200, query_timeout=GUARD, tool_timeout=GUARD,
                   **kwargs)
    env.reset(seed=0)
    return env


@pytest.fixture
def wikipedia(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path))
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps([{"title": f"Lantern {i}", "text": f"Lantern {i} is a novel about rivers."}
                                  for i in range(50)]))
    env = gym.make("benchmax/Wikipedia-v0", tasks=ListTasks([Task("t", "Which novel?", "Lantern 1")]),
                   backend="local", backend_args={"corpus": str(corpus)})
    env.reset(seed=0)
    yield env
    env.close()


def answer_step(env):
    """Play the reference solver up to its final answer, which is returned, not sent."""
    solver = env.unwrapped.reference_solver()
    obs, info = env.reset(seed=0, options={"task_index": 0})
    while not (action := solver(obs, info)).startswith("<answer>"):
        obs, _, _, _, info = env.step(action)
    return action


def test_other_episodes_look_ups_searches_and_grading_wait_out_a_query_at_its_bound(cache, wikipedia):
    hostile, looker, updater = crm(cache), crm(cache), crm(cache)
    grader = crm(cache, task_args={"task_types": ["route_case"]})
    answer = answer_step(grader)
    case = looker.unwrapped.episode.state["db"].con.execute('SELECT Id FROM "Case" LIMIT 1').fetchone()[0]
    near = Hold(hostile, "near", near_the_limit)
    grow = Step(hostile, call(hostile, "query", sql=GROW.format(holds="near(n) ||")))
    try:
        assert near.reached.wait(GUARD)
        innocent = [Step(looker, call(looker, "search_knowledge", query="warranty vacuum")),
                    Step(updater, call(updater, "update_case", case_id=case, priority="High")),
                    Step(wikipedia, call(wikipedia, "search", query="lantern novel")),
                    Step(grader, answer)]
        wait_until(failed_or_waiting(innocent))
    finally:
        near.go.set()
    grown, results = grow.outcome(), [s.outcome() for s in innocent]
    obs, _, info = grown
    assert info["error"] == "tool_error" and "needed more than 256 MB" in obs, obs  # A's own verdict stands
    # was: each a tool error "MemoryError" (scored as the model's), and the grading a 0
    for obs, _, info in results[:3]:
        assert info["error"] is None and "outcome" not in info, obs
    assert '"Title": ' in results[0][0] and "updated: Priority = High" in results[1][0]
    assert "1. Lantern" in results[2][0]
    assert results[3][1] == 1.0 and results[3][2]["outcome"] == "scored", results[3]
    for env in (hostile, looker, updater, grader):
        env.close()


def test_a_query_sharing_the_bound_is_not_failed_by_the_other_ones_growth(cache):
    """B's query starts while A's runs (the bound then covers both), A grows to the limit, and B
    needs memory: B's answer is its own, and so is A's memory error."""
    a, b = crm(cache), crm(cache)
    a_started = Hold(a, "started")
    a_near = Hold(a, "near", near_the_limit)
    b_started = Hold(b, "started")
    grow = Step(a, call(a, "query", sql=GROW.format(holds="started(n) || near(n) ||")))
    try:
        assert a_started.reached.wait(GUARD)
        sort = Step(b, call(b, "query", sql='SELECT started(Id) || Description || Subject || Description '
                                             'FROM "Case" ORDER BY 1 DESC'))
        assert b_started.reached.wait(GUARD)
        a_started.go.set()
        assert a_near.reached.wait(GUARD)
        b_started.go.set()
        wait_until(failed_or_waiting([sort]))
    finally:
        for hold in (a_started, a_near, b_started):
            hold.go.set()
    (sorted_obs, _, sorted_info), (obs, _, info) = sort.outcome(), grow.outcome()
    assert sorted_info["error"] is None and '"rows": [["' in sorted_obs, sorted_obs  # was: "needed more than 256 MB"
    assert info["error"] == "tool_error" and "needed more than 256 MB" in obs, obs
    a.close()
    b.close()


@pytest.fixture
def out_of_memory():
    """SQLite's heap limited (as a user may) to what it holds now: no bound of a query at all."""
    before = _hard(-1), _soft(-1)

    def limit():
        _hard(_used() + 4096)

    yield limit
    _hard(before[0])
    _soft(before[1])


def test_sqlite_short_of_memory_outside_a_query_is_the_environments_failure(cache, wikipedia, out_of_memory):
    looker = crm(cache)
    grader = crm(cache, task_args={"task_types": ["route_case"]})
    answer = answer_step(grader)
    for env, action in ((looker, call(looker, "describe_object", name="Case")),
                        (wikipedia, call(wikipedia, "search", query="lantern novel")), (grader, answer)):
        out_of_memory()  # (again: the last failed episode let its database go)
        obs, reward, _, truncated, info = env.step(action)
        # was: tool errors "MemoryError" (the model's, scored) and a grading of 0
        assert info.get("outcome") == "env_error" and truncated and reward != reward, (obs, info)  # (NaN)
    looker.close()
    grader.close()
