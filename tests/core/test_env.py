"""The engine's episode loop, limits, error codes, messages and seeding, on a small real toolset."""

import asyncio
import json
import sys
import threading
from pathlib import Path

import gymnasium as gym
import pytest

from benchmax_gym.core import (
    GeneratedTasks,
    ListTasks,
    Rubric,
    Task,
    ToolEnv,
    ToolError,
    Toolset,
    tool,
)

SECRET = "ANSWER-7f3a9c"  # the ground truth: must never reach obs or info


sys.path.insert(0, str(Path(__file__).parent))
from sample_tools import add, anap, nap


@tool
def shout(text: str) -> str:
    """Repeat text loudly."""
    return text.upper() * 100


@tool
def broken() -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


@tool
def refuse() -> str:
    """Fails cleanly."""
    raise ToolError("not allowed here")


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def make_env(**kwargs) -> ToolEnv:
    tasks = kwargs.pop("tasks", ListTasks([Task(f"t{i}", f"Question {i}: say the code.", SECRET) for i in range(5)]))
    return ToolEnv(
        tasks=tasks,
        toolset=Toolset([add, nap, anap, shout, broken, refuse]),
        rubric=kwargs.pop("rubric", Rubric([exact])),
        system_prompt="You are a test agent.",
        **kwargs,
    )


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def assert_no_secret(*things):
    assert SECRET not in json.dumps(things, default=str)


def test_reset_info_tools_are_the_callers_own_copy():
    """A caller may edit the schemas a reset hands out: the env's, and the next reset's, stay."""
    env = make_env()
    _, info = env.reset(seed=0)
    schemas = env.unwrapped.tool_schemas
    assert info["tools"] == schemas and info["tools"] is not schemas
    info["tools"][0]["function"]["name"] = "edited"
    info["tools"][0]["function"]["parameters"]["properties"].clear()
    info["tools"].append({"type": "function"})
    _, again = env.reset(seed=1)
    assert again["tools"] == schemas and schemas[0]["function"]["name"] == "add"
    assert schemas[0]["function"]["parameters"]["properties"]


def test_copy_json_copies_deeply_and_keeps_types_marshal_refuses():
    from collections import OrderedDict
    from benchmax_gym.core.env import copy_json

    data = {"a": [1, 2.5, True, None, "x", {"b": (1, 2)}], "shared": None}
    data["shared"] = data["a"][5]
    out = copy_json(data)
    assert out == data and out is not data and out["a"] is not data["a"] and out["a"][5] is not data["a"][5]
    assert out["shared"] is out["a"][5]  # shared parts stay shared, as deepcopy keeps them
    odd = {"k": OrderedDict(x=1)}
    copied = copy_json(odd)
    assert type(copied["k"]) is OrderedDict and copied == odd and copied["k"] is not odd["k"]


def test_episode_flow_messages_and_reward():
    env = make_env()
    obs, info = env.reset(seed=0)
    assert "You are a test agent." in obs and "say the code" in obs
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert info["turn"] == 0 and info["task_id"].startswith("t")
    assert [t["function"]["name"] for t in info["tools"]][:2] == ["add", "nap"]
    assert '"name": "add"' in obs  # tool schemas are rendered into the system prompt
    assert_no_secret(obs, info)

    obs, reward, terminated, truncated, info = env.step("Let me add. " + call("add", a=2, b=3))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs == "<tool_response>\n5\n</tool_response>"
    assert info["messages"] == [{"role": "tool", "tool_call_id": "call_1_0", "name": "add", "content": "5"}]
    assert info["tool_calls"] == [{"id": "call_1_0", "name": "add", "arguments": {"a": 2, "b": 3}}]
    assert info["error"] is None and info["turn"] == 1
    assistant = env.unwrapped.messages[-2]
    assert assistant["role"] == "assistant" and assistant["content"] == "Let me add."
    assert assistant["tool_calls"][0]["id"] == "call_1_0"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert_no_secret(obs, info)

    obs, reward, terminated, truncated, info = env.step(SECRET)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward_components"] == {"exact": 1.0}
    assert [m["role"] for m in env.unwrapped.messages] == ["system", "user", "assistant", "tool", "assistant"]
    with pytest.raises(gym.error.ResetNeeded):
        env.step("again")


