"""Tasks for MCP-v0: the user's own (a list of dicts or a JSON/JSONL file) or the bundled examples.

A task dict has ``prompt`` and, optionally, ``answer`` (what your reward functions compare
against), ``id``, ``metadata`` and ``solution`` (what the reference solver replays:
``{"calls": [[tool, {args}], ...], "final": "reply that ends the episode"}``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmax_gym.core.tasks import (GeneratedTasks, Task, TaskSource, check_unique_ids, given_tasks, numbered_jsonl,
                                     pick, rand_int, task_from_dict)

_TOPICS = ("groceries", "meeting", "travel", "garden", "books", "recipes", "budget", "music")
_WORDS = ("apples", "Tuesday", "passport", "tomatoes", "chapter 4", "flour", "rent", "piano", "milk", "train")


def example_task(rng: np.random.Generator, index: int) -> Task:
    """Save a note, then compute with the calculator: both the server's state and the answer count."""
    title = f"{pick(rng, _TOPICS)} {index}"
    text = f"{pick(rng, _WORDS)} and {pick(rng, _WORDS)}"
    a, b, c = rand_int(rng, 11, 99), rand_int(rng, 11, 99), rand_int(rng, 1, 999)
    expression = f"{a} * {b} + {c}"
    value = str(a * b + c)
    return Task(
        id=f"notes-{index}",
        prompt=(
            f"Save a note titled '{title}' with the text '{text}'. Then use the calculator to compute "
            f"{expression}, and reply with only the number inside <answer></answer>."
        ),
        answer={"note_title": title, "note_text": text, "value": value},
        solution={
            "calls": [["add_note", {"title": title, "text": text}], ["calculate", {"expression": expression}]],
            "final": f"<answer>{value}</answer>",
        },
        metadata={"source": "example"},
    )


def example_tasks(seed: int = 0, size: int | None = None) -> GeneratedTasks:
    return GeneratedTasks(example_task, seed=seed, size=size)


def user_tasks(tasks: str | os.PathLike | Sequence[Any] | TaskSource) -> TaskSource:
    """A TaskSource from a list of dicts/Tasks or a JSON (array) / JSON Lines file."""
    if isinstance(tasks, TaskSource):
        return tasks
    if isinstance(tasks, (str, os.PathLike)):
        return _file_tasks(tasks)
    if isinstance(tasks, (Mapping, bytes, bytearray)):  # (a dict's keys were read as its tasks)
        raise ValueError(f"tasks must be a list of task dicts, a JSON/JSONL file or a TaskSource, "
                         f"got a {type(tasks).__name__}: {tasks!r:.80}")
    source = given_tasks(list(tasks))
    if source is None:
        raise ValueError("tasks must not be empty")
    return source


def _file_tasks(file: str | os.PathLike) -> TaskSource:
    """The tasks of a JSON array or JSON Lines file; any fault names ``tasks``, the file and, in
    JSON Lines, the line."""
    name = os.fspath(file)
    if os.path.isdir(file):
        raise ValueError(f"tasks {name!r} is a directory, not a JSON/JSONL file of tasks")
    if not os.path.exists(file):
        raise ValueError(f"tasks: no such file {name!r}")
    if Path(file).suffix != ".json":
        records = numbered_jsonl(file, "tasks")  # (not a regular file, not UTF-8, not JSON: named, with its line)
        where = [f"tasks {name!r} line {number}" for number, _ in records]
        tasks = [task_from_dict(record, i, where[i]) for i, (_, record) in enumerate(records)]
        check_unique_ids(tasks, place=where.__getitem__)  # (two lines with one id: named by their lines)
    else:
        if not os.path.isfile(file):  # a FIFO or a device: opening it blocked, or never ended
            raise ValueError(f"tasks {name!r} is not a regular file")
        try:
            tasks = json.loads(Path(file).read_bytes().decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"tasks {name!r}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"tasks {name!r} is not valid JSON: {exc}") from None
        if not isinstance(tasks, list):
            raise ValueError(f"tasks {name!r} must hold a JSON array of task dicts (or be JSON Lines, .jsonl), "
                             f"got a JSON {type(tasks).__name__}")
    if not tasks:
        raise ValueError(f"tasks {name!r} holds no tasks")
    return given_tasks(tasks)
