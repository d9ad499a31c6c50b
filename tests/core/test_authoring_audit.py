"""Building an env from a user's own tools (helper 117's audit): tools written as partials,
callable objects, generators or sync functions that return a coroutine; a subclass of the real
``benchmax`` package's BaseEnv written as its newer releases allow (a ``prompt`` that is a list of
messages, ``enable_tracking``'s wrapped methods). Each is run through gym.make, make_vec (sync and
subprocess), the CLI's ``run --import`` and ``mcp-serve``; the CLI imports this module to find them."""

import asyncio
import functools
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from benchmax.envs.base_env import BaseEnv as PackageBaseEnv
from benchmax.envs.types import ToolDefinition
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from benchmax_gym import final_answer, register_benchmax_env, register_tool_env
from benchmax_gym.core import Toolset, tool

HERE = Path(__file__).parent
CLI = [sys.executable, "-m", "benchmax_gym", "--import", "test_authoring_audit"]
CAPITALS = {"Peru": "Lima", "France": "Paris"}


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def lookup(country: str, table: dict, times: int = 1) -> str:
    """Look up a country's capital.

    Args:
        country: the country's English name
        times: how many times to say it
    """
    return " ".join([table.get(country, "unknown")] * times)


class Shouter:
    """Says a word louder (a callable object)."""

    async def __call__(self, word: str, times: int) -> str:
        """Shout a word.

        Args:
            word: what to shout
            times: how many exclamation marks
        """
        await asyncio.sleep(0)
        return word.upper() + "!" * times


def stated(completion: str, answer: str) -> float:
    return float((final_answer(completion) or "").casefold() == answer.casefold())


