"""Typed task sources: each family declares its named sources as small frozen dataclasses.

A source's fields are its arguments, checked where they are declared; ``build(env)`` makes the
:class:`~benchmax_gym.core.tasks.TaskSource`. A user picks one by name with arguments, or
hands an instance over::

    gym.make("benchmax/Math-v0", tasks="gsm8k", task_args={"dataset": "train.jsonl", "limit": 100})
    gym.make("benchmax/Math-v0", tasks=GSM8K(dataset="train.jsonl", limit=100))

An argument the chosen source does not take fails at ``gym.make`` naming the ones it does take
(and the source it belongs to). Wikipedia's backends use the same shape (``backend_args``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from benchmax_gym.core.checks import Checked, arg, non_negative_int, optional, positive_size
from benchmax_gym.core.tasks import DatasetTasks, GeneratedTasks, ListTasks, Task, TaskSource, given_tasks
from benchmax_gym.core.warn import warn


__all__ = ["GeneratedSource", "SourceConfig", "arg", "choose", "task_source"]


@dataclass(frozen=True)
class SourceConfig(Checked):
    """A named, typed choice (a task source, a backend). Subclasses set ``name`` and fields
    (declared with :func:`arg` and their checks)."""

    name: ClassVar[str] = ""

    @classmethod
    def arg_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def required(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)

    def build(self, env: Any) -> Any:
        """The TaskSource (or backend) this config describes; ``env`` is the family env being made."""
        raise NotImplementedError


@dataclass(frozen=True)
class GeneratedSource(SourceConfig):
    """A seeded generator: item ``i`` of ``task_seed`` is always the same task (whatever order
    items are asked for); ``num_tasks=None`` is unbounded. Families add ``difficulty``."""

    name: ClassVar[str] = "generated"
    num_tasks: int | None = arg(None, optional(positive_size))  # (10**30 failed every reset)
    task_seed: int = arg(0, non_negative_int)

    def make_task(self, rng: Any, index: int) -> Task:
        raise NotImplementedError

    def build(self, env: Any) -> GeneratedTasks:
        return GeneratedTasks(self.make_task, seed=self.task_seed, size=self.num_tasks)


def _names(options: Sequence[type[SourceConfig]]) -> str:
    return ", ".join(repr(o.name) for o in options)


def _takes(cls: type[SourceConfig], what: str) -> str:
    names = cls.arg_names()
    return f"{what}={cls.name!r} takes " + (", ".join(names) if names else "no arguments")


def choose(
    value: Any,
    args: Mapping[str, Any] | None,
    options: Sequence[type[SourceConfig]],
    legacy: MutableMapping[str, Any] | None = None,
    *,
    what: str = "tasks",
) -> SourceConfig | None:
    """The config ``value`` names (with ``args``), or ``value`` itself if it is one; ``None`` when
    ``value`` is something else (tasks handed over directly), which then takes no arguments.

    ``legacy``: the family's remaining keyword arguments. Any of them that is a field of one of
    ``options`` is taken out: used with a DeprecationWarning when the chosen source takes it
    (the flat form of 0.1, ``tasks="gsm8k", dataset=...``), an error naming its source otherwise.
    """
    args_name = f"{what.rstrip('s')}_args" if what == "tasks" else f"{what}_args"
    owners: dict[str, list[str]] = {}
    for option in options:
        for name in option.arg_names():
            owners.setdefault(name, []).append(option.name)
    flat = {k: legacy.pop(k) for k in list(legacy or ()) if k in owners}
    if args is not None and not isinstance(args, Mapping):
        raise ValueError(f"{args_name} must be a dict of the source's arguments, got {args!r}")
    given = {**flat, **(args or {})}
    if isinstance(value, SourceConfig):
        if given:
            raise ValueError(f"{args_name} ({', '.join(given)}) apply to {what} given by name; "
                             f"{type(value).__name__} already holds its arguments")
        return value
    cls = next((o for o in options if isinstance(value, str) and o.name == value), None)
    if cls is None:
        if isinstance(value, str):
            close = difflib.get_close_matches(value, [o.name for o in options], n=1)
            raise ValueError(f"{what} must be one of {_names(options)}"
                             + (", a config instance or your own tasks" if what == "tasks" else " or a config instance")
                             + f", got {value!r}"
                             + (f" (did you mean {close[0]!r}?)" if close else ""))
        if given:
            raise ValueError(f"{', '.join(given)} " + ("applies" if len(given) == 1 else "apply")
                             + f" only to {what} given by name ({_names(options)})")
        return None
    wrong = [k for k in given if k not in cls.arg_names()]
    if wrong:
        why = []
        for k in wrong:
            if k in owners:
                why.append(f"{k} applies only to {what}=" + " or ".join(map(repr, owners[k])))
            else:
                close = difflib.get_close_matches(k, cls.arg_names(), n=1)
                why.append(f"unknown {args_name} key {k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"{'; '.join(why)}; {_takes(cls, what)}")
    if flat:
        warn(f"passing {', '.join(flat)} to the environment directly is deprecated; "
             f"use {args_name}={{{', '.join(repr(k) + ': ...' for k in flat)}}} "
             f"(on the command line: {' '.join(f'--env-arg {args_name}.{k}=...' for k in flat)})", DeprecationWarning)
    missing = [k for k in cls.required() if k not in given]
    if missing:
        raise ValueError(f"{what}={cls.name!r} needs {args_name} {', '.join(missing)}; {_takes(cls, what)}")
    return cls(**given)


def task_source(env: Any, tasks: Any, task_args: Mapping[str, Any] | None,
                options: Sequence[type[SourceConfig]], legacy: MutableMapping[str, Any]) -> TaskSource:
    """A family's TaskSource from its ``tasks``/``task_args`` (see :func:`choose`); tasks handed
    over directly (a TaskSource, a list of Tasks or dicts) are used as they are.
    The chosen config is kept as ``env.task_config`` (None for tasks handed over)."""
    config = choose(tasks, task_args, options, legacy)
    env.task_config = config
    if config is not None:
        return require_answers(config.build(env), env)
    source = given_tasks(tasks)
    if source is None:
        raise ValueError(f"tasks must be one of {_names(options)}, a config instance, a TaskSource or a "
                         f"non-empty list of tasks, got {tasks!r}")
    return require_answers(source, env)


def require_answers(source: TaskSource, env: Any) -> TaskSource:
    """``source``, checked that each task held in memory (a list, a dataset) has a ground truth:
    the families that call :func:`task_source` grade every episode against ``task.answer``, and a
    task without one (``None``, or blank text) would be scored against nothing (Math's grader
    gave ``\\boxed{None}`` full reward). Refused at make, naming the task."""
    if isinstance(source, (ListTasks, DatasetTasks)):
        for i, task in enumerate(source.tasks):
            answer = task.answer
            if answer is None or (isinstance(answer, str) and not answer.strip()):
                raise ValueError(f"tasks[{i}] (id {task.id!r}) has no answer (got {answer!r}): "
                                 f"{type(env).__name__} grades each episode against its task's answer; "
                                 "give every task one, or leave the task out")
    return source
