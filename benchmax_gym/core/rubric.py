"""Rubrics: a tree of named reward functions.

A reward function (a *leaf*) asks for what it needs by parameter name, from:

* ``completion`` - the final assistant text (the action that ended the episode),
* ``answer`` - the task's ground truth,
* ``task`` - the whole :class:`~benchmax_gym.core.tasks.Task`,
* ``messages`` - the full OpenAI-style transcript,
* ``episode`` - the running episode; ``state`` - its per-episode state (``episode.state``: a
  workbook, a database, a sandbox),
* ``tool_calls``, ``tool_results``, ``turn`` - what the step being scored ran (``[{"name",
  "arguments"}]``) and got back (the results' texts), and its number: what a per-turn leaf reads,
* whatever else the environment offers (MCP-v0 offers ``client``, a live client to its server).

Inner nodes combine their children's values (see :func:`all_of`, :func:`gate`, :func:`min_of`,
:func:`product`); a :class:`Rubric` itself is the weighted sum, the default::

    Rubric([exact])                                  # name "exact", weight 1.0
    Rubric([("exact", exact, 0.9), ("short", lambda completion: len(completion) < 99, 0.1)])
    Rubric([gate(untouched, Rubric([correct, ("format", fmt, 0.1)]))])   # 0 unless untouched holds

Weights count only under a weighted sum; ``min``, ``product``, ``all_of`` and ``gate`` combine
their children's plain values. Every leaf is scored (a gate that fails still reports its body),
and ``info["reward_components"]`` has each leaf's score by name: names are unique in a tree, so
the logged components are the ones that made the reward. A name derived from the function (its
``__name__``: two lambdas, two ``functools.partial`` of one function, the same function in a nested
rubric, two gates) is numbered when it is taken: ``<lambda>``, ``<lambda>#2``; two names the user
gave (a tuple's, a ``RewardFn``'s, a node's ``name=``) that clash are refused when the rubric is
built, naming both: only the user knows which is which. ``repr(rubric)`` draws the tree.

A function may return a dict of named scores (as benchmax's ``compute_reward`` does). Each entry
becomes a component (its key is its name), and the function's value is their weighted mean:
equal parts by default, or ``RewardFn(..., parts={"correct": 3, "format": 1})`` (an entry not in
``parts`` weighs 0: reported, not rewarded). So the entries' weights sum to the function's weight:
``{"a": 1, "b": 1}`` at weight 1 scores 1.0, not 2.0. An entry whose key is another
component's name (in the tree, or an entry another function returned first) is recorded as
``key#2`` (``#3``...), never over the other.

A leaf marked ``per_turn=True`` (a top-level child of the rubric only) is scored after every step
with what that step produced, and its weighted value is that step's reward; the final reward
(the rest of the tree, at the step that ends the episode) is unchanged, so the episode's return is
the final reward plus the per-turn rewards. ``Rubric(..., shaping=True)`` asks for shaping
instead: the last step pays the final reward less what the per-turn leaves paid, so the return is
the final reward and the per-turn leaves only move credit earlier. :func:`milestones` builds a
per-turn leaf that cannot be farmed (each milestone pays once, the sum is capped by its weight).
The last step's components are the final leaves' and each per-turn leaf's episode total; an entry
key both a per-turn and a final function returned is numbered in the final's (``key#2``), so the
per-turn name means at the last step what it meant at every step, and neither is written over.

A component that raises :class:`~benchmax_gym.core.outcomes.RewardFailure` (it could not score,
e.g. its judge is down) fails the episode with that outcome; any other exception scores 0, is
logged with its traceback, and never breaks the episode; so does a value that is no finite number
(``None``, text, NaN, a tree that combines past a float); ``info["reward_errors"]`` says which
failed and why. A coroutine a sync function hands back (a decorator's wrapper) is awaited.

**Every leaf is bounded** (``Rubric(..., timeout=60)``, :data:`DEFAULT_TIMEOUT` seconds; ``None``
for none): a leaf past it scores 0 with ``reward_errors[name]`` starting ``reward_timeout``, and
the episode stays scored. The model's hostile text can hang a grader (a user's regex that
backtracks for ever), and a model must not escape a bad reward by hanging its grader (as with
its own code in a sandbox: ``core.outcomes``); a leaf that can fail for reasons not the model's
(an endpoint) bounds itself and raises ``RewardFailure``, as the judge does. A function carrying
``reward_timeout`` (seconds, or None) has that bound instead (the judge's: None, its own
timeouts). A sync leaf in the main thread runs inline under a ``SIGALRM`` deadline, armed once
a minute at most rather than per call (a regex, a blocking read, a Python loop are all stopped;
before each leaf it is armed again if the last leaf used SIGALRM itself and left the timer off);
in another thread, or where SIGALRM is someone else's, it runs in a helper thread that is
abandoned at the deadline (C code that holds the GIL cannot be stopped there). An async leaf
is awaited under ``asyncio.wait_for``.

Every family finds the model's answer by one rule, :func:`final_answer`: the content of the last
closed ``<answer>...</answer>`` of the final reply. A reply without one has no answer and scores
0 (it is not graded on its prose, which would reward saying many things). Math also accepts
``\\boxed{}``, which takes precedence.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import logging
import math
import os
import queue
import signal
import _signal  # (signal.getsignal's enum conversion costs 2.5 us a call: the fast path reads the handler here)
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmax_gym.core.outcomes import RewardFailure

log = logging.getLogger(__name__)

#: seconds a leaf may take before it scores 0 with a ``reward_timeout`` error (module docstring)
DEFAULT_TIMEOUT = 60.0
REWARD_TIMEOUT = "reward_timeout"  #: how ``reward_errors`` starts for a leaf past its deadline

CONTEXT_NAMES = ("completion", "answer", "task", "messages", "episode", "state", "tool_calls", "tool_results", "turn")


def answer_tags(completion: str) -> list[str]:
    """The contents of every closed ``<answer>...</answer>`` (any case), left to right.

    Linear in the text (a regex's lazy ``.*?`` is quadratic on thousands of unclosed tags).
    """
    lowered, found, position = completion.lower(), [], 0
    while (start := lowered.find("<answer>", position)) >= 0:
        end = lowered.find("</answer>", start + 8)
        if end < 0:
            break
        found.append(completion[start + 8:end])
        position = end + 9
    return found


def final_answer(completion: str | None) -> str | None:
    """The answer a reply gives: its last ``<answer>...</answer>`` (any case), stripped.

    None when there is no closed tag: the reply has not stated an answer, and every family's
    rubric scores it 0 (see the module docstring).
    """
    if not isinstance(completion, str):
        return None
    found = answer_tags(completion)
    return found[-1].strip() if found else None


def _check_weight(name: str, weight: Any) -> None:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"weight of reward component {name!r} must be a finite number, got {weight!r}")


@dataclass
class RewardFn:
    """One leaf: ``name``, ``fn`` (sync or async) and ``weight``.

    ``per_turn``: scored after every step (that step's reward) instead of once at the end.
    ``parts``: the weights of the entries of a dict-returning ``fn`` (default: equal parts).
    """

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    context: tuple[str, ...] = ()  # names the environment offers beyond CONTEXT_NAMES
    per_turn: bool = False
    parts: Mapping[str, float] | None = None
    auto_name: str | None = field(default=None, repr=False)  # the derived name, numbered on a clash; None: the user's
    params: tuple[str, ...] = field(init=False)
    is_async: bool = field(init=False)
    own_timeout: Any = field(init=False, repr=False)  # the function's ``reward_timeout``, when it carries one

    def __post_init__(self):
        names = CONTEXT_NAMES + tuple(self.context)
        sig = inspect.signature(self.fn)
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        self.params = names if accepts_any else tuple(n for n in sig.parameters if n in names)
        unknown = [
            n for n, p in sig.parameters.items()
            if n not in names and p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if unknown:
            raise TypeError(
                f"reward function {self.name!r} asks for {unknown}; reward functions may take "
                f"any of {list(names)}"
            )
        # (an object whose __call__ is async is one too: called, it hands back a coroutine)
        self.is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None))
        _check_weight(self.name, self.weight)
        self.own_timeout = getattr(self.fn, "reward_timeout", _UNSET)
        if self.own_timeout is not _UNSET:
            _check_timeout(f"reward_timeout of {self.name!r}", self.own_timeout)
        if self.parts is not None:
            self.parts = dict(self.parts)
            for key, weight in self.parts.items():
                _check_weight(f"{self.name}/{key}", weight)

    def _copy(self, **changes: Any) -> "RewardFn":
        fields = {"name": self.name, "fn": self.fn, "weight": self.weight, "context": self.context,
                  "per_turn": self.per_turn, "parts": self.parts, "auto_name": self.auto_name}
        return RewardFn(**{**fields, **changes})

    def _collect(self, value: Any, components: dict, errors: dict, taken: Any = frozenset()) -> float:
        """Record ``value`` (a score or a dict of named scores); return the leaf's value. A dict's
        key that is another component's (``taken``: the tree's names) is numbered."""
        if not isinstance(value, dict):
            score = _finite(self.name, value, errors)
            components[self.name] = score
            return score
        if not value:
            components[self.name] = 0.0
            errors[self.name] = "ValueError: returned an empty dict"
            return 0.0
        parts, total, weights = self.parts, 0.0, 0.0
        for key, raw in value.items():
            key = name = str(key)
            if name in components or (name in taken and name != self.name):
                name = _numbered(name, components, taken)
            score = components[name] = _finite(name, raw, errors)
            weight = 1.0 if parts is None else parts.get(key, 0.0)
            total += weight * score
            weights += weight
        return total / weights if weights else 0.0


class _Unset:
    """No ``reward_timeout`` of the function's own: pickled by name, so that a rubric sent to a
    worker or an env host still tells it apart (a plain ``object()`` arrives as another object)."""

    def __reduce__(self) -> str:
        return "_UNSET"


_UNSET = _Unset()


def _numbered(name: str, *taken: Any) -> str:
    """``name#2`` (``#3``...): the first not in any of ``taken``."""
    k = 2
    while any(f"{name}#{k}" in t for t in taken):
        k += 1
    return f"{name}#{k}"


def _check_timeout(what: str, timeout: Any) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"{what} must be a positive number of seconds or None (no bound), got {timeout!r}")


