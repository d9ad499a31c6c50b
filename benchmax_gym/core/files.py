"""Host-side access to files in an episode's workspace, where model code may have planted anything.

The host runs with more rights than the model's code, so it must never follow what the code
wrote: a symlink (absolute or relative, in any path component) to a host file, a hard link to
one, a FIFO that blocks the reader forever, a device such as ``/dev/zero``. These helpers open
only regular files inside the workspace, one ``O_NOFOLLOW`` component at a time, non-blocking,
with one link, and read at most a given number of bytes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from benchmax_gym.core.tools import ToolError

__all__ = ["WorkspaceFileError", "read_workspace_file", "write_workspace_file", "workspace_file_version", "unchanged"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


class WorkspaceFileError(ToolError):
    """A workspace file the host refuses to use. ``code``: ``file_missing``, ``unsafe_file``
    (a symlink, hard link, FIFO, device or directory) or ``file_too_large``."""


def _parent(root: str | os.PathLike, name: str) -> tuple[int, str]:
    """An fd of the directory holding ``root/name``, reached one ``O_NOFOLLOW`` component at a
    time, and the file's own name in it."""
    parts = [p for p in Path(name).parts if p not in ("", ".")]
    if not parts or Path(name).is_absolute() or ".." in parts:
        raise WorkspaceFileError(f"{name!r} is not a path inside the workspace", code="unsafe_file")
    try:  # the workspace itself is the host's: only what lies below it is followed by no link
        fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    except OSError:
        raise WorkspaceFileError(f"the workspace holding {name} is gone", code="file_missing") from None
    try:
        for part in parts[:-1]:
            try:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            except FileNotFoundError:
                raise WorkspaceFileError(f"{name} does not exist in the workspace", code="file_missing") from None
            except OSError:
                raise WorkspaceFileError(f"{name}: {part!r} is not a plain directory (a symbolic link?)", code="unsafe_file") from None
        return fds.pop(), parts[-1]
    finally:
        for fd in fds:
            os.close(fd)


def _open_in(dir_fd: int, base: str, name: str, flags: int) -> int:
    try:
        return os.open(base, flags | _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise WorkspaceFileError(f"{name} does not exist in the workspace", code="file_missing") from None
    except OSError as exc:  # ELOOP: a symbolic link; ENXIO: a FIFO without reader, ...
        raise WorkspaceFileError(f"{name} cannot be opened ({os.strerror(exc.errno)}): only a regular file is used", code="unsafe_file") from None


def _open(root: str | os.PathLike, name: str, flags: int) -> int:
    dir_fd, base = _parent(root, name)
    try:
        return _open_in(dir_fd, base, name, flags)
    finally:
        os.close(dir_fd)


def _check(fd: int, name: str, max_bytes: int | None) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise WorkspaceFileError(f"{name} is not a regular file (a FIFO, device or directory); only a regular file is used", code="unsafe_file")
    if st.st_nlink != 1:
        raise WorkspaceFileError(f"{name} has {st.st_nlink} hard links; only a file with one link is used (copy it instead)", code="unsafe_file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise WorkspaceFileError(f"{name} is {st.st_size} bytes, over the limit of {max_bytes}", code="file_too_large")
    return st


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def unchanged(root: str | os.PathLike, name: str, version: tuple | None) -> bool:
    """Whether ``root/name`` is still the regular, single-link file of ``version`` (as read
    before through these helpers): one ``lstat`` and no open, for a cache's hot path."""
    try:
        st = os.lstat(os.path.join(root, name))
    except OSError:
        return False
    return version is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and _version(st) == version


def workspace_file_version(root: str | os.PathLike, name: str, max_bytes: int | None = None) -> tuple[int, int, int, int]:
    """``(device, inode, mtime_ns, size)`` of a safe workspace file, to tell whether it changed."""
    fd = _open(root, name, os.O_RDONLY)
    try:
        return _version(_check(fd, name, max_bytes))
    finally:
        os.close(fd)


def read_workspace_file(root: str | os.PathLike, name: str, max_bytes: int) -> tuple[bytes, tuple[int, int, int, int]]:
    """The bytes of ``root/name`` and its version (see :func:`workspace_file_version`), if it is
    a regular file with one link and at most ``max_bytes`` long; else :class:`WorkspaceFileError`."""
    fd = _open(root, name, os.O_RDONLY)
    try:
        st = _check(fd, name, max_bytes)
        chunks, left = [], max_bytes + 1  # a file that grows while read is still capped
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise WorkspaceFileError(f"{name} is over the limit of {max_bytes} bytes", code="file_too_large")
        return data, _version(st)
    finally:
        os.close(fd)


def write_workspace_file(root: str | os.PathLike, name: str, data: bytes) -> tuple[int, int, int, int]:
    """Replace the existing regular file ``root/name`` with ``data`` and return its new version.

    ``data`` goes to a new file beside it (created exclusively, never through a link), which is
    then renamed over it: a write that fails (a full disk) leaves the old file whole. The new
    file takes the old one's owner and mode, so the model's code may still change it."""
    dir_fd, base = _parent(root, name)
    try:
        fd = _open_in(dir_fd, base, name, os.O_RDONLY)
        try:
            st = _check(fd, name, None)
        finally:
            os.close(fd)
        temp = f".{base}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            try:
                try:
                    os.fchown(fd, st.st_uid, st.st_gid)
                except PermissionError:  # not root: the file is ours, which is what counts
                    if os.fstat(fd).st_uid != st.st_uid:
                        raise
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                version = _version(os.fstat(fd))
            finally:
                os.close(fd)
            os.rename(temp, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        return version
    finally:
        os.close(dir_fd)
