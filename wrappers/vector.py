"""``SubprocVectorEnv``: batched rollouts in worker processes, several environments per worker.

A drop-in :class:`gymnasium.vector.VectorEnv` (lock-step ``reset``/``step``, the three autoreset
modes, infos as dicts of arrays with ``_key`` masks) that is faster than ``AsyncVectorEnv`` and
survives faults:

* **Several environments per worker.** A worker runs its environments' ``astep`` coroutines
  concurrently on one event loop, so tools that wait on I/O overlap inside one process, and a
  batch costs one message per worker instead of one per environment.
* **A parent that stays out of the way.** In lock-step ``step()`` each worker answers with
  column messages (``worker.pack_results``: observations as one list, rewards and flags as
  arrays, each info key's numeric array and ``_key`` mask built there, in ``marshal``'s format),
  and the parent joins the slices into Gymnasium's dict of arrays (``batching.join_columns``)
  without Python work per env: its serial CPU per env step is what caps any number of workers.
  The info columns of Python objects (each env's messages and tool calls) come as bytes and are
  decoded the first time the caller reads them (``batching.LazyInfos``, a ``dict``): building
  and collecting those objects was most of the parent's work with full infos (1,024 calculator
  envs on 2 cores: 0.5-0.6 us per env step unread, 1.9-2.2 read, 2.0-2.2 before).
  Ready-first calls, faults and mixtures take the per-env path, whose results are the same.
* **Ready-first mode** (envpool's pattern) for heavy-tailed tool latency: ``send(actions,
  env_ids)`` then ``recv(min_ready=k)`` returns whichever environments finished first, with their
  ids, so a trainer never waits for the slowest member of a batch::

      envs.reset(seed=0)
      envs.send(first_actions, np.arange(envs.num_envs))
      while training:
          obs, rew, term, trunc, info, ids = envs.recv(min_ready=16)
          envs.send(policy(obs), ids)          # those envs go on while the rest still run

* **Faults.** An environment whose step raises (``sys.exit()`` too) or whose result cannot be
  pickled is rebuilt, its neighbours untouched; a worker that dies (even by SIGKILL)
  or exceeds ``step_timeout`` is killed and restarted. The affected environments report
  ``truncated=True`` with ``info["error"]`` and ``info["outcome"] == "env_error"`` (in
  ``final_info`` under ``SAME_STEP``), reward NaN (issue 29: never a reward): every env a lost
  worker held, the one past ``step_timeout`` and its neighbours alike (nothing tells which hung and
  why, so none of them is the model's); the others go on untouched. A worker that does not answer
  a ``call``/``get_attr``/``set_attr`` in time (an env method that blocks) is restarted alike, and
  the call raises ``WorkerTimeout`` naming it (its late answer is never the next call's). Every
  batch's ``info["scored"]`` (bool array) says which rewards are signal:
  ``rewards[info["scored"]]``. A ``reset`` whose worker was lost (dead since the last call) is run
  again on the fresh one, with its seeds; an env whose reset raised reports the error in
  ``reset``'s info, and its next step resets it (``NEXT_STEP``, ``SAME_STEP``) rather than play
  on in the episode it had. ``close()``, garbage collection and interpreter exit leave no process
  (nor descriptor) behind; a call that another thread's ``close()`` cuts short raises that the env
  was closed.

* **Mixtures** (``benchmax/Mix-v0``): the parent holds the one curriculum controller
  (``envs.curriculum``, ``envs.curriculum_stats()``), fed by every worker's ended episodes, and
  sends its levels to every worker (a restarted one included); ended episodes' infos get the
  batch-wide ``success_rate`` and ``zero_variance``; ``get_mix_state``/``set_mix_state`` save and
  restore every env's sampler and the controller.

``gym.make_vec("benchmax/Math-v0", num_envs=64)`` returns one (vector options such as
``num_workers``, ``autoreset_mode`` and ``step_timeout`` go in as keyword arguments).

The parent logic is :class:`WorkerVectorEnv`'s (here), the worker loop ``_Worker``'s (``worker``),
the pipe ``_Process`` (``channel``) and the batching of results ``batching``'s; only the
transport differs between this class (a pipe per worker process) and ``RayVectorEnv`` in
``ray_vector`` (a Ray actor per host), so both behave alike.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import math
import os
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import multiprocess as mp
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector.utils import batch_space

from benchmax_gym.core.checks import COUNT_MAX, int_between, one_of
from benchmax_gym.core.outcomes import outcome_detail

from .batching import _collections_paused, _stack, batch_infos, join_columns, unpack_columns
from .channel import HEARS_CLOSE, WAIT_MAX_S, WorkerLost, _Process, ended, readable
from .worker import (ENV_ERROR, MIX_INFO_KEYS, WORKER_RESTARTED, driver_registrations, result_arrays, unpack_results,
                     with_registrations)


def seconds_arg(name: str, value: Any, *, none: str | None = None, zero: bool = False) -> float | None:
    """A vector env's wait in seconds (``zero``: 0 allowed; ``none``: what ``None`` means, if
    allowed). Up to :data:`WAIT_MAX_S`, and no bool: inf or ``10**30`` passed a bare check and
    failed at the first wait with OverflowError, ``True`` meant 1 s."""
    if value is None and none is not None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            (0 <= value if zero else 0 < value) and value <= WAIT_MAX_S):
        raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'} number of seconds up to "
                         f"{WAIT_MAX_S:.0f}{f' or None ({none})' if none is not None else ''}, got {value!r}")
    return float(value)


def _env_fns(env: str | Callable | Sequence[Callable], num_envs: int | None, env_kwargs: dict,
             owner: type | None = None) -> list[Callable]:
    if num_envs is not None:  # (0 or "2" failed later naming num_workers or with a bare TypeError; True made 1)
        int_between(1, COUNT_MAX)("num_envs", num_envs)
    if isinstance(env, str):
        if num_envs is None:
            raise ValueError("num_envs is required when the environment is given by id")
        if env_kwargs and owner is not None:
            _check_env_kwargs(env, env_kwargs, owner)
        return [functools.partial(gym.make, env, **env_kwargs) for _ in range(num_envs)]
    if env_kwargs:
        raise ValueError(f"environment keyword arguments {sorted(env_kwargs)} need an environment id, not functions")
    if callable(env):
        if num_envs is None:
            raise ValueError("num_envs is required with a single environment function")
        return [env] * num_envs
    fns = list(env)
    if not fns or not all(callable(f) for f in fns):
        raise ValueError("env must be an id, a function that makes an environment, or a list of such functions")
    if num_envs is not None and num_envs != len(fns):
        raise ValueError(f"num_envs={num_envs} but {len(fns)} environment functions were given")
    return fns


_GYM_MAKE_ARGS = {"max_episode_steps", "disable_env_checker"}  # gym.make's own, not the env's


def _check_env_kwargs(env_id: str, env_kwargs: dict, owner: type) -> None:
    """Keyword arguments the env would refuse fail here, in the parent, in one line that names
    them with a did-you-mean over the env's and the vector env's options (``num_worker=2``),
    instead of in every worker. Only for envs that refuse unknown arguments (``ToolEnv``s)."""
    from benchmax_gym.core.env import ToolEnv, known_arguments, unknown_arguments_message
    from benchmax_gym.registry import _PARTS, RegisteredFactory

    try:
        creator = gym.spec(env_id).entry_point
        if isinstance(creator, str):
            creator = load_env_creator(creator)
    except Exception:  # an unknown id or a broken entry point: the workers say why
        return
    if isinstance(creator, RegisteredFactory):
        creator = _PARTS.get(creator.env_id, (None,))[0]
    if not (isinstance(creator, type) and issubclass(creator, ToolEnv)):
        return
    known = known_arguments(creator) | _GYM_MAKE_ARGS
    unknown = {k: v for k, v in env_kwargs.items() if k not in known}
    if unknown:
        # The suggestions come from both classes; the one named is the vector env only where every
        # name is closest to one of its own options (num_worker), else the env, as gym.make names it
        # (max_turn is MathEnv's)
        own = known_arguments(owner) - known
        message = unknown_arguments_message(creator, unknown, also=owner)
        if not all(set(difflib.get_close_matches(name, sorted(known | own), n=1)) & own for name in unknown):
            message = creator.__name__ + message.removeprefix(owner.__name__)
        raise TypeError(message)


CLOSE_GRACE_S = 10.0  # seconds close() gives workers to close their envs (MCP servers, sandboxes) before killing them
# ... if they hear it within this (an idle worker, or one awaiting async steps, does at once; one
# stuck in a synchronous step cannot, and is killed then, not after the grace)
CLOSE_ANSWER_S = 1.0
CALL_TIMEOUT = 120.0  # seconds every worker has to answer a call/get_attr/set_attr (or step_timeout, if longer)


class WorkerTimeout(RuntimeError):
    """A worker that did not answer a command within its timeout (an env method that blocks)."""


def _build_failure(what: str, payload: str) -> Exception:
    """A worker's report that its environments could not be built (``failure_text``: the
    exception's line, then its traceback's end). A bad argument (ValueError, TypeError: what
    ``gym.make`` raises for it, naming the argument) is raised as itself, its one line, with the
    worker's traceback as a note; anything else is a RuntimeError with the whole report."""
    line, _, tail = str(payload).partition("\n")
    kind, _, message = line.partition(": ")
    if kind in ("ValueError", "TypeError") and message:
        error = (ValueError if kind == "ValueError" else TypeError)(message)
        error.add_note(f"({what}; in the worker:\n{tail})")
        return error
    return RuntimeError(f"{what}: {payload}")


