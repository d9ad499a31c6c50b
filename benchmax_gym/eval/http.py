"""A lean HTTP/1.1 path for chat completions with the official ``openai`` SDK's semantics.

Why: the SDK spends ~1 ms of CPU per request (request option copies, httpx objects, its
transport), more than the rest of an eval turn; on a many-core machine with a fast server that
caps a harness process near 1,000 calls/s. :class:`LeanChatClient` sends the same request (the
SDK builds the URL and headers once: key, organization/project, user agent, ``x-stainless-*``)
over a pool of keep-alive asyncio connections and reads the reply with llhttp (``httptools``, the
C parser uvicorn and Node use, fed as bytes arrive: ``Content-Length``, chunked, to the close,
interim 1xx replies skipped; gzip/deflate decoded here) and ``json.loads`` it: ~0.15 ms of CPU a
request where the SDK's path costs ~1 ms (a loaded 2-core VM, concurrency 64). Without
``httptools`` (the ``eval`` extra installs it) ChatPolicy takes the SDK's path.

What it keeps of the SDK: the retries (the SDK's own ``_should_retry``: 408, 409, 429, 5xx and
``x-should-retry``; timeouts and connection errors) and their waits (the SDK's own
``_calculate_retry_timeout``: ``Retry-After``/``retry-after-ms`` honoured, else exponential
backoff with jitter), the exceptions (the SDK's own classes and messages, built by the SDK from
the reply), a non-JSON content type returned as text as the SDK does, and a whole-reply deadline
and size cap (as :func:`benchmax_gym.eval.policies._bounded` adds to the SDK; the cap cuts the
connection as soon as the body passes it). A reply llhttp refuses, or with headers over
``MAX_HEAD_BYTES``/``MAX_HEADERS``, is a connection error (retried as the SDK retries one).
Whatever it does not speak goes through the SDK itself: a proxy from the environment
(``HTTPS_PROXY``...), a redirect, a scheme other than http/https, headers that are not Latin-1.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
import zlib
from typing import Any

from benchmax_gym.core.formats import _scan_once
from benchmax_gym.eval.policies import PolicyError

MAX_HEAD_BYTES = 64 << 10  # a status line and headers longer than this are not an HTTP reply
MAX_HEADERS = 256  # header fields in one reply (uvicorn sends 4, vLLM and OpenAI about 20)
MAX_IDLE = 1024  # keep-alive connections kept for reuse

# json.dumps with these settings builds an encoder per call (a tenth of a request's encoding)
_encode_body = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _json_reply(body: bytes) -> Any:
    """``json.loads(body)``, its C scanner called directly for a UTF-8 body that is one JSON value
    (with JSON white space after it); anything else, and every error, goes through json.loads."""
    try:
        text = body.decode("utf-8")
        obj, end = _scan_once(text, 0)
        if end == len(text) or not text[end:].strip(" \t\n\r"):
            return obj
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
        pass
    return json.loads(body)


class _Unsupported(Exception):
    """This reply (a redirect) or endpoint is the SDK's to handle."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection. Its bytes go to an llhttp parser (``httptools``, uvicorn's) as
    they arrive; its callbacks keep this request's reply and resolve ``reply`` once it is whole,
    or fail it at the first fault (a size cap, a malformed reply, the peer closing early)."""

    def __init__(self, httptools: Any, max_bytes: int) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.malformed = (httptools.HttpParserError, httptools.HttpParserUpgrade)
        self.max_bytes = max_bytes
        self.transport: Any = None
        self.reply: asyncio.Future | None = None  # this request's: (status, headers, body, keep-alive)
        self.closed = False
        self.spoiled = False  # bytes past a reply (out of step): never reused
        self.got = False  # a byte of this request's reply arrived (a stale reused one gets none)
        self.error: BaseException | None = None  # what a callback stopped the parser for
        self.start = b""  # the reply's first bytes, for an error about them
        self.pending = 0  # bytes fed since the last head ended (a head is capped at MAX_HEAD_BYTES)
        self.status, self.headers, self.parts, self.size, self.whole_head, self.head_size = 0, [], [], 0, False, 0
        self.length: int | None = None
        self.chunked = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reply = self.reply
        if reply is None or reply.done():  # bytes no request asked for: out of step
            self.spoiled = True
            self.close()
            return
        if not self.got:
            self.got, self.start = True, data[:80]
        self.pending += len(data)
        try:
            self.parser.feed_data(data)
        except self.malformed as exc:
            self._fail(self.error or ConnectionError(f"not an HTTP/1.x reply: {exc} (it began {self.start!r})"))
            return
        if not self.whole_head and self.pending > MAX_HEAD_BYTES:
            self._fail(ConnectionError("the reply's headers are too long"))

    def eof_received(self) -> bool:
        self._closed()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()

    def _closed(self) -> None:
        self.closed = True
        reply = self.reply
        if reply is None or reply.done():
            return
        # a body read to the close is whole now (llhttp says so only from llhttp_finish, which
        # httptools does not expose; feeding it b"" does not end the message)
        if self.whole_head and self.length is None and not self.chunked:
            reply.set_result((self.status, self.headers, b"".join(self.parts), False))
        elif self.whole_head:
            where = "inside a chunked reply" if self.chunked else "before the whole reply"
            reply.set_exception(ConnectionError(f"the server closed the connection {where}"))
        else:
            reply.set_exception(ConnectionError("the server closed the connection before a whole reply"))

    def _fail(self, exc: BaseException) -> None:
        reply = self.reply
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        self.spoiled = True
        self.close()

    def _expire(self) -> None:
        self._fail(TimeoutError())

    def _stop(self, exc: BaseException) -> None:
        """Stop the parser (inside a callback): ``data_received`` fails the reply with ``exc``."""
        self.error = exc
        raise exc

    # llhttp's callbacks (httptools calls them by these names)

    def on_message_begin(self) -> None:
        if self.reply.done():  # a second reply after this request's: out of step
            self.spoiled = True
        self.headers, self.parts, self.size, self.length, self.chunked, self.head_size = [], [], 0, None, False, 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            self._stop(ConnectionError(f"the reply has over {MAX_HEADERS} header fields"))
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD_BYTES:  # (the head came in one read: the count in data_received missed it)
            self._stop(ConnectionError("the reply's headers are too long"))
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        parser = self.parser
        self.pending = 0
        status = self.status = parser.get_status_code()
        version = parser.get_http_version()
        if status < 100 or version[:2] != "1.":
            self._stop(ConnectionError(f"not an HTTP/1.x reply: HTTP/{version} {status} (it began {self.start!r})"))
        if status < 200:  # an interim reply (100 Continue, 103 Early Hints): the reply follows
            if status == 101:
                self._stop(ConnectionError("the server switched protocols"))
            return
        self.whole_head = True
        for name, value in self.headers:
            key = name.lower()
            if key == "content-length":
                self.length = int(value)  # llhttp let only digits through
                if self.length > self.max_bytes:
                    self._stop(_too_big(self.max_bytes))
            elif key == "transfer-encoding":
                self.chunked = value.lower().rstrip().endswith("chunked")
        if 300 <= status < 400 and status != 304:
            self._stop(_Unsupported("a redirect"))

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:  # abort as the bytes arrive, never holding more
            self._stop(_too_big(self.max_bytes))
        self.parts.append(body)

    def on_message_complete(self) -> None:
        reply = self.reply
        if self.status < 200 or reply.done():  # an interim reply, or one past this request's
            return
        parts = self.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        reply.set_result((self.status, self.headers, body, self.parser.should_keep_alive()))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, data: bytes, deadline: float | None) -> tuple[int, list[tuple[str, str]], bytes, bool]:
        """Send ``data`` (a whole request) and read one reply by ``deadline`` (the loop's clock,
        None for none; past it, TimeoutError and the connection closed): ``(status, headers, body, reusable)``
        (``headers``: ``(name, value)`` pairs as sent, Latin-1 text; ``body`` decoded)."""
        if self.closed:
            raise ConnectionError("the server closed the connection before a whole reply")
        self.got, self.whole_head, self.pending, self.error, self.status = False, False, 0, None, 0
        loop = asyncio.get_running_loop()
        reply = self.reply = loop.create_future()
        # the reply itself times out (a timer a request, not asyncio.timeout's cancelling the task:
        # a third of the cost)
        timer = loop.call_at(deadline, self._expire) if deadline is not None else None
        try:
            self.transport.write(data)
            status, headers, body, keep_alive = await reply
        finally:
            if timer is not None:
                timer.cancel()
        encoding = _field(headers, "content-encoding")
        if encoding:
            encoding = encoding.lower()
            if encoding in ("gzip", "x-gzip", "deflate"):
                try:
                    body = _inflate(body, encoding, self.max_bytes + 1)
                except zlib.error as exc:
                    raise ConnectionError(f"a bad {encoding} body: {exc}") from None
                if len(body) > self.max_bytes:
                    raise _too_big(self.max_bytes)
            elif encoding != "identity":
                raise ConnectionError(f"an unsupported Content-Encoding: {encoding[:40]!r}")
        return status, headers, body, keep_alive and not self.closed and not self.spoiled


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A gzip or deflate body, decoded up to ``limit`` bytes; deflate as zlib's format, else raw
    (what some servers send, and httpx and aiohttp accept too)."""
    if encoding != "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS | 32).decompress(body, limit)
    try:
        return zlib.decompressobj(zlib.MAX_WBITS).decompress(body, limit)
    except zlib.error:
        return zlib.decompressobj(-zlib.MAX_WBITS).decompress(body, limit)


