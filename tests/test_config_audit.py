"""A bad configuration fails at ``gym.make`` (and ``gym.make_vec``) with one error naming the
argument: never a silently ignored or misread value, nor a traceback deep in a reset (helper 127's
audit of every registered id's arguments)."""

from __future__ import annotations

import math
import os
import re

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401  (registers the ids)

TASKS = [{"prompt": "2+3?", "answer": "5"}]
SERVER = {"command": "python", "args": ["-c", "pass"]}  # never started: servers start at the first reset


def _reward(completion: str) -> float:
    return 0.0


# (env id, kwargs, what the message must say: the argument's name); "{fifo}"/"{empty}" are files made per test
CASES = [
    # a value Python reads as true or false was used as one (python_tool="no" offered the python tool)
    ("benchmax/Math-v0", {"python_tool": "no"}, "python_tool"),
    ("benchmax/Excel-v0", {"python_tool": 1}, "python_tool"),
    ("benchmax/MCP-v0", {"lenient_schemas": "false"}, "lenient_schemas"),
    # a list was read as "no limits"; a string failed with "'str' object is not a mapping"
    ("benchmax/Math-v0", {"sandbox_limits": []}, "sandbox_limits"),
    ("benchmax/Excel-v0", {"sandbox_limits": "x"}, "sandbox_limits"),
    # a bad tool_timeout was called "sandbox limit timeout" (the sandbox's copy of it)
    ("benchmax/Math-v0", {"tool_timeout": -1}, "tool_timeout"),
    ("benchmax/Excel-v0", {"tool_timeout": math.nan}, "tool_timeout"),
    # passed make, then every reset failed: OverflowError: cannot fit 'int' into an index-sized integer
    ("benchmax/Math-v0", {"task_args": {"num_tasks": 10**30}}, "num_tasks"),
    # MCP-v0: OverflowError (int(inf)), AttributeError ('int' has no 'strip'), "'int' object is not
    # iterable", "not a reward function: 5": none named the argument
    ("benchmax/MCP-v0", {"max_message_mb": math.inf}, "max_message_mb"),
    ("benchmax/MCP-v0", {"system_prompt": 5}, "system_prompt"),
    ("benchmax/MCP-v0", {"server": SERVER, "tasks": 5, "reward": _reward}, "tasks"),
    ("benchmax/MCP-v0", {"server": SERVER, "tasks": TASKS, "reward": 5}, "^reward: "),
    ("benchmax/MCP-v0", {"server": SERVER, "tasks": TASKS, "reward": []}, "^reward: "),
    # CRM: "expected str, bytes or os.PathLike object, not int"; "" and [] used the default cache
    ("benchmax/CRM-v0", {"cache_dir": 5}, "cache_dir"),
    ("benchmax/CRM-v0", {"cache_dir": ""}, "cache_dir"),
    ("benchmax/CRM-v0", {"tasks": TASKS, "org_db": 5}, "org_db"),
    ("benchmax/CRM-v0", {"tasks": TASKS, "org_db": "{fifo}"}, "org_db.*not a regular file"),  # was "no such file"
    # blocked for ever inside gym.make, reading the FIFO
    ("benchmax/Excel-SpreadsheetBench-v0", {"task_args": {"dataset": "{fifo}"}}, "dataset.*not a regular file"),
    # user=None played the customer-service tasks with no customer at all
    ("benchmax/CRM-Service-v0", {"user": None}, "user"),
    # "tasks must not be empty": neither the argument nor the file named
    ("benchmax/Wikipedia-HotpotQA-v0", {"task_args": {"dataset": "{empty}"}}, "dataset.*empty.json"),
    ("benchmax/Wikipedia-v0", {"tasks": "bamboogle", "task_args": {"dataset": "{empty}"}}, "dataset.*empty.json"),
    # OverflowError: Python int too large to convert to C ssize_t
    ("benchmax/Mix-v0", {"window": 10**30}, "window"),
    # the engine's own: [] or "" read as "off"; inf reported as "weight of reward component 'dense'"
    ("benchmax/Math-v0", {"dense_rewards": []}, "^dense_rewards must be True, False or a weight"),
    ("benchmax/Math-v0", {"dense_rewards": math.inf}, "^dense_rewards must be a positive number"),
    ("benchmax/Math-v0", {"tool_format": ["hermes"]}, "^tool_format must be one of"),  # (was: unhashable type)
    # reported as tool_timeout's bound; OverflowError: timestamp out of range
    ("benchmax/Wikipedia-v0", {"backend": "live", "backend_args": {"http_timeout": math.inf}}, "^http_timeout"),
    ("benchmax/OpenEnv-v0", {"base_url": "http://127.0.0.1:9", "connect_timeout": math.inf}, "^connect_timeout"),
    # guards of behaviour already right (they pass on the code before this audit too)
    ("benchmax/Math-v0", {"max_turn": 3}, "max_turn"),
    ("benchmax/Math-v0", {"max_turns": True}, "max_turns"),
    ("benchmax/Math-v0", {"task_args": {"difficulty": {"digits": 0}}}, "digits"),
]


