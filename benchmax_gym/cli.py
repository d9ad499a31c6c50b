"""The ``benchmax-gym`` command: list and play environments, evaluate models on them, compare runs, serve them over MCP or OpenEnv, make tasks, launch remote workers.

    benchmax-gym list
    benchmax-gym list --json
    benchmax-gym doctor
    benchmax-gym doctor --json
    benchmax-gym run benchmax/Math-v0 --policy solver --episodes 20
    benchmax-gym run benchmax/Math-v0 --policy random --episodes 5 --seed 1 --jsonl out.jsonl
    benchmax-gym run benchmax/Math-v0 --env-arg tasks=gsm8k --env-arg task_args.dataset=train.jsonl -k 4
    benchmax-gym eval benchmax/Math-v0 --model Qwen/Qwen3-8B --base-url http://localhost:8000/v1 --tasks 100 -k 4 --out runs/qwen3
    benchmax-gym eval benchmax/Math-v0 --policy solver --tasks 100 --out runs/solver
    benchmax-gym compare runs/qwen3 runs/solver
    benchmax-gym mcp-serve benchmax/Excel-v0 --transport http --port 8000
    benchmax-gym launch --nodes 4 --infra k8s --print-yaml
    benchmax-gym launch --nodes 4 --infra k8s --sky-python ~/.venv-sky/bin/python
    benchmax-gym openenv-serve benchmax/Excel-v0 --port 8000
    benchmax-gym tasks from-corpus docs/ --out tasks.jsonl
    benchmax-gym tasks from-traces runs/qwen3/rollouts.jsonl --env benchmax/Math-v0 --keep success=true --out traces.jsonl
    benchmax-gym export-sft runs/qwen3 --out sft.jsonl
    benchmax-gym new acme-weather
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NoReturn

import gymnasium as gym

from benchmax_gym.core import checks
from benchmax_gym.core.checks import COUNT_MAX, RETRIES_MAX


def _parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (VALUE as JSON when it parses); ``task_args.dataset=x`` sets a key of a
    dict argument. A key given twice is refused (the first was silently lost)."""
    kwargs: dict[str, Any] = {}
    given: dict[str, str] = {}  # each dotted key -> the pair that set it (a repeat kept only the last)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or key.startswith(".") or key.endswith("."):
            usage_error(f"--env-arg expects KEY=VALUE or KEY.FIELD=VALUE, got {pair!r}")
        clash = next((given[k] for k in given if k == key or k.startswith(key + ".")), None)
        if clash is not None:
            usage_error(f"--env-arg {pair!r}: {key} is already set by --env-arg {clash!r}; "
                        "give each argument once")
        given[key] = pair
        try:
            value = json.loads(raw)
        except ValueError:  # (text; Python's True/False/None as JSON's: "False" turned python_tool on)
            value = {"True": True, "False": False, "None": None}.get(raw, raw)
        *path, last = key.split(".")
        target = kwargs
        for part in path:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                usage_error(f"--env-arg {pair!r}: {part} is already set to a value that is not a dict")
        if last in target:  # set inside a whole dict an earlier pair gave (task_args='{"limit": 5}')
            clash = next(given[k] for k in given if key.startswith(k + "."))
            usage_error(f"--env-arg {pair!r}: {key} is already set by --env-arg {clash!r}; "
                        "give each argument once")
        target[last] = value
    return kwargs


def list_report() -> dict[str, Any]:
    """What ``list`` shows, as ``list --json`` prints it: each registered id with its description,
    its entry point (``module:attribute``; None for an id registered in Python) and the plugin
    that declares it (``package version``; None for a built-in or one registered in Python), and
    one line per plugin that could not be registered."""
    from benchmax_gym import registry
    from benchmax_gym.registry.plugins import PLUGINS, PROBLEMS

    environments = []
    for env_id in registry.env_ids():
        entry_point = registry.ENVS[env_id].entry_point
        plugin = PLUGINS.get(env_id)
        environments.append({
            "id": env_id, "description": registry.describe(env_id),
            "entry_point": plugin.value if plugin else entry_point if isinstance(entry_point, str) else None,
            "plugin": plugin.origin if plugin else None})
    return {"environments": environments, "broken_plugins": list(PROBLEMS)}


def cmd_list(args: argparse.Namespace) -> int:
    report = list_report()
    if args.json:
        print(json.dumps(report))
        return 0
    width = max(len(e["id"]) for e in report["environments"])
    for entry in report["environments"]:
        origin = f"  [{entry['plugin']}]" if entry["plugin"] else ""
        print(f"{entry['id']:<{width}}  {entry['description']}{origin}")
    for problem in report["broken_plugins"]:
        print(f"broken plugin: {problem}")
    return 0


def doctor_report() -> dict[str, Any]:
    """What ``doctor`` shows, as ``doctor --json`` prints it: ``python`` (version, executable),
    ``packages`` (name: version, None when not installed), ``sandbox`` (``level``, the line
    ``summary``, and with bubblewrap its ``details``: memory, disk, network, mountinfo, uid),
    ``environments`` (the ids), ``plugins`` (id: ``package version``), ``broken_plugins`` (lines),
    ``extras`` (name: ``installed``, ``missing`` requirements, the line ``state``, and
    ``cpu_install``: for an extra that installs only on a GPU machine, its CPU smoke test's install)
    and ``libreoffice`` (``path``, ``version``, the line ``summary``: Excel-v0's ``recalc="libreoffice"``)."""
    import platform
    from importlib import metadata

    from benchmax_gym import registry
    from benchmax_gym.core.sandbox import BUBBLEWRAP, bubblewrap_status, isolation_report, resolve_level, seccomp_filter
    from benchmax_gym.registry.plugins import PLUGINS, check_plugins

    packages: dict[str, str | None] = {}
    for dist in ("benchmax-gym", "gymnasium", "numpy", "datasets", "math-verify", "mcp", "openpyxl"):
        try:
            packages[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            packages[dist] = None
    level = resolve_level("auto")
    ok, detail = bubblewrap_status()
    if level == BUBBLEWRAP:
        who = ("root: each sandbox runs its code as its own unprivileged uid" if os.geteuid() == 0
               else "unprivileged: code runs as this uid in a user namespace, its server shielded (PID-namespace "
                    "init, non-dumpable); the process limit counts all of this user's processes")
        filtered = "seccomp filter on" if seccomp_filter() else f"no seccomp filter for {platform.machine()}"
        sandbox = f"{level} ({detail}, checked by running code in it); {who}; {filtered}"
    else:
        sandbox = (f"{level}: {detail}. Tools that run model code are left out; install bubblewrap, "
                   "or opt in to resource limits only with sandbox='rlimits'")
    details = {k.removeprefix("sandbox "): v for k, v in isolation_report()} if level == BUBBLEWRAP else {}
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "packages": packages,
        "sandbox": {"level": level, "summary": sandbox, "details": details},
        "environments": registry.env_ids(),
        "plugins": {p.env_id: p.origin for p in PLUGINS.values()},
        "broken_plugins": check_plugins(),
        "extras": extras_status(),
        "libreoffice": libreoffice_status(),
    }


def libreoffice_status() -> dict[str, str | None]:
    """Headless LibreOffice for Excel-v0's ``recalc="libreoffice"``: where it is, its version
    (what ``soffice --version`` says, within 30 s), and a line for ``doctor``'s table."""
    import subprocess

    from benchmax_gym.envs.excel.recalc import soffice_executable

    path = soffice_executable()
    if path is None:
        return {"path": None, "version": None,
                "summary": "not found: Excel-v0's recalc='libreoffice' needs it (Debian: apt-get install "
                           "libreoffice-calc-nogui); recalc='auto' computes formulas without it"}
    try:
        said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        version = " ".join(said.stdout.split()[:2]) or None
    except (OSError, subprocess.SubprocessError):
        version = None
    return {"path": path, "version": version,
            "summary": f"{version or 'version unknown'} at {path} (Excel-v0's recalc='libreoffice')"}


def cmd_doctor(args: argparse.Namespace) -> int:
    """What this machine gives benchmax-gym: versions, and the isolation level for model code."""
    report = doctor_report()
    if args.json:
        print(json.dumps(report))
        return 0
    python, sandbox = report["python"], report["sandbox"]
    rows = [("python", f"{python['version']} ({python['executable']})")]
    rows += [(dist, version or "not installed") for dist, version in report["packages"].items()]
    rows.append(("sandbox", sandbox["summary"]))
    rows += [(f"sandbox {k}", v) for k, v in sandbox["details"].items()]
    rows.append(("environments", ", ".join(report["environments"])))
    if report["plugins"]:
        rows.append(("plugins", ", ".join(f"{env_id} ({origin})" for env_id, origin in report["plugins"].items())))
    rows += [("broken plugin", line) for line in report["broken_plugins"]]
    rows += [(f"extra {extra}", status["state"]) for extra, status in report["extras"].items()]
    rows.append(("libreoffice", report["libreoffice"]["summary"]))
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


