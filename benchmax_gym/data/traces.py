"""Tasks from agents' traces: ``benchmax-gym tasks from-traces LOGS --env ENV_ID --out tasks.jsonl``.

A trace is one conversation in the OpenAI chat format, one JSON object a line: ``{"messages":
[...]}`` (eval's ``rollouts.jsonl``, ``run --jsonl``, most gateways), a bare list of messages, or
a logged request and its response (``{"request": {"messages"}, "response": {"choices": [{"message"}]}}``);
a ``.json`` file may hold an array of them.
Each kept trace becomes one task for the env:

* ``messages``: the conversation up to the chosen turn (``turn``): ``"last-user"`` (default: up
  to the last user message, so earlier exchanges are the task's context and the agent redoes
  the last request), ``"first-user"`` (only the opening request), ``"final"`` (everything but
  the final assistant reply), or ``N`` (before the N-th assistant message). A system message
  equal to the env's own prompt is dropped (the env adds its own); another one is kept.
* ``answer``: the reference, only from traces the user trusts (``keep``): the trace's final
  assistant reply (its last ``\\boxed{}`` or ``<answer>`` when it has one), or a field of the record
  (``answer_field``). ``keep`` is ``"all"``, ``"reward>=X"`` (also ``>``, ``<=``, ``<``, ``=``;
  the record's ``reward``), or ``"FIELD=VALUE"`` (a dotted path into the record, VALUE as JSON
  when it parses: ``success=true``, ``metadata.label=good``). Traces not kept are counted, and
  so is one whose prefix already holds an assistant reply giving that answer (the task would be
  to repeat it).
* every tool call of the trace (structured ``tool_calls``, or calls written in the env's format
  in the text) is checked against the env's tools: unknown tools and invalid arguments are
  reported with where they are; a trace whose *prefix* holds one is skipped (the env could not
  have produced that conversation) unless ``allow_invalid_calls``.

A trace that gives the same task as an earlier one (the same messages and answer: a run of ``-k 4``
holds each task's conversation four times) is left out and counted in ``duplicates``: each
distinct task is written once, by :func:`~benchmax_gym.core.tasks.task_digest`'s identity.
"""

from __future__ import annotations

import json
import operator
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmax_gym.core.tasks import Task, check_messages, task_digest

TURNS = ("last-user", "first-user", "final")
_COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
            "=": operator.eq}
MAX_EXAMPLES = 20  # problems quoted in the report (all are counted)


@dataclass
class TraceReport:
    """What ``tasks_from_traces`` read, kept and why it skipped the rest."""

    traces: int = 0
    kept: int = 0
    duplicates: int = 0  # traces whose task (messages and answer) an earlier trace gave: left out
    skipped: Counter = field(default_factory=Counter)
    unknown_tools: Counter = field(default_factory=Counter)
    invalid_arguments: Counter = field(default_factory=Counter)
    calls_checked: int = 0
    examples: list[str] = field(default_factory=list)

    def problem(self, where: str, message: str) -> None:
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{where}: {message}")

    def as_dict(self) -> dict[str, Any]:
        return {"traces": self.traces, "kept": self.kept, "duplicates": self.duplicates, "skipped": dict(self.skipped),
                "calls_checked": self.calls_checked, "unknown_tools": dict(self.unknown_tools),
                "invalid_arguments": dict(self.invalid_arguments), "examples": self.examples}


#: an eval run's files that hold no conversation (its rollouts.jsonl does): skipped in a LOGS folder
EVAL_RUN_RECORDS = ("run.json", "summary.json", "group_rewards.jsonl")


def _eval_run_record(file: Path) -> bool:
    """Whether ``file`` is one of :data:`EVAL_RUN_RECORDS` beside an eval run's ``run.json`` and
    ``rollouts.jsonl`` (each was reported as "not a chat trace")."""
    folder = file.parent
    return (file.name in EVAL_RUN_RECORDS and (folder / "run.json").is_file()
            and (folder / "rollouts.jsonl").is_file())


