"""Streamable HTTP for the SDK's ``Client``: its own transport, over an HTTP client that checks
every JSON reply to a request before the SDK reads it, and that keeps credentials out of sight.

Why: the SDK parks a call whose POST came back with a JSON body that does not answer it (another
request's id, a notification) until the call's timeout, which stops the server and loses its
state; other unreadable replies (not JSON, a content type that is neither JSON nor an event
stream) fail with a pydantic dump. Here each such reply becomes a JSON-RPC error for its own
request at once, in one line naming the problem (``the server's reply could not be read: ...``,
as a stdio server's unreadable reply does), and a reply over the size limit is dropped as it
arrives. Event streams are the SDK's (a cut or garbled one already fails its call at once).

Credentials: a URL's user and password go in a basic-auth header, and its query (``?api_key=...``)
and the credential segments of its path (``/mcp/<token>/``, see :func:`_secret_segment`) are put
back by our HTTP transport into each request for the endpoint: the URL the SDK and httpx2 see, and
log (httpx2 logs every request's URL at INFO, the SDK its endpoint at DEBUG), carries none of them
(its path segments are ``***``).
:func:`shown_url` and :func:`secrets_of` are what error messages use instead of the URL and to
blank out what a message quotes (:func:`redact` says which quotes); a successful tool result is
redacted of :func:`credentials_of` only (credential-named headers, not ``X-Region``). Each
credential is looked for in the forms a server may write it back in (:func:`_encodings`: escaped
in JSON or a Python literal, percent-encoded, base64, also as ``base64(user:<key>)``), and a
server's ``secrets`` (its config's) names those nothing finds by their name or shape.

A server's ``retry:`` in an event stream (how long to wait before reconnecting to it) is capped at
:data:`MAX_RETRY_MS`: the SDK sleeps the whole of it, so a huge one could only run the call out to
its timeout, which stops the server and loses its state.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any
from urllib.parse import quote, quote_plus, unquote

import httpx2
from mcp.client.streamable_http import streamable_http_client

HIDDEN = "***"
# Query keys whose values are credentials (api_key, access_token, sig, X-Amz-Signature, ...).
_SECRET_KEY = re.compile(r"token|key|secret|pass|pwd|auth|sig|credential|session|jwt|bearer|code", re.I)
_SNIPPET = 80  # characters of an unreadable reply quoted in its error
MAX_RETRY_MS = 2_000  # the longest wait before an event stream reconnects (a server's ``retry:``)
# A credential this long is blanked wherever a message quotes it; a shorter one only where it
# follows its name (``X-Api-Key: ab``, ``token=ab``, ``Bearer ab``): blanking every ``2`` or ``a``
# of a message would garble it (``X-Api-Version: 2`` is a header too), and a credential of 1 to 3
# characters is guessable whether or not it is shown.
MIN_FREE_TEXT_SECRET = 4


def _split(url: str) -> tuple[str, str, str, str]:
    """``(scheme://, userinfo, host[:port]/path, ?query#fragment)`` of ``url`` as text (no parser: a
    URL too malformed to parse, which a configuration error quotes, is redacted all the same)."""
    start = url.find("//") + 2 if "//" in url else 0
    end = min([i for i in (url.find(c, start) for c in "/?#") if i != -1], default=len(url))
    userinfo, at, host = url[start:end].rpartition("@")
    path_end = min([i for i in (url.find(c, end) for c in "?#") if i != -1], default=len(url))
    return url[:start], userinfo if at else "", host + url[end:path_end], url[path_end:]


# A URL path segment that is a credential (hosted servers hand out ``https://host/mcp/<token>/``): a
# UUID, one with a run of 16 or more letters and digits, both mixed in (``sk-ak-9fQ2...``, a hex
# or base64url key), or one with a run of 32 or more of either (a 40-digit or all-letter key: no
# word is that long). Ordinary segments (``mcp``, ``v1``, ``sse``, ``streamable-http``,
# ``acme-2024-production``) have no such run. A token of shorter all-letter or all-digit pieces
# (``AbCdEfGhIjKlMnOpQrSt``, ``sk-abc123-def456``) is missed: a server's ``secrets`` names it (see
# :func:`secrets_of`). A segment taken for one wrongly is only shown as ``***``.
_UUID = re.compile(r"[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}", re.I)
_TOKEN_RUN = re.compile(r"[A-Za-z0-9]{16,}")


def _secret_segment(segment: str, declared: tuple[str, ...] = ()) -> bool:
    """Whether a path segment is a credential: token-like, or holding a ``declared`` secret."""
    plain = unquote(segment)
    return bool(_UUID.fullmatch(plain)) or any(
        len(run) >= 32 or not (run.isdigit() or run.isalpha()) for run in _TOKEN_RUN.findall(plain)) or any(
        secret in plain or secret in segment for secret in declared)


def _hidden_path(rest: str, declared: tuple[str, ...] = ()) -> str:
    """``host[:port]/path`` with each credential segment of the path as ``***``."""
    host, *segments = rest.split("/")
    return "/".join([host] + [HIDDEN if _secret_segment(s, declared) else s for s in segments])


def _query_secrets(query: str) -> list[tuple[str, str]]:
    """``(key, value)`` of each credential in a ``?query#fragment``."""
    pairs = (p.partition("=") for p in re.split(r"[?&;#]", query) if p)
    return [(k, v) for k, eq, v in pairs if eq and v and _SECRET_KEY.search(k)]


