"""The worker side of the vector envs: the loop that owns some environments and runs the parent's
commands on them, in a worker process (``SubprocVectorEnv``) or an env host (``RayVectorEnv``)."""

from __future__ import annotations

import asyncio
import functools
import gc
from array import array
import marshal
import math
import os
from operator import itemgetter
import pickle
import signal
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

import numpy as np

from benchmax_gym.core.aio import LAST_WORD_LOST, Outbox, OwnLoop, say_last_word_lost
from benchmax_gym.core.env import fewer_collections
from benchmax_gym.core.outcomes import outcome_detail
from benchmax_gym.core.sandbox import remove_tree

from .batching import _pack_column, defer_columns, pack_columns

# Wrappers gym.make adds by default; behind only these, a worker may call the env's own astep.
_TRANSPARENT_WRAPPERS = ("OrderEnforcing", "PassiveEnvChecker")
ENV_ERROR, WORKER_RESTARTED = "env_error", "worker_restarted"
MIX_INFO_KEYS = ("member", "mix_episode")  # a mixture's (benchmax/Mix-v0) reports for the parent's controller
FLUSH_EVERY = 256  # results per message at most, when one command steps many envs
# ... and in a lock-step batch's column messages: fewer, bigger messages cost the parent less
# (each is a wake-up, a read and a merge; 1,024 envs over 2 workers: 0.6-0.8 us of parent CPU per
# env step instead of 1.0 with 256)
COLUMN_FLUSH_EVERY = 1024
# What an env's own code may raise that ends its episode, not its worker: sys.exit() in a tool
# (argparse or click given a model's bad arguments) or a stray KeyboardInterrupt (Ctrl-C is the
# parent's: workers ignore SIGINT) took the worker down, and every env it held.
ENV_FAULTS = (Exception, SystemExit, KeyboardInterrupt)


def async_api(env: gym.Env) -> Any | None:
    """The env's own coroutine API, when nothing but Gymnasium's default wrappers sit above it."""
    layer = env
    while isinstance(layer, gym.Wrapper):
        if type(layer).__name__ not in _TRANSPARENT_WRAPPERS:
            return None
        layer = layer.env
    return layer if hasattr(layer, "astep") and hasattr(layer, "areset") else None


