"""Environments from other packages: the ``benchmax_gym.envs`` entry-point group.

A package registers its ids by declaring them in its metadata, one entry point per id::

    [project.entry-points."benchmax_gym.envs"]
    "acme/Weather-v0" = "acme_envs.weather:WeatherEnv"

``import benchmax_gym`` registers each with Gymnasium from the metadata alone: the module
(``acme_envs.weather``) is imported only when ``gym.make`` needs it, so a slow or broken plugin
costs nothing until used, and then ``gym.make`` raises the plugin's own error (a note names the
plugin and its entry point, and says so when its package was uninstalled since). An entry point
that is no callable fails there naming it. A plugin whose metadata is wrong (a name that is no
``ns/Name-vN`` id, a value that is no ``module:attribute``, an entry-point file that cannot be
read, an id that a built-in or another library already holds, or that two packages declare) is
not registered: it is one line in :data:`PROBLEMS`, logged as a warning at import, which
``benchmax-gym list`` and ``doctor`` print; ``gym.make`` of an id two packages declare, or whose
value is malformed, raises that line (neither package wins: installing a package must not
silently swap the env an id makes). Nothing a plugin declares can break ``import benchmax_gym``.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GROUP = "benchmax_gym.envs"
# (no ":": gym.make reads "module:id" as a module to import first)
_ID = re.compile(r"^[\w.\-]+/[\w.\-]+-v\d+$")
_VALUE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Plugin:
    """One registered id and where it comes from."""

    env_id: str
    value: str  # "module:attribute"
    package: str
    version: str

    @property
    def origin(self) -> str:
        return f"{self.package} {self.version}"

    def load(self) -> Callable[..., Any]:
        """The class or factory the entry point names, imported now. What goes wrong raises the
        plugin's own error, with a note naming the plugin."""
        module, _, attr = self.value.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in attr.split("."):  # ("module:Class.factory": Gymnasium's loader takes one name)
                obj = getattr(obj, part)
            if not callable(obj):
                raise TypeError(f"{self.value} is {type(obj).__name__} {obj!r:.60}, not an env class or factory")
        except Exception as exc:
            gone = "" if _installed(self.package) else f"; {self.package} is no longer installed"
            exc.add_note(f"(loading {self.env_id} from the plugin {self.origin}, entry point {self.value!r}{gone})")
            raise
        return obj


#: env id -> the plugin that registered it
PLUGINS: dict[str, Plugin] = {}
#: one line per entry point that could not be registered
PROBLEMS: list[str] = []
#: env id -> why no plugin makes it (two packages declare it, its value is malformed): gym.make raises it
REFUSED: dict[str, str] = {}


def __getattr__(name: str) -> Any:
    """Gymnasium's entry point for a plugin's id is ``benchmax_gym.registry.plugins:<id>``: the
    plugin's class or factory, loaded on first use (:meth:`Plugin.load`), or a refused id's error.
    (A string, as Gymnasium's specs are copied and pickled; code that resolves entry points with
    ``load_env_creator`` gets the plugin's class itself.)"""
    if name in REFUSED:
        from gymnasium.error import Error

        raise Error(REFUSED[name])
    if name in PLUGINS:
        return PLUGINS[name].load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_plugins() -> None:
    """Register every ``benchmax_gym.envs`` entry point of the installed packages (idempotent;
    never raises: what goes wrong is one line in :data:`PROBLEMS`, logged as a warning)."""
    import gymnasium as gym

    from benchmax_gym import registry

    PROBLEMS.clear()
    try:
        found = _entry_points()
    except Exception as exc:  # a corrupt installed distribution: the built-ins still register
        PROBLEMS.append(f"reading the {GROUP} entry points failed: {type(exc).__name__}: {exc}")
        found = []
    claims: dict[str, list[tuple[str, str, str, str]]] = {}
    for package, version, summary, name, value in found:
        where = f"{package} {version}: entry point {name!r} = {value!r}"
        if not _ID.match(name):
            PROBLEMS.append(f"{where}: the name must be an env id like 'acme/Weather-v0'")
        elif not _VALUE.match(value):
            PROBLEMS.append(f"{where}: the value must be 'module:attribute' (a ToolEnv subclass or a factory)")
            _refuse(name, PROBLEMS[-1])
        else:
            claims.setdefault(name, []).append((package, version, summary, value))
    for name, rows in claims.items():
        holder = PLUGINS.get(name)
        if holder is not None and any(p == holder.package for p, *_ in rows):
            continue  # (registered by an earlier call)
        if name in registry.ENVS or (name in gym.registry and name not in REFUSED):
            owner = "a built-in id" if name in registry.ENVS else "already registered by another library"
            PROBLEMS.extend(f"{p} {v}: entry point {name!r} = {value!r}: {name} is {owner}; not registered"
                            for p, v, _, value in rows)
            continue
        if len({p for p, *_ in rows}) > 1:
            PROBLEMS.append(f"{name} is declared by {' and '.join(f'{p} {v}' for p, v, *_ in rows)}: registered by "
                            "neither; uninstall all but one")
            _refuse(name, PROBLEMS[-1])
            continue
        package, version, summary, value = rows[0]
        PLUGINS[name] = Plugin(name, value, package, version)
        if REFUSED.pop(name, None) is not None:  # (refused by an earlier call)
            gym.registry.pop(name, None)
        entry = registry.EnvEntry(name, f"{__name__}:{name}", summary or f"from {package}")
        registry.ENVS[name] = entry
        try:
            registry._register(entry)
        except Exception as exc:  # Gymnasium refused the id
            registry.ENVS.pop(name, None)
            PLUGINS.pop(name, None)
            PROBLEMS.append(f"{package} {version}: entry point {name!r} = {value!r}: Gymnasium refused it: "
                            f"{type(exc).__name__}: {exc}")
    for problem in PROBLEMS:
        log.warning("benchmax-gym plugin not registered: %s", problem)


