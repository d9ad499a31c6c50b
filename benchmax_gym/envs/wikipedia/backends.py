"""Where articles come from: one small interface, three backends.

A backend answers two questions, ``search(query, limit) -> [SearchHit]`` and
``article(title) -> Article | None``; the tools format the answers and never ask which backend
they talk to.

* :class:`CorpusBackend` over a :class:`CorpusIndex` - an SQLite FTS5 index (BM25 ranking, title
  weighted 10x) of ``{title, text}`` records. The ``generated`` backend indexes the fictional
  encyclopedia in a shared in-memory database; the ``local`` backend indexes any corpus into a
  file cached on disk under a hash of the corpus, built once and opened read-only per episode.
* :class:`LiveBackend` - the real MediaWiki API through the ``wikipedia-api`` package (articles and
  ``list=search``), which brings the User-Agent, timeouts, and retries with exponential backoff on
  429/5xx honouring ``Retry-After`` (up to one request's timeout: a longer one fails the call at
  once, the wiki is rate-limiting). Its httpx transport is a :class:`CachingTransport`: it
  remembers successful answers (an identical request is not sent twice) and, given ``api_url``,
  sends every request to another MediaWiki server (tests use a local one). A title of another
  wiki (``fr:Paris``, ``wikt:word``: MediaWiki answers with ``interwiki``, no ``pages``) is a
  tool error saying so; a title MediaWiki lists no page for at all is no article.

Corpus text follows MediaWiki's conventions: ``== Heading ==`` lines open sections, a page whose
text is ``#REDIRECT [[Target]]`` is a redirect, and a page saying ``may refer to:`` is a
disambiguation page whose ``[[links]]`` are its candidates. Titles are looked up forgiving case,
underscores and extra spaces, as Wikipedia's search box is.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import os
import re
import sqlite3
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx

from benchmax_gym.core.cache import cache_root, cached_file, whole_sqlite
from benchmax_gym.core.checks import (http_url, int_between, number_between, optional, positive_number, seconds,
                                      text)
from benchmax_gym.core.sources import SourceConfig, arg
from benchmax_gym.core.outcomes import TOOL_UNAVAILABLE
from benchmax_gym.core.tools import ToolError, ToolFailure
from benchmax_gym.core.sqlite_heap import outside_query_bounds, safe_from_query_bounds

USER_AGENT = "benchmax-gym/0.1 (https://github.com/benchmax-gym; multi-hop search QA environment)"
DISAMBIGUATION_CATEGORIES = "Category:All disambiguation pages|Category:Disambiguation pages"
MAX_QUERY_TERMS = 32
MAX_RESPONSE_BYTES = 32 << 20  # one API answer; Wikipedia's longest article is ~1 MB of text
INDEX_VERSION = "1"  # bump when the index schema or text conventions change: old cache files are ignored


@dataclass(frozen=True)
class SearchHit:
    title: str
    snippet: str


@dataclass(frozen=True)
class Section:
    """A titled part of an article; the lead section's title is ``""``."""

    title: str
    text: str


@dataclass(frozen=True)
class Article:
    """An article as the tools show it.

    ``redirected_from`` is the title asked for when it was a redirect; ``disambiguation`` marks a
    page listing other articles of the same name, ``candidates`` (where known) their titles.
    """

    title: str
    sections: tuple[Section, ...]
    redirected_from: str | None = None
    disambiguation: bool = False
    candidates: tuple[str, ...] = ()


class Backend(Protocol):
    def search(self, query: str, limit: int) -> list[SearchHit]: ...

    def article(self, title: str) -> Article | None: ...

    def close(self) -> None: ...


def title_key(title: str) -> str:
    """What two titles must share to name the same page: case, underscores and spacing aside."""
    return " ".join(unicodedata.normalize("NFC", title).replace("_", " ").split()).casefold()


# -- corpus text conventions ------------------------------------------------------------------

_REDIRECT = re.compile(r"^\s*#REDIRECT\s*\[\[([^\]|#]+)[^\]]*\]\]", re.IGNORECASE)
_HEADING = re.compile(r"^(={2,6})\s*(.+?)\s*\1\s*$", re.MULTILINE)
_LINK = re.compile(r"\[\[([^\]|]+)(?:\|([^\]]*))?\]\]")
_DISAMBIGUATION = re.compile(r"\bmay (?:also )?refer to\b", re.IGNORECASE)


