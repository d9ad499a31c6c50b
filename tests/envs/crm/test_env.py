"""benchmax/CRM-v0 end to end: the solver on every task type, bad SQL and bad updates, isolation, config."""

import json
import sqlite3

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import benchmax_gym  # noqa: F401
from benchmax_gym.core.rubric import final_answer
from benchmax_gym.envs.crm.org import Org, build_org, cached_org, sf_id
from benchmax_gym.envs.crm.rubric import exact_match, fuzzy_match
from benchmax_gym.envs.crm.tasks import QA_TYPES, TASK_TYPES, UPDATE_TYPES
from benchmax_gym.testing import aplay, play

SMALL = 600  # cases: big enough for every task type, quick to build


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("crm-cache"))


def make(cache, **kwargs):
    return gym.make("benchmax/CRM-v0", cache_dir=cache, org_size=kwargs.pop("org_size", SMALL), **kwargs)



def call(env, tool_name, **args):
    return env.unwrapped.format.render_calls([(tool_name, args)])


def org_rows(con):
    """Every row of every table: the database's whole content."""
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    return {t: con.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall() for t in tables}


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_solver_solves_every_task_type_through_the_tools(cache, task_type):
    env = make(cache, task_args={"task_types": [task_type]})
    solver = env.unwrapped.reference_solver()
    for i in range(12):
        p = play(env, solver, options={"task_index": i})
        reward, info, obs, first_info = p.reward, p.info, p.observations[0], p.infos[0]
        task = env.unwrapped.episode.task
        assert task.metadata["type"] == task_type
        assert reward == 1.0 and info["reward_components"] == {"correct": 1.0, "untouched": 1.0}, task.id
        prompt = first_info["messages"][-1]["content"] + json.dumps(first_info["task_metadata"])
        if task_type in QA_TYPES and task.answer != "None":  # "None" is an answer the prompt offers
            assert str(task.answer) not in prompt
        elif task_type == "route_case":
            assert all(agent not in prompt for values in task.answer["Case"].values() for agent in values.values())


def test_solver_on_the_default_org_mixes_all_types(cache):
    env = gym.make("benchmax/CRM-v0", cache_dir=cache)  # the default size: 2,000 cases, 50 agents
    solver = env.unwrapped.reference_solver()
    types = set()
    for i in range(60):
        reward = play(env, solver, options={"task_index": i}).reward
        assert reward == 1.0, env.unwrapped.episode.task.id
        types.add(env.unwrapped.episode.task.metadata["type"])
    assert types == set(TASK_TYPES)
    assert env.unwrapped.org.pristine.execute("SELECT COUNT(*) FROM User").fetchone()[0] == 50


@pytest.mark.parametrize("tool_format", ["hermes", "json", "openai", "xml"])
def test_solver_works_in_every_tool_format(cache, tool_format):
    env = make(cache, tool_format=tool_format, task_args={"task_types": ["close_case", "named_entity_disambiguation",
                                                           "policy_violation_identification", "knowledge_qa"]})
    solver = env.unwrapped.reference_solver()
    for i in range(4):
        reward = play(env, solver, options={"task_index": i}).reward
        assert reward == 1.0


def test_wrong_answers_and_doing_nothing_score_zero(cache):
    env = make(cache)
    for i in range(30):
        env.reset(options={"task_index": i})
        task = env.unwrapped.episode.task
        _, reward, terminated, _, info = env.step("<answer>I do not know</answer>")
        assert terminated and reward == 0.0, task.id  # update tasks: nothing changed
        assert info["reward_components"]["untouched"] == 1.0


def solve_with_an_extra_update(env, solver, pick_case):
    """Play the solver's episode, adding one more priority change just before its final reply."""
    held = []

    def policy(obs, info):
        if held:
            return held.pop()
        action = solver(obs, info)
        if not action.startswith("<answer>"):
            return action
        held.append(action)
        con = env.unwrapped.episode.state["db"].con
        case_id, priority = pick_case(con, next(iter(env.unwrapped.episode.task.answer["Case"])))
        return call(env, "update_case", case_id=case_id, priority="High" if priority != "High" else "Low")

    p = play(env, policy, options={"task_index": 0})
    assert p.infos[-2]["error"] is None  # the extra update itself went through
    return p.reward, p.terminated, p.truncated, p.info


