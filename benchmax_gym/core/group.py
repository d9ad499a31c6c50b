"""Group rewards: score the k rollouts of one task together.

GRPO-style trainers sample k rollouts of each task; some rewards only make sense across them:
a rank within the group, a bonus for the best of k, a penalty for answering like a sibling, a
judge that compares the k answers side by side (:meth:`~benchmax_gym.core.judge.JudgeRubric.group`).
A Gymnasium episode cannot see its siblings, so a :class:`GroupRubric` is called by whoever
holds the group, on the finished episodes' records (``env.unwrapped.episode_record()``, eval's
records, an adapter's episodes):

* a vector env: reset with ``options=[{"task_index": i}] * k``, play, then
  :func:`score_vector_group` (or :func:`score_groups` on records you kept);
* ``benchmax_gym.eval.evaluate(..., k=8, group_rubric=...)``: each task's k samples;
* the trainer adapters (TRL's batch, or the hook each trainer offers: see the README).

An env may carry its own: ``env.unwrapped.group_rubric`` (a benchmax env whose class defines
``compute_group_reward`` gets one, :mod:`benchmax_gym.core.benchmax`); holders use it when given
none.

A group function asks for what it needs by parameter name, one list entry per member, and
returns one score per member (a float, or a dict of named floats, as benchmax's
``compute_group_reward`` does):

* ``rewards`` - each member's own reward (its rubric's),
* ``completions`` - each member's final assistant text,
* ``messages`` - each member's transcript,
* ``records`` - the records themselves,
* ``task`` / ``answer`` - the task and its ground truth (when the holder has it, else None),
* ``prompt`` - the task's text.

``combine="add"`` (default): a member's reward is its own plus the weighted group scores (what
benchmax does: group dicts "are merged with the results of compute_reward");
``combine="replace"``: the weighted group scores alone (a rank replaces the raw reward).

Failed episodes (an outcome that is a failure: :mod:`benchmax_gym.core.outcomes`) never enter a
group: they are not members, their record comes back unchanged (reward ``None``). A component
that raises :class:`~benchmax_gym.core.outcomes.RewardFailure` (a judge down) fails every member
of that group with its outcome; any other exception scores 0 for that component, as in a
:class:`~benchmax_gym.core.rubric.Rubric`, with ``group_errors`` saying why. Each function is
bounded as a rubric's leaves are (``GroupRubric(..., timeout=60)``, a function's own
``reward_timeout`` instead): past it, it scores 0 for every member with a ``reward_timeout``
error (the members' texts are the model's, and a hung grader would hang whoever holds the group).

Example::

    group = GroupRubric([("rank", relative_rank, 1.0)], combine="replace")
    envs = gym.make_vec("benchmax/Math-v0", num_envs=8)
    envs.reset(seed=0, options=[{"task_index": 3}] * 8)
    ...                                   # play until every episode has ended
    records = score_vector_group(envs, group)   # [{"reward": ..., "group_components": {"rank": ...}}, ...]
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmax_gym.core.aio import run_sync
from benchmax_gym.core.outcomes import RewardFailure, is_failure
from benchmax_gym.core.rubric import (_UNSET, DEFAULT_TIMEOUT, _bounded, _check_timeout, _finite, _LeafTimeout,
                                      _numbered, _timed_out, _within, derived_name)

log = logging.getLogger(__name__)

GROUP_CONTEXT = ("rewards", "completions", "messages", "records", "task", "answer", "prompt")
COMBINE = ("add", "replace")


@dataclass
class GroupFn:
    """One group component: ``name``, ``fn`` (sync or async, lists in, one score per member out), ``weight``."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    auto_name: str | None = field(default=None, repr=False)  # the derived name, numbered on a clash; None: the user's
    params: tuple[str, ...] = field(init=False)
    is_async: bool = field(init=False)
    own_timeout: Any = field(init=False, repr=False)  # the function's ``reward_timeout``, when it carries one

    def __post_init__(self):
        sig = inspect.signature(self.fn)
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        self.params = GROUP_CONTEXT if accepts_any else tuple(n for n in sig.parameters if n in GROUP_CONTEXT)
        unknown = [n for n, p in sig.parameters.items() if n not in GROUP_CONTEXT and p.default is p.empty
                   and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if unknown:
            raise TypeError(f"group reward function {self.name!r} asks for {unknown}; group reward functions "
                            f"may take any of {list(GROUP_CONTEXT)}")
        call = getattr(self.fn, "__call__", None)
        self.is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(call)
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"weight of group reward function {self.name!r} must be a finite number, "
                             f"got {self.weight!r}")
        self.own_timeout = getattr(self.fn, "reward_timeout", _UNSET)
        if self.own_timeout is not _UNSET:
            _check_timeout(f"reward_timeout of {self.name!r}", self.own_timeout)


