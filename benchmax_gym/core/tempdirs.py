"""Temp folders named for the process that owns them, so a process killed with no chance to
clean up (SIGKILL, the OOM killer, a timed-out job) leaves its episode workspaces only until the
next benchmax-gym process makes one there: that process removes every folder whose owner is gone.

A name is ``benchmax-<kind>-p<pid>-n<pid namespace>-<random>``: a pid means a process only within
its own namespace, so another namespace's (a container sharing ``/tmp``) and another user's folders
are left alone, and a folder is never followed through a link.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["owned_tempdir", "owned_workspace", "remove_owned"]

_OWNED = re.compile(r"benchmax-([a-z]+)-p(\d+)-n(\d+)-")
_swept: set[tuple[int, str]] = set()  # (process, folder): each process sweeps each folder once


def _pid_namespace() -> int:
    """This process's pid namespace (0: unknown): a pid means a process only within its own."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def remove_owned(pid: int | None = None, dir: str | os.PathLike | None = None) -> None:
    """Remove the owned folders in ``dir`` (the temp directory) whose owner has ended: process
    ``pid``'s (the caller knows it ended: a worker it reaped), else every one whose owner is gone
    (a process of this pid namespace, by this user, with no ``/proc/PID``). A folder only, never
    followed through a link (whatever is inside: model code's closed modes and deep trees too);
    another namespace's or another user's are left as they are."""
    from benchmax_gym.core.sandbox import remove_tree  # (it makes its pools with this module)

    namespace = _pid_namespace()
    if not namespace:
        return
    try:
        entries = os.scandir(tempfile.gettempdir() if dir is None else dir)
    except OSError:
        return
    with entries:
        for entry in entries:
            match = _OWNED.match(entry.name)
            if match is None or int(match[3]) != namespace:
                continue
            owner = int(match[2])
            if owner == os.getpid() or (owner != pid if pid is not None else os.path.exists(f"/proc/{owner}")):
                continue
            try:
                if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                    continue
            except OSError:
                continue
            remove_tree(Path(entry.path))


def owned_tempdir(kind: str, dir: str | os.PathLike | None = None) -> Path:
    """A new folder in ``dir`` (the temp directory) named for this process and ``kind`` (``excel``,
    ``mcp``: lower-case letters). The first one a process makes in a folder removes what dead
    owners left there."""
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"kind must be lower-case letters, got {kind!r}")
    where = os.fspath(tempfile.gettempdir() if dir is None else dir)
    if (os.getpid(), where) not in _swept:
        _swept.add((os.getpid(), where))
        remove_owned(dir=where)
    return Path(tempfile.mkdtemp(prefix=f"benchmax-{kind}-p{os.getpid()}-n{_pid_namespace()}-", dir=where))


@contextlib.contextmanager
def owned_workspace(kind: str) -> Iterator[Path]:
    """:func:`owned_tempdir`, removed when done (a process killed inside it leaves it only until
    the next process makes one, where a ``TemporaryDirectory`` stayed for good)."""
    path = owned_tempdir(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