def _filled(value, files):
    if isinstance(value, dict):
        return {k: _filled(v, files) for k, v in value.items()}
    return files.get(value, value) if isinstance(value, str) else value


@pytest.fixture
def files(tmp_path):
    fifo, empty = tmp_path / "fifo", tmp_path / "empty.json"
    os.mkfifo(fifo)
    empty.write_text("[]")
    return {"{fifo}": str(fifo), "{empty}": str(empty)}


def _said(exc: BaseException) -> str:
    """The error's own message: gym.make appends the kwargs to a TypeError, which would name every argument."""
    return str(exc).partition(" was raised from the environment creator")[0]


def _case_id(i: int, case: tuple) -> str:
    return f"{case[0].split('/')[1]}-{re.sub(r'[^a-z_]', '', case[2].split('.')[0])}-{i}"


@pytest.mark.parametrize("env_id,kwargs,names", CASES, ids=[_case_id(i, c) for i, c in enumerate(CASES)])
def test_bad_argument_fails_at_make_naming_it(env_id, kwargs, names, files):
    with pytest.raises((ValueError, TypeError)) as caught:
        gym.make(env_id, **_filled(kwargs, files)).close()
    assert re.search(names, _said(caught.value)), _said(caught.value)


@pytest.mark.parametrize("mode", ["sync", None])  # None: the id's own vector entry point (worker processes)
def test_bad_argument_fails_at_make_vec_naming_it(mode):
    extra = {"vectorization_mode": mode} if mode else {}
    with pytest.raises(ValueError) as caught:  # (the workers' build failed with a RuntimeError and their traceback)
        gym.make_vec("benchmax/Math-v0", num_envs=2, python_tool="no", **extra).close()
    assert str(caught.value).startswith("python_tool must be True or False"), str(caught.value)


@pytest.mark.parametrize("kwargs, says", [
    ({"system_prompt": 5}, "^system_prompt must be a string"),  # (AttributeError: 'int' object has no 'split')
    ({"description": 5}, "^description must be a string"),  # (kept as the id's description)
    ({"rubric": 5}, "^rubric: "),  # ("not a reward function: 5")
])
def test_register_tool_env_names_a_bad_argument(kwargs, says):
    from benchmax_gym import register_tool_env

    with pytest.raises((TypeError, ValueError)) as caught:
        register_tool_env("config-audit/Bad-v0", **{"tools": [], "tasks": TASKS, "rubric": _reward, **kwargs})
    assert re.search(says, str(caught.value)), str(caught.value)
    assert "config-audit/Bad-v0" not in gym.registry


def test_the_cli_reads_python_s_true_false_and_none_in_env_args():
    """``--env-arg python_tool=False`` (Python's spelling) was the text "False", which turned the
    python tool on; now it is False, as JSON's ``false`` is."""
    from benchmax_gym.cli import _parse_env_args

    assert _parse_env_args(["python_tool=False", "a=True", "b=None", "c=false", "d=Falsey"]) == \
        {"python_tool": False, "a": True, "b": None, "c": False, "d": "Falsey"}
