"""The engine's fast step (one call, mid-episode, in one frame) returns exactly what the general
path returns: the same observation, reward, flags and info, and the same transcript, for any
action, including the ones it leaves to the general path."""

import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmax_gym.core import (ListTasks, RewardFailure, RewardFn, Rubric, Task, ToolEnv, ToolError, ToolFailure, Toolset,
                               tool)

sys.path.insert(0, str(Path(__file__).parent))
from sample_tools import add, anap, nap


@tool
def broken() -> str:
    """Fails in a thread."""
    raise RuntimeError("disk on fire")


@tool(inline=True)
def boom() -> str:
    """Fails inline."""
    raise RuntimeError("inline fire")


@tool(inline=True)
def deny(reason: str = "no") -> str:
    """Fails cleanly, inline."""
    raise ToolError(f"denied: {reason}")


@tool(inline=True)
def echo(text: str, times: int = 1) -> str:
    """Repeat text."""
    return text * times


@tool(inline=True)
def listing(n: int) -> list:
    """A non-string result."""
    return list(range(n))


@tool(inline=True)
def gone() -> str:
    """Its backend is gone: a failure that is not the model's, which ends the episode."""
    raise ToolFailure("the server went away", "tool_unavailable")


@tool
def gone_thread() -> str:
    """The same failure, from a thread."""
    raise ToolFailure("the server went away", "tool_unavailable")


TOOLS = [add, nap, anap, broken, boom, deny, echo, listing, gone, gone_thread]


def _turn_signal(messages, tool_results, turn):
    """A per-turn leaf that reads the transcript it is shown (its value says how long it was)."""
    return min(1.0, len(messages) / 20 + len("".join(tool_results)) / 1000)


def _judge_down_at_turn_2(messages, tool_results, turn):
    if turn == 2:
        raise RewardFailure("the judge is down")
    return _turn_signal(messages, tool_results, turn)


def _user(conversation, task):
    return "Thanks, go on."


def make(per_turn=None, **kwargs) -> ToolEnv:
    """The test env; ``per_turn``: a per-turn leaf (``"reads"`` the transcript, or also ``"fails"``
    to score at turn 2); ``user=True``: a simulated user."""
    tasks = ListTasks([Task(f"t{i}", f"Question {i}", "42") for i in range(3)])
    leaves = [lambda completion, answer: float(completion == answer)]
    if per_turn:
        leaves.append(RewardFn("turn_signal", _turn_signal if per_turn == "reads" else _judge_down_at_turn_2, 0.1,
                               per_turn=True))
    if kwargs.pop("user", False):
        kwargs["user"] = _user
    return ToolEnv(tasks=tasks, toolset=Toolset(TOOLS), rubric=Rubric(leaves), system_prompt="Test.", **kwargs)


_names = st.sampled_from(["add", "nap", "anap", "broken", "boom", "deny", "echo", "listing", "gone", "gone_thread",
                          "nope", ""])
_values = st.one_of(st.integers(-5, 40), st.text(max_size=12), st.booleans(), st.none(), st.floats(allow_nan=False),
                    st.lists(st.integers(), max_size=2))
_arguments = st.one_of(
    st.fixed_dictionaries({"a": st.integers(-9, 9), "b": st.integers(-9, 9)}),
    st.fixed_dictionaries({"text": st.text(max_size=20)}, optional={"times": st.integers(0, 30)}),
    st.fixed_dictionaries({"n": st.integers(0, 30)}),
    st.fixed_dictionaries({"seconds": st.just(0)}),
    st.dictionaries(st.sampled_from(["a", "b", "text", "n", "seconds", "reason", "x"]), _values, max_size=3),
    _values,
)


@st.composite
def _body(draw):
    name, args = draw(_names), draw(_arguments)
    shape = draw(st.sampled_from(["plain", "plain", "plain", "string_args", "parameters", "function", "list",
                                  "fenced", "no_args", "broken_json"]))
    if shape == "string_args":
        return json.dumps({"name": name, "arguments": json.dumps(args)})
    if shape == "parameters":
        return json.dumps({"name": name, "parameters": args})
    if shape == "function":
        return json.dumps({"function": {"name": name, "arguments": args}})
    if shape == "list":
        return json.dumps([{"name": name, "arguments": args}] * draw(st.integers(1, 2)))
    if shape == "fenced":
        return "```json\n" + json.dumps({"name": name, "arguments": args}) + "\n```"
    if shape == "no_args":
        return json.dumps({"name": name})
    if shape == "broken_json":
        return json.dumps({"name": name, "arguments": args})[:-1]
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=draw(st.booleans()))


