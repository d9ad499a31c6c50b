"""An audit of the Wikipedia family: answers that scored wrong (Unicode spellings of the right
answer, hedges between a comparison's options), a live wiki that answers badly (not JSON, a
trickle, a body too large to hold), hostile tool arguments, and a large local corpus that every
``gym.make`` parsed again."""

import json
import math
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import ListTasks, Task
from benchmax_gym.core.tools import ToolFailure
from benchmax_gym.envs.wikipedia.backends import LiveBackend, corpus_key
from benchmax_gym.envs.wikipedia.rubric import em, f1

TASKS = ListTasks([Task("t", "Where does the Limmat flow?", "Zürich", {"supporting": ["Zürich"]})])


def step(env, name, **arguments):
    return env.step(env.unwrapped.format.render_calls([(name, arguments)]))


# -- grading ----------------------------------------------------------------------------------


@pytest.mark.parametrize("said, gold", [
    ("Arthur’s Magazine", "Arthur's Magazine"),  # a curly apostrophe
    ("1939-1945", "1939–1945"),                  # a hyphen for the gold's en dash
    ("“Paris”", "Paris"),                        # curly quotes
    ("Ze\u0301ro", "Z\u00e9ro"),                 # a decomposed é
    ("１８７５", "1875"),                          # full-width digits
    ("Ｔhe Vorsa Press", "Vorsa Press"),          # a full-width letter
])
def test_a_unicode_spelling_of_the_right_answer_scores_as_it(said, gold):
    """HotpotQA's script strips ASCII punctuation only: each of these scored 0."""
    assert em(f"<answer>{said}</answer>", gold) == 1.0 and f1(f"<answer>{said}</answer>", gold) == 1.0


def test_accents_numbers_and_yes_no_hedges_are_graded_as_documented():
    assert em("<answer>Zurich</answer>", "Zürich") == 0.0  # accents count, as in the official script
    assert em("<answer>three</answer>", "3") == 0.0  # numbers as written
    for hedge in ("yes and no", "Yes/No", "no, yes"):
        assert f1(f"<answer>{hedge}</answer>", "yes") == 0.0 and f1(f"<answer>{hedge}</answer>", "no") == 0.0
    assert f1("<answer>Parisian</answer>", "Paris") == 0.0  # a longer word holding the gold is another word
    many = "Paris London Berlin Rome Madrid Vienna Prague Lisbon Oslo"
    assert f1(f"<answer>{many}</answer>", "Paris") == pytest.approx(0.2)  # listing candidates pays less, not more


def test_a_hedge_between_a_comparisons_options_scores_0():
    """"A or B" earned F1 0.57 against "A" (two-word names), more than a guess is worth, and the
    wrong name earned 0.5 for a word it shares with the right one."""
    hand_made = Task("h", "Which is older, Vorsa Press or Vorsa?", "Vorsa", {"options": ["Vorsa Press", "Vorsa"]})
    assert em("<answer>Vorsa</answer>", "Vorsa", hand_made) == 1.0
    assert f1("<answer>Vorsa Press</answer>", "Vorsa", hand_made) == 0.0  # (0.67 before)
    assert f1("<answer>Vorsa or Vorsa Press</answer>", "Vorsa", hand_made) == 0.0
    env = gym.make("benchmax/Wikipedia-v0", task_args={"num_tasks": 60})
    tasks = env.unwrapped.tasks
    index, task = next((i, t) for i, t in enumerate(tasks) if len(t.solution.get("options", ())) == 2
                       and all(len(o.split()) == 2 for o in t.solution["options"]))
    wrong = next(o for o in task.solution["options"] if o != task.answer)
    try:
        for reply, reward in [(f"{task.solution['options'][0]} or {task.solution['options'][1]}", 0.0),
                              (f"{wrong}, not {task.answer}", 0.0), (task.answer, 1.0), (f"the {task.answer}.", 1.0)]:
            env.reset(options={"task_index": index})
            _, got, terminated, _, info = env.step(f"<answer>{reply}</answer>")
            assert terminated and got == reward, (reply, task.answer, got)
        # part of the right name, naming no other option, still earns its share
        assert f1(f"<answer>{task.answer.split()[0]}</answer>", task.answer, task) == pytest.approx(2 / 3)
    finally:
        env.close()


# -- a live wiki that answers badly -----------------------------------------------------------


class BadWiki:
    """A loopback HTTP server whose ``answer(handler)`` writes each whole answer."""

    def __init__(self, answer):
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                try:
                    answer(self, outer.stop)
                except OSError:  # the client gave up on us
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def api_url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/w/api.php"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def headers(handler, length=None):
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json; charset=utf-8")
    if length is not None:
        handler.send_header("Content-Length", str(length))
    handler.end_headers()


def not_json_but_search_works(handler, stop):
    if "list=search" in handler.path:
        body = json.dumps({"batchcomplete": "", "query": {"searchinfo": {"totalhits": 0}, "search": []}}).encode()
    else:
        body = b"<html><body>Please log in to the hotel Wi-Fi</body></html>"
    headers(handler, len(body))
    handler.wfile.write(body)


