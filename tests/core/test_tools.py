"""Tools: schemas built from Python functions, argument validation and execution rules."""

import asyncio
import json
import re
import threading
from typing import Annotated, Literal, Optional

import pydantic
import pytest

from benchmax_gym.core import aio
from benchmax_gym.core.tools import Tool, ToolError, ToolResult, Toolset, tool

RUN = {"timeout": 5.0, "max_chars": 10_000}


# -- tools used across the tests -------------------------------------------------------------


@tool
def everything(
    text: str,
    count: int,
    ratio: float,
    flag: bool,
    numbers: list[int],
    mode: Literal["a", "b"],
    limit: Optional[int] = None,
    scale: float = 1.5,
    label: str = "x",
) -> dict:
    """Exercise every kind of argument.

    A second paragraph of description.

    Args:
        text: the text to work on,
            described over two lines
        count (int): how many times
        ratio: a fraction
        flag: whether to shout
        numbers: some integers
        mode: which mode to use
        limit: an optional cap

    Returns:
        a summary of the arguments
    """
    return {
        "text": text, "count": count, "ratio": ratio, "flag": flag, "numbers": numbers,
        "mode": mode, "limit": limit, "scale": scale, "label": label,
    }


@tool
def echo(message: str) -> str:
    """Return the message unchanged.

    Args:
        message: what to echo
    """
    return message


@tool
def whoami(tag: str, episode) -> str:
    """Report the episode the engine passed in.

    Args:
        tag: a label
    """
    return f"{tag}:{episode!r}"


def good_args(**overrides):
    args = {"text": "hi", "count": 2, "ratio": 0.5, "flag": True, "numbers": [1, 2], "mode": "a"}
    args.update(overrides)
    return args


@pytest.fixture
def toolset():
    ts = Toolset([everything, echo, whoami])
    yield ts
    ts.close()


# -- schema ----------------------------------------------------------------------------------


def test_schema_has_openai_function_shape():
    schema = everything.schema
    assert set(schema) == {"type", "function"}
    assert schema["type"] == "function"
    assert set(schema["function"]) == {"name", "description", "parameters"}
    assert schema["function"]["name"] == "everything"
    assert schema["function"]["parameters"]["type"] == "object"
    json.dumps(schema)  # serialisable as is


def test_schema_description_is_the_docstring_before_args():
    desc = everything.description
    assert desc.startswith("Exercise every kind of argument.")
    assert "A second paragraph of description." in desc
    assert "Args" not in desc and "Returns" not in desc and "how many times" not in desc
    assert everything.schema["function"]["description"] == desc


def test_schema_types_from_type_hints():
    props = everything.parameters["properties"]
    assert props["text"]["type"] == "string"
    assert props["count"]["type"] == "integer"
    assert props["ratio"]["type"] == "number"
    assert props["flag"]["type"] == "boolean"
    assert props["numbers"]["type"] == "array"
    assert props["numbers"]["items"] == {"type": "integer"}
    assert props["mode"]["enum"] == ["a", "b"]
    assert props["mode"].get("type", "string") == "string"
    limit_types = {branch.get("type") for branch in props["limit"]["anyOf"]}
    assert limit_types == {"integer", "null"}


def test_schema_defaults_and_required():
    params = everything.parameters
    assert params["required"] == ["text", "count", "ratio", "flag", "numbers", "mode"]
    props = params["properties"]
    assert props["limit"]["default"] is None
    assert props["scale"]["default"] == 1.5
    assert props["label"]["default"] == "x"
    assert "default" not in props["text"]


def test_schema_argument_descriptions_from_google_docstring():
    props = everything.parameters["properties"]
    assert props["text"]["description"] == "the text to work on, described over two lines"
    assert props["count"]["description"] == "how many times"  # "(int)" is not part of it
    assert props["limit"]["description"] == "an optional cap"
    # Arguments the docstring does not describe have no description at all.
    assert "description" not in props["scale"]
    assert "description" not in props["label"]
    # The Returns: section is not an argument.
    assert "Returns" not in props and "a summary of the arguments" not in json.dumps(props)


def test_schema_forbids_additional_properties_and_has_no_titles():
    params = everything.parameters
    assert params["additionalProperties"] is False
    text = json.dumps(params)
    assert '"title"' not in text


