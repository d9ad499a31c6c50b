"""Tool-call formats: render -> parse round trips, final answers and malformed actions."""

import gc
import json
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmax_gym.core.formats import FORMATS, Parsed, ToolCall, ToolCallFormat, get_format

FORMAT_NAMES = sorted(FORMATS)

CALC = {
    "type": "object",
    "properties": {
        "expression": {"type": "string"},
        "note": {"type": "string"},
        "digits": {"type": "string"},
        "precision": {"type": "integer"},
        "scale": {"type": "number"},
        "exact": {"type": "boolean"},
        "options": {"type": "object"},
        "values": {"type": "array"},
    },
}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}}}
TOOLS = {"calculator": CALC, "search": SEARCH}

CALL_A = (
    "calculator",
    {
        "expression": "2**10 + √4",
        "note": "héllo 世界 😀 \"quoted\" and 'single' <b>tag</b>",
        "digits": "0042",  # a string that looks like a number stays a string
        "precision": 12,
        "scale": -0.125,
        "exact": False,
        "options": {"mode": "deg", "nested": {"list": [1, 2.5, None, True, "x"]}},
        "values": [1, [2, [3]], {"k": "v"}],
    },
)
CALL_B = ("search", {"query": "true", "k": 0})
CALL_EMPTY = ("search", {})


def fmt(name: str) -> ToolCallFormat:
    return get_format(name)


def names_and_args(parsed: Parsed):
    return [(c.name, c.arguments) for c in parsed.calls]


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize(
    "calls",
    [[CALL_A], [CALL_B], [CALL_EMPTY], [CALL_A, CALL_B], [CALL_B, CALL_A, CALL_EMPTY, CALL_B]],
    ids=["one", "strings-that-look-like-json", "no-arguments", "two", "four"],
)
def test_render_then_parse_round_trips(name, calls):
    f = fmt(name)
    text = f.render_calls(calls)
    assert isinstance(text, str)
    parsed = f.parse(text, 3, TOOLS)
    assert parsed.errors == []
    assert not parsed.is_final
    assert names_and_args(parsed) == calls
    assert parsed.content == ""
    # Call ids are unique within an action.
    ids = [c.id for c in parsed.calls]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("name", ["hermes", "json", "xml"])
def test_call_ids_default_to_turn_and_position(name):
    f = fmt(name)
    parsed = f.parse(f.render_calls([CALL_B, CALL_EMPTY, CALL_B]), 7, TOOLS)
    assert [c.id for c in parsed.calls] == ["call_7_0", "call_7_1", "call_7_2"]
    assert fmt(name).parse(f.render_calls([CALL_B]), 0, TOOLS).calls[0].id == "call_0_0"


def test_openai_ids_are_preserved_and_defaulted():
    action = json.dumps({
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "abc-123", "type": "function", "function": {"name": "search", "arguments": '{"query": "q"}'}},
            {"type": "function", "function": {"name": "search", "arguments": {"query": "r"}}},
            {"id": "", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        ],
    })
    parsed = fmt("openai").parse(action, 5)
    assert parsed.errors == []
    assert [c.id for c in parsed.calls] == ["abc-123", "call_5_1", "call_5_2"]
    assert names_and_args(parsed) == [("search", {"query": "q"}), ("search", {"query": "r"}), ("search", {})]
    assert parsed.content == ""


def test_openai_render_calls_is_an_assistant_message():
    msg = json.loads(fmt("openai").render_calls([CALL_A, CALL_B]))
    assert msg["role"] == "assistant"
    assert [tc["type"] for tc in msg["tool_calls"]] == ["function", "function"]
    # Arguments are a JSON string, as the OpenAI API returns them.
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == CALL_A[1]
    assert len({tc["id"] for tc in msg["tool_calls"]}) == 2


def test_xml_without_tools_json_decodes_every_value():
    f = fmt("xml")
    text = f.render_calls([("search", {"query": "true", "k": 3, "name": "plain words"})])
    parsed = f.parse(text, 1)
    # Without schemas, JSON-looking text is decoded; other text stays a string.
    assert names_and_args(parsed) == [("search", {"query": True, "k": 3, "name": "plain words"})]
    # With the schema, the string parameter stays a string.
    assert names_and_args(f.parse(text, 1, TOOLS)) == [("search", {"query": "true", "k": 3, "name": "plain words"})]


