"""``benchmax/Mix-v0``: many environments in one, by weight, at the difficulty that teaches.

::

    env = gym.make("benchmax/Mix-v0", members=[
        ("benchmax/Math-v0", 0.5),
        ("benchmax/Wikipedia-v0", 0.3),
        ("benchmax/CRM-v0", {"tool_format": "json"}, 0.2),
    ], curriculum={"Math-v0": "auto"})
    obs, info = env.reset(seed=0)          # info["member"] == "Math-v0", say
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=64, members=...)   # every backend alike

One registered id, configured by ``members=`` (the decision: a mixture is a value passed to
``gym.make``/``make_vec``/eval/the adapters like any other argument, so it travels to workers,
Ray hosts and run records unchanged, and needs no registration step). :func:`register_mix`
also names one (``"me/Train-v0"``), for the CLI or to keep a training mixture under one id.

* **Members**: ``{id: weight}``; a list of ``(spec, weight)`` pairs where a spec is an id,
  ``(id, kwargs)`` or ``(name, id, kwargs)`` (kwargs are a dict, which cannot be a dict key), or
  of ``(id, kwargs, weight)``; or a list of ``{"id", "weight", "kwargs", "name"}`` dicts (the
  JSON form, for the CLI). A
  member's name defaults to its id without the namespace (``"Math-v0"``); two members of one id
  need names. A member is a text env (Text observation and action spaces, as every benchmax id;
  ``CartPole-v1`` is refused at make). Engine options given to ``gym.make`` itself
  (``tool_format``, ``max_turns``...) reach every member whose class takes them; a member's own
  kwargs win.
* **Sampling**: each reset draws a member. ``sampling="stratified"`` (default): a golden-ratio
  (Kronecker) sequence through the cumulative weights, its phase drawn from the env's seed (with
  none, from its entropy-seeded RNG: each env of a vector env its own), so
  any window of N resets holds each member within a count or two of ``N * weight`` (about ±1
  point at N=256; ``benchmarks/mixture.py``); ``"random"``: an independent draw by weight from
  ``self.np_random``. Both are reproducible from the seed. ``options={"member": name}`` forces a
  member (then ``task_index`` is that member's); ``options={"task_index": i}`` alone names task
  ``i`` of the mixture's own task list (:class:`MixTasks`: position ``i`` of the unshifted
  sequence, the k-th task of its member, wrapped over its task count at the level played), the
  same whatever the seed (GRPO groups, eval).
  Forced resets do not advance the sampler. ``options={"difficulty": level}`` plays that level
  (a GRPO group's k rollouts at one level, even if the controller moves meanwhile).
* **Built at make**: each member with a weight is made by ``gym.make`` itself, at its starting
  level, and kept for its first draw: its own constructor checks its arguments there (``max_turns=-1``,
  ``tasks=[]``, a wrong type: ``"members: <name>: ..."``), not hours later in the worker that first
  draws it. No built-in family starts anything at construction (MCP servers and sandboxes start
  at a reset, workbooks are made per episode); what one reads (a dataset, a corpus, an OpenEnv
  server's schema) that process would read at the member's first draw anyway. A member that fails
  at make for another reason than its arguments (a file, a server, the network) is made again at
  its first draw, which raises its error, named, if it still fails (a warning at make names it
  and its error). A member of weight 0 (played
  only when forced) and the other levels are made when first needed; each other level that sets
  more than task arguments (``max_turns`` as the knob, say) is made once at make and closed, and
  every level's task arguments are checked at make too (a bad knob value is an error there).
  When a member's curriculum level moves, its other built levels are closed at the next reset
  (what their episodes started, an MCP server or a sandbox, was held until the mixture closed: one
  more per level reached); one played again (a forced ``difficulty``) is made again.
* **What the model sees is the member's**: its system prompt, tools (``info["tools"]``) and
  spaces' bounds; the mixture's spaces are Text spaces as wide as the widest member.
  ``info["member"]`` names it on every step, ``info["task_id"]`` is ``"<member>/<task id>"``
  (task ids of different families may collide), and ``info["reward_components"]`` are
  namespaced ``"<member>/<component>"``.
* **State**: :meth:`get_state`/:meth:`set_state` (also the ``sampler_state`` attribute, for a
  vector env's ``get_attr``/``set_attr``) hold the sampler's position and phase, the RNGs (the
  mixture's and each built member's), the counts and the curriculum, so a resumed run continues
  the same sequence.
* **Curricula and statistics**: see :mod:`benchmax_gym.curriculum`. The step that ends an episode
  carries ``info["difficulty"]`` (the level) and ``info["mix_episode"]`` (member, level, task,
  graded reward as eval records it, success, outcome: what a vector env's parent feeds its one
  controller). The controller's figures (a member's recent success rate, its zero-variance
  share) change with every episode, so a lone env keeps them out of its info (Gymnasium's checker
  wants a step's info to follow from the seed and actions): read
  ``env.unwrapped.curriculum.stats()``. A
  ``SubprocVectorEnv``/``RayVectorEnv`` adds ``info["success_rate"]`` and
  ``info["zero_variance"]`` for each ended episode, from its one controller over all workers
  (Gymnasium's ``sync``/``async`` modes: each env its own, ``envs.get_attr("curriculum")``). A
  seed restarts the sampler and the members' RNGs, not the curriculum (its levels are training
  progress): the same seed plays the same sequence from the same curriculum state.
* **Through a trainer adapter** (:func:`share_curriculum`): SkyRL, verl and OpenRLHF make an env
  per trajectory and TRL one per rollout slot, so a controller of each env's own would never see
  more than one episode (its level never moved) or only its slot's (levels drifted apart within
  a group). The adapters make every mixture env of one id and kwargs in a process follow one
  controller of that process, fed by all of their episodes.

Attributes the mixture does not define (``tool_schemas``, ``toolset``, ``rubric``, ``episode``,
``messages``...) are the current member's (before the first reset: the first member's with a
weight).
"""