def test_schema_keeps_a_property_named_title():
    @tool
    def make_page(title: str, body: str = "") -> str:
        """Make a page.

        Args:
            title: the page title
        """
        return title

    props = make_page.parameters["properties"]
    assert set(props) == {"title", "body"}
    assert props["title"] == {"description": "the page title", "type": "string"}
    assert make_page.parameters["required"] == ["title"]


def test_schema_without_arguments_or_docstring():
    @tool
    def ping():
        return "pong"

    assert ping.name == "ping"
    assert ping.description == "ping"
    params = ping.parameters
    assert params["type"] == "object"
    assert params["properties"] == {}
    assert params["required"] == []
    assert params["additionalProperties"] is False


def test_docstring_argument_described_on_the_next_line():
    @tool
    def f(query: str) -> str:
        """Search.

        Args:
            query:
                what to look for
        """
        return query

    assert f.parameters["properties"]["query"]["description"] == "what to look for"


def test_decorator_options_name_and_inline():
    @tool(name="renamed", inline=True)
    def original(x: int) -> int:
        """Double x."""
        return 2 * x

    assert isinstance(original, Tool)
    assert original.name == "renamed"
    assert original.schema["function"]["name"] == "renamed"
    assert original.inline is True
    assert echo.inline is False
    ts = Toolset([original])
    assert "renamed" in ts and "original" not in ts
    assert ts.run("renamed", {"x": 4}, **RUN) == ToolResult("8")


def test_episode_parameter_is_hidden_from_the_schema():
    assert whoami.wants_episode is True
    assert echo.wants_episode is False
    props = whoami.parameters["properties"]
    assert "episode" not in props
    assert whoami.parameters["required"] == ["tag"]


def test_episode_is_injected_by_run(toolset):
    marker = object()
    result = toolset.run("whoami", {"tag": "t"}, episode=marker, **RUN)
    assert result.error is None
    assert result.content == f"t:{marker!r}"


def test_episode_cannot_be_supplied_by_the_model(toolset):
    result = toolset.run("whoami", {"tag": "t", "episode": "forged"}, episode="real", **RUN)
    assert result.error == "bad_arguments"
    assert "episode" in result.content


def test_var_args_rejected_at_decoration():
    with pytest.raises(TypeError, match=r"\*args"):
        @tool
        def f(*values: int) -> int:
            return sum(values)

    with pytest.raises(TypeError):
        @tool
        def g(**options: int) -> int:
            return len(options)


def test_unresolvable_type_hint_is_a_type_error():
    def f(x: "NoSuchType") -> str:  # noqa: F821
        return "x"

    with pytest.raises(TypeError, match="type hints"):
        tool(f)


def test_string_annotations_are_resolved():
    def f(xs: "list[int]", name: "str" = "n") -> str:
        return name

    t = tool(f)
    assert t.parameters["properties"]["xs"]["type"] == "array"
    assert t.parameters["properties"]["name"]["type"] == "string"


# -- validation ------------------------------------------------------------------------------


def test_valid_call_passes_converted_arguments(toolset):
    result = toolset.run("everything", good_args(), **RUN)
    assert result.error is None
    assert json.loads(result.content) == {
        "text": "hi", "count": 2, "ratio": 0.5, "flag": True, "numbers": [1, 2],
        "mode": "a", "limit": None, "scale": 1.5, "label": "x",
    }


def test_optional_argument_accepts_null_and_a_value(toolset):
    assert json.loads(toolset.run("everything", good_args(limit=None), **RUN).content)["limit"] is None
    assert json.loads(toolset.run("everything", good_args(limit=7), **RUN).content)["limit"] == 7


def test_missing_argument(toolset):
    args = good_args()
    del args["count"]
    result = toolset.run("everything", args, **RUN)
    assert result.error == "bad_arguments"
    assert "count" in result.content
    assert "missing" in result.content