def _refuse(name: str, why: str) -> None:
    """Make ``gym.make(name)`` raise ``why`` (not Gymnasium's "namespace not found"), where the
    id is nobody else's."""
    import gymnasium as gym

    from benchmax_gym import registry

    if name in REFUSED:  # (refused by an earlier call: registered then)
        REFUSED[name] = why
        return
    if name in registry.ENVS or name in gym.registry:
        return
    REFUSED[name] = why
    try:
        registry._register(registry.EnvEntry(name, f"{__name__}:{name}", why))
    except Exception:  # noqa: BLE001  (Gymnasium refused the id: gym.make says it is unknown)
        REFUSED.pop(name, None)


def _installed(package: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(package)
    except Exception:  # noqa: BLE001  (PackageNotFoundError, or metadata unreadable now)
        return False
    return True


def _entry_points() -> list[tuple[str, str, str, str, str]]:
    """``(package, version, summary, name, value)`` of each entry point in the group, in a
    stable order (package, then name)."""
    from importlib import metadata

    rows = []
    seen = set()
    for dist in metadata.distributions():
        try:
            if f"[{GROUP}]" not in (dist.read_text("entry_points.txt") or ""):
                continue  # (no plugin: its other entry points are not ours to read)
            package = dist.metadata["Name"] or "?"
            version, summary = dist.version or "?", dist.metadata.get("Summary") or ""
        except Exception as exc:  # unreadable metadata of one distribution
            PROBLEMS.append(f"a distribution's metadata is unreadable: {type(exc).__name__}: {exc}")
            continue
        if package in seen:  # the same distribution twice on sys.path: the first wins, as for imports
            continue
        seen.add(package)
        try:
            eps = [ep for ep in dist.entry_points if ep.group == GROUP]
        except Exception as exc:  # (a line that is no "name = value")
            PROBLEMS.append(f"{package} {version}: its entry points are unreadable: {type(exc).__name__}: {exc}")
            continue
        rows += [(package, version, summary, ep.name, ep.value.strip()) for ep in eps]
    return sorted(rows, key=lambda r: (r[0].lower(), r[3]))


def check_plugins() -> list[str]:
    """Import every registered plugin's attribute (what ``doctor`` does): one line per plugin that
    fails, with the exception, beside :data:`PROBLEMS`."""
    lines = list(PROBLEMS)
    for plugin in PLUGINS.values():
        try:
            plugin.load()
        except (Exception, SystemExit) as exc:  # a module that exits on import is broken, not doctor's end
            message = " ".join(str(exc).split())
            lines.append(f"{plugin.env_id} ({plugin.origin}): {plugin.value} does not load: "
                         f"{type(exc).__name__}: {message}")
    return lines
