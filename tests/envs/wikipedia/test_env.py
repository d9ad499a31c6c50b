"""benchmax/Wikipedia-v0 end to end: the reference solver on every backend, HotpotQA, bad input,
determinism, configuration errors."""

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import ListTasks
from benchmax_gym.testing import play

SEARCH = "search"
GET = "get_article"



def call(env, name, **arguments):
    """One tool call in the env's format; returns (observation, info)."""
    obs, _, terminated, _, info = env.step(env.unwrapped.format.render_calls([(name, arguments)]))
    assert not terminated
    return obs, info


@pytest.mark.parametrize("tool_format, episodes", [("hermes", 120), ("json", 30), ("openai", 30), ("xml", 30)])
def test_solver_solves_generated_tasks(tool_format, episodes):
    env = gym.make("benchmax/Wikipedia-v0", tool_format=tool_format)
    solver = env.unwrapped.reference_solver()
    kinds = set()
    for seed in range(episodes):
        p = play(env, solver, seed=seed)
        reward, terminated, info, seen = p.reward, p.terminated, p.info, p.transcript
        task = env.unwrapped.episode.task
        assert terminated and reward == 1.0, (seed, env.unwrapped.messages)
        assert info["reward_components"] == {"f1": 1.0, "em": 1.0}
        assert env.unwrapped.episode.tool_errors == 0
        if task.answer not in ("yes", "no"):
            assert task.answer in seen  # the tools showed the answer: reading is enough
        kinds.add((task.metadata["type"], task.metadata["hops"]))
    if episodes >= 100:
        assert kinds == {(t, h) for t in ("bridge", "comparison") for h in (2, 3, 4)}


def test_generated_tasks_with_other_knobs():
    env = gym.make("benchmax/Wikipedia-v0", task_args={"difficulty": {"entities": 60, "min_hops": 4, "max_hops": 4, "comparison": 0.5}, "task_seed": 3, "num_tasks": 40})
    solver = env.unwrapped.reference_solver()
    for i in range(40):
        reward = play(env, solver, options={"task_index": i}).reward
        assert reward == 1.0 and env.unwrapped.episode.task.metadata["hops"] == 4


def test_solver_solves_the_hotpotqa_sample_offline(shared_data):
    env = gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa", task_args={"dataset": str(shared_data / "hotpotqa" / "dev_distractor_100.json")})
    tasks = env.unwrapped.tasks
    assert len(tasks) == 100 and env.unwrapped.backend_name == "local"
    solver = env.unwrapped.reference_solver()
    for i in range(len(tasks)):
        p = play(env, solver, options={"task_index": i})
        reward, terminated, info = p.reward, p.terminated, p.info
        assert terminated and reward == 1.0, (i, tasks[i].answer, env.unwrapped.messages)
        assert env.unwrapped.episode.tool_errors == 0


def test_hotpotqa_search_finds_supporting_paragraphs(shared_data):
    env = gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa", task_args={"dataset": str(shared_data / "hotpotqa" / "dev_distractor_100.json")})
    env.reset(options={"task_index": 0})  # Were Scott Derrickson and Ed Wood of the same nationality?
    obs, _ = call(env, SEARCH, query="Scott Derrickson director", limit=3)
    assert obs.split("\n")[1].startswith("1. Scott Derrickson - ")
    obs, _ = call(env, GET, title="scott_derrickson")
    assert "American director" in obs


def test_wrong_and_partial_answers():
    env = gym.make("benchmax/Wikipedia-v0")
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step("I do not know.")
    assert terminated and reward == 0.0 and info["reward_components"] == {"f1": 0.0, "em": 0.0}
    env.reset(options={"task_index": 0})
    answer = env.unwrapped.episode.task.answer
    _, reward, _, _, info = env.step(f"<answer>{answer} and more words</answer>")
    assert 0 < reward < 1 and info["reward_components"]["em"] == 0.0


def test_reward_weights_make_em_the_reward():
    env = gym.make("benchmax/Wikipedia-v0", reward_weights={"f1": 0.0, "em": 1.0})
    env.reset(options={"task_index": 0})
    answer = env.unwrapped.episode.task.answer
    _, reward, *_ = env.step(f"<answer>{answer} extra</answer>")
    assert reward == 0.0
    env.reset(options={"task_index": 0})
    _, reward, *_ = env.step(f"<answer>{answer}</answer>")
    assert reward == 1.0


