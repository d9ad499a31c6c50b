"""Authoring tools from Python functions (helper 155's audit): each annotation a user writes
becomes a schema the model sees and a check of the JSON the model writes; what cannot become a
tool fails at registration naming the function and the parameter. Every call goes through a
real ``gym.make`` of a ``register_tool_env`` id, as a model's ``<tool_call>`` text."""

import dataclasses
import datetime
import enum
import itertools
import json
from typing import Annotated, Callable, Literal, Optional, Union

import gymnasium as gym
import jsonschema
import pydantic
import pytest

from benchmax_gym import register_tool_env

_IDS = itertools.count()


def make(*tools):
    """A fresh env id serving ``tools``, made with gym.make and reset."""
    env_id = register_tool_env(f"audit155/Tools{next(_IDS)}-v0", tools=list(tools),
                               tasks=[{"prompt": "Go.", "answer": "x"}], rubric=lambda completion: 0.0, max_turns=50)
    env = gym.make(env_id)
    env.reset(seed=0)
    return env


def call(env, name, **arguments):
    """One model reply calling ``name``: (observation, info); step never raises."""
    obs, reward, terminated, truncated, info = env.step(
        f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")
    assert not terminated and reward == 0.0
    return obs, info


def parameters(env, name):
    """The parameters schema the model is shown for ``name``, checked against JSON Schema's metaschema."""
    (schema,) = [t["function"]["parameters"] for t in env.unwrapped.tool_schemas if t["function"]["name"] == name]
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def refused(obs, info, argument, says=""):
    assert info["error"] == "bad_arguments", obs
    assert f"argument '{argument}'" in obs and says in obs, obs


# -- booleans and numbers in Literal and Enum --------------------------------------------------

class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Switch(enum.Enum):
    ON = True
    OFF = False


class Weight(enum.Enum):
    HALF = 0.5
    FULL = 1.0


def pick(level: Level = Level.LOW, switch: Switch = Switch.OFF, weight: Weight = Weight.HALF,
         mode: Literal["auto", 1, True] = "auto") -> str:
    """Report what arrived, with its Python type.

    Args:
        level: how much
        switch: on or off
        weight: how heavy
        mode: "auto", 1 or true
    """
    return repr((level, switch, weight, type(mode).__name__, mode))


@pytest.mark.parametrize("argument, value, says", [
    ("level", True, "expected a number, got the boolean true"),  # ran as Level.LOW
    ("switch", 1, "expected a boolean, got the number 1"),  # ran as Switch.ON
    ("weight", True, "expected a number, got the boolean true"),  # ran as Weight.FULL
])
def test_an_enum_or_mixed_literal_never_reads_a_boolean_as_a_number_nor_a_number_as_a_boolean(argument, value, says):
    env = make(pick)
    refused(*call(env, "pick", **{argument: value}), argument, says)
    env.close()


def test_a_whole_float_for_a_mixed_literal_is_its_number_and_enums_arrive_as_members():
    env = make(pick)
    obs, info = call(env, "pick", mode=1.0)  # JSON Schema's 1.0 is the enum's 1 (it ran as True)
    assert info["error"] is None and "'int', 1)" in obs, obs
    for value in (1.5, False, 0):  # a number or a boolean none of its own still refused
        refused(*call(env, "pick", mode=value), "mode")
    obs, info = call(env, "pick", level=2, switch=True, weight=1, mode=True)
    assert "(<Level.HIGH: 2>, <Switch.ON: True>, <Weight.FULL: 1.0>, 'bool', True)" in obs, obs
    schema = parameters(env, "pick")
    assert schema["properties"]["mode"]["enum"] == ["auto", 1, True]
    assert jsonschema.Draft202012Validator(schema).is_valid({"level": 2, "switch": True, "weight": 1, "mode": 1.0})
    env.close()


# -- unions, dates -------------------------------------------------------------------------------

def either(key: Union[int, str], keys: Union[list[int], str] = "all") -> str:
    """Look up by number or by name.

    Args:
        key: a number or a name
        keys: numbers, or "all"
    """
    return repr((key, keys))


@pytest.mark.parametrize("arguments, argument", [
    ({"key": True}, "key.int"),
    ({"key": None}, "key.int"),
    ({"key": 1, "keys": [True]}, "keys.list[int].0"),
])
def test_a_refused_union_argument_names_the_argument_and_its_member_types_plainly(arguments, argument):
    env = make(either)
    obs, info = call(env, "either", **arguments)
    refused(obs, info, argument)
    assert "function-" not in obs and "_not_a_boolean" not in obs, obs  # (the engine's own checks showed)
    env.close()


def when(at: datetime.datetime, on: datetime.date, within: datetime.timedelta = datetime.timedelta(0)) -> str:
    """Schedule something.

    Args:
        at: when it starts (ISO 8601)
        on: the day
        within: how long it may wait
    """
    return repr((at, on, within))


@pytest.mark.parametrize("argument, value", [("at", 0), ("on", 1700000000), ("within", 60), ("at", True)])
def test_a_date_time_or_duration_is_a_string_as_its_schema_says_never_a_number(argument, value):
    env = make(when)
    good = {"at": "2024-05-01T09:30:00", "on": "2024-05-01"}
    assert parameters(env, "when")["properties"][argument]["type"] == "string"
    refused(*call(env, "when", **{**good, argument: value}), argument, "expected a string")  # 0 ran as 1970-01-01
    obs, info = call(env, "when", **good, within="PT1M")
    assert "datetime.datetime(2024, 5, 1, 9, 30)" in obs and "datetime.timedelta(seconds=60)" in obs, obs
    env.close()


# -- defaults ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Place:
    city: str


def find(query: str, limit: int = None, near: Place = None, tags: Optional[list[str]] = None) -> str:
    """Find things.

    Args:
        query: words
        limit: at most this many
        near: close to
        tags: only these
    """
    return repr((query, limit, near, tags))


def test_a_parameter_whose_default_is_none_takes_null():
    env = make(find)
    props = parameters(env, "find")["properties"]
    for name in ("limit", "near", "tags"):
        assert {"type": "null"} in props[name]["anyOf"] and props[name]["default"] is None, props[name]
    obs, info = call(env, "find", query="q", limit=None, near=None)  # was refused: "Input should be a valid integer"
    assert info["error"] is None and "('q', None, None, None)" in obs, obs
    obs, info = call(env, "find", query="q", limit=3, near={"city": "Lima"})
    assert "('q', 3, Place(city='Lima'), None)" in obs, obs
    refused(*call(env, "find", query="q", limit="many"), "limit")
    env.close()


def count_words(text: str, top: int = "all") -> str:
    """Count words.

    Args:
        text: the text
        top: how many to show
    """
    return text


def test_a_default_that_is_not_a_value_of_its_type_fails_at_registration_naming_the_parameter():
    with pytest.raises(TypeError, match=r"tool 'count_words': parameter 'top': its default 'all' is not a value "
                                        r"of its type int"):
        register_tool_env("audit155/BadDefault-v0", tools=[count_words], tasks=[{"prompt": "Go.", "answer": "x"}],
                          rubric=lambda completion: 0.0)
    assert "audit155/BadDefault-v0" not in gym.registry


# -- what cannot become a tool -------------------------------------------------------------------

class Connection:
    """A plain class: no JSON for it."""


def query_db(sql: str, conn: Connection) -> str:
    return sql


def apply(values: list[int], fn: Callable[[int], int]) -> str:
    return "x"


def total(*values: int) -> str:
    return "x"


def configure(name: str, **options: str) -> str:
    return name


def scale(x: float, /, factor: float = 2.0) -> str:
    return "x"


def later(x: "NotDefinedAnywhere") -> str:  # noqa: F821
    return "x"


@pytest.mark.parametrize("fn, says", [
    (query_db, "parameter 'conn' (Connection)"),
    (apply, "parameter 'fn' (Callable[[int], int])"),
    (total, "parameter '*values'"),
    (configure, "parameter '**options'"),
    (scale, "parameter 'x'"),
    (later, "parameter 'x': name 'NotDefinedAnywhere' is not defined"),
])
def test_a_function_that_cannot_become_a_tool_fails_at_registration_naming_it_and_the_parameter(fn, says):
    with pytest.raises(TypeError) as raised:
        register_tool_env(f"audit155/Unfit{next(_IDS)}-v0", tools=[fn], tasks=[{"prompt": "Go.", "answer": "x"}],
                          rubric=lambda completion: 0.0)
    message = str(raised.value)
    assert message.startswith(f"tool {fn.__name__!r}: ") and says in message and "\n" not in message, message


# -- docstrings ----------------------------------------------------------------------------------

def numpy_style(city: str, days: int = 1) -> str:
    """Forecast the weather.

    Parameters
    ----------
    city : str
        The city's English name,
        as on a map.
    days : int, optional
        How many days ahead.

    Returns
    -------
    str
        The forecast.
    """
    return city


def rest_style(city: str, days: int = 1) -> str:
    """Forecast the weather.

    :param city: The city's English name,
        as on a map.
    :param int days: How many days ahead.
    :returns: The forecast.
    """
    return city


def field_described(city: Annotated[str, pydantic.Field(description="The city's English name, as on a map.")],
                    days: Annotated[int, pydantic.Field(ge=1, description="How many days ahead.")] = 1) -> str:
    """Forecast the weather."""
    return city


def test_numpy_rest_and_field_descriptions_reach_the_schema_and_the_sections_stay_out_of_the_description():
    env = make(numpy_style, rest_style, field_described)
    for t in env.unwrapped.tool_schemas:
        function = t["function"]
        assert function["description"] == "Forecast the weather.", function
        props = parameters(env, function["name"])["properties"]
        assert props["city"]["description"] == "The city's English name, as on a map.", function
        assert props["days"]["description"] == "How many days ahead.", function
    refused(*call(env, "field_described", city="Lima", days=0), "days", "greater than or equal to 1")
    env.close()


# -- sets: each item once, as the schema's uniqueItems says ------------------------------------

def tag(ids: set[int], names: Optional[frozenset[str]] = None) -> str:
    """Tag items (each tagged once, whatever the list says).

    Args:
        ids: the items to tag
        names: labels to add
    """
    return repr((sorted(ids), type(ids).__name__, sorted(names or ()), type(names).__name__))


@pytest.mark.parametrize("arguments, argument, repeated", [
    ({"ids": [3, 3]}, "ids", "3"),
    ({"ids": [1, 2, 1.0]}, "ids", "1.0"),  # (JSON Schema's 1.0 is 1)
    ({"ids": [1], "names": ["a", "b", "a"]}, "names", '"a"'),
])
def test_a_set_parameter_given_an_item_twice_is_refused_as_its_schema_says(arguments, argument, repeated):
    """pydantic kept one of [3, 3] without a word, so the model's two meant one; the schema it
    is shown says uniqueItems, which a schema tool (MCP) enforces."""
    env = make(tag)
    schema = parameters(env, "tag")
    assert schema["properties"]["ids"]["uniqueItems"] is True
    with pytest.raises(jsonschema.ValidationError, match="non-unique"):
        jsonschema.validate(arguments, schema)
    refused(*call(env, "tag", **arguments), argument, f"items must be unique (it is a set), {repeated} is given more than once")


def test_a_set_parameter_takes_distinct_items_and_keeps_json_kinds_apart():
    env = make(tag)
    obs, info = call(env, "tag", ids=[2, 1], names=["1", "a"])
    assert info["error"] is None and "([1, 2], 'set', ['1', 'a'], 'frozenset')" in obs, obs
    refused(*call(env, "tag", ids=[1, True]), "ids.1", "expected a number, got the boolean true")  # (not "given twice")
