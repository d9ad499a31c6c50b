"""Thousands of random and malformed actions never raise and always give an observation in the space."""

import json

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import benchmax_gym  # noqa: F401
from benchmax_gym.testing import play

KNOWN_CODES = {None, "parse_error", "unknown_tool", "bad_arguments", "tool_timeout", "tool_error",
               "action_too_long", "too_many_calls"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
names = st.sampled_from(["calculator", "python", "", "CALCULATOR", "calculator ", "\x00"]) | st.text(max_size=15)
expressions = st.sampled_from(["1+1", "9**9**9", "1/0", "(" * 300, "sqrt(-1)", "x", "", "2" * 5000]) | st.text(max_size=50)


@st.composite
def tool_call_actions(draw):
    args = draw(st.one_of(
        st.fixed_dictionaries({"expression": expressions}),
        st.dictionaries(st.text(max_size=12), json_values, max_size=3),
        json_values,
    ))
    body = json.dumps({"name": draw(names), "arguments": args})
    mutate = draw(st.sampled_from(["none", "cut", "quotes", "double", "nest", "string_args"]))
    if mutate == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    elif mutate == "quotes":
        body = body.replace('"', "'")
    elif mutate == "double":
        body = body + body
    elif mutate == "string_args":
        body = json.dumps({"name": draw(names), "arguments": json.dumps(args)[:-1]})
    wrapped = f"<tool_call>{body}</tool_call>"
    if mutate == "nest":
        wrapped = f"<tool_call>{wrapped}</tool_call>"
    count = draw(st.integers(1, 12))
    noise = draw(st.text(max_size=40))
    return noise + wrapped * count + draw(st.sampled_from(["", "<tool_call>", "</tool_call>", "\\boxed{", "\x00\x1b"]))


actions = st.one_of(
    st.text(max_size=300),
    tool_call_actions(),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=0, max_size=100),
    st.builds(lambda n: "x" * n, st.integers(0, 40_000)),
    st.sampled_from(["<function=calculator><parameter=expression>1+", '{"role": "assistant", "tool_calls": 5}']),
)


@pytest.mark.parametrize("tool_format", ["hermes", "json", "openai", "xml"])
@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(action_list=st.lists(actions, min_size=1, max_size=4))
def test_random_actions_never_raise(tool_format, action_list):
    env = _ENVS[tool_format]
    obs, info = env.reset(seed=0)
    for action in action_list:
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs)
        assert isinstance(reward, float)
        assert info["error"] in KNOWN_CODES
        if terminated or truncated:
            assert "reward_components" in info
            break


_ENVS = {f: gym.make("benchmax/Math-v0", tool_format=f, max_turns=3, max_action_chars=20_000) for f in
         ("hermes", "json", "openai", "xml")}


def test_action_space_samples_are_valid_actions():
    env = gym.make("benchmax/Math-v0", max_turns=50)
    env.action_space.seed(0)
    errors = set()
    for episode in range(40):
        p = play(env, lambda obs, info: env.action_space.sample(), seed=episode)
        assert all(env.observation_space.contains(obs) for obs in p.observations)
        errors.update(info["error"] for info in p.infos[1:])
    assert errors <= KNOWN_CODES and "parse_error" in errors
