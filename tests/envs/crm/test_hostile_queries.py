"""Queries written to exhaust the host: each runs through ``env.step`` with the real ``query``
tool and must come back within the query's deadline (``query_timeout``, 2 s by default: the
built-ins took 5 s and more a row, and a deadline is seen only once a row's function returns),
bounded in memory, with the same answers SQLite gives."""

import sqlite3
import string
import time
import tracemalloc

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

# one 1 MB text value per row, built inside the query (no special data needed)
MEGA = "WITH big(x) AS (SELECT replace(hex(zeroblob(499000)), '0', 'a')) "


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path_factory.mktemp("crm")), org_size=200)
    env.reset(seed=0)
    yield env
    env.close()


def query(env, sql):
    action = env.unwrapped.format.render_calls([("query", {"sql": sql})])
    obs, _, _, _, info = env.step(action)
    return obs, info


@pytest.mark.parametrize("sql, rows", [
    # a 500 KB needle in a 1 MB haystack: SQLite's instr compares at every position (5 s a row)
    (MEGA + ", rows(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM rows WHERE n < 4) "
            "SELECT instr(x, substr(x, 1, 500000) || 'b') FROM big, rows", "[[0], [0], [0], [0]]"),
    (MEGA + "SELECT length(replace(x, substr(x, 1, 400000) || 'b', '')) FROM big", "[[998000]]"),
    (MEGA + "SELECT length(trim(x, substr(x, 1, 400000) || 'b')) FROM big", "[[0]]"),
])
def test_quadratic_string_functions_are_linear(env, sql, rows):
    obs, info = query(env, sql)
    assert info["error"] is None, obs  # not "ran longer than 2 s": the built-ins took 5 s and more a row
    assert f'"rows": {rows}' in obs, obs


def test_long_like_patterns_are_refused_at_once(env):
    sql = MEGA + "SELECT x LIKE '%' || substr(x, 1, 40000) || 'b' FROM big"  # 51 s before
    obs, info = query(env, sql)
    # refused by SQLite's pattern length limit, checked before any matching (not "ran longer than 2 s")
    assert info["error"] == "tool_error" and "LIKE and GLOB patterns are limited" in obs
    # one LIKE/GLOB costs up to the value's length times the pattern's, in one step that the
    # deadline cannot cut short: a 1 MB value against a 256-character GLOB class took 0.7 s
    for operator in ("GLOB", "LIKE"):
        for length in (100, 101):  # (against a short value: a 1 MB one costs 0.28 s a row at 100, longer loaded)
            pattern = f"'*[' || substr(x, 1, {length - 4}) || ']b'"
            obs, info = query(env, f"WITH big(x) AS (SELECT replace(hex(zeroblob(500)), '0', 'a')) "
                                      f"SELECT x {operator} {pattern} FROM big")
            if length == 100:
                assert info["error"] is None, obs
            else:
                assert info["error"] == "tool_error" and "patterns are limited to 100 characters" in obs, obs
    obs, info = query(env, "SELECT COUNT(*) FROM \"Case\" WHERE Subject LIKE '%order%'")
    assert info["error"] is None


def test_rows_of_a_megabyte_are_not_all_held_at_once(env):
    sql = MEGA + ", rows(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM rows WHERE n < 200) SELECT n, x FROM big, rows"
    tracemalloc.start()
    try:
        obs, info = query(env, sql)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info["error"] is None
    assert peak < 40e6, peak  # 200 rows of 1 MB held together was ~200 MB of Python strings (600 MB RSS)
    assert '{"truncated": true, "note": "only the first 1 rows are shown' in obs, obs[:300]


CASES = [("hello world", "o"), ("hello", ""), ("", "x"), (None, "a"), ("a", None), (12345, 3), (1.5, "."),
         (b"ab\x00cd", b"cd"), ("naïve café", "é"), ("aaa", "aa"), ("x", "xyz"),
         ("cabbage", "ab\x00c"),  # SQLite's trim reads its character set up to a NUL
         ("abcXYZ 12 mid-dle 34 ZYXcba", string.ascii_letters + string.digits + " !é")]  # a big set


def test_linear_functions_give_sqlites_own_results(env):
    """The replacements answer exactly as the built-in functions they replace."""
    con = env.unwrapped.episode.state["db"].con
    plain = sqlite3.connect(":memory:")
    for a, b in CASES:
        for sql, args in [("SELECT instr(?, ?)", (a, b)), ("SELECT replace(?, ?, 'Z')", (a, b)),
                          ("SELECT replace(?, ?, ?)", (a, b, a)), ("SELECT trim(?, ?)", (a, b)),
                          ("SELECT ltrim(?, ?)", (a, b)), ("SELECT rtrim(?, ?)", (a, b)),
                          ("SELECT trim(?)", (a,)), ("SELECT rtrim(?)", (b,))]:
            if isinstance(a, bytes) and "instr" not in sql:
                continue  # blobs through replace/trim come back as text here, as blobs in SQLite
            assert con.execute(sql, args).fetchone() == plain.execute(sql, args).fetchone(), (sql, args)


def test_printf_char_repeats_past_the_value_limit_return_at_once(env):
    """SQLite 3.40's ``%c`` loops once per repeat even after the result overflowed: 10 s a row."""
    sql = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
           "SELECT printf('%.*c', 2147483647 - n, 'x') IS NULL, format('%.2147483000c', 'y') IS NULL FROM r")
    obs, info = query(env, sql)
    assert info["error"] is None, obs  # not "ran longer than 2 s": it was 10 s and more a row
    assert '"rows": [[1, 1], [1, 1], [1, 1]]' in obs, obs


