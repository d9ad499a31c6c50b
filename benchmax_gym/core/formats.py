"""Tool-call formats: how a model writes calls in text, and how results are shown back.

Each format parses an action into tool calls (or a final answer, or parse errors), renders the
calling convention for the system prompt, and renders tool results as observation text.

* ``hermes`` (default) - ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as in the
  Hermes/Qwen chat templates; several per action.
* ``json`` - the whole action is a call object ``{"name", "arguments"}`` or a list of them
  (Llama 3.x's ``{"name", "parameters"}`` too), after an optional ``[TOOL_CALLS]`` (Mistral) or
  ``<|python_tag|>`` (Llama), which a reply decoded with its special tokens starts with.
* ``openai`` - the action is an OpenAI assistant message serialised as JSON, with ``tool_calls``
  (what vLLM's tool parser and the OpenAI API return).
* ``xml`` - Qwen3-Coder's XML calls: ``<function=NAME><parameter=KEY>value</parameter></function>``.

Parsing never raises: anything malformed becomes an entry in :attr:`Parsed.errors`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

PARSE_ERROR = "parse_error"
_ENCODER = json.JSONEncoder(ensure_ascii=False)  # json.dumps(..., ensure_ascii=False) builds one per call
_escape = json.encoder.encode_basestring  # the C escaper json.dumps uses for str with ensure_ascii=False
_SCALARS = {str: _escape, bool: lambda v: "true" if v else "false", int: int.__repr__, type(None): lambda v: "null"}
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_ERRORS_SHOWN = 5  # distinct parse errors named in one reply's note; the rest are counted


def utf8_safe(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD. A JSON escape the model writes in
    ASCII (``"\\ud800"``) decodes to one, and a tool may echo it: no UTF-8 encoder takes it (a
    Hugging Face tokenizer raises TypeError, ``print`` raises), so the env never shows one."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _summarised(errors: list[str]) -> list[str]:
    """Each distinct error once, with its count, the first few only: a reply of thousands of
    broken calls (``<tool_call>[1,1,1,...]``, two characters a call) was answered with a
    40-character error for each, a note twenty times the reply's size in the transcript."""
    if len(errors) < 2:
        return errors
    counts = Counter(errors)
    shown = [e if n == 1 else f"{e} ({n} times)" for e, n in list(counts.items())[:MAX_ERRORS_SHOWN]]
    if len(counts) > MAX_ERRORS_SHOWN:
        rest = sum(list(counts.values())[MAX_ERRORS_SHOWN:])
        shown.append(f"{rest} more error{'s' if rest > 1 else ''} not listed")
    return shown


def dumps_arguments(arguments: Any) -> str:
    """``json.dumps(arguments, ensure_ascii=False)``, the same text, several times faster for
    the common flat object of strings, integers, booleans and nulls (setting up the encoder is
    most of a small call's cost)."""
    if type(arguments) is dict:
        if len(arguments) == 1:
            (key, value), = arguments.items()
            if type(value) is str and type(key) is str:  # (one string argument: a calculator's)
                return f"{{{_escape(key)}: {_escape(value)}}}"
            encode = _SCALARS.get(type(value))
            if encode is not None and type(key) is str:
                return "{" + _escape(key) + ": " + encode(value) + "}"
        parts = []
        for key, value in arguments.items():
            encode = _SCALARS.get(type(value))
            if encode is None or type(key) is not str:
                return _ENCODER.encode(arguments)
            parts.append(_escape(key) + ": " + encode(value))
        return "{" + ", ".join(parts) + "}"
    return _ENCODER.encode(arguments)


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: Any

    def to_openai(self) -> dict[str, Any]:
        args = self.arguments if isinstance(self.arguments, str) else dumps_arguments(self.arguments)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(slots=True)
