"""The on-disk cache shared by every family: where it lives, downloads into it, safe extraction.

Everything is written atomically (a temp file or folder, then a rename), so concurrent processes
and interrupted runs never leave a half-written entry that a later run would trust.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from urllib.parse import urlparse

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def cache_root(subdir: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$BENCHMAX_GYM_CACHE``, else ``~/.cache/benchmax-gym``; then the
    family's ``subdir`` (``""`` for none). A family's rule never changes: that would orphan its
    existing caches."""
    base = cache_dir or os.environ.get("BENCHMAX_GYM_CACHE") or Path.home() / ".cache" / "benchmax-gym"
    return Path(base).expanduser() / subdir


def cache_folder(folder: str | os.PathLike) -> Path:
    """``folder``, created if need be; a folder that cannot be written (read-only, a file in the
    way) is an :class:`OSError` that names it and says how to choose another."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, os.strerror(13))
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write the cache folder {str(folder)!r} ({exc.strerror or exc}): make it "
                        "writable, or give another with cache_dir= or $BENCHMAX_GYM_CACHE") from None
    return folder


def cached_file(target: str | os.PathLike, build: Callable[[str], object],
                whole: Callable[[Path], bool] = lambda path: True) -> Path:
    """``target``, built once by ``build(path)`` into a new temp file beside it (a random name that
    no planted link can redirect) and renamed into place: concurrent builders each rename a whole
    file, and a killed build leaves no entry. An entry that is not ``whole`` (one a crash left empty
    or cut short) is built again rather than trusted."""
    target = Path(target)
    if target.is_file() and whole(target):
        return target
    fd, partial = tempfile.mkstemp(dir=cache_folder(target.parent), prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    try:
        build(partial)
        os.replace(partial, target)
    finally:
        if os.path.lexists(partial):
            os.remove(partial)
    return target


def whole_sqlite(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a whole SQLite database: its header is there and its size is the page
    count the header records (a file that a crash left empty or cut short is not)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(100)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return False
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0") or header[24:28] != header[92:96]:
        return False  # (the header's page count is valid only while those two counters agree)
    page_size = int.from_bytes(header[16:18], "big")
    pages = int.from_bytes(header[28:32], "big")
    return pages > 0 and size == pages * (65536 if page_size == 1 else page_size)


def download(
    url: str, root: str | os.PathLike, *, fallback_name: str = "download", timeout: float = 60.0
) -> Path:
    """Download ``url`` into ``root/downloads`` once; later calls reuse the file without a request.

    ``fallback_name`` names the file when the URL's path has no file name.
    """
    import httpx  # an mcp dependency; imported here so offline users never need it

    name = os.path.basename(urlparse(url).path) or fallback_name
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    target = Path(root) / "downloads" / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}"
    if target.is_file():
        return target
    fd, partial = tempfile.mkstemp(dir=cache_folder(target.parent), prefix=f".{target.name}.", suffix=".part")
    try:
        with (
            os.fdopen(fd, "wb") as out,
            httpx.stream("GET", url, follow_redirects=True, timeout=timeout) as response,
        ):
            response.raise_for_status()
            for chunk in response.iter_bytes():
                out.write(chunk)
        os.replace(partial, target)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return target


def extract_download(url: str, root: str | os.PathLike, *, fallback_name: str = "download",
                     timeout: float = 60.0) -> Path:
    """:func:`download` then :func:`extract_cached`. A download that is no readable archive (an
    error page, a body cut short) is removed, so the next call fetches it again instead of failing
    on the cached copy forever."""
    archive = download(url, root, fallback_name=fallback_name, timeout=timeout)
    try:
        return extract_cached(archive, root)
    except ValueError as exc:
        archive.unlink(missing_ok=True)
        raise ValueError(f"{url}: {exc} (the download is removed: the next try fetches it again)") from None


def extract_cached(archive: str | os.PathLike, root: str | os.PathLike) -> Path:
    """Extract ``archive`` safely into ``root/extracted`` (once per archive content); return the folder."""
    archive = Path(archive)
    digest = hashlib.sha256()
    with open(archive, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    parent = Path(root) / "extracted"
    target = parent / digest.hexdigest()[:16]
    if (target / ".complete").is_file():
        return target
    staging = Path(tempfile.mkdtemp(dir=cache_folder(parent), prefix=f".{target.name}-"))
    try:
        safe_extract(archive, staging)
        (staging / ".complete").write_text(archive.name)
        if target.exists() and not (target / ".complete").is_file():
            shutil.rmtree(target, ignore_errors=True)  # an interrupted earlier extraction
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / ".complete").is_file():  # not another process finishing first
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def safe_extract(archive: str | os.PathLike, target: str | os.PathLike) -> None:
    """Extract a tar (any compression) or zip archive into ``target``, refusing anything unsafe.

    Every member is checked before anything is written: absolute names, names that resolve
    outside ``target`` (``../``), links whose target is absolute or resolves outside ``target``
    (or passes through another link), members inside a link, and device files, FIFOs and other
    special members all raise :class:`ValueError` naming the member, and so does an archive that is
    cut short or corrupt (naming the archive). Tar extraction also uses ``tarfile``'s ``data``
    filter where Python has it.
    """
    try:
        _extract(Path(archive), Path(target))
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise ValueError(f"{archive}: the archive is cut short or corrupt ({type(exc).__name__}: {exc})") from None


def _extract(archive: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            _check_zip(zf, target)
            zf.extractall(target)
        return
    if not tarfile.is_tarfile(archive):
        raise ValueError(
            f"{archive} is neither a tar nor a zip archive (expected {', '.join(ARCHIVE_SUFFIXES)})"
        )
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        _check_tar(members, target)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, members=members, filter="data")
        else:  # pragma: no cover - Python < 3.11.4; our own checks above still apply
            tar.extractall(target, members=members)


def _absolute(text: str) -> bool:
    return "\x00" in text or text.startswith("/") or bool(re.match(r"^[A-Za-z]:", text))


def _walk(
    text: str, base: Sequence[str], outside: str, links: Container[str] = (), via: str = ""
) -> list[str]:
    """The components ``/``-separated ``text`` leads to from ``base``: ValueError ``outside`` when
    ``..`` climbs above the root, ``via`` when it steps on one of ``links`` on the way."""
    parts = list(base)
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ValueError(outside)
            parts.pop()
        else:
            parts.append(part)
            if "/".join(parts) in links:
                raise ValueError(via)
    return parts


def _parts(name: str, member: str, *, base: Sequence[str] = ()) -> list[str]:
    """The normalised components of ``name`` (relative to ``base``), refusing escapes."""
    text = name.replace("\\", "/")
    if _absolute(text):
        raise ValueError(f"unsafe archive member {member!r}: absolute path {name!r}")
    outside = f"unsafe archive member {member!r}: {name!r} resolves outside the target directory"
    return _walk(text, base, outside)


def _check_member(name: str, target: Path, links: set[str]) -> list[str]:
    parts = _parts(name, name)
    for i in range(1, len(parts)):
        if "/".join(parts[:i]) in links:
            raise ValueError(
                f"unsafe archive member {name!r}: it is inside the link {'/'.join(parts[:i])!r}"
            )
    root = os.path.realpath(target)
    resolved = os.path.realpath(os.path.join(root, *parts))
    if resolved != root and os.path.commonpath([root, resolved]) != root:
        raise ValueError(
            f"unsafe archive member {name!r}: it resolves outside the target directory"
        )
    return parts


def _check_link(name: str, link_target: str, base: Sequence[str], links: set[str]) -> None:
    """A link's target must be relative, stay inside, and not go through another link."""
    text = link_target.replace("\\", "/")
    if not text or _absolute(text):
        raise ValueError(f"unsafe archive member {name!r}: link to absolute path {link_target!r}")
    link = f"unsafe archive member {name!r}: link to {link_target!r}"
    outside, via = f"{link} points outside the target directory", f"{link} goes through another link"
    _walk(text, base, outside, links, via)


