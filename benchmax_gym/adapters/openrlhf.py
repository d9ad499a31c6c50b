"""OpenRLHF: any benchmax-gym env as an agent for ``--train.agent_func_path`` (``pip install 'benchmax-gym[openrlhf]'``).

OpenRLHF loads a Python file and instantiates its ``AgentExecutor`` class. Point it at a file
of two lines (``examples/openrlhf_agent.py``)::

    from benchmax_gym.adapters.openrlhf import make_executor
    AgentExecutor = make_executor("benchmax/Math-v0", max_turns=4)

or at this module itself, configured by ``BENCHMAX_ENV_ID`` and ``BENCHMAX_ENV_KWARGS`` (JSON).
Each prompt gets its own env. The row's ``label`` picks the task: a task index, or a JSON
object ``{"env_id": ..., "task_index": ..., "env_kwargs": {...}}`` (rows from :func:`task_rows`),
so one dataset may mix envs (``make_executor()`` without an env then takes every env from its rows).

The executor plays the episode with :class:`TokenSession` (the same engine as every adapter)
and returns what OpenRLHF's ``MultiTurnAgentExecutor`` returns, for its samples generator:
the model's ids as generated, env turns rendered by the chat template (special-token texts in
tool output stay text), and the budget rule: ``max_length`` (``--data.max_len``) bounds prompt
and response, each request asks for what is left (at least 1), env ids that would overflow end
the episode truncated and graded as it stands (OpenRLHF's own loop stops there ungraded);
``--rollout.max_new_tokens`` caps each turn. The env is built, reset and stepped in a thread; a
sample that ends, raises or is cancelled closes its env (after the env call running there returns).
A close that raises is logged as a leak: the sample keeps its result (or its own error).
``extra_logs`` holds the keys every env has (OpenRLHF merges a batch's logs by the first
sample's keys): ``reward``, ``turns``, ``tool_errors``, ``truncated`` and ``env/outcome/<name>``
(1.0 for the episode's outcome: a batch's sums are its outcome counts).

Group rewards (:mod:`benchmax_gym.core.group`): OpenRLHF's engine plays a prompt's
``n_samples_per_prompt`` samples together on one event loop, so with
``make_executor(..., group_size=N, group_rubric=...)`` (N = ``--rollout.n_samples_per_prompt``)
the samples wait for each other and are scored together before they return (a failed sample is
not a member; one that raises leaves the rest to go on; those still waiting for a member later
than ``group_timeout`` fail, NaN: their group cannot be scored whole). A group
its rubric fails (a function that raises, times out or gives no finite score) is failed samples:
their ``scores`` NaN, as below, never the 0 the function scored.

Per-turn rewards (a rubric's per-turn components, ``dense_rewards=True``; issue 30): OpenRLHF's own
multi-turn executor sums its steps' rewards into one ``reward`` per sample, and so does this one:
``reward`` and ``scores`` are the episode's return. ``turn_rewards`` (one per ``action_ranges``
entry, each turn's reward on its range) and ``extra_logs["turn_reward"]`` (what the turns before
the last paid) carry the per-turn part.

Failed episodes (issue 29: a tool gone, a worker lost, a deadline; an engine ``generate`` that
raised or returned garbage is ``model_error``; the env's reset or step raising is ``env_error``,
logged with its traceback; so is building it raising, for one row's unknown env id or bad
argument as for a server or database that would not come up) come back as samples, never as
exceptions: OpenRLHF's ``generate_responses`` gathers a prompt's samples without
``return_exceptions``, so one sample that raised would fail the engine's Ray call and end
training. (A label naming no env and a prompt over ``max_length`` still raise, as does a
cancellation or an interrupt.)
A failed sample's ``outcome_detail`` says why, in a line ("" for the others; OpenRLHF ignores the
key); an env that failed before its prompt existed gets the row's prompt (one token where that
cannot be rendered within ``max_length``) and no action range. OpenRLHF needs every sample
of a prompt's group (its advantages reshape rewards by ``n_samples_per_prompt``), has no
NaN-aware baseline and no hook for one, so a single sample cannot leave the baseline. The one
thing its own code can do is drop the prompt's whole group: a failed sample's ``scores`` (and
``reward``) are NaN, and OpenRLHF's dynamic filtering (``--algo.dynamic_filtering_enable``)
drops every group whose mean score is outside its range, which NaN always is. Train with it on
when failures can happen: without it the NaN reaches the group's advantages (loud, never a
fake 0). A failed sample is never ``truncated`` (its ``extra_logs["truncated"]`` still says
whether the budget cut it): ``--reward.stop_properly_penalty_coef`` below 0 sets a truncated
sample's reward, which would turn its NaN into one. Policy: ``failed_group="drop"`` only; its
range also drops groups whose samples all score the same (DAPO's filter: widen
``--algo.dynamic_filtering_range`` to keep them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from copy import deepcopy
from typing import Any

from benchmax_gym.adapters.tokens import (ChatTemplate, TokenEpisode, TokenSession, amake_env, check_chat_kwargs,
                                          make_env, task_dataset)
from benchmax_gym.core import outcomes
from benchmax_gym.core.group import GroupRubric, group_failed, group_rubric_of

log = logging.getLogger(__name__)

try:
    from openrlhf.utils.agent import AgentExecutorBase
except ImportError:  # pragma: no cover - exercised by the missing-extra test in a bare venv
    raise ImportError("the OpenRLHF adapter needs openrlhf: pip install 'benchmax-gym[openrlhf]'") from None


def _task(label: Any, env_id: str | None, env_kwargs: dict[str, Any]) -> tuple[str, int | None, dict[str, Any]]:
    """(env id, task index, env kwargs) from a row's label."""
    if isinstance(label, str) and label.lstrip().startswith("{"):
        label = json.loads(label)
    if isinstance(label, dict):
        index = label.get("task_index")
        return (label.get("env_id") or env_id, None if index is None else int(index),
                {**env_kwargs, **(label.get("env_kwargs") or {})})
    return env_id, None if label in (None, "") else int(label), env_kwargs