def test_wrong_final_answer_scores_zero():
    env = make_env()
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step("no idea")
    assert terminated and reward == 0.0 and info["reward_components"] == {"exact": 0.0}


@pytest.mark.parametrize(
    "action, code, says",
    [
        ("<tool_call>{not json}</tool_call>", "parse_error", "could not parse"),
        (call("nope", x=1), "unknown_tool", "unknown tool 'nope'"),
        (call("add", a="two", b=3), "bad_arguments", "'a'"),
        (call("add", a=1), "bad_arguments", "missing required argument 'b'"),
        (call("broken"), "tool_error", "disk on fire"),
        (call("refuse"), "tool_error", "not allowed here"),
    ],
)
def test_bad_actions_become_observations(action, code, says):
    env = make_env(tool_timeout=0.2)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["error"] == code
    assert says in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.observation_space.contains(obs)
    # the episode goes on
    obs, _, _, _, info = env.step(call("add", a=1, b=1))
    assert "2" in obs and info["error"] is None


def test_action_too_long_runs_nothing():
    env = make_env(max_action_chars=100)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("add", a=1, b=2) + " " * 200)
    assert info["error"] == "action_too_long" and info["tool_calls"] == []
    assert "limit is 100" in obs and not terminated


def test_too_many_calls_runs_only_the_first():
    env = make_env(max_calls_per_action=2)
    env.reset(seed=0)
    obs, *_, info = env.step("".join(call("add", a=i, b=0) for i in range(4)))
    contents = [m["content"] for m in info["messages"]]
    assert contents[:2] == ["0", "1"]
    assert all("at most 2 tool calls" in c for c in contents[2:]) and len(contents) == 4
    assert info["error"] == "too_many_calls"


def test_tool_output_is_capped_with_marker():
    env = make_env(max_tool_output_chars=300)
    env.reset(seed=0)
    _, *_, info = env.step(call("shout", text="abcd"))
    content = info["messages"][0]["content"]
    assert len(content) <= 300 and "[truncated: " in content


def test_turn_limit_truncates_and_grades():
    env = make_env(max_turns=2)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(call("add", a=1, b=1))
    assert not (terminated or truncated)
    _, reward, terminated, truncated, info = env.step(call("add", a=1, b=1))
    assert truncated and not terminated and reward == 0.0
    assert info["reward_components"] == {"exact": 0.0}


def test_reward_function_that_raises_scores_zero_and_episode_ends():
    def explode(completion):
        raise ZeroDivisionError("bad grader")

    env = make_env(rubric=Rubric([("exact", exact, 1.0), ("explode", explode, 1.0)]))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(SECRET)
    assert terminated and reward == 1.0
    assert info["reward_components"] == {"exact": 1.0, "explode": 0.0}
    assert "bad grader" in info["reward_errors"]["explode"]


def test_reward_weights_override_and_validation():
    def short(completion):
        return len(completion) < 50

    env = make_env(rubric=Rubric([exact, ("short", short, 0.0)]), reward_weights={"short": 0.5})
    env.reset(seed=0)
    _, reward, *_ = env.step(SECRET)
    assert reward == 1.5
    with pytest.raises(ValueError, match="reward_weights.*'nope'"):
        make_env(reward_weights={"nope": 1.0})


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_action_chars": -5}, "max_action_chars"),
        ({"max_tool_output_chars": "big"}, "max_tool_output_chars"),
        ({"tool_timeout": 0}, "tool_timeout"),
        ({"max_calls_per_action": 1.5}, "max_calls_per_action"),
        ({"tool_format": "yaml"}, "tool_format"),
        ({"render_mode": "rgb_array"}, "render_mode"),
    ],
)
def test_bad_configuration_names_the_argument(kwargs, names):
    with pytest.raises(ValueError, match=names):
        make_env(**kwargs)


def test_seeding_and_task_index():
    env = make_env(tasks=GeneratedTasks(lambda rng, i: Task(f"g{i}", f"q{i} {rng.integers(10**9)}", SECRET)))
    first = [env.reset(seed=s)[0] for s in (3, 4, 3)]
    assert first[0] == first[2] and first[0] != first[1]
    obs, info = env.reset(options={"task_index": 12345})
    assert info["task_id"] == "g12345" and info["task_index"] == 12345
    again, _ = make_env(tasks=env.unwrapped.tasks).reset(options={"task_index": 12345})
    assert obs == again
    with pytest.raises(IndexError):
        make_env().reset(options={"task_index": 99})


