"""ChatPolicy's lean HTTP path (``transport="lean"``, the default) against the official SDK's
(``transport="sdk"``) on the loopback server: the same request, the same reply, the same retries
(which statuses, how many, ``Retry-After`` honoured), the same error for each failure, the key
never in an error. Each case runs both transports against the same faults and compares."""

import asyncio
import gzip
import itertools
import json
import socketserver
import threading
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmax_gym.eval import ChatPolicy, PolicyError
from benchmax_gym.testing.openai_server import FakeChatServer

KEY = "sk-test-0123456789abcdef"
PARAMS = {"model": "test-model", "messages": [{"role": "user", "content": "2+2? ünïcode ✓"}], "temperature": 0.5}
SAME_HEADERS = ("authorization", "content-type", "accept", "user-agent", "x-stainless-lang",
                "x-stainless-package-version", "x-stainless-retry-count", "x-stainless-read-timeout")


def reply(body):
    return {"content": f"\\boxed{{4}} after {len(body['messages'])} messages",
            "tool_calls": [{"name": "calculator", "arguments": {"expression": "2+2"}}]}


@pytest.fixture(scope="module")
def server():
    with FakeChatServer(reply, api_key=KEY) as server:
        yield server


def run(server, transport, faults, **kwargs):
    """``(what complete() returned or the PolicyError's text, the requests' headers, arrival times)``."""
    server.faults[:] = list(faults)
    first = len(server.requests)
    policy = ChatPolicy("test-model", base_url=kwargs.pop("base_url", server.url), api_key=KEY, transport=transport,
                        **{"max_retries": 2, "timeout": 5.0, **kwargs})

    async def go():
        try:
            message, finish, usage, _ = await policy.complete(dict(PARAMS))
            for call in message.get("tool_calls") or []:
                call.pop("id")  # the server numbers its calls
            return message, finish, usage
        except PolicyError as exc:
            return str(exc)
        finally:
            await policy.aclose()

    outcome = asyncio.run(go())
    return outcome, server.headers[first:], server.arrivals[first:]


def both(server, faults, **kwargs):
    lean, sdk = (run(server, transport, faults, **kwargs) for transport in ("lean", "sdk"))
    assert lean[0] == sdk[0]  # the same reply, or the same error
    assert len(lean[1]) == len(sdk[1])  # as many attempts
    for mine, theirs in zip(lean[1], sdk[1]):
        assert {k: mine.get(k) for k in SAME_HEADERS} == {k: theirs.get(k) for k in SAME_HEADERS}
    return lean


def test_a_reply_is_read_the_same_plain_or_chunked(server):
    outcome, headers, _ = both(server, [None])
    message, finish, usage = outcome
    assert message["content"].startswith("\\boxed{4}") and message["tool_calls"][0]["function"]["name"] == "calculator"
    assert finish == "tool_calls" and usage["prompt_tokens"] > 0 and headers[0]["authorization"] == f"Bearer {KEY}"
    chunked, _, _ = both(server, [{"chunked": 7}])
    assert chunked[0]["content"] == message["content"]
    assert both(server, [{"text": "plain words"}])[0].startswith("the endpoint's reply is malformed: the reply")


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503])
def test_retried_statuses_are_retried_with_the_retry_count_sent(server, status):
    outcome, headers, _ = both(server, [{"status": status}, {"status": status}])
    assert isinstance(outcome, tuple)  # the third attempt succeeded
    assert [h["x-stainless-retry-count"] for h in headers] == ["0", "1", "2"]


@pytest.mark.parametrize("status, kind", [(400, "BadRequestError"), (401, "AuthenticationError"),
                                          (403, "PermissionDeniedError"), (404, "NotFoundError"),
                                          (422, "UnprocessableEntityError")])
def test_other_4xx_fail_at_once_with_the_sdks_error(server, status, kind):
    outcome, headers, _ = both(server, [{"status": status, "message": f"nope, {KEY}"}])
    assert outcome == f"{kind} {status}: nope, ***" and len(headers) == 1