class LeanChatClient:
    """``POST {base_url}/chat/completions`` as the SDK client ``sdk`` would send it, retried as it
    would be; returns the reply's JSON (its text when the content type is not JSON). Made on the
    event loop that uses it. Raises what ``sdk.post(..., cast_to=object)`` raises, and a
    :class:`~benchmax_gym.eval.policies.PolicyError` for a reply over ``max_bytes``."""

    def __init__(self, sdk: Any, timeout: float, max_bytes: int):
        import httptools  # (without it, ChatPolicy takes the SDK's path: this raises ImportError)
        from openai._models import FinalRequestOptions

        self.sdk, self.timeout, self.max_bytes = sdk, timeout, max_bytes
        self.loop = asyncio.get_running_loop()
        self._options = FinalRequestOptions.construct(method="post", url="/chat/completions", json_data={})
        request = sdk._build_request(self._options, retries_taken=0)
        url = request.url
        if url.scheme not in ("http", "https"):
            raise _Unsupported(f"the scheme {url.scheme}")
        proxies = urllib.request.getproxies()
        if proxies.get(url.scheme) or proxies.get("all"):
            if not urllib.request.proxy_bypass(url.host):
                raise _Unsupported("a proxy")
        self.url, self.host = url, url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = None
        if url.scheme == "https":
            try:
                import httpx2 as httpx
            except ImportError:
                import httpx
            # the SDK's trust store (certifi, SSL_CERT_FILE...) when its httpx has the helper
            make = getattr(httpx, "create_ssl_context", ssl.create_default_context)
            self.ssl = make()
        skip = {"content-length", "x-stainless-retry-count", "accept-encoding", "connection"}
        lines = [f"POST {url.raw_path.decode('ascii')} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in request.headers.items() if name.lower() not in skip]
        lines += ["accept-encoding: gzip, deflate", "connection: keep-alive"]
        head = "\r\n".join(lines) + "\r\n"
        head.encode("latin-1")  # what the SDK's httpx refuses too: the SDK's path then says so
        self._head = head.replace("%", "%%") + "x-stainless-retry-count: %d\r\ncontent-length: %d\r\n\r\n"
        self._idle: list[_Connection] = []
        self._protocol = lambda: _Connection(httptools, max_bytes)

    async def _connect(self) -> _Connection:
        _, conn = await self.loop.create_connection(
            self._protocol, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None)
        return conn

    async def _attempt(self, payload: bytes, retries_taken: int) -> tuple[int, list, bytes]:
        """One try: the whole reply within the timeout (TimeoutError past it)."""
        data = (self._head % (retries_taken, len(payload))).encode("latin-1") + payload
        deadline = None if self.timeout is None else self.loop.time() + self.timeout
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                status, headers, body, reusable = await conn.exchange(data, deadline)
            except ConnectionError:
                conn.close()
                if conn.got:
                    raise
                continue  # a kept-alive connection the server had closed: another one, not a retry
            except BaseException:
                conn.close()
                raise
            self._keep(conn, reusable)
            return status, headers, body
        async with asyncio.timeout_at(deadline):
            conn = await self._connect()
        try:
            status, headers, body, reusable = await conn.exchange(data, deadline)
        except BaseException:
            conn.close()
            raise
        self._keep(conn, reusable)
        return status, headers, body

    def _keep(self, conn: _Connection, reusable: bool) -> None:
        if reusable and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()

    def _response(self, status: int, headers: list[tuple[str, str]], body: bytes) -> Any:
        """The reply as the SDK's httpx ``Response`` (for its retry rules and errors; rare), its
        body already decoded (so without the headers that describe it as sent)."""
        headers = [(k, v) for k, v in headers if k.lower() not in ("content-encoding", "content-length")]
        return _sdk_httpx().Response(status, headers=headers, content=body, request=self._request())

    def _request(self) -> Any:
        return _sdk_httpx().Request("POST", str(self.url))

    async def post(self, params: dict[str, Any]) -> Any:
        import openai

        payload = _encode_body(params).encode("utf-8")
        sdk = self.sdk
        max_retries = sdk.max_retries
        for taken in range(max_retries + 1):
            remaining = max_retries - taken
            try:  # (the whole reply within the timeout, as the SDK path's deadline)
                status, headers, body = await self._attempt(payload, taken)
            except _Unsupported:
                return await self.sdk.post("/chat/completions", body=params, cast_to=object)
            except TimeoutError:
                if remaining > 0:
                    await asyncio.sleep(sdk._calculate_retry_timeout(remaining, self._options, None))
                    continue
                late = TimeoutError(f"no whole reply within {self.timeout:g} s")  # what the SDK's path says
                raise openai.APITimeoutError(request=self._request()) from late
            except PolicyError:
                raise
            except (OSError, ssl.SSLError) as exc:  # refused, reset, closed early, not HTTP
                if remaining > 0:
                    await asyncio.sleep(sdk._calculate_retry_timeout(remaining, self._options, None))
                    continue
                raise openai.APIConnectionError(request=self._request()) from exc
            if status >= 400:
                response = self._response(status, headers, body)
                if remaining > 0 and sdk._should_retry(response):
                    await asyncio.sleep(sdk._calculate_retry_timeout(remaining, self._options, response.headers))
                    continue
                raise sdk._make_status_error_from_response(response) from None
            break
        content_type = (_field(headers, "content-type") or "*").split(";")[0]
        if not content_type.endswith("json"):  # as the SDK: the text, undecoded
            return self._response(status, headers, body).text
        return _json_reply(body)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        await self.sdk.close()


def _too_big(max_bytes: int) -> PolicyError:
    return PolicyError(f"the endpoint's reply is over the limit of {max_bytes} bytes")


def _field(headers: list[tuple[str, str]], name: str) -> str | None:
    """The value of the first header field ``name`` (lower case), or None."""
    for key, value in headers:
        if len(key) == len(name) and key.lower() == name:
            return value
    return None


def _sdk_httpx() -> Any:
    try:
        import httpx2 as httpx  # the openai SDK's fork of httpx, when it uses it
    except ImportError:
        import httpx
    return httpx