class _Rendezvous:
    """Where a prompt's ``group_size`` samples meet to be group-scored. OpenRLHF's engine plays a
    prompt's ``n_samples_per_prompt`` samples together (``generate_responses``: one
    ``asyncio.gather`` on one engine, one executor), so they meet on one event loop; samples of
    the same prompt and label form groups in arrival order. A member that waits past
    ``timeout`` fails (NaN, logged; its own reward would sit among its siblings' group scores):
    a group never deadlocks training."""

    def __init__(self, size: int, timeout: float):
        self.size, self.timeout = size, timeout
        self.open: dict[str, dict[str, Any]] = {}

    async def arrive(self, key: str, record: dict[str, Any], rubric: GroupRubric | None, task: Any,
                     wait: bool = True) -> dict[str, Any]:
        slot = self.open.get(key)
        if slot is None:
            slot = self.open[key] = {"records": [], "done": asyncio.get_running_loop().create_future(),
                                     "rubric": None, "task": None}
        index = len(slot["records"])
        slot["records"].append(record)
        if rubric is not None and slot["rubric"] is None:  # a member still playing holds its env open
            slot["rubric"], slot["task"] = rubric, task
        if len(slot["records"]) == self.size:
            del self.open[key]
            rubric, task = slot["rubric"], slot["task"]
            try:
                scored = await rubric.ascore(slot["records"], task=task) if rubric else slot["records"]
            except BaseException as exc:  # the group fails (never a reward), its members still let go
                log.exception("group reward failed: %s", exc)
                scored = [{**r, "reward": None, "group_errors": {"group": f"{type(exc).__name__}: {exc}"}}
                          for r in slot["records"]]
            slot["done"].set_result(scored)
        if not wait:
            return record
        try:
            return (await asyncio.wait_for(asyncio.shield(slot["done"]), self.timeout))[index]
        except TimeoutError:  # its group cannot be scored whole: a failed group (NaN), not its own reward
            why = f"{len(slot['records'])} of {self.size} samples arrived within {self.timeout:g} s"
            log.warning("group of %r: %s; this sample's group fails", key[:80], why)
            return {**record, "reward": None, "group_errors": {"group": why}}


def _env_failed(session: TokenSession, what: str, exc: Exception) -> None:
    """End the session's episode as ``env_error`` for the exception its env raised (logged with
    its traceback): a failed sample, not an exception that would fail the prompt's whole
    ``generate_responses`` gather (and with it OpenRLHF's Ray call)."""
    log.warning("%s raised; the sample fails (%s)", what, outcomes.ENV_ERROR, exc_info=exc)
    session.fail(outcomes.ENV_ERROR, outcomes.outcome_detail(f"{what} raised {type(exc).__name__}: {exc}"))


def _unbuilt(what: str, exc: Exception, prompt_ids: list[int]) -> TokenEpisode:
    """The episode of a sample whose env could not be built (``env_error``, logged with its
    traceback): the row's prompt, no reply, no reward; a failed sample, as for :func:`_env_failed`."""
    log.warning("%s raised; the sample fails (%s)", what, outcomes.ENV_ERROR, exc_info=exc)
    error = outcomes.outcome_detail(f"{what} raised {type(exc).__name__}: {exc}")
    return TokenEpisode(prompt_ids=prompt_ids, reward=None, truncated=True, outcome=outcomes.ENV_ERROR,
                        info={"outcome": outcomes.ENV_ERROR, "error": error})