class GroupRubric:
    """Group components over the k rollouts of one task; see the module docstring.

    Args:
        funcs: functions, ``(name, fn, weight)`` tuples or :class:`GroupFn`.
        combine: ``"add"`` (own reward + group scores) or ``"replace"`` (group scores only).
        timeout: seconds each function may take (None: unbounded); past it, it scores 0 for every
            member with a ``reward_timeout`` error in ``group_errors`` (module docstring).
    """

    def __init__(self, funcs: Iterable[GroupFn | tuple | Callable[..., Any]], *, combine: str = "add",
                 timeout: float | None = DEFAULT_TIMEOUT):
        if combine not in COMBINE:
            raise ValueError(f"combine must be one of {list(COMBINE)}, got {combine!r}")
        _check_timeout("timeout", timeout)
        self.combine = combine
        self.timeout = timeout
        self.funcs: list[GroupFn] = []
        for f in funcs:
            if isinstance(f, GroupFn):
                gf = f
            elif isinstance(f, tuple):
                gf = GroupFn(*f[:3])
            elif callable(f):
                name = derived_name(f, "group")
                gf = GroupFn(name, f, auto_name=name)
            else:
                raise TypeError(f"not a group reward function: {f!r}")
            self.funcs.append(gf)
        if not self.funcs:
            raise ValueError("a GroupRubric needs at least one group reward function")
        # names are unique: two the user gave that clash are refused, a derived one taken is numbered
        chosen: dict[str, GroupFn] = {}
        for gf in self.funcs:
            if gf.auto_name is None:
                if gf.name in chosen:
                    raise ValueError(f"duplicate group reward component name {gf.name!r}: given to "
                                     f"{chosen[gf.name].fn!r} and to {gf.fn!r}; give one of them another name")
                chosen[gf.name] = gf
        taken = set(chosen)
        for gf in self.funcs:
            if gf.auto_name is not None:
                gf.name = gf.auto_name if gf.auto_name not in taken else _numbered(gf.auto_name, taken)
                taken.add(gf.name)

    def __repr__(self) -> str:
        parts = ", ".join(f"{f.name}*{f.weight:g}" for f in self.funcs)
        return f"GroupRubric([{parts}], combine={self.combine!r})"

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.funcs]

    def score(self, records: Sequence[Mapping[str, Any]], task: Any = None) -> list[dict[str, Any]]:
        """:meth:`ascore` from sync code (in a helper thread when this thread runs a loop)."""
        return run_sync(self.ascore(records, task=task))

    async def ascore(self, records: Sequence[Mapping[str, Any]], task: Any = None) -> list[dict[str, Any]]:
        """The records of one task's rollouts, group-scored: new dicts, in the same order.

        A member's record gets ``reward`` (combined), ``individual_reward`` (its own),
        ``group_components`` (each group score) merged into ``reward_components`` too, and
        ``group_size`` (the members scored together). A failed record comes back unchanged.
        A group score whose name is taken (a component of the member's own rubric, another
        function's, an entry another function's dict returned) is recorded as ``name#2``
        (``#3``...), in both, never over the other.
        """
        out = [dict(r) for r in records]
        members = [i for i, r in enumerate(out) if not _failed(r)]
        if not members:
            return out
        group = [out[i] for i in members]
        context = _context(group, task)
        n = len(group)
        scores: list[dict[str, float]] = [{} for _ in range(n)]
        totals = [0.0] * n
        errors: dict[str, str] = {}
        for gf in self.funcs:
            timeout = self.timeout if gf.own_timeout is _UNSET else gf.own_timeout
            try:
                kwargs = {p: context[p] for p in gf.params}
                value = gf.fn(**kwargs) if gf.is_async or timeout is None else _bounded(gf.fn, kwargs, timeout)
                if gf.is_async or inspect.isawaitable(value):
                    value = await _within(value, timeout)
                if isinstance(value, (str, bytes, bytearray, Mapping)):  # (iterable, but not one score a member)
                    raise TypeError(f"returned a {type(value).__name__}, not one score per member")
                value = list(value)
                if len(value) != n:
                    raise ValueError(f"returned {len(value)} scores for a group of {n}")
            except RewardFailure as exc:
                log.warning("group reward %r could not score: %s", gf.name, exc)
                for i in members:
                    out[i].update(reward=None, outcome=exc.outcome, reward_components={},
                                  error=f"group reward {gf.name!r}: {exc}")
                return out
            except _LeafTimeout:
                _timed_out(gf.name, timeout, {}, errors)
                value = [0.0] * n
            except Exception as exc:
                log.warning("group reward %r raised; scored 0", gf.name, exc_info=exc)
                errors[gf.name] = f"{type(exc).__name__}: {exc}"
                value = [0.0] * n
            for j, raw in enumerate(value):
                items = raw.items() if isinstance(raw, Mapping) else [(gf.name, raw)]
                own = group[j].get("reward_components") or {}
                for name, one in items:
                    name = str(name)
                    if name in scores[j] or name in own or (name in self.names and name != gf.name):
                        name = _numbered(name, scores[j], own, self.names)
                    s = scores[j][name] = _finite(name, one, errors)
                    totals[j] += gf.weight * s
        for j, i in enumerate(members):
            record = out[i]
            own = float(record.get("reward") or 0.0)
            record["individual_reward"] = record.get("reward")
            record["reward"] = (own if self.combine == "add" else 0.0) + totals[j]
            record["group_components"] = scores[j]
            record["reward_components"] = {**(record.get("reward_components") or {}), **scores[j]}
            record["group_size"] = n
            if errors:
                record["group_errors"] = dict(errors)
        return out


