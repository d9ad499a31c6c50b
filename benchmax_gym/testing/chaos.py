"""Faults injected on purpose, for the chaos tests and ``benchmarks/chaos.py`` (issue 29).

A chaos run plays a fixed list of episodes - each a (task, seed, right-or-wrong answer) and at
most one fault - through one path (a vector env, TRL's rollout function), and a clean run plays
the same list without the faults. Every failed episode must say how it failed, and every scored
one must end exactly as it did in the clean run: a fault touches only the episodes it hits.

* :data:`CHAOS_ID` is ``benchmax/Math-v0`` (same tasks, prompt, rubric, calculator and python
  tools) with one more tool, ``fetch``, an async call to a slow backend: a reply that calls it
  for longer than ``tool_timeout`` is the injected tool timeout (the tool's, not model code's).
* the replies are scripted: a calculator call, then the answer (right or ``-1``);
* faults (:class:`Episode` ``.fault``): ``"kill"`` SIGKILLs the process serving the episode (a
  vector env's worker; in the in-process TRL path the sandbox server under a python call),
  ``"tool_timeout"`` calls ``fetch`` past the timeout, ``"model_error"`` is a generation that
  fails (the policy raises; garbage token ids from the backend).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from benchmax_gym.core.env import ToolEnv
from benchmax_gym.core.outcomes import ENV_ERROR, MODEL_ERROR, SCORED, TOOL_TIMEOUT, TOOL_UNAVAILABLE
from benchmax_gym.core.sandbox import sandboxed_python
from benchmax_gym.core.sources import task_source
from benchmax_gym.core.tools import Toolset, tool
from benchmax_gym.envs.math.env import PRELOAD, SYSTEM_PROMPT, TASK_SOURCES
from benchmax_gym.envs.math.rubric import math_rubric
from benchmax_gym.envs.math.tools import calculator

CHAOS_ID = "benchmax-test/ChaosMath-v0"
FAULTS = ("kill", "tool_timeout", "model_error")
#: the outcome each fault must give (a kill under the sandbox is ``tool_unavailable``)
EXPECTED = {"kill": ENV_ERROR, "tool_timeout": TOOL_TIMEOUT, "model_error": MODEL_ERROR}
HANG_SECONDS = 30.0  # what a hanging backend or python call would take, far past any timeout


@tool
async def fetch(seconds: float = 0.0) -> str:
    """Fetch a value from a slow backend.

    Args:
        seconds: how long the backend takes
    """
    await asyncio.sleep(seconds)
    return "fetched"


class ChaosMathEnv(ToolEnv):
    """``benchmax/Math-v0``'s generated tasks, prompt and rubric, with ``calculator``, ``fetch``
    and (``python_tool``) the sandboxed python tool, whose calls may take ``python_timeout``."""

    def __init__(self, *, python_tool: bool = False, python_timeout: float = 60.0, tool_timeout: float = 0.5,
                 max_turns: int = 4, **engine_kwargs: Any):
        source = task_source(self, "generated", None, TASK_SOURCES, engine_kwargs)
        python, sandbox = sandboxed_python(CHAOS_ID, enabled=python_tool, mode="auto", limits=None,
                                           timeout=python_timeout, preload=PRELOAD)
        super().__init__(tasks=source, toolset=Toolset([calculator, fetch, *python]), rubric=math_rubric(),
                         system_prompt=SYSTEM_PROMPT, max_turns=max_turns, tool_timeout=tool_timeout,
                         sandbox=sandbox, **engine_kwargs)


def make_chaos_env(**kwargs: Any) -> gym.Env:
    """``gym.make(CHAOS_ID, **kwargs)`` (a module-level function: vector workers unpickle it)."""
    return gym.make(CHAOS_ID, **kwargs)


if CHAOS_ID not in gym.registry:
    gym.register(CHAOS_ID, entry_point=ChaosMathEnv)


@dataclass(frozen=True)
class Episode:
    """One scripted episode: its task, seed, whether it answers right, and its fault (or None)."""

    task_index: int
    seed: int
    right: bool
    fault: str | None = None


def plan(n: int, *, tasks: int = 32, group: int = 1, kill: float = 0.0, tool_timeout: float = 0.0,
         model_error: float = 0.0, seed: int = 0) -> list[Episode]:
    """``n`` episodes (``group`` in a row per task, as GRPO samples them), exactly
    ``round(n * rate)`` of each fault, at places drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    faults: list[str | None] = [None] * n
    places = iter(rng.permutation(n).tolist())
    for name, rate in (("kill", kill), ("tool_timeout", tool_timeout), ("model_error", model_error)):
        for _ in range(round(n * rate)):
            faults[next(places)] = name
    return [Episode((i // group) % tasks, 1000 + i, bool(rng.random() < 0.6), faults[i]) for i in range(n)]


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def reply(episode: Episode, turn: int, answer: str, inject: bool = True, in_process: bool = False) -> str:
    """The scripted model: a calculator call (or, injected, the fault's call), then the answer.
    ``in_process``: a kill is the sandbox server's, under a long python call."""
    if turn == 0:
        if inject and episode.fault == "tool_timeout":
            return call("fetch", seconds=HANG_SECONDS)
        if inject and episode.fault == "kill" and in_process:
            return call("python", code=f"import time\ntime.sleep({HANG_SECONDS})")
        return call("calculator", expression=f"{episode.task_index} + 1")
    return f"The answer is \\boxed{{{answer if episode.right else -1}}}."


def answers(n_tasks: int, **kwargs: Any) -> list[str]:
    """The tasks' answers (the scripted model's right answers)."""
    env = make_chaos_env(**kwargs)
    try:
        return [str(env.unwrapped.tasks[i].answer) for i in range(n_tasks)]
    finally:
        env.close()


# -- a vector env -------------------------------------------------------------------------------

def run_vector(episodes: list[Episode], answer: list[str], *, num_envs: int = 4, num_workers: int = 2,
               step_timeout: float | None = 10.0, inject: bool = True, vector: Any = None,
               **env_kwargs: Any) -> dict[str, Any]:
    """Play ``episodes`` through a :class:`~benchmax_gym.wrappers.SubprocVectorEnv` (or what
    ``vector(env_fn, num_envs, num_workers, step_timeout)`` makes: a ``RayVectorEnv``), ``num_envs``
    at a time. A ``kill`` SIGKILLs the worker holding the episode between its two steps (every
    episode that worker holds fails with it); a ``model_error`` is a policy that fails before its
    second reply (the episode ends there, its env untouched).

    Returns ``results`` (episode index -> outcome, reward, components, observations, and
    ``signal``: the batch's ``info["scored"]``; False for a failed policy),
    ``expected`` (index -> the outcome its fault must give, the neighbours of a kill included),
    ``stalls`` (seconds each batch waited, send to receive) and ``restarts``."""
    import functools

    from benchmax_gym.wrappers import SubprocVectorEnv

    fn = functools.partial(make_chaos_env, **env_kwargs)
    if vector is None:
        envs = SubprocVectorEnv(fn, num_envs, num_workers=num_workers, autoreset_mode="Disabled",
                                step_timeout=step_timeout)
    else:
        envs = vector(fn, num_envs, num_workers, step_timeout)
    results: dict[int, dict[str, Any]] = {}
    expected: dict[int, str] = {}
    stalls: list[float] = []
    try:
        for start in range(0, len(episodes), num_envs):
            batch = list(range(start, min(start + num_envs, len(episodes))))
            pad = num_envs - len(batch)
            obs, _ = envs.reset(seed=[episodes[e].seed for e in batch] + [0] * pad,
                                options=[{"task_index": episodes[e].task_index} for e in batch]
                                + [{"task_index": 0}] * pad)
            seen = {slot: [str(obs[slot])] for slot in range(len(batch))}
            live = list(range(len(batch)))
            for turn in range(2):
                ids, actions = [], []
                for slot in live:
                    ep = episodes[batch[slot]]
                    if inject and turn == 1 and ep.fault == "model_error":
                        results[batch[slot]] = {"outcome": MODEL_ERROR, "reward": None, "components": {},
                                                "observations": seen[slot], "signal": False}
                        expected[batch[slot]] = MODEL_ERROR
                        continue
                    ids.append(slot)
                    actions.append(reply(ep, turn, answer[ep.task_index], inject))
                if inject and turn == 1:
                    killed = {envs._owner[slot] for slot in ids if episodes[batch[slot]].fault == "kill"}
                    for w in killed:
                        os.kill(envs.worker_pids[w], signal.SIGKILL)
                    for slot in ids:  # every episode of a killed worker is lost with it
                        if envs._owner[slot] in killed:
                            expected[batch[slot]] = ENV_ERROR
                t0 = time.monotonic()
                envs.send(actions, ids)
                got: dict[int, tuple] = {}
                while len(got) < len(ids):
                    o, r, term, trunc, info, which = envs.recv(min_ready=len(ids) - len(got))
                    for k, slot in enumerate(which.tolist()):
                        got[slot] = (o[k], float(r[k]), bool(term[k]), bool(trunc[k]), _one(info, k))
                stalls.append(time.monotonic() - t0)
                for slot, (o, r, term, trunc, info) in got.items():
                    seen[slot].append(str(o))
                    if term or trunc:
                        live.remove(slot)
                        failed = math.isnan(r)
                        results[batch[slot]] = {"outcome": info.get("outcome", SCORED), "reward": None if failed else r,
                                                "components": {} if failed else dict(info.get("reward_components", {})),
                                                "observations": seen[slot], "signal": bool(info["scored"])}
                        if inject and turn == 0 and episodes[batch[slot]].fault == "tool_timeout":
                            expected[batch[slot]] = TOOL_TIMEOUT
        restarts = envs.faults
    finally:
        envs.close()
    return {"results": results, "expected": expected, "stalls": stalls, "restarts": restarts}


def _one(info: dict[str, Any], k: int) -> dict[str, Any]:
    """Environment ``k``'s info out of a vector env's batched one (dicts of arrays, ``_key`` masks)."""
    out = {}
    for key, value in info.items():
        if key.startswith("_") or not info.get("_" + key, np.ones(k + 1, bool))[k]:
            continue
        out[key] = _one(value, k) if isinstance(value, dict) else value[k]
    return out


# -- TRL's rollout function -----------------------------------------------------------------------

def _kill_sandbox_call(box: Any, wait: float = 20.0) -> None:
    """SIGKILL the sandbox server (its process group) once ``box`` has a call running in it."""
    deadline = time.monotonic() + wait
    while box._running is None and time.monotonic() < deadline and not box._closed:
        time.sleep(0.002)
    running = box._running
    if running is not None:
        try:
            os.killpg(running[0].proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_trl(episodes: list[Episode], answer: list[str], tokenizer: Any, *, batch: int = 16, inject: bool = True,
            max_completion_length: int = 2048, trainer: Any = None, failed_group: str = "renormalise",
            **env_kwargs: Any) -> dict[str, Any]:
    """Play ``episodes`` through :class:`~benchmax_gym.adapters.trl.TRLRollout` (``batch`` prompts
    a call, as GRPOTrainer calls it) with a scripted generation backend. A ``kill`` runs a long
    python call and SIGKILLs the sandbox server under it (``tool_unavailable`` where bubblewrap
    isolates the code); a ``model_error`` is a backend returning ids outside the vocabulary.

    Returns ``results`` (index -> outcome, reward, completion ids, mask), ``outputs`` (what each
    call returned, for the trainer), ``stalls`` (seconds per call) and ``expected``."""
    from types import SimpleNamespace

    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.core.sandbox import bubblewrap_status

    kills = any(e.fault == "kill" for e in episodes)  # the same env (prompt, tools) clean or not
    kwargs = {"python_tool": True, **env_kwargs} if kills else dict(env_kwargs)
    isolated = bubblewrap_status()[0]
    calls: list[int] = []  # the episode indices of the current call, in prompt order

    def generate(_trainer: Any, sessions: list[Any]) -> tuple[list[list[int]], list[None]]:
        pool = next(iter(rollout._sessions.values()))
        out = []
        for s in sessions:
            index = calls[pool.index(s)]
            ep, turn = episodes[index], s.info["turn"]
            if inject and ep.fault == "model_error" and turn == 1:
                out.append([len(tokenizer) + 7])  # garbage: no such token
                continue
            if inject and ep.fault == "kill" and turn == 0:
                threading.Thread(target=_kill_sandbox_call, args=(s.env.unwrapped.episode.state["sandbox"],),
                                 daemon=True).start()
            out.append(s.chat.encode(reply(ep, turn, answer[ep.task_index], inject, True)) + [tokenizer.eos_token_id])
        return out, [None] * len(out)

    rollout = TRLRollout(CHAOS_ID, tokenizer, env_kwargs=kwargs, generate=generate, failed_group=failed_group)
    trainer = trainer or SimpleNamespace(max_completion_length=max_completion_length, _metrics=None)
    rows = rollout.dataset(max(e.task_index for e in episodes) + 1)["prompt"]
    results: dict[int, dict[str, Any]] = {}
    expected: dict[int, str] = {}
    outputs, stalls = [], []
    try:
        for start in range(0, len(episodes), batch):
            calls[:] = list(range(start, min(start + batch, len(episodes))))
            t0 = time.monotonic()
            out = rollout([rows[episodes[i].task_index] for i in calls], trainer)
            stalls.append(time.monotonic() - t0)
            outputs.append(out)
            pool = next(iter(rollout._sessions.values()))
            for k, index in enumerate(calls):
                episode = pool[k].episode
                results[index] = {"outcome": episode.outcome or SCORED, "reward": out["env_reward"][k],
                                  "completion_ids": out["completion_ids"][k], "env_mask": out["env_mask"][k],
                                  "components": dict(episode.reward_components)}
                fault = episodes[index].fault if inject else None
                if fault == "kill":
                    expected[index] = TOOL_UNAVAILABLE if isolated else SCORED  # rlimits: the model's own doing
                elif fault:
                    expected[index] = EXPECTED[fault]
    finally:
        rollout.close()
    return {"results": results, "outputs": outputs, "stalls": stalls, "expected": expected, "isolated": isolated}


__all__ = ["CHAOS_ID", "ChaosMathEnv", "EXPECTED", "Episode", "FAULTS", "answers", "make_chaos_env", "plan", "reply",
           "run_trl", "run_vector"]