def test_an_answer_that_is_not_json_is_the_wikis_trouble_not_a_missing_article():
    """A proxy's HTML page for the article request read as "there is no article titled 'Zürich'":
    a tool error, scored as the model's mistake."""
    with BadWiki(not_json_but_search_works) as wiki:
        env = gym.make("benchmax/Wikipedia-v0", tasks=TASKS, backend="live",
                       backend_args={"api_url": wiki.api_url, "max_retries": 0})
        try:
            env.reset(seed=0)
            obs, reward, _, truncated, info = step(env, "get_article", title="Zürich")
            assert info.get("outcome") == "tool_unavailable" and math.isnan(reward) and truncated, obs
            assert "no article titled" not in obs
        finally:
            env.close()


def trickle(handler, stop):
    headers(handler)
    handler.wfile.write(b'{"batchcomplete": "", "query": {"pages": {"1": {"pageid": 1, "title": "Z", "extract": "')
    while not stop.wait(0.05):  # a byte at a time, each well within the read timeout
        handler.wfile.write(b"x")
        handler.wfile.flush()


def test_a_wiki_trickling_its_answer_fails_the_call_instead_of_holding_it():
    """httpx's timeout bounds each read: a byte every 50 ms held the call (and its tool thread,
    one of at most 256 for the process) for as long as the server kept it up."""
    with BadWiki(trickle) as wiki:
        backend = LiveBackend(api_url=wiki.api_url, timeout=0.5, max_retries=0)
        out = {}
        worker = threading.Thread(target=lambda: out.setdefault("value", _outcome(backend.article, "Zürich")),
                                  daemon=True)
        worker.start()
        worker.join(60)  # a hang guard only
        assert not worker.is_alive(), "the call was still reading the trickle after 60 s"
        assert isinstance(out["value"], ToolFailure) and out["value"].outcome == "tool_unavailable", out
        backend.shutdown()


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 (handed to the test)
        return exc


def oversized(handler, stop):
    extract = b"x" * (40 << 20)
    head = b'{"batchcomplete": "", "query": {"pages": {"1": {"pageid": 1, "ns": 0, "title": "Z\\u00fcrich", "extract": "'
    tail = b'"}}}}'
    headers(handler, len(head) + len(extract) + len(tail))
    handler.wfile.write(head)
    for i in range(0, len(extract), 1 << 20):
        if stop.is_set():
            return
        handler.wfile.write(extract[i:i + (1 << 20)])
    handler.wfile.write(tail)


def test_an_answer_too_large_to_be_an_article_ends_the_episode_saying_so():
    """40 MB for one page was read whole (and copied several times over): no cap at all."""
    with BadWiki(oversized) as wiki:
        env = gym.make("benchmax/Wikipedia-v0", tasks=TASKS, backend="live",
                       backend_args={"api_url": wiki.api_url, "max_retries": 0})
        try:
            env.reset(seed=0)
            obs, reward, _, truncated, info = step(env, "get_article", title="Zürich")
            assert info.get("outcome") == "tool_unavailable" and math.isnan(reward) and truncated, obs[:300]
            assert "more than 32 MiB" in obs
        finally:
            env.close()


# -- hostile arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("name, argument", [("get_article", "title"), ("search", "query")])
def test_a_lone_surrogate_is_a_tool_error_that_says_so(name, argument):
    env = gym.make("benchmax/Wikipedia-v0", task_args={"num_tasks": 1})
    try:
        env.reset(seed=0)
        obs, _, _, _, info = step(env, name, **{argument: "Zu\ud800rich"})
        assert info["error"] == "tool_error" and "not valid Unicode" in obs and "UnicodeEncodeError" not in obs
        obs, _, _, _, info = step(env, "search", query="Zürich")  # the episode goes on
        assert info["error"] is None
    finally:
        env.close()


# -- a large local corpus ---------------------------------------------------------------------


def test_an_environment_over_an_indexed_corpus_does_not_parse_it_again(tmp_path, index_cache):
    """Every gym.make read the corpus whole twice and parsed it, even with its index built: a
    190 MB corpus cost each one 1.2 s and 600 MB. Now it is hashed in chunks; the index is
    keyed as before (caches stay valid)."""
    corpus = tmp_path / "corpus.jsonl"
    filler = " ".join(f"word{i}" for i in range(1500))
    corpus.write_text("".join(json.dumps({"title": f"Article {i}", "text": f"Article {i} is about {filler}."}) + "\n"
                              for i in range(600)))
    size = corpus.stat().st_size
    assert size > 6_000_000
    tasks = ListTasks([Task("t", "What is Article 7 about?", "word1", {"supporting": ["Article 7"]})])

    def make():
        return gym.make("benchmax/Wikipedia-v0", tasks=tasks, backend="local", backend_args={"corpus": str(corpus)})

    make().close()  # builds the index
    assert [p.name for p in index_cache.glob("corpus-*.sqlite")].count(
        f"corpus-v1-{corpus_key(corpus.read_bytes())}.sqlite") == 1
    tracemalloc.start()
    try:
        env = make()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        assert peak < size / 3, f"opening the built index took {peak} bytes for a {size}-byte corpus"
        env.reset(seed=0)
        obs, _, _, _, info = step(env, "get_article", title="article 7")
        assert info["error"] is None and "# Article 7" in obs
    finally:
        env.close()
