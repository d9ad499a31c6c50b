"""Play every (task, sample) pair of an eval with many episodes in flight, and keep a run directory.

Episodes run concurrently up to ``concurrency``: each holds one environment from a pool while
its model call is awaited, and env steps go to a thread pool, so no episode waits for another's
model call. A run directory holds ``run.json`` (what was run, by whom, with which versions),
``rollouts.jsonl`` (one full transcript per episode, written as each ends) and ``summary.json``;
running again with the same ``out`` resumes: only the pairs not yet in ``rollouts.jsonl`` run.
Every record has an ``outcome`` (:mod:`benchmax_gym.core.outcomes`); ``retry_failed`` re-runs
the failed pairs of a run directory. A run directory is held while an eval writes it: a second
eval into it at once is refused. A task source read from a file or a split builds only the tasks
``tasks`` reaches (:func:`only_needed`). An episode in flight when the run is interrupted (Ctrl-C,
the task cancelled) is written as ``cancelled`` (no reward, what it did so far; with
``workers > 1`` each worker is told to stop and sends its own); resuming runs its pair again, as
``retry_failed`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import json
import os
import pickle
import platform
import socket
import stat
import subprocess
import sys
import tempfile
import time
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmax_gym.core.aio import LAST_WORD_LOST, Outbox, run_sync, say_last_word_lost
from benchmax_gym.core.env import fewer_collections
from benchmax_gym.core.formats import PARSE_ERROR
from benchmax_gym.core.group import GroupRubric, ascore_groups, group_rubric_of
from benchmax_gym.core.judge import judge_usage, total_usage
from benchmax_gym.core.outcomes import (CANCELLED, ENV_ERROR, FAILURES, MODEL_ERROR, OUTCOMES, SCORED, SIGNAL,
                                        TRUNCATED, is_failure)
from benchmax_gym.core.sandbox import remove_tree
from benchmax_gym.core.tasks import task_digest
from benchmax_gym.eval.policies import PolicyError, Turn, as_policy
from benchmax_gym.wrappers.vector import FORKSERVER_EXIT
from benchmax_gym.wrappers.worker import async_api, driver_registrations, use_temp_root, with_registrations

RUN_FORMAT = "benchmax-gym-eval/1"
# what must match for a run directory to be resumed
RESUME_KEYS = ("env_id", "env_kwargs", "policy", "k", "tasks", "seed")
# what a resume may change: how long to wait for the endpoint and how often to retry it (a
# --retry-failed after timeouts wants a longer --timeout); the model is asked the same either way
RESUME_MAY_CHANGE = ("timeout", "max_retries")
# the CLI's flag for each setting a resume must keep (API callers: the argument of that name)
_FLAGS = {"env_id": "the env id", "env_kwargs": "--env-arg", "k": "-k", "tasks": "--tasks", "seed": "--seed",
          "policy.model": "--model", "policy.base_url": "--base-url", "policy.native_tools": "--tool-mode",
          "policy.name": "--policy", "policy.kind": "--policy", "policy.sampling.temperature": "--temperature",
          "policy.sampling.top_p": "--top-p", "policy.sampling.max_tokens": "--max-tokens"}


class EvalError(ValueError):
    """A bad eval request (tasks, out directory, endpoint), found before any episode runs."""


@dataclass
class EvalResult:
    """``records``: one per episode (this run's and a resumed run's); ``summary``: their statistics."""

    run: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    out: Path | None = None


def task_indices(tasks: Any, available: int | None) -> list[int]:
    """``"all"``, ``N`` (the first N), ``"i:j"`` or ``(i, j)`` (a slice) -> task indices.
    ``available`` is None for an unbounded source, which needs a count. Errors name the CLI's flags
    (``--tasks``: the ``tasks`` argument)."""
    return list(_task_range(tasks, available))


def _task_range(tasks: Any, available: int | None) -> range:
    if isinstance(tasks, str) and tasks != "all" and ":" not in tasks:
        try:
            tasks = int(tasks)
        except ValueError:
            raise EvalError(f"--tasks must be all, N or i:j, got {tasks!r}") from None
    if tasks == "all":
        if available is None:
            raise EvalError("this environment's task list is unbounded: say how many with --tasks N (the first N) "
                            "or --tasks i:j")
        return range(available)
    if isinstance(tasks, int) and not isinstance(tasks, bool):
        start, stop = 0, tasks
    elif isinstance(tasks, str):
        left, _, right = tasks.partition(":")
        try:
            start, stop = int(left or 0), int(right) if right else available
        except ValueError:
            raise EvalError(f"--tasks must be all, N or i:j, got {tasks!r}") from None
    elif isinstance(tasks, (tuple, list)) and len(tasks) == 2:
        start, stop = tasks
    else:
        raise EvalError(f"--tasks must be all, N or i:j, got {tasks!r}")
    if stop is None:
        raise EvalError("this environment's task list is unbounded: give --tasks an end (i:j)")
    if not 0 <= start < stop or (available is not None and stop > available):
        within = f"within the {available} tasks" if available is not None else "of task indices from 0"
        raise EvalError(f"--tasks {tasks}: not a non-empty range {within}")
    return range(start, stop)


def tasks_needed(tasks: Any) -> int | None:
    """How many of a source's first tasks ``tasks`` (``N``, ``i:j``) reads: None for ``"all"`` and
    ``"i:"`` (to the source's end), or a request :func:`task_indices` refuses (it says why, later)."""
    try:
        return _task_range(tasks, None).stop
    except EvalError:
        return None


def only_needed(env_id: str, kwargs: dict[str, Any], needed: int | None) -> dict[str, Any]:
    """``kwargs`` with the env's named task source (a file, a dataset split) cut to its first
    ``needed`` tasks through its ``limit`` (every source that takes one keeps its first tasks in
    order, so tasks 0 to ``needed - 1`` are those of the whole source): ``--tasks 5`` builds 5
    tasks in each env, not every task of a large file. ``kwargs`` itself where there is nothing
    to cut: every task wanted, a source without ``limit``, tasks handed over, a generated source
    (built lazily already)."""
    from benchmax_gym.core.sources import SourceConfig

    if needed is None:
        return kwargs
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:  # (gym.make says why)
        return kwargs
    chosen = kwargs.get("tasks", spec.kwargs.get("tasks"))
    if isinstance(chosen, SourceConfig):
        if "limit" in chosen.arg_names() and (chosen.limit is None or chosen.limit > needed):
            return {**kwargs, "tasks": dataclasses.replace(chosen, limit=needed)}
        return kwargs
    entry = spec.entry_point
    if isinstance(entry, str):
        from gymnasium.envs.registration import load_env_creator

        try:
            entry = load_env_creator(entry)
        except (ImportError, AttributeError, ValueError):  # (gym.make says why)
            return kwargs
    choices = getattr(entry, "choices", None)
    options = choices.get("task_args", ()) if isinstance(choices, dict) else ()
    named = next((o for o in options if isinstance(chosen, str) and o.name == chosen), None)
    args = kwargs["task_args"] if "task_args" in kwargs else spec.kwargs.get("task_args")
    if named is None or "limit" not in named.arg_names() or not isinstance(args, (Mapping, type(None))):
        return kwargs
    limit = (args or {}).get("limit", kwargs.get("limit"))  # (the flat form of 0.1: limit=...)
    if limit is not None and not (type(limit) is int and limit > needed):  # (a bad one: the source says why)
        return kwargs
    return {**kwargs, "task_args": {**(args or {}), "limit": needed}}


def task_set_of(source: Any) -> str | None:
    """The content hash of an env's task source (``TaskSource.content_hash``), None without one."""
    digest = getattr(source, "content_hash", None)
    return digest() if callable(digest) else None


def _whole_task_set(env_id: str, kwargs: Mapping[str, Any]) -> str | None:
    """The task set of ``env_id``'s whole task source (every task built: only to resume a run
    written before eval cut sources to the tasks it needs)."""
    env = gym.make(env_id, **kwargs)
    try:
        return task_set_of(getattr(env.unwrapped, "tasks", None))
    finally:
        env.close()


def episode_seed(seed: int, task_index: int, sample: int) -> int:
    """The reset (and sampling) seed of one pair: the same whatever order pairs run in."""
    return int(np.random.SeedSequence([seed, task_index, sample]).generate_state(1)[0] & 0x7FFFFFFF)


# -- the run directory -----------------------------------------------------------------------------

# A run directory may have been handed over, unpacked from elsewhere, or shared: nothing in it is
# followed or trusted. Files are opened O_NOFOLLOW and used only when regular with one link
# (core.files), read up to a bound, and replaced through exclusive temporary files.
MAX_RUN_JSON_BYTES = 64 << 20
MAX_ROLLOUTS_BYTES = 16 << 30
_WRITE_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def _read_safely(folder: Path, name: str, max_bytes: int) -> bytes | None:
    """The bytes of ``folder/name`` (None when absent); a symlink, FIFO, device, hard link or a
    file over ``max_bytes`` is an :class:`EvalError`."""
    from benchmax_gym.core.files import WorkspaceFileError, read_workspace_file

    try:
        return read_workspace_file(folder, name, max_bytes)[0]
    except WorkspaceFileError as exc:
        if exc.code == "file_missing":
            return None
        raise EvalError(f"{folder}: {name} refused: {exc} (a run directory holds only the regular files eval "
                        "writes); choose a new directory") from None


def _open_append(folder: Path, name: str) -> int:
    """An append descriptor on ``folder/name``, created if absent, never through a link or onto
    a FIFO or device."""
    try:
        fd = os.open(folder / name, _WRITE_FLAGS | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EvalError(f"{folder}: cannot open {name} ({os.strerror(exc.errno)}; a symbolic link or FIFO?); "
                        "choose a new directory") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise EvalError(f"{folder}: {name} is not a regular file with one link; choose a new directory")
    os.set_blocking(fd, True)
    return fd


def _replace_file(folder: Path, name: str, data: bytes) -> None:
    """Write ``folder/name`` whole: into a new exclusive temporary file, then renamed over it (a
    link there is replaced, never followed)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")  # O_EXCL | O_NOFOLLOW
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def run_dir_held(out: str | os.PathLike | None):
    """Hold the run directory ``out`` (an exclusive ``flock`` on it, made if absent) while an eval
    writes it: two evals into it at once (a resume started twice, two callers of :func:`evaluate`)
    each ran every episode, and the run could no longer be read. The second is refused at once
    with an :class:`EvalError` naming the directory. On the way out the folders made here and
    left empty (the eval failed before writing) are removed. Nothing is held where ``out`` is
    None or not a folder (:class:`RunDir` says why)."""
    import fcntl

    fd, created = None, None
    if out is not None:
        out = os.fspath(out)
        if not os.path.lexists(out):
            created = os.path.abspath(out)
            while not os.path.lexists(os.path.dirname(created)):
                created = os.path.dirname(created)
        try:
            os.makedirs(out, exist_ok=True)
            fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            if not os.path.lexists(out):
                where = f"{exc.filename}: {exc.strerror}" if exc.filename is not None and exc.strerror else exc
                raise EvalError(f"--out {out}: cannot make the run directory ({where})") from None
            created = None  # a file or a link there
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                created = None  # (the other eval's)
                raise EvalError(f"--out {out}: another eval is writing this run now; let it finish (or stop it) "
                                "and run again to resume, or choose another directory") from None
        yield
    finally:
        if fd is not None:
            os.close(fd)
        folder = os.path.abspath(out) if created else None
        while folder:
            try:
                os.rmdir(folder)  # only if empty
            except OSError:
                break
            folder = os.path.dirname(folder) if folder != created else None


class RunDir:
    """``run.json`` + ``rollouts.jsonl`` + ``summary.json`` in ``path``; refuses a directory that holds
    something else, a corrupt, foreign or repeated record, or a run of another configuration.
    ``pairs``: the run's ``(task_index, sample)`` pairs (a record of any other is refused).
    ``whole_task_set``: the task set of the whole source, where this run's is of its first tasks
    only (:func:`only_needed`): a run written before eval cut sources has that one."""

    def __init__(self, path: str | os.PathLike, config: dict[str, Any], pairs: set[tuple[int, int]] | None = None,
                 whole_task_set: Any = None):
        self.path = Path(path)
        self.config = config
        self.pairs = pairs
        self.whole_task_set = whole_task_set
        self.records: list[dict[str, Any]] = []
        self.run: dict[str, Any] = {}
        self._fd: int | None = None
        if self.path.exists() and not self.path.is_dir():
            raise EvalError(f"--out {self.path}: exists and is not a directory")
        entries = sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []
        if entries:
            self._resume(entries)

    def _resume(self, entries: list[str]) -> None:
        raw = _read_safely(self.path, "run.json", MAX_RUN_JSON_BYTES) if "run.json" in entries else None
        if raw is None:
            raise EvalError(f"--out {self.path}: not empty and not a benchmax-gym eval run (no run.json); "
                            "choose a new directory")
        try:
            run = json.loads(raw)
        except ValueError as exc:
            raise EvalError(f"--out {self.path}: run.json is unreadable ({exc}); choose a new directory") from None
        if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
            raise EvalError(f"--out {self.path}: run.json is not a {RUN_FORMAT} record; choose a new directory")
        then_, now_ = ({k: _resumed_part(k, c.get(k)) for k in RESUME_KEYS} for c in (run, self.config))
        chosen = _selection(run.get("tasks"), run.get("task_count"))
        if chosen is not None and chosen == _selection(self.config.get("tasks"), self.config.get("task_count")):
            now_["tasks"] = then_["tasks"]  # the same tasks spelled otherwise (3, "0:3", ":3")
        differs = [k for k in RESUME_KEYS if then_[k] != now_[k]]
        if differs:
            said = "; ".join(_differences("", then_, now_))
            raise EvalError(f"--out {self.path} holds a run with other settings ({', '.join(differs)}): {said}; "
                            "resume it with the same ones or choose a new directory")
        then, now = run.get("task_set"), self.config.get("task_set")
        if then and now and then != now and not (self.whole_task_set and then == self.whole_task_set()):
            raise EvalError(f"--out {self.path} holds a run over other tasks (task set {then}, the env's is now "
                            f"{now}): the task source changed; choose a new directory")
        self.run = run
        self.records = read_rollouts(self.path, repair=True, pairs=self.pairs)

    def drop(self, pairs: set[tuple[int, int]]) -> None:
        """Remove the records of ``pairs`` (to run them again): ``rollouts.jsonl`` is rewritten whole
        through an exclusive temporary file and renamed over, every other line kept byte for byte.
        Interrupted after this, the dropped pairs are pairs not yet done: resuming runs them."""
        data = _read_safely(self.path, "rollouts.jsonl", MAX_ROLLOUTS_BYTES) or b""
        kept = [line for line in data.split(b"\n") if line.strip()
                and (json.loads(line)["task_index"], json.loads(line)["sample"]) not in pairs]
        _replace_file(self.path, "rollouts.jsonl", b"".join(line + b"\n" for line in kept))
        self.records = [r for r in self.records if (r["task_index"], r["sample"]) not in pairs]

    def start(self, run: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.run:  # resumed: keep the first start, note this one
            run = {**self.run, "resumed": [*self.run.get("resumed", []), run["started"]],
                   **({"retried": run["retried"]} if "retried" in run else {})}
        self.run = run
        self.write_json("run.json", run)
        self._fd = _open_append(self.path, "rollouts.jsonl")

    def add(self, record: dict[str, Any], scrub: Any = None) -> None:
        """Append ``record`` as one line, on disk once its episode ends (what resume reads). A
        write that fails (the disk full, a quota) takes back the part of the line it wrote: a
        later line after a torn one made the file unreadable to resume (a corrupt line), and the
        error names the file (the CLI says the run directory cannot be written)."""
        line = json.dumps(record, ensure_ascii=False, default=str)
        data = ((scrub(line) if scrub else line) + "\n").encode("utf-8")
        view, written = memoryview(data), 0
        try:
            while written < len(data):
                written += os.write(self._fd, view[written:])
        except OSError as exc:
            with contextlib.suppress(OSError):
                if written:
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            raise OSError(exc.errno, exc.strerror, str(self.path / "rollouts.jsonl")) from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def finish(self, run: dict[str, Any], summary: dict[str, Any]) -> None:
        self.close()
        self.run = run
        self.write_json("run.json", run)
        self.write_json("summary.json", summary)

    def write_json(self, name: str, value: Any) -> None:
        _replace_file(self.path, name,
                      (json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n").encode("utf-8"))


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _resumed_part(key: str, value: Any) -> Any:
    """What of setting ``key`` a resume must keep, as JSON has it (:data:`RESUME_MAY_CHANGE` left out)."""
    value = _normal(value)
    if key == "policy" and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in RESUME_MAY_CHANGE}
    return value


def _selection(tasks: Any, count: Any) -> tuple[int, int] | None:
    """The task indices ``tasks`` chose, as ``(start, stop)``: what a resume must keep, not how
    ``--tasks`` spelled it. ``count``: how many it chose (run.json's ``task_count``), for ``all``
    and ``i:``, which reach the source's end. None where that cannot be told."""
    try:
        chosen = _task_range(tasks, None)
        return chosen.start, chosen.stop
    except (EvalError, TypeError, ValueError):
        pass
    if type(count) is not int or count <= 0:
        return None
    if tasks == "all":
        return 0, count
    if isinstance(tasks, str) and tasks.endswith(":") and tasks.count(":") == 1:
        try:
            start = int(tasks[:-1] or 0)
        except ValueError:
            return None
        return start, start + count
    return None


def _differences(where: str, then: Any, now: Any) -> list[str]:
    """``FLAG THEN then, NOW now`` for each leaf setting that differs (the CLI's flag where it has one)."""
    if isinstance(then, dict) and isinstance(now, dict) and where != "env_kwargs":
        found = []
        for key in sorted(set(then) | set(now), key=str):
            if then.get(key) != now.get(key):
                found += _differences(f"{where}.{key}" if where else key, then.get(key), now.get(key))
        return found
    name = _FLAGS.get(where, where)
    if where == "policy.native_tools":  # (the flag's words)
        then, now = ("native" if v else "text" if v is not None else None for v in (then, now))
    show = lambda v: "none" if v is None else json.dumps(v, sort_keys=True)[:200]  # noqa: E731
    return [f"{name} {show(then)} then, {show(now)} now"]


def _provenance() -> dict[str, Any]:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for dist in ("benchmax-gym", "gymnasium", "openai", "numpy"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    commit = None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"versions": versions, "git_commit": commit, "host": socket.gethostname(),
            "platform": platform.platform(), "argv": sys.argv}


def _token_total(records: list[dict[str, Any]], key: str) -> int | None:
    """The tokens ``key`` over the records that report them; None when none does (an endpoint
    that sends no ``usage``: its run used an unknown number of tokens, not 0)."""
    counts = [r[key] for r in records if r.get(key) is not None]
    return sum(counts) if counts else None


def _user_usage(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"user": {calls, prompt_tokens, completion_tokens, cost}}`` over the episodes a simulated
    user spoke in (each record's ``user``); nothing when none did. ``cost`` is None unless priced."""
    used = [r["user"] for r in records if isinstance(r.get("user"), dict)]
    if not used:
        return {}
    costs = [u.get("cost") for u in used]
    return {"user": {**{k: sum(u.get(k) or 0 for u in used) for k in ("calls", "prompt_tokens", "completion_tokens")},
                     "cost": None if None in costs else sum(costs)}}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# -- playing --------------------------------------------------------------------------------------


def max_reward(env: gym.Env) -> float:
    """The reward of an episode that earns every component in full (components are in [0, 1])."""
    rubric = getattr(env.unwrapped, "rubric", None)
    return rubric.max_reward if rubric is not None else 1.0


async def play_episode(env: gym.Env, policy: Any, task_index: int, sample: int, seed: int,
                       executor: concurrent.futures.Executor) -> dict[str, Any]:
    """One episode of ``task_index``. An episode whose policy cannot produce a turn (the endpoint
    kept failing, a malformed reply, your function raised) or whose env raised is *failed*: its
    record has the ``error``, ``reward`` None and no components, and the summary leaves it out of
    every statistic (a failure is not a score of 0); the run goes on. Cancelled while it waits
    (the run interrupted), it returns its record as ``cancelled``: the caller writes it and stops."""
    loop = asyncio.get_running_loop()
    base = env.unwrapped
    start = time.perf_counter()
    api = async_api(env)
    if api is not None and not getattr(api, "needs_event_loop", True):
        # Nothing in a step waits on I/O: its coroutine runs inline, cheaper than a thread hop.
        reset, step = api.areset, api.astep
    else:  # tools that block (a sandbox, a server): the sync API in a worker thread
        reset = lambda **kw: loop.run_in_executor(executor, lambda: env.reset(**kw))  # noqa: E731
        step = lambda action: loop.run_in_executor(executor, env.step, action)  # noqa: E731
    reward, terminated, truncated, error, failure = 0.0, False, False, None, None
    turns: list[dict[str, Any]] = []
    codes: list[str] = []
    components: dict[str, float] = {}
    try:
        obs, info = await reset(seed=seed, options={"task_index": task_index})
    except asyncio.CancelledError:
        obs, info, terminated, base = None, {}, True, None
        error, failure = "cancelled: the run was interrupted while the env reset", CANCELLED
    except Exception as exc:  # the env could not start this task: the episode fails, the run goes on
        obs, info, terminated = None, {}, True
        error, failure = policy.scrub(f"the env's reset raised {type(exc).__name__}: {exc}"), ENV_ERROR
        base = None  # its episode (if any) is an earlier one
    while not (terminated or truncated):
        try:
            turn: Turn = await policy(base, obs, info, seed=seed)
        except asyncio.CancelledError:
            error, failure = f"cancelled: the run was interrupted waiting for the model (turn {len(turns)})", CANCELLED
            break
        except PolicyError as exc:
            error, failure = policy.scrub(str(exc)), MODEL_ERROR
            break
        except Exception as exc:  # the user's policy raised: record it, go on with the run
            error, failure = policy.scrub(f"{type(exc).__name__}: {exc}"), MODEL_ERROR
            break
        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = await step(turn.action)
        except asyncio.CancelledError:
            error, failure = f"cancelled: the run was interrupted in the env's step (turn {len(turns)})", CANCELLED
            break
        except Exception as exc:
            error, failure = policy.scrub(f"the env's step raised {type(exc).__name__}: {exc}"), ENV_ERROR
            break
        codes += info.get("errors") or []
        components = info.get("reward_components", components)
        turns.append({"model_seconds": round(turn.model_seconds, 4), "env_seconds": round(time.perf_counter() - t0, 4),
                      "prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                      "finish_reason": turn.finish_reason, "errors": info.get("errors") or [],
                      **({"reasoning": turn.reasoning} if turn.reasoning else {})})
    episode = base.episode if base is not None else None
    tokens = [t["prompt_tokens"] for t in turns], [t["completion_tokens"] for t in turns]
    reported = info.get("outcome") if isinstance(info, Mapping) else None
    if failure is None and reported in FAILURES:  # the env's own failure (a tool timed out, a worker lost)
        failure = reported
        error = policy.scrub(str(info.get("outcome_detail") or info.get("error")
                                 or f"the env ended the episode as {reported}"))
    failed = failure is not None
    outcome = failure or (reported if reported in OUTCOMES else TRUNCATED if truncated else SCORED)
    so_far = {}
    if episode is not None:
        try:
            so_far = base.episode_record()
        except Exception:  # cancelled: its step may still be running in its thread
            so_far = {}
    if episode is not None and episode.reward is not None:
        reward = episode.reward  # the graded reward: a last step's per-turn reward (dense_rewards) is not in it
    return {
        "task_index": task_index, "sample": sample, "seed": seed,
        "task_id": episode.task.id if episode is not None else None,
        # what the task was, so compare can check that runs cut to different task sets agree where they meet
        "task_digest": task_digest(episode.task).hex()[:32] if episode is not None else None,
        "metadata": dict(episode.task.metadata) if episode is not None else {},
        **so_far,
        **({"judge": judge} if (judge := judge_usage(episode)) else {}),
        "reward": None if failed else float(reward),
        "success": not failed and float(reward) >= max_reward(env) - 1e-9,
        "reward_components": {} if failed else components,
        "outcome": outcome, "error": error, "terminated": bool(terminated), "truncated": bool(truncated),
        "turns": len(turns), "tool_errors": episode.tool_errors if episode is not None else 0,
        "parse_errors": codes.count(PARSE_ERROR), "errors": codes,
        "prompt_tokens": sum(tokens[0]) if turns and None not in tokens[0] else None,
        "completion_tokens": sum(tokens[1]) if turns and None not in tokens[1] else None,
        "finish_reason_length": sum(t["finish_reason"] == "length" for t in turns),
        "seconds": round(time.perf_counter() - start, 4),
        "turn_log": turns,
    }


async def aevaluate(
    env_id: str,
    policy: Any = "solver",
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    k: int = 1,
    tasks: Any = "all",
    concurrency: int = 16,
    seed: int = 0,
    out: str | os.PathLike | None = None,
    progress: bool = False,
    preflight: bool = True,
    plots: bool = False,
    workers: int = 1,
    extra_run_info: Mapping[str, Any] | None = None,
    retry_failed: bool = False,
    group_rubric: GroupRubric | None = None,
) -> EvalResult:
    """Evaluate ``policy`` on ``env_id``: every selected task ``k`` times, ``concurrency`` episodes
    in flight. See :func:`evaluate`."""
    import benchmax_gym  # noqa: F401  (registers the ids)

    policy = as_policy(policy)
    for name, value in (("-k", k), ("--concurrency", concurrency), ("--workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise EvalError(f"{name} must be a positive integer, got {value!r}")
    with run_dir_held(out):  # before anything reads or writes it
        given = {**(env_kwargs or {}), **policy.env_kwargs}
        kwargs = only_needed(env_id, given, tasks_needed(tasks))  # (each env builds only the tasks it may run)
        first = gym.make(env_id, **kwargs)
        closing: list[Any] = [first]
        try:
            source = getattr(first.unwrapped, "tasks", None)
            from benchmax_gym.core.tasks import INFINITE

            available = len(source) if source is not None and len(source) < INFINITE else None
            indices = task_indices(tasks, available)
            config = {"format": RUN_FORMAT, "env_id": env_id, "env_kwargs": dict(env_kwargs or {}),
                      "policy": policy.describe(), "k": k,
                      "tasks": tasks if isinstance(tasks, (str, int)) else list(tasks), "seed": seed,
                      "task_count": len(indices), "task_set": task_set_of(source), **dict(extra_run_info or {})}
            pairs = [(i, s) for i in indices for s in range(k)]
            whole = (lambda: _whole_task_set(env_id, given)) if kwargs is not given else None
            run_dir = RunDir(out, config, set(pairs), whole) if out is not None else None
            cancelled = {(r["task_index"], r["sample"]) for r in run_dir.records if r["outcome"] == CANCELLED} \
                if run_dir else set()
            done = {(r["task_index"], r["sample"]) for r in run_dir.records} - cancelled if run_dir else set()
            pending = [pair for pair in pairs if pair not in done]  # a cancelled pair runs again
            if retry_failed:
                if run_dir is None or not run_dir.run:
                    raise EvalError(f"--retry-failed: {out} holds no eval run to retry")
                failed = {(r["task_index"], r["sample"]) for r in run_dir.records if is_failure(r["outcome"])}
                pending = [pair for pair in pairs if pair in failed]  # exactly those, nothing else
                if progress:
                    print(f"retrying {len(pending)} failed episodes of {len(pairs)}", file=sys.stderr, flush=True)
            elif done and progress:
                again = f", {len(cancelled)} cancelled to run again" if cancelled else ""
                print(f"resuming: {len(done)} of {len(pairs)} done{again}", file=sys.stderr, flush=True)
            if pending and preflight and hasattr(policy, "preflight"):
                await policy.preflight()
            run = {**config, "started": _now(), "episodes": len(indices) * k,
                   **_provenance()}
            if run_dir:
                if retry_failed:
                    run_dir.drop(set(pending))
                    run = {**run, "retried": [*run_dir.run.get("retried", []), {"started": run["started"],
                                                                                 "episodes": len(pending)}]}
                elif cancelled:
                    run_dir.drop(cancelled)
                run_dir.start(run)
                closing.append(run_dir)
            sink = _Sink(run_dir, len(pending), env_id, progress, policy.scrub)
            try:
                if min(workers, concurrency, len(pending)) > 1:
                    first.close()
                    closing.remove(first)
                    await _play_in_workers(env_id, kwargs, policy, pending, seed, concurrency, workers, sink)
                else:
                    await _play_all(env_id, kwargs, first, policy, pending, seed, concurrency, sink, closing)
            finally:
                sink.bar.close()
            records = (list(run_dir.records) if run_dir else []) + sink.records
            if group_rubric is not None or group_rubric_of(first) is not None:
                records, group_rubric = await _group_scored(records, group_rubric, first, env_id, kwargs, closing,
                                                            run_dir)
        finally:
            for item in closing:
                item.close()
            if hasattr(policy, "aclose"):
                await policy.aclose()
        from benchmax_gym.eval.plots import plots_available
        from benchmax_gym.eval.stats import summarize

        records.sort(key=lambda r: (r["task_index"], r["sample"]))
        summary = summarize(records, seed=seed)
        judged = total_usage(records)
        if judged is not None:
            summary["judge"] = judged
        if group_rubric is not None:
            summary["group_rubric"] = repr(group_rubric)
            erred = sum(1 for r in records if r.get("group_errors"))
            if erred:  # (scored 0 for the function that raised, as a rubric's leaf: said, never silent)
                summary["group_errors"] = erred
                summary.setdefault("notes", []).append(
                    f"{erred} episodes' group rubric raised or gave no finite score: that component scored 0 "
                    "(group_errors in group_rewards.jsonl); a trainer leaves such groups out")
        if run_dir and plots and not plots_available():  # (said, not silently skipped)
            summary.setdefault("notes", []).append(
                "no PNGs: plots need matplotlib (pip install 'benchmax-gym[plots]'; --no-plots asks for none)")
        run = {**(run_dir.run if run_dir else run), "ended": _now(),
               "usage": {**{key: _token_total(records, key) for key in ("prompt_tokens", "completion_tokens")},
                         **_user_usage(records)}}
        if run_dir:
            run_dir.finish(run, summary)
            if plots:
                _plot(records, summary, run_dir.path, run)
        return EvalResult(run=run, records=records, summary=summary, out=run_dir.path if run_dir else None)


async def _group_scored(records, group_rubric, first, env_id, kwargs, closing, run_dir) -> tuple[list, Any]:
    """Each task's k records scored together by ``group_rubric`` (:mod:`benchmax_gym.core.group`);
    failed episodes stay out. ``rollouts.jsonl`` keeps each episode's own reward (what resuming
    reads); the group-scored fields go to ``group_rewards.jsonl``, rewritten whole, and into the
    summary. ``success`` (pass@k) stays each episode's own: solved or not."""
    if first not in closing:  # spread over workers: the first env was closed; the rubric may need one
        first = await asyncio.to_thread(gym.make, env_id, **kwargs)
        closing.append(first)
    group_rubric = group_rubric or group_rubric_of(first)
    source = first.unwrapped.tasks
    records = sorted(records, key=lambda r: (r["task_index"], r["sample"]))
    scored = await ascore_groups(records, group_rubric, tasks=lambda r: source.get(r["task_index"]))
    if run_dir is not None:
        keys = ("task_index", "sample", "reward", "individual_reward", "group_components", "group_size",
                "group_errors", "outcome", "error", "judge")
        lines = (json.dumps({k: r[k] for k in keys if k in r}, ensure_ascii=False, default=str) + "\n" for r in scored)
        _replace_file(run_dir.path, "group_rewards.jsonl", "".join(lines).encode("utf-8"))
    return scored, group_rubric


class _Sink:
    """Where finished episodes go: the records, the run directory, the progress bar (running mean)."""

    def __init__(self, run_dir: RunDir | None, total: int, desc: str, progress: bool, scrub: Any = None):
        from tqdm import tqdm

        self.run_dir, self.progress, self.scrub = run_dir, progress, scrub
        self.records: list[dict[str, Any]] = []
        self.reward, self.failed = 0.0, 0
        self.broken: OSError | None = None  # the run directory's write that failed
        self.bar = tqdm(total=total, desc=desc, unit="ep", disable=not progress, dynamic_ncols=True)

    def add(self, record: dict[str, Any]) -> None:
        """Keep ``record`` (written first: a record the run directory lacks is not counted). Once
        a write failed every later one fails with that error, unwritten: the run stops."""
        if self.run_dir:
            if self.broken is not None:
                raise self.broken
            try:
                self.run_dir.add(record, self.scrub)
            except OSError as exc:
                self.broken = exc
                raise
        self.records.append(record)
        self.failed += is_failure(record["outcome"])
        self.reward += record["reward"] or 0.0
        if self.progress:
            self.bar.update(1)
            scored = len(self.records) - self.failed
            self.bar.set_postfix(mean_reward=f"{self.reward / scored:.3f}" if scored else "-", failed=self.failed,
                                 refresh=False)


def _dumps(message: Any) -> bytes:
    """A worker's message to the parent, pickled by the C pickler: the connection's own ``send``
    (multiprocess's dill, pure Python) took ~0.3 ms a record, 40x the C pickler's, in every
    worker and for every episode. dill only for what the C pickler refuses; ``pickle.loads``
    reads either."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        from multiprocess.reduction import ForkingPickler

        return bytes(ForkingPickler.dumps(message))


def _receive(conn: Any) -> Any:
    return pickle.loads(conn.recv_bytes())


class _PipeSink:
    """A worker process's sink: each record goes to the parent as it finishes, written without
    blocking the worker's event loop (``Outbox``). A worker that blocked on a full pipe while the
    parent read the other workers' records stalled every episode it held: at 1,024 episodes in
    flight over 16 workers and a 100 ms model, an episode took 103-105 ms per model call while
    each call took a slot 125-131 ms. A parent that is gone fails the worker's run (``OSError``)."""

    def __init__(self, conn: Any):
        self.outbox = Outbox(conn, asyncio.get_running_loop())

    def add(self, record: dict[str, Any]) -> None:
        self.outbox.send_bytes(_dumps(("record", record)))


async def _play_all(env_id, kwargs, first, policy, pending, seed, concurrency, sink, closing) -> None:
    """``concurrency`` players, each with its own environment, take the pairs in order."""
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=min(concurrency, 64),
                                                     thread_name_prefix="benchmax-eval")
    pairs = iter(pending)  # shared: each pair is taken once

    async def player(env: gym.Env | None) -> None:
        for task_index, sample in pairs:
            if env is None:
                env = await loop.run_in_executor(executor, lambda: gym.make(env_id, **kwargs))
                closing.append(env)
            record = await play_episode(env, policy, task_index, sample, episode_seed(seed, task_index, sample),
                                        executor)
            sink.add(record)
            if record["outcome"] == CANCELLED:  # written; now stop as the run was told to
                raise asyncio.CancelledError

    players = [asyncio.ensure_future(player(first if i == 0 else None)) for i in range(min(concurrency, len(pending)))]
    try:
        with fewer_collections():
            await asyncio.gather(*players)
    finally:
        # One player failed (the run directory cannot be written, an env cannot be made): the
        # others stop too, rather than play on unrecorded with the envs the caller is closing.
        for task in players:
            task.cancel()
        await asyncio.gather(*players, return_exceptions=True)
        executor.shutdown(wait=False, cancel_futures=True)


def _worker_main(conn, env_id, kwargs, policy, pairs, seed, concurrency, environ=None, registrations=None,
                 tmp=None) -> None:
    """A worker process (``workers > 1``): its share of the pairs on its own event loop and CPU.
    Ctrl-C is the parent's to handle: a worker ignores it, and the parent's SIGTERM cancels its
    run (its episodes in flight are sent as ``cancelled``). ``environ``: the parent's environment
    variables as they are now (a fork server's children would otherwise have those of its start).
    ``registrations``: the ids the parent registered in Python (``driver_registrations``), made
    here too: a worker is a fresh process, where a script's ``if __name__ == "__main__"`` block
    (its ``register_tool_env``) never ran.
    ``pairs`` come pickled by the C pickler: a process's arguments go through dill's pure-Python
    one, ~7 us a pair (40,960 pairs over 16 workers held the last one's start back ~0.3 s).
    ``tmp``: the worker's own temp root, made and removed by the parent (the workspaces of a
    worker killed mid-episode, by the parent's Ctrl-C or the OOM killer, go with it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (started blocked: _ctrl_c_blocked)
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if tmp is not None:
        use_temp_root(tmp)

    pairs = pickle.loads(pairs)

    async def main() -> None:
        import benchmax_gym  # noqa: F401  (registers the ids)

        with_registrations(registrations or {}, {})  # (after the package's own: those stay)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)

        closing: list[Any] = [gym.make(env_id, **kwargs)]
        sink.append(_PipeSink(conn))
        try:
            await _play_all(env_id, kwargs, closing[0], policy, pairs, seed, concurrency, sink[0], closing)
        finally:
            for item in closing:
                item.close()
            if hasattr(policy, "aclose"):
                await policy.aclose()

    sink: list[_PipeSink] = []
    try:
        asyncio.run(main())
        message = ("done", None)
    except BaseException as exc:  # the parent raises it, with the worker's own message
        message = ("failed", policy.scrub(f"{type(exc).__name__}: {exc}"))
    if tmp is not None:  # (its envs closed: a worker whose parent is gone, as the parent would)
        remove_tree(Path(tmp))
    # The records still waiting, then the last word, within a minute in all: one not delivered
    # (the parent not reading, or gone) is said on stderr, and the exit status tells the parent
    # (it exited 0 "without a word"; a last word written after a torn record read as garbage).
    outbox = sink[0].outbox if sink else Outbox(conn, None)
    try:
        outbox.flush(timeout=60.0, last_word=_dumps(message))
    except OSError as exc:
        kind, value = message
        say_last_word_lost("an eval worker", kind if value is None else f"{kind}: {value}", exc)
        sys.exit(LAST_WORD_LOST)


# What a fork server imports once for all eval workers (those not installed are skipped).
# (forkserver_exit: imported by the fork server alone, it removes the server's socket at its exit)
_WORKER_PRELOAD = [__name__, "benchmax_gym.eval.policies", "openai", "httptools", FORKSERVER_EXIT]


def _worker_context() -> Any:
    """How eval workers start: forked from a fork server where the platform has one, which
    imports the package and the OpenAI SDK once (each spawned worker imported them again, the
    SDK most: 1.2 s of CPU per worker on 2 cores, more than a second of wall before its first
    request), else spawned. Either way each worker starts from a clean process, never a fork of
    the running parent (its event loop, threads and connections), and imports the script anew
    (a fork server's ``__main__`` preload does not take before Python 3.14)."""
    import multiprocess as mp

    try:
        ctx = mp.get_context("forkserver")
    except ValueError:  # (no fork server on this platform)
        return mp.get_context("spawn")
    ctx.set_forkserver_preload(_WORKER_PRELOAD)  # (read when the server starts, once a process)
    return ctx


async def _play_in_workers(env_id, kwargs, policy, pending, seed, concurrency, workers, sink) -> None:
    """Spread the pairs over ``workers`` processes (``concurrency`` split among them); the
    parent keeps the run directory and the progress bar. One process's event loop tops out at a
    few hundred model calls per second (the HTTP client's CPU): more processes, more calls.
    The ids registered here in Python go to the workers by value (cloudpickle, as to a spawned
    ``SubprocVectorEnv`` worker); one that cannot travel still works where the worker's import
    of the script registers it, else its making there says why."""
    import cloudpickle

    registrations = driver_registrations(cloudpickle.dumps, None, "an eval worker process (cloudpickle)")
    ctx = _worker_context()
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    running, errors, procs, roots = [workers], [], [], []

    def on_message(conn, proc) -> None:
        try:
            kind, value = _receive(conn)
        except (EOFError, OSError):
            proc.join(timeout=1.0)  # (its exit status, when it had one; its traceback went to stderr)
            if proc.exitcode == LAST_WORD_LOST:
                kind, value = "failed", (f"an eval worker exited (status {proc.exitcode}): its last message "
                                         "could not be delivered; see its stderr")
            else:
                kind, value = "failed", f"an eval worker exited (status {proc.exitcode}) without a word"
        if kind == "record":
            try:
                sink.add(value)
            except OSError as exc:  # the run directory cannot be written: stop the run, say why
                if not finished.done():
                    finished.set_exception(exc)
            return
        loop.remove_reader(conn.fileno())
        if kind == "failed":
            errors.append(value)
        running[0] -= 1
        if running[0] == 0 and not finished.done():
            finished.set_result(None)

    # Exactly ``concurrency`` in flight over all workers (the remainder spread one each), and
    # never a worker with nothing to hold (more would only add processes that share the CPU).
    workers = max(1, min(workers, concurrency, len(pending)))
    split = [concurrency // workers + (w < concurrency % workers) for w in range(workers)]
    running[0] = workers
    try:
        from multiprocess import forkserver, resource_tracker

        resource_tracker.ensure_running()  # (first: it unblocks SIGINT once it has started)
        forked = ctx.get_start_method() == "forkserver"
        if forked:  # once a process: the workers are its children
            with _ctrl_c_blocked():
                forkserver.ensure_running()
        for w in range(workers):
            parent, child = ctx.Pipe()
            tmp = tempfile.mkdtemp(prefix="benchmax-eval-worker-")  # removed once the worker has ended
            roots.append(tmp)
            os.chmod(tmp, 0o711)  # a sandbox's unprivileged uid must reach its workspace inside
            proc = ctx.Process(target=_worker_main, daemon=True, args=(
                child, env_id, kwargs, policy, pickle.dumps(pending[w::workers], protocol=pickle.HIGHEST_PROTOCOL), seed,
                split[w], dict(os.environ), registrations, tmp))
            with contextlib.nullcontext() if forked else _ctrl_c_blocked():
                proc.start()
            child.close()
            procs.append((parent, proc))
            loop.add_reader(parent.fileno(), on_message, parent, proc)
        with fewer_collections():  # (each record read makes ~100 objects, and they all stay: the run's result)
            await finished
    finally:
        for conn, proc in procs:
            try:
                loop.remove_reader(conn.fileno())
            except (ValueError, OSError):
                pass
        # (a cancelled await cancels the future; a write that failed sets its error)
        completed = finished.done() and not finished.cancelled() and finished.exception() is None
        try:
            if not completed:  # interrupted: each worker cancels its run, sends its episodes in flight
                _cancel_workers(procs, sink)
        finally:  # (a second Ctrl-C cuts the wait for their episodes short, not this)
            for conn, proc in procs:
                proc.join(timeout=10 if completed else 0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=10)
                conn.close()
            for tmp in roots:  # (what a killed worker's envs could not remove)
                remove_tree(Path(tmp))
    if errors:
        raise RuntimeError(f"an eval worker failed: {errors[0]}")


@contextlib.contextmanager
def _ctrl_c_blocked():
    """SIGINT blocked in this thread: the processes it starts (the fork server, a spawned worker)
    start with it blocked (the mask is kept through fork and exec), and a fork server keeps it so
    for its life, and its workers from birth. A terminal sends Ctrl-C to the whole process group;
    it is the parent's to handle: a fork server hit while it imported its preload (it ignores
    SIGINT only after) died, and the parent's next start failed with a bare EOFError traceback.
    Nothing is lost here: a blocked signal stays pending (or another thread takes it)."""
    import signal

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _cancel_workers(procs: list, sink: Any, wait: float = 10.0) -> None:
    """SIGTERM each live worker and take what it sends until it ends (its ``cancelled`` records),
    for at most ``wait`` seconds in all; whatever is still running then is killed by the caller."""
    import signal
    from multiprocessing.connection import wait as ready

    live = {}
    for conn, proc in procs:
        if proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGTERM)
                live[conn] = proc
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait
    while live and time.monotonic() < deadline:
        for conn in ready(list(live), max(0.0, deadline - time.monotonic())):
            try:
                kind, value = _receive(conn)
            except (EOFError, OSError):
                kind = "gone"
            if kind == "record":
                with contextlib.suppress(OSError):  # (the run directory's write failed: said already)
                    sink.add(value)
            else:
                live.pop(conn)


def _plot(records, summary, path: Path, run: dict[str, Any]) -> None:
    try:
        from benchmax_gym.eval.plots import plot_run
    except ImportError:
        return
    try:
        plot_run(records, summary, path, run)
    except ImportError:
        pass  # matplotlib is in the [plots] extra


def evaluate(env_id: str, policy: Any = "solver", **kwargs: Any) -> EvalResult:
    """Evaluate ``policy`` on ``env_id`` and return an :class:`EvalResult`.

    Args:
        policy: a :class:`~benchmax_gym.eval.policies.ChatPolicy` (a model endpoint), ``"solver"``
            (the reference solver: the ceiling), ``"random"`` or ``"empty"`` (floors), or your
            function ``(obs, info) -> action`` (sync or async).
        env_kwargs: ``gym.make`` arguments.
        k: samples per task; tasks: ``"all"``, ``N`` (the first N) or ``"i:j"`` (a source read
            from a file or a split, with a ``limit``, builds only the tasks up to the last one).
        concurrency: episodes in flight; seed: the run's seed (each pair's reset and sampling seed
            derives from it, so a run is the same whatever order its episodes finish in).
        out: a run directory (resumed when it holds this run already; held while written: a
            second eval into it at once is an :class:`EvalError`); progress: a progress bar;
        plots: PNGs in ``out`` (needs matplotlib).
        retry_failed: run again exactly the failed (task, sample) pairs of the run in ``out`` (same
            seeds), replacing their records, then summarise the whole run anew.
        group_rubric: a :class:`~benchmax_gym.core.group.GroupRubric` that scores each task's
            ``k`` samples together once all have run (default: the env's own, if any); the
            summary's rewards are the group-scored ones, ``success`` stays each episode's own.
        workers: processes to spread the episodes over (``concurrency`` is split exactly among
            them; never more workers than ``concurrency``). One process spends ~0.5 ms of CPU per
            model call (the env's share included), so it tops out near 2,000 calls per second;
            beyond that, more workers. They start from a clean process (a fork server's, where the
            platform has one, else spawned), which imports your script; the ids you registered
            in Python (``register_tool_env``, even under ``if __name__ == "__main__"``) go with
            them, by value (cloudpickle).

    Example::

        from benchmax_gym.eval import ChatPolicy, evaluate
        result = evaluate("benchmax/Math-v0", ChatPolicy("Qwen/Qwen3-8B", base_url="http://localhost:8000/v1"),
                          tasks=100, k=4, out="runs/qwen3-8b")
        print(result.summary["pass_at_k"])
    """
    return run_sync(aevaluate(env_id, policy, **kwargs))


_COUNTS = ("turns", "tool_errors", "parse_errors", "prompt_tokens", "completion_tokens", "finish_reason_length")


def outcome_of(record: Mapping[str, Any]) -> str:
    """A record's ``outcome``; for a record written before outcomes (an older run directory),
    derived as eval classified it: an error the env raised is ``env_error``, any other error
    (the endpoint, a malformed reply, your policy) ``model_error``, else ``truncated`` or ``scored``."""
    outcome = record.get("outcome")
    if outcome in OUTCOMES:
        return outcome
    error = record.get("error")
    if error is not None:
        return ENV_ERROR if str(error).startswith("the env") else MODEL_ERROR
    return TRUNCATED if record.get("truncated") else SCORED


def _record_problem(record: Any) -> str | None:
    """What makes ``record`` no rollout record (the fields the summary reads, by type), or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for key in ("task_index", "sample"):
        if type(record.get(key)) is not int or record[key] < 0:
            return f"{key} is {record.get(key)!r}, not an index"
    reward = record.get("reward")
    if reward is not None and (type(reward) not in (int, float) or not np.isfinite(reward)):
        return f"reward is {reward!r}, not a number"
    if record.get("error") is not None and not isinstance(record["error"], str):
        return "error is not text"
    if "outcome" in record:
        if record["outcome"] not in OUTCOMES:
            return f"outcome is {record['outcome']!r}, not one of {sorted(OUTCOMES)}"
        if is_failure(record["outcome"]) and reward is not None:
            return f"outcome is {record['outcome']}, a failure, yet reward is {reward!r}"
    outcome = outcome_of(record)
    if outcome in SIGNAL:  # a score: what every statistic reads (a null reward would be NaN or crash them)
        said = f"outcome is {outcome}" if "outcome" in record else f"no outcome and no error (so {outcome})"
        if reward is None:
            return f"{said}, a score, yet reward is None"
        if type(record.get("success")) is not bool:
            return f"{said}, a score, yet success is {record.get('success')!r}, not true or false"
        if type(record.get("task_id")) not in (str, int):
            return f"{said}, a score, yet task_id is {record.get('task_id')!r}"
    if not isinstance(record.get("metadata", {}), dict):
        return "metadata is not an object"
    for key in _COUNTS:
        if record.get(key) is not None and type(record[key]) is not int:
            return f"{key} is {record[key]!r}, not a count"
    return None


def read_rollouts(folder: Path, repair: bool = False,
                  pairs: set[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """The records of ``folder/rollouts.jsonl``. A last line cut short (a run killed while writing
    it) is dropped - and removed from the file when ``repair``; any other bad line, a pair twice,
    or (given ``pairs``) a pair outside the run is an error: counted, it would skew the summary.
    So is a score (a ``scored`` or ``truncated`` record) without a finite reward, ``success`` or
    task id: every statistic reads them (a null reward would be NaN in the summary, or crash it).
    A record without ``outcome`` (an older run) gets the derived one (:func:`outcome_of`)."""
    data = _read_safely(folder, "rollouts.jsonl", MAX_ROLLOUTS_BYTES)
    if data is None:
        return []
    lines = data.split(b"\n")
    records, good, seen = [], 0, set()
    for i, line in enumerate(lines):
        if line.strip():
            try:
                record = json.loads(line)
                problem = _record_problem(record)
                if problem:
                    raise ValueError(problem)
            except ValueError as exc:
                if i == len(lines) - 1:
                    if repair:
                        fd = _open_append(folder, "rollouts.jsonl")
                        try:
                            os.ftruncate(fd, good)
                        finally:
                            os.close(fd)
                    break
                raise EvalError(f"{folder}: rollouts.jsonl line {i + 1} is corrupt ({exc}); choose a new "
                                "directory") from None
            pair = (record["task_index"], record["sample"])
            if pair in seen:
                raise EvalError(f"{folder}: rollouts.jsonl line {i + 1} repeats task {pair[0]} sample {pair[1]}; "
                                "this run's records were changed: choose a new directory")
            if pairs is not None and pair not in pairs:
                raise EvalError(f"{folder}: rollouts.jsonl line {i + 1} is task {pair[0]} sample {pair[1]}, "
                                "not a pair of this run (--tasks, -k); choose a new directory")
            seen.add(pair)
            record.setdefault("outcome", outcome_of(record))  # an older run: derived
            records.append(record)
        good += len(line) + 1
    return records


def load_run(path: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(run, records)`` of a run directory (for ``compare``); refuses anything else."""
    folder = Path(path)
    raw = _read_safely(folder, "run.json", MAX_RUN_JSON_BYTES) if folder.is_dir() else None
    if raw is None:
        raise EvalError(f"{folder}: not a benchmax-gym eval run (no run.json)")
    try:
        run = json.loads(raw)
    except ValueError as exc:
        raise EvalError(f"{folder}: run.json is unreadable ({exc})") from None
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        raise EvalError(f"{folder}: run.json is not a {RUN_FORMAT} record")
    return run, read_rollouts(folder)