@pytest.mark.parametrize(
    "name, value",
    [
        ("text", 5),
        ("count", "abc"),
        ("count", 1.5),
        ("count", "3.5"),  # never truncated to 3
        ("count", "0x10"),
        ("count", "1e3"),
        ("ratio", "fast"),
        ("numbers", ["one"]),
        ("numbers", 3),
        ("mode", "c"),
        ("limit", "many"),
        ("flag", "perhaps"),
    ],
)
def test_wrong_type(toolset, name, value):
    result = toolset.run("everything", good_args(**{name: value}), **RUN)
    assert result.error == "bad_arguments"
    # The message names the argument (or the bad element inside it, e.g. 'numbers.0').
    assert re.search(rf"argument '{name}(\.\w+)*'", result.content), result.content


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("count", True, "expected a number, got the boolean true"),  # ran as count=1
        ("ratio", False, "expected a number, got the boolean false"),
        ("limit", True, "expected a number, got the boolean true"),  # inside Optional
        ("numbers", [1, True], "expected a number, got the boolean true"),  # inside a list
        ("flag", 1, "expected a boolean, got the number 1"),
        ("flag", 0.0, "expected a boolean, got the number 0.0"),
        ("ratio", float("nan"), "finite number"),  # json.loads reads NaN and Infinity
        ("scale", float("inf"), "finite number"),
        ("scale", "-Infinity", "finite number"),
    ],
)
def test_booleans_and_numbers_are_kept_apart_as_json_schema_keeps_them(toolset, name, value, expected):
    result = toolset.run("everything", good_args(**{name: value}), **RUN)
    assert result.error == "bad_arguments" and expected in result.content, result.content
    assert re.search(rf"argument '{name}(\.\w+)*'", result.content), result.content


def test_strings_that_spell_the_value_are_still_read(toolset):
    result = toolset.run("everything", good_args(count="3", ratio="0.25", flag="false", limit=" 7 ", scale=2), **RUN)
    assert result.error is None, result.content
    values = json.loads(result.content)
    assert (values["count"], values["ratio"], values["flag"], values["limit"], values["scale"]) == (3, 0.25, False, 7, 2.0)


@tool
def search_like(query: str, limit: int = 5, min_score: float = 0.0, exact: bool = False) -> str:
    """Plain arguments only, as the families' tools (CRM's search_knowledge): the fast check.

    Args:
        query: words
        limit: how many
        min_score: a threshold
        exact: whole words only
    """
    return json.dumps([query, limit, min_score, exact])


@tool
def halve(x: float) -> float:
    """One float argument (the one-argument fast check).

    Args:
        x: a number
    """
    return x / 2


@pytest.mark.parametrize(
    "tool_name, arguments, name, expected",
    [
        # json.loads reads NaN: it ran
        ("search_like", {"query": "q", "min_score": float("nan")}, "min_score", "finite number"),
        ("search_like", {"query": "q", "min_score": float("inf")}, "min_score", "finite number"),
        ("search_like", {"query": "q", "min_score": float("-inf"), "limit": 2}, "min_score", "finite number"),
        ("halve", {"x": float("nan")}, "x", "finite number"),
        ("halve", {"x": float("-inf")}, "x", "finite number"),
    ],
)
def test_plain_float_arguments_refuse_nan_and_infinities(tool_name, arguments, name, expected):
    result = Toolset([search_like, halve]).run(tool_name, arguments, **RUN)
    assert result.error == "bad_arguments" and expected in result.content, result.content
    assert f"argument '{name}'" in result.content, result.content


@tool
def constrained(
    limit: Annotated[int, pydantic.Field(ge=1, le=20)] = 5,
    page: pydantic.PositiveInt = 1,
    shout: Annotated[bool, "loud"] = False,
    level: Literal[1, 2, 3] = 1,
    only: Literal[True] = True,
) -> str:
    """Constrained and literal arguments.

    Args:
        limit: how many
        page: which page
        shout: loudly
        level: a level
        only: must be true
    """
    return json.dumps([limit, page, shout, level, only])


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("limit", True, "expected a number, got the boolean true"),  # ran as limit=1
        ("page", True, "expected a number, got the boolean true"),
        ("shout", 1, "expected a boolean, got the number 1"),  # ran as shout=True
        ("level", True, "expected a number, got the boolean true"),  # ran as level=1 (True == 1)
        ("only", 1, "expected a boolean, got the number 1"),
    ],
)
def test_annotated_and_literal_arguments_keep_booleans_and_numbers_apart(name, value, expected):
    result = Toolset([constrained]).run("constrained", {name: value}, **RUN)
    assert result.error == "bad_arguments" and expected in result.content, result.content
    assert f"argument '{name}'" in result.content, result.content
    low = Toolset([constrained]).run("constrained", {"limit": 0}, **RUN)  # the constraints still hold
    assert low.error == "bad_arguments"
    assert "argument 'limit': Input should be greater than or equal to 1" in low.content
    props = constrained.parameters["properties"]  # the schema the model sees is unchanged
    assert (props["limit"]["minimum"], props["limit"]["maximum"]) == (1, 20)
    assert props["page"]["exclusiveMinimum"] == 0
    assert props["level"]["enum"] == [1, 2, 3]
    ok = Toolset([constrained]).run("constrained", {"limit": "3", "page": 2.0, "level": 2}, **RUN)
    assert json.loads(ok.content) == [3, 2, False, 2, True]