def finite_score(raw: Any, what: str = "") -> float:
    """A grader's raw value (a reward function's, a group function's, a judge's ``parse``) as a
    score: a finite number of any numeric type (numpy, Decimal; a bool is 0 or 1), else a
    ``TypeError`` (not a number) or a ``ValueError`` (NaN, inf). Text is never a number
    (``float("5")`` would pay a returned answer "5" as 5.0), and the error never quotes the
    value: it may be the answer, or a judge's reply quoting the reference answer."""
    returned = f"{what} returned" if what else "returned"
    if isinstance(raw, (str, bytes, bytearray)):
        raise TypeError(f"{returned} {type(raw).__name__}, not a number")
    try:
        score = float(raw)
    except OverflowError:  # (an int past a float's range)
        raise ValueError(f"{returned} an {type(raw).__name__} too large for a float, not a finite number") from None
    except (TypeError, ValueError):
        raise TypeError(f"{returned} {type(raw).__name__}, not a number") from None
    if not math.isfinite(score):
        raise ValueError(f"{returned} {score}, not a finite number (NaN and inf are not finite)")
    return score


def _finite(name: str, raw: Any, errors: dict) -> float:
    """A leaf's value as a score (:func:`finite_score`); one that is no score is 0, the reason in ``errors``."""
    try:
        return finite_score(raw)
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
        log.warning("reward component %r returned %r; scored 0", name, raw)
        return 0.0