def redirect_target(text: str) -> str | None:
    match = _REDIRECT.match(text)
    return match.group(1).strip() if match else None


def parse_article(title: str, text: str, redirected_from: str | None = None) -> Article:
    """Split corpus text into sections; spot disambiguation pages and their candidates."""
    sections, start, heading = [], 0, ""
    for match in _HEADING.finditer(text):
        sections.append(Section(heading, _unlink(text[start:match.start()]).strip()))
        heading, start = match.group(2), match.end()
    sections.append(Section(heading, _unlink(text[start:]).strip()))
    sections = [s for s in sections if s.title or s.text] or [Section("", "")]
    disambiguation = bool(_DISAMBIGUATION.search(text[:2000]))
    candidates = tuple(dict.fromkeys(m.group(1).strip() for m in _LINK.finditer(text))) if disambiguation else ()
    return Article(title, tuple(sections), redirected_from, disambiguation, candidates)


def _unlink(text: str) -> str:
    return _LINK.sub(lambda m: m.group(2) or m.group(1), text)


def fts_query(query: str) -> str | None:
    """The words of ``query`` as an FTS5 query that cannot be a syntax error: each word quoted,
    joined with OR (BM25 ranks pages matching more of them higher). None when there are no words."""
    words = re.findall(r"\w+", query)[:MAX_QUERY_TERMS]
    return " OR ".join(f'"{w}"' for w in words) if words else None


# -- SQLite FTS5 index ------------------------------------------------------------------------


class CorpusIndex:
    """An SQLite FTS5 index of ``{title, text}`` records, opened read-only by each reader.

    Build with :meth:`on_disk` (cached under a hash of the corpus: built once, reused by every
    process) or :meth:`in_memory` (a shared-cache memory database kept alive by this object).
    """

    _memory_lock = threading.Lock()

    def __init__(self, uri: str, keeper: sqlite3.Connection | None = None):
        self.uri = uri
        self._keeper = keeper  # holds a shared in-memory database open

    @classmethod
    def on_disk(cls, records: Iterable[Mapping[str, str]] | Callable[[], Iterable[Mapping[str, str]]], key: str,
                directory: str | os.PathLike | None = None) -> "CorpusIndex":
        """The index for corpus ``key`` (a hash of its content) under :func:`.cache_root`, built if
        absent; ``records`` may be a function that loads them, called only then (a cached index of a
        large corpus opens without reading the corpus again)."""
        folder = cache_root("", directory)  # no family subfolder: existing indexes stay valid

        def build(partial: str) -> None:
            _build(partial, records() if callable(records) else records)

        path = cached_file(folder / f"corpus-v{INDEX_VERSION}-{key}.sqlite", build,
                           whole_sqlite)  # (a concurrent builder's file is as good as ours)
        return cls(f"{path.resolve().as_uri()}?mode=ro")

    @classmethod
    def in_memory(cls, records: list[Mapping[str, str]], name: str) -> "CorpusIndex":
        """Named by ``name`` and a hash of ``records``: a live database of that name is reused."""
        uri = f"file:benchmax-wiki-{name}-{records_digest(records)}?mode=memory&cache=shared"
        with cls._memory_lock:
            keeper = sqlite3.connect(uri, uri=True, check_same_thread=False)
            if not keeper.execute("SELECT count(*) FROM sqlite_master WHERE name = 'pages'").fetchone()[0]:
                _fill(keeper, records)
        return cls(uri, keeper)

    def connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.uri, uri=True, check_same_thread=False)
        db.execute("PRAGMA query_only = ON")
        return db


def _build(path: str, records: Iterable[Mapping[str, str]]) -> None:
    db = sqlite3.connect(path)
    try:
        _fill(db, records)
    finally:
        db.close()