def test_unexpected_argument(toolset):
    result = toolset.run("echo", {"message": "m", "volume": 11}, **RUN)
    assert result.error == "bad_arguments"
    assert "volume" in result.content
    assert "unexpected" in result.content


@pytest.mark.parametrize("arguments", [["m"], "m", None, 3, '{"message": "m"}'])
def test_arguments_not_a_dict(toolset, arguments):
    result = toolset.run("echo", arguments, **RUN)
    assert result.error == "bad_arguments"
    assert "echo" in result.content
    assert "JSON object" in result.content


def test_unknown_tool_lists_available_tools(toolset):
    result = toolset.run("nope", {}, **RUN)
    assert result.error == "unknown_tool"
    assert "nope" in result.content
    for name in ("everything", "echo", "whoami"):
        assert name in result.content


def test_unknown_tool_in_empty_toolset():
    result = Toolset().run("anything", {}, **RUN)
    assert result.error == "unknown_tool"


def test_validation_errors_do_not_call_the_tool():
    calls = []

    @tool
    def record(n: int) -> int:
        calls.append(n)
        return n

    ts = Toolset([record])
    assert ts.run("record", {"n": "x"}, **RUN).error == "bad_arguments"
    assert ts.run("record", {}, **RUN).error == "bad_arguments"
    assert ts.run("record", {"n": 1, "m": 2}, **RUN).error == "bad_arguments"
    assert calls == []
    assert ts.run("record", {"n": 3}, **RUN) == ToolResult("3")
    assert calls == [3]
    ts.close()


# -- failures inside tools -------------------------------------------------------------------


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    if b == 0:
        raise ValueError("cannot divide by zero")
    return a / b


@tool
def strict(x: int) -> str:
    """Fail with a custom code."""
    raise ToolError(f"x is {x}, which I refuse", code="custom")


@tool
def plain_tool_error(x: int) -> str:
    """Fail with the default code."""
    raise ToolError("plain failure")


@pytest.mark.parametrize("runner", ["run", "arun"])
def test_exception_in_tool_is_tool_error(runner):
    ts = Toolset([divide])
    if runner == "run":
        result = ts.run("divide", {"a": 1, "b": 0}, **RUN)
    else:
        result = asyncio.run(ts.arun("divide", {"a": 1, "b": 0}, **RUN))
    ts.close()
    assert result.error == "tool_error"
    assert "cannot divide by zero" in result.content
    assert "ValueError" in result.content
    assert "Traceback" not in result.content


@pytest.mark.parametrize("runner", ["run", "arun"])
def test_tool_error_code_is_kept(runner):
    ts = Toolset([strict, plain_tool_error])
    if runner == "run":
        custom = ts.run("strict", {"x": 4}, **RUN)
        plain = ts.run("plain_tool_error", {"x": 4}, **RUN)
    else:
        custom = asyncio.run(ts.arun("strict", {"x": 4}, **RUN))
        plain = asyncio.run(ts.arun("plain_tool_error", {"x": 4}, **RUN))
    ts.close()
    assert custom.error == "custom"
    assert "x is 4, which I refuse" in custom.content
    assert plain.error == "tool_error"
    assert "plain failure" in plain.content


def test_inline_tool_errors_are_results_too():
    @tool(inline=True)
    def boom() -> str:
        raise RuntimeError("kaboom")

    result = Toolset([boom]).run("boom", {}, **RUN)
    assert result.error == "tool_error"
    assert "kaboom" in result.content


# -- timeouts --------------------------------------------------------------------------------


def _blocking_tool():
    """A sync tool that blocks until released; records whether it has finished."""
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    @tool
    def block() -> str:
        started.set()
        release.wait(10)
        finished.set()
        return "done"

    return block, started, release, finished