def test_async_api_matches_sync():
    sync_env, async_env = make_env(), make_env()
    actions = [call("add", a=2, b=2), call("anap", seconds=0.01), call("nap", seconds=0.01), SECRET]

    async def run_async():
        out = [await async_env.areset(seed=7)]
        for a in actions:
            out.append(await async_env.astep(a))
        return out

    sync_out = [sync_env.reset(seed=7)] + [sync_env.step(a) for a in actions]
    async_out = asyncio.run(run_async())
    assert [o[0] for o in sync_out] == [o[0] for o in async_out]
    assert sync_out[-1][1:4] == async_out[-1][1:4] == (1.0, True, False)


def meeting(parties: int):
    """An async tool whose calls return "met" only if ``parties`` of them wait at once; a call left
    alone (calls run one after another) gives up after a minute, a hang guard, and the rest with it."""
    arrived, gave_up = [], threading.Event()

    @tool
    async def meet() -> str:
        """Wait for the others."""
        arrived.append(1)
        for _ in range(6000):
            if len(arrived) >= parties:
                return "met"
            if gave_up.is_set():
                break
            await asyncio.sleep(0.01)
        gave_up.set()
        return "alone"

    return meet


def test_async_episodes_interleave():
    """Many environments in one event loop wait on their tools concurrently."""
    meet = meeting(20)
    envs = [make_env(tool_timeout=120) for _ in range(20)]

    async def episode(env):
        env.set_toolset(Toolset([meet]))
        await env.areset(seed=0)
        return await env.astep(call("meet"))

    async def main():
        return await asyncio.gather(*(episode(e) for e in envs))

    results = asyncio.run(main())
    assert [r[0] for r in results] == ["<tool_response>\nmet\n</tool_response>"] * 20  # all 20 waited at once


@tool
async def which_thread() -> str:
    """The thread the tool's coroutine runs in."""
    return str(threading.get_ident())


def test_sync_step_runs_async_tools_in_the_calling_thread():
    # No hop to a loop in another thread: the thread that calls step() drives the env's loop.
    env = make_env()
    env.set_toolset(Toolset([which_thread]))
    env.reset(seed=0)
    assert str(threading.get_ident()) in env.step(call("which_thread"))[0]
    seen = []
    worker = threading.Thread(target=lambda: seen.append(env.step(call("which_thread"))[0]))
    worker.start()
    worker.join(60)
    assert str(worker.ident) in seen[0]
    env.close()


def test_every_format_runs_an_episode():
    for fmt in ("hermes", "json", "openai", "xml"):
        env = make_env(tool_format=fmt)
        obs, _ = env.reset(seed=0)
        action = env.unwrapped.format.render_calls([("add", {"a": 20, "b": 22})])
        obs, _, _, _, info = env.step(action)
        assert info["error"] is None and info["messages"][0]["content"] == "42", fmt
        _, reward, terminated, _, _ = env.step(SECRET)
        assert terminated and reward == 1.0, fmt


def test_openai_format_accepts_a_message_dict():
    env = make_env(tool_format="openai")
    env.reset(seed=0)
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    _, _, _, _, info = env.step(message)
    assert info["messages"][0] == {"role": "tool", "tool_call_id": "abc", "name": "add", "content": "3"}


def test_non_string_action_is_a_clear_type_error():
    env = make_env()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="action must be a str"):
        env.step(42)


def test_info_timings_opt_in():
    env = make_env(info_timings=True)
    env.reset(seed=0)
    *_, info = env.step(call("add", a=1, b=2))
    assert set(info["timings"]) == {"parse_s", "tools_s", "reward_s", "step_s"}
    assert info["timings"]["step_s"] >= info["timings"]["tools_s"] >= 0
    plain = make_env()
    plain.reset(seed=0)
    *_, info = plain.step(call("add", a=1, b=2))
    assert "timings" not in info


def test_render_ansi_shows_the_transcript():
    env = make_env(render_mode="ansi")
    env.reset(seed=0)
    env.step(call("add", a=1, b=2))
    text = env.render()
    assert "[system]" in text and "-> add(" in text and "[tool]\n3" in text


