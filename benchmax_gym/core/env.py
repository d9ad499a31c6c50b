"""The one multi-turn engine: :class:`ToolEnv`.

::

    reset(seed, options) -> pick a Task (options["task_index"] or self.np_random)
                         -> open_episode(): the family's per-episode state; setup(task, episode):
                            the user's (tools and rewards receive it as ``state``; teardown(state)
                            runs once, when the episode is left)
                         -> obs = system prompt (+ tool schemas) and the task, as text
    step(action: str)    -> parse tool calls | final answer | parse error
                         -> run each call (timeout, output cap) -> obs = tool results, reward 0
                            (or the rubric's per-turn leaves' score: core.rubric)
    final answer         -> rubric scores the episode -> reward, terminated=True
                            (with a simulated user, ``user=``: the reply goes to the user, who answers
                            as a ``user`` message, or is done: then graded; see core.users)
    terminal tool        -> (a call to a ``terminal=True`` tool that ran without error) the same,
                            its result kept in obs; calls after it in the reply are not run
    turn limit           -> rubric scores the episode as it stands -> truncated=True
    a failure            -> (not the model's: a tool's backend gone, the deadline passed)
                            reward NaN, not graded, truncated=True

The step that ends an episode carries ``info["outcome"]`` (:mod:`core.outcomes`): ``scored``
after a final answer, ``truncated`` at the turn limit, or the failure. Steps mid-episode carry no
``outcome`` key (read it with ``info.get("outcome")``; a vector env's batched info then masks it
with ``_outcome``). A failure is truncation in Gymnasium's sense - the episode was cut off from
outside, not brought to an end by the model - and its resources are released at once.

A family (Math, Excel, ...) supplies only a TaskSource, a Toolset, a Rubric, a system prompt and,
when it needs per-episode state, an ``open_episode`` hook that registers what it opens on
``episode.resources`` (closed when the episode ends). Everything else -
parsing, limits, messages, info, seeding - lives here, once.

Bad model output never raises: an over-long action, unparsable call, unknown tool, bad argument,
tool exception or timeout becomes an observation saying what was wrong, with a stable code in
``info["error"]``, and the episode goes on. Bad configuration raises at construction (that is,
at ``gym.make``) with a message naming the argument.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import difflib
import functools
import gc
import inspect
import json
import logging
import marshal
import time
import os
import re
import typing
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from benchmax_gym.core.aio import OwnLoop
from benchmax_gym.core.formats import (PARSE_ERROR, Parsed, ToolCall, ToolCallFormat, dumps_arguments, get_format,
                                      split_reasoning, utf8_safe)
from benchmax_gym.core.rubric import Rubric, milestones
from benchmax_gym.core.checks import boolean, positive_int, positive_number, positive_up_to, seconds
from benchmax_gym.core.outcomes import (DEADLINE, SCORED, TOOL_TIMEOUT, TRUNCATED, RewardFailure, failed_reward,
                                        outcome_detail)
from benchmax_gym.core.sandbox import UNAVAILABLE, Sandbox, SandboxConfig, SandboxLease
from benchmax_gym.core.spaces import UnicodeText
from benchmax_gym.core.tasks import Task, TaskSource
from benchmax_gym.core.tools import FailedResult, ToolResult, Toolset, run_direct_text, truncate
from benchmax_gym.core.users import (UserFailure, UserReply, UserSeeds, UserUsage, addressed_to_user, ahear, as_user,
                                     hear)

log = logging.getLogger(__name__)
THINK_TAGS = ("<think>", "</think>")  # reasoning_tags' default
_CALL_IDS = [f"call_{turn}_0" for turn in range(256)]  # the fast step's call ids, made once

#: ``(observation, info)`` and ``(observation, reward, terminated, truncated, info)``
ResetResult = tuple[str, dict[str, Any]]
StepResult = tuple[str, float, bool, bool, dict[str, Any]]

ACTION_TOO_LONG = "action_too_long"
DENSE_WEIGHT = 0.2  # ``dense_rewards=True``: what a family's dense signal may pay in all, per episode
TOO_MANY_CALLS = "too_many_calls"
NOT_RUN = "not_run"  # a call after a terminal tool's, in the same reply


@dataclass
class Episode:
    """Everything about the running episode. Tools that take ``episode`` receive this.

    ``state`` belongs to the family (a workspace path, a database connection, a sandbox);
    ``resources`` closes what the episode opened (the sandbox, a family's workspace or
    connection) when it ends, last opened first.
    ``task`` holds the ground truth: tools may use it on the environment's side, but nothing
    of it may be returned to the model. ``setup_state`` is what the environment's ``setup``
    returned (tools and reward functions receive it as ``state``).
    """

    task: Task
    rollout_id: str
    index: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)  # the model's raw text, one per turn, reasoning kept
    turn: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    tool_errors: int = 0
    reward: float | None = None  # the final reward, once graded
    reward_components: dict[str, float] = field(default_factory=dict)
    outcome: str | None = None  # how it ended (core.outcomes), once it has
    user: Any = None  # in an env with a simulated user: its counters and turns (core.users.UserUsage)
    # per-turn rewards (core.rubric): what they paid in all, each step's components, the milestones paid
    turn_paid: float = 0.0
    turn_log: list[dict[str, float]] = field(default_factory=list)
    milestones: dict[str, set] = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() past which it ends with ``deadline`` (episode_timeout)
    resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    setup_state: Any = None

    def turn_totals(self) -> dict[str, float]:
        """Each per-turn leaf's score summed over the episode's steps."""
        totals: dict[str, float] = {}
        for components in self.turn_log:
            for name, value in components.items():
                totals[name] = totals.get(name, 0.0) + value
        return totals


def _chat_tool_call(call: dict[str, Any], style: str) -> dict[str, Any]:
    function = dict(call["function"])
    if style == "hf":
        try:
            function["arguments"] = json.loads(function["arguments"])
        except (TypeError, ValueError):
            pass  # not JSON: a template shows the string as it is
    return {**call, "function": function}


def known_arguments(cls: type) -> set[str]:
    """The keyword arguments ``cls`` takes: its own and those of the classes it passes the rest to."""
    return {name for klass in cls.__mro__ if "__init__" in vars(klass)
            for name, p in inspect.signature(vars(klass)["__init__"]).parameters.items()
            if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _config_fields(option: type) -> dict[str, tuple[str, ...]]:
    """The fields of ``option`` (a source config) that are themselves configs, with their fields
    (``{"difficulty": ("digits", ...)}``)."""
    try:
        hints = typing.get_type_hints(option)
    except Exception:  # (a name the annotations use that cannot be resolved here: no suggestions from it)
        return {}
    return {name: tuple(f.name for f in dataclasses.fields(hint)) for name, hint in hints.items()
            if isinstance(hint, type) and dataclasses.is_dataclass(hint)}


def unknown_arguments_message(cls: type, unknown: dict[str, Any], also: type | None = None) -> str:
    """``"MathEnv got an unexpected keyword argument 'task' (did you mean 'tasks'?)"``: the
    suggestions come from the arguments of ``cls`` and of the classes it passes the rest to, and
    from the fields of its typed choices (``task_args={'difficulty': ...}``). ``also``: a class
    that takes the arguments first and passes ``cls`` the rest (a vector env): it is the one named,
    and its arguments are suggested too."""
    known = known_arguments(cls) | (known_arguments(also) if also is not None else set())
    nested = {name: f"{args_name}={{{name!r}: ...}}" for args_name, options in getattr(cls, "choices", {}).items()
              for option in options for name in option.arg_names()}
    for args_name, options in getattr(cls, "choices", {}).items():  # a knob one level down: difficulty's digits
        for option in options:
            for name, inner in _config_fields(option).items():
                for knob in inner:
                    nested.setdefault(knob, f"{args_name}={{{name!r}: {{{knob!r}: ...}}}}")
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known | set(nested)), n=3)
        hints = [nested.get(c, repr(c)) for c in close]
        parts.append(f"{name!r}" + (f" (did you mean {' or '.join(hints)}?)" if hints else ""))
    noun = "argument" if len(parts) == 1 else "arguments"
    return f"{(also or cls).__name__} got an unexpected keyword {noun} {', '.join(parts)}"


#: a family's own argument that sets an engine argument (MCP-v0's reward= makes its rubric)
_OWN_INSTEAD = {"rubric": "reward", "toolset": "server"}
#: else what to pass instead of an engine argument a family sets itself, where there is something
_INSTEAD = {
    "rubric": "reweigh its components with reward_weights=, or register your own env with "
              "register_tool_env(..., rubric=...)",
    "toolset": "register your own env with register_tool_env(..., tools=...)",
    "system_prompt": "register your own env with register_tool_env(..., system_prompt=...) for other instructions",
}
_CLASH = re.compile(r"got multiple values for keyword argument '(\w+)'")


def _naming_clashes(init: Callable[..., None]) -> Callable[..., None]:
    """A subclass's ``__init__`` that names an engine argument the family sets itself and was
    given too (``gym.make("benchmax/Math-v0", system_prompt=...)``): Python's "ToolEnv.__init__()
    got multiple values for keyword argument", raised where one of the env's own methods calls
    ``super().__init__``, named neither the family nor why."""

    @functools.wraps(init)
    def __init__(self: ToolEnv, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError as exc:
            match, tb = _CLASH.search(str(exc)), exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            if not (match and match[1] in kwargs and match[1] in inspect.signature(ToolEnv.__init__).parameters
                    and tb is not None and tb.tb_frame.f_locals.get("self") is self):
                raise
            raise TypeError(set_itself_message(type(self), [match[1]])) from None

    return __init__


def set_itself_message(cls: type, names: list[str]) -> str:
    """``"MathEnv sets system_prompt itself, so gym.make does not take it: ..."``."""
    parts = []
    for name in names:
        own = _OWN_INSTEAD.get(name)
        hint = f"give its own {own}= instead" if own in known_arguments(cls) else _INSTEAD.get(name)
        parts.append(f"{cls.__name__} sets {name} itself, so gym.make does not take it" + (f" ({hint})" if hint else ""))
    return "; ".join(parts)


class ToolEnv(gym.Env[str, str]):
    """A multi-turn, tool-using text environment.

    Args:
        tasks: where tasks come from.
        toolset: the tools the model may call.
        rubric: scores the episode when it ends.
        system_prompt: the family's instructions; the tool-calling convention is appended.
        tool_format: ``hermes`` (default), ``json``, ``openai`` or ``xml``.
        max_turns: steps before the episode is truncated.
        max_action_chars: longer actions are refused (``action_too_long``) without being run.
        max_tool_output_chars: each tool result is cut to this with a visible marker.
        tool_timeout: seconds per tool call (``tool_timeout`` error when exceeded). A sync tool
            runs in a thread that is abandoned at its timeout; an async one is cancelled at its
            next ``await``: one that blocks the event loop (``time.sleep``, a CPU loop) cannot be
            stopped and holds the step until it returns, but whatever it then returns or raises
            is the ``tool_timeout``, never a result to grade. Give such work a sync tool or
            ``asyncio.to_thread``.
        episode_timeout: wall-clock seconds for the whole episode, all turns (None: no limit).
            A step that starts past it, or a tool call cut short by it (each call's timeout is
            bounded by the time left), ends the episode with outcome ``deadline``: reward NaN,
            ``truncated=True`` (Gymnasium's truncation: cut off by a limit outside the task),
            its resources released at once.
        max_calls_per_action: calls beyond this in one action are not run (``too_many_calls``).
        max_observation_chars: the observation space's length bound.
        tools_in_prompt: render tool schemas into the system prompt (turn off when a trainer's
            chat template renders ``info["tools"]`` itself).
        reward_weights: override rubric component weights, e.g. ``{"format": 0.1}`` (negative
            ones are penalties; some must stay positive: a maximum of 0 is refused).
        reward_timeout: seconds each reward function may take (``None``: unbounded); past it, it
            scores 0 with a ``reward_timeout`` error in ``info["reward_errors"]`` (the model's text
            must not hang its grader). Default ``"rubric"``: the rubric's own (60 s unless set).
        dense_rewards: add the family's dense signal (:meth:`dense_signal`), a per-turn component
            named ``dense``: each milestone pays once, the first step that reaches it, and the
            episode earns at most ``0.2`` in all (or the number given, which must be below the
            final reward's maximum) on top of the final reward. Off by default.
        info_timings: add ``info["timings"]`` (seconds spent parsing, in tools, grading, in all).
            Off by default: wall-clock figures differ run to run, so a step's info would no
            longer be a function of (seed, actions), which Gymnasium's env checker requires.
        sandbox: when tools run model-written code, how each episode's :class:`Sandbox` is made:
            its workspace at reset (``episode.state["sandbox"]``), deleted when the episode ends;
            its code runs through the process's shared server, started by the first call.
        render_mode: ``"ansi"`` (``render()`` returns the transcript) or ``"human"`` (prints it).
        reasoning_tags: the tags around a reasoning model's thinking, ``("<think>", "</think>")``
            by default. Tool calls and the final answer are read only outside them (a call or a
            ``\\boxed{}`` inside the thinking is not acted on); the raw reply, thinking
            included, is kept in ``episode.actions``. ``None``: the whole reply is read.
        setup: ``setup(task, episode) -> state``, sync or async, run at every reset (after
            ``open_episode``): per-episode state (a database copy, a workspace, a client) that
            tools and reward functions receive by naming a parameter ``state``
            (``episode.setup_state``). A subclass may define it as a method instead.
        teardown: ``teardown(state)``, sync or async: releases what ``setup`` made, exactly
            once, on whichever path the episode leaves by - the next reset, ``close()``, a
            failure that ends it, garbage collection of the env (through ``episode.resources``).
            It takes only the state, so that it can run after the env is gone; a subclass's
            ``teardown`` method gets ``self`` as a weak proxy for that reason. A vector worker
            killed outright runs nothing: keep files under ``tempfile.gettempdir()``, which the
            vector env deletes with the dead worker.
        user: a simulated user (:mod:`core.users`): a reply without a tool call is addressed to
            them and they answer (a ``user`` message) until they say they are done, which ends
            the episode graded; ``None`` (default): such a reply is the final answer.

    Example::

        env = gym.make("benchmax/Math-v0")
        obs, info = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>')
    """

    #: a family's typed choices, ``{"task_args": (GeneratedMath, GSM8K, ...)}``: their fields are
    #: suggested when an argument is misspelt
    choices: dict[str, tuple[Any, ...]] = {}

    #: ``setup(task, episode) -> state`` and ``teardown(state)`` (see the arguments); None: none
    setup: Any = None
    teardown: Any = None

    # render_fps only quiets Gymnasium's checker: a transcript has no frame rate (toy_text uses 4 too)
    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):  # (an engine argument the family sets itself, given too, is named)
            cls.__init__ = _naming_clashes(vars(cls)["__init__"])

    def __init__(
        self,
        *,
        tasks: TaskSource,
        toolset: Toolset,
        rubric: Rubric,
        system_prompt: str = "",
        tool_format: str | ToolCallFormat = "hermes",
        max_turns: int = 10,
        max_action_chars: int = 32_000,
        max_tool_output_chars: int = 8_000,
        tool_timeout: float = 10.0,
        episode_timeout: float | None = None,
        max_calls_per_action: int = 8,
        max_observation_chars: int = 1_000_000,
        tools_in_prompt: bool = True,
        reward_weights: dict[str, float] | None = None,
        reward_timeout: float | None | str = "rubric",
        dense_rewards: bool | float = False,
        info_timings: bool = False,
        sandbox: SandboxConfig | None = None,
        render_mode: str | None = None,
        reasoning_tags: tuple[str, str] | list[str] | None = THINK_TAGS,
        setup: Any = None,
        teardown: Any = None,
        user: Any = None,
        **unknown: Any,
    ):
        if unknown:
            raise TypeError(unknown_arguments_message(type(self), unknown))
        for hook, fn in (("setup", setup), ("teardown", teardown)):
            if fn is not None:
                if not callable(fn):
                    raise TypeError(f"{hook} must be a callable, got {fn!r}")
                setattr(self, hook, fn)  # an instance attribute: called as given, never bound
        if reasoning_tags is not None and not (
                isinstance(reasoning_tags, (tuple, list)) and len(reasoning_tags) == 2
                and all(isinstance(t, str) and t for t in reasoning_tags)):
            raise ValueError(f"reasoning_tags must be None or two non-empty strings (opening, closing), "
                             f"got {reasoning_tags!r}")
        self.reasoning_tags = None if reasoning_tags is None else tuple(reasoning_tags)
        self.user = as_user(user)
        self._user_seeds = UserSeeds()  # the simulator's seed per episode, from reset(seed=...)
        if not isinstance(tasks, TaskSource):
            raise TypeError(f"tasks must be a TaskSource, got {type(tasks).__name__}")
        if not isinstance(toolset, Toolset):
            raise TypeError(f"toolset must be a Toolset, got {type(toolset).__name__}")
        if not isinstance(rubric, Rubric):
            raise TypeError(f"rubric must be a Rubric, got {type(rubric).__name__}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.tasks = tasks
        self.format = get_format(tool_format)
        self.max_turns = positive_int("max_turns", max_turns)
        self.max_action_chars = positive_int("max_action_chars", max_action_chars)
        self.max_tool_output_chars = positive_int("max_tool_output_chars", max_tool_output_chars)
        self.tool_timeout = seconds("tool_timeout", tool_timeout)  # (at most what a thread can wait)
        self.episode_timeout = None if episode_timeout is None else positive_number("episode_timeout", episode_timeout)
        self.max_calls_per_action = positive_int("max_calls_per_action", max_calls_per_action)
        self.max_observation_chars = positive_int("max_observation_chars", max_observation_chars)
        if dense_rewards is not None and not isinstance(dense_rewards, (bool, int, float)):  # ([] or "" read as off)
            raise ValueError(f"dense_rewards must be True, False or a weight (a number), got {dense_rewards!r:.80}")
        if dense_rewards:  # (False, None, 0: off)
            rubric = self._with_dense(rubric, dense_rewards)
        if reward_weights is not None:
            if not isinstance(reward_weights, dict):
                raise TypeError(f"reward_weights must be a dict of component -> weight, got {reward_weights!r}")
            rubric = rubric.with_weights(reward_weights)
            if not rubric.max_reward > 0:  # (every episode, the solver's too, scored 0 or less: nothing to learn)
                raise ValueError(f"reward_weights leave the reward no positive maximum ({rubric.max_reward:g}): give "
                                 f"some component a positive weight; components are {rubric.names}, got "
                                 f"{reward_weights!r}")
        if reward_timeout != "rubric":
            rubric = rubric.with_timeout(reward_timeout)  # (a ValueError naming reward_timeout)
        if dense_rewards:  # (checked as weighed: reward_weights may change either side)
            dense = next(f for f in rubric.turn_funcs if f.name == "dense")
            if dense.weight >= rubric.max_reward:
                raise ValueError(f"dense_rewards must be below the final reward's maximum ({rubric.max_reward:g}, with "
                                 f"reward_weights), so that it never pays more than solving the task; got "
                                 f"{dense.weight:g}")
        self.rubric = rubric
        self.render_mode = render_mode
        self.info_timings = boolean("info_timings", info_timings)
        if sandbox is not None and not isinstance(sandbox, SandboxConfig):
            raise TypeError(f"sandbox must be a SandboxConfig, got {type(sandbox).__name__}")
        self.sandbox_config = sandbox
        self._sandbox_lease: SandboxLease | None = None
        #: the isolation level for model code (``info["sandbox"]``); None when no tool runs code
        self.sandbox_level = sandbox.level if sandbox else None

        self.observation_space = UnicodeText(self.max_observation_chars)
        self.action_space = UnicodeText(self.max_action_chars)
        self._family_prompt, self._tools_in_prompt = system_prompt, boolean("tools_in_prompt", tools_in_prompt)
        self.set_toolset(toolset)
        self.episode: Episode | None = None

    @functools.cached_property
    def aio(self) -> OwnLoop:
        """The environment's own event loop: async tools, rewards and resources (an MCP session)
        run on it, driven by the thread that calls ``reset``/``step`` (see :mod:`core.aio`)."""
        return OwnLoop()

    # -- what families may override -------------------------------------------------------------

    def set_toolset(self, toolset: Toolset) -> None:
        """Install the tools (and re-render the system prompt). Families whose tools are only
        known once a server is up (MCP-v0) call this again when they learn them."""
        self.toolset = toolset
        self.tool_schemas = toolset.schemas
        self._terminal = frozenset(t.name for t in toolset if t.terminal)
        self._tool_params = {t.name: t.parameters for t in toolset}
        self.system_prompt = self.build_system_prompt(self._family_prompt, self._tools_in_prompt)

    @property
    def needs_event_loop(self) -> bool:
        """Whether a tool or reward may wait on I/O (then a vector worker runs ``astep`` on its
        loop); False when a plain ``step`` is enough and cheaper. An env whose tools are not
        known yet (MCP-v0 before its first reset) says True."""
        return not (len(self.toolset) > 0 and not self.rubric.has_async
                    and all(t.inline and not t.is_async for t in self.toolset))

    def dense_signal(self):
        """The family's dense signal for ``dense_rewards=True``: a function that asks for context
        by name (``task``, ``state``, ``tool_calls``, ``tool_results``...) and returns ``(reached,
        total)``, the milestones a step reached and how many the episode has (see
        :func:`~benchmax_gym.core.rubric.milestones`); None when the family has none."""
        return None

    def _with_dense(self, rubric: Rubric, dense_rewards: Any) -> Rubric:
        find = self.dense_signal()
        if find is None:
            raise ValueError(f"dense_rewards: {type(self).__name__} has no dense signal of its own; give its rubric a "
                             "per-turn component instead (RewardFn(..., per_turn=True) or core.rubric.milestones)")
        weight = DENSE_WEIGHT if dense_rewards is True else positive_up_to(1e9)("dense_rewards", dense_rewards)
        return Rubric([*rubric.children, milestones("dense", find, weight, context=rubric.context)], rubric.context,
                      shaping=rubric.shaping)

    def reward_context(self, episode: Episode) -> dict[str, Any]:
        """Extra arguments reward functions may ask for by name (declared in ``Rubric(context=...)``)."""
        return {}

    def build_system_prompt(self, family_prompt: str, tools_in_prompt: bool) -> str:
        parts = [family_prompt.strip()] if family_prompt.strip() else []
        if tools_in_prompt and len(self.toolset):
            instructions = self.format.instructions(self.tool_schemas)
            parts.append(addressed_to_user(instructions) if getattr(self, "user", None) is not None else instructions)
        return "\n\n".join(parts)

    def task_prompt(self, task: Task) -> str:
        """The first user message for ``task``."""
        return task.prompt

    def task_messages(self, task: Task) -> list[dict[str, Any]]:
        """The messages that open an episode: the system prompt, the task's own conversation
        (``task.messages``; a system message in it is appended to the env's, which stays first
        since chat templates allow one, at the start), then :meth:`task_prompt` as a user message
        (left out when the conversation is there and it is empty)."""
        system, messages = self.system_prompt, []
        for m in task.messages:
            if m["role"] == "system":
                system = "\n\n".join(p for p in (system, m.get("content") or "") if p)
            else:
                messages.append(copy_json(dict(m)))
        prompt = self.task_prompt(task) if task.prompt or not task.messages else self.task_prompt(task).strip()
        if prompt or not task.messages:  # (a family's part of the prompt, Excel's workbook, stays)
            messages.append({"role": "user", "content": prompt})
        if system:
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        """Open per-episode state (a workspace, a DB copy) in ``episode.state``, registering how
        to release it on ``episode.resources`` (run on the next reset and on close())."""

    def close_episode(self, episode: Episode) -> None:
        """Release what cannot go on ``episode.resources`` (an adapter's async release)."""

    def final_info(self, episode: Episode) -> dict[str, Any]:
        """Extra ``info`` entries for the step that ends an episode (after grading)."""
        return {}

    def reference_solver(self):
        """A scripted policy ``(obs, info) -> action`` that reads the task's solution and must
        reach the maximum reward: it proves every task is solvable through the tools."""
        raise NotImplementedError(f"{type(self).__name__} has no reference solver")

    async def aopen_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        self.open_episode(episode, options)

    async def aclose_episode(self, episode: Episode) -> None:
        self.close_episode(episode)

    # -- Gymnasium API --------------------------------------------------------------------------

    def _seed(self, seed: int | None) -> None:
        """Gymnasium's ``reset(seed=...)``, its generator built when first read: seeding costs
        ~12 us, a tenth of a reset, and an episode given its ``task_index`` (every eval episode)
        never draws. Same generator, same ``np_random_seed``; a bad seed still fails here."""
        if type(seed) is int and seed >= 0:
            self.__dict__["_rng"], self.__dict__["_lazy_seed"] = None, seed
            self._np_random_seed = seed
        else:
            super().reset(seed=seed)
        self._user_seeds.reseed(seed)

    @property
    def _np_random(self) -> Any:  # (Gymnasium's attribute, read by its np_random and check_env)
        seed = self.__dict__.get("_lazy_seed")
        if seed is not None:
            from gymnasium.utils import seeding

            self.__dict__["_rng"], self._np_random_seed = seeding.np_random(seed)
            self.__dict__["_lazy_seed"] = None
        return self.__dict__.get("_rng")

    @_np_random.setter
    def _np_random(self, value: Any) -> None:
        self.__dict__["_rng"], self.__dict__["_lazy_seed"] = value, None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        self._seed(seed)
        index, task, options = self._choose_task(options)  # (a bad option fails before the running episode ends)
        self._end_episode()
        try:
            episode = self._new_episode(index, task)
            self.open_episode(episode, options)
            if self.setup is not None or self.teardown is not None:
                state = self.setup(episode.task, episode) if self.setup is not None else None
                self._keep_state(episode, self.aio.run(state) if inspect.isawaitable(state) else state)
            return self._first_observation(episode)
        except BaseException:  # no half-made episode to step (and grade): step() asks for a reset
            self._end_episode()
            raise

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """``reset`` as a coroutine, for workers that interleave many environments."""
        self._seed(seed)
        index, task, options = self._choose_task(options)
        await self._aend_episode()
        try:
            episode = self._new_episode(index, task)
            await self.aopen_episode(episode, options)
            if self.setup is not None or self.teardown is not None:
                state = self.setup(episode.task, episode) if self.setup is not None else None
                self._keep_state(episode, await state if inspect.isawaitable(state) else state)
            return self._first_observation(episode)
        except BaseException:
            await self._aend_episode()
            raise

    def step(self, action: str) -> StepResult:
        if type(action) is str and not self.info_timings:
            result = self._step_one_call(action)
            if result is not None:
                return result
        plan = self._plan_step(action)
        timed = self.info_timings
        t = time.perf_counter() if timed else 0.0
        if plan.episode.deadline is not None:
            self._run_before_deadline(plan)
        elif plan.to_run:
            run, results = self.toolset.run, plan.results
            for call in plan.to_run:
                results.append(run(call.name, call.arguments, episode=plan.episode, timeout=self.tool_timeout,
                                   max_chars=self.max_tool_output_chars, run_coroutine=self.aio.run))
                if results[-1].outcome:
                    break  # a failure ends the episode: the calls after it do not run
                if call.name in self._terminal and self._ended_by(plan, call):
                    break
        if timed:
            plan.tools_s = time.perf_counter() - t
        if plan.final and self.user is not None and not plan.failure and plan.ended_by is None:
            self._user_turn(plan, hear(self.user, plan.episode, self.aio.run))
        self._after_tools(plan)
        if self.rubric.per_turn and not plan.failure:
            try:
                plan.turn_score = self.rubric.score_turn_in(self._plan_turn_context(plan), self.aio.run)
            except RewardFailure as exc:
                self._reward_failed(plan, exc)
        if plan.grade:
            t = time.perf_counter() if timed else 0.0
            try:
                plan.score = self.rubric.score(run_coroutine=self.aio.run, **self._reward_context(plan))
            except RewardFailure as exc:
                self._reward_failed(plan, exc)
            if timed:
                plan.reward_s = time.perf_counter() - t
        return self._finish_step(plan)

    async def astep(self, action: str) -> StepResult:
        """``step`` as a coroutine: async tools are awaited, blocking ones run in threads."""
        plan = self._plan_step(action)
        timed = self.info_timings
        t = time.perf_counter() if timed else 0.0
        deadline = plan.episode.deadline
        if deadline is not None and time.monotonic() >= deadline:
            plan.failure = DEADLINE
        for call in () if plan.failure else plan.to_run:
            timeout = self.tool_timeout if deadline is None else self._time_left(plan, deadline)
            if timeout is None:
                break
            result = await self.toolset.arun(call.name, call.arguments, episode=plan.episode, timeout=timeout,
                                             max_chars=self.max_tool_output_chars)
            result = self._deadline_hit(result, timeout)
            plan.results.append(result)
            if result.outcome:
                break
            if call.name in self._terminal and self._ended_by(plan, call):
                break
        if timed:
            plan.tools_s = time.perf_counter() - t
        if plan.final and self.user is not None and not plan.failure and plan.ended_by is None:
            self._user_turn(plan, await ahear(self.user, plan.episode))
        self._after_tools(plan)
        if self.rubric.per_turn and not plan.failure:
            try:
                plan.turn_score = await self.rubric.ascore_turn(**self._plan_turn_context(plan))
            except RewardFailure as exc:
                self._reward_failed(plan, exc)
        if plan.grade:
            t = time.perf_counter() if timed else 0.0
            try:
                plan.score = await self.rubric.ascore(**self._reward_context(plan))
            except RewardFailure as exc:
                self._reward_failed(plan, exc)
            if timed:
                plan.reward_s = time.perf_counter() - t
        return self._finish_step(plan)

    def render(self):
        if self.episode is None:
            return None
        text = "\n\n".join(f"[{m['role']}]\n{m.get('content') or ''}" + (
            "".join(f"\n-> {c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", []))
        ) for m in self.episode.messages)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self):
        self._end_episode()
        if self._sandbox_lease is not None:
            self._sandbox_lease.release()
        self.toolset.close()
        if "aio" in self.__dict__:  # only envs that ran async work have a loop to close
            if self.user is not None:
                running = asyncio._get_running_loop()
                if running is not None and running is self.aio._loop:  # (from a task on it: a vector
                    _in_background(running, self.user.aclose())  # worker replacing a broken env)
                else:
                    try:
                        self.aio.run(self.user.aclose())  # (an LLM user's client on this loop)
                    except Exception:
                        log.exception("closing the user simulator failed")
            self.aio.close()
        super().close()

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The whole transcript of the current episode as OpenAI chat messages (the engine's
        own record: tool messages also carry the tool's ``name``). To send it to a model, use
        :meth:`chat_messages`."""
        return self.episode.messages if self.episode else []

    def chat_messages(self, style: str = "openai") -> list[dict[str, Any]]:
        """The conversation so far, ready for the model's next turn (fresh dicts, safe to extend).

        ``info["messages"]`` holds only one turn's messages; a chat API needs the whole
        conversation, the model's own turns included. Example::

            obs, info = env.reset(seed=0)
            while not done:
                reply = client.chat.completions.create(model=..., messages=env.unwrapped.chat_messages())
                obs, reward, terminated, truncated, info = env.step(reply.choices[0].message.content)

        ``style="openai"``: exactly the Chat Completions schema (OpenAI, vLLM, SGLang servers):
        tool-call ``arguments`` are JSON strings; tool results are ``{role, tool_call_id, content}``.
        ``style="hf"``: for ``tokenizer.apply_chat_template(messages, tools=info["tools"])``:
        ``arguments`` are dicts (templates such as Qwen2.5's apply ``tojson`` to them, so a
        string would be encoded twice) and tool results keep their ``name``.
        """
        if style not in ("openai", "hf"):
            raise ValueError(f"style must be 'openai' or 'hf', got {style!r}")
        out = []
        for message in self.messages:
            message = dict(message)
            if message["role"] == "tool" and style == "openai":
                message.pop("name", None)
            if message.get("tool_calls"):
                message["tool_calls"] = [_chat_tool_call(c, style) for c in message["tool_calls"]]
                if not message.get("content") and style == "openai":
                    message["content"] = None
            out.append(message)
        return out

    def episode_record(self) -> dict[str, Any]:
        """The current (or just finished) episode as a JSON-able record - what RecordEpisodes and
        eval write and trainer adapters read: the task's id and index, the transcript (:attr:`messages`),
        the model's raw text per turn, turns, tool errors, its ``outcome`` once it ended, and the
        reward and its components once the episode is graded (``None`` and ``{}`` before, and for a
        failed episode, which is never graded). Never the ground truth."""
        episode = self.episode
        if episode is None:
            return {}
        return {"task_id": episode.task.id, "task_index": episode.index, "messages": [dict(m) for m in episode.messages],
                "actions": list(episode.actions), "turns": episode.turn, "tool_errors": episode.tool_errors,
                "outcome": episode.outcome, "reward": episode.reward,
                "reward_components": dict(episode.reward_components),
                **({"user": episode.user.as_info()} if episode.user is not None else {})}

    def episode_task(self) -> Task | None:
        """The task of the current (or just finished) episode, None before the first reset: what
        :func:`~benchmax_gym.core.group.score_vector_group` reads from a worker process
        (``envs.call("episode_task")``), where the whole :class:`Episode` carried its transcript
        over the pipe and could not be sent at all when it held a lock or a connection."""
        return self.episode.task if self.episode is not None else None

    # -- internals ------------------------------------------------------------------------------

    def _choose_task(self, options: Any) -> tuple[int, Task, dict[str, Any]]:
        """``reset``'s task (``options["task_index"]``, else drawn) and its options, as a dict."""
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset(options=...) must be a dict or None, got {type(options).__name__}: {options!r:.80}")
        options = dict(options or {})
        index = options.get("task_index")
        if index is None:
            index = self.tasks.sample_index(self.np_random)
        return index, self.tasks[index], options

    def _new_episode(self, index: int, task: Task) -> Episode:
        self.episode = Episode(task=task, rollout_id=uuid.uuid4().hex, index=int(index))
        if self.episode_timeout is not None:
            self.episode.deadline = time.monotonic() + self.episode_timeout
        # An env dropped without close() (or an interpreter exiting) still releases what the
        # episode opened; after an explicit release this does nothing (ExitStack closes once).
        weakref.finalize(self.episode, _release_in, os.getpid(), self.episode.resources)
        cfg = self.sandbox_config
        if cfg is not None and cfg.level != UNAVAILABLE:
            if self._sandbox_lease is None:  # the shared server outlives this env's episodes, not the env
                self._sandbox_lease = SandboxLease(cfg.level, cfg.preload)
                weakref.finalize(self, _release_in, os.getpid(), self._sandbox_lease.release)
            # the episode's workspace only: its code runs when its first call comes
            box = Sandbox(mode=cfg.mode, limits=cfg.limits, preload=cfg.preload)
            self.episode.state["sandbox"] = self.episode.resources.enter_context(contextlib.closing(box))
        return self.episode

    def _first_observation(self, episode: Episode) -> ResetResult:
        messages = self.task_messages(episode.task)
        if self.user is not None:  # the opening user messages are the user's own words
            episode.user = UserUsage(turns={i for i, m in enumerate(messages, len(episode.messages))
                                                       if m.get("role") == "user"}, seed=self._user_seeds.next())
        episode.messages.extend(messages)
        text = (self._conversation_text(messages) if episode.task.messages
                else "\n\n".join(str(m.get("content") or "") for m in messages))
        obs = truncate(text, self.max_observation_chars)
        info = {
            "messages": messages,
            "tools": copy_json(self.tool_schemas),  # users may keep and modify it
            "task_id": episode.task.id,
            "task_index": episode.index,
            "task_set": self.tasks.content_hash(),  # the task set's identity (TaskSource.content_hash)
            "task_metadata": dict(episode.task.metadata),
            "turn": 0,
            "sandbox": self.sandbox_level,
        }
        return obs, info

    def _conversation_text(self, messages: list[dict[str, Any]]) -> str:
        """A task's opening conversation as text in the env's tool-call format: the assistant's
        calls as it would write them, tool results as the env shows them."""
        parts = []
        for m in messages:
            if m["role"] == "tool":
                parts.append(self.format.render_results([(m.get("tool_call_id", ""), m.get("name", ""),
                                                          str(m.get("content") or ""))]))
                continue
            text = str(m.get("content") or "")
            if m.get("tool_calls"):
                calls = []
                for c in m["tool_calls"]:
                    try:
                        arguments = json.loads(c["function"]["arguments"])
                    except (TypeError, ValueError):
                        arguments = c["function"]["arguments"]
                    calls.append((c["function"]["name"], arguments))
                text = "\n".join(p for p in (text, self.format.render_calls(calls)) if p)
            parts.append(text)
        return "\n\n".join(parts)

    def _end_episode(self) -> None:
        if self.episode is not None:
            episode, self.episode = self.episode, None
            try:
                self.close_episode(episode)
            except Exception:
                log.exception("close_episode failed for task %s", episode.task.id)
            self._release(episode)

    async def _aend_episode(self) -> None:
        if self.episode is not None:
            episode, self.episode = self.episode, None
            try:
                await self.aclose_episode(episode)
            except Exception:
                log.exception("close_episode failed for task %s", episode.task.id)
            once = episode.state.get("_teardown")
            if once is not None:  # an async teardown is awaited here, not run by the sync ExitStack
                try:
                    await once.arun()
                except Exception:
                    log.exception("teardown failed for task %s", episode.task.id)
            self._release(episode)

    @staticmethod
    def _release(episode: Episode) -> None:
        try:
            episode.resources.close()
        except Exception:
            log.exception("releasing the resources of task %s failed", episode.task.id)

    def _step_one_call(self, action: str) -> StepResult | None:
        """The common step in one frame: one call of a known tool, mid-episode, nothing to warn
        about. It returns what the general path (``_plan_step``, the toolset, ``_finish_step``)
        returns, without the plan, parse and result objects and their frames (a third of a
        calculator step). ``None``, with nothing changed, for any other step."""
        episode = self.episode
        if (episode is None or episode.done or len(action) > self.max_action_chars or episode.turn + 2 >= self.max_turns
                or episode.deadline is not None):
            return None  # (the general path raises, cuts, adds a note about the turn limit, or keeps the deadline)
        tags = self.reasoning_tags
        if tags:
            if tags is THINK_TAGS or tags == THINK_TAGS:
                if "think>" in action:  # (either tag, in one look; a stray "think>" takes the general path)
                    return None
            elif tags[1] in action or tags[0] in action:
                return None
        fmt = self.format
        one = fmt.one_call(action)
        if one is None:
            return None
        name, arguments, content, call_id = one
        tool = self.toolset.tools.get(name)
        if tool is None or tool.terminal:
            return None  # (a terminal tool may end the episode: the general path grades it)
        episode.turn = turn = episode.turn + 1
        episode.actions.append(action)
        if call_id is None:
            call_id = _CALL_IDS[turn] if turn < 256 else f"call_{turn}_0"
        messages = episode.messages
        function = {"name": name, "arguments": utf8_safe(dumps_arguments(arguments))}
        messages.append({"role": "assistant", "content": content,
                         "tool_calls": [{"id": call_id, "type": "function", "function": function}]})
        if tool.direct:  # a success is its text (no result object), a failure its ToolResult
            result = (tool.invoke or run_direct_text)(tool, arguments, self.tool_timeout, self.max_tool_output_chars)
        else:
            result = self.toolset.run(name, arguments, episode=episode, timeout=self.tool_timeout,
                                      max_chars=self.max_tool_output_chars, run_coroutine=self.aio.run)
        if type(result) is str:
            text, error = utf8_safe(result), None
        else:
            text, error = utf8_safe(result.content), result.error
            if error:
                episode.tool_errors += 1
                lost = _files_lost(episode)  # (a read of a workspace gone with its sandbox: not the model's error)
                if lost:
                    result = FailedResult(lost[1], lost[0])
            if result.outcome:  # not the model's failure: the episode ends as the general path ends it
                return self._finish_one_call(episode, ToolCall(call_id, name, arguments), result)
        tool_calls = [{"id": call_id, "name": name, "arguments": arguments}]
        if self.rubric.per_turn:  # (one attribute read a step for rubrics without per-turn leaves)
            try:  # (before the result joins the transcript, as in the general path)
                reward, components, errors = self.rubric.score_turn_in(self._turn_context(
                    episode, content, tool_calls, [text]), self.aio.run)
            except RewardFailure as exc:
                return self._finish_one_call(episode, ToolCall(call_id, name, arguments),
                                             result if error else ToolResult(text), exc)
        message = {"role": "tool", "tool_call_id": call_id, "name": name, "content": text}
        messages.append(message)
        obs = fmt.render_one(call_id, name, text)
        if len(obs) > self.max_observation_chars:
            obs = truncate(obs, self.max_observation_chars)
        info = {
            "messages": [message], "task_id": episode.task.id, "turn": turn,
            "tool_calls": tool_calls, "error": error, "errors": [error] if error else [],
        }
        if self.rubric.per_turn:
            episode.turn_log.append(components)  # (_pay_turn, inline: this is every step's cost)
            info["reward_components"] = components
            if errors:
                info["reward_errors"] = errors
            episode.turn_paid += reward
            return obs, reward, False, False, info
        return obs, 0.0, False, False, info

    def _finish_one_call(self, episode: Episode, call: ToolCall, result: ToolResult,
                         unscored: RewardFailure | None = None) -> StepResult:
        """The short step's rare endings, finished by the general path's ``_finish_step`` so that
        both end an episode alike: its call failed for a reason not the model's (``result``'s
        outcome), or a per-turn leaf could not score (``unscored``)."""
        plan = _StepPlan(episode, 0.0)
        plan.to_run, plan.results = [call], [result]
        if result.error:
            plan.errors.append(result.error)
        if unscored is not None:
            self._reward_failed(plan, unscored)
        else:
            plan.failure, plan.failure_detail, plan.truncated = result.outcome, result.content, True
        return self._finish_step(plan)

    @staticmethod
    def _ended_by(plan: "_StepPlan", call: Any) -> bool:
        """Whether ``call`` (of a terminal tool, just run) ended the episode: it did unless it
        failed (bad arguments, an exception), which leaves the episode going."""
        if plan.results[-1].error:
            return False
        plan.ended_by, plan.final = call.name, True
        plan.completion = plan.parsed.content if plan.parsed is not None else ""
        return True

    def _keep_state(self, episode: Episode, state: Any) -> None:
        """Hold ``setup``'s state on the episode, its ``teardown`` on ``episode.resources``."""
        episode.setup_state = state
        teardown = self.teardown
        if teardown is None:
            return
        if inspect.ismethod(teardown) and teardown.__self__ is self:
            # a method would keep the env alive from the episode's finalizer: self goes by proxy
            teardown = functools.partial(teardown.__func__, weakref.proxy(self))
        once = _Teardown(teardown, state, self.aio)
        episode.state["_teardown"] = once
        episode.resources.callback(once)

    @staticmethod
    def _user_turn(plan: "_StepPlan", heard: UserReply | UserFailure) -> None:
        """A reply without a tool call in an env with a simulated user: the user answers (the
        episode goes on), says they are done (it is graded, terminated), or fails (ungraded)."""
        plan.asked_user = True
        if isinstance(heard, UserFailure):
            log.warning("the user simulator failed in task %s: %s", plan.episode.task.id, heard)
            plan.failure, plan.final = heard.outcome, False
            plan.failure_detail = f"the simulated user could not answer: {heard}"
            plan.notes.append(f"The simulated user could not answer ({heard.outcome}): the episode is over.")
            return
        if heard.content:
            plan.user_message = {"role": "user", "content": heard.content}
        if not heard.done:
            plan.final = False

    def _turn_context(self, episode: Episode, completion: str | None, tool_calls: list, tool_results: list) -> dict:
        """What a per-turn leaf may ask for: the step's reply, calls and results, and the episode."""
        context = {"completion": completion, "answer": episode.task.answer, "task": episode.task,
                   "messages": episode.messages, "episode": episode, "state": episode.setup_state, "tool_calls": tool_calls,
                   "tool_results": tool_results, "turn": episode.turn}
        if self.rubric.context:  # (a call and a merge a step, only for envs that offer more)
            context.update(self.reward_context(episode))
        return context

    @staticmethod
    def _pay_turn(episode: Episode, score: tuple, info: dict[str, Any]) -> float:
        """Record a step's per-turn score (``info["reward_components"]``: this step's values); its reward."""
        reward, components, errors = score
        episode.turn_log.append(components)
        info["reward_components"] = components
        if errors:
            info["reward_errors"] = errors
        episode.turn_paid += reward
        return reward

    def _plan_turn_context(self, plan: "_StepPlan") -> dict:
        calls = plan.to_run + plan.skipped if plan.skipped else plan.to_run
        completion = plan.completion if plan.final else (plan.parsed.content if plan.parsed else None)
        return self._turn_context(plan.episode, completion,
                                  [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
                                  [r.content for r in plan.results])

    def _fail(self, episode: Episode, info: dict[str, Any], outcome: str, detail: str | None = None) -> float:
        """End ``episode`` with a failure that is not the model's: never graded (its record's
        reward stays ``None``), ``info["outcome"]`` set and ``info["outcome_detail"]`` saying why,
        what it opened released now (a dead sandbox, a deadline's workspace) rather than at the
        next reset. Returns the step's reward, NaN."""
        episode.done, episode.outcome = True, outcome
        info["outcome"] = outcome
        info["outcome_detail"] = outcome_detail(detail or f"the episode ended as {outcome}")
        info["reward_components"] = {}
        self._release(episode)
        return failed_reward()

    @staticmethod
    def _reward_failed(plan: "_StepPlan", exc: RewardFailure) -> None:
        """A reward component could not score (its judge down): the episode ends ungraded."""
        log.warning("reward failed for task %s: %s", plan.episode.task.id, exc)
        plan.failure, plan.grade, plan.final, plan.truncated = exc.outcome, False, False, True
        plan.failure_detail = f"a reward could not score: {exc}"
        plan.notes.append(f"The episode could not be graded ({exc.outcome}): it is over.")

    def _time_left(self, plan: "_StepPlan", deadline: float) -> float | None:
        """The next call's timeout: the tool timeout bounded by the time left before the episode's
        deadline; None (and the plan fails with ``deadline``) when none is left."""
        left = deadline - time.monotonic()
        if left <= 0:
            plan.failure = DEADLINE
            return None
        return min(self.tool_timeout, left)

    def _deadline_hit(self, result: ToolResult, timeout: float) -> ToolResult:
        """A call cut short by the deadline (its timeout was the time left) ends with ``deadline``."""
        if result.error == TOOL_TIMEOUT and timeout < self.tool_timeout:
            return FailedResult(result.content, DEADLINE)
        return result

    def _run_before_deadline(self, plan: "_StepPlan") -> None:
        """``step``'s calls in an episode with a deadline: none runs once it passed (a final answer
        after it is not graded either), each call's timeout is bounded by the time left."""
        deadline = plan.episode.deadline
        if time.monotonic() >= deadline:
            plan.failure = DEADLINE
            return
        for call in plan.to_run:
            timeout = self._time_left(plan, deadline)
            if timeout is None:
                return
            result = self.toolset.run(call.name, call.arguments, episode=plan.episode, timeout=timeout,
                                      max_chars=self.max_tool_output_chars, run_coroutine=self.aio.run)
            result = self._deadline_hit(result, timeout)
            plan.results.append(result)
            if result.outcome:
                return
            if call.name in self._terminal and self._ended_by(plan, call):
                return

    def _plan_step(self, action: Any) -> "_StepPlan":
        t0 = time.perf_counter() if self.info_timings else 0.0
        episode = self.episode
        if episode is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        if episode.done:
            raise gym.error.ResetNeeded("the episode has ended; call reset() before step()")
        if type(action) is not str:
            if isinstance(action, dict) and self.format.name == "openai":
                action = json.dumps(action)
            if not isinstance(action, str):
                raise TypeError(f"action must be a str (the model's reply), got {type(action).__name__}")
        episode.turn += 1
        episode.actions.append(action)
        plan = _StepPlan(episode, t0)
        if len(action) > self.max_action_chars:
            plan.errors.append(ACTION_TOO_LONG)
            episode.messages.append({"role": "assistant", "content": truncate(action, self.max_action_chars)})
            plan.notes.append(
                f"Error: your reply has {len(action)} characters; the limit is {self.max_action_chars}. "
                "Nothing in it was run."
            )
            if self.info_timings:
                plan.parse_s = time.perf_counter() - t0
            return plan
        tags = self.reasoning_tags
        visible = split_reasoning(action, tags)[1] if tags and (tags[1] in action or tags[0] in action) else action
        parsed: Parsed = self.format.parse(visible, episode.turn, self._tool_params)
        if self.info_timings:
            plan.parse_s = time.perf_counter() - t0
        plan.parsed = parsed
        calls, errors = parsed.calls, parsed.errors
        if not calls and not errors:  # a final answer
            plan.final = True
            plan.completion = parsed.content
            episode.messages.append({"role": "assistant", "content": parsed.content})
            return plan
        if len(calls) > self.max_calls_per_action:
            plan.to_run = calls[: self.max_calls_per_action]
            plan.skipped = calls[self.max_calls_per_action :]
        else:
            plan.to_run = calls
        # a reply that did not parse keeps its text (outside reasoning), so the next turn shows
        # the model what it wrote and the transcript loses nothing
        content = visible.strip() if errors else parsed.content
        if calls:
            episode.messages.append({"role": "assistant", "content": content, "tool_calls": [
                _shown_call(calls[0])] if len(calls) == 1 else [_shown_call(c) for c in calls]})
        else:
            episode.messages.append({"role": "assistant", "content": content})
        if errors:
            plan.errors.append(PARSE_ERROR)
            plan.notes.append(
                "Error: could not parse your tool call: " + "; ".join(errors) + ". "
                "Follow the calling convention from the system prompt."
            )
        return plan

    def _after_tools(self, plan: "_StepPlan") -> None:
        episode = plan.episode
        for r in plan.results:
            if r.error:
                plan.errors.append(r.error)
                episode.tool_errors += 1
                if r.outcome and not plan.failure:
                    plan.failure, plan.failure_detail = r.outcome, r.content
        if not plan.failure:
            lost = _files_lost(episode)
            if lost:
                plan.failure, plan.failure_detail = lost
        if plan.failure:  # the episode ends here, ungraded; calls not run get no result
            if plan.failure == DEADLINE:
                if DEADLINE not in plan.errors:
                    plan.errors.append(DEADLINE)
                plan.failure_detail = f"the episode's time limit ({self.episode_timeout:g} s) passed"
                plan.notes.append(f"The episode's time limit ({self.episode_timeout:g} s) has passed: the episode is over.")
            del plan.to_run[len(plan.results):]
            plan.skipped = ()
            plan.truncated, plan.final = True, False
            return
        if plan.ended_by is not None:  # a terminal tool ended the episode: the calls after it are not run
            plan.to_run += plan.skipped
            plan.skipped = ()
            unrun = len(plan.to_run) - len(plan.results)
            if unrun:
                plan.results += [ToolResult(f"Error: not run: '{plan.ended_by}' ended the episode.", NOT_RUN)] * unrun
                plan.errors.append(NOT_RUN)
                episode.tool_errors += unrun
        if plan.skipped:
            plan.results += [
                ToolResult(f"Error: not run: at most {self.max_calls_per_action} tool calls per reply.", TOO_MANY_CALLS)
                for _ in plan.skipped
            ]
            plan.errors.append(TOO_MANY_CALLS)
            episode.tool_errors += len(plan.skipped)
        if plan.final:
            plan.grade = True
        elif episode.turn >= self.max_turns - 1:
            if episode.turn >= self.max_turns:
                plan.truncated = plan.grade = True
                plan.notes.append(f"The turn limit ({self.max_turns}) is reached: the episode is over and is graded as it stands.")
            elif self.user is not None:
                plan.notes.append("This is your last turn: your next reply still runs its tool calls or reaches the "
                                  "user, but the episode then ends.")
            else:
                plan.notes.append("This is your last turn: tool calls in your next reply still run, but the episode "
                                  "then ends, so give your final answer in it.")

    def _reward_context(self, plan: "_StepPlan") -> dict[str, Any]:
        episode = plan.episode
        messages = episode.messages
        if plan.results:  # this step's results (a terminal tool's, the last turn's) are graded too
            messages = messages + [{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r.content}
                                   for c, r in zip(plan.to_run + list(plan.skipped), plan.results)]
        return {
            "completion": plan.completion,
            "answer": episode.task.answer,
            "task": episode.task,
            "messages": messages,
            "episode": episode,
            "state": episode.setup_state,
            "tool_calls": [],
            "tool_results": [],
            "turn": episode.turn,
            **self.reward_context(episode),
        }

    def _finish_step(self, plan: "_StepPlan") -> StepResult:
        episode = plan.episode
        calls = plan.to_run + plan.skipped if plan.skipped else plan.to_run
        new_messages, tool_calls, shown = [], [], []  # one loop: a comprehension costs a frame each
        for c, r in zip(calls, plan.results):
            name, content = utf8_safe(c.name), utf8_safe(r.content)
            new_messages.append({"role": "tool", "tool_call_id": c.id, "name": name, "content": content})
            tool_calls.append({"id": c.id, "name": c.name, "arguments": c.arguments})
            shown.append((c.id, name, content))
        said = plan.user_message
        if said is not None:  # the simulated user's words: before any note of the engine's
            episode.user.turns.add(len(episode.messages) + len(new_messages))
            new_messages.append(said)
        if plan.notes:
            notes = utf8_safe("\n".join(plan.notes))
            new_messages.append({"role": "user", "content": notes})
            obs = self.format.render_results(shown) + "\n" + notes if calls else notes
        else:
            obs = self.format.render_results(shown) if calls else ""
        if said is not None and not plan.final:
            obs = said["content"] + ("\n" + obs if obs else "")
        episode.messages += new_messages
        if len(obs) > self.max_observation_chars:
            obs = truncate(obs, self.max_observation_chars)
        info: dict[str, Any] = {
            "messages": new_messages,
            "task_id": episode.task.id,
            "turn": episode.turn,
            "tool_calls": tool_calls,
            "error": plan.errors[0] if plan.errors else None,
            "errors": plan.errors,
        }
        if self.user is not None and (plan.asked_user or plan.grade or plan.failure):
            info["user"] = episode.user.as_info()  # counts and cost, never its instructions
        reward = 0.0
        if plan.failure:
            reward = self._fail(episode, info, plan.failure, plan.failure_detail)
        elif plan.turn_score is not None:
            reward = self._pay_turn(episode, plan.turn_score, info)
        if plan.grade and not plan.failure:
            final, components, reward_errors = plan.score
            final = float(final)
            if plan.turn_score is not None:  # the final leaves and each per-turn leaf's episode total
                # (a name both passes wrote is numbered, as the rubric numbers names: never written over)
                components, reward_errors = self.rubric.with_turn_totals(
                    components, reward_errors, episode.turn_totals(), info.get("reward_errors", {}))
                # shaping: the return is the final reward (this step pays what the earlier ones did not)
                reward = final - (episode.turn_paid - reward) if self.rubric.shaping else final + reward
            else:
                reward = final
            info["reward_components"] = components
            episode.reward, episode.reward_components = final, dict(components)
            if reward_errors:
                info["reward_errors"] = reward_errors
            info.update(self.final_info(episode))
            episode.done = True
            episode.outcome = info["outcome"] = TRUNCATED if plan.truncated else SCORED
            if plan.final and plan.ended_by is None:  # (a terminal tool's result stays in sight)
                obs = ""
        if self.info_timings:
            info["timings"] = {
                "parse_s": plan.parse_s,
                "tools_s": plan.tools_s,
                "reward_s": plan.reward_s,
                "step_s": time.perf_counter() - plan.t0,
            }
        return obs, reward, plan.final, plan.truncated, info


def _files_lost(episode: Episode) -> tuple[str, str] | None:
    """``(outcome, why)`` when the episode's sandbox lost its files (:meth:`Sandbox.files_lost`):
    then no tool's or grader's failure to read them is the model's doing."""
    box = episode.state.get("sandbox")
    return box.files_lost() if type(box) is Sandbox else None


_BACKGROUND: set[asyncio.Task] = set()  # closes left running on a loop (kept from the garbage collector)


def _in_background(loop: asyncio.AbstractEventLoop, coro: Any) -> None:
    """Run ``coro`` as a task of ``loop``, which is running this very call: it cannot be waited
    for here (``close()`` called from a task on the env's own loop)."""
    task = loop.create_task(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _release_in(pid: int, release: contextlib.ExitStack | Any) -> None:
    """Close an episode's resources (or call ``release``), in the process that opened them only
    (a forked child inherits the finalizer, not the resources)."""
    if os.getpid() == pid:
        release.close() if isinstance(release, contextlib.ExitStack) else release()


class _Teardown:
    """An episode's ``teardown(state)``, run once, by whichever path gets there first: the
    episode's ExitStack (sync paths, garbage collection) or ``areset`` awaiting it.
    It holds the env's loop, never the env (the episode's finalizer holds this)."""

    __slots__ = ("fn", "state", "aio", "done")

    def __init__(self, fn: Any, state: Any, aio: OwnLoop):
        self.fn, self.state, self.aio, self.done = fn, state, aio, False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        result = self.fn(self.state)
        if inspect.isawaitable(result):
            running = asyncio._get_running_loop()
            if running is not None and running is self.aio._loop:  # on the env's own loop (a failure in astep)
                _in_background(running, result)
            else:
                self.aio.run(result)

    async def arun(self) -> None:
        if self.done:
            return
        self.done = True
        result = self.fn(self.state)
        if inspect.isawaitable(result):
            await result


class _StepPlan:
    """One step's working state, shared by ``step`` and ``astep``: a plain class whose scalars
    default on the class (a dataclass with list factories cost a microsecond a step)."""

    parsed: Parsed | None = None
    ended_by: str | None = None  # the terminal tool whose call ended the episode
    failure: str | None = None  # an outcome that is not the model's: the episode ends ungraded
    failure_detail: str | None = None  # why, in a line (info["outcome_detail"])
    user_message: dict[str, Any] | None = None  # what the simulated user said this step
    asked_user = False
    skipped: list | tuple = ()
    final = truncated = grade = False
    completion = ""
    score: Any = None
    turn_score: Any = None  # the per-turn leaves' (reward, components, errors) for this step
    parse_s = tools_s = reward_s = 0.0

    def __init__(self, episode: Episode, t0: float):
        self.episode, self.t0 = episode, t0
        self.to_run, self.results, self.errors, self.notes = [], [], [], []


def _shown_call(call: ToolCall) -> dict[str, Any]:
    """``call.to_openai()`` for the transcript, its name and arguments UTF-8-safe (:func:`utf8_safe`)."""
    message = call.to_openai()
    function = message["function"]
    if not (function["name"].isascii() and function["arguments"].isascii()):
        function["name"], function["arguments"] = utf8_safe(function["name"]), utf8_safe(function["arguments"])
    return message


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-like data (a tool schema): a ``marshal`` round trip, a quarter of
    ``copy.deepcopy``'s time (a third of a dataset env's reset went to copying its schemas);
    ``deepcopy`` for anything ``marshal`` will not take (a subclass, a custom object)."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return copy.deepcopy(value)


@contextlib.contextmanager
def fewer_collections(young: int = 20_000):
    """Collect the cyclic GC's young generation every ``young`` allocations instead of 700 while
    a process runs many episodes (restored after). Steps and model replies make thousands of
    short-lived containers, and transcripts grow: at the default, collections (the full ones
    walking every transcript most) took a quarter of a vector worker's time stepping 32
    calculator envs and a third of the eval loop's stalls at 64 episodes in flight."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], young), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