def test_sync_tool_past_timeout_returns_promptly():
    block, started, release, finished = _blocking_tool()
    ts = Toolset([block])
    try:
        result = ts.run("block", {}, timeout=0.2, max_chars=1000)
        # run() returned while the tool was still blocked: it did not wait for the tool.
        assert started.is_set()
        assert not finished.is_set()
    finally:
        release.set()
        ts.close()
    assert result.error == "tool_timeout"
    assert "block" in result.content and "timed out" in result.content


def test_sync_tool_past_timeout_in_arun():
    block, started, release, finished = _blocking_tool()
    ts = Toolset([block])
    try:
        result = asyncio.run(ts.arun("block", {}, timeout=0.2, max_chars=1000))
        assert started.is_set()
        assert not finished.is_set()
    finally:
        release.set()
        ts.close()
    assert result.error == "tool_timeout"


def test_time_sleep_tool_times_out():
    import time

    woke = threading.Event()

    @tool
    def nap(seconds: float) -> str:
        time.sleep(seconds)
        woke.set()
        return "rested"

    ts = Toolset([nap])
    result = ts.run("nap", {"seconds": 10.0}, timeout=0.1, max_chars=100)
    assert not woke.is_set()  # run() returned while the tool still slept: it did not wait for it
    ts.close()
    assert result.error == "tool_timeout"


def _async_sleeper():
    state = {"cancelled": False, "finished": False}

    @tool
    async def slow(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        state["finished"] = True
        return "woke"

    return slow, state


def test_async_tool_timeout_in_arun():
    slow, state = _async_sleeper()
    ts = Toolset([slow])
    result = asyncio.run(ts.arun("slow", {"seconds": 5}, timeout=0.1, max_chars=100))
    assert result.error == "tool_timeout"
    assert state == {"cancelled": True, "finished": False}


def test_async_tool_timeout_in_run_with_an_own_loop():
    slow, state = _async_sleeper()
    ts = Toolset([slow])
    result = ts.run("slow", {"seconds": 5}, timeout=0.1, max_chars=100, run_coroutine=aio.OwnLoop().run)
    assert result.error == "tool_timeout"
    assert "timed out" in result.content
    assert state["cancelled"] is True and state["finished"] is False


def test_async_tool_returns_value():
    @tool
    async def add(a: int, b: int) -> int:
        """Add."""
        await asyncio.sleep(0)
        return a + b

    assert add.is_async
    ts = Toolset([add])
    assert asyncio.run(ts.arun("add", {"a": 2, "b": 3}, **RUN)) == ToolResult("5")
    assert ts.run("add", {"a": 2, "b": 3}, run_coroutine=aio.OwnLoop().run, **RUN) == ToolResult("5")
    # Validation applies to async tools too.
    assert asyncio.run(ts.arun("add", {"a": "x", "b": 3}, **RUN)).error == "bad_arguments"


def test_async_tool_gets_the_episode():
    @tool
    async def where(episode) -> str:
        return str(episode)

    ts = Toolset([where])
    assert asyncio.run(ts.arun("where", {}, episode="ep-1", **RUN)).content == "ep-1"
    assert ts.run("where", {}, episode="ep-2", run_coroutine=aio.OwnLoop().run, **RUN).content == "ep-2"


def test_async_tool_in_run_without_runner_is_an_error_result():
    @tool
    async def f() -> str:
        return "x"

    result = Toolset([f]).run("f", {}, **RUN)
    assert result.error == "tool_error"
    assert result.content.startswith("Error")


def test_async_tool_raising_in_run_with_an_own_loop():
    @tool
    async def bad() -> str:
        raise ToolError("nope", code="denied")

    result = Toolset([bad]).run("bad", {}, run_coroutine=aio.OwnLoop().run, **RUN)
    assert result == ToolResult("Error: nope", "denied")


# -- output ----------------------------------------------------------------------------------


@pytest.mark.parametrize("runner", ["run", "arun"])
def test_long_output_is_truncated_with_marker(runner):
    @tool
    def spew(n: int) -> str:
        return "a" * n

    ts = Toolset([spew])
    if runner == "run":
        result = ts.run("spew", {"n": 5000}, timeout=5, max_chars=300)
    else:
        result = asyncio.run(ts.arun("spew", {"n": 5000}, timeout=5, max_chars=300))
    ts.close()
    assert result.error is None
    assert len(result.content) <= 300
    assert "[truncated" in result.content
    assert result.content.startswith("a" * 100)
    assert "5000" in result.content  # says how long the full output was


def test_output_at_the_limit_is_not_truncated():
    ts = Toolset([echo])
    result = ts.run("echo", {"message": "b" * 300}, timeout=5, max_chars=300)
    ts.close()
    assert result.content == "b" * 300


def test_truncated_output_never_exceeds_small_max_chars():
    ts = Toolset([echo])
    result = ts.run("echo", {"message": "c" * 500}, timeout=5, max_chars=20)
    ts.close()
    assert len(result.content) <= 20


@pytest.mark.parametrize(
    "value, text",
    [
        ({"a": 1, "b": [True, None]}, '{"a": 1, "b": [true, null]}'),
        ([1, "two", 3.5], '[1, "two", 3.5]'),
        ({"city": "Zürich", "emoji": "😀"}, '{"city": "Zürich", "emoji": "😀"}'),
        (None, ""),
        ("plain", "plain"),
        (42, "42"),
        (True, "true"),
    ],
)
def test_return_values_become_text(value, text):
    @tool
    def give() -> object:
        return value

    result = Toolset([give]).run("give", {}, **RUN)
    assert result == ToolResult(text)
    if isinstance(value, (dict, list)):
        assert json.loads(result.content) == value


# -- Tool.from_schema ------------------------------------------------------------------------

SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "k": {"type": "integer", "minimum": 1}},
    "required": ["query"],
    "additionalProperties": False,
}