_text = st.sampled_from(["", "Let me compute.", "  ", "\n", "<think>hmm</think>", "</think>", "<think>", "x" * 50,
                         "</tool_call>", "<tool_call>", "The answer is 42", "<tool_response>", "rethink>", "tool_call>"])


@st.composite
def _one_call(draw):
    """The step the fast path is for: text, one plain call, text."""
    name = draw(st.sampled_from(["add", "echo", "listing", "boom", "deny", "nap", "anap", "broken", "gone",
                                 "gone_thread"]))
    args = {"add": {"a": 2, "b": 3}, "echo": {"text": "hey", "times": draw(st.integers(0, 30))},
            "listing": {"n": draw(st.integers(0, 30))}, "nap": {"seconds": 0}, "anap": {"seconds": 0}}.get(name, {})
    args = draw(st.one_of(st.just(args), _arguments))
    spaced = draw(st.sampled_from(["", "\n", "  "]))
    return (draw(st.sampled_from(["", "Let me compute.", " ok ", "<think>hmm</think>", "</think> so"])) + "<tool_call>" + spaced
            + json.dumps({"name": name, "arguments": args}) + spaced + "</tool_call>" + draw(st.sampled_from(["", "\n", "done"])))


@st.composite
def _messy(draw):
    parts = []
    for _ in range(draw(st.integers(0, 2))):
        parts.append(draw(_text))
        if draw(st.booleans()):
            closed = draw(st.integers(0, 9)) > 0
            spaced = draw(st.sampled_from(["", "\n", "  "]))
            parts.append("<tool_call>" + spaced + draw(_body()) + spaced + ("</tool_call>" if closed else ""))
    parts.append(draw(_text))
    return "".join(parts)


_action = st.one_of(_one_call(), _one_call(), _messy())


_config = st.fixed_dictionaries({}, optional={
    "max_turns": st.integers(1, 5),
    "max_observation_chars": st.integers(1, 60),
    "max_tool_output_chars": st.integers(1, 40),
    "max_action_chars": st.integers(10, 200),
    "max_calls_per_action": st.integers(1, 2),
    "reasoning_tags": st.sampled_from([None, ("<think>", "</think>")]),
    "per_turn": st.sampled_from([None, "reads", "fails"]),
    "user": st.booleans(),
})


def _play(env: ToolEnv, actions: list[str]) -> list:
    out = [env.reset(seed=3)]
    for action in actions:
        try:
            out.append(env.step(action))
        except Exception as exc:
            out.append(("raised", type(exc).__name__, str(exc)))
    episode = env.episode
    out.append((episode.messages, episode.actions, episode.turn, episode.tool_errors, episode.done, episode.outcome,
                env.episode_record()))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_action, min_size=1, max_size=6), _config)
def test_fast_step_returns_what_the_general_path_returns(actions, config):
    fast, general = make(**config), make(**config)
    general._step_one_call = lambda action: None  # this one always takes the general path
    try:
        assert _play(fast, actions) == _play(general, actions)
    finally:
        fast.close()
        general.close()


