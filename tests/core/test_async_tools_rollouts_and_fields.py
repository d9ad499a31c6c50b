"""The engine's tool calls, round 5: an async tool that blocks past its timeout is a
``tool_timeout`` (not a result to grade); a benchmax rollout whose episode failed is cleaned up
when it fails; the fields of a pydantic-model or TypedDict parameter are checked as the
parameters themselves are."""

import asyncio
import json
import math
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal, Optional

import pydantic
import pytest
import typing_extensions
from benchmax.envs.base_env import BaseEnv as PackageBaseEnv
from benchmax.envs.types import ToolDefinition

from benchmax_gym import BenchmaxEnv
from benchmax_gym.core import ListTasks, Rubric, Task, ToolEnv, ToolFailure, Toolset, tool
from benchmax_gym.core.aio import OwnLoop


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


# -- 1. an async tool that blocks its event loop ------------------------------------------------


@tool
async def block(seconds: float) -> str:
    """Sleeps without awaiting: the event loop is blocked, asyncio's timeout cannot fire.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "the late answer"


@tool
async def spin(seconds: float) -> str:
    """A CPU loop with no await.

    Args:
        seconds: how long
    """
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "the late answer"


@tool
async def block_then_raise(seconds: float) -> str:
    """Blocks, then fails: past its timeout, that is no error of the model's either.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    raise ValueError("a late complaint")


@tool
async def quick(seconds: float) -> str:
    """Well-behaved: awaits.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "on time"


def tool_env(**kwargs) -> ToolEnv:
    tasks = ListTasks([Task("t0", "Question", "42")])
    return ToolEnv(tasks=tasks, toolset=Toolset([block, spin, block_then_raise, quick]),
                   rubric=Rubric([lambda completion, answer: float(completion == answer)]), system_prompt="Test.",
                   **kwargs)


@pytest.mark.parametrize("how", ["step", "astep", "step with a deadline"])
@pytest.mark.parametrize("name", ["block", "spin", "block_then_raise"])
def test_an_async_tool_that_blocks_past_its_timeout_is_a_tool_timeout_never_a_graded_result(name, how):
    """It returned (or raised) once it was done, 0.3 s into a 0.05 s timeout, and that came back
    as an on-time result: the step's ``error`` None, the episode going on to be graded."""
    env = tool_env(tool_timeout=0.05, episode_timeout=600 if how == "step with a deadline" else None)
    env.reset(seed=0)
    action = call(name, seconds=0.3)
    obs, reward, terminated, truncated, info = asyncio.run(env.astep(action)) if how == "astep" else env.step(action)
    assert info["outcome"] == info["error"] == "tool_timeout", obs
    assert "timed out after 0.05 s" in obs and "late" not in obs
    assert math.isnan(reward) and truncated and not terminated and env.episode_record()["reward"] is None
    env.close()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_well_behaved_async_tool_within_its_timeout_still_returns_its_result(asynchronous):
    env = tool_env(tool_timeout=30)
    env.reset(seed=0)
    action = call("quick", seconds=0.01)
    obs, reward, terminated, truncated, info = asyncio.run(env.astep(action)) if asynchronous else env.step(action)
    assert info["error"] is None and "on time" in obs and not (terminated or truncated)
    env.close()


def test_toolset_run_and_arun_time_a_blocking_async_tool_alike():
    ts = Toolset([block])
    ran = ts.run("block", {"seconds": 0.2}, timeout=0.05, max_chars=100, run_coroutine=OwnLoop().run)
    awaited = asyncio.run(ts.arun("block", {"seconds": 0.2}, timeout=0.05, max_chars=100))
    assert (ran.error, ran.outcome) == (awaited.error, awaited.outcome) == ("tool_timeout", "tool_timeout")


# -- 2. a failed benchmax episode's rollout ------------------------------------------------------


