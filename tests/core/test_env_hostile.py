"""Hostile actions and settings through the engine: each gets an observation saying what was
wrong (or fails at construction, naming the argument), never an exception out of step, never a
reward for a failure, and an observation inside the observation space that any UTF-8 encoder,
tokenizer or terminal takes."""

import json
import math
import sys
from pathlib import Path

import pytest

from benchmax_gym.core import ListTasks, Rubric, Task, ToolEnv, Toolset, tool

sys.path.insert(0, str(Path(__file__).parent))
from sample_tools import add, nap  # noqa: E402
from test_env import SECRET, call, make_env  # noqa: E402


def utf8_clean(*things) -> bool:
    """Whether every string in ``things`` encodes as UTF-8 (what a tokenizer or a file needs)."""
    try:
        json.dumps(things, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# A JSON escape the model writes in plain ASCII ("\ud800") decodes to a lone surrogate, which no
# UTF-8 encoder takes: a Hugging Face tokenizer raises on it (TypeError), print() raises.
ESCAPED = '<tool_call>{"name": "shout", "arguments": {"text": "a\\ud800b"}}</tool_call>'
ESCAPED_NAME = '<tool_call>{"name": "add\\udfff", "arguments": {"a": 1, "b": 2}}</tool_call>'


@pytest.mark.parametrize("action", [ESCAPED, ESCAPED + call("add", a=1, b=2), ESCAPED_NAME],
                         ids=["one-call", "two-calls", "unknown-name"])
def test_a_lone_surrogate_from_a_json_escape_never_reaches_what_the_model_sees(action, capsys):
    env = make_env(render_mode="human")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs) and (reward, terminated, truncated) == (0.0, False, False)
    assert "\ufffd" in obs  # the character shows where it was
    assert utf8_clean(obs, info["messages"], env.unwrapped.messages, env.unwrapped.chat_messages("hf"))
    env.render()  # prints the transcript: raised UnicodeEncodeError
    assert "\ufffd" in capsys.readouterr().out


@pytest.mark.parametrize("timeout", [math.inf, 1e10])
def test_a_tool_timeout_no_clock_can_wait_for_fails_at_construction(timeout):
    """Beyond threading.TIMEOUT_MAX every threaded tool call failed with an OverflowError that
    the model was shown as the tool's failure (an episode scored on an env fault)."""
    with pytest.raises(ValueError, match="tool_timeout"):
        make_env(tool_timeout=timeout)


def test_an_action_of_50_mb_is_refused_unrun_and_the_observation_stays_small():
    env = make_env()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("add", a=1, b=2) + "x" * 50_000_000)
    assert info["error"] == "action_too_long" and info["tool_calls"] == [] and not (terminated or truncated)
    assert reward == 0.0 and env.observation_space.contains(obs) and len(obs) < 200
    assert len(env.unwrapped.messages[-2]["content"]) <= env.unwrapped.max_action_chars


@pytest.mark.parametrize("action", ["\x00", SECRET[:4] + "\x00" + SECRET[4:], "\ud800"])
def test_nul_bytes_and_surrogates_in_a_final_answer_are_graded_as_what_they_are(action):
    env = make_env()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and reward == 0.0 and info["outcome"] == "scored" and env.observation_space.contains(obs)


@pytest.mark.parametrize("action", [b"<tool_call>", None, {"name": "add"}, ["a"]])
def test_an_action_that_is_not_a_str_is_a_type_error_that_leaves_the_episode_as_it_was(action):
    """The documented answer to a caller's bug (the model only writes text): nothing is counted."""
    env = make_env()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="action must be a str"):
        env.step(action)
    assert env.unwrapped.episode.turn == 0 and env.unwrapped.episode.actions == []
    assert env.step(SECRET)[1] == 1.0


@tool(terminal=True)
def submit(answer: str) -> str:
    """Hand in the answer."""
    return "submitted " + answer


def submitted(messages) -> float:
    return float(any(m["role"] == "tool" and m["content"] == "submitted 42" for m in messages))


def terminal_env(**kwargs) -> ToolEnv:
    return ToolEnv(tasks=ListTasks([Task("t", "Submit 42.", "42")]), toolset=Toolset([add, nap, submit]),
                   rubric=Rubric([submitted]), **kwargs)


def test_a_terminal_tool_on_the_last_turn_terminates_rather_than_truncates():
    """Both limits meet: the model ended it (terminated: a trainer does not bootstrap past it)."""
    env = terminal_env(max_turns=1)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(call("submit", answer="42"))
    assert (reward, terminated, truncated, info["outcome"]) == (1.0, True, False, "scored")


def test_thousands_of_calls_in_one_reply_run_the_first_few_and_answer_every_call():
    env = make_env(max_action_chars=10_000_000)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("add", a=1, b=2) * 5_000)
    assert info["errors"] == ["too_many_calls"] and reward == 0.0 and not (terminated or truncated)
    assert len(info["messages"]) == 5_000  # a result for every call id, as chat APIs require
    assert [m["content"] for m in info["messages"][:8]] == ["3"] * 8
    assert env.observation_space.contains(obs)
