"""Data in and out: tasks from a user's documents (:mod:`.corpus`, :mod:`.questions`) and from
agents' traces (:mod:`.traces`), SFT data from scored episodes (:mod:`.sft`), and reading the
task files they write (:func:`load_tasks`).

Each writes tasks as JSON Lines, one ``{id, prompt or messages, answer, solution, metadata}``
object a line, what every family's ``tasks=`` takes as a list::

    from benchmax_gym.data import load_tasks
    env = gym.make("benchmax/Math-v0", tasks=load_tasks("tasks.jsonl"))
"""

from __future__ import annotations

import json
import os
from typing import Any

from benchmax_gym.core.tasks import ListTasks, check_unique_ids, numbered_jsonl, task_from_dict


def read_jsonl(path: str | os.PathLike, what: str = "file") -> list[dict[str, Any]]:
    """The JSON objects of a JSON Lines file; a bad line is an error naming the file and line."""
    return [record for _, record in numbered_jsonl(path, what)]


def load_tasks(path: str | os.PathLike) -> ListTasks:
    """The tasks of a JSON Lines file written by ``benchmax-gym tasks ...`` (or by hand), checked
    as ``gym.make`` checks tasks handed over; a bad record is an error naming the file and its
    line (not its index among the records: blank lines are skipped)."""
    records = numbered_jsonl(path, "tasks")
    if not records:
        raise ValueError(f"tasks {os.fspath(path)!r} holds no tasks")
    where = [f"tasks {os.fspath(path)!r} line {number}" for number, _ in records]
    tasks = [task_from_dict(record, i, where[i]) for i, (_, record) in enumerate(records)]
    check_unique_ids(tasks, place=where.__getitem__)  # (two lines with one id: named by their lines)
    return ListTasks(tasks)


def write_jsonl(path: str | os.PathLike, records: list[dict[str, Any]]) -> None:
    """Write ``records`` as JSON Lines (through a temporary file, renamed: never half a file)."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)
