"""The benchmax contract, and one adapter from it to a Gymnasium environment.

Code written for benchmax (``list_tools``, ``run_tool``, ``compute_reward``, ``init_rollout``,
``release_rollout``, a ``system_prompt`` class attribute) runs here unchanged:
:class:`BenchmaxEnv` drives such a class over a list of dataset rows with the engine's parsing,
limits and info, and :func:`register_benchmax_env` registers it under a Gymnasium id.

``compute_reward`` comes in two published forms and both work:

* ``compute_reward(rollout_id, messages, task, **kw)`` - the transcript and the dataset row;
* ``compute_reward(rollout_id, completion, ground_truth, **kw)`` - the older form: the assistant
  text and ``row["ground_truth"]`` (other row fields arrive as keyword arguments: those it names,
  or all but the prompt's with ``**kwargs``; never one its first three parameters fill, and one
  it requires that a row lacks fails ``gym.make``); where
  ``completion`` is annotated as a list (the package's ``Completion = List[Dict]`` since 2026-03,
  whose reward functions read ``completion[-1]["content"]``), the transcript from the model's first
  reply on (:func:`completion_messages`).

Rows are ``{"prompt": str, "ground_truth": ...}`` or ``{"messages": [...], ...}`` (or a ``prompt``
that is a list of messages, as the package's ``StandardizedExample`` allows), optionally with
``init_rollout_args`` passed to ``init_rollout``. An environment's ``dataset_preprocess(row)`` (the
real package's hook that turns a raw dataset row into that shape) is applied to every row first;
an empty ``prompt`` (what the package's default hook gives a row without one) is none: the row's
``messages`` are the task, and a row with neither fails ``gym.make``, naming the hook.

The environment's own failures name its class and method (:class:`BenchmaxEnvError`,
``MyEnv.init_rollout raised KeyError: ...``): ``list_tools`` raising or returning what is not a
list of tools fails ``gym.make``; ``init_rollout`` raising fails the reset (a vector env's
``env_error``, its ``outcome_detail``); ``compute_reward`` raising or returning what is not a
dict or a number scores 0 with that error in ``info["reward_errors"]``, as any reward
function that raises. ``run_tool``'s exceptions are the model's tool errors, as any tool's.

Classes of the real ``benchmax`` package (``benchmax.envs.base_env.BaseEnv``) are accepted as they
are, as is any class with async ``list_tools``, ``run_tool`` and ``compute_reward``. What differs:

* ``init_rollout(rollout_id, **init_rollout_args)`` (async, or sync as in the package's
  ``LocalMCPEnv``) opens each episode; the environment's own
  workspace hooks (``copy_to_workspace``/``copy_from_workspace``) are its business, called from
  its ``init_rollout`` and ``compute_reward`` as in benchmax.
* The episode is closed with ``release_rollout(rollout_id)``, or the package's
  ``cleanup_rollout(rollout_id)`` where that is what the class has (sync or async): once, at the
  next reset or ``close()``, or as soon as the episode ends by a failure that is not the model's
  (an ``env_error``, a tool's ``tool_timeout``, the ``deadline``): a failed rollout is never
  graded nor passed to ``compute_group_reward``, so nothing reads it after. A finished (graded)
  rollout is kept until the next reset, as the engine keeps a scored episode's resources.
* ``compute_reward``'s dict is one rubric component, ``benchmax``: each entry is reported in
  ``info["reward_components"]`` and the reward is their mean (the entries share the component's
  weight, :mod:`core.rubric`), not their sum.
* ``shutdown()`` (sync, as ``LocalMCPEnv``'s, or async) is called when the env closes, or when
  building it fails, for a class this env instantiated; an instance passed in is its owner's.
* ``compute_group_reward`` (the package's since 0.1.2.dev16, 2026-03) is honoured where a group is
  held: the env's ``group_rubric`` (:mod:`benchmax_gym.core.group`) calls it on the k finished
  rollouts of one task (a vector env's group, eval's ``k`` samples, a trainer adapter's group), and
  its dicts are merged with each rollout's ``compute_reward`` components (added to the reward).
  The arguments go by parameter name (:func:`group_reward_arguments`): the shipped
  ``(rollout_ids, completions, ground_truths, **kwargs)`` gets the same completion as
  ``compute_reward`` (the assistant text for the older form, else the transcript) and each other
  row field as a per-rollout list in ``kwargs``; a form naming ``messages_list``, ``tasks`` or
  ``termination_reasons`` gets the transcripts, the rows or the outcomes (``scored``/``truncated``).
  Failed rollouts are never passed. It is bounded as ``compute_reward`` is: ``gym.make``'s
  ``reward_timeout`` (else the rubric's 60 s), past which it scores 0 with a ``reward_timeout`` error.
* Tool calls are parsed by the engine's formats (hermes by default, as benchmax's prompt asks),
  and ``system_prompt`` gets the engine's tool listing rather than ``get_system_prompt(True)``'s.

Example::

    class Echo(BaseEnv):
        system_prompt = "Answer inside <answer></answer> tags."

        async def list_tools(self):
            return []

        async def run_tool(self, rollout_id, tool_name, **tool_args):
            raise ValueError("no tools")

        async def compute_reward(self, rollout_id, completion, ground_truth, **kw):
            m = re.search(r"<answer>(.*?)</answer>", completion, re.S)
            return {"match": float(bool(m) and m.group(1).strip().lower() == ground_truth.lower())}

    register_benchmax_env("me/Echo-v0", Echo, [{"prompt": "Say hi", "ground_truth": "hi"}])
"""