def test_collateral_changes_fail_an_update_task(cache):
    env = make(cache, task_args={"task_types": ["route_case"]})
    solver = env.unwrapped.reference_solver()
    another = lambda con, target: con.execute(  # noqa: E731
        "SELECT Id, Priority FROM \"Case\" WHERE Id != ? LIMIT 1", (target,)).fetchone()
    reward, _, _, info = solve_with_an_extra_update(env, solver, another)
    assert reward == 0.0 and info["reward_components"] == {"correct": 0.0, "untouched": 0.0}
    same = lambda con, target: con.execute(  # noqa: E731
        "SELECT Id, Priority FROM \"Case\" WHERE Id = ?", (target,)).fetchone()
    reward, _, _, info = solve_with_an_extra_update(env, solver, same)
    assert reward == 0.0 and info["reward_components"] == {"correct": 0.0, "untouched": 0.0}
    assert play(env, solver, options={"task_index": 0}).reward == 1.0


@pytest.mark.parametrize(
    "sql, says",
    [
        ('DELETE FROM "Case"', "read-only"),
        ("UPDATE \"Case\" SET Status = 'Closed'", "read-only"),
        ("DROP TABLE User", "read-only"),
        ("INSERT INTO Issue__c VALUES ('x', 'y', 'z')", "read-only"),
        ("CREATE TABLE t (a)", "read-only"),
        ("ATTACH DATABASE '/tmp/crm-evil.db' AS evil", "read-only"),
        ("SELECT load_extension('/tmp/evil.so')", "load_extension"),
        ("PRAGMA query_only = OFF", "read-only"),
        ("PRAGMA writable_schema = ON", "read-only"),
        ("VACUUM INTO '/tmp/crm-copy.db'", "read-only"),
        ("INSERT INTO Knowledge__kav_fts(Knowledge__kav_fts) VALUES ('delete-all')", "read-only"),
        ('SELECT 1; DELETE FROM "Case"', "one SQL statement"),
        ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r", "was stopped"),
        ("SELECT randomblob(1000000000)", "too big"),
        ("SELEC 1", "syntax error"),
    ],
)
def test_bad_sql_is_a_clear_tool_error_and_the_database_is_intact(cache, sql, says):
    env = make(cache, query_timeout=0.5)
    env.reset(seed=0)
    con = env.unwrapped.episode.state["db"].con
    before = org_rows(con)
    obs, _, terminated, _, info = env.step(call(env, "query", sql=sql))
    assert info["error"] == "tool_error" and says in obs and not terminated
    assert org_rows(con) == before
    obs, *_ = env.step(call(env, "query", sql='SELECT COUNT(*) FROM "Case"'))
    assert json.loads(obs.split("\n")[1])["rows"] == [[SMALL]]


def test_huge_results_are_capped_with_a_note(cache):
    env = make(cache, query_max_rows=50)
    env.reset(seed=0)
    sql = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10000000) SELECT n FROM r"
    obs, _, _, _, info = env.step(call(env, "query", sql=sql))
    result = json.loads(obs.split("\n")[1])
    assert info["error"] is None and len(result["rows"]) == 50 and result["truncated"] and "first 50 rows" in result["note"]


@pytest.mark.parametrize(
    "args, says",
    [
        ({"case_id": "500000000000000AAA", "status": "Closed"}, "no Case with Id"),
        ({"status": "Done"}, "status must be one of"),
        ({"priority": "Urgent"}, "priority must be one of"),
        ({"resolution": "Fixed it"}, "resolution must be one of"),
        ({"owner_id": "005000000000000AAA"}, "no active User"),
        ({}, "nothing to update"),
    ],
)
def test_bad_updates_are_clear_tool_errors_and_change_nothing(cache, args, says):
    env = make(cache)
    env.reset(seed=0)
    con = env.unwrapped.episode.state["db"].con
    case_id = con.execute("SELECT Id FROM \"Case\" WHERE Status = 'Working' LIMIT 1").fetchone()[0]
    before = org_rows(con)
    obs, _, _, _, info = env.step(call(env, "update_case", **{"case_id": case_id, **args}))
    assert info["error"] == "tool_error" and says in obs
    assert org_rows(con) == before
    obs, _, _, _, info = env.step(call(env, "update_case", case_id=case_id, status="Closed"))
    assert "needs a resolution" in obs and org_rows(con) == before