Child = Any  # a RewardFn or a Node


def _as_child(spec: Any, context: tuple[str, ...]) -> Child:
    """A RewardFn, a node, a ``(name, fn_or_node, weight)`` tuple or a plain function, as a child."""
    if isinstance(spec, RewardFn):
        return spec._copy(context=context) if context and spec.context != context else spec
    if isinstance(spec, Node):
        return spec._with_context(context) if context else spec
    if isinstance(spec, tuple):
        if len(spec) >= 2 and isinstance(spec[1], Node):
            node = _as_child(spec[1], context)
            return node._copy(name=spec[0], auto_name=None, weight=spec[2] if len(spec) > 2 else node.weight)
        return RewardFn(*spec[:3], context=context)
    if callable(spec):
        name = derived_name(spec)
        return RewardFn(name, spec, context=context, auto_name=name)
    raise TypeError(f"not a reward function: {spec!r}")


def derived_name(fn: Any, default: str = "reward") -> str:
    """A function's own name: its ``__name__``, a ``functools.partial``'s function's, else its class's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name:
        name = type(fn).__name__ if not inspect.isroutine(fn) else default
    return name


def _entries(children: list, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """Every leaf and node under ``children``, each with its path of child indices, in order."""
    out = []
    for i, c in enumerate(children):
        out.append(((*path, i), c))
        if isinstance(c, Node):
            out += _entries(c.children, (*path, i))
    return out


def _what(c: Any) -> str:
    if isinstance(c, Node):
        return f"a {c.kind} node"
    return f"reward function {getattr(c.fn, '__qualname__', None) or derived_name(c.fn)}"


def _unique_names(children: list) -> list:
    """``children`` with every name in the tree unique: a clash of two names the user gave is an
    error naming both; a derived name that is taken is numbered (``name#2``)."""
    entries = _entries(children)
    chosen: dict[str, Any] = {}
    for _, c in entries:
        if c.auto_name is None:
            if c.name in chosen:
                raise ValueError(f"duplicate reward component name {c.name!r}: given to {_what(chosen[c.name])} "
                                 f"and to {_what(c)}; give one of them another name")
            chosen[c.name] = c
    taken, renames = set(chosen), {}
    for path, c in entries:
        if c.auto_name is not None:
            name = c.auto_name if c.auto_name not in taken else _numbered(c.auto_name, taken)
            taken.add(name)
            if name != c.name:
                renames[path] = name
    if not renames:
        return children
    return [_renamed(c, (i,), renames) for i, c in enumerate(children)]


def _renamed(c: Any, path: tuple, renames: dict) -> Any:
    if isinstance(c, Node):
        kids = [_renamed(k, (*path, i), renames) for i, k in enumerate(c.children)]
        if any(k is not old for k, old in zip(kids, c.children)):
            c = c._rebuilt(kids)
    return c._copy(name=renames[path]) if path in renames else c


class Node:
    """An inner node of a rubric tree: combines its children's values (see :func:`all_of` ...)."""

    kind = "node"
    default_name: str | None = None  # (None: the kind)

    def __init__(self, children: Iterable[Any], *, name: str | None = None, weight: float = 1.0,
                 context: tuple[str, ...] = (), threshold: float = 1.0):
        self.context = tuple(context)
        self.children: list[Child] = [_as_child(c, self.context) for c in children]
        if not self.children:
            raise ValueError(f"{type(self).__name__} needs at least one reward function")
        self.name = name or self.default_name or self.kind
        self.auto_name = None if name else self.name
        _check_weight(self.name, weight)
        self.weight = float(weight)
        self.threshold = threshold
        self.children = _unique_names(self.children)
        self.has_async = any(leaf.is_async for leaf in self.leaves())

    # -- the tree -----------------------------------------------------------------------------

    def leaves(self) -> list[RewardFn]:
        out: list[RewardFn] = []
        for c in self.children:
            out += c.leaves() if isinstance(c, Node) else [c]
        return out

    @property
    def funcs(self) -> list[RewardFn]:
        """Every leaf, in order (per-turn ones included)."""
        return self.leaves()

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.leaves()]

    def _copy(self, **changes: Any) -> "Node":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def _with_context(self, context: tuple[str, ...]) -> "Node":
        new = self._rebuilt([_as_child(c, context) for c in self.children])
        new.context = context
        return new

    def map_leaves(self, fn: Callable[[RewardFn], RewardFn]) -> "Node":
        """A copy of the tree with each leaf replaced by ``fn(leaf)``. A name ``fn`` gives a leaf
        is the user's: the names are checked again, as the constructor checks them (a clash of
        two names the user gave is an error, a derived one taken is numbered)."""
        return self._rebuilt(_unique_names(self._mapped(fn)))

    def _mapped(self, fn: Callable[[RewardFn], RewardFn]) -> list[Child]:
        out: list[Child] = []
        for c in self.children:
            if isinstance(c, Node):
                out.append(c._rebuilt(c._mapped(fn)))
                continue
            leaf = fn(c)
            if leaf.name != c.name and getattr(leaf, "auto_name", None) is not None:
                leaf = leaf._copy(auto_name=None)  # (renamed: no longer the derived name, numbered back)
            out.append(leaf)
        return out

    def _rebuilt(self, children: list[Child]) -> "Node":
        new = self._copy(children=children)
        new.has_async = any(leaf.is_async for leaf in new.leaves())
        return new

    def with_weights(self, weights: dict[str, float]) -> "Node":
        """A copy with the weights of some leaves or nodes (by name) replaced; an unknown name is
        an error naming the choices."""
        known = set(self.names) | set(self._node_names())
        unknown = set(weights) - known
        if unknown:
            raise ValueError(f"reward_weights: unknown component(s) {sorted(unknown)}; components are {self.names}")
        for name, weight in weights.items():
            _check_weight(name, weight)
        return self._reweighted(weights)

    def _node_names(self) -> list[str]:
        return [n for c in self.children if isinstance(c, Node) for n in (c.name, *c._node_names())]

    def _reweighted(self, weights: dict[str, float]) -> "Node":
        children = [
            c._reweighted(weights)._copy(weight=float(weights.get(c.name, c.weight))) if isinstance(c, Node)
            else c._copy(weight=float(weights[c.name])) if c.name in weights else c
            for c in self.children
        ]
        return self._rebuilt(children)

    @property
    def max_reward(self) -> float:
        """The value when every leaf scores 1 (leaves score in [0, 1])."""
        return self._max([_max_of(c) for c in self.children])

    def _max(self, values: list[float]) -> float:
        return self.combine(values)

    # -- scoring ------------------------------------------------------------------------------

    def combine(self, values: list[float]) -> float:
        raise NotImplementedError

    def _weights(self) -> list[float]:
        return [c.weight for c in self.children]

    async def _value(self, context: dict[str, Any], p: "_Pass") -> float:
        values = [await _evaluate(c, context, p) for c in self.children]
        return self.combine(values)

    # -- printing -----------------------------------------------------------------------------

    def _label(self) -> str:
        return self.kind

    def _lines(self, prefix: str = "") -> list[str]:
        lines = []
        for i, c in enumerate(self.children):
            last = i == len(self.children) - 1
            branch, deeper = ("└─ ", "   ") if last else ("├─ ", "│  ")
            weight = f"{c.weight:g} × " if isinstance(self, Rubric) else ""
            if isinstance(c, Node):
                lines.append(f"{prefix}{branch}{weight}{c.name}: {c._label()}")
                lines += c._lines(prefix + deeper)
            else:
                tags = [t for t in ("per-turn" if c.per_turn else "", "async" if c.is_async else "") if t]
                lines.append(f"{prefix}{branch}{weight}{c.name}" + (f"  [{', '.join(tags)}]" if tags else ""))
        return lines

    def __repr__(self) -> str:
        return "\n".join([f"{type(self).__name__} {self.name}: {self._label()}", *self._lines()])