def trace_files(logs: str | os.PathLike) -> list[Path]:
    """``logs`` itself, or the ``*.jsonl`` / ``*.json`` files under a folder (sorted; an eval run's
    records other than its rollouts left out); a file of the folder that links outside it is refused."""
    path = Path(logs)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".json") and p.is_file()
                       and not _eval_run_record(p))
        if not files:
            raise ValueError(f"LOGS {str(logs)!r}: no .jsonl or .json files in the folder")
        inside = path.resolve()
        for file in files:  # (as for DOCS: a folder from elsewhere may link a file of this machine in)
            target = file.resolve()
            if not target.is_relative_to(inside):
                raise ValueError(f"LOGS {str(logs)!r}: {file} links outside the folder (to {target}); copy that "
                                 "file into the folder, or pass it as LOGS itself")
        return files
    if path.exists() and not path.is_file():  # a FIFO or a device: never opened (a FIFO would block)
        raise ValueError(f"LOGS {str(logs)!r}: not a regular file or folder")
    if not path.is_file():
        raise FileNotFoundError(f"LOGS {str(logs)!r}: no such file or folder")
    return [path]


class Unreadable(str):
    """Why a trace line (or ``.json`` file) could not be read: yielded in place of its record."""


_BOM = b"\xef\xbb\xbf"  # (editors on Windows write one; json.loads refuses it in text)


def _parse(data: bytes) -> Any:
    """The JSON value in ``data``, or an :class:`Unreadable` saying why not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Unreadable(f"not UTF-8 text (byte {exc.start} of the line); save the file as UTF-8")
    try:
        return json.loads(text)
    except ValueError as exc:
        return Unreadable(f"not JSON ({exc})")
    except RecursionError:  # a hostile or broken log must not end the command
        return Unreadable("JSON nested too deeply to read")


def read_traces(logs: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for each line of each trace file (``where`` is ``file:line``, the file
    relative to a LOGS folder); a line that cannot be read (not UTF-8, not JSON) is yielded as an
    :class:`Unreadable` saying why (reported, not fatal)."""
    root = Path(logs)
    for file in trace_files(logs):
        name = file.relative_to(root).as_posix() if root.is_dir() else file.name
        if file.suffix == ".json":  # a JSON array of traces (or one trace)
            data = _parse(file.read_bytes().removeprefix(_BOM))
            if not isinstance(data, Unreadable):
                items = data if isinstance(data, list) and not (data and isinstance(data[0], dict)
                                                                and "role" in data[0]) else [data]
                for i, item in enumerate(items, 1):
                    yield f"{name}[{i}]", item
                continue
        with open(file, "rb") as f:
            for number, line in enumerate(f, 1):
                if number == 1:
                    line = line.removeprefix(_BOM)
                if line.strip():
                    yield f"{name}:{number}", _parse(line)


def conversation(record: Any) -> list[dict[str, Any]] | None:
    """The messages of a trace record in any of the accepted shapes, or None."""
    if isinstance(record, list):
        return record
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("messages"), list):
        return record["messages"]
    request, response = record.get("request"), record.get("response")
    if isinstance(request, dict) and isinstance(request.get("messages"), list):
        messages = list(request["messages"])
        choices = response.get("choices") if isinstance(response, dict) else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("message"):
            messages.append(choices[0]["message"])
        return messages
    return None