def _check_tar(members: Sequence[tarfile.TarInfo], target: Path) -> None:
    links = {"/".join(_parts(m.name, m.name)) for m in members if m.issym() or m.islnk()}
    for m in members:
        if m.ischr() or m.isblk() or m.isfifo():
            raise ValueError(f"unsafe archive member {m.name!r}: device file or FIFO")
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise ValueError(
                f"unsafe archive member {m.name!r}: unsupported member type {m.type!r}"
            )
        parts = _check_member(m.name, target, links)
        if m.issym():
            _check_link(m.name, m.linkname, parts[:-1], links - {"/".join(parts)})
        elif m.islnk():  # hard link targets are archive paths
            _check_link(m.name, m.linkname, (), links - {"/".join(parts)})


def _check_zip(zf: zipfile.ZipFile, target: Path) -> None:
    infos = zf.infolist()
    modes = {info.filename: (info.external_attr >> 16) & 0xFFFF for info in infos}
    links = {
        "/".join(_parts(i.filename, i.filename)) for i in infos if stat.S_ISLNK(modes[i.filename])
    }
    for info in infos:
        mode = modes[info.filename]
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            raise ValueError(
                f"unsafe archive member {info.filename!r}: device file, FIFO or socket"
            )
        parts = _check_member(info.filename, target, links)
        if stat.S_ISLNK(mode):
            link_target = zf.read(info).decode("utf-8", errors="replace")
            _check_link(info.filename, link_target, parts[:-1], links - {"/".join(parts)})

