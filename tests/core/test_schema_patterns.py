"""A schema tool's regular expressions (``pattern``, ``patternProperties``) cannot hang a worker:
Python's ``re`` backtracks without bound on a hostile argument (``^(a|a)*$`` on 40 a's and a "!"
takes a day) holding the GIL, where no timeout can stop it. The model's argument is refused instead,
naming it, and normal patterns validate as before."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import benchmax_gym
from benchmax_gym.core.tools import Tool, Toolset

HOSTILE_PATTERN = "^(a|a)*$"
HOSTILE_TEXT = "a" * 40 + "!"


def tags_schema(**keywords) -> dict:
    return {"type": "object", "properties": {"tags": {"type": "object", **keywords}}, "required": ["tags"]}


# name: (schema, hostile arguments, the start of the refusal)
CASES = {
    "pattern": (
        {"type": "object", "properties": {"code": {"type": "string", "pattern": HOSTILE_PATTERN}}},
        {"code": HOSTILE_TEXT}, "code: refused: matching the value against the pattern '^(a|a)*$' took over 0.1 s",
    ),
    "items": (
        {"type": "object", "properties": {"codes": {"type": "array", "items": {"type": "string", "pattern": HOSTILE_PATTERN}}}},
        {"codes": ["aa", HOSTILE_TEXT]}, "codes.1: refused: matching the value",
    ),
    "patternProperties": (
        tags_schema(patternProperties={HOSTILE_PATTERN: {"type": "string"}}),
        {"tags": {HOSTILE_TEXT: "x"}}, f"tags: refused: matching the property name {HOSTILE_TEXT!r}",
    ),
    "additionalProperties": (
        tags_schema(patternProperties={HOSTILE_PATTERN: {"type": "string"}}, additionalProperties=False),
        {"tags": {HOSTILE_TEXT: "x"}}, "tags: refused: matching the property name",
    ),
    "unevaluatedProperties": (
        tags_schema(allOf=[{"patternProperties": {HOSTILE_PATTERN: {"type": "string"}}}], unevaluatedProperties=False),
        {"tags": {HOSTILE_TEXT: "x"}}, "tags: refused: matching the property name",
    ),
    "propertyNames": (
        tags_schema(propertyNames={"pattern": HOSTILE_PATTERN}),
        {"tags": {HOSTILE_TEXT: "x"}}, "tags: refused: matching the property name",
    ),
}

SCRIPT = """
import json, sys
from benchmax_gym.core import tools as core_tools
from benchmax_gym.core.tools import Tool, Toolset
core_tools.PATTERN_TIME_LIMIT_S = 0.1  # (a quick test; 0.5 s by default)
cases = json.loads(sys.argv[1])
results = {}
for name, (schema, args, _) in cases.items():
    tools = Toolset([Tool.from_schema(name, "A tool.", schema, lambda **kw: "ran")])
    refused = tools.run(name, args, timeout=30, max_chars=2000)
    fine = json.loads(json.dumps(args).replace(sys.argv[2], "aaa"))
    after = tools.run(name, fine, timeout=30, max_chars=2000)  # the next call has its own time
    results[name] = [refused.content, refused.error, after.content]
print(json.dumps(results))
"""


def test_a_hostile_argument_is_refused_naming_it_never_a_hung_worker():
    root = Path(benchmax_gym.__file__).resolve().parents[1]
    try:  # HEAD: the first search never returned
        done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES), HOSTILE_TEXT], capture_output=True, text=True,
                              timeout=90, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    except subprocess.TimeoutExpired:
        pytest.fail("validating a hostile argument against a schema pattern hung the process")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    for name, (_, _, refusal) in CASES.items():
        content, error, after = results[name]
        assert error == "bad_arguments", (name, content)
        assert content.startswith(f"Error: bad arguments for '{name}': {refusal}"), (name, content)
        assert after == "ran", (name, after)


def run(t: Tool, args: dict):
    result = Toolset([t]).run(t.name, args, timeout=30, max_chars=2000)
    return result.content, result.error


def test_normal_patterns_validate_as_jsonschema_with_re_does():
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": r"^[A-Z][a-z]+(?: [A-Z][a-z]+)*$"},
            "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
            "headers": {"type": "object", "patternProperties": {"^X-[A-Za-z-]+$": {"type": "string"}},
                        "additionalProperties": False},
        },
        "required": ["city"],
    }
    t = Tool.from_schema("book", "Book a trip.", schema, lambda **kw: "booked")
    plain = jsonschema.Draft202012Validator(schema)
    for args in (
        {"city": "New York", "date": "2024-03-01", "headers": {"X-Trace": "1"}},
        {"city": "new york"},
        {"city": "Paris", "date": "2024-3-1"},
        {"city": "Paris", "headers": {"X-Trace": 1}},
        {"city": "Paris", "headers": {"Trace": "1"}},
        {"city": "Paris\n"},  # $ matches before a final newline, in re as in regex
    ):
        content, error = run(t, args)
        if plain.is_valid(args):
            assert (content, error) == ("booked", None), args
        else:
            errors = sorted(plain.iter_errors(args), key=lambda e: list(e.path))
            expected = "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" if e.path else e.message for e in errors)
            assert (content, error) == (f"Error: bad arguments for 'book': {expected}", "bad_arguments"), args
    assert run(t, {"city": "Paris\n"}) == ("booked", None)
    assert run(t, {"city": "Paris", "headers": {"Trace": "1"}})[0].endswith(
        "headers: 'Trace' does not match any of the regexes: '^X-[A-Za-z-]+$'")


def test_jsonschema_elsewhere_in_the_process_keeps_re():
    """The bound holds during a tool's validation only: other code's jsonschema runs as before."""
    Tool.from_schema("t", "A tool.", {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}},
                     lambda **kw: "")
    validator = jsonschema.Draft202012Validator({"type": "string", "pattern": r"^\p{L}+$"})
    with pytest.raises(re.error):  # re has no \p{...} (regex reads it as a Unicode property)
        validator.is_valid("abc")