def _max_of(child: Child) -> float:
    return child.max_reward if isinstance(child, Node) else 1.0


class _Pass:
    """One scoring pass: where async leaves run, what it recorded, the tree's names, the bound."""

    __slots__ = ("run_coroutine", "components", "errors", "taken", "timeout")

    def __init__(self, run_coroutine: Any, taken: Any, timeout: float | None):
        self.run_coroutine, self.taken, self.timeout = run_coroutine, taken, timeout
        self.components: dict[str, float] = {}
        self.errors: dict[str, str] = {}


class _LeafTimeout(Exception):
    """A leaf ran past its deadline."""


async def _evaluate(child: Child, context: dict[str, Any], p: _Pass) -> float:
    """One child's value: a leaf's (its exceptions caught, RewardFailure aside) or a node's."""
    if isinstance(child, Node):
        return _checked_total(child.name, await child._value(context, p), p.errors)
    timeout = p.timeout if child.own_timeout is _UNSET else child.own_timeout
    try:
        kwargs = {n: context.get(n) for n in child.params}
        value = child.fn(**kwargs) if child.is_async or timeout is None else _bounded(child.fn, kwargs, timeout)
        if child.is_async or inspect.iscoroutine(value):  # (a sync wrapper, a decorator's, may hand one back)
            value = _within(value, timeout)
            value = p.run_coroutine(value) if p.run_coroutine is not None else await value
    except RewardFailure:
        raise  # not a score: the engine ends the episode with its outcome
    except _LeafTimeout:
        return _timed_out(child.name, timeout, p.components, p.errors)
    except Exception as exc:
        return _raised(child.name, exc, p.components, p.errors)
    return child._collect(value, p.components, p.errors, p.taken)


