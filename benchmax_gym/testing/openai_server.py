"""An OpenAI-compatible chat-completions server on loopback, for tests and benchmarks of eval.

A real ASGI app (Starlette under uvicorn) speaking ``POST /v1/chat/completions`` (``tool_calls``
included, ``usage``, ``finish_reason``) and ``GET /v1/models``; its replies come from a Python
function, so a test scripts the model: right answers, wrong ones, malformed calls. Faults are
queued per request: ``{"status": 429, "retry_after": 0.2}``, ``{"status": 500}``,
``{"delay": 5.0}`` (past the client's timeout), ``{"malformed": True}`` (a body that is not
JSON), ``{"finish_reason": "length"}``; ``"message"`` sets an error's text. ``max_in_flight``
tells how many requests it held at once. Hostile replies, for the client's limits: ``{"drip": 0.5}``
(a JSON prefix, then one byte every 0.5 s, never ending), ``{"endless": True}`` (bytes as fast as
they go, no length), ``{"huge": N}`` (a valid reply of about N bytes, its length declared),
``{"body": {...}}`` (this JSON as the reply, however malformed), ``{"echo_headers": True}`` (the
request's headers as the reply's content, as a misconfigured proxy might), ``{"chunked": N}`` (the
normal reply in chunks of N bytes, no length declared), ``{"text": "..."}`` (a ``text/plain``
reply); an error fault's ``"headers"`` are sent with it (``x-should-retry``, ``retry-after-ms``). ``fault_for`` chooses
a fault from the request itself (``body -> fault or None``), so the same requests fail however
concurrent requests interleave; set it to ``None`` and the server is healthy again.

Example::

    def reply(body):                      # the request's JSON body -> the assistant's turn
        return {"content": "\\\\boxed{4}"}

    with FakeChatServer(reply, latency=0.1) as server:
        client = openai.OpenAI(base_url=server.url, api_key="test")

:func:`judge_model` is a scripted judge (pointwise, group and pairwise) for judged rewards.

``python -m benchmax_gym.testing.openai_server --latency 0.1`` serves the scripted ``calculator``
model (a tool call, then an answer) in its own process and prints the URL (``--latency-jitter J``:
each reply waits the latency times a uniform draw in ``[1 - J, 1 + J]``); ``--processes N`` runs
N server processes on that one port (``SO_REUSEPORT``), so the server is never what caps a
many-worker benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

Reply = Callable[[dict[str, Any]], dict[str, Any]]


def calculator_model(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted model for benchmarks: a ``calculator`` call, then a final answer after its result.
    Native tool calls when the request offers tools, a Hermes ``<tool_call>`` otherwise."""
    last = body["messages"][-1]
    answered = last.get("role") == "tool" or "<tool_response>" in str(last.get("content") or "")
    if answered:
        return {"content": "\\boxed{2}"}
    call = {"name": "calculator", "arguments": {"expression": "1+1"}}
    if body.get("tools"):
        return {"tool_calls": [call]}
    return {"content": f"<tool_call>{json.dumps(call)}</tool_call>"}