def _failed(record: Mapping[str, Any]) -> bool:
    reward = record.get("reward")
    return is_failure(record.get("outcome")) or reward is None or reward != reward  # (NaN, of any numeric type)


def group_failed(record: Mapping[str, Any]) -> bool:
    """Whether a group-scored record is a failure for a trainer, never a reward: its episode
    failed, or its group's rubric did (a function that raised, timed out or gave no finite score
    scored 0 with ``group_errors``: learning from that 0 teaches the model a grader's bug)."""
    return _failed(record) or bool(record.get("group_errors"))


def completion_of(record: Mapping[str, Any]) -> str:
    """A record's final assistant text: its last action, else its last assistant message."""
    actions = record.get("actions")
    if actions:
        return str(actions[-1])
    for m in reversed(record.get("messages") or ()):
        if isinstance(m, Mapping) and m.get("role") == "assistant":
            return str(m.get("content") or "")
    return str(record.get("completion") or "")


def prompt_of(record: Mapping[str, Any], task: Any = None) -> str:
    """The task's text: ``task.prompt``, else the first user message of the transcript."""
    if task is not None and getattr(task, "prompt", None):
        return str(task.prompt)
    for m in record.get("messages") or ():
        if isinstance(m, Mapping) and m.get("role") == "user":
            return str(m.get("content") or "")
    return ""


def _context(group: list[dict[str, Any]], task: Any) -> dict[str, Any]:
    return {"rewards": [float(r.get("reward") or 0.0) for r in group],
            "completions": [completion_of(r) for r in group],
            "messages": [list(r.get("messages") or []) for r in group],
            "records": group, "task": task, "answer": getattr(task, "answer", None),
            "prompt": prompt_of(group[0], task)}




def group_key(record: Mapping[str, Any]) -> Any:
    """What makes records one group: the task index (else the task id), within a mixture's member
    and level (``benchmax/Mix-v0`` records carry the member's own index: task 0 of Math and task 0
    of CRM are two tasks)."""
    index = record.get("task_index")
    if index is None:
        return ("id", record.get("task_id"))
    return ("index", record.get("member"), record.get("difficulty"), index)