def shown_url(url: str, declared: tuple[str, ...] = ()) -> str:
    """``url`` with its password (or a user-only userinfo, often a token), its path's credential
    segments, the values of its credential-like query keys and any ``declared`` secret replaced by
    ``***``: what failed stays visible."""
    scheme, userinfo, rest, query = _split(url)
    rest = _hidden_path(rest, declared)
    host, slash, path = rest.partition("/")
    name, colon, port = host.rpartition(":")
    if colon and "]" not in port and not port.isdigit():  # (``user:password`` whose ``@host`` was left out)
        rest = f"{name}:{HIDDEN}{slash}{path}"
    if userinfo:
        user, colon, _ = userinfo.partition(":")
        rest = f"{user}:{HIDDEN}@{rest}" if colon else f"{HIDDEN}@{rest}"
    for key, value in _query_secrets(query):
        query = query.replace(f"{key}={value}", f"{key}={HIDDEN}")
    shown = scheme + rest + query
    return redact(shown, secrets_of(None, {}, declared=declared)) if declared else shown


def _base64(data: bytes) -> set[str]:
    """``data`` in base64, standard and URL-safe (unpadded: a padded one holds it), and, for each
    of the 3 byte alignments it may have inside a longer base64 text (``base64(user:<secret>)``, a
    token in an encoded JSON blob), the run of characters that encodes its bytes alone."""
    forms = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms.add(encode(data).decode().rstrip("="))
        for skip in (0, 1, 2):  # bytes before it, mod 3; the characters from its own bits only
            start, end = -(-8 * skip // 6), 8 * (skip + len(data)) // 6
            forms.add(encode(bytes(skip) + data + bytes(2)).decode()[start:end])
    return {form for form in forms if len(form) >= MIN_FREE_TEXT_SECRET}


def _encodings(secret: str, encoded: bool = True) -> set[str]:
    """The forms in which a server may write ``secret`` back: as it is; inside a JSON or Python
    string literal (``\\"``, ``\\u00e9``, ``\\xc3\\xa9``); and, when ``encoded``, percent-encoded (as a
    URL carries it) or decoded, and in base64 (see :func:`_base64`; only a secret of
    :data:`MIN_FREE_TEXT_SECRET` characters or more). One level of each: a form of a form (JSON in
    JSON) is not looked for. Each is a string to look for in every result: the set is kept small."""
    forms = set()
    for plain in {secret, unquote(secret)} if encoded else {secret}:
        forms |= {plain, json.dumps(plain)[1:-1], json.dumps(plain, ensure_ascii=False)[1:-1],
                  repr(plain)[1:-1], repr(plain.encode())[2:-1]}
        if encoded:
            forms |= {quote(plain, safe=""), quote(plain), quote_plus(plain, safe="")}
            forms |= _base64(plain.encode()) if len(plain) >= MIN_FREE_TEXT_SECRET else set()
    return forms


def secrets_of(url: str | None, headers: Mapping[str, str],
               env: Mapping[str, str] | None = None, declared: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """The credentials in a server's URL, headers and environment as ``(name, value)``: a header's
    value (and its last word, named by the words before it, as ``Bearer <token>``'s token), a
    credential-like query key's or environment variable's value (``API_KEY``, ``GITHUB_TOKEN``),
    a URL's password (named by its user) and the basic-auth token it is sent as, a credential
    segment of its path, and the ``declared`` ones (a server's ``secrets``), each in every form
    of :func:`_encodings` (a header's words together only as they are: its last word's forms
    hide the token in them): what no message may quote (see :func:`redact`)."""
    found: list[tuple[str, str]] = [("", secret) for secret in declared]
    sent: list[tuple[str, str]] = []
    if url:
        _, userinfo, rest, query = _split(url)
        found += [("", segment) for segment in rest.split("/")[1:] if _secret_segment(segment)]
        if userinfo:
            user, colon, password = userinfo.partition(":")
            found.append((user, password) if colon else ("", userinfo))
            basic = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
            sent.append(("Basic", basic))  # (as http_transport sends it; its parts are the password's forms)
        found += _query_secrets(query)
    found += [(name, value) for name, value in (env or {}).items() if _SECRET_KEY.search(name)]
    for name, value in headers.items():
        words = value.split()
        if len(words) > 1:
            sent += [(name, form) for form in _encodings(value, encoded=False)]
            found.append((" ".join(words[:-1]), words[-1]))
        else:
            found.append((name, value))
    found = [(name, form) for name, value in found for form in _encodings(value)] + sent
    unique = {value if len(value) >= MIN_FREE_TEXT_SECRET else (name, value): (name, value)
              for name, value in found if value}  # (a long one is blanked whatever its name)
    return tuple(sorted(unique.values(), key=lambda s: len(s[1]), reverse=True))  # (longest first)


# Headers whose values are credentials: Authorization, Proxy-Authorization, Cookie, X-Api-Key, ...
_SECRET_HEADER = re.compile(rf"{_SECRET_KEY.pattern}|cookie", re.I)


def credentials_of(url: str | None, headers: Mapping[str, str], env: Mapping[str, str] | None = None,
                   declared: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """:func:`secrets_of` with only the credential-named headers: what a successful result may not
    show. Every header value is hidden from errors, but a result that quotes ``X-Region: us-east-1``
    is the server's answer, which blanking it would garble."""
    headers = {name: value for name, value in headers.items() if _SECRET_HEADER.search(name)}
    return secrets_of(url, headers, env, declared)


# between a credential's name and its value: ``: ``, ``=``, ``', '``, ``": "``, or spaces (``Bearer ab``)
_SEPARATOR = r"""['"]?(?:\s*[:=,]\s*|\s+)\(?b?['"]?"""


def redact(text: str, secrets: tuple[tuple[str, str], ...]) -> str:
    """``text`` with each credential of :func:`secrets_of` as ``***``: everywhere when it has at
    least :data:`MIN_FREE_TEXT_SECRET` characters, else where it follows its name."""
    folded = None  # (the text casefolded, to look for a short secret's name: its regex is 40 ns a character)
    for name, secret in secrets:
        if len(secret) >= MIN_FREE_TEXT_SECRET:
            text = text.replace(secret, HIDDEN)
        elif name and secret in text:
            folded = text.casefold() if folded is None else folded
            if name.casefold() not in folded:
                continue
            pattern = rf"(?<![\w-])((?i:{re.escape(name)}){_SEPARATOR}){re.escape(secret)}(?![\w.~+/=-])"
            text = re.sub(pattern, lambda m: m.group(1) + HIDDEN, text)
    return text


def _error(request_id: Any, why: str) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": request_id,
            "error": {"code": -32603, "message": f"the server's reply could not be read: {why}"}}
    return httpx2.Response(200, json=body)


def _problem(raw: bytes, request_id: Any) -> str | None:
    """What is wrong with ``raw`` as the answer to ``request_id``, or None when it answers it."""
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return f"it is not JSON ({exc}): {raw[:_SNIPPET]!r}"
    if not isinstance(reply, dict):
        return f"it is a JSON {type(reply).__name__}, not a JSON-RPC message: {raw[:_SNIPPET]!r}"
    if "method" in reply:
        return f"it is the server's {str(reply['method'])[:_SNIPPET]!r} message, not an answer to the call"
    if reply.get("id") != request_id or not ("result" in reply or "error" in reply):
        return f"it does not answer this request (id {request_id!r}): {raw[:_SNIPPET]!r}"
    return None


class _CheckedReplies(httpx2.AsyncBaseTransport):
    """Passes every exchange through, except that a 2xx reply to a JSON-RPC request that is
    not an event stream must be one JSON-RPC answer to that request, within ``max_bytes``:
    anything else comes back as a JSON-RPC error for it, saying what was wrong. A request for
    ``endpoint`` (the URL shown, credentials as ``***``) goes out to ``real`` (the configured URL,
    which nothing above sees), and an event stream's ``retry:`` over :data:`MAX_RETRY_MS` arrives
    as that."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, max_bytes: int, endpoint: str = "", real: str = ""):
        self.inner, self.max_bytes = inner, max_bytes
        self.endpoint, self.real = endpoint, real

    def _sent(self, request: httpx2.Request) -> httpx2.Request:
        """``request`` as it goes out: to the configured URL, when it is for the endpoint."""
        if self.real == self.endpoint or str(request.url) != self.endpoint:
            return request
        return httpx2.Request(request.method, self.real, headers=request.headers,
                              stream=request.stream, extensions=request.extensions)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(self._sent(request))
        request_id = _request_id(request)
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if not 200 <= response.status_code < 300:
            return response
        if kind == "text/event-stream":
            return httpx2.Response(response.status_code, headers=_decoded(response),
                                   stream=_RetryCapped(response), extensions=response.extensions)
        if request_id is None or response.status_code == 202:
            return response
        try:
            body, size = bytearray(), 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self.max_bytes:
                    return _error(request_id, f"it is over the {self.max_bytes / 1e6:g} MB limit for one message; "
                                              "it was dropped")
                body += chunk
        except httpx2.HTTPError as exc:  # cut off mid-body, or undecodable
            return _error(request_id, f"it broke off ({type(exc).__name__}: {exc})")
        finally:
            with suppress(Exception):
                await response.aclose()
        if kind != "application/json":
            kind = repr(kind) if kind else "missing"
            why = f"its content type is {kind}, not JSON or an event stream: {bytes(body[:_SNIPPET])!r}"
            return _error(request_id, why)
        problem = _problem(bytes(body), request_id)
        if problem is not None:
            return _error(request_id, problem)
        return httpx2.Response(response.status_code, headers=_decoded(response), content=bytes(body),
                               extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _decoded(response: httpx2.Response) -> list[tuple[str, str]]:
    """``response``'s headers for a copy of it whose body is already decoded."""
    return [(k, v) for k, v in response.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]


_LINE_END = re.compile(rb"[\r\n]")
_RETRY_FIELD = re.compile(rb"retry: ?([0-9]+)")


class _RetryCapped(httpx2.AsyncByteStream):
    """An event stream's (decoded) bytes, each ``retry:`` field over :data:`MAX_RETRY_MS` set to it.
    Only a line that may be a ``retry:`` field is held back until it ends (at most 64 bytes of it:
    a longer one is over the cap, or not a number, which SSE ignores); the rest flows as it comes."""

    def __init__(self, response: httpx2.Response):
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held, passing = b"", False  # the start of the current line, if it may be a retry field
        async for chunk in self.response.aiter_bytes():
            out, pos = bytearray(), 0
            while pos < len(chunk):
                end = _LINE_END.search(chunk, pos)
                stop = end.start() if end else len(chunk)
                if passing:
                    out += chunk[pos:stop]
                else:
                    line = held + chunk[pos:stop]
                    if line.startswith(b"retry:") or b"retry:".startswith(line):
                        held = line[:64]
                    else:
                        out += line
                        held, passing = b"", True
                if end:
                    out += _capped(held) + chunk[stop:stop + 1]
                    held, passing = b"", False
                pos = stop + 1
            if out:
                yield bytes(out)
        if held:
            yield _capped(held)

    async def aclose(self) -> None:
        await self.response.aclose()


def _capped(line: bytes) -> bytes:
    field = _RETRY_FIELD.fullmatch(line)
    if field and (len(field[1]) > 12 or int(field[1]) > MAX_RETRY_MS):
        return b"retry: %d" % MAX_RETRY_MS
    return line


def _request_id(request: httpx2.Request) -> Any:
    """The id of the JSON-RPC request a POST carries (None for anything else)."""
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
    except (ValueError, RecursionError):
        return None
    return message.get("id") if isinstance(message, dict) and "method" in message else None


@asynccontextmanager
async def http_transport(url: str, headers: Mapping[str, str], max_message_bytes: int,
                         declared: tuple[str, ...] = ()) -> AsyncIterator[Any]:
    """The SDK's streamable-HTTP transport over a checked HTTP client (see the module's doc);
    ``declared``: secrets of the server's that a path segment may hold (it is ``***`` in the log)."""
    scheme, userinfo, rest, query = _split(url)
    user, _, password = userinfo.partition(":")
    auth = httpx2.BasicAuth(unquote(user), unquote(password)) if userinfo else None
    endpoint = str(httpx2.URL(scheme + _hidden_path(rest, declared)))  # (as httpx2 writes it, to know a request for it)
    query = query.partition("#")[0]
    real = str(httpx2.URL(scheme + rest)) + (query if len(query) > 1 else "")
    client = httpx2.AsyncClient(
        headers=dict(headers), auth=auth, timeout=httpx2.Timeout(30.0, read=300.0),  # the SDK's defaults
        transport=_CheckedReplies(httpx2.AsyncHTTPTransport(), max_message_bytes, endpoint, real),
    )
    async with client, streamable_http_client(endpoint, http_client=client,
                                              max_sse_event_size=max_message_bytes) as streams:
        yield streams
