"""Tool calls as real chat models write them, and hostile ones, through ``gym.make`` and ``step``:
a call the model meant runs, text that is not one does not, and anything malformed becomes an
observation that says what was wrong."""

import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.spaces import utils
from gymnasium.wrappers import FlattenObservation

from benchmax_gym import register_tool_env

sys.path.insert(0, str(Path(__file__).parent))
from test_env_hostile import utf8_clean  # noqa: E402

ENV_ID = "formats-audit/Add-v0"


def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def echo(text: str) -> str:
    """Repeat the text."""
    return text


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


register_tool_env(ENV_ID, tools=[add, echo], tasks=[{"prompt": "Say 42 (漢字, ünï, 😀).", "answer": "42"}],
                  rubric=exact)


def step(action: str, **kwargs):
    env = gym.make(ENV_ID, **kwargs)
    env.reset(seed=0)
    return env, *env.step(action)


HERMES_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


# -- real models' replies ---------------------------------------------------------------------


@pytest.mark.parametrize("tool_format, action, results", [
    ("hermes", HERMES_ADD, ["3"]),  # Qwen2.5
    ("hermes", HERMES_ADD.replace("\n", ""), ["3"]),
    ("hermes", HERMES_ADD + "\n" + HERMES_ADD.replace("1", "3"), ["3", "5"]),
    ("hermes", "<think>\nI should add.\n</think>\n\n" + HERMES_ADD, ["3"]),  # Qwen3
    ("hermes", "I should add.\n</think>\n\n" + HERMES_ADD, ["3"]),  # <think> opened by the template
    ("json", '{"name": "add", "parameters": {"a": 1, "b": 2}}', ["3"]),  # Llama 3.x
    ("xml", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
            "</function>\n</tool_call>", ["3"]),  # Qwen3-Coder
])
def test_calls_as_real_models_write_them_run(tool_format, action, results):
    _, obs, reward, terminated, truncated, info = step(action, tool_format=tool_format)
    assert info["errors"] == [] and not (terminated or truncated)
    assert [m["content"] for m in info["messages"]] == results


@pytest.mark.parametrize("tool_format, action", [
    ("hermes", '<think>\nmaybe <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n</think>\n\n42'),
    ("xml", "<think><function=add><parameter=a>1</parameter><parameter=b>2</parameter></function></think>42"),
    ("json", '<think>{"name": "add", "arguments": {"a": 1, "b": 2}}</think>\n42'),
])
def test_a_call_inside_the_thinking_is_not_run_and_the_answer_after_it_is_graded(tool_format, action):
    _, obs, reward, terminated, truncated, info = step(action, tool_format=tool_format)
    assert info["tool_calls"] == [] and terminated and reward == 1.0


@pytest.mark.parametrize("action", [
    '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',  # Mistral, decoded with special tokens
    '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}',  # Llama 3.x, likewise
    '```JSON\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
])
def test_json_calls_after_a_models_call_token_or_in_an_upper_case_fence_run(action):
    """The first was a parse error the model could not fix (the token is its own), the second
    and third a final answer, graded 0."""
    _, obs, reward, terminated, truncated, info = step(action, tool_format="json")
    assert info["errors"] == [] and not terminated
    assert [m["content"] for m in info["messages"]] == ["3"]


@pytest.mark.parametrize("action, says", [
    ("{'name': 'add', 'arguments': {'a': 1, 'b': 2}}", "invalid JSON"),  # a Python dict: was the final answer
    ('[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', "after [TOOL_CALLS]"),  # Mistral's newer syntax: likewise
    ('<|python_tag|>{"name": "add", "arguments": {"a": 1, "b": 2}', "invalid JSON"),
    ("[TOOL_CALLS][1, 2]", '"name" and "arguments"'),
])
def test_json_calls_meant_but_malformed_are_said_to_be_and_the_episode_goes_on(action, says):
    _, obs, reward, terminated, truncated, info = step(action, tool_format="json")
    assert info["errors"] == ["parse_error"] and says in obs
    assert not (terminated or truncated) and reward == 0.0


# -- hostile actions --------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("tool_format, action, says", [
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 1_000_000 + ', "b": 2}}</tool_call>',
     "integer string conversion"),
    ("json", '{"name": "add", "arguments": {"a": ' + "9" * 1_000_000 + ', "b": 2}}', "integer string conversion"),
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": ' + DEEP + "}}</tool_call>", "nested too deeply"),
    ("hermes", '<tool_call>{"name": "add", "arguments": "' + DEEP + '"}</tool_call>', "nested too deeply"),
    ("openai", '{"role": "assistant", "tool_calls": ' + DEEP + "}", "nested too deeply"),
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2,}}</tool_call>', "invalid JSON"),
    ("hermes", '<tool_call>{"name": "echo", "arguments": {"text": "a\x00b"}}</tool_call>', "control character"),
    ("hermes", '<tool_call>{"name": ["add"], "arguments": {}}</tool_call>', '"name" string'),
])
@pytest.mark.timeout(60)
def test_hostile_json_is_a_parse_error_observation(tool_format, action, says):
    _, obs, reward, terminated, truncated, info = step(action, tool_format=tool_format, max_action_chars=2_000_000)
    assert info["errors"] == ["parse_error"] and says in obs and not (terminated or truncated)