def _row_prompt_ids(prompt: Any, chat: ChatTemplate, max_length: int) -> list[int]:
    """The prompt of a sample whose env failed before its own existed: the row's (its messages
    through the template, or text OpenRLHF rendered), else one token. Never empty (a sequence
    of nothing) and never over ``max_length``."""
    try:
        if isinstance(prompt, str):
            ids = chat.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            ids = chat.prompt_ids([dict(m) for m in prompt])
    except Exception:  # noqa: BLE001  (a row the template cannot render: the one-token prompt)
        ids = []
    if not ids or len(ids) >= max_length:
        tokenizer = chat.tokenizer
        ids = [tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id]
    return list(ids)


def make_executor(env_id: str | None = None, *, chat_kwargs: dict[str, Any] | None = None,
                  group_rubric: GroupRubric | None = None, group_size: int | None = None,
                  group_timeout: float = 600.0, **env_kwargs: Any) -> type:
    """An ``AgentExecutor`` class (no-argument constructor, as OpenRLHF makes it) for ``env_id``
    (``None``: each row's label names its env). ``chat_kwargs``: :class:`ChatTemplate` options
    (``tool_role``, ``chat_template``, template variables), checked here as the env's arguments are.

    Group rewards: with ``group_size`` (set it to ``--rollout.n_samples_per_prompt``), each
    prompt's samples wait for each other and are scored together by ``group_rubric`` (default:
    the env's own, e.g. a benchmax env's ``compute_group_reward``) before they are returned; a
    failed sample is not a member. ``group_timeout``: how long a member waits for the rest."""
    if group_rubric is not None and not isinstance(group_rubric, GroupRubric):
        raise TypeError(f"group_rubric must be a GroupRubric, got {type(group_rubric).__name__}")
    if group_rubric is not None and group_size is None:
        raise ValueError("group_size is missing: a group rubric needs the group's size, "
                         "--rollout.n_samples_per_prompt")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be a positive integer (--rollout.n_samples_per_prompt), got {group_size!r}")
    if isinstance(group_timeout, bool) or not isinstance(group_timeout, (int, float)) or not group_timeout > 0:
        raise ValueError(f"group_timeout must be a positive number of seconds, got {group_timeout!r}")
    if chat_kwargs is not None:  # (checked here, as the env's arguments: the template is built at the first sample)
        chat_kwargs = check_chat_kwargs("chat_kwargs", chat_kwargs)
    if env_id is not None:
        make_env(env_id, env_kwargs).close()  # a wrong id or argument fails when OpenRLHF loads the file

    class AgentExecutor(AgentExecutorBase):
        __doc__ = f"benchmax-gym episodes of {env_id or 'the env each row names'} for OpenRLHF."

        def __init__(self):
            self._chat: ChatTemplate | None = None
            self._groups = _Rendezvous(group_size, group_timeout) if group_size else None

        async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
            if self._chat is None or self._chat.tokenizer is not hf_tokenizer:
                self._chat = ChatTemplate(hf_tokenizer, **(chat_kwargs or {}))
            name, index, kwargs = _task(label, env_id, env_kwargs)
            if not name:
                raise ValueError("env_id is missing: pass it to make_executor(), or give it in the row's label")
            key = json.dumps([prompt, label], sort_keys=True, default=str)
            try:
                env = await amake_env(name, kwargs)
            except Exception as exc:  # (a row's bad argument, a server that would not start) env_error
                episode = _unbuilt(f"{name} task {index}: building the env", exc,
                                   _row_prompt_ids(prompt, self._chat, max_length))
                if self._groups is not None:  # not a member: its siblings must not wait for it
                    await self._groups.arrive(key, {"reward": None, "outcome": outcomes.ENV_ERROR}, None, None,
                                              wait=False)
                return _sample(prompt, label, images, episode, math.nan, sampling_params)
            session = TokenSession(env, self._chat)
            arrived = False
            try:
                try:
                    prompt_ids = await session.areset(options=None if index is None else {"task_index": index})
                except Exception as exc:  # the env failed this sample: env_error, its group dropped
                    session.episode = TokenEpisode(prompt_ids=_row_prompt_ids(prompt, self._chat, max_length))
                    _env_failed(session, f"{name} task {index}: reset", exc)
                else:
                    if len(prompt_ids) >= max_length:
                        raise ValueError(f"{name} task {index}: its prompt is {len(prompt_ids)} tokens, max_length "
                                         f"is {max_length}: raise --data.max_len")
                    session.max_tokens = max_length - len(prompt_ids)
                while not session.done:
                    params = deepcopy(sampling_params)
                    cap = sampling_params.max_tokens  # --rollout.max_new_tokens: a per-turn cap
                    params.max_tokens = session.budget if cap is None else min(cap, session.budget)
                    try:
                        output = (await llm_engine.generate(session.input_ids, params, multi_modal_data=None)).outputs[0]
                        ids = list(output.token_ids)
                        logprobs = None
                        if sampling_params.logprobs is not None:
                            logprobs = [lp[t].logprob for lp, t in zip(output.logprobs, ids)]
                    except Exception as exc:  # the engine failed this sample: model_error, its group dropped
                        session.fail(outcomes.MODEL_ERROR, f"generate raised {type(exc).__name__}: {exc}")
                        break
                    try:
                        await session.astep(ids, logprobs)
                    except Exception as exc:  # the env failed this sample: env_error, its group dropped
                        _env_failed(session, f"{name} task {index}: step", exc)
                        break
                episode = session.episode
                reward = math.nan if episode.failed else episode.reward  # NaN: dynamic filtering drops the group
                rubric = group_rubric or group_rubric_of(session.env)
                if self._groups is not None and rubric is not None:
                    record = {**episode.record, "reward": None if episode.failed else episode.reward,
                              "outcome": episode.outcome, "reward_components": dict(episode.reward_components)}
                    arrived = True
                    record = await self._groups.arrive(key, record, rubric,
                                                       getattr(session.env.unwrapped.episode, "task", None))
                    reward = math.nan if group_failed(record) else record["reward"]  # (its rubric's error too)
            except BaseException:
                if self._groups is not None and not arrived:  # it raised: its siblings must not wait for it
                    await self._groups.arrive(key, {"reward": None, "outcome": outcomes.ENV_ERROR}, None, None,
                                              wait=False)
                raise
            finally:  # (shielded: a second cancel must not drop the close)
                try:
                    await asyncio.shield(asyncio.to_thread(session.close))
                except Exception as exc:  # the episode is played (and graded): a close that fails leaks, said
                    log.warning("closing the env of %s task %s raised %s: %s", name, index, type(exc).__name__, exc)
            return _sample(prompt, label, images, episode, reward, sampling_params)

    return AgentExecutor