def _timed_out(name: str, timeout: float, components: dict, errors: dict) -> float:
    log.warning("reward component %r did not return within %g s; scored 0", name, timeout)
    components[name] = 0.0
    errors[name] = f"{REWARD_TIMEOUT}: did not return within {timeout:g} s (abandoned, scored 0)"
    return 0.0


# -- the bound on a leaf (module docstring) ----------------------------------------------------


def _within(coroutine: Any, timeout: float | None) -> Any:
    """``coroutine`` under ``timeout`` (a :class:`_LeafTimeout` past it)."""
    if timeout is None:
        return coroutine

    async def bounded() -> Any:
        try:
            return await asyncio.wait_for(coroutine, timeout)
        except asyncio.TimeoutError:
            raise _LeafTimeout from None
    return bounded()


def _bounded(fn: Callable[..., Any], kwargs: dict, timeout: float) -> Any:
    """``fn(**kwargs)``, or :class:`_LeafTimeout` after ``timeout`` seconds."""
    if threading.get_ident() == _ALARM.main and _ALARM.ready(timeout):
        return _ALARM.call(fn, kwargs, timeout)
    return _in_thread(fn, kwargs, timeout)


class _OutOfTime(BaseException):
    """The alarm's exception: a BaseException, so that no ``except Exception`` in a leaf keeps it."""


class _Alarm:
    """Deadlines for sync leaves in the main thread, on ``SIGALRM`` (a real timer: it stops a
    regex in C, a blocking read, a Python loop). The timer is armed once and left to fire (within
    the timeout, at most once a minute by default): a leaf only writes its deadline, and the
    handler re-arms for a leaf still running, raises in one past its deadline, and gives SIGALRM
    back when none runs. Used only while SIGALRM is free (no handler of someone else's, no timer)."""

    def __init__(self) -> None:
        self.handler = self._fired  # (one bound method: compared by identity)
        self.reset()

    def reset(self) -> None:
        self.main = threading.main_thread().ident
        self.deadline: float | None = None  # the running leaf's
        self.fires_at: float | None = None  # when our timer fires; None: not armed
        self.previous: Any = signal.SIG_DFL if _HAS_ALARM else None

    def ready(self, timeout: float) -> bool:
        """Whether the timer is ours and armed (arming it when SIGALRM is free)."""
        if self.fires_at is not None:
            # (ours still, unless it should have fired by now, another handler took SIGALRM over, or
            # a leaf that used SIGALRM itself gave the handler back with the timer off: Math's check)
            if (time.monotonic() < self.fires_at and _signal.getsignal(signal.SIGALRM) is self.handler
                    and _signal.getitimer(signal.ITIMER_REAL)[0]):
                return True
            self.fires_at = None
        if not _HAS_ALARM:
            return False
        try:
            current = signal.getsignal(signal.SIGALRM)
            if current is not self.handler:
                if current not in (signal.SIG_DFL, signal.SIG_IGN) or signal.getitimer(signal.ITIMER_REAL)[0]:
                    return False  # someone else's
                self.previous = signal.signal(signal.SIGALRM, self.handler)
            signal.setitimer(signal.ITIMER_REAL, timeout)
        except (ValueError, OSError):  # (not the main thread after all; no timer here)
            return False
        self.fires_at = time.monotonic() + timeout
        return True

    def call(self, fn: Callable[..., Any], kwargs: dict, timeout: float) -> Any:
        start = time.monotonic()
        outer = self.deadline
        deadline = start + timeout if outer is None else min(outer, start + timeout)
        if deadline < self.fires_at:  # (a shorter bound than the one armed)
            signal.setitimer(signal.ITIMER_REAL, max(deadline - start, 1e-3))
            self.fires_at = deadline
        self.deadline = deadline
        try:
            try:
                return fn(**kwargs)
            finally:
                self.deadline = outer
        except _OutOfTime:
            raise _LeafTimeout from None

    def _fired(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.deadline is None:  # no leaf runs: SIGALRM goes back to what it was
            self.fires_at = None
            signal.signal(signal.SIGALRM, self.previous)
            return
        if now < self.deadline:
            self.fires_at = self.deadline
            signal.setitimer(signal.ITIMER_REAL, self.deadline - now)
            return
        if now < self.deadline + IMPORT_GRACE and in_import(frame):
            self.fires_at = now + 0.05
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        self.fires_at = now + 0.5
        signal.setitimer(signal.ITIMER_REAL, 0.5)  # (again, should the leaf keep the exception)
        raise _OutOfTime


IMPORT_GRACE = 30.0  # how long past its deadline a leaf's import may run on before it is cut anyway


def in_import(frame: Any) -> bool:
    """Whether ``frame`` runs inside an import. A signal's exception there leaves a package half
    imported: the modules it had finished stay, the rest are dropped, and the package can stay
    broken for the process (sympy did: every later Math answer scored 0). So a timeout waits for
    the import to end; the leaf is cut just after it."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_HAS_ALARM = hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer")
_ALARM = _Alarm()


class _Runner:
    """A helper thread that runs one calling thread's sync leaves, abandoned at a deadline."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(self.jobs,), name="benchmax-reward", daemon=True).start()

    def __del__(self) -> None:  # (its thread ended: the helper's ends too)
        self.jobs.put(None)


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        fn, kwargs, box, done = job
        try:
            box.append((True, fn(**kwargs)))
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            box.append((False, exc))
        done.set()
        del job, fn, kwargs, box, done


_runners = threading.local()


def _after_fork() -> None:
    """A forked child inherits neither the timer nor the helper threads (only their records)."""
    global _runners
    _ALARM.reset()
    _runners = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _at_exit() -> None:
    """Our timer off and SIGALRM given back before the interpreter's teardown, which resets the
    handler to the default: a timer still armed then ended the process ('Alarm clock', exit 142,
    buffered output lost) once a teardown outlasted what the timer had left (sympy's can)."""
    try:
        if _ALARM.fires_at is not None and signal.getsignal(signal.SIGALRM) is _ALARM.handler:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, _ALARM.previous)
        _ALARM.fires_at = None
    except (ValueError, OSError):  # (not the main thread)
        pass


