"""Typed task sources: a source by name with task_args, or its config instance; misplaced
arguments name what the source takes; the flat form of 0.1 still works, with a warning."""

import contextlib
import sqlite3
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.sources import SourceConfig, choose
from benchmax_gym.envs.crm.tasks import GeneratedCRM
from benchmax_gym.envs.excel.generator import GeneratedSheets
from benchmax_gym.envs.excel.spreadsheetbench import SpreadsheetBench
from benchmax_gym.envs.math.datasets import GSM8K, MATH500, HFDataset
from benchmax_gym.envs.math.generator import GeneratedMath
from benchmax_gym.envs.wikipedia.backends import LiveWikipedia
from benchmax_gym.envs.wikipedia.corpora import LocalCorpus
from benchmax_gym.envs.wikipedia.tasks import HotpotQA

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GSM8K_FILE = DATA / "gsm8k" / "train_sample500.jsonl"
HOTPOT_FILE = DATA / "hotpotqa" / "dev_distractor_100.json"
MATH_SOURCES = (GeneratedMath, GSM8K, MATH500, HFDataset)


def first_tasks(env, n=3):
    tasks = env.unwrapped.tasks
    return [(t.id, t.prompt, t.answer) for t in (tasks[i] for i in range(n))]


@contextlib.contextmanager
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_by_name_by_instance_and_by_id_give_the_same_tasks():
    with no_warnings():
        by_name = gym.make("benchmax/Math-v0", tasks="gsm8k", task_args={"dataset": str(GSM8K_FILE), "limit": 5})
        by_instance = gym.make("benchmax/Math-v0", tasks=GSM8K(dataset=GSM8K_FILE, limit=5))
        by_id = gym.make("benchmax/Math-GSM8K-v0", task_args={"dataset": str(GSM8K_FILE), "limit": 5})
    assert first_tasks(by_name) == first_tasks(by_instance) == first_tasks(by_id)
    assert len(by_name.unwrapped.tasks) == 5 and by_name.unwrapped.task_config == GSM8K(dataset=str(GSM8K_FILE), limit=5)
    for env in (by_name, by_instance, by_id):
        env.close()


def test_the_flat_form_still_works_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"use task_args=\{'dataset': ..., 'limit': ...\} \(on the command "
                      r"line: --env-arg task_args.dataset=... --env-arg task_args.limit=...\)") as caught:
        flat = gym.make("benchmax/Math-v0", tasks="gsm8k", dataset=str(GSM8K_FILE), limit=5)
    assert (caught[0].filename, caught[0].lineno) == (__file__, sys._getframe().f_lineno - 1)  # (the line above)
    typed = gym.make("benchmax/Math-v0", tasks="gsm8k", task_args={"dataset": str(GSM8K_FILE), "limit": 5})
    assert first_tasks(flat) == first_tasks(typed)
    with pytest.warns(DeprecationWarning, match="difficulty"):
        old = gym.make("benchmax/Excel-v0", difficulty={"rows": 6}, num_tasks=3)
    assert old.unwrapped.task_config == GeneratedSheets(difficulty={"rows": 6}, num_tasks=3)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"tasks": "generated", "task_args": {"dataset": "x.jsonl"}},
         "dataset applies only to tasks='gsm8k' or 'math500' or 'hf'; tasks='generated' takes num_tasks, task_seed, difficulty"),
        ({"tasks": "gsm8k", "task_args": {"numeric_only": True}},
         "numeric_only applies only to tasks='math500'; tasks='gsm8k' takes dataset, split, limit"),
        ({"tasks": "gsm8k", "task_args": {"limt": 3}}, r"unknown task_args key 'limt' \(did you mean 'limit'\?\)"),
        ({"tasks": "hf"}, "tasks='hf' needs task_args dataset; tasks='hf' takes dataset, split"),
        ({"tasks": "gsm8k", "task_args": ["dataset"]}, "task_args must be a dict"),
        ({"tasks": GSM8K(), "task_args": {"limit": 3}}, "GSM8K already holds its arguments"),
        ({"tasks": [{"prompt": "2+2?", "answer": "4"}], "task_args": {"limit": 3}},
         r"limit applies only to tasks given by name \('generated', 'gsm8k', 'math500', 'hf'\)"),
        ({"tasks": "gsm8k", "task_args": {"limit": 0}}, "limit must be a positive int"),
        ({"tasks": "generated", "task_args": {"difficulty": {"digits": 20}}}, "digits must be an int from 1 to 9"),
        ({"tasks": "generated", "task_args": {"task_seed": -1}}, "task_seed must be a non-negative int"),
        ({"tasks": "nope"}, "tasks must be one of 'generated', 'gsm8k', 'math500', 'hf', a config instance or "
                            "your own tasks, got 'nope'$"),
        ({"tasks": "gsm8k8"}, r"got 'gsm8k8' \(did you mean 'gsm8k'\?\)$"),
    ],
)
def test_a_misplaced_argument_fails_at_make_naming_what_the_source_takes(kwargs, says):
    with pytest.raises(ValueError, match=says):
        gym.make("benchmax/Math-v0", **kwargs)