def test_updates_are_logged_and_never_leak_into_the_next_episode(cache):
    env = make(cache)
    env.reset(seed=0)
    con = env.unwrapped.episode.state["db"].con
    case_id, number = con.execute("SELECT Id, CaseNumber FROM \"Case\" WHERE Status = 'Working' LIMIT 1").fetchone()
    obs, _, _, _, info = env.step(call(env, "update_case", case_id=number, status="Closed", resolution="Refund issued"))
    assert info["error"] is None and "Status = Closed" in obs
    obs, *_ = env.step(call(env, "get_case", case_id=case_id))
    case = json.loads(obs.split("\n")[1])
    assert case["Status"] == "Closed" and case["ClosedDate"].startswith(env.unwrapped.org.today())
    assert [h["Field__c"] for h in case["history"]][-2:] == ["Status", "Resolution"]
    env.reset(seed=1)
    obs, *_ = env.step(call(env, "query", sql=f"SELECT Status FROM \"Case\" WHERE Id = '{case_id}'"))
    assert json.loads(obs.split("\n")[1])["rows"] == [["Working"]]
    assert env.unwrapped.org.pristine.execute('SELECT Status FROM "Case" WHERE Id = ?', (case_id,)).fetchone() == ("Working",)


def test_typed_tools(cache):
    env = make(cache)
    env.reset(seed=0)
    con = env.unwrapped.episode.state["db"].con
    obs, *_ = env.step(call(env, "describe_schema"))
    assert "Case(Id TEXT PRIMARY KEY" in obs and "OwnerId TEXT -> User.Id" in obs and "_fts" not in obs
    obs, *_ = env.step(call(env, "describe_object", name="casehistory__c"))
    assert '"object": "CaseHistory__c"' in obs
    obs, _, _, _, info = env.step(call(env, "describe_object", name="Lead"))
    assert info["error"] == "tool_error" and "no object named 'Lead'" in obs
    obs, *_ = env.step(call(env, "search_knowledge", query="warranty: robot vacuums?!", limit=1))
    assert json.loads(obs.split("\n")[1])[0]["Title"] == "Warranty coverage for Robot Vacuums"
    obs, *_ = env.step(call(env, "search_knowledge", query='"unbalanced AND ( NEAR'))
    assert "Error" not in obs
    chat_case = con.execute("SELECT CaseId FROM LiveChatTranscript LIMIT 1").fetchone()[0]
    obs, *_ = env.step(call(env, "get_live_chat_transcript", case_id=chat_case))
    assert "Customer:" in obs
    contact = con.execute('SELECT BillToContactId FROM "Order" LIMIT 1').fetchone()[0]
    obs, *_ = env.step(call(env, "get_order_history", contact_id=contact))
    orders = json.loads(obs.split("\n")[1])
    assert orders and all(o["items"] for o in orders)
    obs, _, _, _, info = env.step(call(env, "get_order_history", contact_id="nobody"))
    assert info["error"] == "tool_error" and "no Contact" in obs


def test_org_is_deterministic_salesforce_shaped_and_cached(tmp_path, cache):
    build_org(tmp_path / "a.sqlite", seed=3, size=300)
    build_org(tmp_path / "b.sqlite", seed=3, size=300)
    build_org(tmp_path / "c.sqlite", seed=4, size=300)
    a, b, c = (org_rows(sqlite3.connect(tmp_path / f"{x}.sqlite")) for x in "abc")
    assert a == b and a != c
    ids = [r[0] for r in a["Case"]] + [r[0] for r in a["User"]]
    assert all(len(i) == 18 for i in ids) and len(set(ids)) == len(ids)
    assert sf_id("Case", 7).startswith("500") and sf_id("User", 7).startswith("005")
    path = cached_org(0, SMALL, cache)
    mtime = path.stat().st_mtime_ns
    assert cached_org(0, SMALL, cache) == path and path.stat().st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


def test_tasks_are_deterministic(cache):
    one, two = make(cache), make(cache)
    for i in range(10):
        a, b = one.unwrapped.tasks[i], two.unwrapped.tasks[i]
        assert (a.prompt, a.answer, a.solution) == (b.prompt, b.answer, b.solution)
    assert make(cache, task_args={"task_seed": 1}).unwrapped.tasks[0].prompt != one.unwrapped.tasks[0].prompt