from __future__ import annotations

import bisect
import contextlib
import inspect
import logging
import math
import json
import numbers
import threading
import warnings
import zlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from benchmax_gym.core.checks import positive_int
from benchmax_gym.core.spaces import UnicodeText
from benchmax_gym.core.tasks import INFINITE, Task, TaskSource
from benchmax_gym.curriculum import Curriculum, MemberLevels, apply_level, member_levels

log = logging.getLogger(__name__)

SAMPLING = ("stratified", "random")
PHI = (math.sqrt(5.0) - 1.0) / 2.0  # the golden ratio's fraction: the most evenly spread additive sequence
#: the members of ``gym.make("benchmax/Mix-v0")`` with no ``members=`` (two offline families)
DEFAULT_MEMBERS = {"benchmax/Math-v0": 0.5, "benchmax/Wikipedia-v0": 0.5}


class MemberSpec:
    """One member: its name, id, own kwargs and weight."""

    __slots__ = ("name", "env_id", "kwargs", "weight")

    def __init__(self, name: str, env_id: str, kwargs: Mapping[str, Any], weight: float):
        self.name, self.env_id, self.kwargs, self.weight = name, env_id, dict(kwargs), weight

    def __repr__(self) -> str:
        return f"MemberSpec({self.name!r}, {self.env_id!r}, {self.kwargs!r}, {self.weight!r})"


class _Pairs(list):
    """``(spec, weight)`` pairs read like a dict's items (specs holding dicts are not hashable)."""

    def items(self):
        return list(self)


def parse_members(members: Any) -> list[MemberSpec]:
    """``members=`` in any of its forms -> specs, with errors that name the argument."""
    if isinstance(members, (list, tuple)) and not isinstance(members, _Pairs) and members and all(
            isinstance(m, (list, tuple)) and len(m) in (2, 3) for m in members):
        # [(spec, weight), ...] or [(id, kwargs, weight), ...]: kwargs (a dict) cannot be a dict key
        pairs = [(m[0], m[1]) if len(m) == 2 else ((m[0], m[1]), m[2]) for m in members]
        return parse_members(_Pairs(pairs))
    if isinstance(members, (Mapping, _Pairs)):
        items = list(members.items())
        rows = []
        for spec, weight in items:
            if isinstance(spec, str):
                name, env_id, kwargs = None, spec, {}
            elif isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[1], Mapping):
                name, (env_id, kwargs) = None, spec
            elif isinstance(spec, (tuple, list)) and len(spec) == 3 and isinstance(spec[2], Mapping):
                name, env_id, kwargs = spec
            else:
                raise ValueError("members: each key must be an env id, (id, kwargs) or (name, id, kwargs), "
                                 f"got {spec!r}")
            rows.append((name, env_id, kwargs, weight))
    elif isinstance(members, (list, tuple)) and members and all(isinstance(m, Mapping) for m in members):
        rows = []
        for m in members:
            extra = set(m) - {"id", "weight", "kwargs", "name"}
            if "id" not in m or extra:
                raise ValueError("members: each entry needs 'id' (and may have 'weight', 'kwargs', 'name'), "
                                 f"got {dict(m)!r}")
            kwargs = m.get("kwargs") or {}
            if not isinstance(kwargs, Mapping):
                raise ValueError(f"members: the kwargs of {m['id']!r} must be a dict of its gym.make arguments, "
                                 f"got {kwargs!r}")
            rows.append((m.get("name"), m["id"], kwargs, m.get("weight", 1.0)))
    else:
        raise ValueError("members must be {id or (name, id, kwargs): weight}, a list of (id or (id, kwargs) or "
                         "(name, id, kwargs), weight) pairs or of (id, kwargs, weight), or a list of "
                         f"{{'id', 'weight', 'kwargs', 'name'}} dicts, got {members!r}")
    specs: list[MemberSpec] = []
    for name, env_id, kwargs, weight in rows:
        if not isinstance(env_id, str) or env_id not in gym.registry:
            close = [i for i in gym.registry if isinstance(env_id, str) and env_id.lower() in i.lower()]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"members: {env_id!r} is not a registered env id{hint}")
        if _is_mixture(env_id):  # (a named one too: register_mix's "me/Train-v0" is a Mix-v0)
            raise ValueError(f"members: a mixture cannot hold {env_id} (a mixture itself: list its members instead)")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not weight >= 0 or math.isinf(weight):
            raise ValueError(f"members: the weight of {env_id!r} must be a non-negative number, got {weight!r}")
        name = env_id.rpartition("/")[2] if name is None else name
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"members: a member's name must be a non-empty string without '/', got {name!r}")
        if any(s.name == name for s in specs):
            raise ValueError(f"members: two members are named {name!r}; name them: (name, id, kwargs)")
        specs.append(MemberSpec(name, env_id, kwargs, float(weight)))
    if not specs or sum(s.weight for s in specs) <= 0:
        raise ValueError("members: at least one member needs a positive weight")
    return specs