@pytest.mark.parametrize("tool_format, action", [
    ("hermes", "<tool_call>[" + "1," * 15_000 + "1]</tool_call>"),
    ("hermes", '<tool_call>{"name": 0}</tool_call>' * 900),
    ("openai", '{"role": "assistant", "tool_calls": [' + "1," * 15_000 + "1]}"),
    ("openai", '{"role": "assistant", "tool_calls": ['
     + ",".join(f'{{"function": {{"name": "f{i}", "arguments": "{{"}}}}' for i in range(600)) + "]}"),
])
def test_thousands_of_broken_calls_get_a_note_of_a_few_lines(tool_format, action):
    """Each was answered with its own error: a note up to twenty times the reply's size, kept in
    the transcript the model reads every later turn."""
    env, obs, reward, terminated, truncated, info = step(action, tool_format=tool_format)
    assert len(action) <= 32_000 and info["errors"] == ["parse_error"] and not (terminated or truncated)
    note = env.unwrapped.messages[-1]["content"]
    assert note in obs and len(obs) < 1_000, len(obs)
    assert "times" in note or "more errors" in note


# -- model-chosen call ids (openai) -------------------------------------------------------------


def openai_calls(*ids, content=None):
    return json.dumps({"role": "assistant", "content": content, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": n, "b": 1})}}
        for n, i in enumerate(ids)]})


@pytest.mark.parametrize("ids", [("\ud800",), ("a\udfff", "b\ud800"), ("x", "x"), ("x", "x", "call_1_1")],
                         ids=["surrogate", "two-surrogates", "repeated", "repeated-and-a-default-taken"])
def test_call_ids_are_utf8_and_unique_within_a_reply(ids):
    """An escaped lone surrogate in an id reached the observation (no tokenizer encodes it); a
    repeated id gave two results one id, which chat APIs pair with their calls by."""
    action = openai_calls(*ids)
    assert action.isascii()  # what a model can write
    env, obs, reward, terminated, truncated, info = step(action, tool_format="openai")
    assert info["errors"] == [] and [m["content"] for m in info["messages"]] == [str(n + 1) for n in range(len(ids))]
    result_ids = [m["tool_call_id"] for m in info["messages"]]
    assert len(set(result_ids)) == len(ids)
    assert [c["id"] for c in env.unwrapped.messages[-1 - len(ids)]["tool_calls"]] == result_ids
    assert utf8_clean(obs, info["messages"], env.unwrapped.messages, env.unwrapped.chat_messages("hf"))
    if ids[0] == "x":
        assert result_ids[0] == "x"  # a usable id is kept


@pytest.mark.parametrize("action", [json.dumps({"role": "assistant", "content": "4\ud8002"}),
                                    openai_calls("a", content="adding\udc00")],
                         ids=["final-answer", "with-a-call"])
def test_openai_content_with_an_escaped_lone_surrogate_is_kept_as_a_replacement_character(action):
    env, obs, reward, terminated, truncated, info = step(action, tool_format="openai")
    assert utf8_clean(obs, info["messages"], env.unwrapped.messages, env.unwrapped.chat_messages("hf"),
                      env.unwrapped.episode_record())
    assert "\ufffd" in json.dumps(env.unwrapped.messages, ensure_ascii=False)


# -- the text spaces ----------------------------------------------------------------------------


def test_a_flattened_observation_round_trips_any_text():
    """``contains`` admits any str, but gymnasium's flatten looked each character up in the
    sampling charset: FlattenObservation raised KeyError on the prompt's first '漢'."""
    env = FlattenObservation(gym.make(ENV_ID, max_observation_chars=3_000))
    inner = env.unwrapped.observation_space
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and "漢字, ünï, 😀" in utils.unflatten(inner, obs)
    obs, *_ = env.step('<tool_call>{"name": "echo", "arguments": {"text": "\\u0000é\\ud800"}}</tool_call>')
    assert env.observation_space.contains(obs)
    assert utils.unflatten(inner, obs) == "<tool_response>\n\x00é\ufffd\n</tool_response>"
    with pytest.raises(ValueError, match="3001 characters"):
        utils.flatten(inner, "x" * 3_001)