def test_out_of_retries_and_the_servers_say_on_retrying(server):
    outcome, headers, _ = both(server, [{"status": 500, "message": "down"}] * 3)
    assert outcome == "InternalServerError 500: down" and len(headers) == 3
    outcome, headers, _ = both(server, [{"status": 500, "headers": {"x-should-retry": "false"}}])
    assert outcome.startswith("InternalServerError 500") and len(headers) == 1
    outcome, headers, _ = both(server, [{"status": 400, "headers": {"x-should-retry": "true"}}, None])
    assert isinstance(outcome, tuple) and len(headers) == 2
    outcome, headers, _ = both(server, [{"status": 429, "retry_after": 3600}])  # past the SDK's cap: no wait
    assert outcome.startswith("RateLimitError 429") and len(headers) == 1


@pytest.mark.parametrize("header", [{"retry_after": 0.6}, {"headers": {"retry-after-ms": "600"}}])
def test_retry_after_is_honoured(server, header):
    for transport in ("lean", "sdk"):
        outcome, _, arrivals = run(server, transport, [{"status": 429, **header}])
        assert isinstance(outcome, tuple) and len(arrivals) == 2
        assert arrivals[1] - arrivals[0] >= 0.55  # the server's wait, not the SDK's 0.5 s backoff or less


def test_no_timeout_means_no_deadline_on_either_transport(server):
    """``timeout=None`` (the SDK's "no timeout"): a slow reply is waited for, on both paths."""
    outcome, headers, _ = both(server, [{"delay": 1.0}], timeout=None, max_retries=0)
    assert isinstance(outcome, tuple) and len(headers) == 1


def test_timeouts_malformed_bodies_and_refused_connections_fail_alike(server):
    outcome, headers, _ = both(server, [{"delay": 3.0}, {"delay": 3.0}], timeout=1.0, max_retries=1)
    assert outcome.startswith("APITimeoutError") and len(headers) == 2
    outcome, headers, _ = both(server, [{"delay": 3.0}, None], timeout=1.0, max_retries=1)
    assert isinstance(outcome, tuple)  # a timed-out attempt is retried
    outcome, headers, _ = both(server, [{"malformed": True}])
    assert outcome.startswith("the endpoint's reply is not valid JSON") and len(headers) == 1
    with FakeChatServer(reply) as gone:
        url = gone.url
    lean, sdk = (run(server, t, [], base_url=url, max_retries=1)[0] for t in ("lean", "sdk"))
    # the same outcome (the episode fails as model_error); the SDK on aiohttp calls a refused
    # connection a timeout, the lean path a connection error (as the SDK on httpx does)
    assert lean.startswith("APIConnectionError") and "Connect call failed" in lean and "Connect call failed" in sdk


def test_a_size_cap_and_a_bad_transport_name():
    with FakeChatServer(reply) as server:
        for transport in ("lean", "sdk"):
            outcome, headers, _ = run(server, transport, [{"huge": 1 << 20}], max_reply_bytes=1 << 16)
            assert outcome == "the endpoint's reply is over the limit of 65536 bytes" and len(headers) == 1
    with pytest.raises(ValueError, match="transport must be one of"):
        ChatPolicy("m", transport="curl")