class WorkspaceEnv(PackageBaseEnv):
    """The real package's BaseEnv, as its users write one: a workspace per rollout."""

    system_prompt = "Use the tools."

    def __init__(self, **kwargs):
        self.workspaces: dict[str, Path] = {}
        self.cleaned: list[str] = []

    async def list_tools(self):
        return [ToolDefinition("wait", "Wait.", {"type": "object", "properties": {"seconds": {"type": "number"}}}),
                ToolDefinition("backend", "Its backend is gone.", {"type": "object", "properties": {}})]

    async def init_rollout(self, rollout_id, **rollout_args):
        self.workspaces[rollout_id] = Path(tempfile.mkdtemp(prefix="benchmax-rollout-"))

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        if tool_name == "wait":
            await asyncio.sleep(tool_args.get("seconds", 0))
            return "waited"
        raise ToolFailure("the backend went away", "env_error")

    async def copy_to_workspace(self, rollout_id, src_path, dst_filename=None):
        shutil.copy(src_path, self.workspaces[rollout_id] / (dst_filename or Path(src_path).name))

    async def copy_from_workspace(self, rollout_id, src_filename, dst_path):
        shutil.copy(self.workspaces[rollout_id] / src_filename, dst_path)

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        return {"match": float(ground_truth in completion)}

    async def cleanup_rollout(self, rollout_id):
        self.cleaned.append(rollout_id)
        shutil.rmtree(self.workspaces.pop(rollout_id))


ROWS = [{"prompt": "Say hi.", "ground_truth": "hi"}]


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("failure, action, kwargs", [
    ("tool_timeout", call("wait", seconds=5), {"tool_timeout": 0.1}),
    ("env_error", call("backend"), {}),
    ("deadline", call("wait", seconds=5), {"episode_timeout": 0.3}),
])
def test_a_failed_benchmax_episode_cleans_its_rollout_up_when_it_fails(failure, action, kwargs, asynchronous):
    """The rollout's workspace stayed until the next reset or close(), though nothing reads a
    failed rollout (never graded, never passed to compute_group_reward); the engine releases a
    failed episode's own resources at once. Cleaned up once: the next reset does not again."""
    env = BenchmaxEnv(WorkspaceEnv, ROWS, **kwargs)
    bx = env.benchmax_env

    async def episode():
        await env.areset(seed=0)
        rollout_id = env.episode.rollout_id
        return rollout_id, await env.astep(action)

    if asynchronous:
        rollout_id, (_, reward, _, truncated, info) = asyncio.run(episode())
    else:
        env.reset(seed=0)
        rollout_id = env.episode.rollout_id
        _, reward, _, truncated, info = env.step(action)
    assert info["outcome"] == failure and math.isnan(reward) and truncated
    assert bx.cleaned == [rollout_id] and bx.workspaces == {}
    env.reset(seed=1)
    assert bx.cleaned == [rollout_id] and list(bx.workspaces) == [env.episode.rollout_id]
    env.close()
    assert bx.workspaces == {} and len(bx.cleaned) == 2


def test_a_graded_benchmax_episode_keeps_its_rollout_until_the_next_reset():
    """Unchanged: a finished, graded rollout stays (as a scored episode's resources do) until
    the next reset, which cleans it up once."""
    env = BenchmaxEnv(WorkspaceEnv, ROWS)
    bx = env.benchmax_env
    env.reset(seed=0)
    rollout_id = env.episode.rollout_id
    _, reward, terminated, _, info = env.step("hi")
    assert (reward, terminated, info["outcome"]) == (1.0, True, "scored")
    assert list(bx.workspaces) == [rollout_id] and bx.cleaned == []
    env.reset(seed=1)
    assert bx.cleaned == [rollout_id]
    env.close()
    assert bx.workspaces == {}


# -- 3. the fields of a pydantic-model or TypedDict parameter -----------------------------------


class Point(pydantic.BaseModel):
    n: int
    f: float
    b: bool