class Capitals(PackageBaseEnv):
    """Written as the package's newer releases allow: the prompt a list of messages (its
    ``StandardizedExample``; the rows its SkyRL data script writes)."""

    system_prompt = "Answer in <answer></answer> tags."

    async def list_tools(self):
        return [ToolDefinition("capital", "A country's capital.", {
            "type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]})]

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        return CAPITALS.get(tool_args["country"], "unknown")

    async def init_rollout(self, rollout_id, **rollout_args):
        pass

    async def copy_to_workspace(self, rollout_id, src_path, dst_filename=None):
        pass

    async def copy_from_workspace(self, rollout_id, src_filename, dst_path):
        pass

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        return {"match": float((final_answer(completion) or "") == ground_truth)}


ROWS = [{"prompt": [{"role": "system", "content": "Answer in <answer></answer> tags."},
                    {"role": "user", "content": "What is the capital of Peru?"}],
         "ground_truth": "Lima", "init_rollout_args": None}]

register_tool_env("audit/Tools-v0", tools=[tool(functools.partial(lookup, table=CAPITALS)), tool(Shouter(), name="shout")],
                  tasks=[{"prompt": "What is the capital of Peru?", "answer": "Lima"}], rubric=[stated])
register_benchmax_env("audit/PackageListPrompt-v0", Capitals, ROWS)

# id -> (a tool call, what its observation shows, the final reply, its reward)
CASES = {
    "audit/Tools-v0": (call("lookup", country="Peru", times="2"), "Lima Lima", "<answer>Lima</answer>", 1.0),
    "audit/PackageListPrompt-v0": (call("capital", country="Peru"), "Lima", "<answer>Lima</answer>", 1.0),
}


# -- the tools a user writes ----------------------------------------------------------------------

def test_a_partial_tool_has_its_functions_name_docs_and_types_and_hides_what_it_binds():
    t = tool(functools.partial(lookup, table={"Peru": "Lima"}))
    assert t.name == "lookup" and t.description == "Look up a country's capital."
    assert t.parameters["properties"] == {"country": {"type": "string", "description": "the country's English name"},
                                          "times": {"type": "integer", "default": 1,
                                                    "description": "how many times to say it"}}
    tools = Toolset([t])
    assert tools.run("lookup", {"country": "Peru", "times": "2"}, timeout=5, max_chars=100).content == "Lima Lima"
    refused = tools.run("lookup", {"country": "Peru", "table": {"Peru": "secret"}}, timeout=5, max_chars=100)
    assert refused.error == "bad_arguments" and "unexpected argument 'table'" in refused.content


def test_a_callable_object_tool_reads_its_call_and_runs_async():
    t = tool(Shouter(), name="shout")
    assert t.is_async and t.description == "Shout a word."
    assert t.parameters["properties"]["times"] == {"type": "integer", "description": "how many exclamation marks"}
    result = asyncio.run(Toolset([t]).arun("shout", {"word": "hi", "times": "3"}, timeout=5, max_chars=100))
    assert (result.error, result.content) == (None, "HI!!!")
    with pytest.raises(TypeError, match="has no name: give it one"):
        tool(Shouter())


def test_a_generator_function_is_refused_where_the_tool_is_built():
    def countries(prefix: str):
        yield from (c for c in CAPITALS if c.startswith(prefix))

    async def streamed(prefix: str):
        yield prefix

    for fn in (countries, streamed):
        with pytest.raises(TypeError, match=f"tool '{fn.__name__}' is a generator function"):
            tool(fn)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # (the coroutine is closed: no "never awaited")
def test_a_sync_tool_that_returns_a_coroutine_is_the_tools_error_naming_it():
    async def fetch(city: str) -> str:
        return city

    t = tool(lambda city: fetch(city), name="fetch")
    result = Toolset([t]).run("fetch", {"city": "Lima"}, timeout=5, max_chars=200)
    assert result.error == "tool_error" and "returned a coroutine, not a result: make the tool `async def`" in result.content


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic reads typing.TypedDict from Python 3.12")
def test_a_parameter_type_pydantic_cannot_read_fails_naming_the_tool():
    from typing import TypedDict

    class Point(TypedDict):
        x: int

    def plot(point: Point) -> str:
        return "ok"

    with pytest.raises(TypeError, match="tool 'plot': its parameters' types cannot be validated"):
        tool(plot)


# -- the real package's BaseEnv, as its newer releases write it ----------------------------------

def test_a_row_whose_prompt_is_a_list_of_messages_opens_with_those_messages():
    env = gym.make("audit/PackageListPrompt-v0")
    env.reset()
    assert [m["role"] for m in env.unwrapped.episode.messages[:2]] == ["system", "user"]
    assert env.unwrapped.episode.task.prompt == "What is the capital of Peru?"
    env.close()
    with pytest.raises(ValueError, match=r"rows\[0\]: its messages must be dicts"):
        gym.make(register_benchmax_env("audit/BadMessages-v0", Capitals, [{"prompt": ["hi"], "ground_truth": "x"}]))


class Tracked(Capitals):
    async def compute_group_reward(self, rollout_ids, completions, ground_truths, **kwargs):
        return [{"group": 1.0} for _ in rollout_ids]


def tracked() -> Tracked:
    """An instance as the package's ``enable_tracking()`` leaves it (releases from 0.1.2.dev22):
    both reward methods wrapped on the instance with ``functools.wraps`` of the class functions."""
    env = Tracked()
    for name in ("compute_reward", "compute_group_reward"):
        method = getattr(type(env), name)

        @functools.wraps(method)
        async def wrapped(*args, _method=method, **kwargs):
            return await _method(env, *args, **kwargs)

        setattr(env, name, wrapped)
    return env


def test_an_instance_with_tracking_enabled_builds_and_is_graded_alone_and_in_a_group():
    env = gym.make(register_benchmax_env("audit/Tracked-v0", tracked(), [dict(ROWS[0], prompt="Capital of Peru?")]))
    env.reset()
    _, reward, terminated, _, _ = env.step("<answer>Lima</answer>")
    assert terminated and reward == 1.0
    (scored,) = env.unwrapped.group_rubric.score([env.unwrapped.episode_record()])
    env.close()
    assert scored["reward"] == 2.0 and scored["reward_components"] == {"match": 1.0, "group": 1.0}


# -- every way to run them -----------------------------------------------------------------------

@pytest.mark.parametrize("env_id", list(CASES))
def test_gym_make(env_id):
    action, shows, final, reward = CASES[env_id]
    env = gym.make(env_id)
    env.reset()
    obs, _, terminated, _, info = env.step(action)
    assert shows in obs and not terminated and info["error"] is None
    _, got, terminated, _, _ = env.step(final)
    assert terminated and got == reward
    env.close()


@pytest.mark.parametrize("mode", ["sync", "subprocess"])
@pytest.mark.parametrize("env_id", list(CASES))
def test_make_vec(env_id, mode):
    action, shows, final, reward = CASES[env_id]
    how = {"num_workers": 2} if mode == "subprocess" else {"vectorization_mode": mode}
    envs = gym.make_vec(env_id, num_envs=2, **how)
    try:
        envs.reset(seed=0)
        obs, _, terminated, _, _ = envs.step([action, action])
        assert all(shows in o for o in obs) and not terminated.any()
        _, rewards, terminated, _, _ = envs.step([final, "<answer>wrong</answer>"])
        assert terminated.all() and rewards[0] == reward and rewards[1] < reward
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", list(CASES))
def test_cli_run_and_mcp_serve(env_id):
    action, shows, _, _ = CASES[env_id]
    done = subprocess.run([*CLI, "run", env_id, "--policy", "random", "--episodes", "2", "--json", "--quiet"],
                          cwd=HERE, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["episodes"] == 2
    called = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))

    async def main():
        server = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp-serve", env_id], cwd=str(HERE))
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            result = await client.call_tool(called["name"], called["arguments"])
            return tools, "\n".join(block.text for block in result.content), result.is_error

    tools, text, is_error = asyncio.run(asyncio.wait_for(main(), 120))
    assert called["name"] in tools and shows in text and not is_error
    if env_id == "audit/Tools-v0":  # the partial's bound table is no argument of the served tool either
        assert set(tools["lookup"].input_schema["properties"]) == {"country", "times"}