def test_server_processes_can_share_one_port():
    """``--processes N`` (SO_REUSEPORT): servers on one port each take a share of the connections,
    so a benchmark's server is never one process's CPU."""
    import json
    import urllib.request

    with FakeChatServer(reply, reuse_port=True) as one, FakeChatServer(reply, port=one.port, reuse_port=True) as two:
        assert two.port == one.port
        for _ in range(40):  # a new connection each: the kernel spreads them by their ports
            request = urllib.request.Request(one.url + "/chat/completions", method="POST",
                                             data=json.dumps(PARAMS).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert json.loads(response.read())["choices"][0]["message"]["content"].startswith("\\boxed{4}")
        assert len(one.requests) + len(two.requests) == 40 and one.requests and two.requests


def test_the_eval_command_takes_either_transport_with_the_same_results(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    summaries = {}
    with FakeChatServer(lambda body: {"content": "\\boxed{0}"}) as server:
        for transport in ("lean", "sdk"):
            out = tmp_path / transport
            done = subprocess.run([sys.executable, "-m", "benchmax_gym", "eval", "benchmax/Math-v0", "--model",
                                   "test-model", "--base-url", server.url, "--tasks", "4", "--transport", transport,
                                   "--env-arg", "python_tool=false", "--quiet", "--no-plots", "--out", str(out)],
                                  capture_output=True, text=True, timeout=300, env=env)
            assert done.returncode == 0, done.stderr
            records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
            summaries[transport] = sorted((r["task_index"], r["reward"], r["outcome"]) for r in records)
    assert summaries["lean"] == summaries["sdk"] and len(summaries["lean"]) == 4


def test_a_proxy_from_the_environment_is_used_as_the_sdk_uses_it(monkeypatch):
    """The lean path speaks no proxy protocol: with ``HTTP_PROXY`` set, requests go through the
    SDK, which sends them to the proxy (here the loopback server stands in for one)."""
    with FakeChatServer(reply) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        outcome, headers, _ = run(proxy, "lean", [], base_url="http://model.invalid:9/v1", max_retries=0)
    assert isinstance(outcome, tuple) and outcome[0]["content"].startswith("\\boxed{4}") and len(headers) == 1


def test_a_kept_alive_connection_the_server_closed_is_replaced_not_retried():
    """uvicorn closes a connection idle for 5 s: the next request goes out on a new one, as its
    first attempt (no retry spent, no error)."""
    with FakeChatServer(reply) as server:
        policy = ChatPolicy("test-model", base_url=server.url, max_retries=0)

        async def go():
            try:
                first = await policy.complete(dict(PARAMS))
                await asyncio.sleep(5.5)  # past the server's keep-alive
                return first, await policy.complete(dict(PARAMS))
            finally:
                await policy.aclose()

        first, second = asyncio.run(go())
    assert first[0]["content"] == second[0]["content"] and len(server.requests) == 2
    assert [h["x-stainless-retry-count"] for h in server.headers] == ["0", "0"]


def test_workers_never_hold_more_than_the_concurrency_asked_for():
    """``--workers 3 --concurrency 2``: two workers, one episode each (before, each of the three
    held one: up to 3 model calls in flight, for a run that asked for 2, once their starts overlapped)."""
    from benchmax_gym.eval import evaluate

    with FakeChatServer(lambda body: {"content": "\\boxed{0}"}, latency=0.5) as server:
        result = evaluate("benchmax/Math-v0", ChatPolicy("test-model", base_url=server.url),
                          env_kwargs={"python_tool": False}, tasks=6, concurrency=2, workers=3, preflight=False)
        assert server.max_in_flight <= 2
    assert sorted(r["task_index"] for r in result.records) == list(range(6))
    assert all(r["error"] is None for r in result.records)


# Replies that the loopback app (uvicorn) never writes, from a raw server: what llhttp, the lean
# path's parser, must take (interim replies, a body read to the close) or refuse (a malformed
# status line, headers or a body over the caps) as the SDK's transport does.

COMPLETION = json.dumps({"id": "x", "object": "chat.completion", "model": "test-model",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "\\boxed{4}"},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()


def http(status=b"200 OK", fields=(), body=COMPLETION, length=True):
    """One reply's bytes, a JSON body with its Content-Length unless ``length`` is False."""
    head = [b"HTTP/1.1 " + status, b"content-type: application/json", *fields]
    if length:
        head.append(b"content-length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class RawServer:
    """A loopback TCP server answering the i-th request with ``replies[i]`` (the last one
    repeated) as raw bytes: ``(data, close)``, where ``data`` is bytes or a function giving an
    endless iterator of them, and ``close`` closes the connection after it."""

    def __init__(self, *replies):
        self.replies, self.requests, self.connections, self.stop = list(replies), 0, 0, threading.Event()
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                server.connections += 1
                while not server.stop.is_set():
                    length = None
                    while (line := self.rfile.readline()) not in (b"\r\n", b""):
                        name, _, value = line.decode("latin-1").partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    if not line:
                        return
                    self.rfile.read(length or 0)
                    data, close = server.replies[min(server.requests, len(server.replies) - 1)]
                    server.requests += 1
                    try:
                        for piece in data() if callable(data) else [data]:
                            if server.stop.is_set():
                                return
                            self.wfile.write(piece)
                            self.wfile.flush()
                    except OSError:  # the client hung up (a reply over its cap)
                        return
                    if close:
                        return

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def calls(url, transport, n=1, **kwargs):
    """The outcomes of ``n`` requests in turn through one ChatPolicy: ``(content, finish)`` or
    the PolicyError's text."""
    policy = ChatPolicy("test-model", base_url=url, api_key=KEY, transport=transport,
                        **{"max_retries": 0, "timeout": 5.0, **kwargs})

    async def go():
        outcomes = []
        try:
            for _ in range(n):
                try:
                    message, finish, _, _ = await policy.complete(dict(PARAMS))
                    outcomes.append((message["content"], finish))
                except PolicyError as exc:
                    outcomes.append(str(exc))
            return outcomes
        finally:
            await policy.aclose()

    return asyncio.run(go())


def test_interim_replies_and_a_body_read_to_the_close_are_read_as_the_sdk_reads_them():
    gzipped = gzip.compress(COMPLETION)
    cases = [
        (http(b"100 Continue", body=b"", length=False) + http(), False),  # interim replies first
        (http(b"100 Continue", body=b"", length=False) + http(b"103 Early Hints", [b"link: </x>"], b"", False)
         + http(), False),
        (http(length=False), True),  # no length: the body is what comes before the close
        (http(fields=[b"content-encoding: gzip"], body=gzipped, length=False), True),
        (http(fields=[b"transfer-encoding: chunked"], length=False, body=b"".join(
            b"%x\r\n%s\r\n" % (len(part), part) for part in (COMPLETION[:50], COMPLETION[50:])) + b"0\r\nx-t: 1\r\n\r\n"),
         False),  # chunked, with a trailer
    ]
    for reply in cases:
        for transport in ("lean", "sdk"):
            with RawServer(reply) as server:
                assert calls(server.url, transport) == [("\\boxed{4}", "stop")], (reply, transport)


@pytest.mark.parametrize("reply, says", [
    (http(b"2OO OK"), "APIConnectionError: not an HTTP/1.x reply"),
    (b"HTPT/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", "APIConnectionError: not an HTTP/1.x reply"),
    (http().replace(b"HTTP/1.1", b"HTTP/2.0"), "APIConnectionError: not an HTTP/1.x reply: HTTP/2.0 200"),
    (http(b"099 Early"), "APIConnectionError: not an HTTP/1.x reply: HTTP/1.1 99"),
    (http(fields=[b"content-length: 7"]), "APIConnectionError: not an HTTP/1.x reply: Duplicate Content-Length"),
    (http(fields=[b"x-pad-%d: %s" % (i, b"a" * 1000) for i in range(70)]),
     "APIConnectionError: the reply's headers are too long"),
    (http(fields=[b"x-f-%d: 1" % i for i in range(300)]), "APIConnectionError: the reply has over 256 header fields"),
    (lambda: itertools.chain([b"HTTP/1.1 200 OK\r\nx-pad: "], itertools.repeat(b"a" * 1000)),  # never ending
     "APIConnectionError: the reply's headers are too long"),
    (http()[:-10], "APIConnectionError: the server closed the connection before the whole reply"),
    (http(fields=[b"transfer-encoding: chunked"], length=False, body=b"ff\r\nabc"),
     "APIConnectionError: the server closed the connection inside a chunked reply"),
    (http(length=False)[:40], "APIConnectionError: the server closed the connection before a whole reply"),
    (http(b"101 Switching Protocols", [b"upgrade: h2c", b"connection: upgrade"], b"", False),
     "APIConnectionError: the server switched protocols"),
])
def test_a_malformed_reply_is_a_connection_error_saying_what_was_wrong(reply, says):
    """The lean path says what was wrong; the SDK's path (on aiohttp, which takes an HTTP/2.0
    status line and 70 kB of headers) fails the call as a PolicyError too, never with the HTTP
    client's own exception escaping."""
    with RawServer((reply, True)) as server:
        [lean] = calls(server.url, "lean")
    assert lean.startswith(says), lean
    with RawServer((reply, True)) as server:
        [sdk] = calls(server.url, "sdk")
    assert isinstance(sdk, str) or sdk == ("\\boxed{4}", "stop"), sdk  # a PolicyError's text, or a reply read


def test_a_body_over_the_cap_is_cut_off_as_its_chunks_arrive():
    """An endless chunked body fails at the size cap, not at the deadline (nor out of memory)."""
    def endless():
        yield b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        while True:
            yield b"1000\r\n" + b" " * 0x1000 + b"\r\n"

    for transport in ("lean", "sdk"):
        with RawServer((endless, True)) as server:
            assert calls(server.url, transport, timeout=30.0, max_reply_bytes=1 << 20) == [
                "the endpoint's reply is over the limit of 1048576 bytes"]
    with RawServer((http(fields=[b"transfer-encoding: chunked"], length=False, body=b"%x\r\n%s\r\n0\r\n\r\n" % (
            len(COMPLETION), COMPLETION)), False)) as server:  # a chunk within the cap is read
        assert calls(server.url, "lean", max_reply_bytes=len(COMPLETION)) == [("\\boxed{4}", "stop")]
        assert calls(server.url, "lean", max_reply_bytes=len(COMPLETION) - 1) == [
            f"the endpoint's reply is over the limit of {len(COMPLETION) - 1} bytes"]


def test_a_connection_is_reused_only_when_the_reply_says_it_may_be():
    for reply, connections in [((http(), False), 1),  # keep-alive: one connection for three requests
                               ((http(fields=[b"connection: close"]), False), 3),
                               ((http().replace(b"HTTP/1.1", b"HTTP/1.0"), False), 3),  # 1.0: no keep-alive
                               ((http() + b"HTTP/1.1 200 OK\r\n", False), 3),  # bytes past the reply: out of step
                               ((http(length=False), True), 3)]:
        with RawServer(reply) as server:
            assert calls(server.url, "lean", n=3) == [("\\boxed{4}", "stop")] * 3
            assert (server.requests, server.connections) == (3, connections), reply


def test_without_httptools_the_lean_transport_falls_back_to_the_sdks(monkeypatch, server):
    import sys

    monkeypatch.setitem(sys.modules, "httptools", None)  # `import httptools` raises ImportError
    policy = ChatPolicy("test-model", base_url=server.url, api_key=KEY)
    assert policy.transport == "lean"
    outcome, headers, _ = run(server, "lean", [None])
    assert outcome[0]["content"].startswith("\\boxed{4}") and len(headers) == 1

    async def which():
        try:
            return policy._lean_client()
        finally:
            await policy.aclose()

    assert asyncio.run(which()) is None  # the SDK's path, with no error


_json_texts = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=8).map(lambda v: json.dumps(v, ensure_ascii=False))


@settings(max_examples=400, deadline=None)
@given(_json_texts, st.sampled_from(["", " ", "\n", "\r\n\t", "\x1c", "\u2028", " x", "}", ",1"]),
       st.sampled_from(["", " ", "\ufeff"]), st.sampled_from(["utf-8", "utf-16", "utf-32"]),
       st.binary(max_size=3))
def test_the_lean_paths_reply_decoding_is_json_loads(text, after, before, encoding, junk):
    """The lean path reads a reply's JSON with the C scanner directly: whatever the bytes (white
    space, a BOM, other encodings, trailing junk, broken UTF-8), it gives what json.loads gives, or
    raises the same error."""
    from benchmax_gym.eval.http import _json_reply

    for body in ((before + text + after).encode(encoding), (text + after).encode("utf-8") + junk):
        try:
            expected = ("ok", json.loads(body))
        except ValueError as exc:
            expected = ("error", type(exc), str(exc))
        try:
            got = ("ok", _json_reply(body))
        except ValueError as exc:
            got = ("error", type(exc), str(exc))
        assert repr(got) == repr(expected)


@pytest.mark.parametrize("replies, outcome", [
    ([http(b"429 Too Many Requests", [b"content-encoding: gzip", b"retry-after: 0.2"],
           gzip.compress(b'{"error": {"message": "slow down"}}')), http()], ("\\boxed{4}", "stop")),  # retried
    ([http(b"400 Bad Request", [b"content-encoding: gzip"], gzip.compress(b'{"error": {"message": "bad param"}}'))],
     "BadRequestError 400: bad param"),
    ([http(fields=[b"content-encoding: deflate"], body=zlib.compress(COMPLETION)[2:-4])], ("\\boxed{4}", "stop")),  # raw
])
def test_compressed_error_replies_and_raw_deflate_are_read_as_the_sdk_reads_them(replies, outcome):
    """Servers behind a proxy gzip their error replies too: a rate limit is still retried, an
    error still the SDK's; deflate may come without zlib's wrapper."""
    for transport in ("lean", "sdk"):
        with RawServer(*[(reply, False) for reply in replies]) as server:
            assert calls(server.url, transport, max_retries=1) == [outcome], transport