class MixSampler:
    """Which member each unforced reset plays (see the module docstring)."""

    def __init__(self, weights: list[float], mode: str = "stratified"):
        if mode not in SAMPLING:
            raise ValueError(f"sampling must be one of {list(SAMPLING)}, got {mode!r}")
        if not (weights and max(weights) > 0):
            raise ValueError(f"weights: at least one must be positive, got {weights!r}")
        scaled = np.asarray(weights, dtype=float) / max(weights)  # (huge finite weights: their sum stays finite)
        self.mode = mode
        self.cumulative = list(np.cumsum(scaled / scaled.sum())[:-1])
        last = max(i for i, w in enumerate(scaled) if w > 0)  # (rounding left trailing weight-0 members a
        self.cumulative[last:] = [1.0] * len(self.cumulative[last:])  # sliver below 1: drawn, 1 in 2**53)
        # (None: no phase yet. The first draw takes one from the env's RNG, which Gymnasium seeds
        # from entropy when reset gets no seed: a phase of 0 for all had every env of a vector
        # env play the same member at each reset)
        self.position, self.offset = 0, None

    def seed(self, rng: np.random.Generator) -> None:
        self.position, self.offset = 0, float(rng.random())

    def draw(self, rng: np.random.Generator) -> int:
        if self.mode == "random":
            return bisect.bisect_right(self.cumulative, rng.random())
        if self.offset is None:
            self.offset = float(rng.random())
        u = (self.offset + self.position * PHI) % 1.0
        self.position += 1
        return bisect.bisect_right(self.cumulative, u)

    def schedule(self, stop: int) -> np.ndarray:
        """The members of positions ``0..stop-1`` of the unshifted sequence (the mixture's task list)."""
        u = (np.arange(stop, dtype=np.float64) * PHI) % 1.0
        return np.searchsorted(np.asarray(self.cumulative), u, side="right")


class MixTasks(TaskSource):
    """The mixture's own task list: task ``i`` is position ``i`` of the stratified sequence
    (unshifted), the k-th task of that member where k counts the member's earlier positions.
    Unbounded (``len`` is :data:`~benchmax_gym.core.tasks.INFINITE`); ``locate(i)`` says which."""

    def __init__(self, mix: "MixEnv"):
        self.mix = mix
        self._members = np.zeros(0, dtype=np.int64)
        self._local = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return INFINITE

    def locate(self, index: int, level: int | None = None) -> tuple[str, int]:
        """Task ``index`` as ``(member, its task index)``, among the member's tasks at ``level``
        (default: its current one: the level it will play)."""
        name, k = self.position(index)
        level = self.mix._level_for(name) if level is None else level
        return name, k % len(self.mix._member(name, level).core.tasks)

    def position(self, index: int) -> tuple[str, int]:
        """Task ``index`` as ``(member, k)``: the member's k-th task, before wrapping over its task count."""
        if index >= len(self._members):
            stop = max(2 * len(self._members), index + 1, 1024)
            members = self.mix._sampler.schedule(stop)
            local = np.zeros(stop, dtype=np.int64)
            for m in range(len(self.mix.specs)):
                where = members == m
                local[where] = np.arange(int(where.sum()))
            self._members, self._local = members, local
        return self.mix.specs[int(self._members[index])].name, int(self._local[index])

    def get(self, index: int) -> Task:
        name, local = self.locate(index)
        return self.mix._member(name, self.mix._level_for(name)).core.tasks[local]


class _Member:
    """A built member at one level: the env as made, the object whose methods to call, its max reward."""

    __slots__ = ("name", "level", "key", "env", "core", "direct", "step", "max_reward", "solver")

    def __init__(self, name: str, level: int, env: gym.Env):
        from benchmax_gym.wrappers.worker import async_api

        self.name, self.level, self.key, self.env = name, level, f"{name}@{level}", env
        core = async_api(env)  # behind Gymnasium's checks alone: call the env itself (the mixture has its own)
        self.core = core if core is not None else env.unwrapped  # (attributes are read here)
        self.direct = core is not None  # else its own wrappers stay in the calls
        self.step = (core or env).step
        rubric = getattr(self.core, "rubric", None)
        # (as eval's success: the sum of every leaf's weight also counted per-turn leaves and those
        # under gates, a maximum no episode reaches)
        self.max_reward = rubric.max_reward if rubric is not None else 1.0
        self.solver = None