def keep_filter(spec: str) -> Callable[[Any], bool]:
    """``"all"``, ``"reward>=X"`` (``>``, ``<=``, ``<``, ``=``) or ``"FIELD=VALUE"`` -> a predicate
    on trace records. A bad spec is a ValueError naming ``--keep``."""
    spec = (spec or "").strip()
    if spec == "all":
        return lambda record: True
    found = re.fullmatch(r"reward\s*(>=|<=|==|=|>|<)\s*(-?[\d.]+(?:e-?\d+)?)", spec)
    if found:
        try:
            bound = float(found[2])
        except ValueError:
            raise ValueError(f"--keep {spec!r}: {found[2]!r} is not a number") from None
        compare = _COMPARE[found[1]]
        return lambda record: (isinstance(record, dict) and isinstance(record.get("reward"), (int, float))
                               and not isinstance(record.get("reward"), bool) and compare(record["reward"], bound))
    name, sep, raw = spec.partition("=")
    if sep and name and re.fullmatch(r"[\w.]+", name):
        try:
            wanted = json.loads(raw)
        except ValueError:
            wanted = raw
        return lambda record: _field(record, name) == wanted
    raise ValueError(f"--keep must be all, reward>=X (or >, <=, <, =) or FIELD=VALUE, got {spec!r}")


def _field(record: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(record, dict) or part not in record:
            return None
        record = record[part]
    return record


def _cut(messages: list[dict[str, Any]], turn: str | int) -> int | None:
    """How many messages the task keeps: the prefix ends where the model speaks next."""
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if turn == "last-user":
        return users[-1] + 1 if users else None
    if turn == "first-user":
        return users[0] + 1 if users else None
    if turn == "final":
        return assistants[-1] if assistants else None
    if isinstance(turn, int):
        return assistants[turn - 1] if 0 < turn <= len(assistants) else None
    raise ValueError(f"--turn must be one of {TURNS} or a number N (before the N-th assistant message), got {turn!r}")


def _calls(message: dict[str, Any], env: Any, turn: int) -> list[tuple[str, Any]]:
    """``(name, arguments)`` of an assistant message's calls: its ``tool_calls``, else calls written
    in the env's format in its text (what a text-format agent logs)."""
    calls = []
    listed = message.get("tool_calls") or []
    if not isinstance(listed, (list, tuple)):  # a hostile or broken log: one bad call, reported
        return [("", None)]
    for call in listed:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            calls.append(("", None))
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):
                pass  # kept as text: reported as invalid
        calls.append((str(function.get("name") or ""), arguments))
    if not calls and isinstance(message.get("content"), str) and env is not None:
        parsed = env.format.parse(message["content"], turn, None)
        calls = [(c.name, c.arguments) for c in parsed.calls]
    return calls


def check_calls(messages: list[dict[str, Any]], env: Any, where: str, report: TraceReport) -> list[int]:
    """Check every tool call against ``env``'s tools; returns the indices of the messages that hold
    a bad one (each reported)."""
    from benchmax_gym.core.tools import ArgumentError

    tools = env.toolset.tools
    bad = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        for name, arguments in _calls(message, env, i):
            report.calls_checked += 1
            tool = tools.get(name)
            if tool is None:
                report.unknown_tools[name or "(no name)"] += 1
                report.problem(where, f"message {i}: unknown tool {name!r} (the env has {', '.join(tools) or 'none'})"
                               if name else f"message {i}: a tool call with no function name (tool_calls must be a "
                               'list of {"function": {"name": ..., "arguments": ...}})')
                bad.append(i)
                continue
            try:
                if not isinstance(arguments, dict):
                    raise ArgumentError(f"arguments must be a JSON object, got {arguments!r}"[:200])
                tool.validate(arguments)
            except ArgumentError as exc:
                report.invalid_arguments[name] += 1
                report.problem(where, f"message {i}: invalid arguments for {name}: {exc}")
                bad.append(i)
    return bad


def reference(messages: list[dict[str, Any]], record: Any, answer_field: str | None, env: Any = None) -> Any:
    """The trusted reference: a field of the record, else the final assistant reply (its last
    ``\\boxed{}`` or ``<answer>`` when it has one); None when the trace ends on a tool call."""
    if answer_field:
        value = _field(record, answer_field)
        # (blank text is no reference: its tasks would be scored against nothing)
        return None if isinstance(value, str) and not value.strip() else value
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") == "assistant":
            if _calls(message, env, i):
                return None  # the agent was still working: no final answer
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                from benchmax_gym.envs.math.rubric import extract_answer  # the last \\boxed{}, else <answer>

                return extract_answer(content) or content.strip()
            return None
    return None


