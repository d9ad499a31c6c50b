"""Difficulty control for the members of a mixture (``benchmax/Mix-v0``), and the statistics it
steers by.

A member's *levels* are overlays of its own ``gym.make`` keyword arguments, easiest first, each
naming a knob of the family's generator by its path (``"task_args.difficulty.digits"``). Each
(member, level) is its own env, built when first sampled (closed at the reset after its member's
level moves away). The :class:`Curriculum` keeps, per member, the success rate of its last
``window`` graded episodes at the current level, and moves
the level up when it is above ``band[1]``, down when below ``band[0]`` (then starts counting
afresh), or follows a fixed ``schedule`` (level as a function of the member's episodes seen).
It learns from the rewards the env itself sees: no trainer hook. A failed episode
(``info["outcome"]`` in :data:`~benchmax_gym.core.outcomes.FAILURES`) never counts.

It also counts *zero-variance groups*: the rollouts of one task (``group_size`` of them, GRPO's
k) that all got the same reward, per member and level: the groups whose advantages are all 0
and teach nothing.

In a ``SubprocVectorEnv``/``RayVectorEnv`` the parent holds the one controller that moves levels
(the workers' envs follow the levels it sends them), so difficulty moves with the whole batch, not
per worker, and the same seed plays the same levels whatever the number of workers. Gymnasium's
own ``sync``/``async`` modes have no such parent: each env keeps its own controller
(``envs.get_attr("curriculum")`` reads them). A ``reset(seed=...)`` does not reset a controller:
its levels and windows are training progress (``get_state``/``set_state`` save and restore them).
"""

from __future__ import annotations

import collections
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmax_gym.core.outcomes import FAILURES

#: the difficulty levels each generated family declares, easiest first (overlays of its make kwargs)
FAMILY_LEVELS: dict[str, tuple[dict[str, Any], ...]] = {
    "benchmax/Math-v0": tuple({"task_args.difficulty.digits": d} for d in (1, 2, 3, 4, 5, 6)),
    "benchmax/Wikipedia-v0": tuple({"task_args.difficulty.min_hops": h, "task_args.difficulty.max_hops": h}
                                   for h in (2, 3, 4)),
    "benchmax/Excel-v0": tuple({"task_args.difficulty.rows": r} for r in (5, 10, 20, 40, 80)),
    # CRM's question types first, then every type (updates that change the database: harder)
    "benchmax/CRM-v0": (
        {"task_args.task_types": ("knowledge_qa", "monthly_trend_analysis", "top_issue_identification",
                                  "case_routing", "named_entity_disambiguation", "handle_time", "transfer_count",
                                  "policy_violation_identification", "best_region_identification")},
        {},
    ),
}