def _search(query, k=3):
    return [f"{query}-{i}" for i in range(k)]


def test_from_schema_valid_call():
    t = Tool.from_schema("search", "Search things.", SEARCH_SCHEMA, _search)
    assert t.schema == {
        "type": "function",
        "function": {"name": "search", "description": "Search things.", "parameters": SEARCH_SCHEMA},
    }
    ts = Toolset([t])
    result = ts.run("search", {"query": "cat", "k": 2}, **RUN)
    assert result.error is None
    assert json.loads(result.content) == ["cat-0", "cat-1"]
    ts.close()


@pytest.mark.parametrize(
    "arguments, mentions",
    [
        ({}, "query"),
        ({"query": 5}, "query"),
        ({"query": "cat", "k": 0}, "k"),
        ({"query": "cat", "k": "two"}, "k"),
        ({"query": "cat", "extra": 1}, "extra"),
    ],
)
def test_from_schema_rejects_bad_arguments(arguments, mentions):
    called = []
    t = Tool.from_schema("search", "Search.", SEARCH_SCHEMA, lambda **kw: called.append(kw))
    result = Toolset([t]).run("search", arguments, **RUN)
    assert result.error == "bad_arguments"
    assert mentions in result.content
    assert called == []


@pytest.mark.parametrize(
    "arguments, mentions",
    [
        ({"x": float("nan")}, "x: nan is not of type 'number'"),  # json.loads reads NaN; fn got it
        ({"x": float("inf")}, "x: inf is not of type 'number'"),
        ({"x": 1.5, "xs": [1, float("-inf")]}, "xs.1: -inf is not of type 'number'"),
    ],
)
def test_from_schema_refuses_nan_and_infinities_for_a_number(arguments, mentions):
    schema = {"type": "object", "properties": {
        "x": {"type": "number"}, "xs": {"type": "array", "items": {"type": "number"}},
        "n": {"type": "integer"}}}
    called = []
    t = Tool.from_schema("measure", "Measure.", schema, lambda **kw: called.append(kw))
    result = Toolset([t]).run("measure", arguments, **RUN)
    assert result.error == "bad_arguments" and mentions in result.content, result.content
    assert called == []
    assert Toolset([t]).run("measure", {"x": 1e308, "xs": [-2, 0.5], "n": 3.0}, **RUN).error is None


def test_from_schema_without_parameters_takes_an_empty_object():
    t = Tool.from_schema("now", "The time.", None, lambda: "noon")
    assert t.parameters == {"type": "object", "properties": {}}
    ts = Toolset([t])
    assert ts.run("now", {}, **RUN) == ToolResult("noon")
    assert ts.run("now", [], **RUN).error == "bad_arguments"
    ts.close()