def extras_requirements() -> dict[str, list[str]]:
    """Each optional extra's requirements: the checkout's setup.cfg when running from one (it may be
    newer than the installed metadata), else the installed package's metadata."""
    import configparser
    from importlib import metadata

    from benchmax_gym.launch import _checkout

    root = _checkout()
    if root:
        config = configparser.ConfigParser()
        config.read(os.path.join(root, "setup.cfg"))
        if config.has_section("options.extras_require"):
            return {extra: [line for line in map(str.strip, value.splitlines()) if line and not line.startswith("#")]
                    for extra, value in config.items("options.extras_require")}
    extras: dict[str, list[str]] = {}
    for requirement in metadata.metadata("benchmax-gym").get_all("Requires-Dist") or []:
        if found := re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement):
            extras.setdefault(found[1], []).append(requirement)
    return extras


def extras_rows() -> list[tuple[str, str]]:
    """``doctor``'s line per extra: installed, or what is missing and the pip command."""
    return [(f"extra {extra}", status["state"]) for extra, status in extras_status().items()]


#: extras that install only on a GPU machine (they build flash-attn, deepspeed, vLLM...): their
#: smoke script and its CPU install, as README.md's "Train with a trainer" table gives them
GPU_EXTRAS = {
    "openrlhf": ("openrlhf_smoke.py", "pip install 'benchmax-gym[trl]' aiohttp pylatexenc && "
                 "pip install --no-deps openrlhf==0.11.2"),
    "verl": ("verl_smoke.py", "pip install 'benchmax-gym[trl]' ray==2.60.0 hydra-core tensordict codetiming orjson "
             "cachetools fastapi pandas pillow && pip install --no-deps verl==0.9.1"),
}


def extras_status() -> dict[str, dict[str, Any]]:
    """Each extra: ``installed`` (every requirement for this platform there, at a version it
    allows), the ``missing`` requirements, ``state``, ``doctor``'s line, and ``cpu_install``: for
    an extra that installs only on a GPU machine, the install of its CPU smoke test (else None).
    Read from package metadata (importlib.metadata): nothing heavy is imported."""
    from importlib import metadata

    from packaging.requirements import Requirement

    statuses = {}
    for extra, requirements in extras_requirements().items():
        have, missing = [], []
        for requirement in map(Requirement, requirements):
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
                continue  # not for this platform
            try:
                version = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                missing.append(requirement.name)
                continue
            if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
                missing.append(f"{requirement.name} {version} (wants {requirement.specifier})")
            else:
                have.append(f"{requirement.name} {version}")
        if not missing:
            state = "installed (" + (", ".join(have) if len(have) <= 4 else f"{len(have)} packages") + ")"
        elif extra == "skypilot":
            state = "not here: SkyPilot goes in a venv of its own (launch --sky-python)"
        else:
            state = (f"missing {', '.join(missing)}" + (f" ({len(have)} of {len(have) + len(missing)} there)" if have
                                                        else "") + f": pip install 'benchmax-gym[{extra}]'")
            if extra in GPU_EXTRAS:  # (on CPU that pip fails building them: say what does install)
                script, line = GPU_EXTRAS[extra]
                state += (f" on a GPU machine (it does not install on CPU); for {script} on CPU: {line} "
                          "(README.md, Train with a trainer)")
        statuses[extra] = {"installed": not missing, "missing": missing, "state": state,
                           "cpu_install": GPU_EXTRAS[extra][1] if extra in GPU_EXTRAS else None}
    return statuses


