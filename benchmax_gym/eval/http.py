"""A lean HTTP/1.1 path for chat completions with the official ``openai`` SDK's semantics.

Why: the SDK spends ~1 ms of CPU per request (request option copies, httpx objects, its
transport), more than the rest of an eval turn; on a many-core machine with a fast server that
caps a harness process near 1,000 calls/s. :class:`LeanChatClient` sends the same request (the
SDK builds the URL and headers once: key, organization/project, user agent, ``x-stainless-*``)
over a pool of keep-alive asyncio connections, reads the reply with a small HTTP/1.1 parser
(``Content-Length``, chunked, or to the close; gzip/deflate) and ``json.loads`` it: ~0.15 ms of
CPU a request where the SDK's path costs ~1 ms (a loaded 2-core VM, concurrency 64).

What it keeps of the SDK: the retries (the SDK's own ``_should_retry``: 408, 409, 429, 5xx and
``x-should-retry``; timeouts and connection errors) and their waits (the SDK's own
``_calculate_retry_timeout``: ``Retry-After``/``retry-after-ms`` honoured, else exponential
backoff with jitter), the exceptions (the SDK's own classes and messages, built by the SDK from
the reply), a non-JSON content type returned as text as the SDK does, and a whole-reply deadline
and size cap (as :func:`benchmax_gym.eval.policies._bounded` adds to the SDK). Whatever it does not
speak goes through the SDK itself: a proxy from the environment (``HTTPS_PROXY``...), a redirect,
a scheme other than http/https, headers that are not Latin-1.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
import zlib
from typing import Any

from benchmax_gym.eval.policies import PolicyError

MAX_HEAD_BYTES = 64 << 10  # a status line and headers longer than this are not an HTTP reply
MAX_IDLE = 1024  # keep-alive connections kept for reuse


class _Unsupported(Exception):
    """This reply (a redirect) or endpoint is the SDK's to handle."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: bytes in a buffer, a future woken when more arrive."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: Any = None
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.got = False  # a byte of this request's reply arrived (a stale reused one gets none)

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.got = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self) -> bool:
        """Wait for more bytes; False once the peer has closed."""
        if self.closed:
            return False
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter
        self.waiter = None
        return True

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, data: bytes, max_bytes: int) -> tuple[int, list[tuple[str, str]], bytes, bool]:
        """Send ``data`` (a whole request) and read one reply: ``(status, head, body, reusable)``
        (``head``: the header fields as text, CRLF-separated)."""
        self.got = False
        self.transport.write(data)
        buf = self.buf
        while True:  # the head (1xx interim replies skipped)
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise ConnectionError("the reply's headers are too long")
                if not await self.more():
                    raise ConnectionError("the server closed the connection before a whole reply")
                continue
            head = bytes(buf[:end]).decode("latin-1")
            del buf[:end + 4]
            status_line, _, head = head.partition("\r\n")
            version, _, rest = status_line.partition(" ")
            try:
                status = int(rest[:3])
            except ValueError:
                raise ConnectionError(f"not an HTTP reply: {status_line[:80]!r}") from None
            if not version.startswith("HTTP/1.") or status < 100:
                raise ConnectionError(f"not an HTTP/1.x reply: {status_line[:80]!r}")
            if status >= 200:
                break
        head = "\r\n" + head + "\r\n"  # each field between CRLFs; looked up, not all parsed (the hot path)
        lower = head.lower()
        length = _field(head, lower, "content-length")
        if length is not None:
            try:
                length = int(length)
            except ValueError:
                raise ConnectionError(f"a bad Content-Length: {length[:40]!r}") from None
        chunked = "chunked" in (_field(head, lower, "transfer-encoding") or "").lower()
        reusable = version == "HTTP/1.1" and "close" not in (_field(head, lower, "connection") or "").lower()
        encoding = (_field(head, lower, "content-encoding") or "").lower()
        if 300 <= status < 400 and status != 304:
            raise _Unsupported("a redirect")
        if status in (204, 304):  # never a body (RFC 9110), whatever the fields say
            body = b""
        elif chunked:
            parts, size = [], 0
            while True:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ConnectionError("a bad chunk header")
                    if not await self.more():
                        raise ConnectionError("the server closed the connection inside a chunked reply")
                    continue
                try:
                    n = int(bytes(buf[:line_end]).split(b";", 1)[0], 16)
                except ValueError:
                    raise ConnectionError("a bad chunk size") from None
                if n == 0:  # the last chunk, then trailers up to an empty line
                    while buf.find(b"\r\n\r\n", line_end) < 0:
                        if not await self.more():
                            raise ConnectionError("the server closed the connection inside a chunked reply")
                    del buf[:buf.find(b"\r\n\r\n", line_end) + 4]
                    break
                size += n
                if size > max_bytes:
                    raise _too_big(max_bytes)
                while len(buf) < line_end + 2 + n + 2:
                    if not await self.more():
                        raise ConnectionError("the server closed the connection inside a chunked reply")
                parts.append(bytes(buf[line_end + 2:line_end + 2 + n]))
                del buf[:line_end + 2 + n + 2]
            body = b"".join(parts)
        elif length is not None:
            if length > max_bytes:
                raise _too_big(max_bytes)
            while len(buf) < length:
                if not await self.more():
                    raise ConnectionError("the server closed the connection before the whole reply")
            body = bytes(buf[:length])
            del buf[:length]
        else:  # to the close
            reusable = False
            while await self.more():
                if len(buf) > max_bytes:
                    raise _too_big(max_bytes)
            if len(buf) > max_bytes:
                raise _too_big(max_bytes)
            body = bytes(buf)
            buf.clear()
        if encoding in ("gzip", "x-gzip", "deflate"):
            inflate = zlib.decompressobj(zlib.MAX_WBITS | 32 if encoding != "deflate" else zlib.MAX_WBITS)
            try:
                body = inflate.decompress(body, max_bytes + 1)
            except zlib.error as exc:
                raise ConnectionError(f"a bad {encoding} body: {exc}") from None
            if len(body) > max_bytes:
                raise _too_big(max_bytes)
        elif encoding not in ("", "identity"):
            raise ConnectionError(f"an unsupported Content-Encoding: {encoding[:40]!r}")
        return status, head, body, reusable and not self.closed