def test_from_schema_async_and_episode():
    async def fn(query, episode):
        return f"{query}@{episode}"

    t = Tool.from_schema("s", "S.", SEARCH_SCHEMA, fn, wants_episode=True)
    assert t.is_async
    arguments = {"query": "q"}
    result = asyncio.run(Toolset([t]).arun("s", arguments, episode="E", **RUN))
    assert result == ToolResult("q@E")
    assert arguments == {"query": "q"}  # the call's own arguments (info["tool_calls"]) never get the episode
    assert Toolset([t]).run("s", arguments, episode="E", run_coroutine=lambda c, t: asyncio.run(c), **RUN).content == "q@E"
    assert arguments == {"query": "q"}


# -- Toolset ---------------------------------------------------------------------------------


def test_duplicate_tool_names_raise():
    with pytest.raises(ValueError, match="echo"):
        Toolset([echo, echo])

    @tool(name="echo")
    def other(x: int) -> int:
        return x

    ts = Toolset([echo])
    with pytest.raises(ValueError, match="duplicate"):
        ts.add(other)
    assert ts.tools["echo"] is echo


def test_toolset_accepts_plain_functions_and_keeps_order():
    def shout(text: str) -> str:
        """Upper-case the text.

        Args:
            text: what to shout
        """
        return text.upper()

    ts = Toolset([echo, shout, divide])
    assert len(ts) == 3
    assert [t.name for t in ts] == ["echo", "shout", "divide"]
    assert [s["function"]["name"] for s in ts.schemas] == ["echo", "shout", "divide"]
    assert "shout" in ts and "missing" not in ts
    assert ts.schemas[1]["function"]["parameters"]["properties"]["text"]["description"] == "what to shout"
    assert ts.run("shout", {"text": "hey"}, **RUN) == ToolResult("HEY")
    ts.close()


def test_toolset_runs_again_after_close():
    ts = Toolset([echo])
    assert ts.run("echo", {"message": "1"}, **RUN).content == "1"
    ts.close()
    ts.close()  # idempotent
    assert ts.run("echo", {"message": "2"}, **RUN).content == "2"
    ts.close()


def test_positional_only_parameter_is_rejected_or_callable():
    def f(a: int, /) -> int:
        return a

    try:
        t = tool(f)
    except TypeError:
        return  # rejected at decoration, like *args: fine
    assert Toolset([t]).run("f", {"a": 1}, **RUN) == ToolResult("1")


# -- hostile return values, stuck tools, shared toolsets --------------------------------------


class _Unprintable:
    def __str__(self):
        raise RuntimeError("no text for you")


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("make, why", [
    (lambda: 10 ** 5000, "ValueError"),  # past Python's int-to-text digit limit
    (_Unprintable, "RuntimeError"),
    (lambda: _nested(100_000), "RecursionError"),
], ids=["huge_int", "str_raises", "too_deep"])
def test_a_return_value_with_no_text_is_the_tools_error_on_every_path(inline, make, why):
    @tool(inline=inline)
    def give() -> object:
        """Returns a value that cannot be shown."""
        return make()

    from benchmax_gym.core import ListTasks, Rubric, Task, ToolEnv

    ts = Toolset([give])
    run = {**RUN, "timeout": 120.0}  # (a bound for a hang, not a timing: a loaded CI machine took over 5 s)
    for result in (ts.run("give", {}, **run), asyncio.run(ts.arun("give", {}, **run))):
        assert result.error == "tool_error" and why in result.content and result.outcome is None
    env = ToolEnv(tasks=ListTasks([Task("t", "q", "a")]), toolset=ts, rubric=Rubric([lambda completion: 0.0]),
                  tool_timeout=120.0)
    action = '<tool_call>{"name": "give", "arguments": {}}</tool_call>'
    for step in (env.step, lambda a: env.aio.run(env.astep(a))):
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = step(action)
        assert info["error"] == "tool_error" and "returned a value with no text" in obs and why in obs
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert [m["role"] for m in env.episode.messages[-2:]] == ["assistant", "tool"]  # the call has its reply
    env.close()


class _Loud(Exception):
    def __str__(self):
        raise RuntimeError("nor for this")