def _fill(db: sqlite3.Connection, records: Iterable[Mapping[str, str]]) -> None:
    db.executescript(
        """
        CREATE TABLE IF NOT EXISTS pages (
            id INTEGER PRIMARY KEY, title TEXT NOT NULL, text TEXT NOT NULL, redirect TEXT);
        CREATE TABLE IF NOT EXISTS titles (key TEXT PRIMARY KEY, id INTEGER NOT NULL) WITHOUT ROWID;
        CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(
            title, text, content='pages', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
        """
    )
    seen: set[str] = set()
    rows, count = [], 0
    for record in records:
        title, text = str(record["title"]).strip(), str(record["text"])
        key = title_key(title)
        if not key or key in seen:  # the first record of a title wins
            continue
        seen.add(key)
        count += 1
        rows.append((count, title, text, redirect_target(text), key))
    db.executemany("INSERT INTO pages VALUES (?, ?, ?, ?)", [r[:4] for r in rows])
    db.executemany("INSERT INTO titles VALUES (?, ?)", [(r[4], r[0]) for r in rows])
    db.executemany("INSERT INTO fts (rowid, title, text) VALUES (?, ?, ?)", [r[:3] for r in rows if r[3] is None])
    db.commit()


def corpus_key(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:24]


@functools.lru_cache(maxsize=64)
def _file_key(path: str, size: int, mtime_ns: int, inode: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    digest.update(b"\0")
    return digest.hexdigest()[:24]


def file_key(path: str | os.PathLike) -> str:
    """``corpus_key(the file's bytes)``, read in chunks (never the whole file in memory) and
    remembered per process while the file is unchanged (same size, mtime and inode)."""
    stat = os.stat(path)
    return _file_key(os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)


class CorpusBackend:
    """Search and read a :class:`CorpusIndex` through this reader's own read-only connection.

    SQLite's heap limit is the process's: while a CRM ``query`` in another episode of the process
    nears its bound, a search here can fail for memory that query took, so the reads run
    :func:`~benchmax_gym.core.sqlite_heap.safe_from_query_bounds` (once more when that query is
    done; out of memory even so, the environment's failure, never the model's error)."""

    def __init__(self, index: CorpusIndex):
        self.db = outside_query_bounds(index.connect)

    def _page(self, title: str) -> tuple[str, str, str | None] | None:
        return self.db.execute(
            "SELECT p.title, p.text, p.redirect FROM titles t JOIN pages p ON p.id = t.id WHERE t.key = ?",
            (title_key(title),),
        ).fetchone()

    @safe_from_query_bounds
    def search(self, query: str, limit: int) -> list[SearchHit]:
        match = fts_query(query)
        if match is None:
            return []
        rows = self.db.execute(
            "SELECT p.title, snippet(fts, 1, '', '', ' ... ', 24), substr(p.text, 1, 200) "
            "FROM fts JOIN pages p ON p.id = fts.rowid WHERE fts MATCH ? "
            "ORDER BY bm25(fts, 10.0, 1.0) LIMIT ?",
            (match, limit + 1),
        ).fetchall()
        hits = [SearchHit(title, " ".join((snippet or lead).split())) for title, snippet, lead in rows]
        exact = self._page(query) if len(query) <= 300 else None
        if exact is not None:  # an exact title (or its redirect's target) comes first, as on Wikipedia
            target = self._page(exact[2]) if exact[2] else exact
            if target is not None:
                first = SearchHit(target[0], " ".join(target[1][:200].split()))
                hits = [first] + [h for h in hits if h.title != first.title]
        return hits[:limit]

    @safe_from_query_bounds
    def article(self, title: str) -> Article | None:
        page = self._page(title)
        redirected_from = None
        for _ in range(3):  # follow redirects (bounded: a cycle is a missing page)
            if page is None or page[2] is None:
                break
            redirected_from = redirected_from or page[0]
            page = self._page(page[2])
        if page is None or page[2] is not None:
            return None
        return parse_article(page[0], page[1], redirected_from)

    def close(self) -> None:
        self.db.close()


# -- live MediaWiki ---------------------------------------------------------------------------


_DECODED_AWAY = (b"content-encoding", b"content-length", b"transfer-encoding")  # the body is kept decoded
#: MediaWiki error codes that are the server's trouble, not the request's (``internal_api_error_*`` too)
SERVER_TROUBLE = ("maxlag", "ratelimited", "readonly", "internal_api_error")


class NotAPage(Exception):
    """A ``titles`` query answered with no page at all (no ``query``, or ``query`` without
    ``pages``): MediaWiki did not look the title up on this wiki. :meth:`LiveBackend.article`
    reads it as no article."""


_PAGES = re.compile(rb'"pages"\s*:\s*[\[{]\s*["{]')  # a non-empty "pages" (text's quotes are escaped)


def pageless_answer(title: str, content: bytes) -> Exception:
    """Why the answer ``content`` to a query for ``title`` lists no pages: a :class:`ToolError`
    when the title belongs to another wiki (``query.interwiki``), else :class:`NotAPage`."""
    try:
        query = json.loads(content).get("query")
    except (ValueError, AttributeError):
        query = None
    interwiki = query.get("interwiki") if isinstance(query, dict) else None
    if isinstance(interwiki, list) and interwiki and isinstance(interwiki[0], dict):
        prefix = interwiki[0].get("iw") or title.partition(":")[0]
        return ToolError(f"{title!r} names a page of another wiki ({prefix!r} is an interwiki prefix), which "
                         "cannot be read here: search this wiki for the subject instead")
    return NotAPage(title)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds, from its seconds or its HTTP-date form; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def api_error(headers: httpx.Headers, content: bytes) -> dict | None:
    """MediaWiki's error answer (``{"error": {code, info}}``, sent with HTTP 200 and a
    ``MediaWiki-API-Error`` header), or None for any other body."""
    if "mediawiki-api-error" not in headers and not content.lstrip().startswith(b'{"error"'):
        return None
    try:
        error = json.loads(content).get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, dict) else None