class _Worker:
    """Owns some environments and runs the parent's commands on them, in whatever hosts it: a
    worker process (reading a pipe) or a Ray actor's thread (reading a socket). ``emit`` sends a
    message back.

    Commands are handled while earlier steps still run on ``loop``, so a ready-first caller can
    hand a finished environment its next action at once; results that finish in the same loop
    turn go back in one message.
    """

    def __init__(self, env_fns: dict[int, Callable[[], gym.Env]], mode: AutoresetMode, fresh: bool,
                 emit: Callable[[Any], None], loop: asyncio.AbstractEventLoop, keep: tuple[str, ...] | None = None):
        self.env_fns = env_fns
        self.mode = mode
        self.keep = keep  # the info keys that leave the worker (None: all)
        self.kept_keys = None if keep is None else tuple(dict.fromkeys(keep))  # (each once, in order)
        self.emit = emit
        self.envs: dict[int, gym.Env] = {}
        self.api: dict[int, Any] = {}
        self.plain: dict[int, bool] = {}
        self.stepper: dict[int, Callable[[Any], tuple]] = {}
        self.loop = loop
        for i in env_fns:
            self._build(i)
        # A restarted worker's environments were never reset: the next step resets them.
        self.needs_reset = {i: fresh for i in env_fns}
        self.outbox: list[tuple[int, Any]] = []
        self.flush_scheduled = False
        self.columnar = False  # results go back as columns (a lock-step "step_all"), else as rows
        self.unsent: set[int] = set()  # envs whose result could not be sent, their episode's end in flight
        self.levels: Any = None  # a mixture's levels as the parent last sent them (a rebuilt env follows them too)

    def _build(self, i: int) -> None:
        env = self.env_fns[i]()
        self.envs[i] = env
        self.api[i] = async_api(env)
        self.plain[i] = self.api[i] is None or not getattr(self.api[i], "needs_event_loop", True)
        # Behind Gymnasium's default wrappers alone, a step skips them, as an async step does: the
        # worker resets an env before it steps (OrderEnforcing's check), and the passive checker
        # only looks at a first step. 1.2-1.6 us of a calculator step's 9.5-12 in a worker.
        self.stepper[i] = env.step if self.api[i] is None else self.api[i].step
        own = getattr(self.api[i], "aio", None) if not self.plain[i] else None
        if isinstance(own, OwnLoop):  # its async resources live on this loop: no hop per call
            try:
                own.adopt(self.loop)
            except RuntimeError:  # async work already alive on its own loop: it stays there (a hop per call)
                pass

    # Both coroutines below only await when the env has async work (plain[i] is False); for
    # plain envs they finish in one go and are driven by _finish_now without a Task.

    async def _reset(self, i: int, seed: int | None, options: dict | None):
        env, api = self.envs[i], self.api[i]
        self.needs_reset[i] = True  # until it succeeds: after a reset that raised, no step plays on
        # whatever episode the env was left with (the old one, or none); its next step resets it
        if self.plain[i]:
            result = env.reset(seed=seed, options=options)
        else:
            result = await api.areset(seed=seed, options=options)
            layer = env
            while isinstance(layer, gym.Wrapper):  # the reset bypassed OrderEnforcing: tell it
                if hasattr(layer, "_has_reset"):
                    layer._has_reset = True
                layer = layer.env
        self.needs_reset[i] = False
        return result

    async def _step(self, i: int, action: Any):
        if self.needs_reset[i] and self.mode != AutoresetMode.DISABLED:  # (SAME_STEP: its reset failed)
            obs, info = await self._reset(i, None, None)
            return obs, 0.0, False, False, info
        try:
            if self.plain[i]:
                result = self.stepper[i](action)
            else:
                result = await self.api[i].astep(action)
        except ENV_FAULTS as exc:
            return await self._broken(i, exc)
        return await self._after(i, result)

    async def _after(self, i: int, result: tuple):
        """A step's result as the parent gets it; an episode that ended resets now (SAME_STEP)
        or at its next step (NEXT_STEP)."""
        try:
            obs, reward, terminated, truncated, info = result
            if terminated or truncated:
                if self.mode == AutoresetMode.SAME_STEP:
                    final_obs, final_info = obs, info
                    try:
                        obs, info = await self._reset(i, None, None)
                    except ENV_FAULTS as exc:  # the episode's result stands; the env is rebuilt, the error reported
                        obs, _, _, _, info = await self._broken(i, exc)
                        info = {**{k: v for k, v in info.items() if k not in ("final_obs", "final_info")},
                                "error": info["final_info"]["error"]}
                    info = {"final_obs": final_obs, "final_info": final_info, **info}  # (Gymnasium's order)
                elif self.mode == AutoresetMode.NEXT_STEP:
                    self.needs_reset[i] = True
            return obs, float(reward), bool(terminated), bool(truncated), info
        except ENV_FAULTS as exc:
            return await self._broken(i, exc)

    async def _broken(self, i: int, exc: Exception):
        """The env raised: rebuild it; its episode ends truncated, with the error in the info."""
        error = _env_error(exc)
        error["traceback"] = "".join(traceback.format_exception(exc, limit=5))
        try:
            self.envs[i].close()
        except ENV_FAULTS:
            pass
        self._build(i)
        if self.levels is not None:  # a mixture: it follows the parent's controller, at its levels
            self._follow_levels(self.envs[i])
        self.needs_reset[i] = True
        if self.mode == AutoresetMode.SAME_STEP:
            try:
                obs, info = await self._reset(i, None, None)
            except ENV_FAULTS as again:  # (the env's own error stays the one reported; its next step resets it)
                obs, info = "", {"error": f"{ENV_ERROR}: {_said(again)}"}
            return obs, math.nan, False, True, {"final_obs": "", "final_info": error, **info}
        return "", math.nan, False, True, error

    def _step_plain(self, i: int, action: Any) -> None:
        """``_step`` for a plain env that needs no reset, without a coroutine when its episode
        goes on (the common step)."""
        try:
            obs, reward, terminated, truncated, info = result = self.stepper[i](action)
            if not (terminated or truncated):
                result = (obs, float(reward), False, False, info)
                ended = False
            else:
                ended = True
        except ENV_FAULTS as exc:
            self._start(i, self._broken(i, exc))
            return
        if ended:
            self._start(i, self._after(i, result))
        else:
            self._deliver(i, result)

    def _in_one_loop(self, ids: range) -> bool:
        """Whether a lock-step slice can take ``_step_slice``: every env plain."""
        return all(map(self.plain.__getitem__, ids))

    def _step_slice(self, start: int, actions: list) -> None:
        """A lock-step slice whose envs are all plain (the common batch): one loop steps them and
        their results go back as one column message, without the per-env delivery of
        ``_step_plain`` (a third of a worker's own cost per calculator step). An env due a reset
        (NEXT_STEP, after its episode ended: every env at once in lock-step) takes ``_step``,
        as in the general path. Same message, value for value, as the general path's."""
        stepper, due, rows, ended, settled = self.stepper, self.needs_reset, [], [], True  # settled: every row mid-episode
        # info_keys: each env's info is cut to its kept values as it comes (below), not kept whole
        # until the batch is sent: its memory is reused by the next env's step while in cache, and
        # the collector's young passes find fewer objects (2-core dev machine, 64 calculator envs,
        # benchmarks/worker_loop.py --info keys: ~11.7 -> ~10.3 us of CPU per env step)
        cutting, cut, whole = self.keep is not None, None, []  # cut: (kept keys present, their getter,
        # those absent), from the first info; whole: the rows not cut
        for i, action in enumerate(actions, start):
            if due[i]:  # (its result is final: reset, or the failed reset's)
                rows.append(self._finish_now(self._step(i, action)))
                whole.append(i - start)
                settled = False
                continue
            try:
                result = stepper[i](action)
                obs, reward, terminated, truncated, info = result  # (not five values: the env failed, as in _step_plain)
                if terminated or truncated:
                    ended.append(i - start)
                    rows.append(result)
                    continue
            except ENV_FAULTS as exc:
                rows.append(self._finish_now(self._broken(i, exc)))
                whole.append(i - start)
                settled = False
                continue
            if cutting:  # (as the first info's kept keys: every other info must have the same)
                values = _WHOLE
                if type(info) is dict and "final_info" not in info:  # (a defaultdict would make up keys)
                    cut = cut or self._cut_like(info)
                    try:
                        values = cut[1](info) if cut[2].isdisjoint(info) else _WHOLE
                    except KeyError:  # (it lacks a kept key the first has)
                        pass
                if values is _WHOLE:
                    whole.append(i - start)
                else:
                    result = (obs, reward, terminated, truncated, values)
            rows.append(result)
        for j in ended:  # (an env's reset, SAME_STEP, touches no other env: after the loop is alike)
            rows[j], settled = self._finish_now(self._after(start + j, rows[j])), False
        whole += ended
        try:
            rewards = array("d", [row[1] for row in rows])
        except TypeError:  # (not a float: float() per env, as the general path, or the env failed)
            for j, row in enumerate(rows):
                try:
                    rows[j] = (row[0], float(row[1]), *row[2:])
                except (TypeError, ValueError) as exc:
                    rows[j], settled = self._finish_now(self._broken(start + j, exc)), False
                    whole.append(j)
            rewards = array("d", [row[1] for row in rows])
        obs, _, terminated, truncated, infos = zip(*rows)
        if settled:
            terminated = truncated = bytes(len(rows))
        else:
            terminated, truncated = bytes(map(bool, terminated)), bytes(map(bool, truncated))
        try:
            columns = pack_columns(infos) if self.keep is None else self._kept_columns(infos, set(whole), cut)
            self.emit(("batch", _marshalled(((start, start + len(rows)), list(obs), rewards.tobytes(),
                                             terminated, truncated, columns))))
        except Exception:  # (a result that cannot be pickled: the per-env path ends that env's episode alone)
            whole = set(whole)
            for j, row in enumerate(rows):
                self._deliver(start + j, row if self.keep is None or j in whole else (*row[:4], _uncut(cut, row[4])))

    def _cut_like(self, info: dict) -> tuple:
        """How ``_step_slice`` cuts an info with ``info``'s kept keys: ``(present, getter, absent)``,
        ``getter(info)`` their values (one bare value when one key is present)."""
        present = tuple(key for key in self.kept_keys if key in info)
        getter = itemgetter(*present) if present else _no_values
        return present, getter, frozenset(self.kept_keys).difference(present)

    def _kept_columns(self, infos: tuple, whole: set[int], cut: tuple | None) -> list[tuple]:
        """``pack_columns`` of the infos cut to the kept keys, as ``_kept`` cuts them (``_step_slice``
        cut each info but those at ``whole`` as it came: ``cut``): column by column when every
        info has the same kept keys (mid-episode), else info by info."""
        given, infos = infos, list(infos)
        if whole:  # (a reset, an end, a failure: whole infos, cut here if they can be)
            for j in whole:
                info, values = infos[j], _WHOLE
                if type(info) is dict and "final_info" not in info:
                    cut = cut or self._cut_like(info)
                    try:
                        values = cut[1](info) if cut[2].isdisjoint(info) else _WHOLE
                    except KeyError:
                        pass
                if values is _WHOLE:  # (some infos lack a kept key others have)
                    return pack_columns([self._kept(info) if j in whole else _uncut(cut, info)
                                         for j, info in enumerate(given)])
                infos[j] = values
        present, index = cut[0], list(range(len(infos)))
        if len(present) == 1:
            return [(present[0], *_pack_column(present[0], infos, index, index), None)]
        return [(key, *_pack_column(key, list(column), index, index), None)
                for key, column in zip(present, zip(*infos))]

    def _start(self, i: int, job) -> None:
        if self.plain[i]:
            self._deliver(i, self._finish_now(job))
        else:
            task = self.loop.create_task(_guarded(job))
            task.add_done_callback(lambda t, i=i: self._deliver(i, self._outcome(t)))

    @staticmethod
    def _finish_now(job) -> Any:
        try:
            job.send(None)
        except StopIteration as done:
            return done.value
        except ENV_FAULTS as exc:  # a reset that raised
            return _raised(exc)
        job.close()
        raise RuntimeError("a plain environment awaited")

    @staticmethod
    def _outcome(task: asyncio.Task) -> Any:
        try:
            return task.result()
        except Exception as exc:  # a reset that raised
            return _raised(exc)

    def _deliver(self, i: int, result: Any) -> None:
        if self.keep is not None:
            result = (*result[:-1], self._kept(result[-1]))
        self.outbox.append((i, result))
        # a big batch streams: the parent unpacks while this steps on
        if len(self.outbox) >= (COLUMN_FLUSH_EVERY if self.columnar else FLUSH_EVERY):
            self._flush()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _kept(self, info: dict) -> dict:
        out = {}
        if "final_info" in info:  # SAME_STEP's record of the episode that ended, kept alike
            out["final_obs"], out["final_info"] = info.get("final_obs"), self._kept(info["final_info"])
        out.update((key, info[key]) for key in self.keep if key in info)
        return out

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.outbox:
            out, self.outbox = self.outbox, []
            try:
                try:
                    self.emit(("batch", pack_results(out)) if self.columnar else ("results", out))
                except Exception:  # (a result that cannot be pickled: that env's alone)
                    out = self._sendable(out)
                    if out:  # (infos left to the message's pickling: an env host's by value, see emit_to)
                        self.emit(("batch", pack_results(out, defer=False)) if self.columnar else ("results", out))
                else:
                    if self.unsent:
                        self.unsent.difference_update(i for i, _ in out)
            except Exception as exc:  # (run by the loop, outside any command: the parent must hear of it)
                self.crash(exc)

    def _sendable(self, rows: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """The rows whose results pickle. Each other env's episode ends as if it had raised, with
        what could not be sent (a lock, a generator, a lambda in its info): its neighbours'
        results go on, and the parent learns which env and which value (once the worker died,
        and every env it held, with no env named)."""
        good = []
        for i, result in rows:
            try:
                self.dumps(result)
            except Exception as exc:
                problem = TypeError(f"env {i}'s result cannot be sent to the parent: {_unpicklable(result, self.dumps)} "
                                    f"{type(exc).__name__}: {exc}")
                if i not in self.unsent:  # rebuilt, and reset now under SAME_STEP (its result comes next)
                    self.unsent.add(i)
                    self._start(i, self._broken(i, problem))
                    continue
                # SAME_STEP: the reset that replaced it cannot be sent either; the error alone (the env is reset)
                error = _env_error(problem)
                result = ("", math.nan, False, True,
                          {"final_obs": "", "final_info": error, "error": error["error"]})
            self.unsent.discard(i)
            good.append((i, result))
        return good

    dumps: Callable[[Any], bytes] = staticmethod(functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL))

    def crash(self, exc: BaseException) -> None:
        """A command, or sending its results, failed in the worker itself (not one env's result
        that cannot be pickled: ``_sendable``): its host reports it and stops, so the parent
        restarts the worker and reports this error rather than waiting for results that will not
        come."""
        raise exc

    def handle(self, command: str, payload: Any) -> None:
        """Run one command of the parent's (all but ``close``, which belongs to the host)."""
        if command in ("step", "step_all"):
            self.columnar = command == "step_all"
            if self.columnar:  # lock-step: envs start, start + 1, ...; results go back in columns
                start, actions = payload
                ids = range(start, start + len(actions))
                if self._in_one_loop(ids):
                    self._flush()
                    for at in range(0, len(actions), COLUMN_FLUSH_EVERY):
                        self._step_slice(start + at, actions[at:at + COLUMN_FLUSH_EVERY])
                    return
                payload = zip(ids, actions)
            plain, needs_reset = self.plain, self.needs_reset
            for i, action in payload:
                if plain[i] and not needs_reset[i]:
                    self._step_plain(i, action)
                else:
                    self._start(i, self._step(i, action))
        elif command == "reset":
            self.columnar = False
            for i, seed, options in payload:
                self._start(i, self._reset(i, seed, options))
        elif command == "call":
            name, args, kwargs, wanted = payload
            out = []
            for i in wanted:
                try:
                    attr = self.envs[i].get_wrapper_attr(name)
                    out.append((i, attr(*args, **kwargs) if callable(attr) else attr))
                except Exception as exc:
                    out.append((i, exc))
            self._reply_called(name, out)
        elif command == "set_attr":
            name, values = payload
            refused = []
            for i, value in values:
                try:
                    self.envs[i].set_wrapper_attr(name, value)
                except Exception as exc:  # (the parent raises it, as SyncVectorEnv would)
                    refused.append((i, exc))
            self._reply_called(name, refused)
        elif command == "curriculum":  # a mixture's levels, decided by the parent's controller: no reply
            self.levels = payload
            for env in self.envs.values():
                self._follow_levels(env)
        elif command == "spaces":
            env = next(iter(self.envs.values()))
            self.emit(("spaces", (env.observation_space, env.action_space, env.metadata, env.render_mode)))
        else:
            raise ValueError(f"unknown command {command!r}")

    def _follow_levels(self, env: gym.Env) -> None:
        try:
            env.get_wrapper_attr("set_curriculum_levels")(self.levels)
        except AttributeError:
            pass

    def _reply_called(self, name: str, out: list[tuple[int, Any]]) -> None:
        try:
            self.emit(("called", out))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # (else the parent waits forever)
            self.emit(("called", [(i, TypeError(f"{name!r} cannot be sent to the parent: {exc}")) for i, _ in out]))

    def close(self) -> None:
        for env in self.envs.values():
            try:
                env.close()
            except Exception:
                pass


