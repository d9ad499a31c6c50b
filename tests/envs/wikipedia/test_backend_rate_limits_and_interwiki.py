"""The live backend against a real loopback MediaWiki server: a rate limit that asks for a huge
wait fails the call at once, saying so; titles MediaWiki answers without ``pages`` (another
wiki's ``fr:Paris``, nothing at all) are tool results, never a ``KeyError``."""

import math
import threading
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import ListTasks, Task
from benchmax_gym.core.tools import ToolFailure
from benchmax_gym.envs.wikipedia.backends import LiveBackend, LiveWikipedia
from benchmax_gym.testing.mediawiki import MediaWikiStub

TASKS = ListTasks([Task("t", "Where does the Limmat flow?", "Zürich", {"supporting": ["Zürich"]})])
RECORDS = [{"title": "Zürich", "text": "Zürich is a city on the Limmat."},
           {"title": "Paris", "text": "Paris is the capital of France."}]


def live_env(server, **backend_args):
    return gym.make("benchmax/Wikipedia-v0", tasks=TASKS, backend="live",
                    backend_args={"api_url": server.api_url, **backend_args})


def step(env, name, **arguments):
    return env.step(env.unwrapped.format.render_calls([(name, arguments)]))


def within(seconds, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``'s result or exception, or a failure when it is still running after ``seconds``."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001  (handed to the test)
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- Retry-After --------------------------------------------------------------------------------


def far_date():
    return format_datetime(datetime.now(timezone.utc) + timedelta(days=1), usegmt=True)


@pytest.mark.parametrize("retry_after", ["86400", "far date"])
def test_a_retry_after_longer_than_the_tool_waits_fails_the_call_at_once_as_rate_limiting(retry_after):
    """``Retry-After: 86400`` (or an HTTP date a day ahead) once hung the tool call for a day:
    the client slept what the server said. The episode ends ``tool_unavailable`` (not the
    model's doing), with no retry sent, and the next episode's call goes through."""
    with MediaWikiStub(RECORDS) as server:
        env = live_env(server, http_timeout=30.0, max_retries=2, retry_wait=0.01)  # (a 429 fails at once: no wait)
        try:
            env.reset(seed=0)
            server.fail_next = [(429, {"Retry-After": far_date() if retry_after == "far date" else retry_after})]
            obs, reward, terminated, truncated, info = within(60, step, env, "search", query="Limmat")
            assert info["outcome"] == "tool_unavailable" and "rate-limiting" in obs, obs
            assert math.isnan(reward) and truncated and not terminated
            assert server.count(list="search") == 1  # no retry: the server asked for a day
            env.reset(seed=0)
            obs, _, _, _, info = step(env, "get_article", title="Zürich")
            assert info["error"] is None and "Limmat" in obs
        finally:
            env.close()


def test_a_rate_limit_on_every_retry_says_so():
    with MediaWikiStub(RECORDS) as server:
        backend = LiveBackend(api_url=server.api_url, max_retries=1, retry_wait=0.01)
        server.fail_next = [(429, {"Retry-After": "0"})] * 2
        with pytest.raises(ToolFailure, match="rate-limiting") as caught:
            within(60, backend.article, "Zürich")
        assert caught.value.outcome == "tool_unavailable"
        assert server.count(prop="extracts", titles="Zürich") == 2
        backend.shutdown()


def test_the_tools_timeout_leaves_room_for_every_wait_it_honours():
    """A Retry-After of up to ``http_timeout`` is waited out before each retry: the engine's
    timeout for the call covers each attempt and each such wait, so it never cuts one short."""
    config = LiveWikipedia(http_timeout=2.0, max_retries=3, retry_wait=0.5)
    attempts, waits, backoff = 2.0 * 4, 2.0 * 3, 0.5 * (1 + 2 + 4)
    assert config.tool_timeout >= attempts + waits + backoff


# -- answers without pages ----------------------------------------------------------------------

INTERWIKI = {"batchcomplete": "", "query": {"interwiki": [{"title": "fr:Paris", "iw": "fr"}]}}
PAGELESS = {  # the title asked -> what MediaWiki answers to a titles query for it
    "fr:Paris": INTERWIKI,
    "wikt:word": {"batchcomplete": "", "query": {"normalized": [{"from": "wikt:word", "to": "wikt:Word"}],
                                                 "interwiki": [{"title": "wikt:Word", "iw": "wikt"}]}},
    "Normalized only": {"batchcomplete": "", "query": {"normalized": [{"from": "a", "to": "A"}]}},
    "No query": {"batchcomplete": ""},
    "Empty pages": {"batchcomplete": "", "query": {"pages": []}},
    "Special:Random": {"batchcomplete": "", "query": {"pages": {"-1": {"ns": -1, "title": "Special:Random",
                                                                        "special": ""}}}},
    "Bad<title>": {"batchcomplete": "", "query": {"pages": {"-1": {
        "title": "Bad<title>", "invalidreason": 'The requested page title contains invalid characters: "<".',
        "invalid": ""}}}},
}


class PagelessWiki(MediaWikiStub):
    """The stub, answering the titles of ``PAGELESS`` (and a search for ``nothing``) as MediaWiki does."""

    def answer(self, params):
        if params.get("titles") in PAGELESS:
            return PAGELESS[params["titles"]]
        if params.get("srsearch") == "nothing":
            return {"batchcomplete": ""}
        return super().answer(params)


@pytest.mark.parametrize("title, says", [
    ("fr:Paris", "another wiki ('fr'"), ("wikt:word", "another wiki ('wikt'"),
    ("Normalized only", "no article titled"), ("No query", "no article titled"), ("Empty pages", "no article titled"),
    ("Special:Random", "no article titled"), ("Bad<title>", "no article titled"),
])
def test_a_title_answered_without_pages_is_a_tool_result(title, says):
    """``fr:Paris`` or ``wikt:word`` (MediaWiki answers ``query.interwiki``, no ``pages``) once
    raised ``KeyError: 'pages'``: it is the model's tool error saying the title is another
    wiki's; an answer with no page at all (no ``query``, ``normalized`` only, empty ``pages``),
    a special page or an invalid title is no article. The episode goes on."""
    with PagelessWiki(RECORDS) as server:
        env = live_env(server, max_retries=0)
        try:
            env.reset(seed=0)
            obs, reward, terminated, truncated, info = step(env, "get_article", title=title)
            assert info["error"] == "tool_error" and says in obs, obs
            assert "KeyError" not in obs and not (terminated or truncated)
            obs, _, _, _, info = step(env, "get_article", title="Zürich")  # the same episode goes on
            assert info["error"] is None and "Limmat" in obs
        finally:
            env.close()


def test_a_search_answered_without_results_is_no_results():
    with PagelessWiki(RECORDS) as server:
        backend = LiveBackend(api_url=server.api_url, max_retries=0)
        assert backend.search("nothing", 5) == []
        assert backend.search("Paris", 5)[0].title == "Paris"
        backend.shutdown()
