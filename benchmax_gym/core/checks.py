"""Argument checks shared by the engine, the families and their task sources.

Each check is ``check(name, value) -> value`` (normalised) and raises a ValueError naming the
argument, so a bad configuration fails at ``gym.make`` with one line that says what to pass.
The factories (:func:`int_between`, :func:`one_of`, :func:`optional`...) build checks to
declare next to a field of a :class:`Checked` dataclass with :func:`arg`.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

Check = Callable[[str, Any], Any]


#: the most a count (episodes, samples, sessions, workers, requests in flight, tokens of a reply)
#: may be, on the command line and for a server's ``max_sessions``: each counts things held at once
#: or planned in a list in one process, and a million is past a machine's file-descriptor ceiling
#: (Linux's nr_open, 1,048,576 by default: a session, a worker or a request holds one at least) and
#: past any model's reply; a larger one is a typo (or ``10**20``), which built a plan until memory
#: ran out, served with no limit at all, or failed every model request
COUNT_MAX = 1_000_000
#: the most retries of one model request: the SDK backs off up to 8 s between them, so 100 already
#: waits some 13 minutes on a server that is down; more only hangs the run
RETRIES_MAX = 100


def arg(default: Any = None, check: Check | None = None) -> Any:
    """A field of a :class:`Checked` dataclass with its check (which may normalise the value)."""
    return field(default=default, metadata={"check": check} if check else {})


@dataclass(frozen=True)
class Checked:
    """A frozen dataclass whose fields declared with :func:`arg` are checked when it is made."""

    def __post_init__(self) -> None:
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None:
                object.__setattr__(self, f.name, check(f.name, getattr(self, f.name)))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(name: str, value: Any) -> int:
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def positive_size(name: str, value: Any) -> int:
    """A positive int that fits an index (a count of items): a larger one passed the check and
    failed later with OverflowError."""
    if not _is_int(value) or not 0 < value <= sys.maxsize:
        raise ValueError(f"{name} must be a positive int up to {sys.maxsize}, got {value!r}")
    return value


def non_negative_int(name: str, value: Any) -> int:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def positive_number(name: str, value: Any) -> float:
    if not _is_number(value) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def finite_number(name: str, value: Any) -> float:
    """Any number but NaN and inf: a bar compared with (``reward >= nan`` kept nothing, ``-inf``
    everything, as if the bar were left out)."""
    if not _is_number(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def at_least(low: float, unit: str = "") -> Check:
    """A finite number ``low`` or more (a sampling temperature: NaN and inf cannot be sent as JSON)."""
    def check(name: str, value: Any) -> float:
        if not _is_number(value) or not low <= value < math.inf:
            raise ValueError(f"{name} must be a finite number, {low:g}{unit} or more, got {value!r}")
        return float(value)
    return check


def positive_up_to(high: float, unit: str = "") -> Check:
    """A number above 0 and at most ``high`` (inf and NaN refused): a bound turned into an int or
    a timeout must stay finite."""
    def check(name: str, value: Any) -> float:
        if not _is_number(value) or not 0 < value <= high:
            raise ValueError(f"{name} must be a positive number up to {high:g}{unit}, got {value!r}")
        return float(value)
    return check


#: a timeout a thread can wait for (a larger one fails every threaded wait with OverflowError)
seconds = positive_up_to(threading.TIMEOUT_MAX, " seconds")


def mapping(name: str, value: Any) -> Mapping:
    """A dict (of options): a list or a string is refused, not read as empty or iterated."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict, got {value!r}")
    return value


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def int_between(low: int, high: int, unit: str = "") -> Check:
    """An int from ``low`` to ``high``, both inclusive."""
    def check(name: str, value: Any) -> int:
        if not _is_int(value) or not low <= value <= high:
            raise ValueError(f"{name} must be an int from {low} to {high}{unit}, got {value!r}")
        return value
    return check


def number_between(low: float, high: float, unit: str = "") -> Check:
    """A number from ``low`` to ``high``, both inclusive."""
    def check(name: str, value: Any) -> float:
        if not _is_number(value) or not low <= value <= high:
            raise ValueError(f"{name} must be a number from {low} to {high}{unit}, got {value!r}")
        return float(value)
    return check


#: the schemes of an HTTP(S) endpoint
HTTP_SCHEMES = ("http", "https")
_DOTTED_QUAD = re.compile(r"[0-9]+(\.[0-9]+){3}")


