"""Authoring real environments (issue 31): per-episode state with setup/teardown, terminal
tools, and tool schemas from the wild - on real envs, real vector workers and a real MCP server."""

import asyncio
import gc
import json
import os
import signal
import sys
import tempfile
import textwrap
import warnings
from collections import Counter
from pathlib import Path
from typing import Optional

import gymnasium as gym
import numpy as np
import pytest

import benchmax_gym  # noqa: F401  (registers benchmax/MCP-v0)
from benchmax_gym import BaseEnv, ToolDefinition, final_answer, register_benchmax_env, register_tool_env
from benchmax_gym.core import ListTasks, Rubric, Task, Tool, ToolEnv, ToolError, Toolset, tool
from benchmax_gym.core.formats import get_format
from benchmax_gym.core.tools import ToolFailure, ToolSchemaError

FORMATS = ["hermes", "json", "openai", "xml"]

# -- a bank: per-episode state that tools change and the rubric reads -----------------------------

LOG = Path(tempfile.gettempdir()) / f"benchmax-authoring-{os.getpid()}.log"  # setups and teardowns, any process


def log(line: str) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # one write per line: whole lines from every worker
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def open_account(task, episode):
    log(f"setup {episode.rollout_id} {os.getpid()}")
    workspace = tempfile.mkdtemp(prefix="bank-")  # under the worker's temp root in a vector worker
    return {"id": episode.rollout_id, "balance": int(task.metadata.get("opening", 0)), "workspace": workspace}


def close_account(state):
    log(f"teardown {state['id']} {os.getpid()}")
    os.rmdir(state["workspace"])


def deposit(amount: int, state) -> str:
    """Deposit money.

    Args:
        amount: how much
    """
    if amount == 13:
        raise RuntimeError("unlucky amount")
    state["balance"] += amount
    return f"balance {state['balance']}"


def outage(state) -> str:
    """The bank's backend is down (a failure that is not the model's)."""
    raise ToolFailure("the core banking system is down", "tool_unavailable")


@tool(terminal=True)
def close_day(note: str, state) -> str:
    """Close the day: ends the session.

    Args:
        note: a closing note
    """
    state["note"] = note
    return f"closed with {state['balance']}"


def balance(state) -> float:  # a reward leaf that reads the state
    return float(state["balance"])


TASKS = [{"prompt": f"Account {i}.", "answer": "ok", "metadata": {"opening": 100 * i}} for i in range(4)]
BANK = register_tool_env("authoring/Bank-v0", tools=[deposit, outage, close_day], tasks=TASKS, rubric=[balance],
                         setup=open_account, teardown=close_account, max_turns=5)