@st.composite
def _openai_action(draw):
    """An OpenAI assistant message as the model's action (``tool_format="openai"``): mostly one
    plain call, and the shapes the fast step must leave to the general path."""
    name = draw(st.sampled_from(["add", "echo", "listing", "boom", "deny", "nap", "broken", "gone", "nope", ""]))
    args = {"add": {"a": 2, "b": 3}, "echo": {"text": "hé", "times": 2}, "listing": {"n": 3}}.get(name, {})
    args = draw(st.one_of(st.just(args), _arguments))
    arguments = draw(st.sampled_from(["json", "json", "json", "object", "empty", "blank", "spaced", "broken", "absent"]))
    function = {"name": name}
    if arguments != "absent":
        text = json.dumps(args, ensure_ascii=draw(st.booleans()))
        function["arguments"] = {"json": text, "object": args, "empty": "", "blank": "  ", "spaced": f" {text} ",
                                 "broken": text[:-1]}[arguments]
    call = {"type": "function", "function": function}
    given = draw(st.sampled_from(["c1", "", None, 7, "absent", "call_9"]))
    if given != "absent":
        call["id"] = given
    calls = draw(st.sampled_from(["one", "one", "one", "two", "none", "null", "not_a_list", "not_a_dict",
                                  "flat", "absent"]))
    message = {"role": "assistant", "content": draw(st.sampled_from([None, "", "Let me add.", " x ", 3]))}
    if calls != "absent":
        message["tool_calls"] = {"one": [call], "two": [call, call], "none": [], "null": None, "not_a_list": call,
                                 "not_a_dict": ["x"], "flat": [{"name": name, "arguments": args}]}[calls]
    text = json.dumps(message, ensure_ascii=draw(st.booleans()))
    return draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", "\n", "x", "<think>"]))


@st.composite
def _openai_one_call(draw):
    """The step the fast path is for, as an OpenAI message: one plain call."""
    name = draw(st.sampled_from(["add", "echo", "listing", "boom", "deny", "nap", "broken", "gone"]))
    args = {"add": {"a": 2, "b": 3}, "echo": {"text": "hé", "times": draw(st.integers(0, 30))},
            "listing": {"n": draw(st.integers(0, 30))}, "nap": {"seconds": 0}}.get(name, {})
    call = {"type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=draw(st.booleans()))}}
    given = draw(st.sampled_from(["c1", "", None, "absent"]))
    if given != "absent":
        call["id"] = given
    message = {"role": "assistant", "content": draw(st.sampled_from([None, "", "Let me add.", " x \n"])), "tool_calls": [call]}
    return draw(st.sampled_from(["", " "])) + json.dumps(message) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_openai_one_call(), _openai_one_call(), _openai_action(), _messy()), min_size=1, max_size=6),
       _config)
def test_fast_step_returns_what_the_general_path_returns_for_openai_messages(actions, config):
    fast, general = make(tool_format="openai", **config), make(tool_format="openai", **config)
    general._step_one_call = lambda action: None
    try:
        assert _play(fast, actions) == _play(general, actions)
    finally:
        fast.close()
        general.close()