_WHOLE = object()  # (an info _Worker._step_slice does not cut)


def _no_values(info: dict) -> tuple:
    return ()


def _uncut(cut: tuple, values: Any) -> dict:
    """An info's kept values (``_Worker._step_slice``'s ``cut``) as ``_Worker._kept`` gives them."""
    present = cut[0]
    return {present[0]: values} if len(present) == 1 else dict(zip(present, values))


def pack_results(rows: list[tuple[int, tuple]], defer: bool = True) -> tuple | bytes:
    """Step results as one message in columns: ``(ids, observations, rewards, terminated,
    truncated, infos)``, ids as ``(start, stop)`` when consecutive, numbers as the bytes of
    arrays and infos as :func:`pack_columns` columns (their arrays and masks built here). The
    work of taking a batch apart is the worker's (one of many), not the parent's (one for all).
    In ``marshal``'s format when every value is a plain builtin (a quarter faster to decode than
    pickle's; the parent is the same Python), else as it is (pickled)."""
    ids = [i for i, _ in rows]
    obs, rewards, terminated, truncated, infos = zip(*[result for _, result in rows])
    if ids == list(range(ids[0], ids[0] + len(ids))):
        ids = (ids[0], ids[0] + len(ids))
    return _marshalled((ids, list(obs), array("d", rewards).tobytes(), array("b", terminated).tobytes(),
                        array("b", truncated).tobytes(), pack_columns(infos)), defer)  # (array: less fixed cost than numpy)