@pytest.mark.parametrize("weights", [{"exact": 0}, {"exact": 0, "short": 0}, {"exact": -1.0, "short": 0.0}])
def test_reward_weights_that_leave_no_positive_weight_fail_at_make(weights):
    """(Accepted: the max reward was 0 and every episode, the solver's too, scored 0.)"""
    def short(completion):
        return len(completion) < 50

    with pytest.raises(ValueError, match=r"reward_weights leave the reward no positive maximum \(0\): give some "
                                         r"component a positive weight; components are \['exact', 'short'\]"):
        make_env(rubric=Rubric([exact, ("short", short, 0.0)]), reward_weights=weights)
    with pytest.raises(ValueError, match="reward_weights leave the reward no positive maximum"):
        gym.make("benchmax/Math-v0", reward_weights={"correct": 0, "format": 0})


def test_a_negative_reward_weight_is_a_penalty_beside_a_positive_one():
    def long(completion):
        return len(completion) >= 5

    env = make_env(rubric=Rubric([exact, ("long", long, 0.0)]), reward_weights={"long": -0.25})
    assert env.unwrapped.rubric.max_reward == 1.0
    env.reset(seed=0)
    _, reward, *_ = env.step(SECRET)
    assert reward == 0.75


class _PassesThrough(ToolEnv):
    """A subclass that sets its tasks, tools and rubric and passes every other engine argument on."""

    def __init__(self, **kwargs):
        super().__init__(tasks=ListTasks([Task("t", "Say the code.", SECRET)]), toolset=Toolset([add]),
                         rubric=Rubric([exact]), **kwargs)


class _SetsItsPrompt(_PassesThrough):
    def __init__(self, *, max_turns: int = 3, **kwargs):
        super().__init__(system_prompt="Be brief.", max_turns=max_turns, **kwargs)


def test_an_engine_argument_a_subclass_sets_itself_is_refused_naming_it_and_the_others_pass():
    """(Python's "got multiple values for keyword argument 'system_prompt'" named no class.)"""
    assert _PassesThrough(system_prompt="Mine.", max_turns=2)._family_prompt == "Mine."  # not set by it: passed on
    env = _SetsItsPrompt(max_turns=2)  # its own argument, though it passes it on itself
    assert env.max_turns == 2 and env._family_prompt == "Be brief."
    for name in ("system_prompt", "rubric", "toolset", "tasks"):
        with pytest.raises(TypeError, match=rf"^_SetsItsPrompt sets {name} itself, so gym.make does not take it"):
            _SetsItsPrompt(**{name: None})
    with pytest.raises(TypeError, match=r"sets rubric itself, so gym.make does not take it \(reweigh its components "
                                        r"with reward_weights=, or register your own env with register_tool_env"):
        _PassesThrough(rubric=None)


def test_without_its_source_a_subclass_still_refuses_the_required_arguments_it_sets():
    namespace = {"ToolEnv": ToolEnv, "ListTasks": ListTasks, "Task": Task, "Toolset": Toolset, "Rubric": Rubric,
                 "exact": exact}
    exec("class Made(ToolEnv):\n    def __init__(self, **kw):\n        super().__init__(tasks=ListTasks([Task('t', "
         "'p', 'a')]), toolset=Toolset([]), rubric=Rubric([exact]), system_prompt='s', **kw)\n", namespace)
    with pytest.raises(TypeError, match="Made sets rubric itself"):
        namespace["Made"](rubric=None)
    namespace["Made"](max_turns=2).close()


def test_make_vec_and_the_cli_name_an_argument_the_family_sets_itself():
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from cli_in_process import run_in_process

    with pytest.raises(TypeError, match="MathEnv sets system_prompt itself"):
        gym.make_vec("benchmax/Math-v0", num_envs=2, system_prompt="Be terse.")
    with pytest.raises(TypeError, match="members: Math-v0: MathEnv sets rubric itself"):
        gym.make("benchmax/Mix-v0", rubric=None)
    out = run_in_process("run", "benchmax/Math-v0", "--env-arg", "system_prompt=Be terse.")
    assert out.returncode == 2 and out.stderr.startswith("benchmax-gym: error: ") and out.stderr.count("\n") == 1
    assert "MathEnv sets system_prompt itself, so gym.make does not take it" in out.stderr