def url_fault(value: Any, schemes: tuple[str, ...] = HTTP_SCHEMES, shape: str | None = None) -> str | None:
    """Why ``value`` is no URL a client can connect to, or None where it is one: a string whose
    scheme is one of ``schemes``, with a host (printable, no spaces; four dotted numbers an IPv4
    address) and, where it names a port, one from 1 to 65535. A bad port or host passed a check of
    the scheme alone and failed at the first request (httpx's ``InvalidURL``, ``connect(): port
    must be 0-65535``), naming no argument. The reason says what was expected (``shape``, by
    default ``http(s)://HOST[:PORT]``) and never quotes the URL: it may hold a credential."""
    shape = shape or f"{'http(s)' if schemes == HTTP_SCHEMES else '/'.join(schemes)}://HOST[:PORT]"
    if not isinstance(value, str):
        return f"expected {shape}"
    try:
        parts = urlsplit(value)
        host = parts.hostname
        if host and _DOTTED_QUAD.fullmatch(host):
            ipaddress.IPv4Address(host)
    except ValueError as exc:  # (an unclosed IPv6 bracket, an IPv4 address past 255)
        return f"not a valid URL ({exc})"
    try:
        port = parts.port
    except ValueError as exc:  # (Python's message quotes a port that is no number: "http://user:secret")
        return f"not a valid URL ({exc if 'out of range' in str(exc) else 'its port is not a number'})"
    if port == 0:
        return "not a valid URL (port 0: a port is 1-65535)"
    if parts.scheme not in schemes or not host or not host.isprintable() or any(c.isspace() for c in host):
        return f"expected {shape}"
    return None


def http_url(shape: str | None = None) -> Check:
    """An http(s) URL with a valid host and port (:func:`url_fault`); ``shape`` what to write
    (e.g. ``http(s)://HOST[:PORT]/v1, e.g. http://localhost:8000/v1``)."""
    def check(name: str, value: Any) -> str:
        fault = url_fault(value, HTTP_SCHEMES, shape)
        if fault is not None:
            raise ValueError(f"{name} {value!r}: {fault}")
        return value
    return check


#: what an OpenAI-compatible endpoint's URL looks like (a model's, a simulated user's, a judge's)
ENDPOINT_SHAPE = "http(s)://HOST[:PORT]/v1, e.g. http://localhost:8000/v1"
endpoint_url = http_url(ENDPOINT_SHAPE)


def one_of(*choices: Any) -> Check:
    def check(name: str, value: Any) -> Any:
        if value not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        return value
    return check


def optional(inner: Check) -> Check:
    """``None`` or what ``inner`` accepts."""
    def check(name: str, value: Any) -> Any:
        return None if value is None else inner(name, value)
    return check


def existing_file(name: str, value: Any) -> str:
    """A path to a regular file that exists now (so a typo fails at make, not at the first
    reset); a FIFO, device or folder is said to be one (reading a FIFO blocks)."""
    if isinstance(value, (str, os.PathLike)) and os.path.exists(value) and not os.path.isfile(value):
        raise ValueError(f"{name}: {os.fspath(value)!r} is not a regular file")
    if not isinstance(value, (str, os.PathLike)) or not os.path.isfile(value):
        raise ValueError(f"{name}: no such file {os.fspath(value) if isinstance(value, os.PathLike) else value!r}")
    return os.fspath(value)


def path(name: str, value: Any) -> str:
    """A path (or URL) as a string; whether it exists is checked where it is opened, but a FIFO
    or a device is refused now (SpreadsheetBench's reader blocked on a FIFO inside gym.make)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a path, got {value!r}")
    if os.path.exists(value) and not (os.path.isfile(value) or os.path.isdir(value)):
        raise ValueError(f"{name}: {value!r} is not a regular file or a folder")
    return value


def path_or_id(name: str, value: Any) -> Any:
    """A local path, a list of paths, or a hub id / URL (checked where it is loaded)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, os.PathLike)) for v in value):
        return [os.fspath(v) for v in value]
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a path, a list of paths or a hub id, got {value!r}")
    return value


def config_of(cls: type) -> Check:
    """A config dataclass from ``None`` (its defaults), an instance, or a dict of its fields."""
    def check(name: str, value: Any) -> Any:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a dict of {cls.__name__} fields, got {value!r}")
        names = [f.name for f in fields(cls) if f.init] if dataclasses.is_dataclass(cls) else None
        unknown = [key for key in value if names is not None and key not in names]
        if unknown:  # named with a suggestion and every field, as an unknown keyword argument is
            hints = [f"{key!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(
                str(key), names, n=1)) else "") for key in unknown]
            raise ValueError(f"{name}: unknown {cls.__name__} field{'s' * (len(hints) > 1)} {', '.join(hints)}; "
                             f"its fields are {', '.join(names)}")
        try:
            return cls(**value)
        except TypeError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return check
