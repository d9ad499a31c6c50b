"""What one ``query`` may take from the host beyond time: its temporary storage (sorts, DISTINCT,
GROUP BY) stays in memory, never in temp files, and is bounded; the deadline still holds."""

import os
import sqlite3
import threading

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

# ~900 MB of rows to sort or deduplicate (1,000 distinct values of 900 KB), built inside the query
ROWS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 1000) "


def heap_limit() -> int:
    return sqlite3.connect(":memory:").execute("PRAGMA hard_heap_limit").fetchone()[0]


class TempFiles:
    """Watches this process's open files for SQLite temp files (unlinked at once: ``(deleted)``)."""

    def __init__(self):
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.is_set():
            for fd in os.listdir("/proc/self/fd"):
                try:
                    target = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if "etilqs_" in target:
                    self.seen.add(target)
            self._stop.wait(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def query(env, sql):
    action = env.unwrapped.format.render_calls([("query", {"sql": sql})])
    obs, _, _, _, info = env.step(action)
    return obs, info


@pytest.fixture
def env(tmp_path):
    env = gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path), org_size=200, query_timeout=60)
    env.reset(seed=0)
    yield env
    env.close()


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="watches temp files through /proc")


@pytest.mark.parametrize("sql", [
    ROWS + "SELECT n, hex(zeroblob(450000)) || n FROM r ORDER BY random()",
    ROWS + "SELECT COUNT(DISTINCT hex(zeroblob(450000)) || n) FROM r",
    ROWS + "SELECT x, COUNT(*) FROM (SELECT hex(zeroblob(450000)) || n AS x FROM r) GROUP BY x",
], ids=["order_by", "distinct", "group_by"])
def test_a_query_needing_too_much_temporary_storage_is_stopped_without_temp_files(env, sql):
    before = heap_limit()
    with TempFiles() as temp:
        obs, info = query(env, sql)
    # was: up to 900 MB written to temp files (500 MB within the default 2 s timeout), then a result
    assert info["error"] == "tool_error", obs[:300]
    assert "needed more than 256 MB of working memory" in obs and "LIMIT" in obs, obs
    assert not temp.seen, temp.seen
    assert heap_limit() == before  # the process's SQLite heap is bounded only while a query runs
    # the episode goes on: sorts over the org still answer
    obs, info = query(env, 'SELECT CaseNumber FROM "Case" ORDER BY Description DESC, Id')
    assert info["error"] is None and '"rows": [["' in obs, obs[:300]
    obs, info = query(env, 'SELECT COUNT(DISTINCT Description), MAX(Subject) FROM "Case"')
    assert info["error"] is None and '"rows": [[' in obs, obs[:300]


def test_the_deadline_still_stops_a_long_sort_held_in_memory(tmp_path):
    env = gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path), org_size=200, query_timeout=0.5)
    env.reset(seed=0)
    try:
        with TempFiles() as temp:  # small rows: the deadline comes before the memory bound
            obs, info = query(env, "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
                                   "WHERE n < 1000000000) SELECT n FROM r ORDER BY -n")
        assert info["error"] == "tool_error" and "ran longer than 0.5 s" in obs, obs
        assert not temp.seen, temp.seen  # (was: the sort spilled to temp files past 2 MB)
        obs, info = query(env, 'SELECT COUNT(*) FROM "Case"')
        assert info["error"] is None and '"rows": [[200]]' in obs, obs
    finally:
        env.close()