def test_xml_string_values_keep_inner_newlines_and_spaces():
    f = fmt("xml")
    value = "\n  line one\n\n    line two  \n"
    parsed = f.parse(f.render_calls([("search", {"query": value})]), 1, TOOLS)
    assert parsed.calls[0].arguments == {"query": value}


def test_xml_optional_string_parameter_stays_a_string():
    from typing import Optional

    from benchmax_gym.core.tools import Toolset, tool

    @tool
    def lookup(query: Optional[str] = None) -> str:
        """Look up a query."""
        return query or ""

    f = fmt("xml")
    text = "<tool_call>\n<function=lookup>\n<parameter=query>\n42\n</parameter>\n</function>\n</tool_call>"
    parsed = f.parse(text, 1, {"lookup": lookup.parameters})
    assert parsed.calls[0].arguments == {"query": "42"}
    result = Toolset([lookup]).run("lookup", parsed.calls[0].arguments, timeout=5, max_chars=100)
    assert result.error is None


# -- final answers ---------------------------------------------------------------------------

PROSE = [
    "The answer is 42.",
    "  Thé ànswer is \\boxed{7} 😀 — 四十二\n",
    "<answer>7</answer>",
    "",
]


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("text", PROSE)
def test_plain_prose_is_a_final_answer(name, text):
    parsed = fmt(name).parse(text, 1)
    assert parsed.is_final
    assert parsed.calls == [] and parsed.errors == []
    assert parsed.content == text.strip()


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_instructions_name_every_tool(name):
    schemas = [
        {"type": "function", "function": {"name": n, "description": f"does {n}", "parameters": p}}
        for n, p in TOOLS.items()
    ]
    text = fmt(name).instructions(schemas)
    assert isinstance(text, str)
    for n in TOOLS:
        assert n in text


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_render_results_contains_each_result(name):
    results = [("call_1_0", "calculator", "1024"), ("call_1_1", "search", "no hits for «x»")]
    text = fmt(name).render_results(results)
    for _, _, content in results:
        assert content in text or json.dumps(content) in text


@pytest.mark.parametrize("name", ["json", "openai"])
def test_json_results_carry_ids_and_names(name):
    results = [("call_1_0", "calculator", "1024"), ("id-9", "search", "ünïcode")]
    assert json.loads(fmt(name).render_results(results)) == [
        {"tool_call_id": "call_1_0", "name": "calculator", "content": "1024"},
        {"tool_call_id": "id-9", "name": "search", "content": "ünïcode"},
    ]


def test_get_format():
    assert isinstance(get_format("hermes"), FORMATS["hermes"])
    assert set(FORMATS) == {"hermes", "json", "openai", "xml"}
    for name, cls in FORMATS.items():
        assert cls.name == name
        assert isinstance(get_format(name), ToolCallFormat)
    instance = FORMATS["xml"]()
    assert get_format(instance) is instance


def test_get_format_unknown_name_lists_choices():
    with pytest.raises(ValueError) as info:
        get_format("nope")
    message = str(info.value)
    assert "nope" in message
    for name in FORMATS:
        assert name in message


def test_tool_call_to_openai():
    call = ToolCall("call_1_0", "search", {"query": "ü"})
    entry = call.to_openai()
    assert entry["id"] == "call_1_0" and entry["type"] == "function"
    assert entry["function"]["name"] == "search"
    assert json.loads(entry["function"]["arguments"]) == {"query": "ü"}
    assert ToolCall("x", "f", '{"a": 1}').to_openai()["function"]["arguments"] == '{"a": 1}'


# -- hermes ----------------------------------------------------------------------------------

H = fmt("hermes")


def test_hermes_text_around_calls_is_content():
    action = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>\nThen done.'
    parsed = H.parse(action, 1)
    assert names_and_args(parsed) == [("calculator", {"expression": "1+1"})]
    assert parsed.errors == []
    assert "Let me compute." in parsed.content and "Then done." in parsed.content
    assert "tool_call" not in parsed.content


def test_hermes_broken_json_body():
    parsed = H.parse('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', 1)
    assert parsed.calls == []
    assert len(parsed.errors) == 1 and "JSON" in parsed.errors[0]
    assert not parsed.is_final