async def ascore_groups(records: Sequence[Mapping[str, Any]], group_rubric: GroupRubric,
                        tasks: Callable[[Mapping[str, Any]], Any] | None = None) -> list[dict[str, Any]]:
    """Every group of ``records`` (by :func:`group_key`) scored by ``group_rubric``, concurrently;
    the records come back in their order. ``tasks(record) -> Task`` gives group functions
    ``task`` and ``answer`` (the holder's ground truth), when the holder has it."""
    groups: dict[Any, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(group_key(r), []).append(i)
    out: list[dict[str, Any]] = [dict(r) for r in records]

    async def one(indices: list[int]) -> None:
        members = [records[i] for i in indices]
        task = tasks(members[0]) if tasks is not None else None
        for i, r in zip(indices, await group_rubric.ascore(members, task=task)):
            out[i] = r

    await asyncio.gather(*(one(ix) for ix in groups.values()))
    return out


def score_groups(records: Sequence[Mapping[str, Any]], group_rubric: GroupRubric,
                 tasks: Callable[[Mapping[str, Any]], Any] | None = None) -> list[dict[str, Any]]:
    """:func:`ascore_groups` from sync code."""
    return run_sync(ascore_groups(records, group_rubric, tasks))


def group_rubric_of(env: Any) -> GroupRubric | None:
    """An env's own group rubric (``env.unwrapped.group_rubric``), or None."""
    return getattr(getattr(env, "unwrapped", env), "group_rubric", None)


def score_vector_group(envs: Any, group_rubric: GroupRubric | None = None,
                       tasks: Callable[[Mapping[str, Any]], Any] | None = None) -> list[dict[str, Any]]:
    """Group-score the episodes a vector env's environments just finished (one record each,
    ``envs.call("episode_record")``), grouped by task index. Call it once every episode of the
    group has ended and before the next step (``autoreset_mode`` NEXT_STEP, Gymnasium's default:
    an env resets on its next step). ``group_rubric`` defaults to the envs' own when they live in
    this process (gymnasium's ``SyncVectorEnv``, ``make_vec(..., vectorization_mode="sync")``); an
    env's own rubric in a worker process stays there (it may hold the env itself, a benchmax
    env's ``compute_group_reward``): pass one, or use a sync vector env or eval.

    Group functions get ``task`` and ``answer`` as an env's own rubric does: the task each env
    just played (``env.unwrapped.episode.task``: read in this process, or sent from a worker when
    a group function asks for ``task``, ``answer`` or ``prompt``), or ``tasks(record) -> Task``
    when given (eval's :func:`score_groups` takes the same)."""
    if group_rubric is None:
        local = getattr(envs, "envs", None)  # SyncVectorEnv's own envs, in this process
        group_rubric = group_rubric_of(local[0]) if local else None
        if group_rubric is None:
            raise ValueError("group_rubric is missing: pass one (an env's own is used only when the envs live in "
                             "this process: make_vec(..., vectorization_mode='sync'))")
    records = [dict(r) for r in envs.call("episode_record")]
    unfinished = [i for i, r in enumerate(records) if not r.get("outcome")]
    if unfinished:
        raise ValueError(f"envs {unfinished} have not finished their episode: score a group once all have ended")
    if tasks is None and any(p in ("task", "answer", "prompt") for gf in group_rubric.funcs for p in gf.params):
        played = dict(zip(map(id, records), _played_tasks(envs)))
        tasks = lambda record: played.get(id(record))  # noqa: E731  (ascore_groups asks with these records)
    return score_groups(records, group_rubric, tasks)


def _played_tasks(envs: Any) -> list[Any]:
    """The task each env of ``envs`` just played (None where it has no episode of its own: a
    mixture), read in this process or sent from the workers: only the task (``episode_task()``),
    not the whole :class:`~benchmax_gym.core.env.Episode`, which carried its transcript over the
    pipe and could not be sent at all where it holds what cannot be pickled (a tool's lock, a
    database connection: Math, Excel and CRM episodes do), every group function then given
    ``task=None``. An env without the method (one of your own) still sends its episode."""
    local = getattr(envs, "envs", None)
    if local is not None:
        episodes = [getattr(getattr(env, "unwrapped", env), "episode", None) for env in local]
        return [getattr(e, "task", None) for e in episodes]
    try:  # (asked first: Gymnasium's AsyncVectorEnv shuts down a worker whose call raised)
        if all(envs.call("has_wrapper_attr", "episode_task")):
            return list(envs.call("episode_task"))
    except Exception as exc:  # noqa: BLE001  (a task holding what cannot be sent: no task)
        return _no_tasks(envs, exc)
    try:  # an env of its own without the method: its whole episode, as before
        episodes = list(envs.get_attr("episode"))
    except Exception as exc:  # noqa: BLE001  (an episode holding what cannot be sent: no task)
        return _no_tasks(envs, exc)
    return [getattr(e, "task", None) for e in episodes]


def _no_tasks(envs: Any, exc: Exception) -> list[None]:
    log.warning("score_vector_group: the envs' tasks could not be read (%s: %s); group functions get "
                "task=None: pass tasks=", type(exc).__name__, exc)
    return [None] * getattr(envs, "num_envs", 0)


# -- ready-made group functions ---------------------------------------------------------------


def relative_rank(rewards: list[float]) -> list[float]:
    """Each member's share of the others it beats (a tie counts half), in [0, 1]; 0.5 alone."""
    n = len(rewards)
    if n == 1:
        return [0.5]
    return [(sum(o < r for o in rewards) + 0.5 * (sum(o == r for o in rewards) - 1)) / (n - 1) for r in rewards]


def best_of_k(rewards: list[float]) -> list[float]:
    """1 for the member(s) with the group's highest reward, 0 for the rest."""
    top = max(rewards)
    return [float(r == top) for r in rewards]


def _normal_text(text: str) -> str:
    return " ".join(str(text).split()).lower()


def diversity_penalty(completions: list[str]) -> list[float]:
    """Minus the share of the other members that gave the same final text (whitespace and case
    aside): 0 when all differ, -1 when all are alike. Use with a positive weight."""
    n = len(completions)
    if n == 1:
        return [0.0]
    normal = [_normal_text(c) for c in completions]
    return [-(normal.count(t) - 1) / (n - 1) for t in normal]


__all__ = ["GroupFn", "GroupRubric", "ascore_groups", "best_of_k", "completion_of", "diversity_penalty", "group_failed",
           "group_rubric_of", "relative_rank", "score_groups", "score_vector_group"]
