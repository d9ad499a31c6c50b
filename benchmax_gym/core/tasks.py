"""Tasks and where they come from.

A :class:`Task` is one problem: the text the model sees, the ground truth only the rubric sees,
and an optional worked solution only the reference solver sees. A :class:`TaskSource` is an
indexable collection of tasks; the engine picks an index with ``self.np_random`` or takes
``options["task_index"]``, so the same seed always yields the same task, in-process or in a worker.

Two kinds of source cover every family:

* :class:`GeneratedTasks` - item ``i`` of a generator with seed ``s`` is always the same item
  (reasoning-gym style), sized or infinite.
* :class:`DatasetTasks` - records from a Hugging Face dataset (hub id or local JSON / JSONL /
  Parquet files) turned into tasks by a mapping function.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import marshal
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# How many indices an "infinite" generated source exposes to random selection.
INFINITE = 2**62
# How many of a generated source's tasks its content hash reads (beside its seed, size and
# generator): item i of a seed is fixed, so these and the generator's settings name the rest.
HASHED_PREFIX = 8


@dataclass(frozen=True)
class Task:
    """One problem.

    Attributes:
        id: stable identifier (shown in ``info["task_id"]``).
        prompt: what the model is asked, as user-message text.
        answer: the ground truth; read only by the rubric, never put in ``obs`` or ``info``.
        solution: a worked solution for the reference solver (never shown to the model).
        metadata: what may be shown (difficulty, source, type): it is ``info["task_metadata"]``.
            Never put anything that reveals the answer here.
        files: files the episode starts with, ``{name: bytes or path}``, placed in the episode's
            workspace at reset (Excel's input workbook). Never the answer.
        private: what only the grader and the reference solver read (an expected final state,
            accepted aliases); like ``answer``, never in ``obs`` or ``info``.
        messages: a conversation the episode starts from (OpenAI chat messages: ``user``,
            ``assistant`` with ``tool_calls``, ``tool``; a ``system`` message is added to the
            env's own), shown before ``prompt``; ``prompt`` may then be ``""``. What a task made
            from an agent's trace holds (``benchmax-gym tasks from-traces``).
    """

    id: str
    prompt: str
    answer: Any = None
    solution: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, bytes | str] = field(default_factory=dict)
    private: Mapping[str, Any] = field(default_factory=dict)
    messages: Sequence[Mapping[str, Any]] = ()


def task_digest(task: Task) -> bytes:
    """A digest of everything that makes ``task`` what it is (what the model sees, the ground
    truth, the files by content or path): two tasks with the same digest are the same task."""
    def plain(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray)):
            return "sha256:" + hashlib.sha256(value).hexdigest()
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, (set, frozenset)):
            return sorted(map(repr, value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        return f"{type(value).__qualname__}:{value}"

    record = [task.id, task.prompt, list(task.messages), task.answer, task.solution, dict(task.metadata),
              dict(task.files), dict(task.private)]
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=plain, ensure_ascii=False).encode()).digest()


# -- drawing from a generator's numpy Generator (never global random) -------------------------


def rand_int(rng: np.random.Generator, low: int, high: int) -> int:
    """A uniform int in ``[low, high]``, both inclusive (as numbers read in task text)."""
    return int(rng.integers(low, high + 1))


def pick(rng: np.random.Generator, seq: Sequence[Any]) -> Any:
    """One element of ``seq``."""
    return seq[int(rng.integers(len(seq)))]


def sample(rng: np.random.Generator, seq: Sequence[Any], k: int) -> list[Any]:
    """``k`` distinct elements of ``seq``."""
    return [seq[int(i)] for i in rng.choice(len(seq), size=k, replace=False)]


def shuffled(rng: np.random.Generator, seq: Sequence[Any]) -> list[Any]:
    """The elements of ``seq`` in a random order."""
    return [seq[int(i)] for i in rng.permutation(len(seq))]


class TaskSource:
    """An indexable collection of tasks. Subclasses implement ``__len__`` and ``get``."""

    def __len__(self) -> int:
        raise NotImplementedError

    def get(self, index: int) -> Task:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Task:
        n = len(self)
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"task_index must be an int, got {type(index).__name__}")
        if not 0 <= index < n:
            raise IndexError(f"task_index {index} is out of range for {n} tasks")
        return self.get(int(index))

    def sample_index(self, rng: np.random.Generator) -> int:
        """Pick an index with the environment's generator (never global ``random``)."""
        return int(rng.integers(len(self)))

    def content_hash(self) -> str:
        """The task set's identity: a hash of its tasks, in order (``info["task_set"]`` at reset,
        ``task_set`` in an eval's ``run.json``; ``compare`` refuses runs whose hashes differ).
        Computed once per source, on first use."""
        cached = self.__dict__.get("_content_hash")
        if cached is None:
            cached = self._content_hash = "sha256:" + self.compute_hash().hexdigest()[:32]
        return cached

    def compute_hash(self) -> Any:
        """A ``hashlib`` object over every task in order (an unbounded source: its first
        :data:`HASHED_PREFIX`, and its length). Subclasses may hash something cheaper that
        identifies their tasks as surely."""
        n = len(self)
        digest = hashlib.sha256(f"tasks:{n}".encode())
        for i in range(min(n, HASHED_PREFIX) if n >= INFINITE else n):
            digest.update(task_digest(self.get(i)))
        return digest


class ListTasks(TaskSource):
    """Tasks held in memory (a list of :class:`Task`)."""

    def __init__(self, tasks: Sequence[Task]):
        if not tasks:
            raise ValueError("tasks must not be empty")
        self.tasks = list(tasks)
        check_unique_ids(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def get(self, index: int) -> Task:
        return self.tasks[index]


def check_unique_ids(tasks: Sequence[Task], where: str = "", place: Callable[[int], str] | None = None) -> None:
    """Refuse two tasks with one id: eval's records and statistics tell tasks apart by id, so
    two tasks sharing one were pooled as one task (an explicit id ``"2"`` and a task without an
    id at index 2, or the ids ``1`` and ``"1"``). ``place(i)`` says where a file holds task ``i``
    (``"dataset 'F' line 7"``): what the error names instead of the tasks' indices."""
    seen: dict[str, int] = {}
    for i, task in enumerate(tasks):
        first = seen.setdefault(task.id, i)
        if first != i:
            both = f"tasks[{first}] and tasks[{i}]"
            if place is not None:  # ("tasks 'F' line 2 and line 5" when both are in one file)
                one, other = place(first).rsplit(" ", 2), place(i).rsplit(" ", 2)
                both = " ".join(one) + " and " + " ".join(other[1:] if other[0] == one[0] else other)
            raise ValueError(f"{where}{both} share the id {task.id!r}: give each "
                             "task its own id (eval's records and statistics tell tasks apart by it)")


_TASK_KEYS = ("prompt", "answer", "id", "solution", "metadata", "messages")
_ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: Any, where: str = "messages") -> list[dict[str, Any]]:
    """A task's opening conversation, checked: OpenAI chat messages (``role`` one of system, user,
    assistant, tool; ``content`` text or None; an assistant's ``tool_calls`` with a function name
    and arguments; a tool message's ``tool_call_id``), not ending with an assistant turn (the model
    speaks next). Returns copies, tool-call arguments as JSON strings (the Chat Completions form)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where} must be a non-empty list of chat messages, got {messages!r}")
    out = []
    for i, m in enumerate(messages):
        here = f"{where}[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise ValueError(f"{here} must be a chat message with a role in {_ROLES}, got {m!r}")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{here}['content'] must be text or None, got {type(content).__name__}")
        message: dict[str, Any] = {"role": m["role"], "content": content or ""}
        if m["role"] == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], (list, tuple)):
                raise ValueError(f"{here}['tool_calls'] must be a list of calls, got {type(m['tool_calls']).__name__}")
            calls = []
            for j, call in enumerate(m["tool_calls"]):
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                    raise ValueError(f"{here}['tool_calls'][{j}] must be {{id, type, function: {{name, arguments}}}}")
                arguments = function.get("arguments", "{}")
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                calls.append({"id": str(call.get("id") or f"call_p{i}_{j}"), "type": "function",
                              "function": {"name": function["name"], "arguments": arguments}})
            message["tool_calls"] = calls
        if m["role"] == "tool":
            if not m.get("tool_call_id"):
                raise ValueError(f"{here}: a tool message needs its tool_call_id")
            message["tool_call_id"] = str(m["tool_call_id"])
            if m.get("name"):
                message["name"] = str(m["name"])
        out.append(message)
    if out[-1]["role"] == "assistant":
        raise ValueError(f"{where} ends with an assistant turn: a task's conversation ends where the model speaks "
                         "next (a user or tool message)")
    return out


def task_from_dict(record: Mapping[str, Any], index: int, where: str | None = None) -> Task:
    """``{"prompt" or "messages", "answer", "id", "solution", "metadata", ...}`` -> Task; a clear
    error names the index (``tasks[1]``), or ``where`` the record is when given (a file's
    ``"tasks 'F' line 3"``: a line's index among the records is not its line).

    Only ``prompt`` and ``messages`` are shown to the model and only ``metadata`` (and ``id``)
    appear in ``info``; every other key (``expected_state``, say) is grader-only, in ``task.private``.
    """
    here = f"tasks[{index}]" if where is None else f"{where}: task"
    has_messages = isinstance(record, Mapping) and record.get("messages") is not None
    if not isinstance(record, Mapping) or not (isinstance(record.get("prompt"), str)
                                               or (has_messages and record.get("prompt") is None)):
        raise ValueError(f"{here} must be a Task or a dict with a 'prompt' string or 'messages', "
                         f"got {record!r}")
    metadata = record.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise ValueError(f"{here}['metadata'] must be a dict (it is shown in info), got {metadata!r}")
    return Task(
        id=str(record.get("id", index)),
        prompt=record.get("prompt") or "",
        answer=record.get("answer"),
        solution=record.get("solution"),
        metadata=dict(metadata),
        private={k: v for k, v in record.items() if k not in _TASK_KEYS},
        messages=tuple(check_messages(record["messages"], f"{here}['messages']")) if has_messages else (),
    )


def given_tasks(tasks: Any) -> TaskSource | None:
    """Tasks a user hands over directly: a TaskSource, or a non-empty list of Tasks or task dicts.
    ``None`` for anything else (a family's named source, such as ``"generated"``)."""
    if isinstance(tasks, TaskSource):
        return tasks
    if isinstance(tasks, (list, tuple)) and tasks:
        return ListTasks([t if isinstance(t, Task) else task_from_dict(t, i) for i, t in enumerate(tasks)])
    return None


_GENERATED_HASHES: dict[tuple, Any] = {}  # (make, seed, size) -> GeneratedTasks.compute_hash's digest


class GeneratedTasks(TaskSource):
    """Tasks made on demand by ``make(rng, index) -> Task``.

    Item ``index`` is built from ``np.random.default_rng([seed, index])``, so it is the same
    item whatever order items are asked for. ``size=None`` means effectively infinite.
    """

    def __init__(
        self, make: Callable[[np.random.Generator, int], Task], *, seed: int = 0, size: int | None = None
    ):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise ValueError(f"size must be a positive int or None, got {size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self.make = make
        self.seed = seed
        self.size = size

    def __len__(self) -> int:
        return self.size if self.size is not None else INFINITE

    def get(self, index: int) -> Task:
        return self.make(np.random.default_rng([self.seed, index]), index)

    def compute_hash(self) -> Any:
        """The generator (its function and, for a config's method, the config's settings), seed
        and size, and the first :data:`HASHED_PREFIX` tasks (so a changed generator changes it):
        cheap whatever the size, and made once per process for equal generators (each env of a
        vector env or an eval has its own source: 64 evals' envs spent ~1 ms each on it)."""
        try:
            make = self.make  # (a bound method equals another only with the same self: compare the owners)
            key = (getattr(make, "__self__", None), getattr(make, "__func__", make), self.seed, self.size)
            digest = _GENERATED_HASHES.get(key)
        except TypeError:  # an unhashable generator: computed each time
            return self._compute_hash()
        if digest is None:
            if len(_GENERATED_HASHES) >= 1024:
                _GENERATED_HASHES.clear()
            digest = _GENERATED_HASHES[key] = self._compute_hash()
        return digest.copy()

    def _compute_hash(self) -> Any:
        make = self.make
        owner = getattr(make, "__self__", None)
        settings = repr(owner) if dataclasses.is_dataclass(owner) else ""
        digest = hashlib.sha256(f"generated:{getattr(make, '__qualname__', type(make).__qualname__)}:"
                                f"{settings}:{self.seed}:{self.size}".encode())
        for i in range(min(len(self), HASHED_PREFIX)):
            digest.update(task_digest(self.get(i)))
        return digest


class DatasetTasks(TaskSource):
    """Tasks from a Hugging Face ``datasets`` dataset, through ``to_task(record, index)``.

    ``path`` is a hub id (``"openai/gsm8k"``) or local files: a file, a directory, or a list of
    files in JSON, JSON Lines or Parquet. Records that ``to_task`` maps to ``None`` are skipped
    (e.g. MATH-500 problems whose answer is not a number, when only those are wanted).
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        to_task: Callable[[Mapping[str, Any], int], Task | None],
        *,
        split: str | None = None,
        name: str | None = None,
        limit: int | None = None,
        **load_kwargs: Any,
    ):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise ValueError(f"limit must be a positive int or None, got {limit!r}")
        records = None if limit is None else (_first_parquet_rows(path, split, load_kwargs)
                                              or _first_jsonl_rows(path, split, load_kwargs, limit))
        if records is None:
            records = load_records(path, split=split, name=name, **load_kwargs)
        tasks, indices = [], []
        for i, record in enumerate(_decoded(records, path)):
            task = to_task(record, i)
            if task is not None:
                tasks.append(task)
                indices.append(i)
                if len(tasks) == limit:  # (not a record more: past them a file may not even be read)
                    break
        if not tasks:
            raise ValueError(f"no usable tasks in {path!r} (split={split!r})")
        try:
            check_unique_ids(tasks)
        except ValueError:  # said again naming the two records' places (found only now: a failure)
            check_unique_ids(tasks, place=lambda k: record_where(path, indices[k]))
        self.tasks = tasks
        # what the records are (datasets' fingerprint: the files or hub revision and the loading
        # settings) and how they became tasks: the key of the content hash's cache on disk
        fingerprint = getattr(records, "_fingerprint", None)
        mapper = getattr(to_task, "__qualname__", type(to_task).__qualname__)
        code = getattr(getattr(to_task, "__func__", to_task), "__code__", None)
        try:  # the mapping's code too: an edited to_task makes other tasks from the same records
            code_digest = hashlib.sha256(marshal.dumps(code)).hexdigest() if code is not None else ""
        except ValueError:
            code_digest = ""
        self._hash_key = (hashlib.sha256(f"{fingerprint}:{getattr(to_task, '__module__', '')}.{mapper}:{code_digest}:"
                                         f"{limit}:{len(tasks)}".encode()).hexdigest()[:32] if fingerprint else None)

    def __len__(self) -> int:
        return len(self.tasks)

    def get(self, index: int) -> Task:
        return self.tasks[index]

    def content_hash(self) -> str:
        """As :meth:`TaskSource.content_hash`, kept on disk under the dataset's fingerprint and the
        mapping (``task-sets/`` in the cache): a large dataset is hashed once, not in every process."""
        if "_content_hash" in self.__dict__ or self._hash_key is None:
            return super().content_hash()
        from benchmax_gym.core.cache import cache_root, cached_file

        file = cache_root("task-sets") / self._hash_key
        try:
            cached = file.read_text().strip()
            if cached.startswith("sha256:"):
                self._content_hash = cached
                return cached
        except OSError:
            pass
        value = super().content_hash()
        try:  # (a random temp name: a link planted at a predictable one would have been written through)
            cached_file(file, lambda path: Path(path).write_text(value), whole=lambda path: False)
        except OSError:
            pass  # a read-only cache: hashed again next time
        return value


def _decoded(records: Any, path: Any):
    """``records`` one by one; a record whose text is not UTF-8 is an error naming the file and
    line (pyarrow's JSON reader keeps such text: it failed as a bare UnicodeDecodeError here)."""
    count = 0
    try:
        for record in records:
            yield record
            count += 1
    except UnicodeDecodeError as exc:
        files = _local_files(path)
        if files:  # (_unreadable names the file and line)
            raise ValueError(f"path {path!r}: {_unreadable(files, exc)}") from None
        raise ValueError(f"{record_where(path, count)}: {type(exc).__name__}: {exc}") from None


_BOM = b"\xef\xbb\xbf"


def record_where(path: Any, index: int, what: str = "dataset") -> str:
    """Where the ``index``-th record (counted from 0, in the order ``datasets`` and
    :class:`DatasetTasks` read them) of ``path`` is, as a user finds it: ``"dataset 'F' line N"``
    in a JSON Lines file (N as an editor numbers lines, blank lines counted: ``datasets`` skips
    them, so the record's index is not its line), ``"dataset 'F' record N"`` (N counted from 1)
    in a JSON array, Parquet or CSV file, or a hub dataset. ``F`` is the file of several that
    holds it. Read only for an error: it scans the files again."""
    try:
        files = _local_files(path)
    except (OSError, ValueError):
        files = None
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    if not files:
        return f"{what} {name!r} record {index + 1}"
    left = index
    try:
        for f in files:
            if os.path.splitext(f)[1] in (".json", ".jsonl") and not starts_json_array(f):
                with open(f, "rb") as lines:
                    for number, line in enumerate(lines, 1):
                        if (line.removeprefix(_BOM) if number == 1 else line).strip():
                            if left == 0:
                                return f"{what} {f!r} line {number}"
                            left -= 1
                continue
            if len(files) == 1:
                return f"{what} {f!r} record {index + 1}"
            count = _record_count(f)
            if count is None:
                break
            if left < count:
                return f"{what} {f!r} record {left + 1}"
            left -= count
    except (OSError, ValueError, RecursionError):
        pass
    return f"{what} {name!r} record {index + 1}"


def _record_count(file: str) -> int | None:
    """How many records a JSON array or Parquet file holds; None for another kind."""
    if file.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(file).metadata.num_rows
    if file.endswith((".json", ".jsonl")):
        data = json.loads(Path(file).read_bytes())
        return len(data) if isinstance(data, list) else 1
    return None


def numbered_jsonl(path: str | os.PathLike, what: str, limit: int | None = None) -> list[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of a JSON Lines file, the first ``limit``
    of them only when given (the lines after those are never read: a bad one cannot fail the
    load); a line that is not UTF-8 JSON is an error naming the file and line (a byte-order mark
    is read as the mark); a missing file is a FileNotFoundError saying so, naming ``what``."""
    name = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{what} {name!r} is a directory, not a JSON Lines file")
    if not os.path.exists(path):  # (said as MCP-v0's tasks= says it; still an OSError for callers)
        raise FileNotFoundError(f"{what}: no such file {name!r}")
    if not os.path.isfile(path):  # a FIFO or a device: opening it blocked, or never ended
        raise ValueError(f"{what} {name!r} is not a regular file")
    records: list[tuple[int, Any]] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if limit is not None and len(records) >= limit:
                break
            if number == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # (Windows editors write one)
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{what} {name!r} line {number}: not UTF-8 text (byte {exc.start} of the line); "
                                 "save the file as UTF-8") from None
            except ValueError as exc:
                raise ValueError(f"{what} {name!r} line {number}: not JSON ({exc})") from None
            except RecursionError:
                raise ValueError(f"{what} {name!r} line {number}: JSON nested too deeply to read") from None
            records.append((number, record))
    return records


def starts_json_array(path: str | os.PathLike) -> bool:
    """Whether a file's first character past white space (and a byte-order mark) is ``[``: a JSON
    array, which is parsed whole, where JSON Lines can be read a line at a time."""
    with open(path, "rb") as f:
        head = f.read(1 << 16).removeprefix(b"\xef\xbb\xbf").lstrip()
        while not head and (chunk := f.read(1 << 16)):
            head = chunk.lstrip()
    return head[:1] == b"["


_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_records(
    path: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    split: str | None = None,
    name: str | None = None,
    **load_kwargs: Any,
):
    """Load a dataset split with ``datasets.load_dataset``: local files or a hub id.

    Local files go through the ``json``/``parquet``/``csv`` builders (the original formats
    of most benchmarks; a CSV file's cells are read as the text they hold, see
    :func:`_csv_as_text`); anything else is treated as a hub id. Returns a ``datasets.Dataset``.
    """
    import datasets  # imported here: it costs ~1 s and generated tasks never need it

    expanded = _local_files(path)
    if expanded is None:
        files = [os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)]
        return _load_from_hub(datasets, files[0], name, split or "train", load_kwargs)
    builder = _FILE_BUILDERS[os.path.splitext(expanded[0])[1]]
    if builder == "csv":
        load_kwargs = {**_csv_as_text(expanded[0], load_kwargs), **load_kwargs}
    too_deep = next(filter(None, map(_too_deep, expanded)), None) if builder == "json" else None
    if too_deep:
        raise ValueError(f"path {path!r}: cannot read it as JSON: {too_deep}")
    try:
        return datasets.load_dataset(builder, data_files=expanded, split=split or "train", **load_kwargs)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # datasets' DatasetGenerationError, pyarrow's, a bare StopIteration...
        raise ValueError(f"path {path!r}: cannot read it as {builder.upper()}: {_unreadable(expanded, exc)}") from exc


# Brackets a JSON Lines line may hold before it is parsed here to see how deep it nests (Python's
# parser refuses ~1000 levels, as load_tasks does; pyarrow's, which datasets uses, crashed the
# process with a segmentation fault at ~15000).
_DEEP = 1000


def _too_deep(file: str) -> str | None:
    """Which line of a JSON Lines file nests too deeply to read (file and line), checked before
    ``datasets`` hands it to pyarrow. Only a line longer than ``2 * _DEEP`` bytes can, so the
    scan finds those with numpy (~1 ns a byte) and counts their brackets; a JSON array
    (``datasets`` parses it with ujson, which has a depth limit) is not scanned."""
    with open(file, "rb") as f:
        number = 1
        while chunk := f.read(1 << 22):
            if number == 1 and chunk.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"[":
                return None
            chunk += f.readline()
            ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == ord("\n"))
            bounds = np.concatenate(([-1], ends, [len(chunk)]))
            for k in np.flatnonzero(np.diff(bounds) > 2 * _DEEP):
                line = chunk[bounds[k] + 1:bounds[k + 1]]
                if line.count(b"[") + line.count(b"{") > _DEEP:
                    try:
                        json.loads(line)
                    except RecursionError:
                        return f"{file} line {number + k}: JSON nested too deeply to read"
                    except ValueError:
                        pass  # not JSON: datasets fails on it, and _unreadable names it
            number += len(ends)
    return None


def _local_files(path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str] | None:
    """The local data files ``path`` names (a folder's in name order), all of one kind and each a
    regular file (a FIFO blocked the reader, or read as empty); None for a hub id."""
    files = [os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)]
    local = all(os.path.exists(f) for f in files)
    looks_local = any(
        f.startswith(("/", "./", "../", "~")) or os.path.splitext(f)[1] in _FILE_BUILDERS for f in files
    )
    if not local and (looks_local or len(files) != 1):
        missing = [f for f in files if not os.path.exists(f)]
        raise FileNotFoundError(f"path {path!r}: no such file(s): {missing}")
    if not local:
        return None
    expanded: list[str] = []
    for f in files:
        if os.path.isdir(f):
            expanded += sorted(
                os.path.join(f, n) for n in os.listdir(f) if os.path.splitext(n)[1] in _FILE_BUILDERS
            )
        else:
            expanded.append(f)
    kinds = {_FILE_BUILDERS.get(os.path.splitext(f)[1]) for f in expanded}
    if not expanded or None in kinds or len(kinds) != 1:
        raise ValueError(
            f"path {path!r}: expected JSON, JSON Lines, Parquet or CSV files of one kind, "
            f"got {expanded or 'no data files'}"
        )
    odd = next((f for f in expanded if not os.path.isfile(f)), None)
    if odd is not None:
        raise ValueError(f"path {path!r}: {odd} is not a regular file")
    return expanded


def _same_kind_local_files(path: Any, split: str | None, load_kwargs: Mapping[str, Any],
                           suffixes: tuple[str, ...]) -> list[str] | None:
    """The local files ``path`` names, in the order :func:`load_records` hands them to ``datasets``
    (which reads them in that order: a folder's by name), when they all end with one of
    ``suffixes`` (the same one) and nothing else (a split, loader arguments) asks for ``datasets``'
    own reading; else None."""
    if split not in (None, "train") or load_kwargs:
        return None
    try:
        files = _local_files(path)
    except (OSError, ValueError):
        return None
    kinds = {os.path.splitext(f)[1] for f in files or ()}
    return files if len(kinds) == 1 and kinds <= set(suffixes) else None


def _rest_of_full_load(path: Any, split: str | None, done: int):
    """The records after the first ``done`` as ``datasets`` reads all of ``path``: where a fast
    path cannot tell what it makes of the rest (and it says what is wrong, if anything)."""
    records = load_records(path, split=split)
    return records.select(range(done, len(records)))


def _first_parquet_rows(path: Any, split: str | None, load_kwargs: Mapping[str, Any]):
    """The records of local Parquet files (one, a folder's or a list's), read a batch at a time with
    pyarrow, a file after another, for a source that keeps only its first tasks: ``datasets``
    converts every file to Arrow first (seconds and hundreds of MiB for eval's ``--tasks 5`` of a
    large file). Parquet stores each column's type, so these are the records ``datasets`` gives, as
    long as every column is plain (numbers, text, lists and structs of them) and the first file
    holds no ``datasets`` features (images, class labels: decoded by it). None where that does not
    hold: the full load then reads them (and says what is wrong). ``datasets`` casts every file to
    the first's columns: a later file whose columns differ (or that is not Parquet) is read from
    the full load."""
    files = _same_kind_local_files(path, split, load_kwargs, (".parquet",))
    if files is None:
        return None
    import pyarrow.parquet as pq

    try:
        first = pq.ParquetFile(files[0])
        schema = first.schema_arrow
    except Exception:  # not Parquet: the full load says why
        return None
    if b"huggingface" in (schema.metadata or {}) or not all(_plain_arrow(f.type) for f in schema):
        first.close()
        return None

    def opened(file: str):
        """``file`` as Parquet with the first file's columns; None where it is not."""
        try:
            parquet = pq.ParquetFile(file)
        except Exception:
            return None
        if parquet.schema_arrow.equals(schema):
            return parquet
        parquet.close()
        return None

    def rows():
        done = 0
        for i, file in enumerate(files):
            parquet = first if i == 0 else opened(file)
            if parquet is None:
                yield from _rest_of_full_load(path, split, done)
                return
            with parquet:
                try:
                    for batch in parquet.iter_batches(batch_size=256):
                        records = batch.to_pylist()
                        done += len(records)
                        yield from records
                except (OSError, ValueError) as exc:  # (pyarrow's errors are both)
                    raise ValueError(f"path {path!r}: cannot read it as PARQUET: {type(exc).__name__}: {exc}") from None

    return rows()


def _first_jsonl_rows(path: Any, split: str | None, load_kwargs: Mapping[str, Any], limit: int):
    """The records of local JSON Lines files (one, a folder's or a list's), read from the start a
    batch of lines at a time (``limit`` lines, then twice as many...), a file after another, for a
    source that keeps only its first tasks: ``datasets`` converts every file first (eval's
    ``--tasks 5`` of a large file read all of it, and a bad line anywhere failed it). Each batch goes
    through pyarrow's JSON reader, as ``datasets`` reads a file, so these are the records it gives
    (dates as datetimes, a key missing as None) as long as the rows are flat (numbers, text, lists
    of them) and no later row changes a column's type (an int column that a float further down
    makes ``datasets`` read as floats). None where the first batch is not such rows (or the first
    file has none): the full load reads the files (and says what is wrong). ``datasets`` casts
    every batch to the first's columns: a later batch that is not such rows, or whose columns
    differ, is read from the full load too."""
    files = _same_kind_local_files(path, split, load_kwargs, (".jsonl", ".json"))
    if files is None:
        return None
    f = open(files[0], "rb")
    first = _flat_jsonl_batch(f, limit, start=True)
    if first is None or not first.num_rows:
        f.close()
        return None

    def rows():
        nonlocal f
        batch, size, done, later = first, limit, 0, iter(files[1:])
        try:
            while batch is not None and batch.schema.equals(first.schema):
                records = batch.to_pylist()
                done += len(records)
                yield from records
                size *= 2
                batch = _flat_jsonl_batch(f, size)
                while batch is not None and not batch.num_rows:  # this file is read: the next one
                    f.close()
                    if (file := next(later, None)) is None:
                        return
                    f = open(file, "rb")
                    batch = _flat_jsonl_batch(f, size, start=True)
        finally:
            f.close()
        yield from _rest_of_full_load(path, split, done)  # (the batch is not such rows)

    return rows()


def _flat_jsonl_batch(f: Any, count: int, start: bool = False) -> Any:
    """The next ``count`` records of the JSON Lines file ``f`` (fewer at its end, none past it) as a
    table of pyarrow's JSON reader; None when a line is not a flat JSON object (or the reader
    refuses them)."""
    import pyarrow as pa
    import pyarrow.json as paj

    lines = []
    while len(lines) < count and (line := f.readline()):
        if start and not lines:
            line = line.removeprefix(b"\xef\xbb\xbf")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            return None
        flat = isinstance(record, dict) and all(
            not isinstance(v, (dict, list)) or (isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v))
            for v in record.values())
        if not flat:
            return None
        lines.append(line.rstrip(b"\r\n"))
    if not lines:
        return pa.table({})
    data = b"\n".join(lines)
    try:
        return paj.read_json(pa.BufferReader(data), read_options=paj.ReadOptions(block_size=len(data) + 1))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # mixed types: datasets reads them its own way
        return None


def _plain_arrow(kind: Any) -> bool:
    """An Arrow type whose Python values ``datasets`` gives as pyarrow does (no decoding, casting)."""
    import pyarrow as pa
    import pyarrow.types as t

    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind):
        return _plain_arrow(kind.value_type)
    if t.is_struct(kind):
        return all(_plain_arrow(kind.field(i).type) for i in range(kind.num_fields))
    return (t.is_integer(kind) or kind in (pa.float32(), pa.float64(), pa.bool_(), pa.null())
            or t.is_string(kind) or t.is_large_string(kind))


def _csv_as_text(file: str, load_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``load_dataset`` arguments that read every column of a CSV file as the text it holds:
    pandas' guesses turned answers into other answers (``007`` into 7.0, ``1.50`` into 1.5, ``NA``
    and ``None`` into missing). Only an empty cell is missing. Nothing when the header cannot be
    read here (``datasets`` then says why) or names a column twice."""
    import csv

    import datasets

    if "features" in load_kwargs:
        return {}
    try:
        with open(file, encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f, delimiter=load_kwargs.get("sep", load_kwargs.get("delimiter", ",")) or ","))
    except (OSError, ValueError, StopIteration, csv.Error):
        return {}
    if not header or len(set(header)) != len(header):
        return {}
    return {"features": datasets.Features({name: datasets.Value("string") for name in header}),
            "keep_default_na": False, "na_values": [""]}


def _unreadable(files: list[str], exc: BaseException) -> str:
    """Why ``datasets`` could not read local ``files``, in one line: the first empty file, or
    the first JSON Lines line that is not a UTF-8 JSON object (file and line, as
    :func:`benchmax_gym.data.load_tasks` names them), else the innermost cause's message (pandas
    names a CSV's line, pyarrow a Parquet's footer). Only on failure: a good file is never read twice."""
    for f in files:
        try:
            if os.path.getsize(f) == 0:
                return f"{f} is empty"
            if os.path.splitext(f)[1] not in (".json", ".jsonl"):
                continue
            if os.path.splitext(f)[1] == ".json":
                with open(f, "rb") as head:
                    if head.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"[":
                        continue  # a JSON array: pyarrow's message below
            for number, record in numbered_jsonl(f, "file"):
                if not isinstance(record, dict):
                    return f"{f} line {number}: expected a JSON object, got {type(record).__name__}"
        except ValueError as bad:  # "file 'F' line N: why", said as "F line N: why"
            return f"{f}{str(bad).removeprefix(f'file {f!r}')}"
        except OSError as bad:
            return f"{f}: {bad}"
    cause = exc
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    return f"{type(cause).__name__}: {str(cause).strip() or type(exc).__name__}".splitlines()[0][:500]


HUB_CONNECT_TIMEOUT = 3.0  # seconds a TCP connect to the hub may take before it counts as unreachable


def _load_from_hub(datasets: Any, hub_id: str, name: str | None, split: str, load_kwargs: dict[str, Any]):
    """``datasets.load_dataset`` for a hub id, failing fast with a one-line ConnectionError when the
    hub cannot serve it: offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) without a
    cached copy, or an endpoint that refuses a TCP connect or lets it time out (``datasets``
    would otherwise retry for ~25 s and raise through 50 lines of its internals)."""
    offline = datasets.config.HF_HUB_OFFLINE
    remedy = ("pass local files (JSON, JSON Lines, Parquet) instead: task_args={'dataset': PATH} "
              "(CLI: --env-arg task_args.dataset=PATH)")
    if not offline:
        from huggingface_hub import constants

        problem = _unreachable(constants.ENDPOINT)
        if problem:
            raise ConnectionError(
                f"dataset {hub_id!r}: the Hugging Face hub at {constants.ENDPOINT} is unreachable ({problem}); "
                f"set HF_HUB_OFFLINE=1 to use a cached copy, or {remedy}"
            )
    try:
        return datasets.load_dataset(hub_id, name, split=split, **load_kwargs)
    except ConnectionError as exc:  # datasets' own, e.g. offline with nothing cached
        why = "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and it is not cached" if offline else exc
        raise ConnectionError(f"dataset {hub_id!r}: {why}; {remedy}") from None


def _unreachable(url: str) -> str | None:
    """Why a TCP connection to ``url``'s host (or the proxy for it) fails; None when it opens."""
    import socket
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        parts = urllib.parse.urlsplit(proxy if "//" in proxy else f"http://{proxy}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname, port), timeout=HUB_CONNECT_TIMEOUT).close()
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
