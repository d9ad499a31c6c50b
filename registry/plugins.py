"""Environments from other packages: the ``benchmax_gym.envs`` entry-point group.

A package registers its ids by declaring them in its metadata, one entry point per id::

    [project.entry-points."benchmax_gym.envs"]
    "acme/Weather-v0" = "acme_envs.weather:WeatherEnv"

``import benchmax_gym`` registers each with Gymnasium from the metadata alone: the module
(``acme_envs.weather``) is imported only when ``gym.make`` needs it, so a slow or broken plugin
costs nothing until used. A plugin whose metadata is wrong (a name that is no ``ns/Name-vN`` id,
a value that is no ``module:attribute``, an id that another package or a built-in already holds)
is not registered: it is kept in :data:`PROBLEMS` as one line, which ``benchmax-gym list`` and
``doctor`` print. Nothing a plugin declares can break ``import benchmax_gym``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

GROUP = "benchmax_gym.envs"
_ID = re.compile(r"^[\w.\-]+/[\w.\-:]+-v\d+$")
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


#: env id -> the plugin that registered it
PLUGINS: dict[str, Plugin] = {}
#: one line per entry point that could not be registered
PROBLEMS: list[str] = []


def register_plugins() -> None:
    """Register every ``benchmax_gym.envs`` entry point of the installed packages (idempotent;
    never raises: what goes wrong is one line in :data:`PROBLEMS`)."""
    from benchmax_gym import registry

    PROBLEMS.clear()
    try:
        found = _entry_points()
    except Exception as exc:  # a corrupt installed distribution: the built-ins still register
        PROBLEMS.append(f"reading the {GROUP} entry points failed: {type(exc).__name__}: {exc}")
        return
    for package, version, summary, name, value in found:
        where = f"{package} {version}: entry point {name!r} = {value!r}"
        if not _ID.match(name):
            PROBLEMS.append(f"{where}: the name must be an env id like 'acme/Weather-v0'")
            continue
        if not _VALUE.match(value):
            PROBLEMS.append(f"{where}: the value must be 'module:attribute' (a ToolEnv subclass or a factory)")
            continue
        holder = PLUGINS.get(name)
        if holder is not None:
            if holder.package != package:
                PROBLEMS.append(f"{where}: {name} is already registered by {holder.origin}; not registered again")
            continue
        if holder is None and name in registry.ENVS:
            PROBLEMS.append(f"{where}: {name} is a built-in or already registered id; not registered")
            continue
        PLUGINS[name] = Plugin(name, value, package, version)
        entry = registry.EnvEntry(name, value, summary or f"from {package}")
        registry.ENVS[name] = entry
        try:
            registry._register(entry)
        except Exception as exc:  # Gymnasium refused the id
            registry.ENVS.pop(name, None)
            PLUGINS.pop(name, None)
            PROBLEMS.append(f"{where}: Gymnasium refused it: {type(exc).__name__}: {exc}")


def _entry_points() -> list[tuple[str, str, str, str, str]]:
    """``(package, version, summary, name, value)`` of each entry point in the group, in a
    stable order (package, then name)."""
    from importlib import metadata

    rows = []
    seen = set()
    for dist in metadata.distributions():
        try:
            eps = [ep for ep in dist.entry_points if ep.group == GROUP]
            if not eps:
                continue
            package = dist.metadata["Name"] or "?"
            version, summary = dist.version or "?", dist.metadata.get("Summary") or ""
        except Exception as exc:  # unreadable metadata of one distribution
            PROBLEMS.append(f"a distribution's metadata is unreadable: {type(exc).__name__}: {exc}")
            continue
        if package in seen:  # the same distribution twice on sys.path: the first wins, as for imports
            continue
        seen.add(package)
        rows += [(package, version, summary, ep.name, ep.value.strip()) for ep in eps]
    return sorted(rows, key=lambda r: (r[0].lower(), r[3]))


def check_plugins() -> list[str]:
    """Import every registered plugin's attribute (what ``doctor`` does): one line per plugin that
    fails, with the exception, beside :data:`PROBLEMS`."""
    import importlib

    lines = list(PROBLEMS)
    for plugin in PLUGINS.values():
        module, _, attr = plugin.value.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            if not callable(obj):
                raise TypeError(f"{plugin.value} is not callable")
        except (Exception, SystemExit) as exc:  # a module that exits on import is broken, not doctor's end
            message = " ".join(str(exc).split())
            lines.append(f"{plugin.env_id} ({plugin.origin}): {plugin.value} does not load: "
                         f"{type(exc).__name__}: {message}")
    return lines