atexit.register(_at_exit)


def _in_thread(fn: Callable[..., Any], kwargs: dict, timeout: float) -> Any:
    runner = getattr(_runners, "runner", None)
    if runner is None:
        runner = _runners.runner = _Runner()
    box: list = []
    done = threading.Event()
    runner.jobs.put((fn, kwargs, box, done))
    if not done.wait(timeout):
        runner.jobs.put(None)  # (its helper ends once the leaf returns, if ever)
        _runners.runner = None
        raise _LeafTimeout
    ok, value = box[0]
    if ok:
        return value
    raise value


def _raised(name: str, exc: Exception, components: dict, errors: dict) -> float:
    """A leaf that raised: scored 0, logged with its traceback, its error recorded."""
    log.warning("reward component %r raised; scored 0", name, exc_info=exc)
    components[name] = 0.0
    errors[name] = f"{type(exc).__name__}: {exc}"
    return 0.0


def _checked_total(name: str, total: float, errors: dict) -> float:
    """A node's or a rubric's value, which finite leaves can still push past a float (1e200 * 1e200
    is inf, inf - inf NaN): scored 0 and reported rather than handed to a trainer as a reward."""
    if total - total == 0.0:
        return total
    errors[name] = f"OverflowError: the combined reward is not finite: {total}"
    log.warning("reward node %r combined to %r; scored 0", name, total)
    return 0.0