def _answer_given(prefix: list[dict[str, Any]], answer: Any) -> int | None:
    """The index of an assistant message of ``prefix`` whose final answer is ``answer``, or None:
    such a task scores whoever repeats what the conversation already says."""
    if not isinstance(answer, str) or not answer.strip():
        return None
    from benchmax_gym.envs.math.rubric import extract_answer

    want = " ".join(answer.split()).casefold()
    for i, message in enumerate(prefix):
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str) and content.strip():
            said = extract_answer(content) or content.strip()
            if " ".join(said.split()).casefold() == want:
                return i
    return None


def tasks_from_traces(logs: str | os.PathLike, env: Any, *, keep: str = "all", turn: str | int = "last-user",
                      answer_field: str | None = None, allow_invalid_calls: bool = False,
                      ) -> tuple[list[dict[str, Any]], TraceReport]:
    """Tasks (JSON-able dicts) for ``env`` (an unwrapped ToolEnv) from the traces in ``logs``, and
    the report. See the module docstring for ``keep``, ``turn``, ``answer_field``."""
    trusted = keep_filter(keep)
    if isinstance(turn, str) and turn not in TURNS:
        try:
            turn = int(turn)
        except ValueError:
            raise ValueError(f"--turn must be one of {TURNS} or a number N, got {turn!r}") from None
    if isinstance(turn, int) and turn < 1:
        raise ValueError(f"--turn N counts assistant messages from 1, got {turn}")
    _cut([], turn)  # a bad turn fails before any trace is read
    report, tasks = TraceReport(), []
    seen: set[bytes] = set()
    system = (env.system_prompt or "").strip()
    for where, record in read_traces(logs):
        report.traces += 1
        messages = conversation(record)
        if not messages or not all(isinstance(m, dict) for m in messages):
            report.skipped["not a chat trace"] += 1
            report.problem(where, record if isinstance(record, Unreadable) else "not a chat trace (no messages)")
            continue
        bad = check_calls(messages, env, where, report)
        if not trusted(record):
            report.skipped[f"not kept by --keep {keep}"] += 1
            continue
        end = _cut(messages, turn)
        if end is None or end == 0:
            report.skipped[f"no turn {turn!r} to cut at"] += 1
            continue
        if any(i < end for i in bad) and not allow_invalid_calls:
            report.skipped["a bad tool call in the prefix"] += 1
            continue
        answer = reference(messages, record, answer_field, env)
        if answer is None:
            report.skipped["no reference answer"] += 1
            report.problem(where, "no final answer to keep as the reference"
                           + (f" (field {answer_field!r} is missing or blank)" if answer_field else ""))
            continue
        prefix = [m for m in messages[:end] if not (m.get("role") == "system"
                                                    and str(m.get("content") or "").strip() == system)]
        try:
            prefix = check_messages(prefix, "messages")
        except ValueError as exc:
            report.skipped["malformed messages"] += 1
            report.problem(where, str(exc))
            continue
        given = _answer_given(prefix, answer)
        if given is not None:  # ("are you sure?" after the answer: the task is to repeat it)
            report.skipped["the reference already answered in the conversation"] += 1
            report.problem(where, f"message {given} already gives the reference answer {str(answer)[:80]!r}; "
                           "choose another --turn")
            continue
        # the same task as an earlier trace's: what the model sees and the answer (a task's identity
        # without its id and metadata, which only say where it came from)
        digest = task_digest(Task(id="", prompt="", messages=prefix, answer=answer))
        if digest in seen:
            report.duplicates += 1
            continue
        seen.add(digest)
        source_id = record.get("task_id") if isinstance(record, dict) else None
        metadata = {"source": "traces", "trace": where}
        if source_id is not None:
            metadata["trace_task_id"] = str(source_id)
        tasks.append({"id": f"trace-{len(tasks)}", "messages": prefix, "answer": answer, "metadata": metadata})
        report.kept += 1
    return tasks, report
