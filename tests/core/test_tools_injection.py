"""The engine's ``episode``/``state`` injection never overwrites an argument of the tool's own schema."""

import asyncio

import pytest

from benchmax_gym.core.tools import Tool, Toolset, ToolSchemaError

RUN = {"timeout": 5, "max_chars": 1000}
SCHEMA = {"type": "object", "properties": {"episode": {"type": "string"}}, "required": ["episode"]}


@pytest.mark.parametrize("injected", ["episode", "state"])
def test_a_schema_argument_named_like_an_injected_one_cannot_be_injected_over(injected):
    schema = {"type": "object", "properties": {injected: {"type": "string"}}}
    with pytest.raises(ToolSchemaError, match=f"argument named '{injected}'"):
        Tool.from_schema("remote", "R.", schema, lambda **kw: "x", **{f"wants_{injected}": True})


def test_a_schema_argument_named_episode_reaches_the_tool_intact():
    async def remote(**arguments):
        return f"episode={arguments['episode']}"

    t = Tool.from_schema("remote", "R.", SCHEMA, remote)
    assert not t.wants_episode
    ts = Toolset([t])
    assert asyncio.run(ts.arun("remote", {"episode": "ep-42"}, episode="engine's", **RUN)).content == "episode=ep-42"
    ran = ts.run("remote", {"episode": "ep-42"}, episode="engine's", run_coroutine=lambda c, _: asyncio.run(c), **RUN)
    assert ran.content == "episode=ep-42"