def test_hermes_missing_name():
    for body in ('{"arguments": {"x": 1}}', '{"name": "", "arguments": {}}', '{"name": 5, "arguments": {}}'):
        parsed = H.parse(f"<tool_call>{body}</tool_call>", 1)
        assert parsed.calls == []
        assert len(parsed.errors) == 1 and "name" in parsed.errors[0]


def test_hermes_arguments_as_json_string_accepted():
    parsed = H.parse('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"q\\", \\"k\\": 2}"}</tool_call>', 1)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("search", {"query": "q", "k": 2})]


def test_hermes_empty_or_missing_arguments_mean_none():
    for body in ('{"name": "search"}', '{"name": "search", "arguments": ""}', '{"name": "search", "arguments": "  "}'):
        parsed = H.parse(f"<tool_call>{body}</tool_call>", 1)
        assert parsed.errors == []
        assert names_and_args(parsed) == [("search", {})]


def test_hermes_parameters_key_is_accepted():
    parsed = H.parse('<tool_call>{"name": "search", "parameters": {"query": "q"}}</tool_call>', 1)
    assert names_and_args(parsed) == [("search", {"query": "q"})]


def test_hermes_arguments_string_invalid_json_is_error():
    parsed = H.parse('<tool_call>{"name": "search", "arguments": "{query: q"}</tool_call>', 1)
    assert parsed.calls == []
    assert len(parsed.errors) == 1
    assert "search" in parsed.errors[0] and "JSON" in parsed.errors[0]


def test_hermes_unclosed_final_call_with_valid_body_is_accepted():
    parsed = H.parse('I will search.\n<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n', 2)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("search", {"query": "q"})]
    assert parsed.calls[0].id == "call_2_0"
    assert parsed.content == "I will search."


def test_hermes_unclosed_final_call_after_closed_ones():
    action = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}'
    )
    parsed = H.parse(action, 1)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("a", {}), ("b", {"x": 1})]
    assert [c.id for c in parsed.calls] == ["call_1_0", "call_1_1"]


def test_hermes_unclosed_final_call_with_invalid_body_is_error():
    parsed = H.parse('<tool_call>\n{"name": "search", "argu', 1)
    assert parsed.calls == []
    assert len(parsed.errors) == 1
    assert not parsed.is_final


def test_hermes_stray_closing_tag_is_error():
    parsed = H.parse('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n</tool_call>', 1)
    assert names_and_args(parsed) == [("a", {})]
    assert any("</tool_call>" in e for e in parsed.errors)


def test_hermes_nested_opening_tags_are_error():
    parsed = H.parse('<tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>', 1)
    assert parsed.calls == []
    assert parsed.errors
    assert not parsed.is_final


def test_hermes_list_of_calls_in_one_tag():
    parsed = H.parse('<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b"}]</tool_call>', 4)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("a", {"x": 1}), ("b", {})]
    assert [c.id for c in parsed.calls] == ["call_4_0", "call_4_1"]


def test_hermes_list_with_a_bad_entry_keeps_the_good_ones():
    parsed = H.parse('<tool_call>[{"name": "a"}, 7, {"arguments": {}}]</tool_call>', 1)
    assert names_and_args(parsed) == [("a", {})]
    assert len(parsed.errors) == 2


def test_hermes_body_not_an_object_is_error():
    for body in ("5", '"search"', "null"):
        parsed = H.parse(f"<tool_call>{body}</tool_call>", 1)
        assert parsed.calls == [] and len(parsed.errors) == 1


def test_hermes_code_fence_inside_tag():
    parsed = H.parse('<tool_call>\n```json\n{"name": "a", "arguments": {"x": [1]}}\n```\n</tool_call>', 1)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("a", {"x": [1]})]


def test_hermes_openai_shaped_entry():
    parsed = H.parse('<tool_call>{"type": "function", "function": {"name": "a", "arguments": "{\\"x\\": 2}"}}</tool_call>', 1)
    assert names_and_args(parsed) == [("a", {"x": 2})]