def _marshalled(message: tuple, defer: bool = True) -> tuple | bytes:
    """A column message in ``marshal``'s format when every value is a plain builtin, else as it
    is; its object columns as bytes either way (``defer_columns``: the parent decodes them when
    read), unless not ``defer``."""
    exact = _marshal_exact(message)
    if defer:
        message = (*message[:-1], defer_columns(message[-1], exact))
    return marshal.dumps(message, 4) if exact else message


_MARSHAL_EXACT = frozenset((str, int, float, bool, type(None), bytes, tuple, list, dict))


def _marshal_exact(message: Any) -> bool:
    """Whether ``marshal`` gives back every value as it is: it writes any other object with a
    buffer (numpy arrays and scalars, bytearray) as bytes. Level by level over the containers'
    contents, in C (``gc.get_referents``): well under a microsecond per env's info."""
    frontier = [message]
    for _ in range(100):  # (deeper, or a cycle: pickle's turn)
        if not set(map(type, frontier)) <= _MARSHAL_EXACT:
            return False
        frontier = gc.get_referents(*frontier)
        if not frontier:
            return True
    return False


def unpack_results(message: tuple | bytes) -> tuple:
    """:func:`pack_results`'s message: ``(ids, observations, rewards, terminated, truncated,
    infos)`` with ids a ``range`` or list and the numbers still as the bytes of their arrays
    (float64, bool): the batch joins every worker's bytes into one array each (``result_arrays``),
    not an array per worker to concatenate."""
    if type(message) is bytes:
        message = marshal.loads(message)
    ids = message[0]
    if type(ids) is tuple:
        return (range(*ids), *message[1:])
    return message