def test_articles_redirects_and_disambiguation(world):
    env = gym.make("benchmax/Wikipedia-v0")
    env.reset(seed=0)
    surnames = {}
    for person in world.people:
        surnames.setdefault(person.facts["surname"], []).append(person.title)
    unique = next(s for s, people in surnames.items() if len(people) == 1)
    shared = next(s for s, people in surnames.items() if len(people) > 1)
    obs, info = call(env, GET, title=unique.lower())
    assert info["error"] is None and f"# {surnames[unique][0]}" in obs and f"(Redirected from {unique})" in obs
    obs, info = call(env, GET, title=shared)
    assert "Disambiguation page" in obs and all(t in obs for t in surnames[shared])
    person = next(p for p in world.people if any(w.links["creator"] is p for w in world.works))
    obs, _ = call(env, GET, title=person.title, section="works")
    assert "Career" not in obs and "(" in obs
    obs, info = call(env, GET, title=person.title, section="Early life")
    assert info["error"] == "tool_error" and "Career" in obs


@pytest.mark.parametrize(
    "query",
    ["", "   ", "x" * 100_000, '"', '"unbalanced', "*", "NEAR", "a NEAR b", "NEAR(a b)", "-", "-x", "title:foo",
     "AND OR NOT", "(((", "^", "東京", "Zürich", "💥", "\x00", "a" * 300],
)
def test_bad_queries_are_clear_results(query):
    env = gym.make("benchmax/Wikipedia-v0", max_action_chars=200_000)  # let 100 KB reach the tool
    env.reset(seed=0)
    obs, info = call(env, SEARCH, query=query)
    assert info["error"] in (None, "tool_error"), obs
    if not query.strip():
        assert "empty" in obs
    if len(query) > 300:
        assert "100000 characters" in obs


@pytest.mark.parametrize(
    "arguments, says",
    [
        ({"title": "No Such Article Anywhere"}, "no article titled"),
        ({"title": ""}, "empty"),
        ({"title": "y" * 100_000}, "at most 300"),
        ({"title": "Zürich"}, "no article titled"),
        ({"title": "東京"}, "no article titled"),
        ({"title": '"*NEAR-'}, "no article titled"),
        ({"title": "Lozule", "offset": -1}, "offset"),
        ({"title": "Lozule", "offset": 10**9}, "past the end"),
    ],
)
def test_bad_titles_are_clear_tool_errors(arguments, says):
    env = gym.make("benchmax/Wikipedia-v0", max_action_chars=200_000)
    env.reset(seed=0)
    obs, info = call(env, GET, **arguments)
    assert info["error"] == "tool_error" and says in obs, obs


def test_bad_argument_types_and_limits():
    env = gym.make("benchmax/Wikipedia-v0")
    env.reset(seed=0)
    obs, info = call(env, SEARCH, query="river", limit=0)
    assert info["error"] == "tool_error" and "limit" in obs
    obs, info = call(env, SEARCH, query="river", limit="many")
    assert info["error"] == "bad_arguments"
    obs, info = call(env, SEARCH, query="river", limit=20)
    assert info["error"] is None and obs.count("\n") >= 10


def test_local_corpus_chunks_long_articles(shared_data, index_cache):
    path = shared_data / "wikipedia" / "articles_10.json"
    records = json.loads(path.read_text())
    tasks = ListTasks([benchmax_gym.core.tasks.Task("t", "Who?", "Aristotle", {"supporting": ["Aristotle"]})])
    env = gym.make("benchmax/Wikipedia-v0", tasks=tasks, backend="local", backend_args={"corpus": str(path)})
    env.reset(seed=0)
    obs, _ = call(env, SEARCH, query="Peripatetic school Lyceum")
    assert "1. Aristotle - " in obs
    obs, _ = call(env, GET, title="Aristotle")
    total = len(records[0]["text"].strip())
    assert obs.startswith("<tool_response>\n# Aristotle") and f"[Characters 0-3000 of {total}. Call get_article with offset=3000" in obs
    obs, _ = call(env, GET, title="Aristotle", offset=3000)
    assert "[Characters 3000-6000" in obs
    assert len(list(index_cache.glob("corpus-*.sqlite"))) >= 1
    solver = env.unwrapped.reference_solver()
    reward = play(env, solver, seed=0).reward
    assert reward == 1.0