def _member_class(env_id: str) -> Any:
    """The class (or factory) ``gym.make(env_id)`` calls, without making it."""
    from gymnasium.envs.registration import load_env_creator

    from benchmax_gym.registry import _PARTS, RegisteredFactory

    creator = gym.spec(env_id).entry_point
    if isinstance(creator, str):
        creator = load_env_creator(creator)
    if isinstance(creator, RegisteredFactory):
        creator = _PARTS.get(creator.env_id, (creator,))[0]
    return creator


def _is_mixture(env_id: str) -> bool:
    creator = _member_class(env_id)
    return isinstance(creator, type) and issubclass(creator, MixEnv)


@contextlib.contextmanager
def _naming(name: str, env_id: str | None = None, level: int | None = None):
    """A member's own error, unchanged in type and message, with a note naming the member (the
    mixture's traceback alone does not say which of its members failed)."""
    try:
        yield
    except Exception as exc:
        _name_member(exc, name, env_id, level)
        raise


def _name_member(exc: BaseException, name: str, env_id: str | None = None, level: int | None = None) -> None:
    where = f"mixture member {name!r}"
    if not any(str(note).startswith(where) for note in getattr(exc, "__notes__", ())):
        exc.add_note(where + (f" ({env_id} at level {level})" if env_id else ""))


def _stable(text: str) -> int:
    return zlib.crc32(text.encode())