class WorkerVectorEnv(VectorEnv):
    """The parent logic that :class:`SubprocVectorEnv` and ``RayVectorEnv`` share: environments
    spread over workers, lock-step and ready-first calls, autoreset, faults and restarts.

    A subclass supplies the transport: ``_spawn(w, fresh)`` starts worker ``w`` and returns its
    handle (see :class:`_Process`), ``_wait(ws, timeout)`` returns the workers among ``ws`` that
    have messages. It calls :meth:`_setup` from its ``__init__``.
    """

    _kind = "worker"  # how messages name one worker
    _blocking_reads = False  # a lock-step batch may block on one worker's read (its end shows as EOF)

    def _setup(self, env, fns: list[Callable], num_workers: int, autoreset_mode, step_timeout, info_keys=None) -> None:
        self.num_envs = len(fns)
        self._env_name = repr(env) if isinstance(env, str) else "its environments"
        self._closed = False
        self._workers: list[Any] = []
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(
                f"autoreset_mode must be one of {[m.value for m in AutoresetMode]}, got {autoreset_mode!r}"
            ) from None
        self.step_timeout = seconds_arg("step_timeout", step_timeout, none="no limit")
        if info_keys is not None:
            if isinstance(info_keys, str) or not all(isinstance(k, str) for k in info_keys):
                raise ValueError(f"info_keys must be a list of info key names or None, got {info_keys!r}")
            # always kept: the outcome and why, and what a mixture's controller in this parent reads
            kept = ("outcome", "outcome_detail", *MIX_INFO_KEYS)
            info_keys = tuple(info_keys) + tuple(k for k in kept if k not in info_keys)
        self.info_keys = info_keys
        self._fns = fns
        split = np.array_split(np.arange(self.num_envs), num_workers)
        self._groups = [{int(i): fns[i] for i in ids} for ids in split]
        self._ranges = [range(int(ids[0]), int(ids[-1]) + 1) for ids in split]  # (array_split: contiguous)
        self._owner = [0] * self.num_envs  # env id -> its worker (a list: indexed per env per step)
        for w, group in enumerate(self._groups):
            for i in group:
                self._owner[i] = w
        self._pending: dict[int, float] = {}  # env id -> when its job was sent
        self._lockstep: tuple | None = None  # a lock-step batch being read: (chunks, workers sent to)
        self._ready: dict[int, tuple] = {}  # env id -> result not yet returned by recv
        self._lost: dict[int, dict] = {}  # idle envs whose worker was restarted -> their error info
        self._lost_reset: dict[int, dict] = {}  # SAME_STEP: lost envs being reset -> error info
        self._last_obs: list[Any] = [None] * self.num_envs  # what a masked reset returns for the others
        self._faults = 0
        # Garbage collection without close(): kill the workers (the list is shared, so restarts count).
        self._finalizer = weakref.finalize(self, WorkerVectorEnv._kill_all, self._workers)
        try:
            self._start_all()
            self._workers[0].send(("spaces", None))
            obs_space, act_space, metadata, render_mode = self._expect(self._workers[0], "spaces")
        except BaseException:
            self.close()
            raise
        #: a mixture's one curriculum controller (``benchmax/Mix-v0``), fed by every worker's episodes
        self.curriculum = self._adopt_curriculum()
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(act_space, self.num_envs)
        self.metadata = {**metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = render_mode  # (gym.make_vec sets self.spec)
        _LIVE.add(self)

    # -- a mixture's curriculum: one controller, here ---------------------------------------------

    def _adopt_curriculum(self) -> Any:
        """A mixture's controller (a copy of the first env's), held here: its envs then follow
        the levels it sends (each worker alone would see only its own episodes)."""
        from benchmax_gym.curriculum import Curriculum

        worker, first = self._workers[0], next(iter(self._groups[0]))
        worker.send(("call", ("curriculum", (), {}, [first])))
        controller = dict(self._expect(worker, "called"))[first]
        if isinstance(controller, Exception) and not isinstance(controller, AttributeError):
            # a mixture whose controller cannot come here (a lambda schedule cannot be pickled):
            # each worker would move its own levels from its own episodes, unseen
            self.close()
            raise ValueError(f"{self._env_name}'s curriculum cannot be sent from its workers to this process, which "
                             f"holds the one controller of a vector env ({controller}): give 'schedule' as a list "
                             "or a module-level function") from controller
        if not isinstance(controller, Curriculum):
            return None
        controller.follower = False
        for w in range(len(self._workers)):
            self._send_levels(w, controller)
        return controller

    def _send_levels(self, w: int, controller: Any = None) -> None:
        controller = controller or self.curriculum
        try:
            self._workers[w].send(("curriculum", controller.levels()))
        except WorkerLost:
            pass  # (its restart sends them again)

    def _feed_curriculum(self, infos: Sequence[dict]) -> None:
        """Each ended episode's report into the controller; the batch's infos get the whole
        batch's ``success_rate`` and ``zero_variance``; moved levels go to every worker."""
        controller, moved = self.curriculum, False
        for info in infos:
            if not isinstance(info, dict):
                continue
            if "final_info" in info and isinstance(info["final_info"], dict):
                info = info["final_info"]
            report = info.get("mix_episode")
            if report is None:
                continue
            moved |= controller.record(report["member"], report["level"], report["task_id"], report["reward"],
                                       report["success"], report["outcome"])
            info["success_rate"] = controller.members[report["member"]].success_rate()
            info["zero_variance"] = controller.zero_variance(report["member"], report["level"])
        if moved:
            for w in range(len(self._workers)):
                self._send_levels(w)

    def curriculum_stats(self) -> dict[str, Any] | None:
        """A mixture's per-member level, success rate and zero-variance shares over every worker (None: no mixture)."""
        return self.curriculum.stats() if self.curriculum is not None else None

    def get_mix_state(self) -> dict[str, Any]:
        """Every env's sampler state and the controller's, for :meth:`set_mix_state` on a resumed run."""
        return {"envs": list(self.get_attr("sampler_state")),
                "curriculum": self.curriculum.state_dict() if self.curriculum is not None else None}

    def set_mix_state(self, state: dict[str, Any]) -> None:
        self.set_attr("sampler_state", list(state["envs"]))
        if self.curriculum is not None and state.get("curriculum") is not None:
            self.curriculum.load_state_dict(state["curriculum"])
            for w in range(len(self._workers)):
                self._send_levels(w)

    # -- workers ------------------------------------------------------------------------------

    def _spawn(self, w: int, fresh: bool) -> Any:
        raise NotImplementedError

    def _wait(self, ws: list[int], timeout: float | None) -> list[int]:
        raise NotImplementedError

    def _start_all(self) -> None:
        """Start every worker, then wait for each to be ready (they start side by side)."""
        for w in range(len(self._groups)):
            self._workers.append(self._spawn(w, False))
        for worker in self._workers:
            self._expect(worker, "ready")

    def _start(self, w: int, fresh: bool) -> Any:
        worker = self._spawn(w, fresh)
        self._expect(worker, "ready")
        return worker

    def _expect(self, worker, kind: str, timeout: float = CALL_TIMEOUT) -> Any:
        try:
            got, payload = worker.recv(timeout)
        except TimeoutError:
            raise WorkerTimeout(f"{self._kind} {worker.pid} did not answer {kind!r} within {timeout:g} s") from None
        except WorkerLost as lost:
            raise WorkerLost(f"the {self._kind} for {self._env_name} was lost before answering {kind!r}: {lost}") from None
        if got == "failed":
            worker.kill()  # it is exiting by itself: reap it
            raise _build_failure(f"the {self._kind} could not build {self._env_name}", payload)
        if got != kind:
            raise RuntimeError(f"{self._kind} sent {got!r}, expected {kind!r}")
        return payload

    def _restart(self, w: int, reason: str) -> None:
        """Kill worker ``w``, start a fresh one; its environments' episodes end truncated."""
        self._check_closed_meanwhile()
        self._faults += 1
        self._workers[w].kill()
        self._workers[w] = self._start(w, fresh=True)
        if self._closed:  # (closed while it started: it goes too)
            self._workers[w].kill()
            self._check_closed_meanwhile()
        if getattr(self, "curriculum", None) is not None:
            self._send_levels(w)
        for i in self._groups[w]:
            sent = self._pending.pop(i, None)
            self._lost_reset.pop(i, None)
            info = {"error": f"{WORKER_RESTARTED}: {reason}", "outcome": ENV_ERROR,
                    "outcome_detail": outcome_detail(f"its worker was restarted: {reason}")}
            if sent is None and i not in self._ready:
                self._lost[i] = info  # idle: its next step reports the lost episode
                continue
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                info = {"final_obs": "", "final_info": info}
            self._ready[i] = ("", math.nan, False, True, info)
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            # SAME_STEP returns a fresh observation with the truncation: reset them now.
            restarted = [i for i in self._groups[w] if i in self._ready]
            if restarted:
                self._workers[w].send(("reset", [(i, None, None) for i in restarted]))
                for i, result in self._collect_now(w, set(restarted)).items():
                    self._ready[i] = (result[0], math.nan, False, True, {**self._ready[i][4], **result[-1]})
                    # (a reset that raised too is a 5-tuple: its error joins the info)

    def _collect_now(self, w: int, wanted: set[int]) -> dict[int, Any]:
        out: dict[int, Any] = {}
        while wanted - out.keys():
            results = self._expect(self._workers[w], "results")
            out.update(dict(results))
        return out

    @staticmethod
    def _kill_all(workers: list[Any]) -> None:
        for worker in workers:
            try:
                worker.kill()
            except Exception:
                pass

    # -- ready-first API --------------------------------------------------------------------------

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start a step of ``env_ids`` (default: all) with ``actions`` (one per id, in order)."""
        self._check_open()
        if env_ids is None:
            ids = list(range(self.num_envs))
        else:
            ids = np.asarray(env_ids, dtype=np.int64).reshape(-1).tolist()
            if len(set(ids)) != len(ids) or (ids and not (0 <= min(ids) and max(ids) < self.num_envs)):
                raise ValueError(f"env_ids must be distinct ids in 0..{self.num_envs - 1}")
        actions = list(actions)
        if len(actions) != len(ids):
            raise ValueError(f"{len(actions)} actions for {len(ids)} environments")
        if self._pending or self._ready:
            busy = [i for i in ids if i in self._pending or i in self._ready]
            if busy:
                raise RuntimeError(f"environments {busy} have a step in flight or a result not yet received")
        if not self._lost:  # nothing to report first: every action is a step
            if env_ids is None:
                self._dispatch_all(actions)
            else:
                self._dispatch("step", list(zip(ids, actions)))
            return
        jobs, resets = [], []
        for i, action in zip(ids, actions):
            error = self._lost.pop(i, None)
            if error is None:
                jobs.append((i, action))
            elif self.autoreset_mode == AutoresetMode.SAME_STEP:
                self._lost_reset[i] = error  # reset now; the result reports the truncation
                resets.append((i, None, None))
            else:
                self._ready[i] = ("", math.nan, False, True, error)
        self._dispatch("step", jobs)
        self._dispatch("reset", resets)

    def _dispatch(self, command: str, jobs: list[tuple]) -> None:
        """One message per worker for all of its environments' jobs."""
        by_worker: dict[int, list] = {}
        now, owner, pending = time.monotonic(), self._owner, self._pending
        for job in jobs:
            by_worker.setdefault(owner[job[0]], []).append(job)
            pending[job[0]] = now
        for w, batch in by_worker.items():
            try:
                self._workers[w].send((command, batch))
            except WorkerLost as lost:
                self._restart(w, str(lost))

    def _dispatch_all(self, actions: list[Any]) -> None:
        """``_dispatch("step", ...)`` for every env: each worker's envs are a range of ids."""
        now, pending = time.monotonic(), self._pending
        for w, ids in enumerate(self._ranges):
            pending.update(dict.fromkeys(ids, now))
            try:
                self._workers[w].send(("step", list(zip(ids, actions[ids.start:ids.stop]))))
            except WorkerLost as lost:
                self._restart(w, str(lost))

    def recv(self, min_ready: int = 1, timeout: float | None = None):
        """Results of at least ``min_ready`` stepped environments (all that are ready), with ids.

        Returns ``(obs, rewards, terminated, truncated, infos, env_ids)``; fewer than
        ``min_ready`` only when ``timeout`` (seconds) passes first.
        """
        self._check_open()
        outstanding = len(self._pending) + len(self._ready)
        if isinstance(min_ready, bool) or not isinstance(min_ready, int) or not 1 <= min_ready <= max(outstanding, 1):
            raise ValueError(f"min_ready must be an int from 1 to the {outstanding} environments in flight, got {min_ready!r}")
        timeout = seconds_arg("timeout", timeout, none="wait for them", zero=True)
        self._gather(min_ready, timeout)
        ids = sorted(self._ready)
        results = [self._ready.pop(i) for i in ids]
        for i, r in zip(ids, results):
            self._last_obs[i] = r[0]
        return (*self._batch(results), np.asarray(ids, dtype=np.int64))

    def _gather(self, min_ready: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        owner, pending, ready = self._owner, self._pending, self._ready
        counts: dict[int, int] = {}  # worker -> its envs in flight (kept, not recounted per message)
        recount = True  # after a restart, which changes what is in flight
        while len(self._ready) < min_ready and pending:
            if recount:
                counts, recount = {}, False
                for i in pending:
                    counts[owner[i]] = counts.get(owner[i], 0) + 1
            now = time.monotonic()
            waits = []
            if deadline is not None:
                waits.append(deadline - now)
            if self.step_timeout is not None:  # sent in time order: the first pending is the oldest
                waits.append(next(iter(pending.values())) + self.step_timeout - now)
            wait = max(0.0, min(waits)) if waits else None
            busy = sorted(w for w, count in counts.items() if count)
            heard = set()
            for w in self._wait(busy, wait):
                try:
                    messages = self._workers[w].recv_ready()
                except WorkerLost as lost:
                    self._restart(w, str(lost))
                    recount = True
                    continue
                heard.add(w)
                for kind, results in messages:
                    if kind == "batch":  # (what a lock-step step left when a worker failed)
                        results = list(_rows(unpack_results(results)))
                    if self._lost_reset:
                        results = [(i, self._lost_env_reset(i, result)) for i, result in results]
                    got = len(ready)
                    for i, result in results:
                        if pending.pop(i, None) is not None:  # (not a lost step's late result)
                            ready[i] = result
                    counts[w] -= len(ready) - got
            if self.step_timeout is not None and pending:
                now = time.monotonic()
                if now - next(iter(pending.values())) > self.step_timeout:
                    late = {owner[i] for i, sent in pending.items() if now - sent > self.step_timeout}
                    for w in late:
                        self._restart(w, f"a step took longer than step_timeout={self.step_timeout:g} s")
                    recount = True
            for w in busy:  # one that just answered is alive; it is checked on its next silence
                if w not in heard and not recount and counts.get(w) and not self._workers[w].alive():
                    self._restart(w, f"the {self._kind} died")
                    recount = True
            if deadline is not None and time.monotonic() >= deadline:
                break

    def _lost_env_reset(self, i: int, result: tuple) -> tuple:
        """A result as the parent returns it: the reset of a lost env (SAME_STEP) reports its loss."""
        error = self._lost_reset.pop(i, None) if i in self._pending else None
        if error is None:
            return result
        return result[0], math.nan, False, True, {"final_obs": "", "final_info": error, **result[-1]}  # (a reset
        # that raised too is a 5-tuple: its error joins the info)

    def _batch(self, results: list[tuple]):
        if not results:
            return (_stack(self.single_observation_space, []), np.zeros(0), np.zeros(0, dtype=np.bool_),
                    np.zeros(0, dtype=np.bool_), {})
        obs, rewards, terminated, truncated, infos = zip(*results)  # by columns, in C
        if self.curriculum is not None:
            self._feed_curriculum(infos)
        rewards = np.array(rewards, dtype=np.float64)
        batched = batch_infos(infos, len(results))
        # the rewards that are signal (a failed episode's is NaN, issue 29): rewards[info["scored"]]
        batched["scored"] = scored = rewards == rewards
        batched["_scored"] = np.ones_like(scored)
        return (_stack(self.single_observation_space, obs), rewards,
                np.array(terminated, dtype=np.bool_), np.array(truncated, dtype=np.bool_), batched)

    # -- Gymnasium vector API ---------------------------------------------------------------------

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict | Sequence[dict] | None = None):
        """Reset all environments (or those in ``options["reset_mask"]``).

        ``seed``: an int gives environment ``i`` the seed ``seed + i``. ``options``: one dict
        for all, or a list with one dict per environment (``[{"task_index": 3}, ...]``).
        """
        self._check_open()
        seeds = [None] * self.num_envs if seed is None else (
            [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed))
        if len(seeds) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds for num_envs={self.num_envs}")
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if isinstance(options, dict) and "reset_mask" in options:
            options = dict(options)
            mask = np.asarray(options.pop("reset_mask"))
            if mask.shape != (self.num_envs,) or mask.dtype != np.bool_ or not mask.any():
                raise ValueError(f"options['reset_mask'] must be a bool array of shape ({self.num_envs},) with a True")
        per_env = list(options) if isinstance(options, (list, tuple)) else [options] * self.num_envs
        if len(per_env) != self.num_envs:
            raise ValueError(f"got {len(per_env)} option dicts for num_envs={self.num_envs}")
        self._drain()
        ids = [i for i in range(self.num_envs) if mask[i]]
        for i in ids:
            self._lost.pop(i, None)  # a reset starts afresh anyway
        jobs, workers = [(i, seeds[i], per_env[i]) for i in ids], list(self._workers)
        self._dispatch("reset", jobs)
        self._gather(len(ids), None)
        renewed = {w for w, worker in enumerate(workers) if self._workers[w] is not worker}
        if renewed:  # a worker was lost (dead since the last call, say): its envs reset once more on
            # the fresh one, with their seeds and options (a reset has no episode to lose; reported
            # as lost, their seeds were lost too and the next step reset them unseeded)
            again = [job for job in jobs if self._owner[job[0]] in renewed]
            for i, *_ in again:
                self._ready.pop(i, None)
                self._lost.pop(i, None)
            self._dispatch("reset", again)
            self._gather(len(ids), None)
        results = [self._ready.pop(i) for i in ids]
        obs_list = [r[0] for r in results]
        if self.curriculum is not None:  # (a lost env's reset reports its episode in final_info)
            self._feed_curriculum([r[-1] for r in results])
        infos = batch_infos([r[-1] if isinstance(r[-1], dict) else {} for r in results], self.num_envs, ids)
        for i, o in zip(ids, obs_list):
            self._last_obs[i] = o
        obs_list = list(self._last_obs)
        obs = _stack(self.single_observation_space, obs_list)
        return obs, infos

    def step(self, actions: Any):
        """Lock-step: every environment steps; results in environment order."""
        self._check_open()
        self._drain()
        if not (self._lost or self._lost_reset) and self.curriculum is None:
            actions = list(actions)
            if len(actions) != self.num_envs:
                raise ValueError(f"{len(actions)} actions for {self.num_envs} environments")
            with _collections_paused():
                batch = self._step_all(actions)
            if batch is not None:
                return batch
            # a worker failed or results came out of order: what arrived is ready, the rest pending (as after send())
        else:
            self.send(actions)
        self._gather(self.num_envs, None)
        results = list(map(self._ready.pop, range(self.num_envs)))
        batch = self._batch(results)
        self._last_obs = list(batch[0]) if type(batch[0]) is tuple else [r[0] for r in results]
        return batch

    def _step_all(self, actions: list[Any]) -> tuple | None:
        """The lock-step batch in columns: each worker steps its range of envs and answers with
        column messages (``pack_results``), which the parent joins without a Python step per env
        (the parent's serial work is what caps many workers). None when a worker was lost or
        late: what arrived is then in ``_ready`` and the rest in ``_pending``, for ``_gather``
        to restart and report as always."""
        now, ranges = time.monotonic(), self._ranges
        chunks: list[list[tuple]] = [[] for _ in ranges]
        left = [len(ids) for ids in ranges]
        failed, sent, lost = False, [], {}  # lost: worker -> why its messages stopped (restarted below)
        self._lockstep = (chunks, sent)  # (an interrupted step leaves it: its results are not the next step's)
        for w, ids in enumerate(ranges):
            try:
                self._workers[w].send(("step_all", (ids.start, actions[ids.start:ids.stop])))
                sent.append(w)
            except WorkerLost:  # (the others step on; _gather restarts this one)
                failed = True
        if self._blocking_reads and self.step_timeout is None and not failed:
            # Nothing to time out: read each worker's messages in turn, no poll per message (a dead
            # worker's pipe reads as its end, WorkerLost); what others send meanwhile waits in their pipes.
            for w, worker in enumerate(self._workers):
                while left[w] > 0 and not failed:
                    try:
                        kind, payload = worker._read()
                    except WorkerLost as error:
                        failed, lost[w] = True, str(error)
                        break
                    if kind != "batch":
                        failed = True
                        break
                    chunk = unpack_results(payload)
                    chunks[w].append(chunk)
                    left[w] -= len(chunk[0])
                if failed:
                    break
        busy = [w for w, count in enumerate(left) if count]
        while busy and not failed:
            wait = None if self.step_timeout is None else max(0.0, now + self.step_timeout - time.monotonic())
            heard = self._wait(busy, wait)
            for w in heard:
                try:
                    messages = self._workers[w].recv_ready()
                except WorkerLost as error:
                    failed, lost[w] = True, str(error)
                    break
                for kind, payload in messages:
                    if kind != "batch":  # (not what step_all answers)
                        failed = True
                        break
                    chunk = unpack_results(payload)
                    chunks[w].append(chunk)
                    left[w] -= len(chunk[0])
            if not heard and self.step_timeout is not None and time.monotonic() - now > self.step_timeout:
                failed = True
            for w in busy:  # one that just answered is alive; it is checked on its next silence
                if w not in heard and left[w] and not self._workers[w].alive():
                    failed = True
            busy = [w for w in busy if left[w] > 0]
        self._lockstep = None
        if not failed and not any(left):
            batch = self._batch_columns([chunk for per_worker in chunks for chunk in per_worker])
            if batch is not None:
                return batch
        for per_worker in chunks:  # the general path from here: rows of what arrived, the rest pending
            for chunk in per_worker:
                for i, result in _rows(chunk):
                    self._ready[i] = result
        self._pending.update((i, now) for i in range(self.num_envs) if i not in self._ready)
        for w, why in lost.items():  # (one alive whose message could not be read would wait for ever)
            self._restart(w, why)
        return None

    def _batch_columns(self, chunks: list[tuple]) -> tuple | None:
        """The batch from every env's results in column messages, in env order (None when they
        came out of order, as an env that awaits may finish after a later one): the workers
        built each slice's arrays and masks, the parent joins them (``join_columns``)."""
        obs: list[Any] = []
        parts = []
        for chunk in chunks:
            chunk_ids = chunk[0]
            if type(chunk_ids) is not range or chunk_ids.start != len(obs):
                return None
            parts.append((chunk_ids.start, len(chunk_ids), chunk[5]))
            obs += chunk[1]
        if len(obs) != self.num_envs:
            return None
        self._last_obs = obs
        infos = join_columns(parts, self.num_envs)
        rewards, terminated, truncated = result_arrays(chunks)
        # the rewards that are signal (a failed episode's is NaN, issue 29): rewards[info["scored"]]
        infos["scored"] = scored = rewards == rewards
        infos["_scored"] = np.ones_like(scored)
        return _stack(self.single_observation_space, obs), rewards, terminated, truncated, infos

    def _drain(self) -> None:
        """Finish what a ready-first caller left in flight before a lock-step call, or what an
        interrupted ``step()`` (Ctrl-C) left unread: those results are dropped, not taken for the
        next call's."""
        if self._lockstep is not None:
            chunks, sent = self._lockstep
            self._lockstep = None
            got = {i for per_worker in chunks for chunk in per_worker for i in chunk[0]}
            now = time.monotonic()
            self._pending.update((i, now) for w in sent for i in self._ranges[w] if i not in got)
        if self._pending:
            self._gather(len(self._pending) + len(self._ready), None)
        self._ready.clear()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name(*args, **kwargs)`` on every environment (or read it, if not callable)."""
        return self._call(name, args, kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self._call(name, (), {})

    def _call(self, name, args, kwargs) -> tuple[Any, ...]:
        self._check_open()
        self._drain()
        out: dict[int, Any] = {}
        for answer in self._ask_all("call", name, lambda w: (name, args, kwargs, list(self._groups[w]))):
            out.update(dict(answer))
        for value in out.values():
            if isinstance(value, Exception):
                raise value
        return tuple(out[i] for i in range(self.num_envs))

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open()
        values = list(values) if isinstance(values, (list, tuple)) else [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"got {len(values)} values for num_envs={self.num_envs}")
        self._drain()  # (a ready-first step's results would come before the answers)
        answers = self._ask_all("set_attr", name, lambda w: (name, [(i, values[i]) for i in self._groups[w]]))
        refused = [error for answer in answers for _, error in answer]
        if refused:  # (an env's own error, as SyncVectorEnv raises it)
            raise refused[0]

    def _ask_all(self, command: str, name: str, payload: Callable[[int], Any]) -> list[Any]:
        """Every worker's answer to ``(command, payload(w))`` (``name``: the attribute), within
        ``CALL_TIMEOUT`` (or ``step_timeout``, if longer) for them all. A lost worker is raised
        only once the others' answers are read: one left unread would be taken for the next
        step's results. A worker still silent then (an env method that blocks) is restarted, as
        a lost one is (its envs' episodes end truncated; its late answer would be taken for the
        next call's), and the call raises ``WorkerTimeout`` naming it."""
        timeout = max(CALL_TIMEOUT, self.step_timeout or 0.0)
        asked, lost, late = [], None, []
        for w, worker in enumerate(self._workers):
            try:
                worker.send((command, payload(w)))
                asked.append(w)
            except WorkerLost as error:
                lost = lost or error
        deadline = time.monotonic() + timeout
        answers = []
        for w in asked:
            try:
                answers.append(self._expect(self._workers[w], "called", max(0.0, deadline - time.monotonic())))
            except WorkerLost as error:
                lost = lost or error
            except WorkerTimeout:
                late.append((w, self._workers[w].pid))
        for w, _ in late:
            self._restart(w, f"it did not answer {command} {name!r} within {timeout:g} s")
        if late:
            which = ", ".join(f"{w} (pid {pid})" for w, pid in late)
            envs = [i for w, _ in late for i in self._groups[w]]
            raise WorkerTimeout(
                f"{self._kind} {which} of {self._env_name} did not answer {command} {name!r} within {timeout:g} s (an "
                f"env method that blocks?) and was restarted: envs {envs} end their episodes truncated at their next "
                "step") from lost
        if lost is not None:
            raise lost
        return answers

    @property
    def worker_pids(self) -> list[int]:
        """Each worker's process id (a Ray host's, on its node)."""
        return [w.pid for w in self._workers]

    @property
    def faults(self) -> int:
        """How many times a worker was restarted."""
        return self._faults

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")

    def _check_closed_meanwhile(self) -> None:
        """A step (ready-first call, reset...) whose workers another thread's ``close()`` killed
        ends here, saying so: not an ``IndexError`` nor a worker restarted after the close."""
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} was closed (by another thread) while a call was in flight")

    def close_extras(self, **kwargs: Any) -> None:
        """Ask workers to close their environments and give them ``CLOSE_GRACE_S`` to; kill at
        once those that do not hear it within ``CLOSE_ANSWER_S`` (stuck in a synchronous step:
        a tool blocked in C, a ``time.sleep`` without a tool timeout), and any left at the end."""
        self._closed = True
        workers = getattr(self, "_workers", [])  # (kept: a call in flight in another thread reads them, killed)
        for worker in workers:
            worker.close()
        if HEARS_CLOSE:
            fds = {worker: worker.fileno() for worker in workers}  # (None: never connected, or killed)
            answer_by = time.monotonic() + CLOSE_ANSWER_S
            heard: set[int] = set()
            waiting = [fd for fd in fds.values() if fd is not None]
            while waiting and time.monotonic() < answer_by:
                heard |= ended(waiting, answer_by - time.monotonic())
                waiting = [fd for fd in waiting if fd not in heard]
            self._kill_all([worker for worker, fd in fds.items() if fd not in heard])
        deadline = time.monotonic() + CLOSE_GRACE_S
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        self._kill_all(workers)


ENVS_PER_WORKER = 16  # the default's K: see default_workers


def default_workers(num_envs: int) -> int:
    """The default ``num_workers``: ``min(cpu_count, num_envs, max(1, num_envs // 16))``.

    Each worker costs the parent, serially, a message to send and one to read and join per
    batch (``b``: 8-22 us of parent CPU per batch in lock-step on 2 cores, 2026-11-27), while it
    saves worker time in parallel: the W-th worker pays while ``W * (W - 1) <= num_envs * t / b``
    (``t``, a calculator step in a worker: 16-20 us), about ``0.7-2.5 * num_envs``; at 16 envs per worker
    or more the default stays at or below that optimum, not past it where more workers are
    slower (16 cores, 64 envs: 4 workers 128k steps/s, 16 workers 115k).
    Envs slower to step (real tools, model code) gain from more: pass ``num_workers``."""
    return max(1, min(os.cpu_count() or 1, num_envs, num_envs // ENVS_PER_WORKER))


def _preload_forkserver_exit(ctx: Any) -> None:
    """Have the fork server (when it starts) import :mod:`.forkserver_exit`, besides what it
    preloads already: a vector env's process killed left its ``pymp-*`` directory and socket."""
    from multiprocess import forkserver

    preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    if FORKSERVER_EXIT not in preload:
        ctx.set_forkserver_preload([*preload, FORKSERVER_EXIT])


FORKSERVER_EXIT = "benchmax_gym.wrappers.forkserver_exit"


class SubprocVectorEnv(WorkerVectorEnv):
    """Vectorised environments in worker processes.

    Args:
        env: an environment id (made with ``gym.make(env, **env_kwargs)`` in the workers), a
            function that makes one, or a list of such functions.
        num_envs: how many environments.
        num_workers: worker processes (default :func:`default_workers`: the number of CPUs, at
            most one per 16 environments); environments are spread evenly over them.
        autoreset_mode: ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (an
            :class:`~gymnasium.vector.AutoresetMode` or its value).
        step_timeout: seconds an environment may take for one step or reset before its worker is
            killed and restarted (``None``: no limit; at most ``WAIT_MAX_S``, 2,000,000). ``call``/``get_attr``/``set_attr`` wait
            ``CALL_TIMEOUT`` (120 s), or ``step_timeout`` if longer, then restart the workers that
            did not answer (their envs end truncated) and raise ``WorkerTimeout``.
        context: the multiprocess start method (``"fork"``, ``"forkserver"``, ``"spawn"``). A
            spawned or forkserver worker gets the ids registered in this process in Python (a
            script's ``register_tool_env``), their tools and rubrics by value (cloudpickle).
        info_keys: the keys of each environment's info to return, e.g. ``["reward_components",
            "error"]`` (default ``None``: all). The others never leave the workers: a training
            loop that reads a few keys gets a lighter batch (the transcript messages and tool
            calls are most of an info; 64 calculator envs stepped about a third faster).
            ``final_obs``/``final_info`` stay (``final_info`` filtered alike), ``outcome`` is
            always kept, and an env whose worker was lost still reports its ``error``.
        **env_kwargs: ``gym.make`` keyword arguments, with an id.
    """

    def __init__(
        self,
        env: str | Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
        num_envs: int | None = None,
        *,
        num_workers: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = None,
        context: str | None = None,
        info_keys: Sequence[str] | None = None,
        **env_kwargs: Any,
    ):
        fns = _env_fns(env, num_envs, env_kwargs, type(self))
        if num_workers is None:
            num_workers = default_workers(len(fns))
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or not 1 <= num_workers <= len(fns):
            raise ValueError(f"num_workers must be an int from 1 to num_envs={len(fns)}, got {num_workers!r}")
        one_of(None, *mp.get_all_start_methods())("context", context)  # (mp's own error named no argument)
        self._ctx = mp.get_context(context)
        if self._ctx.get_start_method() == "forkserver":
            _preload_forkserver_exit(self._ctx)
        self._env_id = env if isinstance(env, str) else None
        self._registered: dict[str, bytes] | None = None  # (driver_registrations: made once, for every worker)
        self._setup(env, fns, num_workers, autoreset_mode, step_timeout, info_keys)

    _blocking_reads = True  # a pipe: a dead worker's end reads as EOF at once

    def _spawn(self, w: int, fresh: bool) -> _Process:
        return _Process(self._ctx, self._worker_fns(w), self.autoreset_mode, fresh, self.info_keys)

    def _worker_fns(self, w: int) -> Any:
        """Worker ``w``'s environment functions. A forked worker inherits this process's registry;
        a spawned or forkserver one is a fresh process, so the ids registered here in Python (in
        a script's ``__main__``) go with them, by value (cloudpickle, as to a Ray host: dill, which
        ``multiprocess`` sends the rest with, fails on a tool's argument model)."""
        if self._ctx.get_start_method() == "fork":
            return self._groups[w]
        if self._registered is None:
            self._registered = driver_registrations(cloudpickle.dumps, self._env_id, "a worker process (cloudpickle)")
        return functools.partial(with_registrations, self._registered, self._groups[w])

    def _wait(self, ws: list[int], timeout: float | None) -> list[int]:
        ahead = [w for w in ws if self._workers[w].has_message()]  # (read already: the pipe does not show it)
        if ahead:
            return ahead
        fds = {self._workers[w].fd: w for w in ws}
        if -1 in fds:  # (a killed worker's: closed by another thread; its read says so, where poll would ignore it)
            return [fds[-1]]
        return [fds[fd] for fd in readable(list(fds), timeout)]


def _rows(chunk: tuple):
    """``(env id, result)`` pairs of a column message (``pack_results``), as rows."""
    ids, obs, _, _, _, packed = chunk
    rewards, terminated, truncated = result_arrays([chunk])
    results = zip(obs, rewards.tolist(), terminated.tolist(), truncated.tolist(), unpack_columns(packed, len(ids)))
    return zip(list(ids), results)


_LIVE: "weakref.WeakSet[WorkerVectorEnv]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for envs in list(_LIVE):
        try:
            envs.close()
        except Exception:
            pass