class PointDict(typing_extensions.TypedDict):
    n: int
    f: float
    b: bool


class Shape(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True)
    corners: list[Point]
    kind: Literal[3, 4] = 3

    @pydantic.field_validator("corners")
    @classmethod
    def some(cls, corners):
        if not corners:
            raise ValueError("no corners")
        return corners


@tool
def flat(n: int, f: float, b: bool) -> str:
    """Plain parameters.

    Args:
        n: an int
        f: a float
        b: a bool
    """
    return "ok"


@tool
def as_model(p: Point) -> str:
    """A model parameter.

    Args:
        p: a point
    """
    return "ok"


@tool
def as_typeddict(p: PointDict) -> str:
    """A TypedDict parameter.

    Args:
        p: a point
    """
    return "ok"


@tool
def shape(s: Shape, extra: Optional[dict[str, PointDict]] = None) -> str:
    """Nested deeper.

    Args:
        s: a shape
        extra: named points
    """
    assert type(s) is Shape and all(type(c) is Point for c in s.corners)
    return pickle.dumps(s).hex()[:8]  # (the tool's own class: it pickles)


VALUES = [3, 3.0, "3", " 3 ", 3.5, "3.5", True, False, 1, 0, "true", "yes", 2.5, float("nan"), float("inf"), "NaN",
          "-inf", "1e3", None, [3]]
PLAIN = {"n": 3, "f": 2.5, "b": False}


@pytest.mark.parametrize("field", ["n", "f", "b"])
def test_a_model_or_typeddict_field_takes_exactly_what_a_plain_parameter_of_its_type_takes(field):
    """A model's or TypedDict's int took true (as 1), a bool took 1, a model's float took NaN and
    infinities: pydantic's lax rules, where the same parameter at the top level is refused."""
    ts = Toolset([flat, as_model, as_typeddict])
    for value in VALUES:
        args = {**PLAIN, field: value}
        top = ts.run("flat", args, timeout=5, max_chars=1000).error
        for name in ("as_model", "as_typeddict"):
            nested = ts.run(name, {"p": args}, timeout=5, max_chars=1000)
            assert nested.error == top, (name, field, value, nested.content)


def test_deeper_fields_are_checked_and_the_tool_still_gets_its_own_classes():
    ts = Toolset([shape])
    good = {"s": {"corners": [{"n": "3", "f": 1, "b": "yes"}], "kind": 4},
            "extra": {"a": {"n": 1.0, "f": "1e3", "b": True}}}
    result = ts.run("shape", good, timeout=5, max_chars=1000)
    assert result.error is None, result.content
    refused = {
        "s.corners.0.n": {"s": {"corners": [{"n": True, "f": 1, "b": True}]}},
        "s.kind": {"s": {"corners": [{"n": 1, "f": 1, "b": True}], "kind": True}},
        "extra.a.b": {"s": good["s"], "extra": {"a": {"n": 1, "f": 1, "b": 1}}},
        "extra.a.f": {"s": good["s"], "extra": {"a": {"n": 1, "f": float("inf"), "b": True}}},
    }
    for where, args in refused.items():
        result = ts.run("shape", args, timeout=5, max_chars=1000)
        assert result.error == "bad_arguments" and f"argument '{where}'" in result.content, (where, result.content)
    # the model's own validator still runs
    assert "no corners" in ts.run("shape", {"s": {"corners": []}}, timeout=5, max_chars=1000).content


def test_the_schema_the_model_sees_is_the_classes_own():
    definitions = shape.parameters["$defs"]
    assert definitions["Point"]["properties"] == {"n": {"type": "integer"}, "f": {"type": "number"},
                                                  "b": {"type": "boolean"}}
    assert definitions["Shape"]["properties"]["kind"] == {"default": 3, "enum": [3, 4], "type": "integer"}
    assert set(definitions) == {"Point", "PointDict", "Shape"}