class Rubric(Node):
    """The weighted sum of its children (leaves or nodes); the root of every env's rubric.

    ``score`` (sync, async leaves through ``run_coroutine``) and ``ascore`` return ``(reward,
    components, errors)`` for the final leaves; ``score_turn``/``ascore_turn`` the same for the
    per-turn leaves (``(0.0, {}, {})`` when there are none).

    Args:
        funcs: leaves and nodes (see the module docstring).
        context: names the environment offers beyond the standard ones (MCP-v0's ``client``).
        shaping: the last step pays the final reward less what the per-turn leaves paid.
        timeout: seconds each leaf may take (None: unbounded); past it, the leaf scores 0 with a
            ``reward_timeout`` error (module docstring). The root rubric's bounds the whole tree.
    """

    kind = "weighted sum"
    default_name = "rubric"

    def __init__(self, funcs: Iterable[Any], context: tuple[str, ...] = (), *, name: str | None = None,
                 weight: float = 1.0, shaping: bool = False, timeout: float | None = DEFAULT_TIMEOUT):
        super().__init__(funcs, name=name, weight=weight, context=context)
        self.shaping = bool(shaping)
        _check_timeout("timeout", timeout)
        self.timeout = timeout
        self._split()

    def with_timeout(self, timeout: float | None) -> "Rubric":
        """A copy whose leaves are bounded by ``timeout`` seconds (None: unbounded)."""
        _check_timeout("reward_timeout", timeout)
        return self._copy(timeout=timeout)

    def _split(self) -> None:
        """Per-turn leaves (top-level only) apart from the final tree."""
        for c in self.children:
            if isinstance(c, Node) and any(leaf.per_turn for leaf in c.leaves()):
                raise ValueError(f"per-turn reward component(s) {[f.name for f in c.leaves() if f.per_turn]} must be "
                                 f"top-level components of the Rubric, not inside {c.name!r}")
        self.turn_funcs = [c for c in self.children if isinstance(c, RewardFn) and c.per_turn]
        self._turn_plan = [(f, getattr(f.fn, "_milestone", None)) for f in self.turn_funcs]
        self.final = [c for c in self.children if not (isinstance(c, RewardFn) and c.per_turn)]
        self.per_turn = bool(self.turn_funcs)
        self.turn_has_async = any(f.is_async for f in self.turn_funcs)
        self._taken = frozenset([*self.names, *self._node_names()])  # (a dict's key that is one is numbered)

    def _rebuilt(self, children: list[Child]) -> "Rubric":
        new = super()._rebuilt(children)
        new._split()
        return new

    def combine(self, values: list[float]) -> float:
        return sum(w * v for w, v in zip(self._weights(), values))

    def _max(self, values: list[float]) -> float:
        return sum(max(c.weight, 0.0) * v for c, v in zip(self.children, values)
                   if not (isinstance(c, RewardFn) and c.per_turn))

    async def _value(self, context: dict[str, Any], p: _Pass) -> float:
        total = 0.0
        for c in self.final:
            total += c.weight * await _evaluate(c, context, p)
        return total

    def score(self, run_coroutine: Callable[[Any], Any] | None = None, **context: Any):
        """Score the final leaves synchronously; async ones go through ``run_coroutine(coro)``."""
        return _drive(self._score(self.final, context, run_coroutine or _no_loop))

    async def ascore(self, **context: Any):
        return await self._score(self.final, context, None)

    def score_turn(self, run_coroutine: Callable[[Any], Any] | None = None, **context: Any):
        """Score the per-turn leaves for one step: ``(that step's reward, components, errors)``."""
        return self.score_turn_in(context, run_coroutine)

    def score_turn_in(self, context: dict[str, Any], run_coroutine: Callable[[Any], Any] | None = None):
        """``score_turn`` with the context as one dict: the engine's hot path (every step). Sync
        leaves returning a plain number take a loop of their own, without the coroutine machinery."""
        if self.turn_has_async:
            return _drive(self._score(self.turn_funcs, context, run_coroutine or _no_loop))
        components: dict[str, float] = {}
        errors = _NO_ERRORS  # (read only: a dict of its own once a leaf fails)
        total = 0.0
        for leaf, milestone in self._turn_plan:
            timeout = self.timeout if leaf.own_timeout is _UNSET else leaf.own_timeout
            try:
                fn, params = (leaf.fn, leaf.params) if milestone is None else milestone[1:]
                kwargs = {n: context.get(n) for n in params}
                value = fn(**kwargs) if timeout is None else _bounded(fn, kwargs, timeout)
                if milestone is None:
                    if type(value) is not float and inspect.iscoroutine(value):  # (a sync wrapper's)
                        value = (run_coroutine or _no_loop)(_within(value, timeout))
                else:  # a milestones leaf: its find, called here (one frame less a step)
                    reached, of = value
                    value = _credit(context.get("episode"), milestone[0], reached, of) if reached and of else 0.0
            except RewardFailure:
                raise
            except _LeafTimeout:
                errors = errors or {}
                _timed_out(leaf.name, timeout, components, errors)
                continue
            except Exception as exc:
                errors = errors or {}
                _raised(leaf.name, exc, components, errors)
                continue
            if type(value) is float and value - value == 0.0:  # finite: the common case, recorded as it is
                components[leaf.name] = value
            else:
                errors = errors or {}
                value = leaf._collect(value, components, errors, self._taken)
            total += leaf.weight * value
        if total - total != 0.0:
            errors = errors or {}
            total = _checked_total(self.name, total, errors)
        return total, components, errors

    def with_turn_totals(self, components: dict, errors: dict, totals: dict, turn_errors: dict) -> tuple[dict, dict]:
        """The last step's ``(components, errors)``: the final leaves' beside each per-turn leaf's
        episode total. A name both passes wrote (a per-turn and a final leaf's dicts with the same
        key; numbered alike in each pass) is numbered in the final's (``name#2``), its error with it:
        the per-turn name keeps what it meant at every step, and neither is written over."""
        if not (components.keys() & totals.keys() or errors.keys() & turn_errors.keys()):
            return {**components, **totals}, {**turn_errors, **errors}
        merged: dict[str, float] = {}
        renames: dict[str, str] = {}
        for name, value in components.items():
            if name in totals:
                name = renames[name] = _numbered(name, totals, components, merged, self._taken)
            merged[name] = value
        merged.update(totals)
        merged_errors = dict(turn_errors)
        for name, message in errors.items():
            name = renames.get(name, name)
            if name in merged_errors:  # (an error of no component's: the rubric's own, a total past a float)
                name = _numbered(name, merged_errors, errors, merged, self._taken)
            merged_errors[name] = message
        return merged, merged_errors

    async def ascore_turn(self, **context: Any):
        return await self._score(self.turn_funcs, context, None)

    async def _score(self, children: list[Child], context: dict[str, Any], run_coroutine: Any):
        """The one scoring loop: awaits async leaves, or hands them to ``run_coroutine``."""
        p = _Pass(run_coroutine, self._taken, self.timeout)
        total = 0.0
        for c in children:
            total += c.weight * await _evaluate(c, context, p)
        return _checked_total(self.name, total, p.errors), p.components, p.errors