class CachingTransport(httpx.BaseTransport):
    """An httpx transport that remembers successful GET answers (LRU, at most ``max_entries``
    answers and ``max_bytes`` of bodies: a model reading long articles cannot fill the memory)
    and, when ``api_url`` is set, sends every request there instead of ``{lang}.wikipedia.org``.

    Only 200 answers are kept, so a 429 or 5xx is retried by the client, never replayed; a 429
    whose ``Retry-After`` is longer than ``max_retry_after`` seconds is a :class:`ToolFailure` at
    once (the client would sleep that long: ``86400`` hung the call for a day). A MediaWiki
    error answer (HTTP 200 with ``{"error": ...}``) is never kept either: one the server
    caused (:data:`SERVER_TROUBLE`: lag, rate limit, read-only, internal error) is handed on as a
    503, retried with backoff and then a :class:`ToolFailure`; any other (the request's fault) is
    a :class:`ToolError` with the server's message. An answer to a ``titles`` query that lists
    no pages raises :func:`pageless_answer`'s error. An answer that is not JSON (a proxy's HTML
    page, a body cut short) is the server's trouble too, never "no such article". An answer is
    read at most ``max_response_bytes`` (more is a :class:`ToolFailure`: a 100 MB answer was read
    whole, cached and parsed) and within ``deadline`` seconds in all (httpx bounds each read, so a server
    trickling a byte at a time held the call, and its thread, for as long as it liked; past the
    deadline it is a timeout, retried as one). ``sent`` counts the requests that reached the network.
    """

    def __init__(self, inner: httpx.BaseTransport | None = None, *, api_url: str | None = None,
                 max_entries: int = 4096, max_bytes: int = 256 << 20, max_retry_after: float | None = None,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, deadline: float | None = None):
        self.inner = inner or httpx.HTTPTransport()
        self.max_response_bytes = max_response_bytes
        self.deadline = deadline
        self.api_url = httpx.URL(api_url) if api_url else None
        self.max_retry_after = max_retry_after
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.sent = 0
        self.cached_bytes = 0
        self._cache: OrderedDict[str, tuple[list[tuple[bytes, bytes]], bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.api_url is not None:
            request = httpx.Request(
                request.method, self.api_url.copy_with(query=request.url.query),
                headers=[(k, v) for k, v in request.headers.raw if k.lower() != b"host"],
                extensions=request.extensions,
            )
        key = str(request.url) if request.method == "GET" else None
        with self._lock:
            hit = self._cache.get(key) if key else None
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is not None:
            return httpx.Response(200, headers=hit[0], content=hit[1], request=request)
        self.sent += 1
        until = None if self.deadline is None else time.monotonic() + self.deadline
        response = self.inner.handle_request(request)
        try:
            content = self._read(request, response, until)
        finally:
            response.close()
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _DECODED_AWAY]
        status = response.status_code
        if status == 429 and self.max_retry_after is not None:
            wait = retry_after_seconds(response.headers.get("retry-after"))
            if wait is not None and wait > self.max_retry_after:
                raise ToolFailure(
                    f"Wikipedia is rate-limiting this client: it asks to wait {wait:.0f} s before the next "
                    f"request, longer than this tool waits ({self.max_retry_after:g} s); try again later",
                    TOOL_UNAVAILABLE)
        if status == 200 and not _is_json(content):
            status = 503  # (a captive portal's page, a cut body: once read as "no such article", the model's fault)
        error = api_error(response.headers, content) if status == 200 else None
        if error is not None:
            code = str(error.get("code", ""))
            if not code.startswith(SERVER_TROUBLE):
                raise ToolError(f"Wikipedia refused the request: {error.get('info') or code}")
            status = 503
        titles = request.url.params.get("titles") if status == 200 else None
        if titles is not None and not _PAGES.search(content):
            raise pageless_answer(titles, content)
        if key and status == 200 and len(content) <= self.max_bytes:
            with self._lock:
                if key not in self._cache:
                    self._cache[key] = (headers, content)
                    self.cached_bytes += len(content)
                while len(self._cache) > self.max_entries or self.cached_bytes > self.max_bytes:
                    self.cached_bytes -= len(self._cache.popitem(last=False)[1][1])
        return httpx.Response(status, headers=headers, content=content, request=request)

    def _read(self, request: httpx.Request, response: httpx.Response, until: float | None) -> bytes:
        """The decoded body, bounded in size and in the time it takes to arrive (``until``, monotonic)."""
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > self.max_response_bytes:
                raise ToolFailure(f"Wikipedia answered with more than {self.max_response_bytes >> 20} MiB for one "
                                  "request; no article is that long, so the server is not answering as a wiki does",
                                  TOOL_UNAVAILABLE)
            chunks.append(chunk)
            if until is not None and time.monotonic() > until:
                raise httpx.ReadTimeout(f"the answer took more than {self.deadline:g} s to arrive", request=request)
        return b"".join(chunks)

    def close(self) -> None:
        self.inner.close()


def _is_json(content: bytes) -> bool:
    try:
        json.loads(content)
    except ValueError:  # (UnicodeDecodeError too)
        return False
    return True


#: another MediaWiki's ``api.php``: an http(s) URL with a host and a port from 1 to 65535 (``ftp://``
#: and ``notaurl`` made fine, a port ``:abc`` raised httpx's InvalidURL; where it answers is
#: known at the first call)
mediawiki_url = optional(http_url("http(s)://HOST[:PORT]/w/api.php, e.g. http://localhost:8080/w/api.php"))


class LiveBackend:
    """Wikipedia through the MediaWiki API, with ``wikipedia-api`` as the client.

    Args:
        api_url: another MediaWiki ``api.php`` to use instead of ``https://{language}.wikipedia.org/w/api.php``.
        language: which Wikipedia.
        user_agent: identifies the client, as Wikimedia's policy asks.
        timeout: seconds per HTTP request.
        max_retries, retry_wait: retries on 429/5xx/timeouts, waiting ``retry_wait * 2**n`` s
            (or the server's ``Retry-After``, when it is at most ``timeout``: a longer one fails
            the call at once); never a fixed sleep before a request.
        cache_size: answers remembered by the :class:`CachingTransport`.
    """

    def __init__(self, *, api_url: str | None = None, language: str = "en", user_agent: str = USER_AGENT,
                 timeout: float = 10.0, max_retries: int = 3, retry_wait: float = 0.5, cache_size: int = 4096):
        import wikipediaapi  # imported here: offline backends never need it

        self.api_url = mediawiki_url("api_url", api_url)
        self._errors = wikipediaapi.WikipediaException
        self._rate_limited = wikipediaapi.WikiRateLimitError
        self.transport = CachingTransport(api_url=api_url, max_entries=cache_size, max_retry_after=timeout,
                                          deadline=timeout)
        self.wiki = wikipediaapi.Wikipedia(
            user_agent=user_agent, language=language, timeout=timeout, max_retries=max_retries,
            retry_wait=retry_wait, transport=self.transport,
        )

    def search(self, query: str, limit: int) -> list[SearchHit]:
        try:
            results = self.wiki.search(query, limit=limit)
        except self._errors as exc:
            raise self._unavailable("Wikipedia search", exc) from None
        return [SearchHit(title, _plain(page.search_meta.snippet)) for title, page in results.pages.items()][:limit]

    def article(self, title: str) -> Article | None:
        if "|" in title:  # no title holds one; the API reads it as several titles, one answer
            return None
        page = self.wiki.page(title)
        try:
            summary = page.summary  # one prop=extracts request; sets pageid (negative when missing)
            if page.pageid is None or page.pageid < 0:
                return None
            disambiguation = bool(self.wiki.categories(page, clcategories=DISAMBIGUATION_CATEGORIES))
        except NotAPage:
            return None
        except self._errors as exc:
            raise self._unavailable("Wikipedia", exc) from None
        sections = (Section("", summary.strip()), *_flatten(page.sections))
        redirected_from = title if title_key(page.title) != title_key(title) else None
        return Article(page.title, tuple(s for s in sections if s.title or s.text), redirected_from, disambiguation)

    def _unavailable(self, what: str, exc: Exception) -> ToolFailure:
        if isinstance(exc, self._rate_limited):
            return ToolFailure(f"{what} is rate-limiting this client (HTTP 429 on every retry); try again later",
                               TOOL_UNAVAILABLE)
        # (the client's error names the URL it built, https://{language}.wikipedia.org/..., not the
        # api_url the requests went to; its cause says why: a refused connection, a timeout)
        where = self.api_url or getattr(exc, "url", None) or exc
        status, cause = getattr(exc, "status_code", None), exc.__cause__
        why = f"HTTP {status}" if status else f"{type(cause).__name__}: {cause}" if cause else type(exc).__name__
        return ToolFailure(f"{what} is unavailable ({where}: {why})", TOOL_UNAVAILABLE)

    def close(self) -> None:
        """Shared by every episode of an environment; :meth:`shutdown` releases it."""

    def shutdown(self) -> None:
        self.transport.close()


def _flatten(sections) -> Iterable[Section]:
    for section in sections:
        yield Section(section.title, section.text.strip())
        yield from _flatten(section.sections)


def _plain(snippet: str) -> str:
    """MediaWiki's HTML snippet (``<span class="searchmatch">``) as plain text."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", snippet)).split())


def records_digest(records: list[Mapping[str, str]]) -> str:
    """A stable hash of in-memory records (for corpora that do not come from one file)."""
    return corpus_key(json.dumps([[r["title"], r["text"]] for r in records], ensure_ascii=False))


# -- typed backends (``backend="local"``, ``backend_args={...}``) ------------------------------


@dataclass(frozen=True)
class LiveWikipedia(SourceConfig):
    """``backend="live"``: Wikipedia (or ``api_url``, any MediaWiki ``api.php``) over HTTP; see
    :class:`LiveBackend` for the retry policy."""

    name = "live"
    api_url: str | None = arg(None, mediawiki_url)
    language: str = arg("en", text)
    user_agent: str = arg(USER_AGENT, text)
    http_timeout: float = arg(10.0, seconds)  # (inf was reported as tool_timeout's)
    max_retries: int = arg(3, int_between(0, 10))
    retry_wait: float = arg(0.5, number_between(0, 60, " seconds"))

    @property
    def tool_timeout(self) -> float:
        """Long enough for every retry of one request: each attempt, and each wait before a
        retry (the backoff, or a ``Retry-After`` of at most ``http_timeout``)."""
        return self.http_timeout * (2 * self.max_retries + 1) + self.retry_wait * 2 ** self.max_retries

    def build(self, env: Any) -> LiveBackend:
        return LiveBackend(api_url=self.api_url, language=self.language, user_agent=self.user_agent,
                           timeout=self.http_timeout, max_retries=self.max_retries, retry_wait=self.retry_wait)