def usage_error(message: Any) -> NoReturn:
    """A bad command line or configuration: one line on stderr, exit status 2 (argparse's)."""
    print(f"benchmax-gym: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(2)


def cannot_make(env_id: str | None, exc: BaseException) -> str:
    """Why ``gym.make(env_id)`` failed, as the env said it: without the suffix Gymnasium adds to a
    TypeError (``... was raised from the environment creator for ID with kwargs (...)``), which
    repeats the arguments, secrets among them. ``env_id`` None: the one that suffix names (an id
    read from a run), else none."""
    suffix = re.search(r" was raised from the environment creator for (.*?) with kwargs \(.*\)\Z", str(exc), flags=re.S)
    said = str(exc)[:suffix.start()] if suffix else str(exc)
    env_id = env_id or (suffix[1] if suffix else None)
    return f"cannot make {env_id}: {said}" if env_id else said


class CommandFailed(SystemExit):
    """A command that ran and failed (:func:`runtime_error`): :func:`main` returns its status, 1,
    as it returns a command's own 1 (eval that scored nothing, a data command with nothing to
    write); a SystemExit elsewhere (a command's function called directly), so the status still ends
    the process."""


def runtime_error(message: Any) -> NoReturn:
    """A failure while running (an environment that cannot start): one line on stderr, exit status 1."""
    print(f"benchmax-gym: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise CommandFailed(1)


def os_error_text(exc: OSError) -> str:
    """``PATH: reason`` for a file that could not be opened, made or written (a message of our own as is)."""
    if not exc.strerror:
        return str(exc)
    return f"{exc.filename}: {exc.strerror}" if exc.filename is not None else exc.strerror


def _closest_env_id(env_id: str) -> str | None:
    """The registered id ``env_id`` most likely meant: the namespace or version left out, another
    case, a typo (gymnasium suggests only within the namespace typed, and only the name)."""
    import difflib

    from benchmax_gym import registry

    keys: dict[str, str] = {}
    for known in registry.env_ids():
        name = known.rpartition("/")[2]
        for key in (known, name, name.rpartition("-v")[0]):
            keys.setdefault(key.lower(), known)
    close = difflib.get_close_matches(env_id.lower(), list(keys), n=1, cutoff=0.75)
    return keys[close[0]] if close else None


def env_id_error(exc: Exception, env_id: str, flag: str = "", command: str = "") -> NoReturn:
    """gym.make refused ``env_id``: say which registered id is close, else where the ids are listed;
    an id not registered may be one a user's module registers, which ``command`` sees only with
    the global ``--import`` (before the command)."""
    if env_id in gym.registry:  # (found, and refused for another reason)
        usage_error(f"{flag}{exc} Run `benchmax-gym list` for the available ids.")
    own = f"an id your own module registers needs it imported first: benchmax-gym --import MODULE {command} ..."
    if close := _closest_env_id(env_id):
        usage_error(f"{flag}no environment {env_id!r}: did you mean {close}? (`benchmax-gym list` shows every id; "
                    f"{own})")
    usage_error(f"{flag}{exc} Run `benchmax-gym list` for the available ids; {own}")


def counted(count: int, noun: str) -> str:
    """``"1 distinct task"``, ``"2 distinct tasks"``: a count and its noun, plural unless one."""
    return f"{count} {noun if count == 1 else noun + 's'}"


def port_number(text: str) -> int:
    """argparse type of a server's ``--port``: 0 (any free one) to 65535; uvicorn would wrap 70000 round.
    Refused in one line (argparse's words, without its usage above them), as the other integer
    options are (:func:`whole_number`)."""
    try:
        port = int(text)
    except ValueError:
        usage_error(f"argument --port: invalid port number: {text[:40]!r}")
    if not 0 <= port <= 65535:
        usage_error(f"argument --port: must be 0 (any free port) to 65535, got {text[:40]}")
    return port


def whole_number(flag: str, high: int | None = None) -> Callable[[str], int]:
    """argparse type of an integer option: ``3.0``, ``1e20``, ``nan`` and a value past ``high``
    refused in one line naming ``flag`` (argparse printed its usage above ``invalid int value``,
    and took ``100000000000000000000`` as it came). A value below the option's least is left to
    the command's own check, which says it."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # (a number past Python's 4300 digits too)
            usage_error(f"{flag} must be a whole number, got {text[:40]!r}")
        if high is not None and value > high:
            usage_error(f"{flag} must be at most {high:,}, got {text[:40]}")
        return value
    return check


def real_number(flag: str, check: checks.Check = checks.finite_number) -> Callable[[str], float]:
    """argparse type of a float option: text that is no number, ``nan``, ``inf`` and what ``check``
    (one of :mod:`benchmax_gym.core.checks`) refuses, in one line naming ``flag`` (argparse took
    ``nan`` as it came: ``export-sft --min-reward nan`` kept nothing, ``compare --max-failure-gap
    nan`` refused every pair of runs, a timeout of ``1e300`` overflowed where it was waited on)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            usage_error(f"{flag} must be a number, got {text[:40]!r}")
        try:
            return check(flag, value)
        except ValueError as exc:
            usage_error(exc)
    return parse


def given(flag: str, what: str) -> Callable[[str], str]:
    """argparse type of an option (or argument) that names a path, a variable or a token: an
    empty one, what an unset ``"$OUT"`` gives, is refused in one line naming ``flag``, as ``--host
    ""`` is (it read as the current folder, as the option left out, or failed later saying
    something else)."""
    def check(text: str) -> str:
        if not text:
            usage_error(f"{flag} is empty (an unset variable?): give {what}")
        return text
    return check


def _check_seed(seed: int) -> None:
    """Gymnasium and numpy refuse a negative seed, deep inside a reset: say so naming --seed."""
    if seed < 0:
        usage_error(f"--seed must be 0 or more, got {seed}")


def episode_plan(args: argparse.Namespace, num_tasks: int | None) -> tuple[str, list[tuple[int, int | None]]]:
    """``(mode, [(seed, task_index or None), ...])`` for ``run``.

    ``--episodes N`` draws N tasks at random (with replacement, as ``reset(seed=SEED+i)`` does).
    Otherwise, when the task list is finite (or ``--first-tasks`` bounds it), each task runs
    exactly once, in order, or ``-k`` times; episode ``j`` is reset with seed ``SEED+j``. An
    unbounded list (the generated default) without either is sampled, 10 episodes.
    """
    k, first = args.rollouts_per_task, args.first_tasks
    if args.episodes is not None:
        if k is not None or first is not None:
            usage_error("--episodes draws tasks at random; -k/--rollouts-per-task and --first-tasks run each "
                        "task in order: use one or the other")
        return "sampled", [(args.seed + i, None) for i in range(args.episodes)]
    if num_tasks is None and first is None:
        if k is not None:
            usage_error("this environment's task list is unbounded: say how many tasks -k applies to with "
                        "--first-tasks N (or sample tasks with --episodes N)")
        return "sampled", [(args.seed + i, None) for i in range(10)]
    count = min(n for n in (num_tasks, first) if n is not None)
    k = k or 1
    plan = [(args.seed + j, i) for j, i in enumerate(i for i in range(count) for _ in range(k))]
    return ("each task once" if k == 1 else f"each task {k} times"), plan


class ResetFailed(RuntimeError):
    """``play``'s reset raised what a bad task raises (a lazily loaded one the env refuses): an
    env error at run time, said in one line (eval records it as the episode's ``env_error``)."""


def play(env: gym.Env, policy: str, plan: list[tuple[int, int | None]], seed: int,
         progress: bool = True) -> list[dict[str, Any]]:
    """Play one episode per ``(seed, task_index)`` of ``plan`` (``task_index`` None: the seed picks)."""
    from tqdm import tqdm

    base = env.unwrapped
    if policy == "solver":
        try:
            act = base.reference_solver()
        except NotImplementedError:
            name = env.spec.id if env.spec else type(base).__name__
            usage_error(f"no reference solver for {name}: use --policy random (or pass solver= to register_tool_env)")
    else:
        env.action_space.seed(seed)

        def act(obs, info):
            return env.action_space.sample()

    results = []
    for episode_seed, task_index in tqdm(plan, desc=env.spec.id if env.spec else "episodes",
                                         disable=not progress, unit="ep"):
        start = time.perf_counter()
        options = None if task_index is None else {"task_index": task_index}
        try:
            obs, info = env.reset(seed=episode_seed, options=options)
        except (ValueError, TypeError, LookupError) as exc:  # a task the env refuses, met at reset (a lazy source's)
            raise ResetFailed(f"the env's reset raised {type(exc).__name__}: {exc}") from exc
        reward, terminated, truncated = 0.0, False, False
        errors: Counter[str] = Counter()
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step(act(obs, info))
            errors.update(info.get("errors") or ([info["error"]] if info.get("error") else []))
        results.append({
            "task_id": base.episode.task.id,
            "reward": reward,
            "terminated": terminated,
            "turns": base.episode.turn,
            "errors": dict(errors),
            "seconds": time.perf_counter() - start,
        })
    return results


def summarize(results: list[dict[str, Any]], wall: float, rollouts_per_task: int = 1) -> dict[str, Any]:
    """Means over episodes; ``errors`` counts every ``info["error"]`` code of every step (parse
    errors, unknown tools, timeouts...), ``errors_by_code`` per code; with several rollouts per
    task, ``pass_at_k`` is the share of tasks that any of their rollouts solved."""
    rewards = [r["reward"] for r in results]
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    by_task: dict[str, list[float]] = {}
    for r in results:
        by_task.setdefault(r["task_id"], []).append(r["reward"])
    summary = {
        "episodes": len(results),
        "tasks": len(by_task),
        "mean_reward": statistics.fmean(rewards),
        "success_rate": sum(r >= 1.0 for r in rewards) / len(rewards),
        "mean_turns": statistics.fmean(r["turns"] for r in results),
        "errors": sum(errors.values()),
        "errors_by_code": dict(sorted(errors.items())),
        "wall_seconds": wall,
        "episodes_per_second": len(results) / wall if wall > 0 else float("inf"),
    }
    if rollouts_per_task > 1:
        summary["pass_at_k"] = sum(max(r) >= 1.0 for r in by_task.values()) / len(by_task)
    return summary


def _check_jsonl(args: argparse.Namespace) -> None:
    """Refuse, before any episode runs, a ``--jsonl`` path that exists (unless ``--append`` or
    ``--overwrite``) or cannot be written."""
    path = args.jsonl
    if not path:
        usage_error("--jsonl needs a file name")
    if args.append and args.overwrite:
        usage_error("--append and --overwrite exclude each other")
    if os.path.isdir(path):
        usage_error(f"--jsonl {path}: is a directory")
    if os.path.lexists(path):
        if not (args.append or args.overwrite):
            usage_error(f"--jsonl {path} exists: pass --append to add to it or --overwrite to replace it")
        if not os.access(path, os.W_OK):
            usage_error(f"--jsonl {path}: not writable")
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        usage_error(f"--jsonl {path}: no such directory: {folder}")
    if not os.access(folder, os.W_OK):
        usage_error(f"--jsonl {path}: cannot create a file in {folder}")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two spellings name one file (``./x``, a symlink, a hard link), existing or not."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except (OSError, ValueError):  # (one of them does not exist yet; a NUL in one)
        return False


def _refuse_writing_an_env_file(flag: str, out: str, env_args: Any, key: str = "") -> None:
    """Refuse ``out`` when an ``--env-arg`` names that same file (a tasks file, a dataset): the
    episodes written there replaced what the env reads."""
    if isinstance(env_args, dict):
        for k, v in env_args.items():
            _refuse_writing_an_env_file(flag, out, v, f"{key}.{k}" if key else str(k))
    elif isinstance(env_args, list):
        for i, v in enumerate(env_args):
            _refuse_writing_an_env_file(flag, out, v, f"{key}[{i}]")
    elif isinstance(env_args, str) and env_args and same_file(env_args, out):
        usage_error(f"{flag} {out} is the file of --env-arg {key}={env_args}, which the env reads: "
                    "write the episodes elsewhere")


def cmd_run(args: argparse.Namespace) -> int:
    import benchmax_gym  # noqa: F401  (registers the ids)
    from benchmax_gym.core.tasks import INFINITE
    from benchmax_gym.wrappers import RecordEpisodes

    for flag, value in (("--episodes", args.episodes), ("-k/--rollouts-per-task", args.rollouts_per_task),
                        ("--first-tasks", args.first_tasks)):
        if value is not None and value <= 0:
            usage_error(f"{flag} must be a positive number, got {value}")
    _check_seed(args.seed)
    env_args = _parse_env_args(args.env_arg)
    if args.jsonl is not None:
        _refuse_writing_an_env_file("--jsonl", args.jsonl, env_args)
        _check_jsonl(args)
    elif args.append or args.overwrite:
        flag = "--append" if args.append else "--overwrite"
        usage_error(f"{flag} applies to --jsonl FILE: give one, or leave it out")
    try:
        env = gym.make(args.env_id, **env_args)
    except gym.error.Error as exc:
        env_id_error(exc, args.env_id, command="run")
    except (TypeError, ValueError, OSError, ImportError) as exc:  # ImportError: a missing extra, named
        usage_error(cannot_make(args.env_id, exc))
    tasks = getattr(env.unwrapped, "tasks", None)
    num_tasks = len(tasks) if tasks is not None else INFINITE
    mode, plan = episode_plan(args, num_tasks if num_tasks < INFINITE else None)
    if args.jsonl:
        try:
            if args.overwrite:
                open(args.jsonl, "w").close()
            env = RecordEpisodes(env, args.jsonl)
        except OSError as exc:
            env.close()
            usage_error(f"--jsonl {args.jsonl}: {exc.strerror or exc}")
    try:
        start = time.perf_counter()
        results = play(env, args.policy, plan, args.seed, progress=not args.quiet)
        summary = summarize(results, time.perf_counter() - start, args.rollouts_per_task or 1)
    except (RuntimeError, OSError) as exc:  # the environment failed to start (an MCP server, a lost connection)
        runtime_error(f"{args.env_id}: {exc}")
    except KeyboardInterrupt:  # Ctrl-C: the episodes written so far stay (the one cut short as cancelled)
        return interrupted(f"; the finished episodes are in {args.jsonl} (--append adds to it)" if args.jsonl else "")
    finally:
        env.close()
    summary = {"env_id": args.env_id, "policy": args.policy, "mode": mode, **summary}
    if args.json:
        print(json.dumps(summary))
    else:
        errors = summary["errors_by_code"]
        rows = [
            ("environment", args.env_id),
            ("policy", args.policy),
            ("episodes", f"{summary['episodes']} ({mode}; {counted(summary['tasks'], 'distinct task')})"),
            ("mean reward", f"{summary['mean_reward']:.3f}"),
            ("success rate", f"{summary['success_rate']:.1%}"),
        ]
        if "pass_at_k" in summary:
            rows.append(("pass@k", f"{summary['pass_at_k']:.1%} (a task counts when any rollout solves it)"))
        rows += [
            ("mean turns", f"{summary['mean_turns']:.2f}"),
            ("errors", f"{summary['errors']}" + (" (" + ", ".join(f"{c} {n}" for c, n in errors.items()) + ")"
                                                  if errors else "")),
            ("wall time", f"{summary['wall_seconds']:.2f} s ({summary['episodes_per_second']:.1f} episodes/s)"),
        ]
        width = max(len(k) for k, _ in rows)
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
        if args.jsonl:
            print(f"{'episodes written to':<{width}}  {args.jsonl}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Score a model endpoint (or a baseline) on an environment; see :mod:`benchmax_gym.eval`.
    Ctrl-C: :func:`eval_interrupted`."""
    from benchmax_gym.eval import ChatPolicy, EvalError, PolicyError, aevaluate
    from benchmax_gym.eval.stats import format_summary

    if args.model is None and args.policy is None:
        usage_error("say who plays: --model NAME (with --base-url) or --policy solver|random|empty")
    if args.model is not None and args.policy is not None:
        usage_error("--model and --policy exclude each other")
    _check_seed(args.seed)
    _check_task_count(args.tasks)
    if args.max_retries < 0:
        usage_error(f"--max-retries must be 0 or more, got {args.max_retries}")
    if args.max_tokens is not None and args.max_tokens < 1:
        usage_error(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.policy is not None:  # (they were silently ignored: a baseline run that looked like a sampled one)
        given = [flag for flag, value in (("--base-url", args.base_url), ("--api-key-env", args.api_key_env),
                                          ("--temperature", args.temperature), ("--top-p", args.top_p),
                                          ("--max-tokens", args.max_tokens)) if value is not None]
        if given:
            usage_error(f"{', '.join(given)}: for --model only (--policy {args.policy} calls no model)")
    extra = {}
    if args.model is not None:
        if args.base_url is not None:
            _check_base_url(args.base_url, "--base-url")
        elif os.environ.get("OPENAI_BASE_URL"):
            _check_base_url(os.environ["OPENAI_BASE_URL"], "$OPENAI_BASE_URL")
        # the key's variable: --api-key-env, else OPENAI_API_KEY as the SDK reads it (and it reads
        # OPENAI_BASE_URL when --base-url is not given)
        variable = args.api_key_env or "OPENAI_API_KEY"
        key = os.environ.get(variable) or None
        if args.api_key_env and not key:
            usage_error(f"--api-key-env {args.api_key_env}: the variable is not set")
        if key:
            extra["api_key_env"] = variable  # the variable's name, never the key
        try:
            import openai  # noqa: F401
        except ImportError:
            usage_error("evaluating a model needs the openai package: pip install 'benchmax-gym[eval]'")
        policy: Any = ChatPolicy(args.model, base_url=args.base_url, api_key=key, native_tools=args.tool_mode == "native",
                                 temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                                 timeout=args.timeout, max_retries=args.max_retries, transport=args.transport)
    else:
        policy = args.policy

    try:  # (aevaluate holds the run directory while it writes it: a second eval into it is refused)
        from benchmax_gym.core.aio import run_sync

        result = run_sync(aevaluate(
            args.env_id, policy, env_kwargs=_parse_env_args(args.env_arg), k=args.k, tasks=args.tasks,
            concurrency=args.concurrency, workers=args.workers, seed=args.seed, out=args.out, progress=not args.quiet,
            plots=not args.no_plots, extra_run_info=extra, retry_failed=args.retry_failed))
    except gym.error.Error as exc:
        env_id_error(exc, args.env_id, command="eval")
    except (EvalError, PolicyError) as exc:
        usage_error(exc)
    except OSError as exc:
        if exc.filename is not None and _inside(os.fspath(exc.filename), args.out):  # the run directory's
            usage_error(f"--out {args.out}: cannot write the run there ({os_error_text(exc)})")
        usage_error(cannot_make(args.env_id, exc))
    except (TypeError, ValueError) as exc:
        usage_error(cannot_make(args.env_id, exc))
    except RuntimeError as exc:
        if not str(exc).startswith("an eval worker failed"):
            raise
        runtime_error(f"{exc}; the episodes done are kept in {args.out}: rerun the same command to resume")
    if args.json:
        print(json.dumps(result.summary))
    else:
        print(format_summary(result.summary))
        print(f"run directory: {result.out}")
    episodes, scored = result.summary.get("episodes"), result.summary.get("scored_episodes")
    if episodes and not scored:  # ran, and produced no score: exit 1, as the data commands with nothing to write
        none, their, them = (("the one episode was not scored", "its error is", "it") if episodes == 1 else
                             (f"none of the {episodes} episodes was scored", "their errors are", "them"))
        print(f"benchmax-gym: error: {none}{_commonest_error(result.records)} ({their} in "
              f"{os.path.join(result.out, 'rollouts.jsonl')}; --retry-failed runs {them} again)", file=sys.stderr)
        return 1
    return 0


def _commonest_error(records: list[dict[str, Any]], width: int = 300) -> str:
    """``": OUTCOME: ERROR"``, the most common error of ``records`` on one line, its middle cut past
    ``width`` (a server's own last words, ``FATAL: missing API_KEY``, end it): where only the run
    directory was named, the terminal never showed why (``run`` does)."""
    errors = Counter((r.get("outcome"), " ".join(str(r["error"]).split())) for r in records
                     if isinstance(r, dict) and r.get("error"))
    if not errors:
        return ""
    (outcome, text), count = errors.most_common(1)[0]
    if len(text) > width:
        text = text[: width // 2 - 2] + " ... " + text[-(width // 2 - 3):]
    share = f" (in {count} of {len(records)} episodes)" if len(errors) > 1 else ""
    return f": {outcome}: {text}{share}"


def _check_task_count(tasks: str) -> None:
    """Refuse ``--tasks N`` or ``i:j`` past :data:`COUNT_MAX` tasks: ``--tasks 100000000000000000000``
    ended in an OverflowError traceback, and a few billion on an unbounded task list built its plan
    until memory ran out. (The rest of its form is the run's to check.)"""
    left, colon, right = tasks.partition(":")
    try:
        count = int(right) - int(left or 0) if colon and right else None if colon else int(tasks)
    except ValueError:
        return
    if count is not None and count > COUNT_MAX:
        usage_error(f"--tasks {tasks[:60]}: at most {COUNT_MAX:,} tasks in one run (all takes every task of a "
                    "finite list)")


def _check_base_url(url: str, where: str) -> None:
    """Refuse an endpoint that is not an http(s) URL the client can connect to: a malformed one
    (``http://[::1/v1``, a port past 65535) failed deep in the HTTP client with a traceback.
    The rule is :func:`~benchmax_gym.core.checks.url_fault`, as for ``ChatPolicy(base_url=...)``."""
    fault = checks.url_fault(url, shape=checks.ENDPOINT_SHAPE)
    if fault is not None:
        usage_error(f"{where} {url}: {fault}")


def eval_interrupted(args: argparse.Namespace) -> int:
    """Ctrl-C in ``eval``, whenever it comes (``--import``, the imports, the workers starting,
    episodes in flight): one line saying how far the run got and how to resume, exit status 130."""
    return interrupted(lambda: f": {_eval_progress(args.out)}; rerun the same command to resume")


_said_interrupted = False  # this command's "interrupted" line is out (main() starts each command without)


def interrupted(note: str | Callable[[], str] = "") -> int:
    """Ctrl-C in any command: one line on stderr, ``interrupted`` and ``note`` (what was kept, how
    to resume), and exit status 130, as a shell shows for an interrupted command. Said once: a
    second Ctrl-C that cut the first one's cleanup short (envs closing, workers cancelled) says
    nothing more, and from here on another one (this line's note being read, Python waiting at
    exit for threads or worker processes) ends the process at once with status 130, where it
    printed a traceback."""
    global _said_interrupted
    try:
        signal.signal(signal.SIGINT, _interrupted_again)
    except ValueError:  # (main() called from another thread: Ctrl-C is not delivered there)
        pass
    if not _said_interrupted:
        line = f"\ninterrupted{note() if callable(note) else note}"
        print(line, file=sys.stderr, flush=True)
        _said_interrupted = True
    return 130


def _no_ctrl_c_in_teardown() -> None:
    """An interrupted command's last moments: Python puts SIGINT's default back as it tears down,
    and a Ctrl-C then killed it (status -2 to a parent, not 130). Registered on import, so that it
    runs after the exit callbacks a command registers (a worker pool's join): Ctrl-C still ends those."""
    if _said_interrupted:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


atexit.register(_no_ctrl_c_in_teardown)


def _interrupted_again(signum: int, frame: Any) -> NoReturn:
    """A further Ctrl-C once the command is interrupted: end now, the line said (plain, if its note
    was still being read)."""
    if not _said_interrupted:
        print("\ninterrupted", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return os.path.commonpath([path, folder]) == folder


def _eval_progress(out: str) -> str:
    """``N/M done`` of the run directory ``out`` (what an interrupted eval leaves there)."""
    if not os.path.isfile(os.path.join(out, "run.json")):  # (before the eval's imports: they may be what was cut)
        return "no episode done"
    from benchmax_gym.eval import EvalError, load_run

    try:
        run, records = load_run(out)
    except EvalError:
        return "no episode done"
    cancelled = sum(r["outcome"] == "cancelled" for r in records)
    again = f" ({cancelled} in flight recorded as cancelled: resuming runs them again)" if cancelled else ""
    return f"{len(records) - cancelled}/{run.get('episodes', '?')} done{again}"


def _check_failure_gap(runs: dict[str, list], gap: float, allow: bool) -> None:
    """Refuse (or, with ``allow``, warn about) runs whose failure rates differ by more than ``gap``:
    each mean leaves its run's failures out, so such means are over different episodes."""
    from benchmax_gym.core.outcomes import is_failure
    from benchmax_gym.eval.runner import outcome_of

    rates = {name: sum(is_failure(outcome_of(r)) for r in records) / len(records)
             for name, records in runs.items() if records}
    if len(rates) < 2 or max(rates.values()) - min(rates.values()) <= gap + 1e-12:
        return
    said = ", ".join(f"{name} {rate:.3f}" for name, rate in rates.items())
    if not allow:
        usage_error(f"the runs' failure rates differ by more than --max-failure-gap {gap} ({said}): their means "
                    "are not comparable; rerun the failed episodes (eval --retry-failed) or pass --allow-failure-gap")
    print(f"benchmax-gym: warning: the runs' failure rates differ by more than --max-failure-gap {gap} ({said}); "
          "their means are over different episodes", file=sys.stderr)


def _check_task_sets(infos: dict[str, dict], runs: dict[str, list], allow: bool) -> None:
    """Refuse (or, with ``allow``, warn about) runs over different task sets: each run.json holds its
    task source's content hash (``task_set``), and the same task ids over other tasks pair nothing
    real. Runs whose hashes differ but whose records show the same task under every shared id
    (``task_digest``: runs of one file cut to different ``--tasks N``) are compared. A run without
    a hash (written before hashes) is named in a warning, not refused."""
    hashes = {name: info.get("task_set") for name, info in infos.items()}
    known = {h for h in hashes.values() if h}
    if len(known) > 1 and not _same_shared_tasks(runs):
        said = ", ".join(f"{name} {h}" for name, h in hashes.items() if h)
        if not allow:
            usage_error(f"the runs are over different task sets ({said}): their tasks differ under the same ids; "
                        "pass --allow-different-tasks to compare them anyway")
        print(f"benchmax-gym: warning: the runs are over different task sets ({said})", file=sys.stderr)
    unknown = [name for name, h in hashes.items() if not h]
    if unknown and len(infos) > 1:
        print(f"benchmax-gym: warning: {', '.join(unknown)} records no task set (an older run): its tasks are not "
              "checked against the others'", file=sys.stderr)


def _same_shared_tasks(runs: dict[str, list]) -> bool:
    """Every task id the runs share names the same task in each (its records' ``task_digest``),
    and there is one at least; False where a record of a shared id has no digest (an older run)."""
    digests: dict[str, dict[Any, set]] = {}
    for name, records in runs.items():
        for r in records:
            digests.setdefault(name, {}).setdefault(r.get("task_id"), set()).add(r.get("task_digest"))
    shared = set.intersection(*(set(d) for d in digests.values())) - {None} if len(digests) == len(runs) else set()
    return bool(shared) and all(len(set().union(*(d[t] for d in digests.values())) - {None}) == 1
                                and all(None not in d[t] for d in digests.values()) for t in shared)


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired comparison of eval runs on the tasks they share."""
    from benchmax_gym.eval import EvalError, load_run
    from benchmax_gym.eval.stats import compare, format_compare

    _check_seed(args.seed)
    if args.plots_dir and os.path.exists(args.plots_dir) and not os.path.isdir(args.plots_dir):
        usage_error(f"--plots-dir {args.plots_dir}: not a folder; name a new or existing folder for the PNGs")
    runs, infos = {}, {}
    try:
        for path in args.runs:
            name = os.path.basename(os.path.normpath(path))
            while name in runs:
                name += "'"
            infos[name], runs[name] = load_run(path)
        baseline = None
        if args.baseline is not None:
            baseline = os.path.basename(os.path.normpath(args.baseline))
            if baseline not in runs:
                usage_error(f"--baseline {args.baseline}: not one of the runs compared")
        if not 0 <= args.max_failure_gap <= 1:
            usage_error(f"--max-failure-gap must be within [0, 1], got {args.max_failure_gap}")
        _check_failure_gap(runs, args.max_failure_gap, args.allow_failure_gap)
        _check_task_sets(infos, runs, args.allow_different_tasks)
        result = compare(runs, baseline=baseline, seed=args.seed)
    except EvalError as exc:
        usage_error(exc)
    except ValueError as exc:
        usage_error(f"cannot compare: {exc}")
    if args.plots_dir:
        from benchmax_gym.eval.plots import plot_compare, plots_available

        if not plots_available():  # (before a folder is made; it was a traceback)
            usage_error("--plots-dir: plots need matplotlib: pip install 'benchmax-gym[plots]'")
        try:
            os.makedirs(args.plots_dir, exist_ok=True)
            plot_compare(result, args.plots_dir, infos)
        except OSError as exc:
            usage_error(f"--plots-dir {args.plots_dir}: cannot write the plots there ({os_error_text(exc)})")
    print(json.dumps(result) if args.json else format_compare(result))
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    """Scaffold an environment package (see :mod:`benchmax_gym.scaffold`)."""
    import shlex

    from benchmax_gym.scaffold import names, scaffold

    try:
        root = scaffold(args.name, args.dir, args.id)
    except ValueError as exc:
        usage_error(exc)
    except OSError as exc:  # ours: the folder exists; else --dir is a file, read-only, ...
        usage_error(f"--dir {args.dir}: cannot create the package ({os_error_text(exc)})" if exc.strerror else exc)
    n = names(args.name, args.id)
    print(f"created {root}: {n['env_id']} ({n['package']}/env.py, tasks, tools, rubric, solver, tests)\n"
          f"  cd {shlex.quote(str(root))} && pip install -e '.[test]' && pytest")
    return 0


# mcp-serve's options for --transport http, and their defaults there
_MCP_HTTP_DEFAULTS = {"host": "127.0.0.1", "port": 8000, "idle_timeout": 600.0, "max_sessions": 64,
                      "auth_token": None}


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    from benchmax_gym.serve import ListenError, serve

    given = [name for name in _MCP_HTTP_DEFAULTS if getattr(args, name) is not None]
    if args.transport == "stdio" and given:  # else ignored: the server waits on stdin, nothing listens
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        usage_error(f"{flags}: for --transport http (stdio serves the client that started it): add --transport http")
    for name, default in _MCP_HTTP_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.max_sessions < 1:
        usage_error(f"--max-sessions must be at least 1, got {args.max_sessions}")
    _check_seed(args.seed)
    try:
        serve(args.env_id, args.transport, host=args.host, port=args.port,
              env_kwargs=_parse_env_args(args.env_arg), seed=args.seed, idle_timeout=args.idle_timeout,
              max_sessions=args.max_sessions, auth_token=args.auth_token)
    except ListenError as exc:  # the port in use, named with --port
        usage_error(exc)
    except gym.error.Error as exc:
        env_id_error(exc, args.env_id, command="mcp-serve")
    except (TypeError, ValueError, ImportError, OSError) as exc:  # a bad --env-arg (a missing file, say), found
        usage_error(cannot_make(args.env_id, exc))  # when the first environment is made
    except RuntimeError as exc:  # its first environment failed to start (an MCP server)
        runtime_error(f"cannot start {args.env_id}: {exc}")
    return 0


def cmd_openenv_serve(args: argparse.Namespace) -> int:
    """Serve an environment to OpenEnv clients (see :mod:`benchmax_gym.openenv`)."""
    if args.max_sessions < 1:
        usage_error(f"--max-sessions must be at least 1, got {args.max_sessions}")
    from benchmax_gym.serve import ListenError, listen

    sockets = []
    try:  # the port held from here on (a port in use: said before OpenEnv is imported, the env made)
        sockets = listen(args.host, args.port)
        from benchmax_gym.openenv import serve

        serve(args.env_id, host=args.host, port=args.port, env_kwargs=_parse_env_args(args.env_arg),
              max_sessions=args.max_sessions, idle_timeout=args.idle_timeout, auth_token=args.auth_token,
              sockets=sockets)
    except ListenError as exc:  # the port in use, named with --port
        usage_error(exc)
    except ImportError as exc:
        usage_error(exc)
    except gym.error.Error as exc:
        env_id_error(exc, args.env_id, command="openenv-serve")
    except (TypeError, ValueError, OSError) as exc:  # a bad --env-arg (a missing file, say)
        usage_error(cannot_make(args.env_id, exc))
    except RuntimeError as exc:  # its environment failed to start (an MCP server), made once before serving
        runtime_error(f"cannot start {args.env_id}: {exc}")
    finally:
        for sock in sockets:
            sock.close()
    return 0


def _import_modules(names: list[str]) -> None:
    """``--import MODULE``: modules that register your own ids (register_tool_env, ...) on import."""
    import importlib

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: a module of the project you run from
    for name in names:
        if name.endswith(".py") or os.sep in name:
            module = os.path.splitext(os.path.basename(name))[0]
            usage_error(f"--import takes a module's name, not a file: --import {module}, run from the folder that "
                        f"holds {module}.py (or with it on PYTHONPATH)")
        try:
            importlib.import_module(name)
        except Exception as exc:
            if _from_ctrl_c(exc):
                raise
            usage_error(f"--import {name}: {type(exc).__name__}: {exc}")


# -- launch: a Ray cluster for RayVectorEnv, provisioned by SkyPilot --------------------------------


def cmd_launch(args: argparse.Namespace) -> int:
    import shutil

    from benchmax_gym import launch

    for flag, value in (("--nodes", args.nodes), ("--env-host-slots", args.env_host_slots)):
        if value is not None and value < 1:
            usage_error(f"{flag} must be at least 1, got {value}")
    if not 0 < args.port < 65536:
        usage_error(f"--port must be a port number, 1-65535, got {args.port}")
    sky_python = args.sky_python or os.environ.get("BENCHMAX_GYM_SKY_PYTHON")
    if sky_python and not shutil.which(sky_python):
        where = "--sky-python" if args.sky_python else "$BENCHMAX_GYM_SKY_PYTHON"
        usage_error(f"{where} {sky_python}: no such executable; give the python of a venv with SkyPilot, "
                    "e.g. ~/.venv-sky/bin/python")
    try:
        return _launch(args, launch)
    except SystemExit as exc:  # launch's own messages (SkyPilot missing, SkyPilot failed): one line
        if isinstance(exc.code, str):
            usage_error(exc.code)
        raise


def _launch(args: argparse.Namespace, launch: Any) -> int:
    if args.down:
        launch.run_sky("down", {"name": args.name}, args.sky_python)
        print(f"cluster {args.name} is down")
        return 0
    try:
        config = launch.task_config(args.nodes, cpus=args.cpus, infra=args.infra, name=args.name,
                                    env_host_slots=args.env_host_slots, port=args.port)
    except ValueError as exc:  # (--cpus or --name SkyPilot would refuse: one line, as the other flags')
        usage_error(f"launch: {exc}".replace("cpus must", "--cpus must").replace("name must", "--name must"))
    if args.print_yaml:
        import yaml

        if args.sky_python or os.environ.get("BENCHMAX_GYM_SKY_PYTHON"):  # as SkyPilot reads it
            config = launch.run_sky("yaml", {"config": config}, args.sky_python)["yaml"]
        class Dumper(yaml.SafeDumper):  # scripts as literal blocks, as one writes them
            def represent_str(self, text):
                return self.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)

        Dumper.add_representer(str, Dumper.represent_str)
        print(yaml.dump(config, Dumper=Dumper, sort_keys=False, width=100), end="")
        return 0
    out = launch.run_sky("up", {"name": args.name, "config": config}, args.sky_python)
    print(f"Ray cluster {args.name!r} ({counted(args.nodes, 'node')}) is starting; inside its network:\n"
          f"  RayVectorEnv(..., address='{out['head_ip']}:{out['port']}', "
          "actor_options={'resources': {'benchmax_env_host': 1}})\n"
          f"  `sky logs {args.name}` shows the nodes joining; `benchmax-gym launch --down --name {args.name}` ends it")
    return 0


def _add_launch(sub) -> None:
    la = sub.add_parser("launch", help="provision a Ray cluster of CPU nodes for RayVectorEnv with SkyPilot")
    la.add_argument("--nodes", type=whole_number("--nodes", COUNT_MAX),
                    default=2, help="nodes, the Ray head included (default 2)")
    la.add_argument("--cpus", default="4+", help="CPUs per node, in SkyPilot's notation (default 4+)")
    la.add_argument("--infra", help="where: aws, gcp, k8s, ... (default: SkyPilot's choice)")
    la.add_argument("--name", default="benchmax-envs", help="the cluster's name (default benchmax-envs)")
    la.add_argument("--env-host-slots", type=whole_number("--env-host-slots", COUNT_MAX),
                    help="benchmax_env_host resource per node (default: its CPUs)")
    la.add_argument("--port", type=whole_number("--port"),
                    default=6379, help="the Ray head's port (default 6379)")
    la.add_argument("--print-yaml", action="store_true", help="print the SkyPilot task and launch nothing (offline)")
    la.add_argument("--down", action="store_true", help="tear the cluster down")
    la.add_argument("--sky-python", type=given("--sky-python", "the python of a venv with SkyPilot (or leave it out)"),
                    help="the python of a venv with SkyPilot (its click pin needs a venv of its "
                    "own); default: $BENCHMAX_GYM_SKY_PYTHON, else this interpreter")
    la.set_defaults(func=cmd_launch)


# reStructuredText from docstrings: ``x`` and :role:`x` (or :role:`~a.b.x`) read as x in --help
_RST = re.compile(r":[a-z]+:`~?([^`]+)`|``([^`]+)``")


def plain_text(text: str) -> str:
    """``text`` with reStructuredText markup removed, as a terminal shows it."""
    return _RST.sub(lambda m: m[1] or m[2], text)


class PlainHelpFormatter(argparse.HelpFormatter):
    """Help as plain text: descriptions and option help may come from docstrings."""

    def format_help(self) -> str:
        return plain_text(super().format_help())

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:\n"):  # an example per line, as one types it (not wrapped)
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _stdout_gone() -> bool:
    """Whether stdout is a pipe nobody reads any more (poll says POLLERR)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no fileno (captured), no poll
        return False


class Parser(argparse.ArgumentParser):
    """argparse's parser, saying which command, choice or option a mistyped one most likely meant
    (argparse 3.11 lists every choice, and names no option at all), and an unknown option with the
    usage of the command it was given to (argparse showed the top level's)."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self
            while parser._subparsers is not None:  # the command, then its subcommand, that they were given to
                action = next(a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
                chosen = getattr(parsed, action.dest, None)
                if chosen not in action.choices:
                    break
                parser = action.choices[chosen]
            parser.error(f"unrecognized arguments: {' '.join(extras)}{parser._close_options(extras)}")
        return parsed

    def _close_options(self, extras: list[str]) -> str:
        """``; --epsiodes: did you mean --episodes?`` for each unknown option close to one of this parser's."""
        import difflib

        known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        said = []
        for extra in extras:
            flag = extra.partition("=")[0]
            if flag.startswith("--") and (close := difflib.get_close_matches(flag, known, n=1, cutoff=0.6)):
                said.append(f"{flag}: did you mean {close[0]}?")
        return "; " + "; ".join(said) if said else ""

    def error(self, message: str) -> NoReturn:
        """argparse's usage and one-line error (exit status 2), with the close choice named."""
        import difflib

        if found := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)\Z", message):
            choices = re.findall(r"'([^']*)'", found[2]) or found[2].split(", ")  # (3.12.8 on: unquoted)
            if close := difflib.get_close_matches(found[1], choices, n=1, cutoff=0.6):
                message = f"{message}: did you mean {close[0]}?"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The ``benchmax-gym`` command line: every subcommand, each with its ``func``."""
    parser = Parser(prog="benchmax-gym", description=__doc__.split("\n")[0], formatter_class=PlainHelpFormatter)
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (it registers your own environment ids); repeatable")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="list the registered environments")
    ls.add_argument("--json", action="store_true",
                    help='print one JSON object for scripts: {"environments": [{"id", "description", "entry_point", '
                    '"plugin"}, ...], "broken_plugins": [line, ...]}')
    ls.set_defaults(func=cmd_list)
    doc = sub.add_parser("doctor", help="versions, and the sandbox level for model code on this machine")
    doc.add_argument("--json", action="store_true",
                     help='print one JSON object for scripts: "python" {"version", "executable"}, "packages" '
                     '{name: version or null}, "sandbox" {"level", "summary", "details"}, "environments", '
                     '"plugins", "broken_plugins", "extras" {name: {"installed", "missing", "state"}}')
    doc.set_defaults(func=cmd_doctor)
    run = sub.add_parser("run", help="play episodes with a built-in policy and print a summary")
    run.add_argument("env_id", help="an id from `benchmax-gym list`, e.g. benchmax/Math-v0")
    run.add_argument("--policy", choices=("solver", "random"), default="solver",
                     help="solver (default): the reference solver (reads the solution); random: random text actions")
    run.add_argument("--episodes", type=whole_number("--episodes", COUNT_MAX),
                     metavar="N", help="play N episodes on tasks drawn at random, with "
                     "replacement (default: each task once when the task list is finite, else 10 such episodes)")
    run.add_argument("-k", "--rollouts-per-task", type=whole_number("-k/--rollouts-per-task", COUNT_MAX),
                     metavar="K",
                     help="run each task K times, in order (no --episodes); the summary adds pass@k")
    run.add_argument("--first-tasks", type=whole_number("--first-tasks", COUNT_MAX),
                     metavar="N", help="only the first N tasks (needed with -k when "
                     "the task list is unbounded, as the generated default is)")
    run.add_argument("--seed", type=whole_number("--seed"),
                     default=0, help="episode i is reset with seed SEED+i (default: 0)")
    run.add_argument("--jsonl", metavar="FILE", help="write each episode's messages and rewards to this JSON Lines "
                     "file (an existing file is refused unless --append or --overwrite)")
    run.add_argument("--append", action="store_true", help="--jsonl: add to an existing file")
    run.add_argument("--overwrite", action="store_true", help="--jsonl: replace an existing file")
    run.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for gym.make (VALUE parsed as JSON when it can be); "
                     "task_args.FIELD=VALUE sets one argument of the task source")
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    run.add_argument("--quiet", action="store_true", help="no progress bars (nor those of `datasets` loading one)")
    run.set_defaults(func=cmd_run)
    ev = sub.add_parser("eval", help="score a model endpoint (OpenAI-compatible) or a baseline on an environment")
    ev.add_argument("env_id", help="an id from `benchmax-gym list`")
    ev.add_argument("--model", type=given("--model", "the served model's name"),
                    help="the served model's name (with --base-url)")
    ev.add_argument("--base-url", help="an OpenAI-compatible endpoint, with its /v1, e.g. http://localhost:8000/v1 "
                    "(vLLM, SGLang) (default: $OPENAI_BASE_URL, else the OpenAI API)")
    ev.add_argument("--api-key-env", metavar="VAR", type=given("--api-key-env", "a variable's name"),
                    help="the environment variable holding the API key, never "
                    "written to the run (default: OPENAI_API_KEY)")
    ev.add_argument("--policy", choices=("solver", "random", "empty"), help="a baseline instead of a model")
    ev.add_argument("--tool-mode", choices=("native", "text"), default="native",
                    help="native: tools as schemas, the model's tool_calls; text: calls written in the env's format "
                    "(default: native)")
    ev.add_argument("-k", type=whole_number("-k", COUNT_MAX),
                    default=1, help="samples per task, pass@k for every k up to this (default: 1)")
    ev.add_argument("--tasks", default="all", help="all, N (the first N) or i:j (default: all)")
    ev.add_argument("--concurrency", type=whole_number("--concurrency", COUNT_MAX),
                    default=64, help="episodes in flight (default: 64)")
    ev.add_argument("--workers", type=whole_number("--workers", COUNT_MAX),
                    default=1, help="processes to spread episodes over (concurrency is "
                    "split among them): one process tops out at a few hundred model calls per second (default: 1)")
    # (nan and inf cannot be sent as JSON, and servers refuse the others: every episode failed)
    ev.add_argument("--temperature", type=real_number("--temperature", checks.at_least(0)),
                    help="sampling temperature (default: the server's)")
    ev.add_argument("--top-p", type=real_number("--top-p", checks.positive_up_to(1)),
                    help="nucleus sampling (default: the server's)")
    ev.add_argument("--max-tokens", type=whole_number("--max-tokens", COUNT_MAX),
                    help="tokens per model turn (default: the server's)")
    ev.add_argument("--timeout", type=real_number("--timeout", checks.seconds), default=120.0,
                    help="seconds per model request, the whole reply "
                    "included (default: 120)")
    ev.add_argument("--max-retries", type=whole_number("--max-retries", RETRIES_MAX),
                    default=4, help="retries per request on 429/5xx/timeouts "
                    "(with backoff, honouring Retry-After) (default: 4)")
    ev.add_argument("--transport", choices=("lean", "sdk"), default="lean",
                    help="lean: the openai SDK's requests, retries and errors over a lean HTTP path (~0.1 ms of "
                         "CPU a request); sdk: every request through the SDK itself (default: lean)")
    ev.add_argument("--seed", type=whole_number("--seed"),
                    default=0, help="the run's seed: each episode's reset and sampling seed "
                    "derives from it (default: 0)")
    ev.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="keyword argument for gym.make, as for run; repeatable")
    ev.add_argument("--out", required=True, type=given("--out", "the run directory"),
                    help="the run directory (run again with the same one to resume)")
    ev.add_argument("--retry-failed", action="store_true", help="run again exactly the failed episodes (model or "
                    "env errors) of the run in --out, same seeds and settings, replacing their records; nothing "
                    "else runs")
    ev.add_argument("--no-plots", action="store_true", help="no PNGs in the run directory")
    ev.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    ev.add_argument("--quiet", action="store_true", help="no progress bars (nor those of `datasets` loading one)")
    ev.set_defaults(func=cmd_eval)
    cmp = sub.add_parser("compare", help="compare eval runs on the tasks they share (paired)")
    cmp.add_argument("runs", nargs="+", metavar="RUN", type=given("RUN", "a run directory"),
                     help="run directories")
    cmp.add_argument("--baseline", type=given("--baseline", "one of the runs compared"),
                     help="the run the others are compared with (default: the first)")
    cmp.add_argument("--seed", type=whole_number("--seed"), default=0, help="bootstrap seed (default: 0)")
    cmp.add_argument("--plots-dir", type=given("--plots-dir", "a folder for the PNGs (or leave it out)"),
                     help="write comparison PNGs here (default: none)")
    cmp.add_argument("--max-failure-gap", type=real_number("--max-failure-gap", checks.number_between(0, 1)),
                     default=0.05, metavar="RATE",
                     help="refuse runs whose failure rates (failed episodes / episodes) differ by more than this: "
                     "their means are over different episodes (default: 0.05)")
    cmp.add_argument("--allow-failure-gap", action="store_true",
                     help="compare despite --max-failure-gap, with a warning")
    cmp.add_argument("--allow-different-tasks", action="store_true",
                     help="compare runs whose task sets (run.json's task_set, a hash of the tasks) differ, with a "
                     "warning")
    cmp.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    cmp.set_defaults(func=cmd_compare)
    new = sub.add_parser("new", help="scaffold an environment package (tasks, tools, rubric, solver, contract "
                         "test, entry point) that passes its own tests")
    new.add_argument("name", help="the package's name, e.g. acme-weather (its folder, distribution and, with - as _, "
                     "import package)")
    new.add_argument("--dir", default=".", type=given("--dir", "the folder to create the package in"),
                     help="where to create the NAME folder (default: here)")
    new.add_argument("--id", type=given("--id", "the env id (or leave it out for PACKAGE/CamelName-v0)"),
                     help="the env id (default: PACKAGE/CamelName-v0)")
    new.set_defaults(func=cmd_new)
    mcp = sub.add_parser("mcp-serve", help="serve an environment's tools as an MCP server (one workspace per session)")
    mcp.add_argument("env_id", help="an id from `benchmax-gym list`")
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                     help="stdio: for the client that starts this command; http: a server at http://HOST:PORT/mcp "
                     "(default: stdio)")
    mcp.add_argument("--host", help="http: the address to listen on (default: 127.0.0.1, loopback)")
    mcp.add_argument("--port", type=port_number,
                     help="http: the port (default: 8000; 0: any free one; the URL is printed)")
    mcp.add_argument("--idle-timeout", type=real_number("--idle-timeout", checks.seconds), metavar="SECONDS",
                     help="http: a session with no request in flight this long is closed with its environment "
                     "(default: 600)")
    mcp.add_argument("--max-sessions", type=whole_number("--max-sessions", COUNT_MAX),
                     help="http: sessions open at once; one more gets HTTP 503 until one ends (default: 64)")
    mcp.add_argument("--auth-token", default=None,
                     type=given("--auth-token", "a token (or leave it out for BENCHMAX_GYM_MCP_TOKEN)"),
                     help="http: require 'Authorization: Bearer TOKEN' (401 without it); "
                          "prefer the BENCHMAX_GYM_MCP_TOKEN variable, which `ps` does not show")
    mcp.add_argument("--seed", type=whole_number("--seed"), default=0,
                     help="each session's environment is reset with this seed (default: 0)")
    mcp.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for gym.make (VALUE parsed as JSON when it can be); "
                     "task_args.FIELD=VALUE sets one argument of the task source")
    mcp.set_defaults(func=cmd_mcp_serve)
    _add_launch(sub)
    from benchmax_gym.data.commands import add_commands  # tasks from-corpus / from-traces, export-sft

    add_commands(sub)
    oe = sub.add_parser("openenv-serve", help="serve an environment to OpenEnv clients (TRL, SkyRL, ...): one "
                        "environment per WebSocket session at /ws (needs the openenv extra)")
    oe.add_argument("env_id", help="an id from `benchmax-gym list` (or yours, with --import MODULE)")
    oe.add_argument("--host", default="127.0.0.1", help="the address to listen on (loopback by default)")
    oe.add_argument("--port", type=port_number, default=8000, help="the port, 8000 by default (0: any free one; the URL is printed)")
    oe.add_argument("--max-sessions", type=whole_number("--max-sessions", COUNT_MAX), default=64,
                    help="WebSocket sessions open at once (64); one more gets CAPACITY_REACHED until one ends")
    oe.add_argument("--idle-timeout", type=real_number("--idle-timeout", checks.seconds), default=600.0,
                    metavar="SECONDS",
                    help="a session with no message this long (600 s) is closed with its environment")
    oe.add_argument("--auth-token", default=None,
                    type=given("--auth-token", "a token (or leave it out for BENCHMAX_GYM_OPENENV_TOKEN)"),
                    help="require 'Authorization: Bearer TOKEN' on every request and WebSocket handshake (401 "
                         "without it); prefer the BENCHMAX_GYM_OPENENV_TOKEN variable, which `ps` does not show")
    oe.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="keyword argument for gym.make (VALUE parsed as JSON when it can be); "
                    "task_args.FIELD=VALUE sets one argument of the task source")
    oe.set_defaults(func=cmd_openenv_serve)
    _finish_help(parser)
    return parser


EXAMPLES = [line.strip() for line in __doc__.splitlines() if line.startswith("    benchmax-gym ")]


def _finish_help(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> None:
    """Each command's --help as plain text that says what the command does (the line the list of
    commands shows; it said nothing) and ends with the module docstring's examples: all of them
    for ``benchmax-gym --help``, a command's own for ``benchmax-gym COMMAND --help``."""
    mine = [line for line in EXAMPLES if tuple(line.split()[1:1 + len(words)]) == words]
    if mine:
        parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in mine)
    parser.formatter_class = PlainHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                command = action.choices[choice.dest]
                command.description = command.description or choice.help
                _finish_help(command, (*words, choice.dest))


def console() -> NoReturn:
    """The ``benchmax-gym`` command (and ``python -m benchmax_gym``): :func:`main`, then exit with
    its status. An interrupted command keeps its Ctrl-C handling while Python exits (it waits for
    threads and worker processes there): a further Ctrl-C ends it with status 130 at once."""
    sys.exit(_run(None))


def main(argv: list[str] | None = None) -> int:
    """Run one command in this process and return its exit status (``benchmax-gym ARGS`` is
    ``main(ARGS)``): 0 done, 1 it ran and failed (said in one line on stderr), 130 interrupted, 141
    its reader left. A usage error (a bad command line or option value, said in one line) raises
    ``SystemExit(2)``, as argparse does, and ``--help`` ``SystemExit(0)``. Ctrl-C whenever it
    comes (the parser being built, ``--import``, the command's imports, gym.make, its work) is
    one line on stderr and status 130, as a shell shows for an interrupted command
    (:func:`interrupted`). The caller's own Ctrl-C handling is back when it returns: a
    notebook's next Ctrl-C interrupts its cell, where it ended the whole process."""
    global _said_interrupted
    handler = signal.getsignal(signal.SIGINT)  # (None: one not set from Python, which cannot be put back)
    unraisable = sys.unraisablehook
    try:
        return _run(argv)
    finally:
        sys.unraisablehook = unraisable
        if handler is not None and signal.getsignal(signal.SIGINT) is not handler:
            with contextlib.suppress(ValueError):  # (not the main thread: it set none either)
                signal.signal(signal.SIGINT, handler)
        _said_interrupted = False  # (nor does the process ignore Ctrl-C as it exits)


def _run(argv: list[str] | None) -> int:
    """:func:`main`'s work, the Ctrl-C handling an interrupted command installs left in place."""
    global _said_interrupted
    _said_interrupted = False
    args = None
    if not isinstance(sys.unraisablehook, _CtrlCInFinalizers):
        sys.unraisablehook = _CtrlCInFinalizers(sys.unraisablehook)
    try:
        args = build_parser().parse_args(argv)
        undo = _datasets_bars_off() if getattr(args, "quiet", False) else None  # (--quiet: nor datasets' bars)
        try:
            _import_modules(args.imports)
            return args.func(args)
        except CommandFailed as exc:  # (returned, as a command's own failure status is)
            return exc.code
        except BrokenPipeError:  # the reader left (`| head`): stop quietly, as other commands do
            if not _stdout_gone():  # another pipe (an MCP server's, say): a real failure
                raise
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit's flush)
            return 141  # 128 + SIGPIPE, what a shell shows for such a command
        finally:
            if undo is not None:
                undo()
    except BaseException as exc:
        if isinstance(exc, SystemExit) or not _from_ctrl_c(exc):
            raise
        if args is not None and args.func is cmd_eval:
            return eval_interrupted(args)
        return interrupted()


def _from_ctrl_c(exc: BaseException) -> bool:
    """Whether Ctrl-C is behind ``exc``: a KeyboardInterrupt, a task group holding one (the MCP
    stdio server's), or an error raised because of one. Libraries turn Ctrl-C into other errors
    where it lands in their code: Python 3.11 re-raises one from a ``__set_name__`` (a dataclass
    field's, as a class is made) as RuntimeError, and a bare ``except:`` around an import
    (multiprocess's, dill's) raises ImportError while handling it."""
    pending, seen = [exc], set()
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, KeyboardInterrupt):
            return True
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        pending += [exc.__cause__, exc.__context__]
    return False


class _CtrlCInFinalizers:
    """Ctrl-C that lands in a finalizer (an env or episode dropped, its cleanup running) is raised
    again where the command runs: Python prints what a finalizer raises and drops it, and the
    command went on as if Ctrl-C never came. Other unraisable errors go to the hook before it."""

    def __init__(self, previous: Callable[[Any], Any]):
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            try:  # (from here, or anywhere in the finalizers still running, it would be dropped again)
                threading.Thread(target=_ctrl_c_again, daemon=True).start()
                return
            except RuntimeError:  # (the interpreter is exiting: no new thread)
                pass
        self.previous(unraisable)


def _ctrl_c_again() -> None:
    """Ctrl-C to the main thread once the finalizers running now are done (a signal, not a flag,
    so that a main thread blocked in a read wakes); one landing in a finalizer again comes back.
    Not before the hook that started this thread has returned: one landing in the hook itself is
    dropped for good (on a loaded machine the main thread can take any time to get there)."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + 60
    while True:
        time.sleep(0.01)
        frame = sys._current_frames().get(main)
        while frame is not None and frame.f_code is not _CtrlCInFinalizers.__call__.__code__:
            frame = frame.f_back
        if frame is None or time.monotonic() > deadline:
            break
    if callable(signal.getsignal(signal.SIGINT)):  # (a handler from Python; the default would kill)
        signal.pthread_kill(main, signal.SIGINT)


def _datasets_bars_off() -> Callable[[], None]:
    """Silence the progress bars ``datasets`` draws as it loads a file (its variable, read when
    it is imported and inherited by workers; its switch, if already imported), for this command
    only: a caller of :func:`main` in-process gets the variable and an imported ``datasets``'
    switch back."""
    before = os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS")
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    imported = sys.modules.get("datasets")
    was_off = imported is not None and not imported.is_progress_bar_enabled()
    if imported is not None:
        imported.disable_progress_bars()

    def undo() -> None:
        if before is None:
            os.environ.pop("HF_DATASETS_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = before
        if imported is not None and not was_off:  # (one the command imported read the variable: off)
            imported.enable_progress_bars()

    return undo


if __name__ == "__main__":
    console()