class LeanChatClient:
    """``POST {base_url}/chat/completions`` as the SDK client ``sdk`` would send it, retried as it
    would be; returns the reply's JSON (its text when the content type is not JSON). Made on the
    event loop that uses it. Raises what ``sdk.post(..., cast_to=object)`` raises, and a
    :class:`~benchmax_gym.eval.policies.PolicyError` for a reply over ``max_bytes``."""

    def __init__(self, sdk: Any, timeout: float, max_bytes: int):
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

    async def _connect(self) -> _Connection:
        _, conn = await self.loop.create_connection(
            _Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None)
        return conn

    async def _attempt(self, payload: bytes, retries_taken: int) -> tuple[int, list, bytes]:
        data = (self._head % (retries_taken, len(payload))).encode("latin-1") + payload
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                status, head, body, reusable = await conn.exchange(data, self.max_bytes)
            except ConnectionError:
                conn.close()
                if conn.got:
                    raise
                continue  # a kept-alive connection the server had closed: another one, not a retry
            except BaseException:
                conn.close()
                raise
            self._keep(conn, reusable)
            return status, head, body
        conn = await self._connect()
        try:
            status, head, body, reusable = await conn.exchange(data, self.max_bytes)
        except BaseException:
            conn.close()
            raise
        self._keep(conn, reusable)
        return status, head, body

    def _keep(self, conn: _Connection, reusable: bool) -> None:
        if reusable and not conn.buf and len(self._idle) < MAX_IDLE:  # (bytes past the reply: out of step)
            self._idle.append(conn)
        else:
            conn.close()

    def _response(self, status: int, head: str, body: bytes) -> Any:
        """The reply as the SDK's httpx ``Response`` (for its retry rules and errors; rare)."""
        headers = [(name.strip(), value.strip()) for name, _, value in
                   (line.partition(":") for line in head.split("\r\n") if line)]
        return _sdk_httpx().Response(status, headers=headers, content=body, request=self._request())

    def _request(self) -> Any:
        return _sdk_httpx().Request("POST", str(self.url))

    async def post(self, params: dict[str, Any]) -> Any:
        import openai

        payload = json.dumps(params, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        sdk = self.sdk
        max_retries = sdk.max_retries
        for taken in range(max_retries + 1):
            remaining = max_retries - taken
            try:
                async with asyncio.timeout(self.timeout):  # the whole reply, as the SDK path's deadline
                    status, head, body = await self._attempt(payload, taken)
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
                response = self._response(status, head, body)
                if remaining > 0 and sdk._should_retry(response):
                    await asyncio.sleep(sdk._calculate_retry_timeout(remaining, self._options, response.headers))
                    continue
                raise sdk._make_status_error_from_response(response) from None
            break
        content_type = (_field(head, head.lower(), "content-type") or "*").split(";")[0]
        if not content_type.endswith("json"):  # as the SDK: the text, undecoded
            return self._response(status, head, body).text
        return json.loads(body)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        await self.sdk.close()


def _too_big(max_bytes: int) -> PolicyError:
    return PolicyError(f"the endpoint's reply is over the limit of {max_bytes} bytes")


def _field(head: str, lower: str, name: str) -> str | None:
    """The value of header ``name`` (lower case) in ``head`` (CRLF-separated fields, a CRLF at
    each end; ``lower`` is ``head.lower()``), or None."""
    at = lower.find(f"\r\n{name}:")
    if at < 0:
        return None
    start = at + len(name) + 3
    return head[start:head.index("\r\n", start)].strip()


def _sdk_httpx() -> Any:
    try:
        import httpx2 as httpx  # the openai SDK's fork of httpx, when it uses it
    except ImportError:
        import httpx
    return httpx
