"""Tools: Python functions the model calls by writing text.

``@tool`` turns a function into a :class:`Tool` whose JSON schema (OpenAI function format) is
built from the signature, type hints and the docstring's argument descriptions (Google's
``Args:``, NumPy's ``Parameters`` section or reST's ``:param x:``). Arguments are
validated with pydantic before the call, so a wrong type or a missing argument becomes a tool
error message, never an exception in the environment. The tool gets its own types: an ``Enum``
member, a ``tuple``, a ``set`` (a list's repeats dropped), a dataclass or pydantic model instance,
a ``datetime`` from an ISO 8601 string (never from a number). A parameter whose default is
``None`` takes ``null`` (``limit: int = None`` is ``int | None``); any other default must be a
value of its type, and a type pydantic cannot read or show as JSON Schema (a plain class, a
``Callable``), like ``*args``, ``**kwargs`` and positional-only parameters, fails where the tool
is built (``register_tool_env``), naming the tool and the parameter. Its lax conversions of strings that spell
the value exactly stay, since models send them (``"3"``, ``" 3 "`` or ``"3.0"`` for an int,
``"1e3"`` for a float, ``"true"``/``"yes"``/``"1"`` for a bool), as does a whole float for an int
(``3.0``: JSON Schema's integer too); what is not exact is refused (``"3.5"`` or ``3.5`` for an
int, ``"0x10"``). A boolean is never a number nor a number a boolean (in ``Annotated``,
``Literal`` and ``Enum`` too), and NaN and infinities are never a number (``json.loads`` reads ``NaN``; a
:meth:`Tool.from_schema` tool refuses them as well), as JSON Schema has it. The same rules hold
in the fields of a pydantic model or ``TypedDict`` parameter, and of the models and TypedDicts in
them; the tool still gets its own classes. Not in a dataclass's fields, nor where a model holds
its own class (a tree's children): pydantic's lax rules stay there.

A tool may take a parameter named ``episode``: the engine passes the running
:class:`~benchmax_gym.core.env.Episode` (per-episode state, workspace), and the parameter is
hidden from the schema; one named ``state`` receives what the environment's ``setup(task,
episode)`` returned for this episode (see :class:`~benchmax_gym.core.env.ToolEnv`). Tools may be
sync or ``async``. An async tool must not block (``time.sleep``, a CPU loop, a blocking client):
asyncio cannot stop it before its next ``await``, so such a call holds the step past its timeout,
and its result then comes back as ``tool_timeout``; give blocking work a sync tool (run in a
thread, abandoned at its timeout) or ``await asyncio.to_thread(...)``.

A terminal tool (``@tool(terminal=True)``: "submit", "transfer to a human") ends the episode
once a call to it has run without error: the rubric scores the episode at that step. Calls after
it in the same reply are not run (each gets a ``not_run`` result); a terminal call refused for
bad arguments, or that raised, is an ordinary error and the episode goes on.

Example::

    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: first addend
            b: second addend
        \"\"\"
        return a + b
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import datetime
import enum
import functools
import inspect
import json
import math
import os
import queue
import re
import threading
import time
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pydantic

from benchmax_gym.core.outcomes import FAILURES
from benchmax_gym.core.warn import warn

INJECTED = ("episode", "state")

#: what ``Tool.from_schema(..., lenient=True)`` reads a catalogue's non-standard type names as
#: (None: no constraint)
TYPE_ALIASES: dict[str, str | None] = {
    "dict": "object", "float": "number", "tuple": "array", "any": None,
    "int": "integer", "str": "string", "bool": "boolean", "list": "array",
}
_JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


class ToolSchemaError(ValueError):
    """A tool's JSON schema is not a valid one: raised where the tool is built (so at
    ``register_tool_env`` or ``gym.make``), in one line naming the tool, the place in the schema
    and the problem."""


class ToolError(Exception):
    """Raised by a tool to report a clean, model-readable error (no traceback)."""

    def __init__(self, message: str, code: str = "tool_error"):
        super().__init__(message)
        self.code = code


class ToolFailure(Exception):
    """Raised by a tool (or the machinery under it) for a failure that is not the model's: its
    backend is gone (``tool_unavailable``), it overran for reasons not the input's
    (``tool_timeout``), the environment broke (``env_error``), the episode's deadline passed
    (``deadline``). The call's result carries ``outcome`` and the engine ends the episode with it
    (see :mod:`benchmax_gym.core.outcomes`); a :class:`ToolError` is the model's and scored."""

    def __init__(self, message: str, outcome: str):
        if outcome not in FAILURES:  # (a typo, or "scored", would put a NaN reward in the signal)
            raise ValueError(f"outcome must be one of {sorted(FAILURES)}, got {outcome!r}")
        super().__init__(message)
        self.outcome = outcome


class ArgumentError(ToolError):
    def __init__(self, message: str):
        super().__init__(message, code="bad_arguments")


@dataclass(slots=True)
class ToolResult:
    """What one call produced: text for the model, and an error code when it failed."""

    content: str
    error: str | None = None
    #: a failure that is not the model's (a :class:`FailedResult`) ends the episode with it; a
    #: class attribute, so that the ordinary result costs nothing more to make
    outcome: ClassVar[str | None] = None


_DIRECT_INPUTS = frozenset({"is_async", "inline", "self_timed", "wants_episode", "wants_state"})
_CALL_INPUTS = frozenset({"fn", "validate", "name"})


class FailedResult(ToolResult):
    """The result of a call that failed for a reason not the model's (:class:`ToolFailure`)."""

    __slots__ = ("outcome",)

    def __init__(self, content: str, outcome: str):
        super().__init__(content, outcome)
        self.outcome = outcome