def judge_model(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted judge for tests and benchmarks, reading the default prompts of
    :mod:`benchmax_gym.core.judge`: a reply that holds the reference answer scores 1, else 0
    (``<score>``; ``<scores>`` for a group; ``<winner>`` for a pair, ties when both or neither)."""
    import re

    text = str(body["messages"][-1].get("content") or "")
    found = re.search(r"Reference answer \(may be empty\):\n(.*?)\n\n", text, re.S)
    answer = found.group(1).strip() if found else ""

    def good(reply: str) -> bool:
        return bool(answer) and answer in reply

    group = re.findall(r"<<<REPLY \d+\n(.*?)\nREPLY \d+>>>", text, re.S)
    if group:
        return {"content": f"Compared. <scores>{json.dumps([float(good(r)) for r in group])}</scores>"}
    pair = re.search(r"<<<A\n(.*?)\nA>>>.*?<<<B\n(.*?)\nB>>>", text, re.S)
    if pair:
        a, b = good(pair.group(1)), good(pair.group(2))
        return {"content": f"<winner>{'tie' if a == b else 'A' if a else 'B'}</winner>"}
    one = re.search(r"<<<REPLY\n(.*?)\nREPLY>>>", text, re.S)
    return {"content": f"Graded. <score>{float(good(one.group(1))) if one else 0.0}</score>"}


class FakeChatServer:
    """Serve ``reply`` as an OpenAI-compatible API on a free loopback port (a context manager).

    Args:
        reply: ``body -> {"content", "tool_calls": [{"name", "arguments"}], "finish_reason"}``.
        latency: seconds every reply waits (model time; requests overlap freely).
        latency_jitter: each wait is ``latency`` times a uniform draw in ``[1 - j, 1 + j]`` (the
            mean stays ``latency``): a real server's replies do not all take the same time, so
            requests sent together do not all come back together.
        models: the model names it knows; another name gets a 404 as OpenAI sends it.
        api_key: when set, a request without ``Authorization: Bearer <api_key>`` gets a 401.
        faults: one fault per request, in order, before normal replies resume (``None``: none).
        fault_for: ``body -> fault or None``, asked when the queue is empty (deterministic by content).
        port: the port (0: a free one); reuse_port: bind it with ``SO_REUSEPORT``, so several
            server processes share one port and the kernel spreads connections over them (what
            ``--processes N`` does: one process's CPU must not cap a many-worker benchmark).
    """

    def __init__(self, reply: Reply = calculator_model, *, latency: float = 0.0, latency_jitter: float = 0.0,
                 models: Iterable[str] = ("test-model",), api_key: str | None = None,
                 faults: Iterable[dict[str, Any] | None] = (),
                 fault_for: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
                 port: int = 0, reuse_port: bool = False):
        self.reply = reply
        if not 0.0 <= latency_jitter <= 1.0:
            raise ValueError(f"latency_jitter must be between 0 and 1, got {latency_jitter!r}")
        self.latency, self.latency_jitter = latency, latency_jitter
        self.models = list(models)
        self.api_key = api_key
        self.faults: list[dict[str, Any] | None] = list(faults)
        self.fault_for = fault_for
        self.requests: list[dict[str, Any]] = []  # every request body, in arrival order
        self.headers: list[dict[str, str]] = []
        self.arrivals: list[float] = []  # time.monotonic() of each request (retry waits show here)
        self.in_flight = self.max_in_flight = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port, self.reuse_port = port, reuse_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "FakeChatServer":
        import uvicorn

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="error", lifespan="off")
        self._server = uvicorn.Server(config)
        sockets = None
        if self.reuse_port:
            sockets = [reuse_port_socket(self.port)]
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": sockets}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake chat server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    # -- the app ------------------------------------------------------------------------------

    def _app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        def error(status: int, message: str, kind: str, code: str | None = None, headers=None):
            return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                                status_code=status, headers=headers)

        def refused(request) -> Any:
            if self.api_key is None:
                return None
            if request.headers.get("authorization") != f"Bearer {self.api_key}":
                return error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
            return None

        async def models(request):
            return refused(request) or JSONResponse(
                {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "test"}
                                            for m in self.models]})

        async def completions(request):
            denied = refused(request)
            if denied is not None:
                return denied
            try:
                body = json.loads(await request.body())
            except ValueError:
                return error(400, "the body is not JSON", "invalid_request_error")
            with self._lock:
                self.requests.append(body)
                self.headers.append(dict(request.headers))
                self.arrivals.append(time.monotonic())
                fault = self.faults.pop(0) if self.faults else self.fault_for(body) if self.fault_for else None
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await answer(body, fault or {}, request)
            finally:
                with self._lock:
                    self.in_flight -= 1

        async def streamed(request, first: bytes, then: bytes, every: float):
            """``first``, then ``then`` every ``every`` s until the client goes (10 min at most)."""
            yield first
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not await request.is_disconnected():
                if every:
                    await asyncio.sleep(every)
                yield then

        async def answer(body, fault, request):
            from starlette.responses import StreamingResponse

            if body.get("model") not in self.models:
                return error(404, f"The model `{body.get('model')}` does not exist.", "invalid_request_error",
                             "model_not_found")
            if fault.get("delay"):
                await asyncio.sleep(fault["delay"])
            if fault.get("status"):
                headers = {**({"retry-after": str(fault["retry_after"])} if "retry_after" in fault else {}),
                           **fault.get("headers", {})} or None
                return error(fault["status"], fault.get("message", f"fault {fault['status']}"), "server_error",
                             headers=headers)
            if fault.get("malformed"):
                return Response(b'{"id": "x", "choices": [', media_type="application/json")
            if fault.get("drip"):
                return StreamingResponse(streamed(request, b'{"id": "x", "choices": [', b" ", fault["drip"]),
                                         media_type="application/json")
            if fault.get("endless"):
                return StreamingResponse(streamed(request, b'{"id": "x", "choices": [', b" " * (1 << 20), 0),
                                         media_type="application/json")
            if "body" in fault:
                return JSONResponse(fault["body"])
            if fault.get("huge"):
                reply = self._completion(body, {"content": "a" * int(fault["huge"])}, None)
                return JSONResponse(reply)
            if fault.get("chunked"):
                data = json.dumps(self._completion(body, self.reply(body), None)).encode()
                size = int(fault["chunked"])
                pieces = [data[i:i + size] for i in range(0, len(data), size)]

                async def chunks():
                    for piece in pieces:
                        yield piece

                return StreamingResponse(chunks(), media_type="application/json")
            if fault.get("text"):
                return Response(str(fault["text"]).encode(), media_type="text/plain")
            if fault.get("echo_headers"):
                return JSONResponse(self._completion(body, {"content": json.dumps(dict(request.headers))}, None))
            if self.latency:
                jitter = self.latency_jitter
                await asyncio.sleep(self.latency * (random.uniform(1 - jitter, 1 + jitter) if jitter else 1.0))
            turn = self.reply(body)
            return JSONResponse(self._completion(body, turn, fault.get("finish_reason")))

        return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", completions,
                                                                       methods=["POST"])])

    def _completion(self, body: dict[str, Any], turn: dict[str, Any], finish: str | None) -> dict[str, Any]:
        n = next(self._ids)
        calls = [{"id": f"call_{n}_{i}", "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c.get("arguments"), str)
                               else json.dumps(c.get("arguments", {}))}}
                 for i, c in enumerate(turn.get("tool_calls") or [])]
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content")}
        if calls:
            message["tool_calls"] = calls
        prompt = sum(len(str(m.get("content") or "")) for m in body["messages"]) // 4 + 1
        completion = len(str(turn.get("content") or "")) // 4 + 8 * len(calls) + 1
        return {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish or turn.get("finish_reason") or ("tool_calls" if calls else "stop")}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }


def reuse_port_socket(port: int = 0):
    """A loopback TCP socket bound with ``SO_REUSEPORT`` (``port`` 0: a free one). Bound but not
    listening, it only holds the port: the kernel hands connections to listening sockets alone."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def main() -> None:
    import signal
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description="serve the scripted calculator model over the OpenAI API")
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--latency-jitter", type=float, default=0.0,
                        help="each reply waits latency times a uniform draw in [1 - J, 1 + J]")
    parser.add_argument("--judge", action="store_true", help="serve the scripted judge (judge_model) instead")
    parser.add_argument("--processes", type=int, default=1,
                        help="server processes sharing one port (SO_REUSEPORT; Linux): one process's CPU "
                             "(~0.3 ms a request) caps a benchmark near 3,000 requests/s")
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)  # a --processes child's
    args = parser.parse_args()
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the finally below ends the children
    hold = reuse_port_socket() if args.processes > 1 else None  # the port, until every process is up
    port = hold.getsockname()[1] if hold else args.port
    children = []
    try:
        command = [sys.executable, "-m", "benchmax_gym.testing.openai_server", "--latency", str(args.latency),
                   "--latency-jitter", str(args.latency_jitter), "--port", str(port), *(["--judge"] if args.judge else [])]
        children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(args.processes - 1)]
        for child in children:
            if not child.stdout.readline():
                raise SystemExit(f"a server process exited (status {child.wait()}) before it served")
        with FakeChatServer(judge_model if args.judge else calculator_model, latency=args.latency,
                            latency_jitter=args.latency_jitter, port=port,
                            reuse_port=bool(port)) as server:
            if hold:
                hold.close()
            print(server.url, flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


if __name__ == "__main__":
    main()