_NO_ERRORS: dict[str, str] = {}


def _drive(scoring: Any) -> Any:
    try:
        scoring.send(None)  # nothing in it awaits: every coroutine goes to run_coroutine
    except StopIteration as done:
        return done.value
    raise RuntimeError("a synchronous score awaited")  # unreachable


def _no_loop(coroutine: Any) -> Any:
    coroutine.close()
    raise RuntimeError("an async reward component needs an event loop: score it with run_coroutine or ascore")


# -- combinators ------------------------------------------------------------------------------


class AllOf(Node):
    """1.0 when every child scores at least ``threshold``, else 0.0."""

    kind = "all_of"

    def combine(self, values: list[float]) -> float:
        return float(all(v >= self.threshold for v in values))

    def _max(self, values: list[float]) -> float:
        return 1.0

    def _label(self) -> str:
        return f"all_of (each >= {self.threshold:g})"


class Gate(Node):
    """The value of its second child (the body) when its first (the condition) scores at least
    ``threshold``, else 0.0."""

    kind = "gate"

    def combine(self, values: list[float]) -> float:
        return values[1] if values[0] >= self.threshold else 0.0

    def _max(self, values: list[float]) -> float:
        return values[1]

    def _label(self) -> str:
        return f"gate (body if {self.children[0].name} >= {self.threshold:g}, else 0)"


class Min(Node):
    kind = "min"

    def combine(self, values: list[float]) -> float:
        return min(values)


class Product(Node):
    kind = "product"

    def combine(self, values: list[float]) -> float:
        return math.prod(values)


def all_of(*checks: Any, threshold: float = 1.0, name: str = "all_of", weight: float = 1.0,
           context: tuple[str, ...] = ()) -> AllOf:
    """A node worth 1.0 when every check scores at least ``threshold``, else 0.0.

    Example: ``Rubric([all_of(compiles, tests_pass, name="works"), ("style", style, 0.1)])``."""
    return AllOf(checks, name=name, weight=weight, context=context, threshold=threshold)


def gate(condition: Any, body: Any, *, threshold: float = 1.0, name: str = "gate", weight: float = 1.0,
         context: tuple[str, ...] = ()) -> Gate:
    """``body``'s value while ``condition`` holds (scores at least ``threshold``), else 0.0:
    ``Rubric([gate(untouched, Rubric([correct, fmt]))])`` zeroes the whole reward of an episode
    that changed what it must not."""
    return Gate([condition, body], name=name, weight=weight, context=context, threshold=threshold)


def min_of(*children: Any, name: str = "min", weight: float = 1.0, context: tuple[str, ...] = ()) -> Min:
    """The smallest of the children's values (the weakest criterion decides)."""
    return Min(children, name=name, weight=weight, context=context)


def product(*children: Any, name: str = "product", weight: float = 1.0, context: tuple[str, ...] = ()) -> Product:
    """The product of the children's values (each scales the others)."""
    return Product(children, name=name, weight=weight, context=context)


# -- per-turn leaves that cannot be farmed ----------------------------------------------------


def _credit(episode: Any, name: str, reached: Iterable, total: int) -> float:
    """Pay the milestones in ``reached`` not paid before in this episode: their share of ``total``."""
    paid: set = episode.milestones.setdefault(name, set()) if episode is not None else set()
    new = [m for m in dict.fromkeys(reached) if m not in paid][: max(total - len(paid), 0)]
    paid.update(new)
    return len(new) / total


def milestones(name: str, find: Callable[..., Any], weight: float = 0.2, *, context: tuple[str, ...] = ()) -> RewardFn:
    """A per-turn leaf paying ``weight / total`` for each milestone the first time a step reaches it.

    ``find`` asks for context by name, as a leaf does (``task``, ``episode``, ``state``, ``tool_calls``,
    ``tool_results``...), and returns ``(reached, total)``: the milestones (hashable) this step
    reached and how many the episode has. A milestone reached again pays nothing, and the episode
    never earns more than ``weight`` in all, however many steps it takes: repeating an action
    cannot farm it. The milestones paid so far live on the episode (``episode.milestones[name]``).
    """
    inner = RewardFn(name, find, context=tuple(context))
    own_episode = "episode" not in inner.params  # else find asks for it too

    def milestone(**kwargs: Any) -> float:
        episode = kwargs.pop("episode") if own_episode else kwargs["episode"]
        reached, total = find(**kwargs)
        return _credit(episode, name, reached, total) if reached and total else 0.0

    milestone._milestone = (name, find, inner.params)  # type: ignore[attr-defined]  (the engine's loop calls find itself)

    # asks for exactly what ``find`` does, and the episode (where the milestones paid are kept)
    milestone.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in dict.fromkeys([*inner.params, "episode"])])
    milestone.__name__ = name
    return RewardFn(name, milestone, weight, tuple(context), per_turn=True)


__all__ = ["AllOf", "CONTEXT_NAMES", "DEFAULT_TIMEOUT", "Gate", "REWARD_TIMEOUT", "Min", "Node", "Product", "RewardFn", "Rubric", "all_of", "answer_tags",
           "derived_name", "final_answer", "gate", "milestones", "min_of", "product"]