from __future__ import annotations

import functools
import inspect
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmax_gym.core.env import Episode, ToolEnv, _Teardown
from benchmax_gym.core.group import GroupFn, GroupRubric, completion_of
from benchmax_gym.core.outcomes import RewardFailure
from benchmax_gym.core.rubric import RewardFn, Rubric
from benchmax_gym.core.tasks import ListTasks, Task
from benchmax_gym.core.tools import Tool, Toolset

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]
_ROW_PROMPT_KEYS = ("prompt", "messages", "prompt_messages", "ground_truth", "init_rollout_args")


@dataclass
class ToolDefinition:
    """A tool's interface as benchmax declares it: name, description, JSON-schema input."""

    name: str
    description: str
    input_schema: dict[str, Any] | None = None


class BaseEnv(ABC):
    """The benchmax environment contract (tools by rollout id, a reward per rollout)."""

    system_prompt: str = ""

    def __init__(self, **kwargs: Any):
        pass

    @abstractmethod
    async def list_tools(self) -> list[ToolDefinition]:
        """The tools this environment offers."""

    @abstractmethod
    async def run_tool(self, rollout_id: str, tool_name: str, **tool_args: Any) -> Any:
        """Run one tool for one rollout."""

    @abstractmethod
    async def compute_reward(self, rollout_id: str, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Score a rollout: ``(rollout_id, messages, task)`` or ``(rollout_id, completion, ground_truth)``."""

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Open per-rollout resources."""

    async def release_rollout(self, rollout_id: str) -> None:
        """Free per-rollout resources."""

    async def shutdown(self) -> None:
        """Free everything."""

    async def get_system_prompt(self, add_tool_defs: bool = False) -> str:
        return self.system_prompt

    def dataset_preprocess(self, example: Any) -> dict[str, Any]:
        """A raw dataset row -> ``{"prompt", "ground_truth", "init_rollout_args", ...}``."""
        return dict(example)


_CONTRACT = ("list_tools", "run_tool", "compute_reward")


class BenchmaxEnvError(RuntimeError):
    """A benchmax environment's own method raised, or returned what its contract does not allow;
    the message names the class and the method (``MyEnv.init_rollout raised KeyError: ...``), as
    ``reset``'s error, a vector env's ``outcome_detail`` or a reward's ``reward_errors`` show it."""


def _named(env: Any, method: str, exc: BaseException) -> BenchmaxEnvError:
    """``exc`` from ``env``'s ``method``, as an error that names them (raise it ``from exc``)."""
    return BenchmaxEnvError(f"{type(env).__name__}.{method} raised {type(exc).__name__}: {exc}")


def _tool_definitions(env: Any, definitions: Any) -> list[tuple[str, str, Any]]:
    """``list_tools``' result as ``(name, description, input_schema)``: the package's
    ``ToolDefinition`` (or ours), an MCP ``Tool``, or a dict with those keys (``input_schema``, or
    ``inputSchema`` as MCP's JSON has it: an env listing an MCP server's tools may return
    either); anything else is an error naming the method."""
    where = f"{type(env).__name__}.list_tools"
    if isinstance(definitions, (str, bytes, Mapping)) or not isinstance(definitions, Sequence):
        raise BenchmaxEnvError(f"{where} returned {type(definitions).__name__}, not a list of ToolDefinition")
    out = []
    for i, d in enumerate(definitions):
        get = d.get if isinstance(d, Mapping) else functools.partial(getattr, d)
        name = get("name", None)
        if not isinstance(name, str) or not name:
            raise BenchmaxEnvError(f"{where} returned {type(d).__name__} at [{i}], not a ToolDefinition "
                                   f"(name, description, input_schema): {d!r:.120}")
        schema = get("input_schema", None)
        if schema is None:
            schema = get("inputSchema", None)
        out.append((name, get("description", None) or "", schema))
    return out


def _keeps_the_contract(obj: Any) -> bool:
    """A benchmax environment, ours or the real package's: async tools and reward by rollout id."""
    return all(inspect.iscoroutinefunction(getattr(obj, name, None)) for name in _CONTRACT)


def extract_completion_text(messages: str | Sequence[Mapping[str, Any]]) -> str:
    """The assistant's text in a transcript (a str passes through), joined by newlines.

    A reward helper: ``compute_reward`` implementations use it to find the model's answer.
    """
    if isinstance(messages, str):
        return messages
    parts = []
    for m in messages or ():
        if isinstance(m, Mapping) and m.get("role") == "assistant":
            content = m.get("content")
            if isinstance(content, str) and content.strip():
                parts.append(content)
    return "\n".join(parts)


def _parameters(fn: Any) -> Mapping[str, inspect.Parameter]:
    """The parameters ``fn`` is called with. A method wrapped on its instance with
    ``functools.wraps`` (the package's ``enable_tracking()`` does so to ``compute_reward`` and
    ``compute_group_reward``) shows its class function's signature, ``self`` first: not one."""
    params = dict(inspect.signature(fn).parameters)
    if not inspect.ismethod(fn) and hasattr(fn, "__wrapped__") and next(iter(params), None) == "self":
        del params["self"]
    return params


def _uses_legacy_reward(benchmax_env: BaseEnv) -> bool:
    params = _parameters(benchmax_env.compute_reward)
    return "ground_truth" in params or "completion" in params


def _completion_is_messages(fn: Any) -> bool:
    """Whether ``fn``'s ``completion`` is annotated as a list of messages: the package's
    ``Completion`` has been ``List[Dict]`` since 2026-03 (its reward functions read
    ``completion[-1]["content"]``); before, it was ``str`` (the assistant's text), as an
    unannotated one is taken to be."""
    import typing

    fn = getattr(fn, "__wrapped__", fn)
    try:
        annotation = typing.get_type_hints(fn).get("completion")
    except Exception:  # noqa: BLE001  (a hint its module cannot resolve: read it as written)
        annotation = getattr(_parameters(fn).get("completion"), "annotation", None)
        if isinstance(annotation, str):
            return annotation.replace("typing.", "").startswith(("List[", "list[", "Completion", "Sequence["))
    origin = typing.get_origin(annotation)
    return annotation is list or (isinstance(origin, type) and issubclass(origin, (list, Sequence))
                                  and not issubclass(origin, str))


def completion_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The part of a transcript the model's turns made (from its first reply on), as the
    package's list ``Completion``: its last item is the model's final reply."""
    start = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return [dict(m) for m in messages[start:]]


def _preprocessed(preprocess, row: Any, index: int, owner: str = "") -> dict[str, Any]:
    """``dataset_preprocess`` on a copy of the row (the package's default pops keys from it);
    ``owner``: the environment's class name, for the errors."""
    where = f"{owner}.dataset_preprocess" if owner else "dataset_preprocess"
    try:
        out = preprocess(dict(row) if isinstance(row, Mapping) else row)
    except Exception as exc:
        raise ValueError(f"{where} failed on rows[{index}]: {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, Mapping):
        raise ValueError(f"{where} must return a dict, got {type(out).__name__} for rows[{index}]")
    out = dict(out)
    out["init_rollout_args"] = out.get("init_rollout_args") or {}  # the package's default gives ""
    return out


def _row_messages(row: Mapping[str, Any]) -> Any:
    """A row's opening conversation: its ``messages`` (``prompt_messages``), or a ``prompt`` that
    is a list of messages (the package's ``StandardizedExample``, and the rows its SkyRL data
    script writes: ``[system, user]``)."""
    prompt = row.get("prompt")
    return prompt if isinstance(prompt, list) else row.get("messages", row.get("prompt_messages"))


def _text_prompt(row: Mapping[str, Any]) -> str | None:
    """A row's ``prompt`` when it is text. An empty one is none: the package's default
    ``dataset_preprocess`` gives ``""`` to a row without the key (a ``messages`` row, or a raw
    dataset row whose question is under another name)."""
    prompt = row.get("prompt")
    return prompt if isinstance(prompt, str) and prompt.strip() else None


def _row_to_task(row: Mapping[str, Any], index: int, owner: str | bool = False) -> Task:
    """``owner``: the class whose ``dataset_preprocess`` made the row, for the error."""
    if not isinstance(row, Mapping):
        raise ValueError(f"rows[{index}] must be a dict, got {type(row).__name__}")
    messages = _row_messages(row)
    if _text_prompt(row) is not None:
        prompt = row["prompt"]
    elif isinstance(messages, list) and messages:
        if not all(isinstance(m, Mapping) for m in messages):
            raise ValueError(f"rows[{index}]: its messages must be dicts with 'role' and 'content'")
        prompt = "\n\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
    else:
        made = (f" as {owner}.dataset_preprocess made it (a raw dataset's fields need a dataset_preprocess that "
                f"maps them to 'prompt', 'ground_truth' and 'init_rollout_args')" if owner else "")
        raise ValueError(f"rows[{index}] needs a 'prompt' (a non-empty string or a list of messages) or a 'messages' "
                         f"list; it has {sorted(row)}{made}")
    # The whole row is the rubric's data (it holds the ground truth); it is never shown.
    return Task(id=str(row.get("id", index)), prompt=prompt, answer=dict(row), metadata={"source": "benchmax"})


class BenchmaxEnv(ToolEnv):
    """A Gymnasium environment over a benchmax :class:`BaseEnv` and a list of rows.

    Args:
        benchmax_env: a BaseEnv subclass (instantiated here with ``env_kwargs``) or an instance.
        rows: dataset rows, see the module docstring.
        env_kwargs: constructor arguments when ``benchmax_env`` is a class.
        lenient_schemas: read ``list_tools``' non-standard schema types (``dict``, ``float``,
            ``tuple``, ``any``) as standard ones, with a warning (see ``Tool.from_schema``);
            by default a tool whose schema is invalid fails ``gym.make``, naming it.
        **engine_kwargs: the engine's options (``tool_format``, ``max_turns``, ...).
    """

    def __init__(
        self,
        benchmax_env: BaseEnv | type[BaseEnv],
        rows: Sequence[Mapping[str, Any]],
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        lenient_schemas: bool = False,
        **engine_kwargs: Any,
    ):
        self.lenient_schemas = bool(lenient_schemas)
        if not _keeps_the_contract(benchmax_env):
            raise TypeError("benchmax_env must be a benchmax BaseEnv subclass or instance (benchmax_gym's or "
                            "the benchmax package's), or have async list_tools, run_tool and compute_reward; "
                            f"got {benchmax_env!r}")
        if not rows:
            raise ValueError("rows must not be empty")
        # One this env instantiated is its own to shut down (at close, or when building fails);
        # an instance the caller passed may serve several envs: its owner shuts it down.
        self._owned = isinstance(benchmax_env, type)
        if self._owned:
            benchmax_env = benchmax_env(**dict(env_kwargs or {}))
        self.benchmax_env = benchmax_env
        try:
            self._build(benchmax_env, rows, engine_kwargs)
        except BaseException:  # a bad argument fails here: nothing it started may outlive the error
            self._shutdown()
            if "aio" in self.__dict__:
                self.aio.close()
            raise

    def _build(self, benchmax_env: Any, rows: Sequence[Mapping[str, Any]], engine_kwargs: dict[str, Any]) -> None:
        preprocess = getattr(benchmax_env, "dataset_preprocess", None)
        if preprocess is not None:
            rows = [_preprocessed(preprocess, row, i, type(benchmax_env).__name__) for i, row in enumerate(rows)]
        self._legacy_reward = _uses_legacy_reward(benchmax_env)
        self._completion_messages = self._legacy_reward and _completion_is_messages(benchmax_env.compute_reward)
        self._reward_params = _reward_parameters(benchmax_env, rows) if self._legacy_reward else None
        try:
            listed = self.aio.run(benchmax_env.list_tools())
        except Exception as exc:
            raise _named(benchmax_env, "list_tools", exc) from exc
        tools = [
            Tool.from_schema(
                name, description, schema, functools.partial(self._call_tool, name), wants_episode=False,
                wants_state=False, lenient=self.lenient_schemas,
            )
            for name, description, schema in _tool_definitions(benchmax_env, listed)
        ]
        super().__init__(
            tasks=ListTasks([_row_to_task(r, i, preprocess is not None and type(benchmax_env).__name__)
                             for i, r in enumerate(rows)]),
            toolset=Toolset(tools),
            rubric=Rubric([RewardFn("benchmax", self._reward)]),
            system_prompt=benchmax_env.system_prompt or "",
            **engine_kwargs,
        )
        group = getattr(benchmax_env, "compute_group_reward", None)
        if group is not None and inspect.iscoroutinefunction(group):
            group_reward_arguments(group, [])  # a signature it cannot be called with fails here
            # bounded as the env's rewards are: gym.make's reward_timeout, else the rubric's default
            self.group_rubric = GroupRubric([GroupFn("benchmax_group", self._group_reward)], timeout=self.rubric.timeout)

    def _shutdown(self) -> None:
        """Shut the benchmax env down (sync or async ``shutdown``) if it is this env's own, once."""
        if not self._owned:
            return
        self._owned = False
        try:
            shutdown = getattr(self.benchmax_env, "shutdown", None)
            done = shutdown() if shutdown is not None else None
            if inspect.isawaitable(done):
                self.aio.run(done)
        except Exception:
            log.exception("shutting down %r failed", self.benchmax_env)

    def close(self):
        self._end_episode()  # the rollout is released while its env still runs
        self._shutdown()
        super().close()

    async def _call_tool(self, tool_name: str, /, **args: Any) -> Any:
        """``run_tool`` with the model's arguments only: a benchmax tool may name one ``episode`` or
        ``tool_name``. The rollout is the running episode's (the call starts within its step)."""
        return await self.benchmax_env.run_tool(self.episode.rollout_id, tool_name, **args)

    async def _reward(self, task: Task, messages: Messages, episode: Episode) -> dict[str, float]:
        row = task.answer
        env = self.benchmax_env
        try:
            if self._legacy_reward:
                extra = _reward_keywords(row, *self._reward_params)
                completion = (completion_messages(messages) if self._completion_messages
                              else extract_completion_text(messages))
                out = await env.compute_reward(episode.rollout_id, completion, row.get("ground_truth"), **extra)
            else:
                out = await env.compute_reward(episode.rollout_id, messages, row)
        except RewardFailure:  # (it could not score: the episode fails, as the rubric's own leaves do)
            raise
        except Exception as exc:
            raise _named(env, "compute_reward", exc) from exc
        if not isinstance(out, (Mapping, int, float)):
            raise BenchmaxEnvError(f"{type(env).__name__}.compute_reward returned {type(out).__name__} "
                                   f"({out!r:.80}), not a dict of reward names to numbers")
        return out

    async def _group_reward(self, records: list[dict[str, Any]]) -> list[dict[str, float]]:
        """The benchmax env's ``compute_group_reward`` over one group's records."""
        rows = [self.tasks.get(r["task_index"]).answer for r in records]
        args, kwargs = group_reward_arguments(self.benchmax_env.compute_group_reward, records, rows,
                                              self._legacy_reward)
        # on the env's own loop, where its rollouts' resources live
        out = await self.aio.arun(self.benchmax_env.compute_group_reward(*args, **kwargs))
        return [dict(d or {}) for d in out]

    def task_messages(self, task: Task) -> Messages:
        row = task.answer
        messages = _row_messages(row)
        if _text_prompt(row) is not None or not isinstance(messages, list):
            return super().task_messages(task)
        messages = [dict(m) for m in messages]
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    async def aopen_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        """``init_rollout``, its release (:meth:`aclose_episode`) held on ``episode.resources``
        first: it runs once, on whichever path the episode leaves by - a failure that ends it
        (at once, as the engine releases a failed episode's resources), the next reset,
        ``close()``, garbage collection - as the engine's ``teardown`` does (a release that
        failed, or an ``init_rollout`` that raised, is logged)."""
        release = _rollout_release(self.benchmax_env)
        if release is not None:  # (the benchmax env, never this env: the episode's finalizer holds it)
            once = _Teardown(release, episode.rollout_id, self.aio)
            episode.state["_rollout_release"] = once
            episode.resources.callback(once)
        args = episode.task.answer.get("init_rollout_args") or {}
        try:
            done = self.benchmax_env.init_rollout(episode.rollout_id, **args)
            if inspect.isawaitable(done):  # (sync in the package's LocalMCPEnv, as its cleanup_rollout)
                await done
        except Exception as exc:  # reset raises it (a vector env: the episode's env_error), naming the method
            raise _named(self.benchmax_env, "init_rollout", exc) from exc

    async def aclose_episode(self, episode: Episode) -> None:
        """Release the episode's rollout (``release_rollout`` or ``cleanup_rollout``), unless a
        failure that ended the episode already has."""
        once = episode.state.get("_rollout_release")
        if once is not None:
            await once.arun()

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        self.aio.run(self.aopen_episode(episode, options))

    def close_episode(self, episode: Episode) -> None:
        self.aio.run(self.aclose_episode(episode))


def _reward_parameters(env: Any, rows: Sequence[Mapping[str, Any]]) -> tuple[frozenset, frozenset, bool]:
    """How the older ``compute_reward(rollout_id, completion, ground_truth, ...)`` takes a row's
    other fields: ``(taken, named, open)``: the names its three positional arguments fill, the
    other names it has, whether it has ``**kwargs``. A field it requires that a row lacks fails
    here, naming it: called each episode, it would have scored every one 0."""
    params = list(_parameters(env.compute_reward).values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:3]
    taken = frozenset(p.name for p in positional)
    named = frozenset(p.name for p in params
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in taken)
    for name in (p.name for p in params if p.name in named and p.default is p.empty):
        for i, row in enumerate(rows):
            if name not in row:
                raise TypeError(f"{type(env).__name__}.compute_reward asks for {name!r}, a field rows[{i}] does not "
                                f"have (it has {sorted(row)}); benchmax_gym passes (rollout_id, completion, "
                                f"ground_truth) and each other field of the row by name")
    return taken, named, any(p.kind is p.VAR_KEYWORD for p in params)


def _reward_keywords(row: Mapping[str, Any], taken: frozenset, named: frozenset, open_: bool) -> dict[str, Any]:
    """A row's fields for the older ``compute_reward``'s keywords: those it names, and with
    ``**kwargs`` every other one but the prompt's; never one its positional arguments already fill
    (a row's ``id`` to a method without ``**kwargs``, or a field named ``completion``, was a
    TypeError that scored every episode 0)."""
    return {k: v for k, v in row.items()
            if k not in taken and (k in named or (open_ and k not in _ROW_PROMPT_KEYS))}


def _rollout_release(env: Any) -> Any:
    """``env``'s ``release_rollout``, or the package's ``cleanup_rollout`` where that is what it
    has (also on a subclass of ours, whose base has a no-op ``release_rollout``); None: neither."""
    release = getattr(env, "release_rollout", None)
    if getattr(type(env), "release_rollout", None) in (None, BaseEnv.release_rollout):
        release = getattr(env, "cleanup_rollout", None) or release
    return release


_GROUP_POSITIONAL = {
    "rollout_ids": lambda g: g["ids"], "completions": lambda g: g["completions"],
    "ground_truths": lambda g: g["truths"], "messages_list": lambda g: g["messages"],
    "messages": lambda g: g["messages"], "tasks": lambda g: g["rows"], "rows": lambda g: g["rows"],
    "termination_reasons": lambda g: g["outcomes"], "outcomes": lambda g: g["outcomes"],
}


def group_reward_arguments(fn: Any, records: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]] = (),
                           legacy: bool = True) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` for a benchmax ``compute_group_reward`` over ``records`` (one group's
    finished rollouts) and their dataset ``rows``, by the method's parameter names; a parameter
    it needs that none of the forms names is a TypeError (raised when the env is built)."""
    group = {
        "ids": [str(r.get("rollout_id") or f"{r.get('task_id')}-{i}") for i, r in enumerate(records)],
        "messages": [list(r.get("messages") or []) for r in records],
        "truths": [row.get("ground_truth") for row in rows],
        "rows": [dict(row) for row in rows],
        "outcomes": [r.get("outcome") for r in records],
    }
    group["completions"] = ([extract_completion_text(m) or completion_of(r) for m, r in zip(group["messages"], records)]
                            if legacy else group["messages"])
    args, kwargs, named = [], {}, set()
    params = _parameters(fn)
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in _GROUP_POSITIONAL:
            value = _GROUP_POSITIONAL[name](group)
            (args.append(value) if p.kind is p.POSITIONAL_ONLY else kwargs.__setitem__(name, value))
            named.add(name)
        elif p.default is p.empty:
            raise TypeError(f"compute_group_reward asks for {name!r}; benchmax_gym passes "
                            f"{sorted(_GROUP_POSITIONAL)} and the rows' other fields as keyword lists")
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        extra = sorted({k for row in rows for k in row} - set(_ROW_PROMPT_KEYS) - named)
        kwargs.update({k: [row.get(k) for row in rows] for k in extra})
    return args, kwargs


def register_benchmax_env(
    env_id: str,
    benchmax_env: BaseEnv | type[BaseEnv],
    rows: Sequence[Mapping[str, Any]],
    *,
    description: str = "",
    **defaults: Any,
) -> str:
    """Register a benchmax environment class plus its rows as a Gymnasium id; returns the id."""
    from benchmax_gym.registry import register_parts

    name = getattr(benchmax_env, "__name__", type(benchmax_env).__name__)
    return register_parts(env_id, BenchmaxEnv, description or f"benchmax environment {name}", defaults,
                          benchmax_env=benchmax_env, rows=[dict(r) for r in rows])