@pytest.mark.parametrize("args", [
    ("%d-%s|%%c", 5, "x"), ("%.3c|%5c|%-5c", "ab", "y", "z"), ("%.*c", 3, "é"), ("%*.*c", 6, 3, "q"),
    ("%.*c", -4, "w"), ("%.*c", "5", "x"), ("%.*c", 4294967298, "x"), ("%.c%.0c%.1c%.2lc", "a", "b", "c", "d"),
    ("%,d %05.2f %q %Q %w %z %!.3g %#x", 1234567, 3.14159, "it's", None, 'a"b', "zz", 1.5, 255),
    ("abc%",), (None, 1), (b"%s", b"x"), (12,), ("%.999999c", "z"), ("%.600000c%.600000c", "a", "b"),
    ("%.1" + "0" * 5000 + "5c|%.4294967299c", "x", "y")])  # SQLite reads a precision as a uint32
def test_printf_gives_sqlites_own_results(env, args):
    con = env.unwrapped.episode.state["db"].con
    plain = sqlite3.connect(":memory:")
    plain.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)
    marks = ", ".join("?" * len(args))
    for name in ("printf", "format"):
        sql = f"SELECT {name}({marks})"
        assert con.execute(sql, args).fetchone() == plain.execute(sql, args).fetchone(), (name, args)


@pytest.mark.parametrize("sql", [
    # every row decodes a 900 KB blob in a Python function: a millisecond an opcode, which a
    # deadline checked every 10,000 opcodes let run 2.7 s past a 2 s timeout
    "WITH RECURSIVE r(n, s) AS (SELECT 1, randomblob(900000) UNION ALL SELECT n + 1, s FROM r WHERE n < 10000000) "
    "SELECT sum(instr(s, 'zz')) FROM r",
    # every row trims a 1 MB value by a 500,000-character set: 8-12 s a row when each character
    # removed was looked up by scanning the set
    "WITH RECURSIVE r(n, s) AS (SELECT 1, replace(hex(zeroblob(499000)), '0', 'a') UNION ALL "
    "SELECT n + 1, s FROM r WHERE n < 10000000) SELECT sum(length(trim(s, replace(hex(zeroblob(250000)), '0', 'b') "
    "|| 'a'))) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 1000000000) SELECT count(*) FROM r",
])
def test_a_query_stops_at_its_deadline_whatever_each_row_costs(tmp_path, sql):
    env = gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path), org_size=200, query_timeout=0.5)
    env.reset(seed=0)
    for _ in range(2):  # the watchdog serves query after query
        obs, info = query(env, sql)
        assert info["error"] == "tool_error" and "ran longer than 0.5 s" in obs, obs
    obs, info = query(env, "SELECT COUNT(*) FROM \"Case\"")  # and the next query runs whole
    assert info["error"] is None and "interrupted" not in obs
    env.close()


def test_a_query_is_stopped_in_the_row_that_runs_past_its_deadline(tmp_path):
    """Each row spends 0.2 s in one function call holding the interpreter lock (as ``instr``
    over a 900 KB blob does in ~1 ms): a deadline checked every 10,000 opcodes let such a query
    run on (2.7 s past a 2 s timeout); interrupted at the deadline, it stops once the row that
    was running returns, the third of these fifty (later if the watchdog wakes late: a loaded
    machine has the rest of the 10 s they take to do so)."""
    env = gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path), org_size=200, query_timeout=0.5)
    env.reset(seed=0)
    rows = []

    def busy(seconds):
        rows.append(len(rows) + 1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        return 0

    env.unwrapped.episode.state["db"].con.create_function("busy", 1, busy)
    obs, info = query(env, "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 50) "
                           "SELECT sum(busy(0.2)) FROM r")
    assert info["error"] == "tool_error" and "ran longer than 0.5 s" in obs, obs
    assert len(rows) < 50, rows  # stopped within the rows, not after all of them
    env.close()


def test_a_query_in_a_forked_worker_stops_at_its_deadline(tmp_path):
    sql = ("WITH RECURSIVE r(n, s) AS (SELECT 1, randomblob(900000) UNION ALL SELECT n + 1, s FROM r "
           "WHERE n < 10000000) SELECT sum(instr(s, 'zz')) FROM r")
    env = gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path), org_size=200, query_timeout=0.5)
    env.reset(seed=0)
    query(env, "SELECT 1")  # the watchdog thread runs in this process before the fork
    envs = gym.make_vec("benchmax/CRM-v0", num_envs=2, cache_dir=str(tmp_path), org_size=200, query_timeout=0.5)
    try:
        envs.reset(seed=0)
        action = env.unwrapped.format.render_calls([("query", {"sql": sql})])
        started = time.monotonic()
        obs, _, _, _, infos = envs.step([action, action])
        # interrupted in each child (a watchdog thread does not survive the fork: each starts its own)
        assert list(infos["error"]) == ["tool_error"] * 2 and all("ran longer than 0.5 s" in o for o in obs)
        assert time.monotonic() - started < 60  # a hang guard: uninterrupted, the query runs for hours
    finally:
        envs.close()
        env.close()
