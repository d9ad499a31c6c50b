"""Rubrics: named, weighted reward functions.

A reward function asks for what it needs by parameter name, from:

* ``completion`` - the final assistant text (the action that ended the episode),
* ``answer`` - the task's ground truth,
* ``task`` - the whole :class:`~benchmax_gym.core.tasks.Task`,
* ``messages`` - the full OpenAI-style transcript,
* ``episode`` - the running episode (per-episode state such as a workbook or database),
* whatever else the environment offers (MCP-v0 offers ``client``, a live client to its server).

The reward is the weighted sum of the components. A function may also return a dict of named
scores (as benchmax's ``compute_reward`` does); each entry becomes a component with the
function's weight. A component that raises :class:`~benchmax_gym.core.outcomes.RewardFailure`
(it could not score, e.g. its judge is down) fails the episode with that outcome; any other
exception scores 0, is logged
with its traceback, and never breaks the episode; ``info["reward_components"]`` shows each
score and ``info["reward_errors"]`` says which failed and why.

Every family finds the model's answer by one rule, :func:`final_answer`: the content of the last
closed ``<answer>...</answer>`` of the final reply. A reply without one has no answer and scores
0 (it is not graded on its prose, which would reward saying many things). Math also accepts
``\\boxed{}``, which takes precedence.

Example::

    def exact(completion: str, answer: str) -> float:
        given = final_answer(completion)
        return float(given is not None and given == answer)

    rubric = Rubric([exact])                       # name "exact", weight 1.0
    rubric = Rubric([("exact", exact, 0.9), ("short", lambda completion: len(completion) < 99, 0.1)])
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from benchmax_gym.core.outcomes import RewardFailure

log = logging.getLogger(__name__)

CONTEXT_NAMES = ("completion", "answer", "task", "messages", "episode", "state")


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


@dataclass
class RewardFn:
    """One component: ``name``, ``fn`` and ``weight``; ``fn`` may be sync or async."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    context: tuple[str, ...] = ()  # names the environment offers beyond CONTEXT_NAMES
    params: tuple[str, ...] = field(init=False)
    is_async: bool = field(init=False)

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
        self.is_async = inspect.iscoroutinefunction(self.fn)
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"weight of reward function {self.name!r} must be a finite number, got {self.weight!r}")


class Rubric:
    """A list of :class:`RewardFn`; ``score`` returns ``(reward, components, errors)``."""

    def __init__(self, funcs: Iterable[RewardFn | tuple | Callable[..., Any]], context: tuple[str, ...] = ()):
        self.funcs: list[RewardFn] = []
        self.context = tuple(context)
        for f in funcs:
            if isinstance(f, RewardFn):
                rf = RewardFn(f.name, f.fn, f.weight, self.context) if self.context else f
            elif isinstance(f, tuple):
                rf = RewardFn(*f[:3], context=self.context)
            elif callable(f):
                rf = RewardFn(getattr(f, "__name__", "reward"), f, context=self.context)
            else:
                raise TypeError(f"not a reward function: {f!r}")
            if any(rf.name == other.name for other in self.funcs):
                raise ValueError(f"duplicate reward component name {rf.name!r}")
            self.funcs.append(rf)
        if not self.funcs:
            raise ValueError("a Rubric needs at least one reward function")
        self.has_async = any(f.is_async for f in self.funcs)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.funcs]

    def with_weights(self, weights: dict[str, float]) -> "Rubric":
        """A copy with some weights replaced; unknown names are an error naming the choices."""
        unknown = set(weights) - set(self.names)
        if unknown:
            raise ValueError(f"reward_weights: unknown component(s) {sorted(unknown)}; components are {self.names}")
        return Rubric([RewardFn(f.name, f.fn, float(weights.get(f.name, f.weight))) for f in self.funcs], self.context)

    def _collect(self, rf: RewardFn, value: Any, components: dict, errors: dict) -> float:
        """Record ``value`` (a score or a dict of named scores); return its weighted sum."""
        items = value.items() if isinstance(value, dict) else [(rf.name, value)]
        total = 0.0
        for name, raw in items:
            name = str(name)
            try:
                score = float(raw)
                if not math.isfinite(score):
                    raise ValueError(f"reward is not finite: {score}")
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                log.warning("reward component %r returned %r; scored 0", name, raw)
                score = 0.0
            components[name] = score
            total += rf.weight * score
        return total

    def _fail(self, rf: RewardFn, exc: BaseException, components: dict, errors: dict) -> None:
        log.warning("reward component %r raised; scored 0", rf.name, exc_info=exc)
        components[rf.name] = 0.0
        errors[rf.name] = f"{type(exc).__name__}: {exc}"

    def score(self, run_coroutine: Callable[[Any], Any] | None = None, **context: Any):
        """Score synchronously; async components go through ``run_coroutine(coro)``."""
        scoring = self._score(context, run_coroutine or _no_loop)
        try:
            scoring.send(None)  # nothing in it awaits: every coroutine goes to run_coroutine
        except StopIteration as done:
            return done.value
        raise RuntimeError("a synchronous score awaited")  # unreachable

    async def ascore(self, **context: Any):
        return await self._score(context, None)

    async def _score(self, context: dict[str, Any], run_coroutine: Callable[[Any], Any] | None):
        """The one scoring loop: awaits async components, or hands them to ``run_coroutine``."""
        components: dict[str, float] = {}
        errors: dict[str, str] = {}
        total = 0.0
        for rf in self.funcs:
            try:
                value = rf.fn(**{n: context.get(n) for n in rf.params})
                if rf.is_async:
                    value = run_coroutine(value) if run_coroutine is not None else await value
            except RewardFailure:
                raise  # not a score: the engine ends the episode with its outcome
            except Exception as exc:
                self._fail(rf, exc, components, errors)
                continue
            total += self._collect(rf, value, components, errors)
        return total, components, errors


def _no_loop(coroutine: Any) -> Any:
    coroutine.close()
    raise RuntimeError("an async reward component needs an event loop: score it with run_coroutine or ascore")