class Parsed:
    """The result of parsing one action.

    ``content`` is the text outside tool calls (the final answer when there are no calls);
    ``errors`` are model-readable reasons why some part of the action could not be parsed.
    """

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""

    @property
    def is_final(self) -> bool:
        return not self.calls and not self.errors


def _call_from_obj(obj: Any, call_id: str) -> tuple[ToolCall | None, str | None]:
    """``{"name": ..., "arguments": {...}}`` -> ToolCall, tolerating arguments given as a JSON string."""
    if not isinstance(obj, dict):
        return None, f"a tool call must be a JSON object, got {type(obj).__name__}"
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI-shaped entry
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, 'a tool call needs a "name" string'
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if isinstance(args, str):
        if not args.strip():
            args = {}
        else:
            args, err = _loads(args)
            if err:
                return None, f'the "arguments" of {name!r} are {err}'
    return ToolCall(call_id, name, args), None


_scan_once = json.JSONDecoder().scan_once  # json.loads without its Python wrapper (a third of its cost)


def _loads(text: str) -> tuple[Any, str | None]:
    try:  # a whole JSON value from the first character: json.loads's result, in C only
        obj, end = _scan_once(text, 0)
        if end == len(text):
            return obj, None
    except (StopIteration, ValueError, RecursionError):
        pass  # json.loads says what is wrong
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"invalid JSON ({exc})"
    except RecursionError:
        return None, "invalid JSON (nested too deeply)"


