"""What the model wrote is kept, and what it only thought is not acted on (through env.step)."""

import json

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.wrappers import RecordEpisodes

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


def math_env(**kwargs):
    env = gym.make("benchmax/Math-v0", python_tool=False, **kwargs)
    env.reset(seed=0)
    return env


def answer_of(env) -> str:
    return str(env.unwrapped.episode.task.answer)


def test_a_reply_that_does_not_parse_is_kept_whole(tmp_path):
    path = tmp_path / "episodes.jsonl"
    env = RecordEpisodes(gym.make("benchmax/Math-v0", python_tool=False), path)
    env.reset(seed=0)
    bad = 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": 6*7</tool_call>'
    _, _, _, _, info = env.step(bad)
    assert info["error"] == "parse_error"
    assistant = [m for m in env.unwrapped.messages if m["role"] == "assistant"][-1]
    assert assistant["content"] == bad  # was "Let me compute." - the call the model wrote was lost
    final = f"<think>easy</think>\\boxed{{{answer_of(env)}}}"
    env.step(final)
    env.close()
    record = json.loads(path.read_text())
    assert record["actions"] == [bad, final]
    assert record["errors"] == ["parse_error"]
    assert any(m.get("content") == bad for m in record["messages"])


def test_calls_inside_reasoning_are_not_run():
    env = math_env()
    _, _, terminated, _, info = env.step(f"<think>maybe {CALC}</think>I will not call anything.")
    assert info["tool_calls"] == [] and terminated  # the visible reply has no call: it is final
    assert env.unwrapped.episode.actions[-1].startswith("<think>maybe <tool_call>")


def test_a_boxed_guess_inside_reasoning_does_not_count_against_the_answer():
    env = math_env()
    _, reward, terminated, _, info = env.step(f"<think>\\boxed{{999}}? no.</think>So \\boxed{{{answer_of(env)}}}")
    assert terminated and reward == 1.0, info["reward_components"]  # the format check saw two answers
    env = math_env()
    _, reward, _, _, _ = env.step(f"<think>\\boxed{{{answer_of(env)}}}</think>So \\boxed{{999}}")
    assert reward == 0.0  # nor does a right guess the reply then abandons


def test_qwen3_style_reply_without_the_opening_tag():
    env = math_env()
    obs, _, terminated, _, info = env.step(f"thinking about {CALC} first...</think>\n\n{CALC}")
    assert [c["name"] for c in info["tool_calls"]] == ["calculator"] and "42" in obs and not terminated


def test_a_reply_cut_off_while_thinking_has_no_calls_and_no_answer():
    env = math_env()
    _, reward, terminated, _, info = env.step(f"<think>I should call {CALC} and answer \\boxed{{{answer_of(env)}}}")
    assert info["tool_calls"] == [] and terminated and reward == 0.0


def test_reasoning_tags_are_configurable_or_off():
    env = math_env(reasoning_tags=None)
    _, _, _, _, info = env.step(f"<think>{CALC}</think>")
    assert [c["name"] for c in info["tool_calls"]] == ["calculator"]
    env = math_env(reasoning_tags=["<reasoning>", "</reasoning>"])
    _, _, terminated, _, info = env.step(f"<reasoning>{CALC}</reasoning>done")
    assert info["tool_calls"] == [] and terminated
    with pytest.raises(ValueError, match="reasoning_tags"):
        gym.make("benchmax/Math-v0", reasoning_tags="<think>")


def test_the_model_is_told_before_its_last_turn_and_when_the_limit_is_hit():
    env = math_env(max_turns=3)
    obs, _, _, _, _ = env.step(CALC)
    assert "last turn" not in obs
    obs, _, _, truncated, info = env.step(CALC)
    assert "42" in obs and "This is your last turn" in obs and not truncated
    assert info["messages"][-1] == {"role": "user", "content": obs.split("</tool_response>\n")[-1]}
    obs, _, _, truncated, _ = env.step(CALC)
    assert truncated and "The turn limit (3) is reached" in obs


def test_render_needs_no_fps_warning():
    import warnings

    env = gym.make("benchmax/Math-v0", python_tool=False, render_mode="ansi")
    env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "[user]" in env.render()