@pytest.mark.parametrize("inline", [True, False])
def test_every_error_text_is_capped_like_a_result(inline):
    @tool(inline=inline)
    def shout(kind: str) -> str:
        """Fails at length."""
        if kind == "tool_error":
            raise ToolError("no " * 100_000)
        if kind == "loud":
            raise _Loud()
        raise ValueError("bad " * 100_000)

    ts = Toolset([shout])
    for kind in ("tool_error", "value"):
        for result in (ts.run("shout", {"kind": kind}, timeout=5.0, max_chars=500),
                       asyncio.run(ts.arun("shout", {"kind": kind}, timeout=5.0, max_chars=500))):
            assert result.error == "tool_error" and len(result.content) <= 500 and "truncated" in result.content
    bad = ts.run("shout", {"kind": "x" * 100_000, "extra": 1}, timeout=5.0, max_chars=300)
    assert bad.error == "bad_arguments" and len(bad.content) <= 300
    loud = ts.run("shout", {"kind": "loud"}, **RUN)  # an exception whose message cannot be read
    assert loud.error == "tool_error" and "_Loud" in loud.content


def test_a_tool_failure_with_an_unknown_outcome_is_refused_where_it_is_raised():
    from benchmax_gym.core.tools import ToolFailure

    for outcome in ("tool_unavailble", "scored", ""):
        with pytest.raises(ValueError, match="outcome must be one of"):
            ToolFailure("gone", outcome)
    assert ToolFailure("gone", "tool_unavailable").outcome == "tool_unavailable"


def test_calls_stuck_past_their_timeout_never_starve_later_calls():
    release = threading.Event()

    @tool
    def fetch(page: str) -> str:
        """A backend that hangs for the page 'slow'."""
        if page == "slow":
            release.wait(60)
        return f"page {page}"

    ts = Toolset([fetch])
    try:
        for _ in range(6):  # more stuck calls than a small fixed pool has threads
            assert ts.run("fetch", {"page": "slow"}, timeout=0.1, max_chars=100).error == "tool_timeout"
        # (30 s: room on a loaded machine; a starved call waits for the release, 60 s, and still fails)
        assert ts.run("fetch", {"page": "fast"}, timeout=30.0, max_chars=100) == ToolResult("page fast")
        assert asyncio.run(ts.arun("fetch", {"page": "fast"}, timeout=30.0, max_chars=100)) == ToolResult("page fast")
    finally:
        release.set()


def test_a_tool_stuck_past_its_timeout_does_not_hold_up_the_interpreters_exit(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "stuck.py"
    script.write_text(
        "import time\n"
        "from benchmax_gym.core.tools import Toolset, tool\n"
        "@tool\n"
        "def hang() -> str:\n"
        "    '''Never returns in time.'''\n"
        "    time.sleep(600)\n"
        "    return 'late'\n"
        "ts = Toolset([hang])\n"
        "print(ts.run('hang', {}, timeout=0.2, max_chars=100).error)\n"
        "ts.close()\n"
    )
    # an exit that waited for the tool (600 s) would meet this hang guard: TimeoutExpired
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "tool_timeout", out.stderr


def test_closing_one_env_leaves_the_calls_of_others_sharing_its_toolset_running():
    import time

    import gymnasium as gym

    from benchmax_gym import register_tool_env

    @tool
    def lookup(key: str) -> str:
        """A slow backend."""
        time.sleep(0.5)
        return f"value of {key}"

    register_tool_env("test/SharedToolset-v0", tools=[lookup], tasks=[{"prompt": "q", "answer": "a"}],
                      rubric=lambda completion: 0.0)
    envs = [gym.make("test/SharedToolset-v0").unwrapped for _ in range(6)]
    assert envs[0].toolset is envs[1].toolset  # (one registered id: one toolset)
    for env in envs:
        env.reset(seed=0)
    action = '<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>'
    results = {}

    def step(i):
        try:
            results[i] = envs[i].step(action)
        except BaseException as exc:  # (a cancelled call raises CancelledError, a BaseException)
            results[i] = exc

    threads = [threading.Thread(target=step, args=(i,)) for i in range(1, 6)]  # more calls than a small pool runs at once
    for t in threads:
        t.start()
    time.sleep(0.2)
    envs[0].close()
    for t in threads:
        t.join(20)
    assert all(isinstance(results[i], tuple) and results[i][4]["error"] is None and "value of k" in results[i][0]
               for i in range(1, 6)), results
    for env in envs[1:]:
        env.close()