def call(name, **arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def events():
    """{rollout_id: Counter of events}, and the pid of each setup."""
    seen, pids = {}, {}
    for line in LOG.read_text().splitlines() if LOG.exists() else []:
        what, rid, pid = line.split()
        seen.setdefault(rid, Counter())[what] += 1
        if what == "setup":
            pids[rid] = int(pid)
    return seen, pids


@pytest.fixture(autouse=True)
def fresh_log():
    LOG.unlink(missing_ok=True)
    yield
    LOG.unlink(missing_ok=True)


def assert_each_torn_down_once(except_pids=()):
    seen, pids = events()
    assert seen, "no episode was set up"
    for rid, counts in seen.items():
        expected = 0 if pids[rid] in except_pids else 1
        assert counts == Counter(setup=1, teardown=expected) if expected else Counter(setup=1), (rid, counts)


# -- 1. the episode lifecycle ------------------------------------------------------------------------


def test_tools_and_rewards_receive_the_episodes_state():
    env = gym.make(BANK)
    env.reset(options={"task_index": 2})
    obs, *_ = env.step(call("deposit", amount=5))
    assert "balance 205" in obs
    assert "state" not in json.dumps(env.unwrapped.tool_schemas)  # injected, never shown to the model
    _, reward, terminated, _, info = env.step("done")
    assert terminated and reward == 205.0 and info["reward_components"] == {"balance": 205.0}
    env.close()


@pytest.mark.parametrize("mode", ["sync", "async", "subprocess"])
def test_concurrent_episodes_keep_their_own_state_in_every_vector_mode(mode):
    how = {"num_workers": 2} if mode == "subprocess" else {"vectorization_mode": mode}
    envs = gym.make_vec(BANK, num_envs=4, **how)
    try:
        envs.reset(seed=0, options={"task_index": 0})
        envs.step([call("deposit", amount=i + 1) for i in range(4)])
        obs, *_ = envs.step([call("deposit", amount=i + 1) for i in range(4)])
        assert [o.split("balance ")[-1].split("<")[0].strip() for o in obs] == ["2", "4", "6", "8"]
        _, rewards, terminated, _, _ = envs.step(["done"] * 4)
        assert terminated.all() and rewards.tolist() == [2.0, 4.0, 6.0, 8.0]
    finally:
        envs.close()
    seen, _ = events()
    assert len(seen) >= 4
    assert_each_torn_down_once()


def test_teardown_runs_once_after_a_normal_end_truncation_a_tool_exception_a_failure_and_close():
    env = gym.make(BANK)
    ids = []

    def start(**options):
        env.reset(options=options)
        ids.append(env.unwrapped.episode.rollout_id)

    start(task_index=0)
    env.step("done")  # normal end; released at the next reset
    start(task_index=1)
    for _ in range(5):  # truncation at the turn limit
        *_, truncated, info = env.step(call("deposit", amount=1))
    assert truncated and info["outcome"] == "truncated"
    start(task_index=1)
    obs, _, terminated, truncated, info = env.step(call("deposit", amount=13))  # the tool raises
    assert "unlucky" in obs and info["error"] == "tool_error" and not (terminated or truncated)
    env.step("done")
    start(task_index=1)
    *_, truncated, info = env.step(call("outage"))  # a failure that is not the model's: released at once
    assert truncated and info["outcome"] == "tool_unavailable"
    seen, _ = events()
    assert seen[ids[-1]] == Counter(setup=1, teardown=1)
    start(task_index=2)  # and close() mid-episode
    env.close()
    env.close()
    assert set(events()[0]) == set(ids)
    assert_each_torn_down_once()


def test_an_env_dropped_without_close_tears_its_episode_down_when_collected():
    env = gym.make(BANK)
    env.reset()
    rid = env.unwrapped.episode.rollout_id
    del env
    gc.collect()
    assert events()[0][rid] == Counter(setup=1, teardown=1)


def test_a_worker_killed_outright_loses_its_workspace_and_the_others_tear_down_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # workers fork with it: their temp roots land here
    envs = gym.make_vec(BANK, num_envs=4, num_workers=2)
    try:
        envs.reset(seed=0)
        victim = envs.worker_pids[0]  # envs 0 and 1
        os.kill(victim, signal.SIGKILL)
        _, _, _, truncated, info = envs.step([call("deposit", amount=1)] * 4)
        assert truncated.tolist() == [True, True, False, False] and "worker_restarted" in info["error"][0]
        envs.step([call("deposit", amount=1)] * 4)  # the restarted worker's envs reset: new episodes
        envs.step(["done"] * 4)
    finally:
        envs.close()
    seen, pids = events()
    assert sum(pid == victim for pid in pids.values()) == 2  # its two episodes: no teardown could run there
    assert_each_torn_down_once(except_pids={victim})
    assert not [p for p in tmp_path.rglob("bank-*")]  # and their workspaces went with its temp root


def test_async_setup_and_teardown_through_reset_and_areset():
    calls = []

    async def setup(task, episode):
        await asyncio.sleep(0)
        calls.append("setup")
        return {"seen": []}

    async def teardown(state):
        await asyncio.sleep(0)
        calls.append(f"teardown {state['seen']}")

    async def note(text: str, state) -> str:
        """Remember text.

        Args:
            text: what
        """
        state["seen"].append(text)
        return "noted"

    env = ToolEnv(tasks=ListTasks([Task("t", "Go.", "x")]), toolset=Toolset([note]),
                  rubric=Rubric([lambda state: float(len(state["seen"]))]), setup=setup, teardown=teardown)
    env.reset()
    env.step(call("note", text="a"))
    assert env.step("done")[1] == 1.0
    env.reset()
    assert calls == ["setup", "teardown ['a']", "setup"]

    async def run():
        await env.areset()  # tears the sync episode down, awaiting its teardown
        await env.astep(call("note", text="b"))
        await env.areset()

    asyncio.run(run())
    env.close()
    assert calls == ["setup", "teardown ['a']", "setup", "teardown []", "setup", "teardown ['b']", "setup",
                     "teardown []"]


@pytest.mark.parametrize("runner", ["reset", "areset"])
def test_a_reset_whose_setup_raises_leaves_no_episode_to_step_or_grade(runner):
    torn = []

    def setup(task, episode):
        if task.id == "broken":
            raise ConnectionError("database copy failed")
        return {"ok": True}

    env = ToolEnv(tasks=ListTasks([Task("fine", "Go.", "x"), Task("broken", "Go.", "x")]), toolset=Toolset([]),
                  rubric=Rubric([lambda completion: 1.0]), setup=setup, teardown=torn.append)
    reset = env.reset if runner == "reset" else lambda **kw: asyncio.run(env.areset(**kw))
    reset(options={"task_index": 0})
    with pytest.raises(ConnectionError, match="database copy failed"):
        reset(options={"task_index": 1})
    assert torn == [{"ok": True}]  # the episode before was ended as usual
    with pytest.raises(gym.error.ResetNeeded):
        env.step("my answer")  # never graded: a failure is not a reward
    assert env.reset(options={"task_index": 0})[1]["task_index"] == 0  # the env goes on
    env.close()


@pytest.mark.parametrize("options", ["task_index=1", 5, [1, 2]])
def test_reset_options_that_are_not_a_dict_are_refused_before_the_running_episode_ends(options):
    env = ToolEnv(tasks=ListTasks([Task("a", "Go.", "x"), Task("b", "Go.", "y")]), toolset=Toolset([]),
                  rubric=Rubric([lambda completion: 1.0]))
    env.reset(options={"task_index": 0})
    with pytest.raises(TypeError, match=r"reset\(options=...\) must be a dict"):
        env.reset(options=options)
    with pytest.raises(IndexError):
        env.reset(options={"task_index": 7})
    assert env.step("x")[1] == 1.0  # the running episode was left as it was, and is graded
    env.close()


async def open_account_async(task, episode):
    await asyncio.sleep(0)
    return open_account(task, episode)


async def close_account_async(state):
    await asyncio.sleep(0)
    close_account(state)


ASYNC_BANK = register_tool_env("authoring/AsyncBank-v0", tools=[deposit, outage, close_day], tasks=TASKS,
                               rubric=[balance], setup=open_account_async, teardown=close_account_async, max_turns=5)


@pytest.mark.parametrize("mode", ["sync", "subprocess"])
def test_an_async_teardown_runs_once_in_a_vector_worker_also_when_a_failure_ends_the_episode(mode):
    how = {"num_workers": 1} if mode == "subprocess" else {"vectorization_mode": mode}
    envs = gym.make_vec(ASYNC_BANK, num_envs=2, **how)
    try:
        envs.reset(seed=0, options={"task_index": 0})
        _, rewards, _, truncated, _ = envs.step([call("outage"), call("deposit", amount=3)])  # on the worker's loop
        assert truncated.tolist() == [True, False] and np.isnan(rewards[0])
        envs.step([call("deposit", amount=1)] * 2)  # env 0 starts a new episode (its next-step autoreset)
        _, rewards, terminated, _, _ = envs.step([call("close_day", note="a")] * 2)
        assert terminated.all() and rewards[1] == 4.0
    finally:
        envs.close()
    seen, _ = events()
    assert len(seen) == 3
    assert_each_torn_down_once()


class Counting(ToolEnv):
    """A subclass defines setup and teardown as methods."""

    torn: list = []

    def __init__(self):
        super().__init__(tasks=ListTasks([Task("t", "Go.", "x")]), toolset=Toolset([deposit]),
                         rubric=Rubric([balance]))

    def setup(self, task, episode):
        return {"balance": 1, "owner": type(self).__name__}

    def teardown(self, state):
        Counting.torn.append(state["owner"])


def test_a_subclass_defines_setup_and_teardown_as_methods_and_is_still_collected():
    env = Counting()
    env.reset()
    env.step(call("deposit", amount=2))
    assert env.step("done")[1] == 3.0
    env.reset()
    assert Counting.torn == ["Counting"]
    del env
    gc.collect()  # the teardown method holds the env weakly: the env is collected and its episode torn down
    assert Counting.torn == ["Counting", "Counting"]


def test_setup_and_teardown_must_be_callables():
    with pytest.raises(TypeError, match="setup must be a callable"):
        register_tool_env("authoring/Bad-v0", tools=[deposit], tasks=TASKS, rubric=[balance], setup="open")
    with pytest.raises(TypeError, match="teardown must be a callable"):
        ToolEnv(tasks=ListTasks([Task("t", "Go.", "x")]), toolset=Toolset([deposit]), rubric=Rubric([balance]),
                teardown=42)


# -- 2. terminal tools ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tool_format", FORMATS)
def test_a_terminal_tool_ends_the_episode_after_its_result_and_the_rubric_runs(tool_format):
    env = gym.make(BANK, tool_format=tool_format)
    fmt = get_format(tool_format)
    env.reset(options={"task_index": 1})
    obs, reward, terminated, truncated, info = env.step(fmt.render_calls([("close_day", {"note": "all good"})]))
    assert terminated and not truncated and info["outcome"] == "scored"
    assert reward == 100.0 and "closed with 100" in obs  # the result stays in sight
    assert env.unwrapped.episode.setup_state["note"] == "all good"
    with pytest.raises(gym.error.ResetNeeded):
        env.step("more")
    env.close()


def test_calls_after_a_terminal_call_in_the_same_reply_are_not_run():
    env = gym.make(BANK)
    env.reset(options={"task_index": 0})
    reply = call("deposit", amount=1) + call("close_day", note="n") + call("deposit", amount=50)
    obs, reward, terminated, _, info = env.step(reply)
    assert terminated and reward == 1.0  # the deposit before ran, the one after did not
    assert [m["content"] for m in info["messages"]] == [
        "balance 1", "closed with 1", "Error: not run: 'close_day' ended the episode."]
    assert info["errors"] == ["not_run"] and len(info["tool_calls"]) == 3
    env.close()


def test_a_terminal_call_that_fails_leaves_the_episode_going():
    env = gym.make(BANK, max_turns=3)
    env.reset()
    _, _, terminated, truncated, info = env.step(call("close_day", nope=1))  # bad arguments
    assert not (terminated or truncated) and info["error"] == "bad_arguments"

    @tool(terminal=True)
    def submit(answer: str) -> str:
        """Submit.

        Args:
            answer: the answer
        """
        if not answer:
            raise ToolError("empty answer")
        return "submitted"

    def right(messages) -> float:
        return float(any(m.get("content") == "submitted" for m in messages))

    env2 = ToolEnv(tasks=ListTasks([Task("t", "Go.", "x")]), toolset=Toolset([submit]), rubric=Rubric([right]),
                   max_turns=2, episode_timeout=60)  # a deadline: the calls take the timed path
    env2.reset()
    _, _, terminated, _, info = env2.step(call("submit", answer=""))
    assert not terminated and info["error"] == "tool_error"
    _, reward, terminated, truncated, info = env2.step(call("submit", answer="x"))  # the last turn: terminated
    assert terminated and not truncated and reward == 1.0
    env.close()
    env2.close()


def test_a_terminal_tool_ends_the_episode_through_astep_too():
    env = gym.make(BANK)

    async def run():
        await env.unwrapped.areset(options={"task_index": 3})
        return await env.unwrapped.astep(call("close_day", note="x") + call("deposit", amount=1))

    obs, reward, terminated, _, info = asyncio.run(run())
    assert terminated and reward == 300.0 and info["errors"] == ["not_run"]
    env.close()


def test_tool_from_schema_may_be_terminal():
    t = Tool.from_schema("finish", "Finish.", {"type": "object", "properties": {}}, lambda: "bye", terminal=True)
    env = ToolEnv(tasks=ListTasks([Task("t", "Go.", "x")]), toolset=Toolset([t]), rubric=Rubric([lambda: 0.5]))
    env.reset()
    _, reward, terminated, _, _ = env.step(call("finish"))
    assert terminated and reward == 0.5
    env.close()


# -- 3. schemas from the wild ----------------------------------------------------------------------


def echo(**arguments):
    return json.dumps(arguments, sort_keys=True)


@pytest.mark.parametrize("schema, where, says", [
    ({"type": "object", "properties": {"when": {"type": "dict"}}}, "'/properties/when/type'", "unknown type 'dict'"),
    ({"type": "object", "properties": {"x": {"type": ["string", "float"]}}}, "'/properties/x/type'", "unknown type"),
    ({"type": "object", "properties": {"x": {"type": "string"}}, "required": "x"}, "'/required'", "not of type 'array'"),
    ({"type": "object", "required": [1]}, "'/required/0'", "not of type 'string'"),
    ({"type": "array", "items": {"type": "string"}}, "'/type'", 'must be "object"'),
    (["city"], "'/'", "must be a JSON object"),
])
def test_an_invalid_schema_is_refused_where_the_tool_is_built_in_one_line(schema, where, says):
    with pytest.raises(ToolSchemaError) as raised:
        Tool.from_schema("book_flight", "Book.", schema, echo)
    message = str(raised.value)
    assert "'book_flight'" in message and where in message and says in message and "\n" not in message


def test_register_tool_env_refuses_a_hand_built_tool_with_an_invalid_schema():
    bad = Tool(name="search", description="Search.", fn=echo, validate=dict,
               parameters={"type": "object", "properties": {"q": {"type": "str"}}})
    with pytest.raises(ToolSchemaError, match=r"tool 'search': parameters schema at '/properties/q/type': unknown"):
        register_tool_env("authoring/HandBuilt-v0", tools=[bad], tasks=TASKS, rubric=[balance])
    assert "authoring/HandBuilt-v0" not in gym.registry


class Catalogue(BaseEnv):
    """A benchmax env whose tool schema came from a catalogue with Python type names."""

    def __init__(self, **kwargs):
        pass

    async def list_tools(self):
        return [ToolDefinition("convert", "Convert an amount.", {
            "type": "object", "properties": {"amount": {"type": "float"}, "options": {"type": "dict"}},
            "required": ["amount"]})]

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        return f"converted {tool_args['amount']}"

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        return {"correct": float(final_answer(completion) == ground_truth)}


CATALOGUE = register_benchmax_env("authoring/Catalogue-v0", Catalogue, [{"prompt": "Convert 2.5.", "ground_truth": "x"}])


def test_a_benchmax_envs_invalid_schema_fails_gym_make_naming_the_tool_and_lenient_reads_it():
    with pytest.raises(ToolSchemaError, match=r"^tool 'convert': parameters schema at '/properties/amount/type'"):
        gym.make(CATALOGUE)
    with pytest.warns(UserWarning, match="'convert'.*'float' as number.*'dict' as object"):
        env = gym.make(CATALOGUE, lenient_schemas=True)
    props = env.unwrapped.tool_schemas[0]["function"]["parameters"]["properties"]
    assert props == {"amount": {"type": "number"}, "options": {"type": "object"}}  # what the model sees
    env.reset()
    obs, *_, info = env.step(call("convert", amount=2.5))
    assert obs.count("converted 2.5") == 1 and info["error"] is None
    obs, *_, info = env.step(call("convert", amount="lots"))
    assert info["error"] == "bad_arguments" and "'lots' is not of type 'number'" in obs
    env.close()


def test_lenient_reads_any_as_no_constraint_and_leaves_data_alone():
    schema = {"type": "object", "properties": {
        "value": {"type": "any"}, "pair": {"type": "tuple", "default": {"type": "dict"}},
        "type": {"type": "string", "enum": ["dict", "float"]}}}
    with pytest.warns(UserWarning, match="'any' as any type"):
        t = Tool.from_schema("put", "Put.", schema, echo, lenient=True)
    assert t.parameters["properties"] == {"value": {}, "pair": {"type": "array", "default": {"type": "dict"}},
                                          "type": {"type": "string", "enum": ["dict", "float"]}}
    assert t.validate({"value": [1, {"a": None}], "type": "dict"}) == {"value": [1, {"a": None}], "type": "dict"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a standard schema warns about nothing
        Tool.from_schema("put", "Put.", {"type": "object", "properties": {"x": {"type": "number"}}}, echo, lenient=True)


def test_a_schema_naming_an_older_draft_is_checked_against_that_draft():
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": {"type": "integer", "minimum": 0, "exclusiveMinimum": True}}}
    t = Tool.from_schema("count", "Count.", draft4, echo)  # valid draft 4 (a boolean exclusiveMinimum)
    assert t.validate({"n": 1}) == {"n": 1}
    with pytest.raises(ToolSchemaError, match="'/properties/n/exclusiveMinimum'"):
        Tool.from_schema("count", "Count.", {**draft4, "$schema": "https://json-schema.org/draft/2020-12/schema"}, echo)


def unresolvable_ref_tool():
    """A valid schema whose validator breaks at call time: its $ref points nowhere."""
    return Tool.from_schema("lookup", "Look up.", {"type": "object", "properties": {
        "key": {"$ref": "urn:benchmax:nowhere"}}}, echo)


@pytest.mark.parametrize("tool_format", FORMATS)
def test_a_validator_that_raises_becomes_the_calls_error_and_step_never_raises(tool_format):
    def broken_validator(arguments):
        raise RecursionError("maximum recursion depth exceeded in the validator")

    hand_built = Tool(name="fetch", description="Fetch.", parameters={"type": "object", "properties": {}},
                      fn=echo, validate=broken_validator, inline=True)  # inline: the fast step's direct path
    env = ToolEnv(tasks=ListTasks([Task("t", "Go.", "x")]), toolset=Toolset([unresolvable_ref_tool(), hand_built]),
                  rubric=Rubric([lambda: 0.0]), tool_format=tool_format)
    fmt = get_format(tool_format)
    env.reset()
    for name in ("lookup", "fetch"):
        obs, _, terminated, truncated, info = env.step(fmt.render_calls([(name, {"key": "k"})]))  # one call
        assert info["error"] == "tool_error" and f"tool '{name}' could not check its arguments" in obs
        assert not (terminated or truncated)
    obs, *_, info = env.step(fmt.render_calls([("lookup", {"key": "a"}), ("fetch", {})]))  # the general path
    assert info["errors"] == ["tool_error", "tool_error"]
    obs, *_, info = asyncio.run(env.astep(fmt.render_calls([("lookup", {"key": "a"})])))
    assert info["error"] == "tool_error" and "could not check its arguments" in obs
    env.close()


BAD_SCHEMA_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer
    server = MCPServer("catalogue")

    @server.tool()
    def scale(factor: float) -> str:
        """Scale by a factor."""
        return f"scaled by {factor}"

    # as a catalogue wrote it: a Python type name where JSON Schema says "number"
    server._tool_manager._tools["scale"].parameters["properties"]["factor"]["type"] = "float"
    server.run()
''')


def test_an_mcp_servers_invalid_schema_is_refused_naming_the_tool_and_lenient_reads_it(tmp_path):
    path = tmp_path / "catalogue_server.py"
    path.write_text(BAD_SCHEMA_SERVER)
    kwargs = {"server": {"command": sys.executable, "args": [str(path)]},
              "tasks": [{"prompt": "Scale by 2.5.", "answer": "x"}], "reward": lambda: 0.0}
    env = gym.make("benchmax/MCP-v0", **kwargs)
    with pytest.raises(ToolSchemaError, match=r"^tool 'scale': parameters schema at '/properties/factor/type': unknown"):
        env.reset()  # the servers list their tools at the first reset
    env.close()
    with pytest.warns(UserWarning, match="'float' as number"):
        env = gym.make("benchmax/MCP-v0", lenient_schemas=True, **kwargs)
        env.reset()
    obs, *_, info = env.step(call("scale", factor=2.5))
    assert "scaled by 2.5" in obs and info["error"] is None
    env.close()


# -- a JSON null for a string parameter: the same in every format ---------------------------------------


@tool
def greet(name: str) -> str:
    """Greet someone.

    Args:
        name: who
    """
    return f"hello {name}"


@tool
def greet_maybe(name: Optional[str] = "x") -> str:
    """Greet someone, or no one.

    Args:
        name: who, or null
    """
    return f"hello {name!r}"


schema_greet = Tool.from_schema("greet_schema", "Greet.", {
    "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, lambda name: f"hello {name}")


@pytest.mark.parametrize("tool_format", FORMATS)
def test_a_null_for_a_string_parameter_is_refused_or_arrives_as_none_in_every_format(tool_format):
    env = ToolEnv(tasks=ListTasks([Task("t", "Go.", "x")]), toolset=Toolset([greet, greet_maybe, schema_greet]),
                  rubric=Rubric([lambda: 0.0]), tool_format=tool_format)
    fmt = get_format(tool_format)
    env.reset()
    for name in ("greet", "greet_schema"):
        obs, *_, info = env.step(fmt.render_calls([(name, {"name": None})]))
        assert info["error"] == "bad_arguments" and "hello" not in obs, (name, obs)
        assert info["tool_calls"][0]["arguments"] == {"name": None}
    obs, *_, info = env.step(fmt.render_calls([("greet_maybe", {"name": None})]))
    assert info["error"] is None and "hello None" in obs
    obs, *_, info = env.step(fmt.render_calls([("greet", {"name": "null person"})]))  # only a bare null is null
    assert "hello null person" in obs
    env.close()