def test_a_misspelt_backend_is_named_with_the_close_one_and_no_talk_of_tasks():
    with pytest.raises(ValueError, match=r"^backend must be one of 'generated', 'local', 'live' or a config "
                                         r"instance, got 'lcoal' \(did you mean 'local'\?\)$"):
        gym.make("benchmax/Wikipedia-v0", backend="lcoal")


def test_every_family_declares_typed_sources_with_checked_fields():
    with pytest.raises(ValueError, match="rows"):
        GeneratedSheets(difficulty={"rows": 0})
    with pytest.raises(ValueError, match="needs task_args dataset; tasks='spreadsheetbench' takes dataset, limit"):
        gym.make("benchmax/Excel-SpreadsheetBench-v0")
    with pytest.raises(ValueError, match="task_types may only contain"):
        GeneratedCRM(task_types=["gossip"])
    with pytest.raises(ValueError, match="dataset: no such file"):
        HotpotQA(dataset="/no/such/file.json")
    with pytest.raises(ValueError, match="max_retries must be an int from 0 to 10"):
        LiveWikipedia(max_retries=11)
    with pytest.raises(ValueError, match="corpus applies only to backend='local'; backend='live' takes api_url"):
        gym.make("benchmax/Wikipedia-v0", tasks=[{"prompt": "q", "answer": "a"}], backend="live",
                 backend_args={"corpus": "x.jsonl"})
    assert isinstance(SpreadsheetBench(dataset=DATA / "spreadsheetbench"), SourceConfig)


def test_wikipedia_backends_by_name_or_instance():
    with no_warnings():
        named = gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa", task_args={"dataset": str(HOTPOT_FILE)},
                         backend="local", backend_args={"corpus": str(HOTPOT_FILE)})
        given = gym.make("benchmax/Wikipedia-HotpotQA-v0", task_args={"dataset": str(HOTPOT_FILE)},
                         backend=LocalCorpus(corpus=HOTPOT_FILE))
    assert named.unwrapped.backend_name == given.unwrapped.backend_name == "local"
    assert first_tasks(named) == first_tasks(given)
    named.close()
    given.close()


def test_choose_leaves_other_keyword_arguments_alone():
    rest = {"max_turns": 3, "limit": 4}
    with pytest.warns(DeprecationWarning):
        config = choose("gsm8k", {"dataset": "a.jsonl"}, MATH_SOURCES, rest)
    assert rest == {"max_turns": 3} and config == GSM8K(dataset="a.jsonl", limit=4)


# -- the episode's resources and what the env tells a vector worker -------------------------------


def test_episode_resources_are_released_when_the_episode_ends(tmp_path):
    env = gym.make("benchmax/CRM-v0", cache_dir=str(tmp_path), org_size=200)
    env.reset(seed=0)
    con = env.unwrapped.episode.state["db"].con
    env.reset(seed=1)
    with pytest.raises(sqlite3.ProgrammingError):  # the previous episode's copy is closed
        con.execute("SELECT 1")
    con = env.unwrapped.episode.state["db"].con
    env.close()
    with pytest.raises(sqlite3.ProgrammingError):
        con.execute("SELECT 1")


def test_excel_without_a_sandbox_removes_its_workspace_at_the_next_reset():
    env = gym.make("benchmax/Excel-v0", python_tool=False)
    env.reset(seed=0)
    folder = env.unwrapped.episode.state["workbook"].path.parent
    assert folder.is_dir()
    env.reset(seed=1)
    assert not folder.exists()
    env.close()


def test_the_env_says_whether_a_vector_worker_needs_its_event_loop():
    plain = gym.make("benchmax/Math-v0", python_tool=False)
    assert plain.unwrapped.needs_event_loop is False
    live = gym.make("benchmax/Wikipedia-v0", tasks=[{"prompt": "q", "answer": "a"}], backend="live")
    assert live.unwrapped.needs_event_loop is True  # its tools wait on HTTP
    mcp = gym.make("benchmax/MCP-v0")
    assert mcp.unwrapped.needs_event_loop is True  # tools unknown until its server is up
    for env in (plain, live, mcp):
        env.close()


FORK_SCRIPT = """
import gc, os, sys
import gymnasium as gym, benchmax_gym
env = gym.make("benchmax/Excel-v0", python_tool=False)
env.reset(seed=0)
folder = env.unwrapped.episode.state["workbook"].path.parent
if os.fork() == 0:
    sys.exit(0)  # a normal exit: atexit runs the finalizers the child inherited
os.wait()
kept = folder.is_dir()
del env
gc.collect()
print(kept, folder.exists())
"""


def test_an_env_dropped_without_close_releases_its_episode_but_a_forked_child_does_not():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]  # the child left the parent's workspace; dropping freed it
