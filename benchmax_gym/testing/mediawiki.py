"""A local MediaWiki API server over any ``{title, text}`` corpus, for offline tests and benchmarks.

It answers, on 127.0.0.1, the requests that ``wikipedia-api`` and the live backend send:
``action=query`` with ``prop=extracts`` (plain text, ``== Heading ==`` sections), ``prop=info``,
``prop=categories`` (disambiguation pages are in ``Category:All disambiguation pages``) and
``list=search`` (the corpus's FTS5 index, snippets marked up as MediaWiki does), following
``redirects=1`` and reporting ``normalized`` titles and missing pages the way Wikipedia does.
It records every request (``requests``) and can be told to fail the next ones with given statuses
(``fail_next``: ``(status, headers)`` or ``(status, headers, error code)``; with 200 that is
MediaWiki's error answer, ``{"error": {...}}`` marked ``MediaWiki-API-Error``) or to stall
before answering (``stall_next``, seconds), so retries, backoff, timeouts and caching are tested
against a real HTTP exchange.

Example::

    with MediaWikiStub(records) as server:
        env = gym.make("benchmax/Wikipedia-v0", tasks=my_tasks, backend="live", api_url=server.api_url)
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from benchmax_gym.envs.wikipedia.backends import CorpusBackend, CorpusIndex, parse_article, redirect_target, title_key

DISAMBIGUATION_CATEGORY = "Category:All disambiguation pages"


class MediaWikiStub:
    """Serve ``records`` as a MediaWiki ``api.php`` on a free loopback port (a context manager)."""

    def __init__(self, records: Iterable[Mapping[str, str]]):
        self.records = [{"title": str(r["title"]), "text": str(r["text"])} for r in records]
        self.pages: dict[str, tuple[int, str, str]] = {}
        for i, r in enumerate(self.records, 1):
            self.pages.setdefault(title_key(r["title"]), (i, r["title"], r["text"]))
        self.index = CorpusIndex.in_memory(self.records, "stub")
        self.requests: list[dict[str, str]] = []
        self.user_agents: list[str] = []
        self.fail_next: list[tuple] = []  # (status, headers[, error code]) for the next requests
        self.stall_next: list[float] = []  # seconds to wait before answering the next requests
        self._lock = threading.Lock()
        self.closed = False
        self._search = CorpusBackend(self.index)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def api_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/w/api.php"

    def __enter__(self) -> "MediaWikiStub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:  # a stalled handler may still wake up: it finds the stub closed
            self.closed = True
            self._search.close()

    def count(self, **params: str) -> int:
        """How many requests had all of ``params``."""
        return sum(all(r.get(k) == v for k, v in params.items()) for r in self.requests)

    # -- the API --------------------------------------------------------------------------------

    def answer(self, params: dict[str, str]) -> dict:
        if params.get("action") != "query":
            action = params.get("action")
            return {"error": {"code": "badvalue", "info": f'Unrecognized value for parameter "action": {action}.'}}
        if params.get("list") == "search":
            return self._search_answer(params)
        query: dict = {}
        entries = {}
        for fake_id, asked in enumerate(filter(None, params.get("titles", "").split("|")), 1):
            title = " ".join(asked.replace("_", " ").split())
            title = title[:1].upper() + title[1:]
            if title != asked:
                query.setdefault("normalized", []).append({"from": asked, "to": title})
            page = self.pages.get(title_key(title))
            target = redirect_target(page[2]) if page else None
            if page and target and params.get("redirects"):
                query.setdefault("redirects", []).append({"from": page[1], "to": target})
                page = self.pages.get(title_key(target))
            if page is None:
                entries[str(-fake_id)] = {"ns": 0, "title": title, "missing": ""}
                continue
            entries[str(page[0])] = self._page_entry(page, params)
        query["pages"] = entries
        return {"batchcomplete": "", "query": query}

    def _page_entry(self, page: tuple[int, str, str], params: dict[str, str]) -> dict:
        pageid, title, text = page
        entry = {"pageid": pageid, "ns": 0, "title": title}
        props = params.get("prop", "").split("|")
        article = parse_article(title, text)
        if "extracts" in props:
            entry["extract"] = "\n\n".join(
                f"== {s.title} ==\n{s.text}" if s.title else s.text for s in article.sections
            )
        if "categories" in props and article.disambiguation:
            wanted = params.get("clcategories")
            if wanted is None or DISAMBIGUATION_CATEGORY in wanted.split("|"):
                entry["categories"] = [{"ns": 14, "title": DISAMBIGUATION_CATEGORY}]
        if "info" in props:
            entry.update({"contentmodel": "wikitext", "pagelanguage": "en", "length": len(text),
                          "fullurl": f"https://stub.invalid/wiki/{title.replace(' ', '_')}"})
        return entry

    def _search_answer(self, params: dict[str, str]) -> dict:
        limit = min(int(params.get("srlimit", 10) or 10), 500)
        with self._lock:  # one SQLite connection, many handler threads
            hits = [] if self.closed else self._search.search(params.get("srsearch", ""), limit)
        words = {w.casefold() for w in params.get("srsearch", "").split()}

        def marked(snippet: str) -> str:
            return " ".join(
                f'<span class="searchmatch">{html.escape(w)}</span>' if w.casefold() in words else html.escape(w)
                for w in snippet.split()
            )

        return {"batchcomplete": "", "query": {
            "searchinfo": {"totalhits": len(hits)},
            "search": [
                {"ns": 0, "title": h.title, "pageid": self.pages[title_key(h.title)][0], "snippet": marked(h.snippet)}
                for h in hits
            ],
        }}

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                params = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query, keep_blank_values=True).items()}
                with stub._lock:
                    stub.requests.append(params)
                    stub.user_agents.append(self.headers.get("User-Agent", ""))
                    failure = stub.fail_next.pop(0) if stub.fail_next else None
                    stall = stub.stall_next.pop(0) if stub.stall_next else 0.0
                time.sleep(stall)
                if stub.closed:
                    return
                if failure is not None:
                    status, headers, *code = failure
                    error = {"code": code[0] if code else "failure", "info": f"HTTP {status}"}
                    return self._send(status, {"error": error}, headers)
                self._send(200, stub.answer(params))

            def _send(self, status: int, body: dict, headers: Mapping[str, str] | None = None):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                if "error" in body:  # as MediaWiki marks its error answers
                    self.send_header("MediaWiki-API-Error", body["error"]["code"])
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep test output clean
                pass

        return Handler