def test_crmarena_task_files_run_against_your_own_org(cache, tmp_path):
    org = cached_org(0, SMALL, cache)
    agent = Org(org).pristine.execute("SELECT Id FROM User ORDER BY Id LIMIT 1").fetchone()[0]
    records = [
        {"idx": 7, "type": "handle_time", "query": "Which agent is first by Id?", "answer": [agent],
         "reward_metric": "exact_match", "metadata": {"required": "Today's date: 2025-01-01"}},
        {"idx": 8, "task": "knowledge_qa", "query": "What is the warranty?", "answer": "twelve months from delivery",
         "reward_metric": "fuzzy_match", "metadata": {}},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    env = gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)}, org_db=str(org))
    obs, info = env.reset(options={"task_index": 0})
    assert "Today's date: 2025-01-01" in obs and info["task_id"] == "crmarena-7" and agent not in obs
    obs, *_ = env.step(call(env, "query", sql="SELECT Id FROM User ORDER BY Id LIMIT 1"))
    _, reward, *_ = env.step(f"<answer>{agent.lower()}</answer>")
    assert reward == 1.0
    env.reset(options={"task_index": 1})
    _, reward, *_ = env.step("<answer>12 months from delivery</answer>")
    assert reward == pytest.approx(0.75)
    solver = env.unwrapped.reference_solver()
    assert play(env, solver, options={"task_index": 1}).reward == 1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"idx": 1, "type": "x", "query": "q", "answer": "a", "reward_metric": "bleu"}]))
    with pytest.raises(ValueError, match="reward_metric"):
        gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(bad)}, org_db=str(org))


def test_crmarena_none_answers_are_the_gold_none_and_missing_answers_are_refused(cache, tmp_path):
    """CRMArena writes "no policy was violated" as ``"answer": [null]`` and grades it as the text
    "None"; so does the loader. A null answer (what ``datasets`` fills in for a missing key) was
    the gold "None" too; it, an empty list and wordless answers (an empty reply would match them)
    are refused at make, naming the record."""
    org = cached_org(0, SMALL, cache)
    record = {"idx": 3, "task": "policy_violation_identification", "reward_metric": "exact_match",
              "query": "Did the agent breach a policy? If so, which knowledge article?"}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(dict(record, answer=[None])))
    env = gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)}, org_db=str(org))
    for reply, expected in (("<answer>None</answer>", 1.0), ("<answer></answer>", 0.0),
                            ("<answer>ka0</answer>", 0.0)):
        env.reset(options={"task_index": 0})
        assert env.step(reply)[1] == expected, reply
    for answer in (None, [], [""], ["ka0Ws000000QriDIAS", " "], "", "the", ["..."]):
        path.write_text(json.dumps(dict(record, answer=["None"])) + "\n" + json.dumps(dict(record, answer=answer)))
        with pytest.raises(ValueError, match=r"tasks.jsonl' line 2: the answer .*every task needs an answer"):
            gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)}, org_db=str(org))



@pytest.mark.parametrize("line, says", [
    (b'{"idx": 2, "query": "caf\xe9?"}', "line 2: not UTF-8 text"),
    (b"{not json", "line 2: not JSON"),
    (b"[" * 5000 + b"]" * 5000, "line 2: JSON nested too deeply to read"),
], ids=["latin1", "not-json", "too-deep"])
def test_a_crmarena_file_with_a_bad_line_is_refused_naming_it(cache, tmp_path, line, says):
    """(A bare UnicodeDecodeError, or json's "line 1 column 2" for the whole file, or a RecursionError.)"""
    org = cached_org(0, SMALL, cache)
    good = {"idx": 1, "type": "knowledge_qa", "query": "q", "answer": "a", "reward_metric": "exact_match"}
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(json.dumps(good).encode() + b"\n" + line + b"\n")
    with pytest.raises(ValueError, match=f"tasks.jsonl' {says}"):
        gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)}, org_db=str(org))

def test_metrics():
    assert final_answer("Thinking... <answer> The May </answer>") == "The May"
    assert exact_match("the May.", "may") == 1.0 and exact_match("June", "May") == 0.0
    assert exact_match("b, a", ["a", "b"]) == 1.0
    assert fuzzy_match("36 months", "36 months") == 1.0 and fuzzy_match("36", "36 months") == pytest.approx(2 / 3)
    assert fuzzy_match("", "x") == 0.0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"org_size": 10}, "org_size"),
        ({"org_size": True}, "org_size"),
        ({"org_seed": -1}, "org_seed"),
        ({"task_types": ["gossip"]}, "task_types"),
        ({"tasks": "salesforce"}, "tasks"),
        ({"tasks": "crmarena", "dataset": "x.json"}, "org_db"),
        ({"tasks": "crmarena", "task_types": ["handle_time"]}, "task_types"),
        ({"org_db": "/nonexistent.sqlite"}, "org_db"),
        ({"dataset": "x.json"}, "dataset"),
        ({"query_max_rows": 0}, "query_max_rows"),
        ({"query_timeout": -1}, "query_timeout"),
    ],
)
def test_bad_configuration_is_named_at_make(cache, kwargs, name):
    with pytest.raises(ValueError, match=name):
        gym.make("benchmax/CRM-v0", cache_dir=cache, **kwargs)