def test_hermes_good_and_bad_calls_together():
    action = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        "<tool_call>{oops}</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    parsed = H.parse(action, 1)
    assert names_and_args(parsed) == [("a", {}), ("b", {})]
    assert [c.id for c in parsed.calls] == ["call_1_0", "call_1_1"]
    assert len(parsed.errors) == 1


@pytest.fixture
def no_stray_finalizers():
    """An earlier test's garbage, collected while the parser is a thousand frames deep, runs its
    finalizers there and fails them with RecursionError (pytest reports it as this test's): collect
    it first, and let no collection start during the parse."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.mark.usefixtures("no_stray_finalizers")
@pytest.mark.parametrize("name", ["hermes", "json", "openai"])
def test_deeply_nested_arguments_string_does_not_raise(name):
    args = "[" * 100_000
    call = {"name": "a", "arguments": args}
    action = {
        "hermes": "<tool_call>" + json.dumps(call) + "</tool_call>",
        "json": json.dumps(call),
        "openai": json.dumps({"tool_calls": [{"id": "x", "function": call}]}),
    }[name]
    parsed = fmt(name).parse(action, 1)
    assert parsed.calls == [] and len(parsed.errors) == 1


@pytest.mark.usefixtures("no_stray_finalizers")
@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_deeply_nested_action_does_not_raise(name):
    for action in ("[" * 100_000, "{" * 100_000, '{"a":' * 50_000, "<tool_call>" + "[" * 100_000 + "</tool_call>"):
        parsed = fmt(name).parse(action, 1)
        assert isinstance(parsed, Parsed)


# -- json ------------------------------------------------------------------------------------

J = fmt("json")


def test_json_bare_object():
    parsed = J.parse('  {"name": "search", "arguments": {"query": "q"}}\n', 2)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("search", {"query": "q"})]
    assert parsed.calls[0].id == "call_2_0"


def test_json_list_of_calls():
    parsed = J.parse('[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": 2}"}]', 1)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("a", {"x": 1}), ("b", {"y": 2})]
    assert [c.id for c in parsed.calls] == ["call_1_0", "call_1_1"]


@pytest.mark.parametrize("fence", ["```json\n{}\n```", "```\n{}\n```", "  ```json {}```  "])
def test_json_code_fence(fence):
    call = '{"name": "search", "arguments": {"query": "fenced"}}'
    parsed = J.parse(fence.replace("{}", call), 1)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("search", {"query": "fenced"})]


def test_json_invalid_json_with_name_is_error():
    parsed = J.parse('{"name": "search", "arguments": {"query": "q"}', 1)
    assert parsed.calls == []
    assert len(parsed.errors) == 1 and "JSON" in parsed.errors[0]


def test_json_prose_starting_with_brace_is_final():
    for text in ("{x | x > 0} is the set of positive numbers.", "[1] Smith et al. showed it."):
        parsed = J.parse(text, 1)
        assert parsed.is_final
        assert parsed.content == text


@pytest.mark.parametrize("text", ['["Paris", "Lyon"]', "[42]", "[]", '[null, 1.5, "x"]'])
def test_json_list_of_values_is_a_final_answer(text):
    parsed = J.parse(text, 1)
    assert parsed.is_final and parsed.content == text


@pytest.mark.parametrize("text", ['[{"arguments": {}}]', '[{"name": "a", "arguments": {}}, 3]'])
def test_json_list_with_an_object_that_is_not_a_call_is_an_error(text):
    parsed = J.parse(text, 1)
    assert not parsed.is_final and parsed.errors


def test_json_object_without_name_is_final():
    text = '{"answer": 42, "reasoning": "because"}'
    parsed = J.parse(text, 1)
    assert parsed.is_final
    assert parsed.content == text


@pytest.mark.parametrize(
    "text",
    [
        '{"arguments": {"x": 1}}',
        '[{"name": "a"}, {"arguments": {}}]',
        '[{"name": "a"}, 3]',
        '{"name": 7, "arguments": {}}',
        '{"name": "a", "arguments": "{not json"}',
    ],
)
def test_json_malformed_calls_are_errors(text):
    parsed = J.parse(text, 1)
    assert parsed.errors
    assert not parsed.is_final


# -- openai ----------------------------------------------------------------------------------

O = fmt("openai")


def test_openai_message_with_content_and_calls():
    action = json.dumps({
        "role": "assistant",
        "content": "  Let me look.  ",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "ü"}'}}],
    }, ensure_ascii=False)
    parsed = O.parse(action, 1)
    assert parsed.errors == []
    assert names_and_args(parsed) == [("search", {"query": "ü"})]
    assert parsed.content == "Let me look."


def test_openai_content_only_message_is_final():
    parsed = O.parse(json.dumps({"role": "assistant", "content": "The answer is 4.", "tool_calls": []}), 1)
    assert parsed.is_final
    assert parsed.content == "The answer is 4."
    parsed = O.parse(json.dumps({"role": "assistant", "content": "Done.", "tool_calls": None}), 1)
    assert parsed.is_final and parsed.content == "Done."


def test_openai_non_json_text_is_final():
    parsed = O.parse("  Just words, no JSON.  ", 1)
    assert parsed.is_final
    assert parsed.content == "Just words, no JSON."


def test_openai_invalid_json_starting_with_brace_is_error():
    parsed = O.parse('{"role": "assistant", "tool_calls": [', 1)
    assert parsed.calls == []
    assert len(parsed.errors) == 1 and "JSON" in parsed.errors[0]


def test_openai_tool_calls_not_a_list_is_error():
    parsed = O.parse(json.dumps({"role": "assistant", "tool_calls": {"function": {"name": "a"}}}), 1)
    assert parsed.calls == []
    assert parsed.errors and "list" in parsed.errors[0]


def test_openai_bad_entries_are_errors():
    action = json.dumps({"tool_calls": [
        7,
        {"id": "x", "function": {"arguments": "{}"}},
        {"id": "y", "function": {"name": "a", "arguments": "{bad"}},
        {"id": "z", "function": {"name": "ok", "arguments": "{}"}},
    ]})
    parsed = O.parse(action, 1)
    assert names_and_args(parsed) == [("ok", {})]
    assert parsed.calls[0].id == "z"
    assert len(parsed.errors) == 3


# -- xml -------------------------------------------------------------------------------------

X = fmt("xml")


def test_xml_multiple_functions_and_surrounding_text():
    action = (
        "I'll use two tools.\n<tool_call>\n<function=search>\n<parameter=query>\nweather in Zürich\n</parameter>\n"
        "<parameter=k>\n5\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=calculator>\n<parameter=options>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>"
    )
    parsed = X.parse(action, 3, TOOLS)
    assert parsed.errors == []
    assert names_and_args(parsed) == [
        ("search", {"query": "weather in Zürich", "k": 5}),
        ("calculator", {"options": {"a": [1, 2]}}),
    ]
    assert [c.id for c in parsed.calls] == ["call_3_0", "call_3_1"]
    assert parsed.content == "I'll use two tools."


def test_xml_missing_closing_function_is_error():
    parsed = X.parse("<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</tool_call>", 1, TOOLS)
    assert parsed.calls == []
    assert len(parsed.errors) == 1 and "</function>" in parsed.errors[0]
    assert not parsed.is_final


def test_xml_missing_closing_after_a_good_call():
    action = "<function=search>\n</function>\n<function=calculator>\n<parameter=expression>\n1\n</parameter>\n"
    parsed = X.parse(action, 1, TOOLS)
    assert names_and_args(parsed) == [("search", {})]
    assert len(parsed.errors) == 1


@pytest.mark.parametrize("name", ["", "  "])
def test_xml_empty_name_is_error(name):
    parsed = X.parse(f"<function={name}>\n<parameter=x>\n1\n</parameter>\n</function>", 1)
    assert parsed.calls == []
    assert len(parsed.errors) == 1 and "name" in parsed.errors[0]


def test_xml_invalid_json_value_stays_text():
    parsed = X.parse("<function=calculator>\n<parameter=options>\n{not json\n</parameter>\n</function>", 1, TOOLS)
    assert parsed.calls[0].arguments == {"options": "{not json"}


# -- robustness: parse never raises ----------------------------------------------------------

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<tool_call>\n", "{", "}", "[", "]", '"', ":", ",", "\\", "\n", " ",
    '"name"', '"arguments"', '"parameters"', '"function"', '"tool_calls"', '"id"', '"content"',
    '"calculator"', '"1+1"', "null", "true", "1", "-2.5e3", '""', '"\\u0000"', '"\\ud800"',
    "```", "```json", "<function=", "<function=calculator>", "</function>", "<parameter=",
    "<parameter=expression>", "</parameter>", ">", "=", "😀", "漢字", "\u202e", "\x00",
]

junk = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=40).map("".join)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=15,
)
call_objects = st.fixed_dictionaries(
    {"name": st.one_of(st.text(max_size=10), st.integers(), st.none())},
    optional={
        "arguments": st.one_of(json_values, json_values.map(json.dumps), st.text(max_size=10)),
        "function": st.dictionaries(st.sampled_from(["name", "arguments"]), json_values, max_size=2),
        "id": st.one_of(st.text(max_size=5), st.integers()),
    },
)


@st.composite
def tool_call_shaped(draw):
    """Near-miss actions: real call structures, wrapped and then damaged."""
    calls = draw(st.lists(call_objects, max_size=3))
    body = json.dumps(calls if draw(st.booleans()) else (calls[0] if calls else {}))
    wrapper = draw(st.sampled_from([
        "<tool_call>{}</tool_call>", "<tool_call>{}", "{}</tool_call>", "```json\n{}\n```", "{}",
        '{{"role": "assistant", "tool_calls": {}}}', "<function={}>", "<tool_call><tool_call>{}</tool_call>",
    ]))
    text = wrapper.replace("{}", body, 1) if wrapper != "{}" else body
    if text and draw(st.booleans()):  # cut or splice somewhere
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(junk) + text[i + draw(st.integers(0, 3)):]
    return text


def _check_parse(name, text):
    parsed = fmt(name).parse(text, 1, TOOLS)
    assert isinstance(parsed, Parsed)
    assert isinstance(parsed.content, str)
    assert all(isinstance(e, str) and e for e in parsed.errors)
    for c in parsed.calls:
        assert isinstance(c.name, str) and c.name
        assert isinstance(c.id, str) and c.id
    assert parsed.is_final == (not parsed.calls and not parsed.errors)


@pytest.mark.parametrize("name", FORMAT_NAMES)
@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_parse_never_raises_on_arbitrary_text(name, text):
    _check_parse(name, text)


@pytest.mark.parametrize("name", FORMAT_NAMES)
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(junk, tool_call_shaped()))
def test_parse_never_raises_on_tool_call_shaped_junk(name, text):
    _check_parse(name, text)


@pytest.mark.parametrize("name", ["hermes", "json", "openai"])
@settings(max_examples=100, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.text(min_size=1, max_size=12), st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
        min_size=1,
        max_size=3,
    )
)
def test_round_trip_property(name, calls):
    # Hermes delimits calls with tags, so a call that contains its own end tag cannot round-trip.
    if name == "hermes" and "</tool_call>" in json.dumps(calls, ensure_ascii=False):
        return
    parsed = fmt(name).parse(fmt(name).render_calls(calls), 1)
    assert parsed.errors == []
    assert names_and_args(parsed) == [(n, a) for n, a in calls]


# A parameter reading "null" (any case) is JSON's null even for a string parameter, on purpose
# (XmlFormat._convert, as vLLM's qwen3_coder parser): such text cannot round-trip as a string.
xml_safe_text = st.text(st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=20).filter(
    lambda s: s.strip().lower() != "null"
)
xml_names = st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="_."), min_size=1, max_size=10)


@settings(max_examples=100, deadline=None)
@given(
    calls=st.lists(
        st.tuples(xml_names, st.dictionaries(xml_names, st.one_of(xml_safe_text, json_values), max_size=4)),
        min_size=1,
        max_size=3,
    )
)
def test_xml_round_trip_property(calls):
    # Values that contain "<" could contain "</parameter>"; keep those out of strings.
    calls = [(n, a) for n, a in calls if "<" not in json.dumps(a, ensure_ascii=False)]
    if not calls:
        return
    f = fmt("xml")
    tools = {}
    for n, a in calls:
        props = tools.setdefault(n, {"type": "object", "properties": {}})["properties"]
        for k, v in a.items():
            props[k] = {"type": "string"} if isinstance(v, str) else {}
    # The same tool may appear twice with the same key holding a string once and not the other time.
    for n, a in calls:
        for k, v in a.items():
            if (tools[n]["properties"][k] == {"type": "string"}) != isinstance(v, str):
                return
    parsed = f.parse(f.render_calls(calls), 1, tools)
    assert parsed.errors == []
    assert names_and_args(parsed) == calls


# -- performance bug: catastrophic backtracking ---------------------------------------------


def test_code_fence_with_long_whitespace_parses_quickly():
    code = textwrap.dedent(
        """
        from benchmax_gym.core.formats import get_format
        get_format("json").parse("```" + " " * 5000 + "x", 1)
        get_format("hermes").parse("<tool_call>```" + " " * 5000 + "x", 1)
        """
    )
    # A generous bound (the import included, on a loaded machine): fixed, the parse takes milliseconds;
    # with the bug, tens of minutes.
    try:
        subprocess.run([sys.executable, "-c", code], timeout=60, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail("parse() of a 5,000-character action did not finish in 60 s")


def test_hermes_closing_tag_without_opening_is_a_parse_error():
    parsed = get_format("hermes").parse('{"name": "calc", "arguments": {}}</tool_call>', 1)
    assert parsed.errors and not parsed.calls and not parsed.is_final


def test_openai_non_message_json_is_the_final_answer():
    parsed = get_format("openai").parse('{"answer": 3}', 1)
    assert parsed.is_final and parsed.content == '{"answer": 3}'
    assert get_format("openai").parse('{"role": "assistant", "tool_calls": {}}', 1).errors


def test_json_empty_list_is_a_final_answer():
    assert get_format("json").parse("[]", 1).is_final


@pytest.mark.parametrize("tool_format, junk", [
    ("hermes", "<tool_call>"), ("hermes", "<tool_call>{"), ("xml", "<function="), ("xml", "<function=a>"),
    ("xml", "<function=a><parameter=b>"), ("xml", "<function=a\n>"), ("json", "{\"name\": "),
    ("openai", "{\"tool_calls\": ["),
])
@pytest.mark.timeout(60)  # a hang guard: linear parsing takes well under a second
def test_hostile_actions_parse_in_linear_time(tool_format, junk):
    """Repeated opening tags that never close: 256k characters took 48 s with a lazy regex, so
    the 2M here would take about an hour."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401

    env = gym.make("benchmax/Math-v0", tool_format=tool_format, max_action_chars=2_100_000, python_tool=False)
    env.reset(seed=0)
    *_, info = env.step(junk * (2_048_000 // len(junk)))
    assert info["error"] == "parse_error"
    env.close()


TAG_SOUP = st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                                     "</parameter>", ">", "\n", "a", "{\"name\": \"calculator\", \"arguments\": {}}",
                                     " "]), max_size=30).map("".join)