@dataclass
class Tool:
    """A callable the model may invoke. Build with :func:`tool` or :meth:`Tool.from_schema`.

    Attributes:
        name / description / parameters: the OpenAI function schema parts.
        fn: the implementation, sync or async.
        validate: turns raw JSON arguments into the keyword arguments for ``fn`` or raises
            :class:`ArgumentError`.
        inline: a sync tool whose work is bounded by construction (e.g. the calculator) runs
            directly in the caller's thread; other sync tools run in a thread so the per-call
            timeout can be enforced.
        self_timed: a tool that enforces its own time limit (the sandboxed ``python``, MCP
            calls, which must restart a server that overran): the engine adds no timeout; a sync
            one is called directly by ``step`` and in a thread by ``astep``.
        wants_episode: pass the running episode as ``episode=``.
        wants_state: pass what the environment's ``setup`` returned for the episode as ``state=``.
        terminal: a call that runs without error ends the episode (the rubric scores it then).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    validate: Callable[[dict[str, Any]], dict[str, Any]]
    inline: bool = False
    wants_episode: bool = False
    self_timed: bool = False
    wants_state: bool = False
    terminal: bool = False
    is_async: bool = field(init=False)

    def __post_init__(self):
        self.is_async = _is_async(self.fn)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        d = self.__dict__
        if name in _DIRECT_INPUTS:  # ``direct`` is kept up to date, not computed at every step
            object.__setattr__(self, "direct", not d.get("is_async", False) and bool(d.get("inline") or d.get(
                "self_timed")) and not d.get("wants_episode") and not d.get("wants_state"))
        elif name in _CALL_INPUTS and "invoke" in d:
            del d["invoke"]  # made for the old function or validator

    #: Called directly in the caller's thread by ``step``: sync, and inline or self-timed,
    #: without the episode (a calculator, the sandboxed ``python``). Follows the fields it reads.
    direct: ClassVar[bool]
    #: :func:`run_direct_text` for this tool, in one frame (``@tool`` makes one for a function of
    #: one plain argument); None: that function. Dropped when ``fn``, ``validate`` or ``name`` change.
    invoke: ClassVar[Callable[["Tool", dict[str, Any], float, int], Any] | None] = None

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools=[...]`` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @classmethod
    def from_schema(
        cls,
        name: str,
        description: str,
        parameters: Mapping[str, Any] | None,
        fn: Callable[..., Any],
        *,
        inline: bool = False,
        wants_episode: bool = False,
        wants_state: bool | None = None,
        terminal: bool = False,
        lenient: bool = False,
    ) -> "Tool":
        """A tool described by a JSON schema (a catalogue's, an MCP server's, a benchmax env's);
        calls are validated with jsonschema and ``fn(**arguments)`` is called.

        The schema is checked here against its draft's metaschema (``$schema``, else 2020-12):
        an unknown type, a malformed ``required``, a top level that is not an object raise
        :class:`ToolSchemaError`, naming the tool, the place and the problem. ``lenient=True``
        first reads well-known non-standard type names (:data:`TYPE_ALIASES`: ``dict`` as
        ``object``, ``float`` as ``number``, ``tuple`` as ``array``, ``any`` as no constraint)
        with a warning; the model is shown the corrected schema. ``wants_state``: pass the
        episode's setup state as ``state=`` (default: when ``fn`` has a ``state`` parameter the
        schema does not describe). A schema argument named ``episode`` (or ``state``) with
        ``wants_episode`` (``wants_state``) raises :class:`ToolSchemaError`: the engine's value
        would overwrite the model's.

        Example::

            schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
            weather = Tool.from_schema("weather", "Today's weather in a city.", schema,
                                       lambda city: f"Sunny in {city}")
        """
        params = check_schema(name, parameters, lenient=lenient)
        validator = jsonschema_validator(params)
        properties = params.get("properties") or {}
        if wants_state is None:
            wants_state = _takes(fn, "state") and "state" not in properties
        for injected, wanted in (("episode", wants_episode), ("state", wants_state)):
            if wanted and injected in properties:  # the engine's value would replace the model's argument
                raise ToolSchemaError(f"tool {name!r}: its schema has an argument named {injected!r}, which the "
                                      f"engine passes as {injected}= (wants_{injected}=True); pass it another way")

        def validate(args: dict[str, Any]) -> dict[str, Any]:
            if validator.is_valid(args):  # the common case, without collecting and sorting errors
                return args
            errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
            if errors:
                raise ArgumentError("; ".join(_jsonschema_message(e) for e in errors[:5]))
            return args

        if _has_patterns(params):
            validate = _patterns_bounded(validate)

        return cls(
            name=name, description=description, parameters=params, fn=fn, validate=validate,
            inline=inline, wants_episode=wants_episode, wants_state=wants_state, terminal=terminal,
        )


def _underlying(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What ``fn`` runs: the function under its ``functools.partial`` s, or a callable object's
    ``__call__`` (its name, docstring and type hints are the tool's; a partial's own are
    ``functools.partial``'s, an object's hints are its class's fields)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not inspect.isroutine(fn) and not isinstance(fn, type) and callable(fn):
        return type(fn).__call__
    return fn


def _is_async(fn: Callable[..., Any]) -> bool:
    """``fn`` returns a coroutine: an ``async def`` function, also under a partial, or an object
    whose ``__call__`` is one (which ``inspect.iscoroutinefunction`` misses before Python 3.13)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(_underlying(fn))


def _takes(fn: Callable[..., Any], parameter: str) -> bool:
    try:
        return parameter in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def jsonschema_validator(schema: dict[str, Any]):
    """A validator for a checked schema, of the draft it names (2020-12 when it names none), for
    which NaN and infinities are no ``number``: JSON has none, but ``json.loads`` reads them."""
    import jsonschema

    draft = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    finite = _FINITE_DRAFTS.get(draft)
    if finite is None:
        checker = draft.TYPE_CHECKER

        def is_finite_number(_checker: Any, instance: Any) -> bool:
            return checker.is_type(instance, "number") and not (
                type(instance) is float and not math.isfinite(instance))

        finite = _FINITE_DRAFTS[draft] = jsonschema.validators.extend(
            draft, type_checker=checker.redefine("number", is_finite_number))
    return finite(schema)


#: each draft's validator class with finite numbers (made once: a class per tool would cost milliseconds)
_FINITE_DRAFTS: dict[type, type] = {}

PATTERN_TIME_LIMIT_S = 0.5
"""The time a call's arguments may take, in all, to match its schema's ``pattern`` and
``patternProperties`` regular expressions; past it the argument is refused (legitimate ones take
microseconds). Python's ``re`` backtracks without bound (``^(a|a)*$`` on 40 a's and a "!": a day),
holding the GIL, where no timeout can stop it; so within a call's validation jsonschema's searches
run on the ``regex`` engine, which gives up at a time limit (:func:`_patterns_bounded`)."""

_pattern_deadline = threading.local()  # .at: the monotonic time this thread's validation gives up matching


class _PatternTimeout(Exception):
    def __init__(self, pattern: str, text: str):
        super().__init__(pattern)
        self.pattern, self.text = pattern, text


@functools.lru_cache(maxsize=1024)
def _bounded_pattern(pattern: str) -> Any:
    """``pattern`` compiled by ``regex`` in its ``re``-compatible syntax; None if it cannot be."""
    import regex

    try:
        return regex.compile(pattern, regex.VERSION0)
    except Exception:
        return None


class _BoundedRe(types.ModuleType):
    """What jsonschema's keyword modules see as ``re``: they call ``re.search(pattern, text)``
    for ``pattern``, ``patternProperties``, ``additionalProperties`` and ``unevaluatedProperties``,
    and take no other engine. During a tool call's validation a search runs on ``regex`` until the
    call's deadline; anywhere else (another use of jsonschema in the process) it is ``re``'s."""

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def search(pattern: Any, string: Any, flags: int = 0) -> Any:
        deadline = getattr(_pattern_deadline, "at", None)
        compiled = None
        if deadline is not None and not flags and type(pattern) is str and isinstance(string, str):
            compiled = _bounded_pattern(pattern)
        if compiled is None:  # (a pattern only ``re`` reads keeps its search, unbounded, as before)
            return re.search(pattern, string, flags)
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            return compiled.search(string, timeout=left)
        except TimeoutError:
            raise _PatternTimeout(pattern, string) from None