@pytest.mark.parametrize("fmt, action, taken", [
    ("hermes", 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', True),
    ("hermes", '<tool_call>{"name": "nap", "arguments": {"seconds": 0}}</tool_call>', True),  # a thread-run tool
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": "x", "b": 2}}</tool_call>', True),  # bad_arguments
    ("hermes", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', False),  # unknown_tool: the general path
    ("hermes", '<tool_call>{"name": "add", "parameters": {"a": 1, "b": 2}}</tool_call>', False),
    ("hermes", "The answer is 42", False),
    ("openai", '{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", '
     '"function": {"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}}]}', True),
    ("openai", '{"content": "x", "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}]}', True),  # bad_arguments
    ("openai", '{"content": "", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]}', False),
    ("openai", '{"content": "", "tool_calls": []}', False),  # a final answer
    ("openai", '{"content": "", "tool_calls": [{"function": {"name": "nope", "arguments": "{}"}}]}', False),
])
def test_which_steps_take_the_fast_path(fmt, action, taken):
    env = make(tool_format=fmt, max_turns=10)
    calls = []
    one_call = env._step_one_call
    env._step_one_call = lambda a: calls.append(one_call(a)) or calls[-1]
    env.reset(seed=0)
    env.step(action)
    assert (calls[0] is not None) == taken
    if taken and fmt == "openai":  # the model's own call id, as the general path keeps it
        given = json.loads(action)["tool_calls"][0].get("id", "call_1_0")
        assert env.episode.messages[-1]["tool_call_id"] == given
    env.close()


def test_the_calculator_step_of_math_takes_the_fast_path():
    env = gym.make("benchmax/Math-v0", python_tool=False).unwrapped
    env.reset(seed=0)
    action = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3"}}\n</tool_call>'
    assert env._step_one_call(action)[0] == "<tool_response>\n57\n</tool_response>"
    env.close()


def test_a_tool_changed_after_it_is_built_is_called_as_it_now_says():
    """``Tool.direct`` follows the fields it reads (MCP makes its tools self-timed after building
    them): the fast step calls a tool in this thread only while it says so."""
    from benchmax_gym.core.tools import Tool

    @tool
    def where() -> str:
        """The thread that runs the call."""
        import threading
        return threading.current_thread().name

    assert not where.direct
    env = ToolEnv(tasks=ListTasks([Task("t", "Q", "42")]), toolset=Toolset([where]), rubric=Rubric([lambda: 0.0]),
                  system_prompt="Test.", max_turns=20)
    env.reset(seed=0)
    action = '<tool_call>{"name": "where", "arguments": {}}</tool_call>'
    assert env.step(action)[0] != "<tool_response>\nMainThread\n</tool_response>"  # a pool thread
    where.self_timed = True
    assert where.direct
    assert env.step(action)[0] == "<tool_response>\nMainThread\n</tool_response>"
    where.wants_state = True  # (now it takes the state: never called directly)
    assert not where.direct
    where.wants_state = False
    assert where.direct and Tool("t", "d", {}, lambda: "", lambda a: a, inline=True).direct
    env.close()


def test_a_format_that_renders_results_its_own_way_renders_the_fast_steps_too():
    """A format overriding ``render_results`` alone: the fast step's observation is its rendering."""
    from benchmax_gym.core.formats import HermesFormat

    class Bracketed(HermesFormat):
        def render_results(self, results):
            return "\n".join(f"[{call_id} {name}] {content}" for call_id, name, content in results)

    fast, general = make(tool_format=Bracketed(), max_turns=10), make(tool_format=Bracketed(), max_turns=10)
    general._step_one_call = lambda action: None
    action = 'Adding.<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    assert _play(fast, [action, action]) == _play(general, [action, action])
    assert _play(fast, [action])[1][0] == "[call_1_0 add] 5"
    fast.close()
    general.close()


@tool(inline=True)
def shout(text: str) -> str:
    """Answers in capitals, or as the text asks: an error, a failure, a timeout, a list, a long text."""
    if text == "error":
        raise ToolError("told to fail", "refused")
    if text == "failure":
        raise ToolFailure("the backend went away", "tool_unavailable")
    if text == "crash":
        raise ZeroDivisionError("division by zero")
    if text == "timeout":
        raise TimeoutError
    if text == "list":
        return ["a", 1]
    return text.upper() * (30 if text == "long" else 1)


def _outcome(result):
    return result if type(result) is str else (type(result).__name__, result.content, result.error, result.outcome)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.fixed_dictionaries({"text": st.sampled_from(["error", "failure", "crash", "timeout", "list", "long",
                                                                 "hi", ""])}),
                 st.dictionaries(st.sampled_from(["text", "x"]), _values, max_size=2)),
       st.integers(1, 200))
def test_a_one_argument_tools_own_call_returns_what_the_general_call_returns(arguments, max_chars):
    """``@tool``'s one-frame call for a function of one plain argument (what the fast step calls)
    answers as :func:`run_direct_text` does: results, errors, failures, timeouts, coercions, caps."""
    from benchmax_gym.core.tools import run_direct_text

    assert shout.invoke is not None
    assert _outcome(shout.invoke(shout, arguments, 5.0, max_chars)) == _outcome(
        run_direct_text(shout, arguments, 5.0, max_chars))


def test_a_tool_given_a_new_function_is_called_through_it():
    """Replacing a tool's function (or validator) drops the call made for the old one."""
    @tool(inline=True)
    def double(n: int) -> str:
        """Twice n."""
        return str(2 * n)

    assert double.invoke is not None and double.invoke(double, {"n": 4}, 30.0, 100) == "8"
    double.fn = lambda *, n: str(3 * n)  # keyword-only: called by position it would fail
    assert double.invoke is None
    assert Toolset([double]).run("double", {"n": 4}, timeout=30.0, max_chars=100).content == "12"