def _sample(prompt: Any, label: Any, images: Any, episode: TokenEpisode, reward: float,
            sampling_params: Any) -> dict[str, Any]:
    """What OpenRLHF's ``MultiTurnAgentExecutor`` returns for a sample, from its episode."""
    start = len(episode.prompt_ids)
    logprobs = None
    if sampling_params.logprobs is not None:
        logprobs = [0.0] * start + (episode.logprobs or [0.0] * len(episode.completion_ids))
    return {"prompt": prompt, "label": label, "images": images, "mm_train_inputs": None,
            "reward": reward, "scores": reward, "observation_tokens": episode.input_ids,
            "action_ranges": [(start + a, start + b) for a, b in episode.turns],
            # (a failed one is not: OpenRLHF's stop-properly penalty gives truncated samples a reward)
            "rollout_log_probs": logprobs, "truncated": episode.cut and not episode.failed,
            "turn_rewards": list(episode.turn_rewards),  # one per action range
            "extra_logs": episode.metrics(components=False),
            # why it failed, in a line ("" for the others): the env's own (a tool gone) or an exception's
            "outcome_detail": outcomes.outcome_detail((episode.info.get("outcome_detail")
                                                       or episode.info.get("error") or "")
                                                      if episode.failed else "")}


def task_rows(env_id: str, n: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
    """Rows for OpenRLHF's prompt dataset: ``prompt`` (the env's messages; the agent renders its
    own) and ``label`` (JSON: the env and task), for ``--data.input_key prompt --data.label_key label``."""
    rows = task_dataset(env_id, n, env_kwargs=env_kwargs).to_list()
    extra = {"env_kwargs": env_kwargs} if env_kwargs else {}
    return [{"prompt": r["prompt"], "label": json.dumps({"env_id": env_id, "task_index": r["task_index"], **extra})}
            for r in rows]


if os.environ.get("BENCHMAX_ENV_ID"):  # loaded by path as an agent file
    AgentExecutor = make_executor(os.environ["BENCHMAX_ENV_ID"], **json.loads(os.environ.get("BENCHMAX_ENV_KWARGS", "{}")))