def result_arrays(chunks: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rewards, terminated and truncated arrays (the caller's own) of :func:`unpack_results`'s
    chunks, in their order."""
    if len(chunks) == 1:
        _, _, rewards, terminated, truncated, _ = chunks[0]
    else:
        _, _, rewards, terminated, truncated, _ = zip(*chunks)
        rewards, terminated, truncated = b"".join(rewards), b"".join(terminated), b"".join(truncated)
    return (np.frombuffer(rewards, dtype=np.float64).copy(), np.frombuffer(terminated, dtype=np.bool_).copy(),
            np.frombuffer(truncated, dtype=np.bool_).copy())


def failure_text(exc: BaseException) -> str:
    """An exception and the end of its traceback, as a worker reports that it could not start."""
    tail = "".join(traceback.format_exception(exc)[-6:]).rstrip()
    return f"{type(exc).__name__}: {exc}\n{tail}"


def use_temp_root(tmp: str) -> None:
    """Give this (worker) process its own temp root: every workspace it makes (sandboxes, MCP
    servers' directories, copies of workbooks) lands there, so all of them can be deleted when
    the worker dies, even by SIGKILL, and when the vector env closes."""
    tempfile.tempdir = os.environ["TMPDIR"] = tmp


def _in_own_tmp(tmp: str, owner: int, *args) -> None:
    """A worker process: its temp root, and its vector env's process (``owner``) watched. A
    forked worker holds the parent's end of its own pipe (and its siblings'), so a parent killed
    (SIGKILL, the OOM killer) never showed as the end of its input: the worker waited for ever,
    its envs' servers and workspaces with it. Once the owner is gone the worker stops and closes
    its envs; whatever stopped it, it removes its temp root as it ends (its owner, if alive,
    removes it again after a kill: a killed worker removes nothing)."""
    use_temp_root(tmp)
    try:
        _worker_main(*args, owner=owner)
    finally:
        remove_tree(Path(tmp))


OWNER_POLL_S = 1.0  # where there is no pidfd (not Linux 5.3+): how often a worker looks for its owner


def _watch_owner(loop: asyncio.AbstractEventLoop, pid: int) -> int | None:
    """Stop ``loop`` once process ``pid`` has ended: a pidfd in the loop, else a poll (which sees
    it once reaped: a zombie still answers a signal). The pidfd (None: polled), for the caller to close."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # (no pidfd; or it has ended already: the poll sees it)
        fd = None
    if fd is not None:
        loop.add_reader(fd, loop.stop)
        return fd

    def poll() -> None:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # (PermissionError: its pid reused by another user)
            loop.stop()
            return
        loop.call_later(OWNER_POLL_S, poll)

    loop.call_later(OWNER_POLL_S, poll)
    return None


def driver_registrations(dumps: Callable[[Any], bytes], own_id: str | None, to: str) -> dict[str, bytes]:
    """The ids registered in this process (``register_tool_env``, ``gym.register``), each pickled
    with ``dumps``: a forked worker inherits them, but a spawned worker or an env host is a fresh
    process that knows only the ids its imports register, and tools, rubrics and factories written
    in a script's ``__main__`` travel only by value. Those with a module path for an entry point go
    too: a user's ``gym.register("my/MCP-v0", entry_point="benchmax_gym.envs.mcp.env:MCPEnv",
    kwargs=...)`` is no import's, and was unknown there (``NameNotFound``); the other process
    keeps its own for an id its imports registered. One that cannot travel is sent as a stub that
    says why when made there (``own_id``, the vector env's own id: a TypeError here, naming where
    it could not go: ``to``)."""
    from benchmax_gym.registry import _PARTS, ENVS

    out = {}
    for env_id, spec in gym.registry.items():
        try:
            out[env_id] = dumps((spec, _PARTS.get(env_id), ENVS.get(env_id)))
        except Exception as exc:
            if isinstance(spec.entry_point, str):
                continue  # (a module path: as before, the other process's imports may register it)
            if env_id == own_id:
                raise TypeError(f"env: {env_id!r}'s registration (its tools, tasks, rubric...) cannot be sent to "
                                f"{to}: {type(exc).__name__}: {exc}") from exc
            out[env_id] = pickle.dumps(_cannot_travel(spec, f"{type(exc).__name__}: {exc}"))
    return out


def _cannot_travel(spec: gym.envs.registration.EnvSpec, reason: str) -> tuple:
    """A registration whose making says why it is not in this process."""
    stub = functools.partial(_unavailable, spec.id, reason)
    return gym.envs.registration.EnvSpec(spec.id, entry_point=stub), None, None


def _unavailable(env_id: str, reason: str, **kwargs: Any) -> gym.Env:
    raise gym.error.Error(f"{env_id!r} is registered in the driver process, but its registration could not be "
                          f"brought to this process (an env host or a spawned worker): {reason}")


def with_registrations(registrations: dict[str, bytes],
                       env_fns: dict[int, Callable[[], gym.Env]]) -> dict[int, Callable[[], gym.Env]]:
    """``env_fns``, once the driver's Python registrations (:func:`driver_registrations`) are made
    in this process too (those its own imports made stay)."""
    from benchmax_gym.registry import _PARTS, ENVS

    for env_id, blob in registrations.items():
        if env_id in gym.registry:
            continue
        try:
            spec, parts, entry = pickle.loads(blob)
        except Exception as exc:  # (a module this node lacks)
            spec, parts, entry = _cannot_travel(gym.envs.registration.EnvSpec(env_id, entry_point=None),
                                                f"{type(exc).__name__}: {exc}")
        gym.registry[env_id] = spec
        if parts is not None:
            _PARTS[env_id] = parts
        if entry is not None:
            ENVS[env_id] = entry
    return env_fns


YOUNG_WHILE_HANDLING = 100_000
"""The cyclic GC's young threshold while a worker handles a command (20,000 between them,
``fewer_collections``). A collection that falls due while the envs step then runs once their
results are sent, while the parent joins the batch, rather than in the middle of a lock-step
batch that every other worker waits on (2 cores, 64 calculator envs, full infos: 99.5k -> 108k
steps/s); the cap still bounds the cyclic garbage one long command can pile up. Only a worker
that is its own process does this (an env host's threads share one collector)."""


def emit_to(outbox: Outbox, dumps: Callable[[Any], bytes] = _Worker.dumps) -> Callable[[Any], None]:
    """A worker's ``emit``: each message pickled, but a column batch already in ``marshal``'s
    format (``pack_results``) goes as its own bytes, which the parent tells from a pickle by their
    first byte (``_Channel._read``): no pickle to wrap and unwrap, nor a copy, per worker per batch.
    An env host's ``dumps`` (:func:`_or_by_value`) also pickles an instance of a class that came
    from the driver's ``__main__`` by value, which this process's ``__main__`` lacks."""
    def emit(message: Any) -> None:
        if message[0] == "batch" and type(message[1]) is bytes:
            outbox.send_bytes(message[1])
        else:
            outbox.send_bytes(dumps(message))

    return emit


def _worker_main(conn, env_fns, mode_value, fresh, keep=None, origin: str = "",
                 by_value: Callable[[Any], bytes] | None = None, owner: int | None = None) -> None:
    """A worker (a process, or an env host's thread): commands come down the connection,
    messages go back up it. ``origin`` prefixes a failure to start (where it happened);
    ``by_value`` (an env host's cloudpickle): for what pickle cannot send (:func:`_or_by_value`);
    ``owner``: its vector env's process (:func:`_in_own_tmp`), whose end stops it as a close does."""
    own_process = threading.current_thread() is threading.main_thread()  # (not an env host's thread)
    if own_process:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    loop = asyncio.new_event_loop()
    outbox = Outbox(conn, loop)
    dumps = _Worker.dumps if by_value is None else _or_by_value(by_value)
    emit = emit_to(outbox, dumps)

    try:
        if callable(env_fns):  # a host unpickles its payload here, so that failing says why too
            env_fns = env_fns()
        worker = _Worker(env_fns, AutoresetMode(mode_value), fresh, emit, loop, keep)
        worker.dumps = dumps
    except BaseException as exc:  # the parent raises this, not a bare EOFError
        text = origin + failure_text(exc)
        try:
            outbox.flush(last_word=dumps(("failed", text)))
        except OSError as lost:
            _last_word_lost(f"could not start: {text}", lost, own_process)
        return
    gc.freeze()  # the envs just built (and the imports) are never garbage: collections skip them

    crashed: list[str] = []  # the error that stopped it: said to the parent, else on stderr
    unsaid: list[BaseException] = []  # why it could not be said

    def crash(exc: BaseException) -> None:
        crashed.append(origin + failure_text(exc))
        try:
            emit(("crashed", crashed[-1]))
        except Exception as lost:  # (the pipe broke): said on stderr as the worker exits
            unsaid.append(lost)
        loop.stop()

    worker.crash = crash

    def on_command() -> None:
        try:
            command, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the parent is gone
            command, payload = "close", None
        except Exception as exc:  # (a class this process lacks): said, not a command lost while the parent waits
            crash(exc)
            return
        if command == "close":
            _answer_close(conn)
            loop.stop()
            return
        if own_process:
            young, *older = gc.get_threshold()
            gc.set_threshold(max(young, YOUNG_WHILE_HANDLING), *older)
        try:
            worker.handle(command, payload)
        except BaseException as exc:  # (a SystemExit in an env's call(): said, not an unexplained exit)
            crash(exc)
        finally:  # the collection due now runs before the loop waits again: the results are out
            if own_process:
                gc.set_threshold(young, *older)

    emit(("ready", None))
    loop.add_reader(conn.fileno(), on_command)
    owner_fd = _watch_owner(loop, owner) if owner is not None else None
    with fewer_collections():
        while True:
            try:
                loop.run_forever()
                break
            except (SystemExit, KeyboardInterrupt):  # from a task an env's code started (an async
                continue  # tool that calls sys.exit()): the task holds it, and the step awaiting it fails
    try:
        outbox.flush()  # (a crash report, after the results before it)
    except OSError as exc:  # (after a close nothing more goes to the parent: results it never reads)
        unsaid.append(exc)
    worker.close()
    loop.close()
    if owner_fd is not None:
        os.close(owner_fd)
    if crashed and unsaid:
        _last_word_lost(f"crashed: {crashed[0]}", unsaid[0], own_process)


def _last_word_lost(gist: str, why: BaseException, own_process: bool) -> None:
    """The worker's last message could not reach its parent (not reading, or gone): its gist goes
    to stderr, and a worker process exits ``LAST_WORD_LOST``, which the parent's error names
    (it exited 0 and the parent said only that it ended). An env host's thread cannot exit."""
    say_last_word_lost("a vector env worker", gist, why)
    if own_process:
        sys.exit(LAST_WORD_LOST)


def _answer_close(conn) -> None:
    """Say "closing" by ending this side of the connection (the parent sees it without reading,
    from any thread): a worker that does not, within moments, is stuck in a synchronous step and
    is killed at once, while this one closes its envs (their MCP servers, sandboxes) in its time.
    Nothing more goes to a parent that closes this worker."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_WR)
    except OSError:  # (not a socket, or the parent is gone)
        pass


def _or_by_value(by_value: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """Pickle (the C pickler, fast), else ``by_value`` (cloudpickle: a class from the driver's
    ``__main__``, which only the driver can find by name)."""
    def dumps(value: Any) -> bytes:
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return by_value(value)

    return dumps


async def _guarded(job) -> Any:
    """``job``, whose ``SystemExit`` or ``KeyboardInterrupt`` is the env's failure: in a task
    it would stop the worker's loop."""
    try:
        return await job
    except (SystemExit, KeyboardInterrupt) as exc:
        return _raised(exc)


def _unpicklable(result: tuple, dumps: Callable[[Any], bytes]) -> str:
    """Which part of a result does not pickle, as ``"info['lock']:"`` (an observation's, a
    reward's...), or ``""``."""
    *values, info = result
    parts = [(name, value) for name, value in zip(("observation", "reward", "terminated", "truncated"), values)]
    if isinstance(info, dict):
        parts += [(f"info[{key!r}]", value) for key, value in info.items()]
    else:
        parts.append(("info", info))
    for name, value in parts:
        try:
            dumps(value)
        except Exception:
            return f"{name}:"
    return ""


def _raised(exc: BaseException) -> tuple:
    """The result of a reset that raised: the env failed (issue 29), not the model."""
    return "", math.nan, False, True, _env_error(exc)


def _said(exc: BaseException) -> str:
    """An exception as one line, with its notes (a mixture names its failing member in one)."""
    return f"{type(exc).__name__}: {exc}" + "".join(f" [{note}]" for note in getattr(exc, "__notes__", ()))


def _env_error(exc: BaseException) -> dict[str, Any]:
    """The info of an episode its env's exception ended (``outcome_detail``: the exception)."""
    said = _said(exc)
    return {"error": f"{ENV_ERROR}: {said}", "outcome": ENV_ERROR, "outcome_detail": outcome_detail(f"the env raised {said}")}