def test_update_types_are_graded_on_state_not_text(cache):
    assert set(UPDATE_TYPES) <= set(TASK_TYPES)
    env = make(cache, task_args={"task_types": ["close_case"]})
    env.reset(options={"task_index": 0})
    task = env.unwrapped.episode.task
    (case_id, values), = task.answer["Case"].items()
    _, reward, *_ = env.step(f"<answer>{values['Resolution__c']}</answer>")
    assert reward == 0.0


def test_async_episode_matches_sync(cache):
    import asyncio

    env = make(cache, task_args={"task_types": ["close_case"]})
    sync_reward = play(env, options={"task_index": 3}).reward
    assert asyncio.run(aplay(env, options={"task_index": 3})).reward == sync_reward == 1.0


SQL_WORDS = ["SELECT", "*", "FROM", '"Case"', "User", "WHERE", "1", "=", "DELETE", "UPDATE", "SET", "INSERT", "INTO",
             "VALUES", "(", ")", ";", "ATTACH", "DATABASE", "'x.db'", "AS", "PRAGMA", "query_only", "OFF",
             "load_extension", "WITH", "RECURSIVE", "r(n)", "UNION ALL", "n+1", "r", "DROP", "TABLE", "VACUUM",
             "BEGIN", "COMMIT", "randomblob", "zeroblob", "1e9", "'", "--", "/*", "sqlite_master", "writable_schema"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(SQL_WORDS) | st.text(max_size=8), max_size=14),
       update=st.dictionaries(st.sampled_from(["case_id", "status", "owner_id", "priority", "resolution", "x"]),
                              st.text(max_size=20) | st.integers() | st.none(), max_size=4))
def test_random_sql_and_updates_never_raise_or_write(cache, words, update):
    env = _FUZZ_ENVS.setdefault(cache, make(cache, query_timeout=0.2, max_turns=1000))
    if env.unwrapped.episode is None:
        env.reset(seed=0)
    con = env.unwrapped.episode.state["db"].con
    before = con.execute('SELECT COUNT(*), SUM(length(Status || OwnerId)) FROM "Case"').fetchone()
    _, _, _, _, info = env.step(call(env, "query", sql=" ".join(words)))
    assert info["error"] in (None, "tool_error", "bad_arguments")
    assert con.execute('SELECT COUNT(*), SUM(length(Status || OwnerId)) FROM "Case"').fetchone() == before
    _, _, _, _, info = env.step(call(env, "update_case", **update))
    assert info["error"] in (None, "tool_error", "bad_arguments")


_FUZZ_ENVS: dict = {}


def test_a_write_that_bypassed_the_tools_counts_as_collateral(cache):
    env = make(cache, task_args={"task_types": ["knowledge_qa"]})
    solver = env.unwrapped.reference_solver()

    def policy(obs, info):
        if info["turn"] == 0:  # right after reset, before the first step
            env.unwrapped.episode.state["db"].con.execute("UPDATE User SET IsActive = 0")  # not through any tool
        return solver(obs, info)

    assert play(env, policy, options={"task_index": 0}).info["reward_components"] == {"correct": 1.0, "untouched": 0.0}


def test_crmarena_tasks_for_another_org_are_refused_and_optional_context_is_shown(cache, tmp_path):
    """CRMArena's org is not included: its tasks' ids exist nowhere in the generated org, and a
    solver replaying the gold once "scored" 1.0 on them."""
    org = cached_org(0, SMALL, cache)
    agent = Org(org).pristine.execute("SELECT Id FROM User ORDER BY Id LIMIT 1").fetchone()[0]
    foreign = {"idx": 1, "task": "handle_time", "query": "Which agent handled case 500Wt00000DDxyzIAD fastest?",
               "answer": ["005Wt000003NIiTIAW"], "reward_metric": "exact_match",
               "metadata": {"required": "Today's date: 2025-01-01",
                            "optional": "Quarters: Q1 is January to March."}}
    path = tmp_path / "crmarena.jsonl"
    path.write_text(json.dumps(foreign))
    with pytest.raises(ValueError, match="not included in benchmax-gym"):
        gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)})
    with pytest.raises(ValueError, match=r"2 Salesforce id\(s\).*500Wt00000DDxyzIAD.*check_org_ids=False"):
        gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)}, org_db=str(org))
    env = gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path), "check_org_ids": False}, org_db=str(org))
    obs, _ = env.reset(options={"task_index": 0})
    assert "Today's date: 2025-01-01" in obs and "Quarters: Q1 is January to March." in obs
    own = dict(foreign, query=f"Which agent is {agent}?", answer=[agent])
    path.write_text(json.dumps(own))
    assert gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)}, org_db=str(org)).reset()[0]


