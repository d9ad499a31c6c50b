"""What the benchmarks share: process memory read from ``/proc`` (psutil is not in the base
install), a one-line exit naming the extra a benchmark needs, and where a peer's interpreter is.

Imported by name: ``python benchmarks/x.py`` puts this folder first on ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys


def need(extra: str, *modules: str, load: bool = True) -> None:
    """Exit (status 2) with one line naming ``pip install 'benchmax-gym[EXTRA]'`` when one of
    ``modules`` does not import; ``load=False``: when one is not installed (for a script whose
    children import them: importing trl, transformers and torch here took ~2.4 s and 250 MB)."""
    for name in modules:
        try:
            if load:
                importlib.import_module(name)
            elif sys.modules.get(name, ...) is None or importlib.util.find_spec(name) is None:
                raise ImportError(name)  # (a module set to None in sys.modules is blocked)
        except ImportError:
            script = os.path.basename(sys.argv[0]) or "benchmark"
            print(f"{script}: needs {name.split('.')[0]}: pip install 'benchmax-gym[{extra}]'", file=sys.stderr)
            raise SystemExit(2) from None


def _proc() -> None:
    if not os.path.isdir("/proc/self"):
        print(f"{os.path.basename(sys.argv[0])}: measures memory from /proc, which this system lacks (Linux only)",
              file=sys.stderr)
        raise SystemExit(2)


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below ``pid`` (default: this one), from the parent ids in /proc/*/stat."""
    _proc()
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])  # after the name: state, ppid
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid or os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def cpu_seconds(pid: int) -> float | None:
    """A live process's CPU time so far (user + system, from /proc/PID/stat); None once it is gone."""
    _proc()
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def memory(pid: int | None = None) -> dict[str, int] | None:
    """``{"rss": bytes, "pss": bytes}`` of a process from /proc/PID/smaps_rollup (PSS shares each
    shared page among its users); None once the process is gone or cannot be read."""
    _proc()
    try:
        with open(f"/proc/{pid or os.getpid()}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            values[key.lower()] = int(rest.split()[0]) * 1024  # kB
    return values if len(values) == 2 else None


def peer_python(flag: str, variable: str, package: str, given: str | None,
                module: str | None = None) -> tuple[str | None, str | None]:
    """``(interpreter, None)`` from ``--FLAG`` or ``$VARIABLE`` (a path, or a command on
    ``$PATH`` such as ``python3``), else this interpreter when ``module`` (the peer's package)
    imports here; or ``(None, why it is skipped)``. A plain interpreter with the peer installed
    is enough: no fixed virtual environment."""
    python = given or os.environ.get(variable)
    if not python:
        if module and importlib.util.find_spec(module) is not None:
            return sys.executable, None
        return None, f"skipped: pass {flag} PYTHON (or set {variable}), an interpreter with {package}"
    if os.sep not in python:
        python = shutil.which(python) or python
    if not os.path.exists(python):
        return None, f"skipped: no interpreter at {python} ({flag} / ${variable})"
    return python, None