def test_ground_truth_never_in_obs_or_info():
    env = gym.make("benchmax/Wikipedia-v0")
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        task = env.unwrapped.episode.task
        text = json.dumps([obs, info])
        assert "supporting" not in text and f"<answer>{task.answer}" not in text
        if task.metadata["type"] == "bridge":
            assert task.answer not in obs


def test_task_seed_picks_another_encyclopedia_built_once_per_process():
    # Same seed, same transcript, sync or async: the contract suite (tests/test_contract.py).
    a = gym.make("benchmax/Wikipedia-v0")
    other = gym.make("benchmax/Wikipedia-v0", task_args={"task_seed": 1})
    assert other.reset(options={"task_index": 5})[0] != a.reset(options={"task_index": 5})[0]
    again = gym.make("benchmax/Wikipedia-v0")
    assert again.unwrapped.backend is a.unwrapped.backend  # one shared index, not rebuilt per env


def test_check_env_on_the_live_backend(mediawiki):
    # The generated and local backends: the contract suite (Wikipedia-v0, Wikipedia-HotpotQA-v0).
    tasks = gym.make("benchmax/Wikipedia-v0", task_args={"num_tasks": 5}).unwrapped.tasks
    env = gym.make("benchmax/Wikipedia-v0", tasks=tasks, backend="live", backend_args={"api_url": mediawiki.api_url})
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"tasks": "nope"}, "tasks must be one of"),
        ({"backend": "nope"}, "backend must be one of"),
        ({"backend": "local"}, "backend='local' does not fit"),
        ({"tasks": "hotpotqa", "backend": "generated", "dataset": __file__}, "backend='generated' does not fit"),
        ({"tasks": "hotpotqa"}, "dataset"),
        ({"tasks": "hotpotqa", "dataset": "/no/such/file.json"}, "dataset: no such file"),
        ({"tasks": "bamboogle", "dataset": "/no/such/file.json"}, "dataset: no such file"),
        ({"difficulty": {"max_hops": 5}}, "max_hops"),
        ({"difficulty": {"min_hops": 4, "max_hops": 3}}, "min_hops"),
        ({"difficulty": {"colour": "red"}}, "difficulty.*colour"),
        ({"difficulty": {"entities": 5}}, "entities"),
        ({"api_url": "http://127.0.0.1:1/w/api.php"}, "api_url"),
        ({"backend": 5}, "backend must be one of .* got 5$"),  # (it said "got None")
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "live",
          "backend_args": {"api_url": "ftp://x/api.php"}}, r"api_url 'ftp://x/api.php': expected http\(s\)://HOST\[:PORT\]/w/api.php"),
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "live",
          "backend_args": {"api_url": "notaurl"}}, "api_url 'notaurl': expected http"),
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "live",
          "backend_args": {"api_url": "http://127.0.0.1:abc/w/api.php"}}, r"api_url .*: not a valid URL \(its port is not a number\)"),
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "live",
          "backend_args": {"api_url": "http://127.0.0.1:70000/w/api.php"}}, r"api_url .*: not a valid URL \(Port out of range"),
        ({"corpus": "x.jsonl"}, "corpus"),
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "local"}, "corpus"),
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "local", "corpus": "/no/c.jsonl"}, "corpus: no such file"),
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "live", "http_timeout": 0}, "http_timeout"),
        ({"tasks": ListTasks([benchmax_gym.core.tasks.Task("t", "q", "a")]), "backend": "live", "max_retries": -1}, "max_retries"),
        ({"reward_weights": {"accuracy": 1.0}}, "reward_weights"),
    ],
)
def test_bad_configuration_fails_at_make(kwargs, names):
    with pytest.raises(ValueError, match=names):
        gym.make("benchmax/Wikipedia-v0", **kwargs)


def test_an_unreachable_api_url_is_named_in_the_tool_failure(refused_port):
    """A valid api_url that does not answer makes fine (the network is checked at use), and the
    failure names it: it named the default https://en.wikipedia.org/w/api.php, not the one set."""
    from benchmax_gym.core.tools import ToolFailure
    from benchmax_gym.envs.wikipedia.backends import LiveBackend

    url = f"http://127.0.0.1:{refused_port}/w/api.php"
    backend = LiveBackend(api_url=url, max_retries=0)
    for ask in (lambda: backend.search("Lima", 3), lambda: backend.article("Lima")):
        with pytest.raises(ToolFailure, match=f"is unavailable \\({url}: ConnectError") as failed:
            ask()
        assert "wikipedia.org" not in str(failed.value)
    backend.shutdown()