class MixEnv(gym.Env[str, str]):
    """Weighted members in one env, with optional curricula (see the module docstring).

    Args:
        members: the members and their weights (default :data:`DEFAULT_MEMBERS`).
        sampling: ``"stratified"`` (default) or ``"random"``.
        curriculum: ``True``/``"auto"`` (every member whose family declares levels), or
            ``{member name: "auto" | {"knob": path, "values": [...]} | {"levels": [...]}}`` with
            optional ``band``, ``window``, ``min_episodes``, ``start``, ``schedule`` per member
            (see :func:`benchmax_gym.curriculum.member_levels`).
        band: the target success band, ``(0.3, 0.7)`` by default.
        window: a member's recent episodes its success rate is taken over.
        group_size: k, the rollouts of one task that make a group (zero-variance statistics).
        render_mode: passed to every member.
        **shared: engine options for every member that takes them (``tool_format``, ``max_turns``...).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(self, members: Any = None, *, sampling: str = "stratified", curriculum: Any = None,
                 band: tuple[float, float] = (0.3, 0.7), window: int = 32, group_size: int = 8,
                 render_mode: str | None = None, **shared: Any):
        from benchmax_gym.core.env import ToolEnv, known_arguments, unknown_arguments_message

        self.specs = parse_members(DEFAULT_MEMBERS if members is None else members)
        self._names = [s.name for s in self.specs]
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.render_mode = render_mode
        classes = {s.env_id: _member_class(s.env_id) for s in self.specs}
        knows = {env_id: (known_arguments(c) if isinstance(c, type) else None) for env_id, c in classes.items()}
        accepted = known_arguments(ToolEnv).union(*(k for k in knows.values() if k is not None))
        unknown = {k: v for k, v in shared.items() if k not in accepted}
        if unknown:
            raise TypeError(unknown_arguments_message(ToolEnv, unknown, also=type(self)))
        self._kwargs = {}
        for s in self.specs:  # what each member is made with: the shared options it takes, then its own
            known = knows[s.env_id]
            wrong = {k: v for k, v in s.kwargs.items() if known is not None and k not in known}
            if wrong:  # here, at make, not in the worker that first draws it
                raise TypeError(f"members: {s.name}: {unknown_arguments_message(classes[s.env_id], wrong)}")
            self._kwargs[s.name] = {**{k: v for k, v in shared.items() if known is None or k in known}, **s.kwargs}
        self._sampler = MixSampler([s.weight for s in self.specs], sampling)
        self.curriculum = self._curriculum(curriculum, band, window, group_size)
        for s in self.specs:
            known = knows[s.env_id]
            heads = {path.partition(".")[0] for level in self.curriculum.members[s.name].levels for path in level}
            wrong = sorted(h for h in heads if known is not None and h not in known)
            if wrong:
                raise ValueError(f"curriculum[{s.name!r}]: a knob's path starts with {wrong}, not an argument of "
                                 f"{s.env_id} (e.g. 'task_args.difficulty.digits')")
            self._check_task_args(s, classes[s.env_id])
        self.observation_space = UnicodeText(self._widest("max_observation_chars", 1_000_000))
        self.action_space = UnicodeText(self._widest("max_action_chars", 32_000))
        self._built: dict[tuple[str, int], _Member] = {}
        self._current: _Member | None = None
        self._episode_step = self._no_episode  # (the playing episode's step: _started)
        self._task_id = ""
        self._seed: int | None = None
        self._seeded: set[str] = set()  # members reset since the mixture was seeded
        self._pending_rng: dict[str, Any] = {}  # restored RNG states of members not built yet
        self.counts = dict.fromkeys(self._names, 0)
        self.tasks = MixTasks(self)
        self._levels = self.curriculum.levels()  # (as the built members were chosen: see _release_retired)
        self._build_drawn()

    def _widest(self, key: str, default: int) -> int:
        """The largest ``key`` of the members, each checked as the engine checks it (``int("abc")``
        or ``int(nan)`` raised before any member was made, naming nothing)."""
        sizes = []
        for s in self.specs:
            try:
                sizes.append(positive_int(key, self._kwargs[s.name].get(key, default)))
            except ValueError as exc:
                raise ValueError(f"members: {s.name}: {exc}" if key in s.kwargs else str(exc)) from None
        return max(sizes)

    def _build_drawn(self) -> None:
        """Make every member that draws can reach, at its starting level, now (and kept), and each
        of its other levels that sets more than task arguments (made and closed): an argument a
        constructor refuses (a ValueError or TypeError) fails at ``gym.make`` naming it, the member
        and the level. Any other failure (a file, a server, the network: it may be there by the
        member's first draw) leaves the member to be made then, and to raise its own error, named,
        if it still fails (see the module docstring)."""
        for s in self.specs:
            if s.weight <= 0:
                continue
            start, levels = self._level_for(s.name), self.curriculum.members[s.name].levels
            others = [level for level, overlay in enumerate(levels) if level != start and set(overlay) - {"task_args"}]
            for level in (start, *others):
                try:
                    if level == start:
                        self._member(s.name, level)
                    else:
                        self._make(s.name, level).close()
                except (TypeError, ValueError) as exc:
                    self.close()  # (the members built so far)
                    # the member named in the message: gym.make re-raises a TypeError as a new one,
                    # without its notes, after the text that the member's own gym.make added
                    says = str(exc).partition(" was raised from the environment creator for ")[0]
                    overlay = levels[level]
                    where = f"curriculum[{s.name!r}] level {level} {overlay}" if overlay else f"members: {s.name}"
                    raise (TypeError if isinstance(exc, TypeError) else ValueError)(f"{where}: {says}") from exc
                except Exception as exc:
                    if level == start:  # (not its arguments: made again, and raising, at its first draw)
                        # said now, naming it: in a vector env's worker its error reaches the
                        # parent as an env_error whose text does not say which member failed
                        log.warning("mixture member %r (%s) could not be made at make: %s: %s; it is made again "
                                    "at its first draw, whose reset raises this if it still fails", s.name, s.env_id,
                                    type(exc).__name__, exc)
                        break
                except BaseException:
                    self.close()
                    raise

    def _check_task_args(self, spec: MemberSpec, cls: Any) -> None:
        """Each level's task source configured now (a checked dataclass: nothing is built or read),
        so a bad knob value fails at make, not in the worker whose controller first reaches it."""
        options = getattr(cls, "choices", {}).get("task_args") if isinstance(cls, type) else None
        param = inspect.signature(cls).parameters.get("tasks") if options else None
        if param is None:
            return
        from benchmax_gym.core.sources import choose

        for level, overlay in enumerate(self.curriculum.members[spec.name].levels):
            kwargs = apply_level(self._kwargs[spec.name], overlay)
            tasks = kwargs.pop("tasks", param.default)
            if tasks is inspect.Parameter.empty:
                return
            try:
                with warnings.catch_warnings():  # (the flat arguments' DeprecationWarning: make gives it)
                    warnings.simplefilter("ignore", DeprecationWarning)
                    choose(tasks, kwargs.pop("task_args", None), options, kwargs)
            except ValueError as exc:
                where = f"curriculum[{spec.name!r}] level {level} {overlay}" if overlay else f"members: {spec.name}"
                raise ValueError(f"{where}: {exc}") from None

    def _curriculum(self, curriculum: Any, band, window, group_size) -> Curriculum:
        defaults = {"band": band, "window": window}
        if curriculum is None or curriculum is False:
            wanted = {}
        elif curriculum is True or curriculum == "auto":
            from benchmax_gym.curriculum import FAMILY_LEVELS

            wanted = {s.name: "auto" for s in self.specs if s.env_id in FAMILY_LEVELS}
        elif isinstance(curriculum, Mapping):
            wanted = dict(curriculum)
            unknown = [n for n in wanted if n not in self._names]
            if unknown:
                raise ValueError(f"curriculum names members {unknown} that the mixture does not have ({self._names})")
        else:
            raise ValueError(f"curriculum must be None, True/'auto' or {{member name: spec}}, got {curriculum!r}")
        levels = {}
        for s in self.specs:
            if s.name in wanted:
                levels[s.name] = member_levels(s.name, s.env_id, wanted[s.name], defaults)
            else:
                levels[s.name] = MemberLevels(s.name, ({},), **defaults)
        return Curriculum(levels, group_size=group_size)

    # -- members ----------------------------------------------------------------------------------

    def _level_for(self, name: str) -> int:
        return self.curriculum.members[name].level

    def _member(self, name: str, level: int) -> _Member:
        member = self._built.get((name, level))
        if member is None:
            member = self._built[(name, level)] = _Member(name, level, self._make(name, level))
            rng_state = self._pending_rng.pop(member.key, None)
            if rng_state is not None:
                member.core.np_random = np.random.Generator(np.random.PCG64())
                member.core.np_random.bit_generator.state = rng_state
                self._seeded.add(member.key)
        return member

    def _release_retired(self) -> None:
        """Close the built levels of each member whose curriculum level moved (by its controller,
        a vector env's parent, ``set_state``) since the last reset, the new level's aside: each held
        what its episodes started (an MCP server, a sandbox) until the mixture closed, one more per
        level reached. Called at a reset, with no episode playing. One played again (a forced
        ``difficulty``, a level moved back) is made again, its RNG where it was."""
        levels = self.curriculum.levels()
        if levels == self._levels:
            return
        moved = {name for name, level in levels.items() if self._levels.get(name) != level}
        self._levels = levels
        for key in [key for key in self._built if key[0] in moved and key[1] != levels[key[0]]]:
            member = self._built.pop(key)
            if member.key in self._seeded or member.core._np_random is not None:
                self._pending_rng[member.key] = member.core.np_random.bit_generator.state
            self._close_member(member)

    def _make(self, name: str, level: int) -> gym.Env:
        """The member ``name`` at ``level``, made now."""
        spec = self.specs[self._names.index(name)]
        kwargs = apply_level(self._kwargs[name], self.curriculum.members[name].levels[level])
        with _naming(name, spec.env_id, level):
            if self.render_mode:
                env = gym.make(spec.env_id, render_mode=self.render_mode, disable_env_checker=True, **kwargs)
            else:
                env = gym.make(spec.env_id, disable_env_checker=True, **kwargs)
            spaces = (env.observation_space, env.action_space)
            if not all(isinstance(space, gym.spaces.Text) for space in spaces):
                # (CartPole made fine, then its reset returned an array and its step refused the
                # text action: the mixture's spaces are Text, its actions strings)
                env.close()
                raise ValueError(
                    f"{spec.env_id} is not a text environment (its observation and action spaces are "
                    f"{type(spaces[0]).__name__} and {type(spaces[1]).__name__}): a mixture's members take text "
                    "actions and return text observations (Text spaces), as every benchmax id does")
        return env

    @property
    def built_members(self) -> list[str]:
        """The members built now, as ``"name@level"`` (those with a weight at make, others when needed;
        a level its curriculum left is closed at the next reset)."""
        return [m.key for m in self._built.values()]

    @property
    def member(self) -> str | None:
        """The member playing now (None before the first reset)."""
        return self._current.name if self._current else None

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The playing member's tools; before a reset, the tools every member shares (an MCP
        server, a TRL environment class: one tool set for all episodes), or a ValueError when
        the members' tools differ (serve or train each member's id then)."""
        if self._current is not None:
            return self._current.core.tool_schemas
        return self._common().tool_schemas

    @property
    def _family_prompt(self) -> str:  # (what mcp-serve gives as the server's instructions)
        return self._common()._family_prompt

    def _common(self) -> Any:
        drawn = [s.name for s in self.specs if s.weight > 0]
        cores = [self._member(n, self._level_for(n)).core for n in drawn]
        names = [sorted(t["function"]["name"] for t in c.tool_schemas) for c in cores]
        if any(n != names[0] for n in names[1:]):
            tools = "; ".join(f"{m}: {', '.join(n)}" for m, n in zip(drawn, names))
            raise ValueError(f"the members of this mixture have different tools ({tools}), so there is no one tool "
                             "set to serve or to make methods of: use each member's id there")
        return cores[0]

    def __getattr__(self, name: str) -> Any:
        # (only for attributes the mixture lacks: the current member's, or before a reset the first
        # member's with a weight: one of weight 0 may not build at all, and was built here)
        if name.startswith("_") or "_built" not in self.__dict__:
            raise AttributeError(name)
        first = next(s.name for s in self.specs if s.weight > 0)
        current = self.__dict__.get("_current") or self._member(first, self._level_for(first))
        return getattr(current.core, name)

    # -- Gymnasium API ----------------------------------------------------------------------------

    def _choose(self, seed: int | None, options: dict[str, Any] | None) -> tuple[_Member, dict[str, Any], int | None]:
        if seed is not None:
            self._sampler.seed(self.np_random)
            self._seed, self._seeded = int(seed), set()
            self._pending_rng.clear()  # (a member made later is seeded from this seed, as a built one is)
        options = dict(options or {})
        name = options.pop("member", None)
        mixed = None  # (a task of the mixture's own list: the member's k-th, wrapped at the level played)
        if name is not None:
            if name not in self._names:
                raise ValueError(f"options['member'] must be one of {self._names}, got {name!r}")
        elif options.get("task_index") is not None:
            index = options["task_index"]
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
                raise ValueError(f"options['task_index'] must be a non-negative int, got {index!r}")
            name, mixed = self.tasks.position(int(index))
        else:
            name = self._names[self._sampler.draw(self.np_random)]
        level = options.pop("difficulty", None)
        if level is None:
            level = self._level_for(name)
        elif isinstance(level, bool) or not isinstance(level, (int, np.integer)) or not (
                0 <= level < len(self.curriculum.members[name].levels)):
            raise ValueError(f"options['difficulty'] must be a level of {name} from 0 to "
                             f"{len(self.curriculum.members[name].levels) - 1}, got {level!r}")
        if mixed is not None:  # (over the task count of the level played: over the current level's, a group
            # pinned to one level played another task of it once the controller moved)
            options["task_index"] = mixed % len(self._member(name, int(level)).core.tasks)
        member = self._member(name, int(level))
        member_seed = None
        if self._seed is not None and member.key not in self._seeded:  # each member seeded once per mixture seed
            self._seeded.add(member.key)
            member_seed = (self._seed * 1_000_003 + _stable(member.key)) % 2**31
        self.counts[name] += 1
        return member, options, member_seed

    def _started(self, member: _Member, obs: str, info: dict[str, Any]):
        self._current = member
        self._task_id = task_id = f"{member.name}/{info.get('task_id')}"
        info["member"], info["task_id"], info["difficulty"] = member.name, task_id, member.level
        # (an attribute step() calls, not step itself: a caller may hold env.step from before this reset)
        self._episode_step = self._stepper(member, task_id)
        return obs, info

    def _stepper(self, member: _Member, task_id: str):
        """``step`` for this episode: the member's step, its info marked, in one frame with
        everything bound (the mixture's whole cost on a step mid-episode; benchmarks/mixture.py)."""
        member_step, name, ended = member.step, member.name, self._ended

        def step(action: str):
            try:
                result = member_step(action)
            except Exception as exc:  # (a try costs nothing until it catches)
                _name_member(exc, name)
                raise
            info = result[4]
            info["member"] = name
            info["task_id"] = task_id
            if result[2] or result[3]:
                ended(member, result[1], info)
            return result

        return step

    def _ending_episode(self) -> None:
        """A reset ends the episode playing: if the next member then fails to build or reset,
        ``step`` raises ResetNeeded instead of going on with the old member's episode."""
        self._current = None
        self._episode_step = self._no_episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._ending_episode()
        self._release_retired()
        member, options, member_seed = self._choose(seed, options)
        with _naming(member.name):
            obs, info = (member.core if member.direct else member.env).reset(seed=member_seed, options=options)
        return self._started(member, obs, info)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """``reset`` as a coroutine (a vector worker interleaves many envs)."""
        super().reset(seed=seed)
        self._ending_episode()
        self._release_retired()
        member, options, member_seed = self._choose(seed, options)
        with _naming(member.name):
            if member.direct:
                obs, info = await member.core.areset(seed=member_seed, options=options)
            else:
                obs, info = member.env.reset(seed=member_seed, options=options)
        return self._started(member, obs, info)

    def step(self, action: str):
        return self._episode_step(action)

    def _no_episode(self, action: str):
        raise gym.error.ResetNeeded("call reset() before step()")

    async def astep(self, action: str):
        """``step`` as a coroutine."""
        member = self._current
        if member is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        with _naming(member.name):
            if member.direct:
                obs, reward, terminated, truncated, info = await member.core.astep(action)
            else:
                obs, reward, terminated, truncated, info = member.step(action)
        info["member"], info["task_id"] = member.name, self._task_id
        if terminated or truncated:
            self._ended(member, reward, info)
        return obs, reward, terminated, truncated, info

    @property
    def needs_event_loop(self) -> bool:
        """Some members are made only when first needed (weight 0, another level): a vector worker
        cannot know beforehand whether one waits on I/O."""
        return True

    def _ended(self, member: _Member, reward: float, info: dict[str, Any]) -> None:
        """Namespace the components, feed the curriculum, report the member's statistics."""
        name, level = member.name, member.level
        components = info.get("reward_components")
        if components:
            info["reward_components"] = {f"{name}/{k}": v for k, v in components.items()}
        outcome = info.get("outcome")
        graded = reward == reward  # (a failure's reward is NaN)
        # success and the zero-variance groups from the graded reward, as eval's records: a last
        # step's reward also holds that step's per-turn pay (dense_rewards), or less what earlier
        # steps paid (shaping), so two rollouts graded alike were a group that taught something
        episode = getattr(member.core, "episode", None)
        final = episode.reward if episode is not None else reward
        success = bool(graded and final is not None and final >= member.max_reward - 1e-9)
        score = float(final if graded and final is not None else reward)
        report = {"member": name, "level": level, "task_id": self._task_id, "reward": score,
                  "success": success, "outcome": outcome}
        with _curriculum_lock:  # (shared by the envs of a trainer's rollout threads: share_curriculum)
            self.curriculum.record(name, level, self._task_id, score, success, outcome)
        info["difficulty"] = level
        info["mix_episode"] = report

    def render(self):
        return self._current.core.render() if self._current else None

    def close(self):
        """Close every built member; one whose close raises is logged by name (as adapters log an
        env's failed close) and the others are still closed."""
        for member in self._built.values():
            self._close_member(member)
        self._built.clear()
        self._current = None
        self._episode_step = self._no_episode
        super().close()

    @staticmethod
    def _close_member(member: _Member) -> None:
        try:
            member.env.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("closing mixture member %r raised %s: %s (its resources may leak)", member.key,
                        type(exc).__name__, exc)

    # -- records, solvers ---------------------------------------------------------------------------

    def episode_record(self) -> dict[str, Any]:
        """The member's record, with ``member``, ``difficulty``, the namespaced ``task_id`` and components."""
        if self._current is None:
            return {}
        record = self._current.core.episode_record()
        if record:
            record["task_id"] = self._task_id
            record["member"], record["difficulty"] = self._current.name, self._current.level
            record["reward_components"] = {f"{self._current.name}/{k}": v
                                           for k, v in record.get("reward_components", {}).items()}
        return record

    def reference_solver(self):
        """Each member's own reference solver, for the member playing."""
        def policy(obs: str, info: dict[str, Any]) -> str:
            member = self._current
            if member.solver is None:
                member.solver = member.core.reference_solver()
            return member.solver(obs, info)

        return policy

    # -- state --------------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The sampler's position and phase, the RNGs, counts and curriculum: :meth:`set_state`
        on a fresh mixture (same arguments) continues the same sequence of members and tasks."""
        rngs = dict(self._pending_rng)
        rngs.update({m.key: m.core.np_random.bit_generator.state for m in self._built.values()
                     if m.key in self._seeded or m.core._np_random is not None})
        return {"position": self._sampler.position, "offset": self._sampler.offset,
                "rng": self.np_random.bit_generator.state, "seed": self._seed, "seeded": sorted(self._seeded),
                "counts": dict(self.counts), "member_rngs": rngs, "curriculum": self.curriculum.state_dict()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._sampler.position = int(state["position"])
        self._sampler.offset = None if state["offset"] is None else float(state["offset"])
        self.np_random.bit_generator.state = state["rng"]
        self._seed, self._seeded = state["seed"], set(state["seeded"])
        self.counts.update(state["counts"])
        self._pending_rng = dict(state["member_rngs"])
        for member in self._built.values():
            rng_state = self._pending_rng.pop(member.key, None)
            if rng_state is not None:
                member.core.np_random.bit_generator.state = rng_state
        self.curriculum.load_state_dict(state["curriculum"])

    @property
    def sampler_state(self) -> dict[str, Any]:
        """:meth:`get_state` as an attribute (``envs.get_attr("sampler_state")`` / ``set_attr``)."""
        return self.get_state()

    @sampler_state.setter
    def sampler_state(self, state: Mapping[str, Any]) -> None:
        self.set_state(state)

    def set_curriculum_levels(self, levels: Mapping[str, int]) -> None:
        """Follow levels decided elsewhere (a vector env's parent, whose controller sees every worker)."""
        self.curriculum.set_levels(levels)


_curriculum_lock = threading.Lock()
_shared_curricula: dict[str, Curriculum] = {}


def share_curriculum(env: gym.Env, env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> None:
    """Make a mixture env whose curriculum has levels follow this process's one controller for
    ``env_id`` and ``env_kwargs`` (the first such env's), fed by every such env's episodes. For
    trainer adapters, which make an env per trajectory or per rollout slot: each with its own
    controller, levels never moved or drifted apart. Any other env is left as it is."""
    base = getattr(env, "unwrapped", env)
    if not isinstance(base, MixEnv) or all(len(m.levels) == 1 for m in base.curriculum.members.values()):
        return
    key = f"{env_id}\x00{json.dumps(dict(env_kwargs or {}), sort_keys=True, default=repr)}"
    with _curriculum_lock:
        base.curriculum = _shared_curricula.setdefault(key, base.curriculum)


def register_mix(env_id: str, members: Any, description: str = "", **kwargs: Any) -> str:
    """Register a named mixture, ``gym.make(env_id)`` being ``benchmax/Mix-v0`` with these
    ``members`` and options (checked now as make checks them, its members made and closed: a bad
    one fails here). For the CLI
    and eval by id, or to keep a training mixture under one name. Returns the id. Example::

        register_mix("me/Train-v0", [("benchmax/Math-v0", 0.7), ("benchmax/Wikipedia-v0", 0.3)], curriculum=True)
        envs = gym.make_vec("me/Train-v0", num_envs=64)
    """
    from benchmax_gym.registry import _check_not_builtin, register_parts

    if not isinstance(env_id, str) or "-v" not in env_id:
        raise ValueError(f"env_id must look like 'namespace/Name-v0', got {env_id!r}")
    _check_not_builtin(env_id)  # (before its members are made)
    MixEnv(members, **kwargs).close()  # every check of make, now
    names = ", ".join(s.name for s in parse_members(members))
    return register_parts(env_id, MixEnv, description or f"A mixture of {names}.", members=members, **kwargs)


__all__ = ["DEFAULT_MEMBERS", "MemberSpec", "MixEnv", "MixSampler", "MixTasks", "parse_members", "register_mix",
           "share_curriculum"]