def _has_patterns(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` may hold a regular expression keyword (a cheap, generous look)."""
    try:
        return '"pattern' in json.dumps(schema)
    except (TypeError, ValueError):
        return True


def _patterns_bounded(validate: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``validate`` with its regular expressions bounded by :data:`PATTERN_TIME_LIMIT_S` in all: an
    argument that takes longer is refused (:class:`ArgumentError`, naming it)."""
    import jsonschema._keywords
    import jsonschema._legacy_keywords
    import jsonschema._utils

    for module in (jsonschema._keywords, jsonschema._legacy_keywords, jsonschema._utils):
        if getattr(module, "re", None) is re:
            module.re = _BOUNDED_RE

    def bounded(args: dict[str, Any]) -> dict[str, Any]:
        outer = getattr(_pattern_deadline, "at", None)
        _pattern_deadline.at = time.monotonic() + PATTERN_TIME_LIMIT_S
        try:
            return validate(args)
        except _PatternTimeout as exc:
            raise ArgumentError(f"{_argument_holding(args, exc.text)} against the pattern {_short(exc.pattern)!r} "
                                f"took over {PATTERN_TIME_LIMIT_S:g} s") from None
        finally:
            _pattern_deadline.at = outer

    return bounded


_BOUNDED_RE = _BoundedRe("re")


def _argument_holding(args: Any, text: str) -> str:
    """``where: refused: matching the value`` (or ``the property name '...'``): the start of the
    refusal of ``text``, named where it is in the arguments (``a.b.0``, as jsonschema's errors)."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), args)]
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if key == text and isinstance(key, str):
                where = ".".join(map(str, path)) or "the arguments"
                return f"{where}: refused: matching the property name {_short(key)!r}"
            if value == text and isinstance(value, str):
                return f"{'.'.join(map(str, (*path, key)))}: refused: matching the value"
            stack.append(((*path, key), value))
    return f"refused: matching the text {_short(text)!r}"


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def check_schema(name: str, parameters: Any, *, lenient: bool = False) -> dict[str, Any]:
    """``parameters`` as a tool's arguments schema (a copy; ``None`` is an empty object), or
    :class:`ToolSchemaError` in one line. ``lenient``: read :data:`TYPE_ALIASES` first, with a warning."""
    if parameters is None or (isinstance(parameters, Mapping) and not parameters):
        return {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise ToolSchemaError(f"tool {name!r}: parameters schema at '/' must be a JSON object "
                              f"(a dict), got {type(parameters).__name__}")
    params = copy.deepcopy(dict(parameters))
    if lenient:
        mapped: list[str] = []
        params = _map_aliases(params, "", mapped)
        if mapped:
            warn(f"tool {name!r}: non-standard schema types read leniently: {', '.join(mapped)}")
    kind = params.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ToolSchemaError(f"tool {name!r}: parameters schema at '/type' must be \"object\" (tool arguments "
                              f"are a JSON object), got {kind!r}")
    try:  # a schema checked before in this process (every env of a vector worker lists the same tools)
        key = json.dumps(params, sort_keys=True)
    except (TypeError, ValueError):
        key = None
    if key is None or key not in _CHECKED:
        problem = _metaschema_problem(params)
        if problem:
            raise ToolSchemaError(f"tool {name!r}: parameters schema {problem}")
        if key is not None:
            if len(_CHECKED) >= 4096:
                _CHECKED.clear()
            _CHECKED.add(key)
    return params


#: the canonical JSON of schemas that passed the metaschema (checking one costs milliseconds)
_CHECKED: set[str] = set()


def _metaschema_problem(params: dict[str, Any]) -> str | None:
    """What ``check_schema`` of the schema's draft finds, every problem (up to 3) in one line."""
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(params, default=jsonschema.Draft202012Validator)
    try:  # what check_schema does, keeping every error (it raises only its best one, in no stable order)
        meta = validator_cls(validator_cls.META_SCHEMA, format_checker=validator_cls.FORMAT_CHECKER)
        errors = sorted(meta.iter_errors(params), key=lambda e: [str(p) for p in e.absolute_path])
    except Exception as exc:  # a metaschema that cannot be read
        return f"at '/': cannot be checked: {type(exc).__name__}: {exc}".replace("\n", " ")
    if not errors:
        return None
    problems = [f"at {_pointer(e.absolute_path)}: {_schema_problem(e)}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    if any("unknown type" in problem for problem in problems):
        more += f". JSON Schema's types are {', '.join(_JSON_TYPES)}; lenient=True reads dict, float, tuple and any"
    return "; ".join(problems) + more


def _pointer(path: Iterable[Any]) -> str:
    return "'/" + "/".join(str(p) for p in path) + "'"


def _schema_problem(error: Any) -> str:
    import jsonschema

    path = list(error.absolute_path)
    if path and path[-1] == "type" or len(path) > 1 and path[-2] == "type":
        return f"unknown type {error.instance!r}"
    return jsonschema.exceptions.best_match([error]).message.replace("\n", " ")


# keywords whose values are data, not schemas: never rewritten
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})


def _map_aliases(node: Any, where: str, mapped: list[str]) -> Any:
    """A copy of a schema with :data:`TYPE_ALIASES` read as standard types (``mapped`` says where)."""
    if isinstance(node, list):
        return [_map_aliases(v, f"{where}/{i}", mapped) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        here = f"{where}/{key}"
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key == "properties" and isinstance(value, dict):  # property names are not keywords
            out[key] = {k: _map_aliases(v, f"{here}/{k}", mapped) for k, v in value.items()}
        elif key == "type" and isinstance(value, str) and value in TYPE_ALIASES:
            mapped.append(f"{here} {value!r} as {TYPE_ALIASES[value] or 'any type'}")
            if TYPE_ALIASES[value] is not None:
                out[key] = TYPE_ALIASES[value]
        elif key == "type" and isinstance(value, list) and any(v in TYPE_ALIASES for v in value):
            if any(isinstance(v, str) and TYPE_ALIASES.get(v, "") is None for v in value):
                mapped.append(f"{here} {value!r} as any type")  # a union with "any" is no constraint
                continue
            standard = [TYPE_ALIASES.get(v, v) if isinstance(v, str) else v for v in value]
            mapped.append(f"{here} {value!r} as {standard!r}")
            out[key] = list(dict.fromkeys(standard))
        else:
            out[key] = _map_aliases(value, here, mapped)
    return out


def _jsonschema_message(error) -> str:
    where = ".".join(str(p) for p in error.path)
    return f"{where}: {error.message}" if where else error.message


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, inline: bool = False, self_timed: bool = False,
    terminal: bool = False,
):
    """Decorator: make a :class:`Tool` from a typed, documented function.

    ``inline=True`` is for cheap sync tools that bound their own work (no timeout thread);
    ``self_timed=True`` for sync tools that enforce their own time limit; ``terminal=True`` for a
    tool whose successful call ends the episode (``submit``, ``transfer_to_human``).
    """

    def build(f: Callable[..., Any]) -> Tool:
        own = name or getattr(f, "__name__", None) or getattr(_underlying(f), "__name__", None)
        if not own or own == "__call__":  # (a callable object)
            raise TypeError(f"tool {f!r:.80} has no name: give it one, tool(fn, name=...)")
        t = _tool_from_function(f, name=own, inline=inline)
        t.self_timed, t.terminal = self_timed, terminal
        return t

    return build(fn) if fn is not None else build


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ARGS = frozenset({"Parameters", "Other Parameters", "Arguments", "Args", "Keyword Arguments"})
_NUMPY_SECTIONS = _NUMPY_ARGS | {"Returns", "Yields", "Receives", "Raises", "Warns", "Warnings", "See Also", "Notes",
                                 "References", "Examples", "Attributes", "Methods"}
_NUMPY_ARG_LINE = re.compile(r"^(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")
_REST_FIELD = re.compile(r"^\s*:(param|parameter|arg|argument|key|keyword|type|returns?|rtype|raises?|yields?)\b")
_REST_ARG = re.compile(r"^\s*:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?(\*{0,2}\w+)\s*:\s*(.*)$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (description, {arg: description}): Google style (``Args:``),
    NumPy style (``Parameters`` over a ``----------`` line) or reST fields (``:param x: ...``).
    The description is the text before the arguments (or NumPy's first section, or the first
    reST field)."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    for i, line in enumerate(lines):
        if _ARGS_HEADER.match(line):
            return "\n".join(lines[:i]).strip(), _google_args(lines[i + 1:])
        if line.strip() in _NUMPY_SECTIONS and i + 1 < len(lines) and _NUMPY_UNDERLINE.match(lines[i + 1]):
            return "\n".join(lines[:i]).strip(), _numpy_args(lines[i:])
        if _REST_FIELD.match(line):
            return "\n".join(lines[:i]).strip(), _rest_args(lines[i:])
    return "\n".join(lines).strip(), {}


def _google_args(lines: list[str]) -> dict[str, str]:
    """The ``Args:`` section's descriptions (``lines``: those after its header)."""
    args: dict[str, str] = {}
    current = None
    indent = None
    for line in lines:
        if not line.strip():
            continue
        this_indent = len(line) - len(line.lstrip())
        if indent is None:
            indent = this_indent
        if this_indent < indent:  # the Args section ended (Returns:, Raises:, ...)
            break
        m = _ARG_LINE.match(line)
        if this_indent == indent and m:
            current = m.group(1).lstrip("*")
            args[current] = m.group(3).strip()
        elif current:
            args[current] = (args[current] + " " + line.strip()).strip()
    return args


def _numpy_args(lines: list[str]) -> dict[str, str]:
    """The descriptions in NumPy-style ``Parameters`` sections (``lines``: from the first
    section's title): ``name : type`` at the section's indent, the description indented below."""
    args: dict[str, str] = {}
    current: list[str] = []
    section = None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and line.strip() and _NUMPY_UNDERLINE.match(lines[i + 1]):
            section, current = line.strip(), []
            continue
        if _NUMPY_UNDERLINE.match(line) or not line.strip() or section not in _NUMPY_ARGS:
            continue
        m = None if line[:1].isspace() else _NUMPY_ARG_LINE.match(line)
        if m:
            current = [n.strip().lstrip("*") for n in m.group(1).split(",")]
            for n in current:
                args[n] = ""
        else:
            for n in current:
                args[n] = (args[n] + " " + line.strip()).strip()
    return args


def _rest_args(lines: list[str]) -> dict[str, str]:
    """The ``:param [type] name: description`` fields, continued on the lines below them."""
    args: dict[str, str] = {}
    current = None
    for line in lines:
        if _REST_FIELD.match(line) or line.lstrip().startswith(":"):
            m = _REST_ARG.match(line)
            current = m.group(1).lstrip("*") if m else None
            if current:
                args[current] = m.group(2).strip()
        elif current and line.strip():
            args[current] = (args[current] + " " + line.strip()).strip()
    return args


def _strip_titles(schema: Any) -> Any:
    """Pydantic puts a ``title`` on every node; OpenAI tool schemas do not use them."""
    if isinstance(schema, dict):
        return {
            k: _strip_titles(v)
            for k, v in schema.items()
            if not (k == "title" and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def _tool_from_function(fn: Callable[..., Any], *, name: str, inline: bool) -> Tool:
    sig = inspect.signature(fn)
    own = _underlying(fn)  # (a partial's or a callable object's function: its docstring and hints)
    if inspect.isgeneratorfunction(own) or inspect.isasyncgenfunction(own):
        raise TypeError(f"tool {name!r} is a generator function: a call would return the generator, not its "
                        "text; return the result (a string, or a list of the items)")
    description, arg_docs = _parse_docstring(own.__doc__ or (None if isinstance(fn, functools.partial) else fn.__doc__))
    try:
        hints = inspect.get_annotations(own, eval_str=True)
    except Exception as exc:  # a hint that cannot be resolved is a bug in the tool's module
        raise TypeError(f"tool {name!r}: cannot resolve type hints: {_unresolved(own)}{exc}") from exc
    bound = _partial_keywords(fn)
    fields: dict[str, Any] = {}
    wants_episode = wants_state = False
    for pname, param in sig.parameters.items():
        if pname in bound:  # the author's value: neither shown to the model nor its to change
            continue
        if pname in INJECTED:
            wants_episode = wants_episode or pname == "episode"
            wants_state = wants_state or pname == "state"
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            shown = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "") + pname
            raise TypeError(
                f"tool {name!r}: parameter {shown!r}: *args, **kwargs and positional-only parameters cannot be "
                "called with named JSON arguments"
            )
        annotation = hints.get(pname, Any)
        if param.default is None and not _takes_none(annotation):  # ``limit: int = None``: None is its value too
            annotation = typing.Optional[annotation]
        default = ... if param.default is param.empty else param.default
        described = {"description": arg_docs[pname]} if arg_docs.get(pname) else {}  # (else Annotated's Field's)
        fields[pname] = (annotation, pydantic.Field(default, **described))
    try:
        model = pydantic.create_model(
            f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid", allow_inf_nan=False),
            **{pname: (_json_kinds_kept(annotation), info) for pname, (annotation, info) in fields.items()},
        )
        parameters = _strip_titles(model.model_json_schema())
    except pydantic.PydanticUserError as exc:  # (a type pydantic cannot validate, e.g. typing.TypedDict on 3.11)
        where = _unreadable_parameter(name, fields)
        raise TypeError(f"tool {name!r}: its parameters' types cannot be validated: {where}{exc}".split("\n")[0]) from exc
    _check_defaults(name, fields, parameters)
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    parameters.pop("additionalProperties", None)
    parameters["additionalProperties"] = False
    names = tuple(fields)

    def validate_with_pydantic(args: dict[str, Any]) -> dict[str, Any]:
        try:
            parsed = model.model_validate(args)
        except pydantic.ValidationError as exc:
            raise ArgumentError(_pydantic_message(exc)) from None
        return {n: getattr(parsed, n) for n in names}

    validate = _primitive_validator(fields, validate_with_pydantic) or validate_with_pydantic

    made = Tool(
        name=name,
        description=description or name,
        parameters=parameters,
        fn=fn,
        validate=validate,
        inline=inline,
        wants_episode=wants_episode,
        wants_state=wants_state,
    )
    one = getattr(validate, "one", None)  # (a function of one plain argument, that takes it by position)
    if (one is not None and len(sig.parameters) == 1
            and sig.parameters[one[0]].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD):
        made.invoke = _one_argument_invoke(*one)
    return made


def _unresolved(fn: Callable[..., Any]) -> str:
    """``parameter 'x': ``, the first of ``fn`` 's string hints that cannot be resolved alone
    (as ``inspect.get_annotations`` resolves them: in the function's globals); "" when none."""
    try:
        raw = inspect.get_annotations(fn)
    except Exception:
        return ""
    scope = getattr(inspect.unwrap(fn), "__globals__", None) if callable(fn) else None
    for pname, hint in raw.items():
        if isinstance(hint, str):
            try:
                eval(hint, scope if isinstance(scope, dict) else {}, None)  # noqa: S307 (what get_annotations does)
            except Exception:
                return f"{'the return type' if pname == 'return' else f'parameter {pname!r}'}: "
    return ""


def _takes_none(annotation: Any) -> bool:
    """Whether ``annotation`` takes ``None`` already (``Optional``, ``Any``, ``Literal[None]``)."""
    if annotation in (Any, object, None, type(None)):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _takes_none(annotation.__origin__)
    if origin in (typing.Union, types.UnionType):
        return any(_takes_none(a) for a in args)
    return origin is typing.Literal and None in args


def _unreadable_parameter(name: str, fields: dict[str, Any]) -> str:
    """``parameter 'x' (its type): ``, the first parameter whose type pydantic cannot read or
    show as JSON Schema alone; "" when none does alone."""
    for pname, (annotation, info) in fields.items():
        try:
            pydantic.create_model(f"{name}_{pname}", **{pname: (_json_kinds_kept(annotation), info)}).model_json_schema()
        except pydantic.PydanticUserError:
            return f"parameter {pname!r} ({_type_name(annotation)}): "
        except Exception:
            continue
    return ""


def _type_name(annotation: Any) -> str:
    return annotation.__qualname__ if isinstance(annotation, type) else repr(annotation).replace("typing.", "")


def _check_defaults(name: str, fields: dict[str, Any], parameters: dict[str, Any]) -> None:
    """Each default the schema shows is a value of its parameter's type: ``count: int = "all"``
    showed the model ``{"type": "integer", "default": "all"}``, a schema no call can follow, and
    the function got ``"all"`` whenever the model left the argument out. A ``TypeError`` naming
    the tool and the parameter (a default pydantic cannot show as JSON is not shown, nor checked)."""
    properties = parameters.get("properties") or {}
    for pname, (annotation, info) in fields.items():
        prop = properties.get(pname)
        if info.is_required() or not isinstance(prop, dict) or "default" not in prop:
            continue
        sub = {k: v for k, v in parameters.items() if k != "required"}
        errors = list(jsonschema_validator(sub).iter_errors({pname: prop["default"]}))
        if errors:
            raise TypeError(f"tool {name!r}: parameter {pname!r}: its default {info.default!r:.80} is not a value of "
                            f"its type {_type_name(annotation)} ({_jsonschema_message(errors[0])}); give a default of "
                            "that type, or annotate the parameter with the default's type too")


def _partial_keywords(fn: Callable[..., Any]) -> set[str]:
    """The parameters a ``functools.partial`` (or a chain of them) binds by keyword."""
    bound: set[str] = set()
    while isinstance(fn, functools.partial):
        bound.update(fn.keywords)
        fn = fn.func
    return bound


def _json_kinds_kept(annotation: Any) -> Any:
    """``annotation`` for pydantic, with JSON's booleans and numbers kept apart: pydantic's lax
    mode reads ``true`` as the integer 1 and ``1`` as ``True`` (``limit: true`` ran as
    ``limit=1``), which no JSON Schema validator accepts (a schema tool refuses them). Its other
    conversions stay: a string that spells the value (``"3"`` for an int, ``"true"`` for a bool),
    a whole float for an int. In ``Optional``/unions, lists, sets, tuples, dicts, ``Annotated``
    (``PositiveInt``, ``Field(ge=1)``) and ``Literal`` too, and in the fields of pydantic models
    and ``TypedDict`` s (:func:`_fields_kinds_kept`)."""
    if annotation is bool:
        return typing.Annotated[bool, pydantic.BeforeValidator(_not_a_number)]
    if annotation in (int, float):
        return typing.Annotated[annotation, pydantic.BeforeValidator(_not_a_boolean)]
    if isinstance(annotation, type) and (issubclass(annotation, pydantic.BaseModel) or _is_typeddict(annotation)):
        return _fields_kinds_kept(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):  # (an IntEnum took true as its 1)
        check = _kinds_check(tuple(member.value for member in annotation))
        return annotation if check is None else typing.Annotated[annotation, pydantic.BeforeValidator(check)]
    if annotation in _TEXT_ONLY:  # (pydantic read a number as a Unix time, or seconds: the schema says a string)
        return typing.Annotated[annotation, pydantic.BeforeValidator(_a_string)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (set, frozenset) or origin in (set, frozenset):  # (pydantic dropped a repeat silently)
        base = origin[_json_kinds_kept(args[0])] if args else annotation
        return typing.Annotated[base, pydantic.BeforeValidator(_no_repeats)]
    if origin is typing.Annotated:  # (constraints next to the type, so that the schema keeps "minimum")
        base = annotation.__origin__
        kept = _json_kinds_kept(base)
        if kept is base:
            return annotation
        if typing.get_origin(kept) is typing.Annotated and kept.__origin__ is base:  # the kind's check last
            return typing.Annotated[(base, *annotation.__metadata__, *kept.__metadata__)]
        return typing.Annotated[(kept, *annotation.__metadata__)]
    if origin is typing.Literal:  # pydantic reads true as the literal 1 (True == 1), and 1 as True
        check = _kinds_check(args)
        return annotation if check is None else typing.Annotated[annotation, pydantic.BeforeValidator(check)]
    if not args:
        return annotation
    kept = tuple(_json_kinds_kept(a) if a is not Ellipsis else a for a in args)
    if kept == args:
        return annotation
    if origin in (typing.Union, types.UnionType):
        return typing.Union[kept]
    if origin in (list, set, frozenset, tuple, dict):
        return origin[kept]
    return annotation


def _is_typeddict(cls: type) -> bool:
    return issubclass(cls, dict) and hasattr(cls, "__required_keys__")


#: each pydantic model or TypedDict class -> what its fields are validated as (:func:`_fields_kinds_kept`)
_KINDS_KEPT: dict[type, Any] = {}


def _fields_kinds_kept(cls: type) -> Any:
    """A pydantic model or ``TypedDict`` parameter ``cls``, its fields checked as the parameters
    are: pydantic validates them with the class's own lax config (``true`` read as ``1``, ``NaN``
    as a float). A twin of ``cls`` with the fields' annotations kept (:func:`_json_kinds_kept`)
    and NaN and infinities refused validates the argument; a model's twin is a subclass (the
    model's validators, aliases and defaults hold) whose instance becomes a ``cls`` once
    validated, so the tool gets its own class. ``cls`` unchanged where no twin can be made (a
    field type the twin cannot take; a model's field of its own type keeps the lax check)."""
    kept = _KINDS_KEPT.get(cls)
    if kept is None:
        _KINDS_KEPT[cls] = cls  # (a model met again inside its own fields: lax there)
        try:
            kept = _model_twin(cls) if issubclass(cls, pydantic.BaseModel) else _typeddict_twin(cls)
        except Exception:  # (pydantic cannot build the twin: the class as it is, as before)
            kept = cls
        _KINDS_KEPT[cls] = kept
    return kept


def _model_twin(cls: type[pydantic.BaseModel]) -> Any:
    annotations, namespace = {}, {}
    for fname, info in cls.model_fields.items():
        kept = _json_kinds_kept(info.annotation)
        if kept is not info.annotation:
            annotations[fname] = kept
            namespace[fname] = copy.copy(info)  # (its default, alias, description and constraints)
    if not annotations:  # (no number, no boolean)
        return cls
    # (``__slots__ = ()``: the same layout as ``cls``, so that its instance can become a ``cls``)
    twin = type(cls)(cls.__name__, (cls,), {
        **namespace, "__annotations__": annotations, "__slots__": (), "__module__": cls.__module__,
        "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
        "model_config": {**cls.model_config, "allow_inf_nan": False},
    })
    if any(getattr(twin, a) != getattr(cls, a) for a in ("__basicsize__", "__dictoffset__", "__weakrefoffset__")):
        return cls  # (a layout its instance could not leave)

    def as_cls(value: Any) -> Any:
        if type(value) is twin:
            object.__setattr__(value, "__class__", cls)  # (object's: a frozen model refuses its own)
        return value

    return typing.Annotated[twin, pydantic.AfterValidator(as_cls)]


def _typeddict_twin(cls: type) -> Any:
    hints = typing.get_type_hints(cls, include_extras=True)
    annotations, changed = {}, False
    for key, hint in hints.items():
        if typing.get_origin(hint) in (typing.Required, typing.NotRequired):
            hint = typing.get_args(hint)[0]
        kept = _json_kinds_kept(hint)
        changed = changed or kept is not hint
        annotations[key] = (typing.Required if key in cls.__required_keys__ else typing.NotRequired)[kept]
    if not changed:  # (no number, no boolean)
        return cls
    config = getattr(cls, "__pydantic_config__", None)  # (without its own, a TypedDict has the parameters')
    namespace = {"__annotations__": annotations, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "__doc__": cls.__doc__}
    if config is not None:
        namespace["__pydantic_config__"] = {**config, "allow_inf_nan": False}
    return type(cls)(cls.__name__, (), namespace)  # (its value is a dict, as the class's is)


def _kinds_check(values: tuple[Any, ...]) -> Callable[[Any], Any] | None:
    """The check that keeps booleans and numbers apart for a ``Literal`` or ``Enum`` of
    ``values``; None where they hold neither. With both (``Literal["a", 1, True]``) a boolean must
    be one of its booleans and a number one of its numbers (pydantic read ``1.0`` as ``True``)."""
    booleans = tuple(v for v in values if type(v) is bool)
    numbers = tuple(v for v in values if type(v) in (int, float))
    if not booleans or not numbers:
        return _not_a_boolean if numbers else _not_a_number if booleans else None
    shown = ", ".join(json.dumps(v) if type(v) in (str, bool, int, float) or v is None else repr(v) for v in values)

    def check(value: Any) -> Any:
        if isinstance(value, bool):
            if value in booleans:
                return value
            raise ValueError(f"expected one of {shown}, got the boolean {str(value).lower()}")
        if isinstance(value, (int, float)):
            for number in numbers:
                if number == value:
                    return number
            raise ValueError(f"expected one of {shown}, got the number {value!r}")
        return value

    return check


#: types JSON Schema shows as a string that pydantic also read from a number
_TEXT_ONLY = (datetime.datetime, datetime.date, datetime.time, datetime.timedelta)


def _no_repeats(value: Any) -> Any:
    """A set parameter's array holds each item once, as its schema's ``uniqueItems`` says (and a
    schema tool checks): pydantic kept one of ``[3, 3]``, so ``add(ids=[3, 3])`` ran as one.
    Items compare as JSON's do (``1`` and ``1.0`` alike, ``1``, ``true`` and ``"1"`` apart)."""
    if isinstance(value, (list, tuple)):
        seen = set()
        for item in value:
            key = (type(item) is bool, item) if isinstance(item, (bool, int, float, str)) else json.dumps(
                item, sort_keys=True, default=repr)
            if key in seen:
                raise ValueError(f"items must be unique (it is a set), {json.dumps(item, default=repr)[:80]} is "
                                 "given more than once")
            seen.add(key)
    return value


def _a_string(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a string, got the boolean {str(value).lower()}")
    if isinstance(value, (int, float)):
        raise ValueError(f"expected a string, got the number {value!r}")
    return value


def _not_a_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
    return value


def _not_a_number(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"expected a boolean, got the number {value!r}")
    return value


def _one_argument_invoke(only: str, kind: type):
    """:func:`run_direct_text` for a function of one plain argument ``only`` of type ``kind``:
    what its validator passes unchanged (that argument alone, of that exact type) is passed by
    position, in this one frame; anything else goes to ``run_direct_text``."""

    def invoke(t: Tool, args: dict[str, Any], timeout: float, max_chars: int) -> str | ToolResult:
        if len(args) == 1:
            value = args.get(only)
            if type(value) is kind:
                try:
                    value = t.fn(value)
                except TOOL_FAULTS as exc:
                    return _failed(t.name, exc, timeout, max_chars)
                return value if type(value) is str and len(value) <= max_chars else _capped_text(t.name, value, max_chars)
        return run_direct_text(t, args, timeout, max_chars)

    return invoke


_PRIMITIVES = (str, int, float, bool)


def _primitive_validator(fields: dict[str, Any], slow: Callable[[dict[str, Any]], dict[str, Any]]):
    """For a signature of plain ``str``/``int``/``float``/``bool`` parameters (with immutable
    defaults): a validator that accepts, without pydantic, arguments that are exactly of their
    types (a float finite), all required ones present and none unknown - what pydantic would
    return unchanged - and hands anything else (a coercion, an error to word) to pydantic. None
    for other signatures."""
    kinds, required, defaults = {}, [], {}
    for pname, (annotation, info) in fields.items():
        if annotation not in _PRIMITIVES:
            return None
        kinds[pname] = annotation
        if info.is_required():
            required.append(pname)
        elif type(info.default) in (*_PRIMITIVES, type(None)):
            defaults[pname] = info.default
        else:
            return None
    n_required = len(required)
    floats = tuple(pname for pname, kind in kinds.items() if kind is float)  # (NaN and infinities are floats)
    if n_required == 1 and len(kinds) == 1 and not floats:  # one required argument (a calculator's): one look
        (only, kind), = kinds.items()

        def validate_one(args: dict[str, Any]) -> dict[str, Any]:
            if len(args) == 1 and type(args.get(only)) is kind:
                return args  # (callers spread it as keyword arguments: never changed)
            return slow(args)

        validate_one.one = (only, kind)  # (what _one_argument_invoke checks in its place)
        return validate_one

    def validate(args: dict[str, Any]) -> dict[str, Any]:
        if len(args) < n_required:
            return slow(args)
        for pname, value in args.items():
            if type(value) is not kinds.get(pname):  # an unknown name gets None, never a type
                return slow(args)
        for pname in required:
            if pname not in args:
                return slow(args)
        return {**defaults, **args} if defaults else args  # (callers spread it: never changed)

    if not floats:
        return validate

    def validate_finite(args: dict[str, Any]) -> dict[str, Any]:
        for pname in floats:
            value = args.get(pname)
            if type(value) is float and not math.isfinite(value):
                return slow(args)  # (pydantic words the refusal)
        return validate(args)

    return validate_finite


def _pydantic_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = ".".join(_readable_tag(str(p)) for p in err["loc"])
        kind = err["type"]
        if kind == "missing":
            parts.append(f"missing required argument '{loc}'")
        elif kind == "extra_forbidden":
            parts.append(f"unexpected argument '{loc}'")
        else:
            parts.append(f"argument '{loc}': {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


_VALIDATOR_TAG = re.compile(r"function-(?:before|after|wrap|plain)\[\w+\(\), ((?:[^\[\]]|\[[^\[\]]*\])*)\]")


def _readable_tag(part: str) -> str:
    """A union member's name in an error's place as the type it is: pydantic names a member by
    its schema, and the checks of :func:`_json_kinds_kept` showed there (``v.function-before[
    _not_a_boolean(), int]`` for ``v.int``)."""
    while "function-" in part:
        shorter = _VALIDATOR_TAG.sub(r"\1", part)
        if shorter == part:
            break
        part = shorter
    return part


def to_text(value: Any) -> str:
    """Tool return value -> the text the model sees."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple, bool, int, float)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            pass
    return str(value)


def truncate(text: str, limit: int) -> str:
    """Cap ``text`` at ``limit`` characters with a visible marker saying how much was cut
    (a limit too small to hold the marker just cuts)."""
    if len(text) <= limit:
        return text
    marker = f"\n...[truncated: {len(text) - limit} of {len(text)} characters not shown]"
    if limit < 2 * len(marker):
        return text[:limit]
    return text[: limit - len(marker)] + marker


class _ToolThreads(concurrent.futures.Executor):
    """Daemon threads for the tools that may block, shared by every env of the process: a
    thread is started whenever none is idle (up to ``limit`` alive), so a tool stuck past its
    timeout (a thread cannot be killed) holds its own thread, never a slot that later calls of
    any env wait for, and never holds up the interpreter's exit. Threads idle for
    ``idle_seconds`` end."""

    def __init__(self, limit: int = 256, idle_seconds: float = 60.0):
        self.limit, self.idle_seconds = limit, idle_seconds
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one release per idle thread not yet claimed by a call
        self._lock = threading.Lock()
        self._alive = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args, kwargs))
        if not self._idle.acquire(blocking=False):
            with self._lock:
                start = self._alive < self.limit
                self._alive += start
            if start:
                threading.Thread(target=self._serve, name="benchmax-tool", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                future, fn, args, kwargs = self._calls.get(timeout=self.idle_seconds)
            except queue.Empty:
                if self._idle.acquire(blocking=False):  # no call is counting on this thread: end it
                    with self._lock:
                        self._alive -= 1
                    return
                continue
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # (the caller's to see, as a pool's worker passes it on)
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs  # (no reference kept while idle)
            self._idle.release()


def _fresh_threads() -> None:
    """A forked child has none of its parent's threads: it starts its own."""
    global _THREADS
    _THREADS = _ToolThreads()


_THREADS = _ToolThreads()
os.register_at_fork(after_in_child=_fresh_threads)


class Toolset:
    """An ordered set of tools with execution rules (timeout, output cap).

    ``run``/``arun`` never raise for anything the model did: unknown tools, bad arguments,
    exceptions inside the tool and timeouts all come back as a :class:`ToolResult` with an
    error code (``unknown_tool``, ``bad_arguments``, ``tool_error``, ``tool_timeout``).
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()):
        self.tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool | Callable[..., Any]) -> None:
        if not isinstance(t, Tool) and not callable(t):
            raise TypeError(f"a tool must be a Tool or a typed, documented function, got {t!r:.80}")
        t = t if isinstance(t, Tool) else tool(t)
        if t.name in self.tools:
            raise ValueError(f"duplicate tool name {t.name!r}")
        self.tools[t.name] = t

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def __len__(self) -> int:
        return len(self.tools)

    def __iter__(self):
        return iter(self.tools.values())

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    # -- execution ------------------------------------------------------------------------

    def _prepare(self, name: str, arguments: Any, episode: Any, max_chars: int):
        t = self.tools.get(name)
        if t is None:
            known = ", ".join(self.tools) or "none"
            return None, None, ToolResult(f"Error: unknown tool '{name}'. Available tools: {known}.", "unknown_tool")
        if type(arguments) is not dict and not isinstance(arguments, dict):
            return None, None, ToolResult(
                f"Error: arguments for '{name}' must be a JSON object, got {type(arguments).__name__}.",
                "bad_arguments",
            )
        try:
            kwargs = t.validate(arguments)
        except ArgumentError as exc:
            return None, None, _bad_arguments(name, exc, max_chars)
        except Exception as exc:  # the validator itself broke (a $ref it cannot resolve): the call's error
            return None, None, _validator_failed(name, exc, max_chars)
        if t.wants_episode or t.wants_state:  # a new dict: validate may return the call's own (info shows it)
            kwargs = dict(kwargs)
            if t.wants_episode:
                kwargs["episode"] = episode
            if t.wants_state:
                kwargs["state"] = getattr(episode, "setup_state", None)
        return t, kwargs, None

    def run(self, name: str, arguments: Any, *, episode: Any = None, timeout: float, max_chars: int,
            run_coroutine: Callable[[Any, float], Any] | None = None) -> ToolResult:
        """Run one call synchronously. Async tools go through ``run_coroutine(coro, timeout)``."""
        t = self.tools.get(name)
        if t is not None and type(arguments) is dict and not t.wants_episode and not t.wants_state:
            if t.direct:
                return self.run_direct(t, arguments, timeout, max_chars)
            try:
                kwargs = t.validate(arguments)
            except ArgumentError as exc:
                return _bad_arguments(name, exc, max_chars)
            except Exception as exc:  # the validator itself broke: the call's error
                return _validator_failed(name, exc, max_chars)
        else:
            t, kwargs, failed = self._prepare(name, arguments, episode, max_chars)
            if failed:
                return failed
        try:
            if t.inline and not t.is_async:  # the cheap sync tools (a calculator) first
                value = t.fn(**kwargs)
            elif t.is_async:
                if run_coroutine is None:
                    raise RuntimeError("async tool called without an event loop runner")
                limit = None if t.self_timed else timeout
                value = run_coroutine(_async_call(t.fn(**kwargs), limit), limit)
            elif t.inline or t.self_timed:
                value = t.fn(**kwargs)
            else:
                value = _THREADS.submit(t.fn, **kwargs).result(timeout)
        except (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError):
            return _timed_out(name, timeout)
        except TOOL_FAULTS as exc:  # the tool's own failure is the model's observation
            return _error_result(name, exc, max_chars)
        text = value if type(value) is str and len(value) <= max_chars else _capped_text(name, value, max_chars)
        return text if type(text) is not str else ToolResult(text)

    @staticmethod
    def run_direct(t: Tool, arguments: dict[str, Any], timeout: float, max_chars: int) -> ToolResult:
        """``run`` for a tool that is called directly in this thread (``t.direct``) with an
        arguments dict."""
        out = (t.invoke or run_direct_text)(t, arguments, timeout, max_chars)
        return ToolResult(out) if type(out) is str else out

    async def arun(self, name: str, arguments: Any, *, episode: Any = None, timeout: float,
                   max_chars: int) -> ToolResult:
        """Run one call inside an event loop; sync tools that may block run in a thread."""
        t, kwargs, failed = self._prepare(name, arguments, episode, max_chars)
        if failed:
            return failed
        try:
            if t.is_async:
                call = _async_call(t.fn(**kwargs), None if t.self_timed else timeout)
                value = await (call if t.self_timed else asyncio.wait_for(call, timeout))
            elif t.inline:
                value = t.fn(**kwargs)
            else:
                loop = asyncio.get_running_loop()
                fut = loop.run_in_executor(_THREADS, lambda: t.fn(**kwargs))
                value = await (fut if t.self_timed else asyncio.wait_for(fut, timeout))
        except (TimeoutError, asyncio.TimeoutError):
            return _timed_out(name, timeout)
        except TOOL_FAULTS as exc:
            return _error_result(name, exc, max_chars)
        text = _capped_text(name, value, max_chars)
        return text if type(text) is not str else ToolResult(text)

    def close(self) -> None:
        """Nothing to release: blocking tools run on the process's shared daemon threads
        (``_THREADS``), which other envs' calls (of one registered id, sharing this toolset) may
        be using. Subclasses that hold connections close them here."""


def run_direct_text(t: Tool, arguments: dict[str, Any], timeout: float, max_chars: int) -> str | ToolResult:
    """:meth:`Toolset.run_direct`, with a successful call's text as a plain ``str`` (a failed
    call is its ``ToolResult``): the engine's fast step calls it, sparing an object per step."""
    try:
        kwargs = t.validate(arguments)
    except ArgumentError as exc:
        return _bad_arguments(t.name, exc, max_chars)
    except Exception as exc:  # the validator itself broke: the call's error
        return _validator_failed(t.name, exc, max_chars)
    try:
        value = t.fn(**kwargs)
    except TOOL_FAULTS as exc:
        return _failed(t.name, exc, timeout, max_chars)
    return value if type(value) is str and len(value) <= max_chars else _capped_text(t.name, value, max_chars)


#: What a tool's own code may raise that is its error: ``sys.exit()`` too (argparse or click given
#: a model's bad arguments exits), which otherwise ended the training process (a KeyboardInterrupt
#: is the user's Ctrl-C: it is not caught)
TOOL_FAULTS = (Exception, SystemExit)


class ToolExited(Exception):
    """An async tool called ``sys.exit()``: raised in its task, a ``SystemExit`` stops the event loop."""


async def _async_call(coroutine: Any, timeout: float | None) -> Any:
    """Await an async tool's coroutine, its ``sys.exit()`` a :class:`ToolExited`. With the
    ``timeout`` the engine gives it, a call that took longer is a :class:`TimeoutError`, whatever
    it returned or raised: asyncio cancels a coroutine only at an ``await``, so one that blocked
    its event loop past the timeout (``time.sleep``, a CPU loop) returns late, and nothing in
    Python can preempt it before (see the module's docstring). A sync tool's late result is
    dropped alike (its thread is abandoned at the timeout)."""
    if timeout is None:
        try:
            return await coroutine
        except SystemExit as exc:
            raise ToolExited(exc.code) from None
    start = time.monotonic()
    try:
        value = await coroutine
    except asyncio.CancelledError:  # (the timeout's cancellation: wait_for reports it)
        raise
    except (Exception, SystemExit) as exc:
        if time.monotonic() - start > timeout:
            raise TimeoutError from None
        if isinstance(exc, SystemExit):
            raise ToolExited(exc.code) from None
        raise
    if time.monotonic() - start > timeout:
        raise TimeoutError
    return value


def _failed(name: str, exc: Exception, timeout: float, max_chars: int) -> ToolResult:
    """The result of a direct call whose tool raised ``exc``."""
    if isinstance(exc, (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError)):
        return _timed_out(name, timeout)
    return _error_result(name, exc, max_chars)  # the tool's own failure is the model's observation


def _capped_text(name: str, value: Any, max_chars: int) -> str | ToolResult:
    """A tool's return value as the text the model sees, at most ``max_chars`` long; a value
    that has no text (its ``__str__`` raises, an int past Python's digit limit, nesting too deep
    for JSON) is the tool's error, never an exception out of ``step()``."""
    if inspect.iscoroutine(value) or inspect.isgenerator(value) or inspect.isasyncgen(value):
        value.close()  # (never run: no "was never awaited" warning)
        hint = ": make the tool `async def`" if inspect.iscoroutine(value) else ""
        return ToolResult(truncate(f"Error: tool '{name}' returned a {type(value).__name__}, not a result{hint}",
                                   max_chars), "tool_error")
    try:
        text = value if type(value) is str else to_text(value)
    except Exception as exc:
        return ToolResult(truncate(f"Error: tool '{name}' returned a value with no text: {_describe(exc)}",
                                   max_chars), "tool_error")
    return text if len(text) <= max_chars else truncate(text, max_chars)


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, even one whose ``__str__`` raises."""
    return f"{type(exc).__name__}: {_message(exc)}"


def _timed_out(name: str, timeout: float) -> ToolResult:
    """A tool the engine timed out: the tool's failure, not the model's (model-written code
    times itself out in the sandbox and reports a ToolError, which is scored)."""
    return FailedResult(f"Error: tool '{name}' timed out after {timeout:g} s.", "tool_timeout")


def _validator_failed(name: str, exc: Exception, max_chars: int) -> ToolResult:
    """Checking a call's arguments raised (not a refusal: the schema's validator broke on them)."""
    return ToolResult(truncate(f"Error: tool '{name}' could not check its arguments: {_describe(exc)}", max_chars),
                      "tool_error")


def _bad_arguments(name: str, exc: ArgumentError, max_chars: int) -> ToolResult:
    return ToolResult(truncate(f"Error: bad arguments for '{name}': {_message(exc)}", max_chars), "bad_arguments")


def _error_result(name: str, exc: Exception, max_chars: int) -> ToolResult:
    """A tool's exception as its result, its text capped like any result's."""
    if isinstance(exc, ToolError):
        return ToolResult(truncate(f"Error: {_message(exc)}", max_chars), exc.code)
    if isinstance(exc, ToolFailure):
        return FailedResult(truncate(f"Error: tool '{name}' failed: {_message(exc)}", max_chars), exc.outcome)
    if isinstance(exc, (SystemExit, ToolExited)):
        code = exc.code if isinstance(exc, SystemExit) else exc.args[0]
        return ToolResult(truncate(f"Error: tool '{name}' exited (sys.exit({code!r}))", max_chars), "tool_error")
    return ToolResult(truncate(f"Error: tool '{name}' failed: {_describe(exc)}", max_chars), "tool_error")


def _message(exc: BaseException) -> str:
    """An exception's message, even one whose ``__str__`` raises."""
    try:
        return str(exc)
    except Exception:
        return f"{type(exc).__name__} (its message could not be read)"