def test_a_database_made_unusable_ends_the_episode_with_env_error(cache):
    """The episode's database gone (here: its connection closed under the tools) is the
    environment's failure, not the model's (issue 29); a bad query stays the model's tool error."""
    import math
    env = make(cache)
    env.reset(seed=0)
    _, _, _, _, info = env.step(call(env, "query", sql="SELECT nope FROM nowhere"))
    assert info["error"] == "tool_error" and "outcome" not in info
    env.unwrapped.episode.state["db"].con.close()  # the injected fault
    _, reward, terminated, truncated, info = env.step(call(env, "query", sql='SELECT Id FROM "Case"'))
    assert info["outcome"] == info["error"] == "env_error" and math.isnan(reward) and truncated and not terminated
    assert env.unwrapped.episode_record()["reward"] is None
    env.close()


# -- the dense signal (dense_rewards=True): reads that narrow the answer down pay, dumps do not --

ISSUES = 12  # Issue__c rows in every generated org: a top_issue answer is one of them


def dense_env(cache, task_type):
    env = make(cache, org_size=200, dense_rewards=True, task_args={"task_types": [task_type]})
    env.reset(seed=0)
    return env, env.unwrapped.episode.task.answer


def dense_of(env, *sqls):
    _, _, _, _, info = env.step(env.unwrapped.format.render_calls([("query", {"sql": sql}) for sql in sqls]))
    assert info["error"] is None, info
    return info["reward_components"]["dense"]


def test_dense_signal_pays_a_read_that_singles_the_answer_out(cache):
    env, gold = dense_env(cache, "top_issue_identification")
    assert dense_of(env, "SELECT * FROM Issue__c") == 0  # all 12 rows: a dump
    assert dense_of(env, f"SELECT Id, Name FROM Issue__c WHERE Id = '{gold}'") > 0
    env.close()


@pytest.mark.parametrize("dump", [
    # one action, two calls of 6 rows each
    ["SELECT Id FROM Issue__c ORDER BY Id LIMIT 6", "SELECT Id FROM Issue__c ORDER BY Id LIMIT 6 OFFSET 6"],
    # one row, every issue in a column of its own
    ["SELECT " + ", ".join(f"(SELECT Id FROM Issue__c ORDER BY Id LIMIT 1 OFFSET {k})" for k in range(ISSUES))],
], ids=["two_calls", "wide_row"])
def test_dense_signal_does_not_pay_every_issue_listed_at_once(cache, dump):
    env, _ = dense_env(cache, "top_issue_identification")
    assert dense_of(env, *dump) == 0  # was 0.2: the answer was among the cells
    env.close()


def test_dense_signal_does_not_pay_every_issue_listed_chunk_by_chunk(cache):
    env, gold = dense_env(cache, "top_issue_identification")
    chunk = f"SELECT Id FROM Issue__c ORDER BY Id = '{gold}', Id LIMIT 6"  # the answer in the last chunk
    assert dense_of(env, chunk) == 0
    assert dense_of(env, chunk + " OFFSET 6") == 0  # was 0.2
    env.close()


def test_dense_signal_does_not_pay_a_phrase_inside_a_cell_the_query_built(cache):
    env, gold = dense_env(cache, "close_case")
    resolution = next(iter(gold["Case"].values()))["Resolution__c"]
    every = "SELECT group_concat(r, ' | ') FROM (SELECT DISTINCT Resolution__c AS r FROM Knowledge__kav)"
    obs, _, _, _, info = env.step(env.unwrapped.format.render_calls([("query", {"sql": every})]))
    assert resolution in obs and info["reward_components"]["dense"] == 0  # was: the resolution paid
    assert dense_of(env, f"SELECT Resolution__c FROM Knowledge__kav WHERE Resolution__c = '{resolution}' LIMIT 1") > 0
    env.close()