def _whole_object(text: str) -> dict | None:
    """The JSON object that is all of ``text`` (read in C), else None: the one-pass readers'
    test; anything else is left to ``_loads``/``parse``, which say what is wrong."""
    try:
        obj, end = _scan_once(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    return obj if end == len(text) and type(obj) is dict else None


def _strip_fence(text: str) -> str:
    """Drop a Markdown code fence around JSON (```json ... ```). Plain string work: a regex here
    backtracks cubically on long runs of whitespace, and actions are hostile input."""
    text = text.strip()
    if text[:3] == "```" and text.endswith("```") and len(text) >= 6:
        inner = text[3:-3]
        if inner[:4].lower() == "json":  # (```JSON too)
            inner = inner[4:]
        return inner.strip()
    return text


def _tagged(text: str, open_tag: str, close_tag: str, named: bool = False):
    """Each ``open_tag body close_tag`` in ``text``, left to right, as ``(name, body, start, end)``:
    what ``re.finditer`` finds with a lazy ``(.*?)`` body, in linear time. (The regex rescans the
    rest of the text from every unclosed opening tag: 48 s for 256k characters of ``<tool_call>``.)

    With ``named``, the opening tag is ``open_tag NAME>`` (``<function=NAME>``), the name holding
    neither ``>`` nor a newline, and ``name`` is returned; otherwise ``name`` is None.
    """
    pos, gt, newline, width = 0, -1, -1, len(open_tag)
    while (start := text.find(open_tag, pos)) >= 0:
        body_start, name = start + width, None
        if named:  # the first ">" and newline after the tag are shared by every later start before them
            if gt < body_start:
                gt = text.find(">", body_start)
                if gt < 0:
                    return
            if newline < body_start:
                newline = text.find("\n", body_start)
                newline = len(text) if newline < 0 else newline
            if newline < gt:
                pos = start + 1
                continue
            name, body_start = text[body_start:gt], gt + 1
        end = text.find(close_tag, body_start)
        if end < 0:  # no later opening can close either
            return
        yield name, text[body_start:end], start, end + len(close_tag)
        pos = end + len(close_tag)


def split_reasoning(text: str, tags: tuple[str, str] | None = ("<think>", "</think>")) -> tuple[str, str]:
    """``(reasoning, visible)``: a reply's reasoning blocks and the rest, where calls and the
    answer are read. Linear in the text.

    Every ``<think>...</think>`` block is reasoning; so is everything before a first ``</think>``
    that has no opening tag (templates such as Qwen3's put ``<think>`` in the prompt), and
    everything after an opening tag that never closes (the model was cut off while thinking).
    ``tags=None`` treats the whole reply as visible.
    """
    if not tags:
        return "", text
    open_tag, close_tag = tags
    first_close, first_open = text.find(close_tag), text.find(open_tag)
    if first_close < 0 and first_open < 0:
        return "", text
    reasoning, visible, pos = [], [], 0
    if first_close >= 0 and (first_open < 0 or first_close < first_open):
        reasoning.append(text[:first_close])
        pos = first_close + len(close_tag)
    while (start := text.find(open_tag, pos)) >= 0:
        visible.append(text[pos:start])
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            reasoning.append(text[start + len(open_tag):])
            pos = len(text)
            break
        reasoning.append(text[start + len(open_tag):end])
        pos = end + len(close_tag)
    visible.append(text[pos:])
    return "\n".join(reasoning), "".join(visible)


def _outside(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the given (start, end) spans, which are sorted and disjoint."""
    pieces, pos = [], 0
    for start, end in spans:
        pieces.append(text[pos:start])
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces)


def _tool_lines(schemas: list[dict[str, Any]]) -> str:
    """One JSON schema per line, as the Hermes/Qwen templates list tools."""
    return "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)


def _own_id(given: Any) -> bool:
    """Whether a model-written call id can be kept: a non-empty str that any UTF-8 encoder
    takes (an escaped lone surrogate in it reached the observation, as the result's id)."""
    return isinstance(given, str) and given != "" and utf8_safe(given) == given


def _add_calls(out: "Parsed", entries: list[Any], turn: int, keep_ids: bool = False) -> "Parsed":
    """Each entry as a call (or an error) in ``out``, with id ``call_{turn}_{n}`` unless
    ``keep_ids`` and the entry names its own. Ids are unique within the reply: chat APIs and
    templates pair each result with its call by id, so a repeated one gets its own."""
    used: set[str] = set()
    for entry in entries:
        given = entry.get("id") if keep_ids and isinstance(entry, dict) else None
        call_id = given if _own_id(given) and given not in used else f"call_{turn}_{len(out.calls)}"
        while call_id in used:  # (a default the model's own ids already took)
            call_id += "_"
        call, err = _call_from_obj(entry, call_id)
        if err:
            out.errors.append(err)
        else:
            out.calls.append(call)
            used.add(call_id)
    out.errors = _summarised(out.errors)
    return out


def _listed_tools(schemas: list[dict[str, Any]]) -> str:
    return f"# Tools\n\nThese functions are available:\n{_tool_lines(schemas)}\n\n"


class ToolCallFormat:
    """Base class; subclasses set ``name`` and implement ``parse`` and ``instructions``."""

    name = ""

    def parse(self, action: str, turn: int, tools: dict[str, Any] | None = None) -> Parsed:
        raise NotImplementedError

    def one_call(self, action: str) -> tuple[str, dict[str, Any], str, str | None] | None:
        """``(name, arguments, content, call_id)`` when ``action`` is plainly one call with an
        arguments object (what ``parse`` finds), in one pass; ``None`` for anything else, left to
        ``parse``. ``call_id`` is the id the action gives its call (formats that keep the model's
        ids), else None. The engine's fast step uses it; a format need not offer it."""
        return None

    def instructions(self, schemas: list[dict[str, Any]]) -> str:
        raise NotImplementedError

    def render_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """The inverse of ``parse``: an action that makes ``calls`` (``(name, arguments)`` pairs)."""
        raise NotImplementedError

    def render_results(self, results: list[tuple[str, str, str]]) -> str:
        """``results`` are ``(call_id, tool_name, content)``; returns the observation text."""
        if len(results) == 1:
            return f"<tool_response>\n{results[0][2]}\n</tool_response>"
        return "\n".join(f"<tool_response>\n{content}\n</tool_response>" for _, _, content in results)

    def render_one(self, call_id: str, name: str, content: str) -> str:
        """``render_results`` of one result, without the list (the engine's fast step). A
        format that overrides ``render_results`` alone gets a ``render_one`` that calls it."""
        return f"<tool_response>\n{content}\n</tool_response>"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "render_results" in cls.__dict__ and "render_one" not in cls.__dict__:
            cls.render_one = _render_one_by_results


def _render_one_by_results(self: ToolCallFormat, call_id: str, name: str, content: str) -> str:
    return self.render_results([(call_id, name, content)])


class HermesFormat(ToolCallFormat):
    name = "hermes"

    def parse(self, action, turn, tools=None):
        start = action.find("<tool_call>")
        if start < 0:
            if "</tool_call>" in action:
                return Parsed(errors=["found </tool_call> without an opening <tool_call>"])
            return Parsed(content=action.strip())
        one = self.one_call(action)  # the common case in one pass (what the loop below would find)
        if one is not None:
            return Parsed([ToolCall(f"call_{turn}_0", one[0], one[1])], [], one[2])
        out = Parsed()
        found = list(_tagged(action, "<tool_call>", "</tool_call>"))
        bodies = [body for _, body, _, _ in found]
        rest = _outside(action, [(start, end) for _, _, start, end in found])
        if "<tool_call>" in rest:  # an unclosed last call (generation stopped at the end tag)
            head, _, tail = rest.partition("<tool_call>")
            bodies.append(tail)
            rest = head
        if "</tool_call>" in rest:
            out.errors.append("found </tool_call> without a matching <tool_call>")
        out.content = rest.strip()
        for body in bodies:
            obj, err = _loads(_strip_fence(body))
            if err:
                out.errors.append(f"<tool_call> body is {err}")
                continue
            for item in obj if isinstance(obj, list) else [obj]:
                call, err = _call_from_obj(item, f"call_{turn}_{len(out.calls)}")
                if err:
                    out.errors.append(err)
                else:
                    out.calls.append(call)
        out.errors = _summarised(out.errors)
        return out

    def one_call(self, action):
        start = action.find("<tool_call>")
        if start < 0:
            return None
        before, rest = action[:start], action[start + 11:]
        body, closed, after = rest.partition("</tool_call>")
        if not closed or "<tool_call>" in rest or "</tool_call>" in after or "</tool_call>" in before:
            return None
        obj = _whole_object(body.strip())  # (a fenced body takes the general path)
        if obj is None:
            return None
        name, args = obj.get("name"), obj.get("arguments")
        if type(name) is not str or not name or type(args) is not dict or "function" in obj:
            return None  # (_call_from_obj's other shapes)
        return name, args, (before + after).strip(), None

    def render_calls(self, calls):
        return "\n".join(
            "<tool_call>\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
            for n, a in calls
        )

    def instructions(self, schemas):
        tools = _tool_lines(schemas)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{tools}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
            "Tool results come back inside <tool_response></tool_response> tags. "
            "A reply without any <tool_call> is your final answer and ends the episode."
        )


# Special tokens that open a JSON tool call, seen when a reply is decoded with its special
# tokens: Mistral's ``[TOOL_CALLS][{...}]``, Llama 3.x's ``<|python_tag|>{...}``.
_CALL_MARKERS = ("[TOOL_CALLS]", "<|python_tag|>")


class JsonFormat(ToolCallFormat):
    name = "json"

    def parse(self, action, turn, tools=None):
        text = _strip_fence(action)
        marker = next((m for m in _CALL_MARKERS if text.startswith(m)), None)  # only ever written to make a call
        if marker:
            text = _strip_fence(text[len(marker):])
        if not text.startswith(("{", "[")):
            if marker:
                return Parsed(errors=[f"after {marker} write a JSON object "
                                      '{"name": ..., "arguments": {...}} or a JSON list of them'])
            return Parsed(content=action.strip())
        obj, err = _loads(text)
        if err:
            if marker or '"name"' in text or "'name'" in text:  # clearly meant as a call (single quotes: not JSON)
                return Parsed(errors=[f"the tool call is {err}"])
            return Parsed(content=action.strip())
        items = obj if isinstance(obj, list) else [obj]
        if items and all(isinstance(i, dict) and "name" in i for i in items):
            return _add_calls(Parsed(), items, turn)
        if not marker:
            if isinstance(obj, dict) and "name" not in obj and "arguments" not in obj:
                return Parsed(content=action.strip())  # some other JSON: a final answer
            if isinstance(obj, list) and not any(isinstance(i, dict) for i in items):
                return Parsed(content=action.strip())  # [] or a list of values (["Paris", "Lyon"]): a final answer
        return Parsed(errors=['each tool call must be an object with "name" and "arguments"'])

    def instructions(self, schemas):
        return _listed_tools(schemas) + (
            'To call functions, reply with only a JSON object {"name": <function-name>, "arguments": '
            "<args-json-object>} or a JSON list of such objects, and nothing else. Tool results come "
            "back as a JSON list. A reply that is not a tool call is your final answer and ends the episode."
        )

    def render_calls(self, calls):
        items = [{"name": n, "arguments": a} for n, a in calls]
        return json.dumps(items[0] if len(items) == 1 else items, ensure_ascii=False)

    def render_results(self, results):
        return json.dumps(
            [{"tool_call_id": i, "name": n, "content": c} for i, n, c in results], ensure_ascii=False
        )

    def render_one(self, call_id, name, content):  # render_results' text for one, without the encoder
        return f'[{{"tool_call_id": {_escape(call_id)}, "name": {_escape(name)}, "content": {_escape(content)}}}]'


class OpenAIFormat(ToolCallFormat):
    name = "openai"

    def parse(self, action, turn, tools=None):
        text = action.strip()
        if not text.startswith("{"):
            return Parsed(content=text)
        msg, err = _loads(text)
        if err:
            return Parsed(errors=[f"the assistant message is {err}"])
        if not isinstance(msg, dict):
            return Parsed(errors=["the assistant message must be a JSON object"])
        if not {"role", "content", "tool_calls"} & msg.keys():
            return Parsed(content=text)  # some other JSON: the reply itself is the answer
        if msg.get("role", "assistant") != "assistant":  # (a malformed message is said to be, never graded)
            return Parsed(errors=[f'the message\'s "role" must be "assistant", got {msg.get("role")!r:.40}'])
        content = msg.get("content")
        if content is not None and not isinstance(content, str):
            return Parsed(errors=[f'the message\'s "content" must be text or null, got {type(content).__name__}'])
        out = Parsed(content=utf8_safe(content.strip()) if isinstance(content, str) else "")
        calls = msg.get("tool_calls")
        calls = [] if calls is None else calls
        if not isinstance(calls, list):
            out.errors.append('"tool_calls" must be a list')
            return out
        return _add_calls(out, calls, turn, keep_ids=True)

    def instructions(self, schemas):
        return _listed_tools(schemas) + (
            "Reply with an assistant message as JSON: "
            '{"role": "assistant", "content": <text>, "tool_calls": [{"id": <id>, "type": "function", '
            '"function": {"name": <function-name>, "arguments": <args-as-JSON-string>}}]}. '
            "A message without tool_calls is your final answer and ends the episode."
        )

    def render_calls(self, calls):
        return json.dumps({
            "role": "assistant",
            "content": "",
            "tool_calls": [ToolCall(f"call_{i}", n, a).to_openai() for i, (n, a) in enumerate(calls)],
        }, ensure_ascii=False)

    def one_call(self, action):
        msg = _whole_object(action.strip())
        if msg is None:
            return None
        calls = msg.get("tool_calls")
        if type(calls) is not list or len(calls) != 1 or type(calls[0]) is not dict:
            return None
        call = calls[0]
        function = call.get("function")
        if type(function) is not dict:
            return None
        name, arguments = function.get("name"), function.get("arguments")
        if type(name) is not str or not name or type(arguments) is not str:
            return None  # (_call_from_obj's other shapes: arguments as an object, absent, parameters)
        args = _whole_object(arguments)
        if args is None:
            return None
        content, given = msg.get("content"), call.get("id")
        if (content is not None and type(content) is not str) or msg.get("role", "assistant") != "assistant":
            return None  # (a malformed message: the general path says what is wrong)
        return (name, args, utf8_safe(content.strip()) if type(content) is str else "",
                given if _own_id(given) else None)

    render_results = JsonFormat.render_results
    render_one = JsonFormat.render_one


class XmlFormat(ToolCallFormat):
    name = "xml"

    def parse(self, action, turn, tools=None):
        if "<function=" not in action:
            return Parsed(content=action.strip())
        out = Parsed()
        found = list(_tagged(action, "<function=", "</function>", named=True))
        for name, body, _, _ in found:
            name = name.strip()
            args: dict[str, Any] = {}
            props = ((tools or {}).get(name) or {}).get("properties", {})
            for key, raw, _, _ in _tagged(body, "<parameter=", "</parameter>", named=True):
                key = key.strip()
                value = raw[1:] if raw.startswith("\n") else raw
                value = value[:-1] if value.endswith("\n") else value
                args[key] = self._convert(value, props.get(key, {}))
            if not name:
                out.errors.append("<function=...> needs a tool name")
            else:
                out.calls.append(ToolCall(f"call_{turn}_{len(out.calls)}", name, args))
        rest = _outside(action, [(start, end) for _, _, start, end in found])
        if "<function=" in rest:
            out.errors.append("found <function=...> without a closing </function>")
        out.content = re.sub(r"</?tool_call>", "", rest).strip()
        return out

    @staticmethod
    def _convert(value: str, schema: dict[str, Any]) -> Any:
        """XML values are text; decode them as JSON unless the schema admits a string. ``null``
        is JSON's null for every parameter, as in the JSON formats (and vLLM's qwen3_coder
        parser): a string parameter then gets ``None``, which its validation takes or refuses."""
        if value.strip().lower() == "null":
            return None
        if _admits_string(schema):
            return value
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value

    def render_calls(self, calls):
        def value(v):
            return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

        return "\n".join(
            f"<tool_call>\n<function={n}>\n"
            + "".join(f"<parameter={k}>\n{value(v)}\n</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>"
            for n, a in calls
        )

    def instructions(self, schemas):
        tools = _tool_lines(schemas)
        return (
            "# Tools\n\nYou have access to the following functions:\n"
            f"<tools>\n{tools}\n</tools>\n\n"
            "To call a function, reply with:\n"
            "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter>\nvalue\n"
            "</parameter>\n</function>\n</tool_call>\n\n"
            "Several calls may follow each other. Tool results come back inside "
            "<tool_response></tool_response> tags. A reply without a function call is your final "
            "answer and ends the episode."
        )


def _admits_string(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    return any(_admits_string(s) for key in ("anyOf", "oneOf") for s in schema.get(key) or [])


FORMATS: dict[str, type[ToolCallFormat]] = {
    f.name: f for f in (HermesFormat, JsonFormat, OpenAIFormat, XmlFormat)
}


def get_format(name: str | ToolCallFormat) -> ToolCallFormat:
    """Look up a format by name; a bad name is a ValueError listing the choices."""
    if isinstance(name, ToolCallFormat):
        return name
    if not isinstance(name, str) or name not in FORMATS:  # (a list or dict: "unhashable type")
        raise ValueError(f"tool_format must be one of {sorted(FORMATS)}, got {name!r:.80}")
    return FORMATS[name]()
