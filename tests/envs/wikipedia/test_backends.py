"""The backends: the cached FTS5 index, and the live backend against a real local MediaWiki server
(retries with backoff, redirects, missing and disambiguation pages, the response cache)."""

import json
import math
import sqlite3
import threading
import time

import gymnasium as gym
import httpx
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import ListTasks, Task
from benchmax_gym.envs.wikipedia.backends import (
    CachingTransport, CorpusBackend, CorpusIndex, LiveBackend, fts_query, parse_article,
)
from benchmax_gym.envs.wikipedia.tasks import bamboogle_tasks, load_corpus
from benchmax_gym.testing import play


def live_env(mediawiki, tasks=None, backend_args=None, **kwargs):
    tasks = tasks or ListTasks([Task("t", "Where does the Limmat flow?", "Zürich", {"supporting": ["Zürich"]})])
    return gym.make("benchmax/Wikipedia-v0", tasks=tasks, backend="live",
                    backend_args={"api_url": mediawiki.api_url, **(backend_args or {})}, **kwargs)


def call(env, name, **arguments):
    obs, _, _, _, info = env.step(env.unwrapped.format.render_calls([(name, arguments)]))
    return obs, info


# -- local index ------------------------------------------------------------------------------


def test_index_is_built_once_and_opened_read_only(tmp_path):
    records = [{"title": "Alpha", "text": "alpha beta"}, {"title": "Beta", "text": "#REDIRECT [[Alpha]]"}]
    first = CorpusIndex.on_disk(records, "k1", tmp_path)
    files = list(tmp_path.glob("corpus-*.sqlite"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    second = CorpusIndex.on_disk(records, "k1", tmp_path)
    assert second.uri == first.uri and files[0].stat().st_mtime_ns == stamp
    reader = CorpusBackend(second)
    with pytest.raises(sqlite3.OperationalError):
        reader.db.execute("DELETE FROM pages")
    assert reader.article("beta").redirected_from == "Beta"
    assert [h.title for h in reader.search("beta", 5)] == ["Alpha"]  # a redirect is never a search hit itself
    reader.close()


def test_hotpotqa_file_is_a_corpus(shared_data):
    records, key = load_corpus(shared_data / "hotpotqa" / "dev_distractor_100.json")
    titles = {r["title"] for r in records}
    assert "Scott Derrickson" in titles and len(records) >= 900
    assert load_corpus(shared_data / "hotpotqa" / "dev_distractor_100.json")[1] == key


@pytest.mark.parametrize("query", ['"', "*", "NEAR", "a NEAR/3 b", "-", "x OR", "col:val", "'", "{a}", "\\"])
def test_fts_syntax_is_quoted(query):
    index = CorpusIndex.in_memory([{"title": "NEAR", "text": "a b col val x"}], "syntax")
    reader = CorpusBackend(index)
    assert isinstance(reader.search(query, 5), list)
    match = fts_query(query)
    assert match is None or all(part.startswith('"') for part in match.split(" OR "))
    reader.close()


def test_parse_article_conventions():
    article = parse_article("X", "Lead [[Y|why]].\n\n== One ==\nfirst\n\n=== Two ===\nsecond")
    assert [s.title for s in article.sections] == ["", "One", "Two"] and article.sections[0].text == "Lead why."
    disambiguation = parse_article("M", "M may refer to:\n* [[M (a)]]\n* [[M (b)]], a thing")
    assert disambiguation.disambiguation and disambiguation.candidates == ("M (a)", "M (b)")


def test_bamboogle_loader(tmp_path):
    path = tmp_path / "bamboogle.jsonl"
    path.write_text("\n".join(json.dumps({"Question": f"Q{i}?", "Answer": f"A{i}"}) for i in range(3)))
    tasks = bamboogle_tasks(path)
    assert len(tasks) == 3 and tasks[1].prompt == "Q1?" and tasks[1].answer == "A1"
    path.write_text(json.dumps([{"question": "q"}]))
    with pytest.raises(ValueError, match="Question and Answer"):
        bamboogle_tasks(path)


# -- live backend against the local MediaWiki server ------------------------------------------


def test_live_solver_and_user_agent(mediawiki):
    generated = gym.make("benchmax/Wikipedia-v0", task_args={"num_tasks": 15}).unwrapped.tasks
    env = live_env(mediawiki, tasks=generated)
    solver = env.unwrapped.reference_solver()
    for i in range(15):
        assert play(env, solver, options={"task_index": i}).reward == 1.0, env.unwrapped.messages
        assert env.unwrapped.episode.tool_errors == 0, env.unwrapped.messages
    assert mediawiki.user_agents and all(ua.startswith("benchmax-gym/") for ua in mediawiki.user_agents)
    assert mediawiki.count(list="search") >= 15 and mediawiki.count(prop="extracts") >= 15


def test_rate_limit_is_retried_with_backoff(mediawiki, monkeypatch):
    waits = []  # the waits the client asked for in this thread (its retry library sleeps with time.sleep)
    sleep, caller = time.sleep, threading.get_ident()
    monkeypatch.setattr(time, "sleep", lambda s: (threading.get_ident() == caller and waits.append(s), sleep(s)))
    backend = LiveBackend(api_url=mediawiki.api_url, retry_wait=0.2)
    mediawiki.fail_next = [(429, {}), (503, {})]
    article = backend.article("Zürich")
    assert article.title == "Zürich"
    assert mediawiki.count(prop="extracts", titles="Zürich") == 3  # 429, 503, then the answer
    assert waits == [0.2, 0.4]  # exponential backoff: 0.2 s, then 0.4 s
    mediawiki.fail_next = [(429, {"Retry-After": "0"})]
    waits.clear()
    assert backend.search("Limmat", 3)[0].title == "Zürich"
    assert mediawiki.count(list="search", srsearch="Limmat") == 2  # the 429, then the answer
    assert waits == [0.0]  # Retry-After: 0 is honoured over the backoff (0.2 s)
    backend.shutdown()


def test_a_server_that_hangs_past_the_retries_ends_the_episode_with_tool_unavailable(mediawiki):
    """Wikipedia unreachable is not the model's mistake (issue 29): the episode ends ungraded."""
    # 1 s: room for the next episode's call on a loaded machine (the stall outlasts it; the stub's close waits it out)
    env = live_env(mediawiki, backend_args={"http_timeout": 1.0, "max_retries": 0})
    env.reset(seed=0)
    mediawiki.stall_next = [2.0]
    obs, reward, terminated, truncated, info = env.step(env.unwrapped.format.render_calls([("search", {"query": "Limmat"})]))
    assert info["outcome"] == info["error"] == "tool_unavailable" and "unavailable" in obs
    assert math.isnan(reward) and truncated and not terminated and env.unwrapped.episode_record()["reward"] is None
    env.reset(seed=0)
    obs, info = call(env, "search", query="Limmat")
    assert info["error"] is None and "Zürich" in obs


def test_a_server_answering_5xx_past_the_retries_ends_the_episode_with_tool_unavailable(mediawiki):
    env = live_env(mediawiki, backend_args={"max_retries": 1, "retry_wait": 0.01})
    env.reset(seed=0)
    mediawiki.fail_next = [(503, {})] * 2
    obs, reward, _, truncated, info = env.step(env.unwrapped.format.render_calls([("get_article", {"title": "Zürich"})]))
    assert info["outcome"] == "tool_unavailable" and "unavailable" in obs and math.isnan(reward) and truncated
    env.reset(seed=0)
    obs, info = call(env, "get_article", title="Zürich")  # the failure was not cached
    assert info["error"] is None and "Limmat" in obs


def test_live_redirect_missing_and_disambiguation(mediawiki):
    env = live_env(mediawiki, max_action_chars=200_000)
    env.reset(seed=0)
    obs, info = call(env, "get_article", title="Hg")
    assert info["error"] is None and "# Mercury (element)" in obs and "(Redirected from Hg)" in obs
    obs, info = call(env, "get_article", title="No such page at all")
    assert info["error"] == "tool_error" and "no article titled" in obs
    obs, info = call(env, "get_article", title="Mercury")
    assert "Disambiguation page" in obs and "Mercury (planet)" in obs
    obs, info = call(env, "get_article", title="zürich", section="History")
    assert "Turicum" in obs and "Limmat" not in obs
    obs, info = call(env, "search", query="x" * 100_000)
    assert info["error"] == "tool_error" and "at most 300" in obs


def test_response_cache_sends_each_request_once(mediawiki):
    env = live_env(mediawiki)
    env.reset(seed=0)
    call(env, "get_article", title="Mercury (planet)")
    call(env, "search", query="closest planet")
    sent = len(mediawiki.requests)
    obs, info = call(env, "get_article", title="Mercury (planet)")
    obs2, _ = call(env, "search", query="closest planet")
    env.reset(seed=1)  # the cache outlives the episode
    call(env, "get_article", title="Mercury (planet)")
    assert len(mediawiki.requests) == sent and "closest planet" in obs and "Mercury (planet)" in obs2
    assert env.unwrapped.backend.transport.sent == sent


def test_modules_import_one_another_without_a_circle():
    """backends <- tasks <- corpora: no module of the package imports one that imports it back
    (at the top or inside a function), so each can be read and loaded on its own."""
    import ast
    from pathlib import Path

    import benchmax_gym.envs.wikipedia as package

    folder = Path(package.__file__).parent
    graph = {}
    for file in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmax_gym.envs.wikipedia."):
                names.add(node.module.rsplit(".", 1)[1])
        graph[file.stem] = names

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph.get(start, ()))

    assert [m for m in graph if reaches(m, m)] == []


def test_bamboogle_numbers_are_graded_as_text_and_empty_aliases_refused(tmp_path):
    """A file's ``"Answer": 1875`` once made the right answer score 0 (the rubric raised on it)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"title": "Vorsa", "text": "Vorsa was founded in 1875."}) + "\n")
    path = tmp_path / "bamboogle.jsonl"
    path.write_text(json.dumps({"Question": "When was Vorsa founded?", "Answer": 1875}) + "\n")
    env = gym.make("benchmax/Wikipedia-v0", tasks="bamboogle", task_args={"dataset": str(path)},
                   backend="local", backend_args={"corpus": str(corpus)})
    try:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step("<answer>1875</answer>")
        assert terminated and reward == 1.0 and info["reward_components"]["em"] == 1.0
    finally:
        env.close()
    path.write_text(json.dumps({"Question": "When was Vorsa founded?", "Answer": []}) + "\n")
    with pytest.raises(ValueError, match="record 1: has no answer"):
        bamboogle_tasks(path)


def test_a_mediawiki_error_answer_is_never_cached_nor_graded_as_the_models(mediawiki):
    """MediaWiki says "lagged", "read-only" or "internal error" with HTTP 200 and ``{"error": ...}``:
    it once became "No results" (search) or a KeyError tool error (get_article), both scored, and
    was cached, so that request failed for the rest of the environment's life."""
    env = live_env(mediawiki, backend_args={"max_retries": 1, "retry_wait": 0.01})
    env.reset(seed=0)
    mediawiki.fail_next = [(200, {}, "maxlag")]  # one lagged answer: retried, then the real one
    obs, info = call(env, "search", query="Limmat")
    assert info["error"] is None and "Zürich" in obs
    mediawiki.fail_next = [(200, {}, "readonly"), (200, {}, "internal_api_error_DBQueryError")]
    obs, reward, _, truncated, info = env.step(env.unwrapped.format.render_calls([("get_article", {"title": "Zürich"})]))
    assert info["outcome"] == "tool_unavailable" and math.isnan(reward) and truncated
    env.reset(seed=0)
    sent = mediawiki.count(prop="extracts", titles="Zürich")
    obs, info = call(env, "get_article", title="Zürich")  # asked again: the error was not kept
    assert info["error"] is None and "Limmat" in obs and mediawiki.count(prop="extracts", titles="Zürich") == sent + 1
    mediawiki.fail_next = [(200, {}, "badvalue")]  # an error of the request itself: the model sees it
    obs, info = call(env, "search", query="closest planet")
    assert info["error"] == "tool_error" and "Wikipedia refused the request" in obs
    obs, info = call(env, "search", query="closest planet")
    assert info["error"] is None and "Mercury (planet)" in obs
    env.close()


def test_a_live_title_with_a_pipe_is_no_article(mediawiki):
    """``|`` separates titles in the API: "A|B" read A under a made-up redirect from "A|B"."""
    env = live_env(mediawiki)
    env.reset(seed=0)
    obs, info = call(env, "get_article", title="Mercury (planet)|Zürich")
    assert info["error"] == "tool_error" and "no article titled" in obs and "Redirected" not in obs
    assert mediawiki.count(titles="Mercury (planet)|Zürich") == 0
    env.close()


def test_the_response_cache_is_bounded_in_bytes(mediawiki, world):
    """Long articles, each kept whole: 4,096 of them once had no bound on their bytes."""
    transport = CachingTransport(api_url=mediawiki.api_url, max_bytes=5_000)
    fetched = 0
    with httpx.Client(transport=transport) as client:
        for person in world.people[:40]:
            params = {"action": "query", "prop": "extracts", "titles": person.title}
            fetched += len(client.get("https://en.wikipedia.org/w/api.php", params=params).content)
    assert fetched > 10_000 and 0 < transport.cached_bytes <= 5_000
    assert transport.cached_bytes == sum(len(body) for _, body in transport._cache.values())


@pytest.mark.parametrize("answer, says", [(None, "has no answer"), (".", "no words"), (["-", "?"], "has no answer")])
def test_an_ungradable_gold_is_refused_at_make(tmp_path, answer, says):
    """A HotpotQA record with ``"answer": null`` once became the gold "None", so that
    ``<answer>None</answer>`` scored 1; a gold with no words made every reply score 0."""
    path = tmp_path / "hotpot.json"
    record = {"_id": "x", "question": "When was Vorsa founded?", "answer": answer,
              "supporting_facts": [["Vorsa", 0]], "context": [["Vorsa", ["Vorsa was founded in 1875."]]]}
    path.write_text(json.dumps([record]))
    with pytest.raises(ValueError, match=says):
        gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa", task_args={"dataset": str(path)})