@given(TAG_SOUP)
@settings(max_examples=400, deadline=None)
def test_tag_scanner_finds_what_the_lazy_regexes_find(text):
    from benchmax_gym.core.formats import _tagged

    plain = [(m.group(1), m.start(), m.end()) for m in re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)]
    assert [(b, s, e) for _, b, s, e in _tagged(text, "<tool_call>", "</tool_call>")] == plain
    named = [(m.group(1), m.group(2), m.start(), m.end())
             for m in re.finditer(r"<function=([^>\n]*)>(.*?)</function>", text, re.DOTALL)]
    assert list(_tagged(text, "<function=", "</function>", named=True)) == named


@pytest.mark.parametrize("message, says", [
    ('{"role": "user", "content": "4"}', '"role" must be "assistant"'),
    ('{"role": "assistant", "content": 5}', '"content" must be text or null'),
    ('{"content": ["4"]}', '"content" must be text or null'),
])
def test_an_openai_message_of_another_role_or_with_content_that_is_not_text_is_said_to_be_wrong(message, says):
    """Such a message was taken as the final answer (its content, or nothing) and graded; it is a
    malformed action, answered with what is wrong, and the episode goes on."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401

    parsed = fmt("openai").parse(message, 0)
    assert parsed.calls == [] and any(says in e for e in parsed.errors)
    env = gym.make("benchmax/Math-v0", tool_format="openai", python_tool=False)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(message)
    assert says in obs and not terminated and not truncated and reward == 0
    env.close()