def set_path(kwargs: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``kwargs`` with ``value`` at the dotted ``path`` (``task_args.difficulty.digits``);
    the dicts on the way are copied, never changed in place."""
    out = dict(kwargs)
    head, _, rest = path.partition(".")
    if not rest:
        out[head] = value
        return out
    inner = out.get(head)
    if inner is None:
        inner = {}
    elif not isinstance(inner, Mapping):
        raise ValueError(f"curriculum knob {path!r}: {head!r} is {inner!r}, not a dict of arguments")
    out[head] = set_path(inner, rest, value)
    return out


def apply_level(kwargs: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    for path, value in overlay.items():
        kwargs = set_path(kwargs, path, value)
    return dict(kwargs)


def _band(name: str, band: Any) -> tuple[float, float]:
    if not (isinstance(band, (tuple, list)) and len(band) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in band)
            and 0.0 <= band[0] < band[1] <= 1.0):
        raise ValueError(f"{name} must be (low, high) with 0 <= low < high <= 1, got {band!r}")
    return float(band[0]), float(band[1])


def _is_int(value: Any, low: int, high: float = math.inf) -> bool:
    """An int (numpy's too, not a bool) from ``low`` to ``high``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= value <= high


class MemberLevels:
    """One member's levels and where it stands: its configuration and its state.

    ``schedule``: ``[(episodes, level), ...]`` (from that many of the member's episodes on, that
    level; before its first entry, ``start``) or a function ``episodes -> level`` (its level at 0
    episodes is the first: no ``start`` with it); then the band does not move it.
    """

    def __init__(self, name: str, levels: Sequence[Mapping[str, Any]], *, band=(0.3, 0.7), window: int = 32,
                 min_episodes: int | None = None, start: int | None = None,
                 schedule: Sequence[tuple[int, int]] | Callable[[int], int] | None = None):
        self.name = name
        self.levels = tuple(dict(level) for level in levels) or ({},)
        self.band = _band(f"curriculum[{name!r}]['band']", band)
        if not _is_int(window, 1, sys.maxsize):  # (a deque's maxlen: a larger one raised OverflowError)
            raise ValueError(f"curriculum[{name!r}]['window'] must be a positive int up to {sys.maxsize}, "
                             f"got {window!r}")
        self.window = int(window)
        # (the window holds at most `window` episodes: a larger min_episodes would never move the level)
        if min_episodes is not None and not _is_int(min_episodes, 1, window):
            raise ValueError(f"curriculum[{name!r}]['min_episodes'] must be an int from 1 to the window "
                             f"({window}), got {min_episodes!r}")
        self.min_episodes = window if min_episodes is None else int(min_episodes)
        if callable(schedule) and start is not None:
            raise ValueError(f"curriculum[{name!r}]: give 'start' or a 'schedule' function, not both (the "
                             "function's level at 0 episodes is the start)")
        start = 0 if start is None else start
        if not _is_int(start, 0, len(self.levels) - 1):
            raise ValueError(f"curriculum[{name!r}]['start'] must be a level from 0 to {len(self.levels) - 1}, "
                             f"got {start!r}")
        if schedule is not None and not callable(schedule):
            schedule = self._checked_schedule(schedule)
        self.schedule = schedule
        self.start = int(start)
        # (a schedule's level at 0 episodes is the first played: it was `start`, the first
        # episode at level 0 whatever the schedule said)
        self.level = self._scheduled(0) if schedule is not None else self.start
        self.episodes = 0  # graded episodes seen (failures never count)
        self.recent: collections.deque[bool] = collections.deque(maxlen=self.window)

    def _checked_schedule(self, schedule: Any) -> tuple[tuple[int, int], ...]:
        """``[(episodes, level), ...]`` as sorted int pairs; anything else is an error naming the key."""
        where, last = f"curriculum[{self.name!r}]['schedule']", len(self.levels) - 1
        if isinstance(schedule, (str, bytes, Mapping)) or not isinstance(schedule, (list, tuple)) or not schedule:
            raise ValueError(f"{where} must be a non-empty list of (episodes, level) pairs or a function "
                             f"episodes -> level, got {schedule!r}")
        for pair in schedule:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and _is_int(pair[0], 0)
                    and _is_int(pair[1], 0, last)):
                raise ValueError(f"{where}: each entry must be (episodes >= 0, level from 0 to {last}), "
                                 f"got {pair!r}")
        return tuple(sorted((int(e), int(level)) for e, level in schedule))

    @property
    def adaptive(self) -> bool:
        return len(self.levels) > 1 and self.schedule is None

    def success_rate(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else math.nan

    def record(self, level: int, success: bool) -> bool:
        """One graded episode played at ``level``; True when the level moved."""
        self.episodes += 1
        before = self.level
        if self.schedule is not None:
            # (its success rate is still the one to watch: it stayed NaN under a schedule)
            if level == self.level:
                self.recent.append(bool(success))
            self.level = self._scheduled(self.episodes)
        elif level == self.level and len(self.levels) > 1:  # (episodes begun before a move do not count)
            self.recent.append(bool(success))
            if len(self.recent) >= self.min_episodes:
                rate = self.success_rate()
                if rate > self.band[1] and self.level + 1 < len(self.levels):
                    self.level += 1
                elif rate < self.band[0] and self.level > 0:
                    self.level -= 1
        elif len(self.levels) == 1:
            self.recent.append(bool(success))
        if self.level != before:
            self.recent.clear()
            return True
        return False

    def _scheduled(self, episodes: int) -> int:
        if callable(self.schedule):
            level = self.schedule(episodes)
            if isinstance(level, bool) or not isinstance(level, numbers.Real) or not math.isfinite(level):
                raise TypeError(f"curriculum[{self.name!r}]['schedule']({episodes}) must return a level (a number), "
                                f"got {level!r}")  # (int(None) failed deep in the step that ended an episode)
            return max(0, min(len(self.levels) - 1, int(level)))
        level = self.start
        for start, value in self.schedule:
            if episodes >= start:
                level = value
        return level

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "episodes": self.episodes, "recent": list(self.recent)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not _is_int(state["level"], 0, len(self.levels) - 1):  # (a state saved with other levels)
            raise ValueError(f"curriculum[{self.name!r}]: the saved level {state['level']!r} is not one of this "
                             f"member's levels 0..{len(self.levels) - 1}")
        self.level, self.episodes = int(state["level"]), int(state["episodes"])
        self.recent = collections.deque((bool(s) for s in state["recent"]), maxlen=self.window)


class Curriculum:
    """The members' levels and the zero-variance statistics (see the module docstring).

    Args:
        members: name -> :class:`MemberLevels`.
        group_size: k, the rollouts of one task that make a group (GRPO's group size).
    """

    MAX_OPEN_GROUPS = 10_000  # groups still filling; the oldest are dropped past this

    def __init__(self, members: Mapping[str, MemberLevels], group_size: int = 8):
        if not _is_int(group_size, 2):
            raise ValueError(f"group_size must be an int of at least 2 (rollouts per task), got {group_size!r}")
        self.members = dict(members)
        self.group_size = int(group_size)
        self.open: dict[tuple[str, int, str], list[float]] = {}
        self.groups: dict[tuple[str, int], list[int]] = {}  # (member, level) -> [complete, zero-variance]
        self.follower = False  # set in a vector env's workers: the parent moves the levels

    def level(self, member: str) -> int:
        return self.members[member].level

    def levels(self) -> dict[str, int]:
        return {name: m.level for name, m in self.members.items()}

    def set_levels(self, levels: Mapping[str, int]) -> None:
        """Follow the levels a vector env's parent decided (its controller sees every worker's episodes)."""
        self.follower = True
        for name, level in levels.items():
            if name in self.members:
                self.members[name].level = int(level)

    def record(self, member: str, level: int, task_id: Any, reward: float, success: bool,
               outcome: str | None) -> bool:
        """One finished episode. A failure (not the model's) is left out of everything.
        Returns True when a level moved."""
        if outcome in FAILURES or reward is None or reward != reward or member not in self.members:
            return False
        key = (member, int(level), str(task_id))
        rewards = self.open.pop(key, None) or []  # (re-inserted: the dict keeps the most recent last)
        rewards.append(float(reward))
        if len(rewards) >= self.group_size:
            counts = self.groups.setdefault(key[:2], [0, 0])
            counts[0] += 1
            counts[1] += max(rewards) == min(rewards)
        else:
            self.open[key] = rewards
            if len(self.open) > self.MAX_OPEN_GROUPS:
                del self.open[next(iter(self.open))]
        if self.follower:
            return False
        return self.members[member].record(int(level), success)

    def zero_variance(self, member: str, level: int) -> float:
        """The share of ``member``'s complete groups at ``level`` whose rewards were all equal (NaN: none yet)."""
        complete, zero = self.groups.get((member, int(level)), (0, 0))
        return zero / complete if complete else math.nan

    def stats(self) -> dict[str, Any]:
        """Per member: its level, the level's overlay, recent success rate, episodes seen, and per
        level played the complete groups and their zero-variance share."""
        out = {}
        for name, m in self.members.items():
            played = sorted(level for (member, level) in self.groups if member == name)
            out[name] = {"level": m.level, "difficulty": m.levels[m.level], "success_rate": m.success_rate(),
                         "episodes": m.episodes,
                         "zero_variance": {level: self.zero_variance(name, level) for level in played},
                         "groups": {level: self.groups[(name, level)][0] for level in played}}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"members": {name: m.state_dict() for name, m in self.members.items()},
                "groups": {f"{m}\x00{level}": list(c) for (m, level), c in self.groups.items()},
                "open": [[m, level, task, list(r)] for (m, level, task), r in self.open.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, s in state["members"].items():
            if name in self.members:
                self.members[name].load_state_dict(s)
        self.groups.clear()
        for key, counts in state.get("groups", {}).items():
            member, _, level = key.rpartition("\x00")
            self.groups[(member, int(level))] = list(counts)
        self.open = {(m, int(level), str(task)): list(r) for m, level, task, r in state.get("open", [])}


def member_levels(name: str, env_id: str, spec: Any, defaults: Mapping[str, Any]) -> MemberLevels:
    """A member's :class:`MemberLevels` from what the user wrote for it in ``curriculum=``:

    * ``"auto"`` or ``True``: the family's declared levels (:data:`FAMILY_LEVELS`);
    * ``{"knob": "task_args.difficulty.digits", "values": [1, 2, 3]}``: one knob, its values easiest first;
    * ``{"levels": [{path: value, ...}, ...]}``: overlays, easiest first;

    each dict may also hold ``band``, ``window``, ``min_episodes``, ``start``, ``schedule``
    (``defaults`` fills in those not given).
    """
    where = f"curriculum[{name!r}]"
    if spec is True or spec == "auto":
        spec = {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be 'auto', {{'knob': path, 'values': [...]}} or {{'levels': [...]}}, "
                         f"got {spec!r}")
    spec = dict(spec)
    options = {k: spec.pop(k) for k in ("band", "window", "min_episodes", "start", "schedule") if k in spec}
    if "knob" in spec or "values" in spec:
        knob, values = spec.pop("knob", None), spec.pop("values", None)
        if not isinstance(knob, str) or not knob or not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"{where} needs 'knob' (a dotted path such as 'task_args.difficulty.digits') and a "
                             f"non-empty list of 'values', got knob={knob!r}, values={values!r}")
        levels = [{knob: v} for v in values]
    elif "levels" in spec:
        levels = spec.pop("levels")
        if not isinstance(levels, (list, tuple)) or not levels or not all(isinstance(lv, Mapping) for lv in levels):
            raise ValueError(f"{where}['levels'] must be a non-empty list of {{path: value}} dicts, got {levels!r}")
    else:
        if env_id not in FAMILY_LEVELS:
            raise ValueError(f"{where}: {env_id} declares no difficulty levels; name the knob: "
                             f"{{'knob': 'task_args....', 'values': [...]}} (declared: {sorted(FAMILY_LEVELS)})")
        levels = FAMILY_LEVELS[env_id]
    if spec:
        raise ValueError(f"{where} got unexpected keys {sorted(spec)} (allowed: knob, values, levels, band, window, "
                         "min_episodes, start, schedule)")
    return MemberLevels(name, levels, **{**defaults, **options})


__all__ = ["Curriculum", "FAMILY_LEVELS", "MemberLevels", "apply_level", "member_levels", "set_path"]
