"""Who plays an eval episode: a model behind an OpenAI-compatible endpoint, a baseline, or your function.

A policy is called once per turn as ``await policy(env, obs, info, seed=...)`` with the unwrapped
env (so it can read ``env.chat_messages()`` and ``env.tool_schemas``) and returns a :class:`Turn`:
the action text plus what the model reported (tokens, ``finish_reason``). ``env_kwargs`` are the
``gym.make`` arguments it needs (native tool calling makes the env speak ``tool_format="openai"``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmax_gym.core.checks import (COUNT_MAX, RETRIES_MAX, Check, at_least, boolean, endpoint_url, int_between,
                                      mapping, optional, positive_int, positive_up_to, seconds, text)
from benchmax_gym.core.formats import _ENCODER  # (json.dumps(..., ensure_ascii=False) builds one per call)

BASELINES = ("solver", "random", "empty")
TRANSPORTS = ("lean", "sdk")
HTTPX_CLIENTS = 8  # httpx clients a ChatPolicy spreads its requests over (one aiohttp client suffices)
_PING = {"max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
MAX_REPLY_BYTES = 64 << 20  # a chat reply larger than this is refused (a logprobs-heavy one is ~MBs)


class PolicyError(RuntimeError):
    """The policy could not produce a turn (the model endpoint kept failing); the episode is
    recorded as failed with this message and the run goes on."""


_BOUNDED: dict[type, type] = {}


def _bounded(client_cls: type) -> type:
    """``client_cls`` (the SDK's httpx or aiohttp client) whose non-streamed replies must arrive
    whole within a deadline and under a size: the SDK's ``timeout`` bounds each read, so a server
    dripping a byte at a time, or streaming forever, is never timed out, and a reply is read into
    memory however large. A late reply raises the transport's own timeout (the SDK retries it as
    one); a huge one :class:`_TooLarge`, which the SDK never retries (the same request gets the
    same reply) and :func:`_sdk`'s client raises as a :class:`PolicyError`."""
    if client_cls in _BOUNDED:
        return _BOUNDED[client_cls]
    try:
        import httpx2 as httpx  # the openai SDK's fork of httpx, when it uses it
    except ImportError:
        import httpx

    class Bounded(client_cls):
        deadline: float = 120.0
        max_bytes: int = MAX_REPLY_BYTES

        async def send(self, request, *, stream: bool = False, **kwargs):
            if stream:
                return await super().send(request, stream=True, **kwargs)
            response = None
            try:
                async with asyncio.timeout(self.deadline):
                    response = await super().send(request, stream=True, **kwargs)
                    parts, size = [], 0  # counted as it comes (a declared length may lie)
                    async for part in response.aiter_bytes():
                        size += len(part)
                        if size > self.max_bytes:
                            raise _TooLarge(f"the endpoint's reply is over the limit of {self.max_bytes} bytes")
                        parts.append(part)
                    response._content = b"".join(parts)  # what aread() sets: the SDK reads it from here
            except TimeoutError:
                raise httpx.ReadTimeout(f"no whole reply within {self.deadline:g} s", request=request) from None
            finally:
                if response is not None:
                    await response.aclose()
            return response

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{client_cls.__name__}"
    _BOUNDED[client_cls] = Bounded
    return Bounded


class _TooLarge(BaseException):
    """A reply over the size cap on its way out of the SDK's request loop. Not an ``Exception``:
    openai 1.x retries whatever its HTTP client raises (then calls it a connection error), and
    the same request would get the same oversized reply; :func:`_sdk`'s client turns it back
    into a :class:`PolicyError` with its own message."""


def _sdk(**kwargs: Any) -> Any:
    """``openai.AsyncOpenAI(**kwargs)`` (over a :func:`_bounded` HTTP client) whose requests
    raise a reply over the size cap as a :class:`PolicyError`, on every SDK version."""
    return _sdk_class()(**kwargs)


@functools.cache
def _sdk_class() -> type:
    import openai

    class BoundedOpenAI(openai.AsyncOpenAI):
        async def request(self, *args: Any, **options: Any) -> Any:
            try:
                return await super().request(*args, **options)
            except _TooLarge as exc:
                raise PolicyError(str(exc)) from None

    return BoundedOpenAI


@dataclass
class Turn:
    """One model turn: the action the env steps with, and what the model reported about it."""

    action: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    model_seconds: float = 0.0
    reasoning: str | None = None  # a reasoning server's separate thinking (vLLM ``reasoning_content``)


#: keys shorter than this are placeholders that servers without auth accept, not secrets
SECRET_MIN_CHARS = 8


def _api_key(name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, str):  # (its value is never shown: it may be a key)
        raise ValueError(f"{name} must be a string (None: $OPENAI_API_KEY), got {type(value).__name__}")
    return value


#: the rule of each argument of an endpoint's client (:class:`ChatPolicy`'s, and
#: :class:`~benchmax_gym.core.users.LLMUser`'s and :class:`~benchmax_gym.core.judge.JudgeRubric`'s,
#: which make one), as ``eval``'s flags of the same names have them. A bad one made fine and failed
#: every episode (``timeout="x"`` a TypeError, ``max_retries=-3`` the SDK's ValueError,
#: ``base_url=5`` httpx's "Invalid type for url"; a NaN temperature, sent, read as a reply that
#: is not JSON). A temperature above OpenAI's 2 is left to the server (vLLM's and SGLang's take one).
CLIENT_ARGS: dict[str, Check] = {
    "model": text,
    "base_url": optional(endpoint_url),
    "api_key": _api_key,
    "temperature": optional(at_least(0)),
    "top_p": optional(positive_up_to(1)),
    "max_tokens": optional(int_between(1, COUNT_MAX)),
    "timeout": optional(seconds),  # (None: the SDK's "no timeout")
    "max_retries": int_between(0, RETRIES_MAX),
    "extra_body": optional(mapping),
    "native_tools": boolean,
    "max_reply_bytes": positive_int,
}


def check_client_args(owner: str = "", **values: Any) -> None:
    """Refuse a bad client argument among ``values`` (by :data:`CLIENT_ARGS`) with a ValueError
    naming it, after ``owner`` (``"LLMUser: "``); the values are left as given."""
    for key, value in values.items():
        CLIENT_ARGS[key](f"{owner}{key}", value)


@dataclass
class ChatPolicy:
    """A model behind an OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, SGLang, a proxy),
    through the official ``openai`` SDK's async client.

    Args:
        model: the served model name.
        base_url: the endpoint, e.g. ``http://localhost:8000/v1`` (default: the SDK's, OpenAI).
        api_key: the key (default: ``$OPENAI_API_KEY``, as the SDK reads it; never written anywhere).
        native_tools: pass the env's tools as schemas and read ``tool_calls`` (the env speaks
            ``tool_format="openai"``, tools left out of the system prompt); ``False``: the model
            writes calls as text in the env's own format (``hermes`` by default).
        temperature, top_p, max_tokens: sampling parameters (left to the server when None).
        timeout: seconds per request, the whole reply included (a server dripping its body is cut
            off); max_retries: the SDK's retries with backoff on 408/409/429/5xx, timeouts and
            connection errors, honouring ``Retry-After``.
        extra_body: more request fields (vLLM's ``top_k``, ``chat_template_kwargs``...).
        max_reply_bytes: a larger reply fails its episode (bounds memory against a hostile endpoint).
        transport: ``"lean"`` (default): the SDK's request, retries and errors over a lean HTTP/1.1
            path (:mod:`benchmax_gym.eval.http`, ~0.1 ms of CPU a request instead of ~1 ms; a proxy
            or a redirect still goes through the SDK); ``"sdk"``: every request through the SDK.
    """

    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    native_tools: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    timeout: float = 120.0
    max_retries: int = 4
    extra_body: dict[str, Any] | None = None
    name: str = "model"
    max_reply_bytes: int = MAX_REPLY_BYTES
    transport: str = "lean"

    def __post_init__(self):
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        check_client_args(**{key: getattr(self, key) for key in CLIENT_ARGS})
        extra = self.extra_body or {}
        # (a streamed reply is server-sent events, not the JSON reply eval reads: every episode
        # failed as malformed; n > 1 had the server make n completions a turn, all but the first
        # thrown away and every one billed)
        if extra.get("stream"):
            raise ValueError("extra_body: stream is not supported: eval reads each reply whole; leave it out")
        if extra.get("n", 1) != 1:
            raise ValueError(f"extra_body: n={extra['n']!r} is not supported: one completion a request is read "
                             "(for more samples of each task, eval's k: -k)")
        if self.api_key is None:  # as the SDK does (it reads OPENAI_BASE_URL too, when base_url is None)
            self.api_key = os.environ.get("OPENAI_API_KEY") or None
        self._clients: list[Any] = []
        self._httpx_only = False
        self._busy: list[int] = []
        self._lean: Any = None  # a LeanChatClient, on the loop that made it; False: the SDK's path

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return {"tool_format": "openai", "tools_in_prompt": False} if self.native_tools else {}

    def describe(self) -> dict[str, Any]:
        """What a run record says about the policy (never the key)."""
        return {"kind": "chat", "model": self.model, "base_url": self.base_url, "native_tools": self.native_tools,
                "sampling": {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                             **(self.extra_body or {})},
                "timeout": self.timeout, "max_retries": self.max_retries}

    def client(self, max_retries: int | None = None, timeout: float | None = None, aiohttp: bool = True) -> Any:
        """A new async client, on aiohttp when the SDK's ``aiohttp`` extra is installed (it spends
        about two thirds of httpx's CPU per request; httpx tells a refused connection from a timeout,
        so the preflight uses it)."""
        import openai

        http = None
        if aiohttp:
            try:
                http = _bounded(openai.DefaultAioHttpClient)(timeout=timeout or self.timeout)
            except RuntimeError:  # openai without its aiohttp extra
                self._httpx_only = True
        if http is None:
            http = _bounded(openai.DefaultAsyncHttpxClient)(timeout=timeout or self.timeout)
        http.deadline, http.max_bytes = timeout or self.timeout, self.max_reply_bytes
        return _sdk(base_url=self.base_url, api_key=self.api_key or "EMPTY", timeout=timeout or self.timeout,
                    http_client=http, max_retries=self.max_retries if max_retries is None else max_retries)

    def _least_busy(self) -> int:
        """The client for the next request. On httpx requests are spread over a few clients: it
        scans its whole connection pool for every request, so one pool of 64 connections costs
        ~1 ms of CPU per request, eight of 8 far less. aiohttp needs one (each costs ~35 ms to make)."""
        if not self._clients:
            self._clients = [self.client()]
            if self._httpx_only:
                self._clients += [self.client() for _ in range(HTTPX_CLIENTS - 1)]
            self._busy = [0] * len(self._clients)
        return min(range(len(self._clients)), key=self._busy.__getitem__)

    def scrub(self, text: str) -> str:
        """``text`` with the API key blotted out (error messages may quote it). A key shorter than
        :data:`SECRET_MIN_CHARS` is a placeholder (vLLM's ``EMPTY``, ``x``), not a secret: blotting
        it out would mangle every reply that contains those letters (``\\boxed`` with key ``x``)."""
        key = self.api_key
        return text.replace(key, "***") if key and len(key) >= SECRET_MIN_CHARS else text

    async def preflight(self, timeout: float = 10.0) -> None:
        """One tiny request before any episode: an unreachable endpoint, an unknown model, a base
        URL without its ``/v1`` or a refused (or missing) key fails here, in seconds, as one line
        (a :class:`PolicyError`)."""
        import openai

        client = self.client(max_retries=0, timeout=timeout, aiohttp=False)
        where = self.base_url or os.environ.get("OPENAI_BASE_URL") or "the OpenAI API"
        try:
            await client.chat.completions.create(**_PING, model=self.model)
        except openai.AuthenticationError:
            if not self.api_key:
                raise PolicyError(f"{where} wants an API key (401) and none was given: set OPENAI_API_KEY, or "
                                  "name the variable that holds it with --api-key-env VAR") from None
            raise PolicyError(f"{where} refused the API key (401)") from None
        except openai.NotFoundError as exc:
            with_v1 = await self._with_v1(str(client.base_url), timeout)
            if with_v1:
                raise PolicyError(f"{where} has no chat completions endpoint but {with_v1} has: add /v1 "
                                  f"(--base-url {with_v1})") from None
            raise PolicyError(f"{where} does not serve model {self.model!r} (404: {self.scrub(_message(exc))})") from None
        except openai.APITimeoutError:
            raise PolicyError(f"{where} did not answer within {timeout:g} s") from None
        except openai.APIConnectionError as exc:
            raise PolicyError(f"cannot reach {where}: {self.scrub(str(exc.__cause__ or exc))}") from None
        except openai.APIStatusError as exc:
            raise PolicyError(f"{where} answered {exc.status_code}: {self.scrub(_message(exc))}") from None
        finally:
            await client.close()

    async def _with_v1(self, url: str, timeout: float) -> str | None:
        """``url`` + ``/v1`` when ``url`` lacks it and that one serves chat completions (the
        common slip: vLLM's and SGLang's routes are under ``/v1``), else None."""
        import dataclasses
        from urllib.parse import urlsplit

        import openai

        if urlsplit(url).path.rstrip("/").endswith("/v1"):
            return None
        candidate = url.rstrip("/") + "/v1"
        client = dataclasses.replace(self, base_url=candidate).client(max_retries=0, timeout=timeout, aiohttp=False)
        try:
            await client.chat.completions.create(**_PING, model=self.model)
        except openai.NotFoundError as exc:  # an API error (not a bare "Not Found"): the route is there
            return candidate if isinstance(exc.body, dict) and "message" in exc.body else None
        except openai.APIStatusError:  # 401, 429, 5xx: a route that answers
            return candidate
        except openai.OpenAIError:
            return None
        finally:
            await client.close()
        return candidate

    async def __call__(self, env: Any, obs: str, info: dict[str, Any], *, seed: int | None = None) -> Turn:
        params: dict[str, Any] = {"model": self.model, "messages": env.chat_messages("openai")}
        if self.native_tools and env.tool_schemas:
            params["tools"] = env.tool_schemas
        for key in ("temperature", "top_p", "max_tokens"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        if seed is not None:
            params["seed"] = seed
        params.update(self.extra_body or {})
        message, finish, usage, seconds = await self.complete(params)
        content = message.get("content")
        if self.native_tools:
            calls = [_without_none(c) for c in message.get("tool_calls") or []]
            action = _ENCODER.encode({"role": "assistant", "content": content, "tool_calls": calls})
        else:
            action = content or ""
        reasoning = message.get("reasoning_content")
        if self.api_key:  # a server echoing the request's headers must not put the key in the record
            action, reasoning = self.scrub(action), reasoning and self.scrub(reasoning)
        return Turn(action=action, prompt_tokens=usage.get("prompt_tokens"),
                    completion_tokens=usage.get("completion_tokens"), finish_reason=finish,
                    model_seconds=seconds, reasoning=reasoning)

    async def complete(self, params: dict[str, Any]) -> tuple[dict, str | None, dict, float]:
        """One chat completion with ``params`` as the request body: ``(message, finish_reason,
        usage, seconds)``, each checked; any failure past the SDK's retries is a :class:`PolicyError`
        (the key scrubbed from it). Shared by the policy and by judges (:mod:`benchmax_gym.core.judge`)."""
        import openai

        start = time.perf_counter()
        try:
            # The SDK's own request path (retries, Retry-After, typed errors), without create()'s
            # type-guided copy of every message (plain chat messages need none: ~2 ms a request)
            # and returning the JSON as it came (building ChatCompletion models cost more CPU than
            # the rest of a turn).
            lean = self._lean_client()
            if lean is not None:
                response = await lean.post(params)
            else:
                slot = self._least_busy()
                self._busy[slot] += 1
                try:
                    response = await self._clients[slot].post("/chat/completions", body=params, cast_to=object)
                finally:
                    self._busy[slot] -= 1
        except openai.OpenAIError as exc:
            detail = _message(exc) if isinstance(exc, openai.APIStatusError) else str(exc.__cause__ or exc)
            status = f" {exc.status_code}" if isinstance(exc, openai.APIStatusError) else ""
            raise PolicyError(self.scrub(f"{type(exc).__name__}{status}: {detail}")) from None
        except ValueError as exc:  # a body that is not JSON
            raise PolicyError(self.scrub(f"the endpoint's reply is not valid JSON: {exc}")) from None
        except PolicyError:  # a reply over the size cap (either path's), already worded
            raise
        except Exception as exc:  # noqa: BLE001  the HTTP client's own (aiohttp's on a malformed reply)
            raise PolicyError(self.scrub(f"{type(exc).__name__}: {exc}")) from None
        seconds = time.perf_counter() - start
        message, finish, usage = _reply_parts(response, self.scrub)
        return message, finish, usage, seconds

    def _lean_client(self) -> Any:
        """The lean client of this event loop, or None for the SDK's path (``transport="sdk"``, or
        an endpoint the lean path does not speak: a proxy, another scheme, a non-Latin-1 header)."""
        lean = self._lean
        if lean is False or self.transport != "lean":
            return None
        if lean is not None and lean.loop is asyncio.get_running_loop():
            return lean
        import openai

        from benchmax_gym.eval.http import LeanChatClient

        sdk = _sdk(base_url=self.base_url, api_key=self.api_key or "EMPTY", timeout=self.timeout,
                   max_retries=self.max_retries, http_client=_bounded(openai.DefaultAsyncHttpxClient)(timeout=self.timeout))
        sdk._client.deadline, sdk._client.max_bytes = self.timeout, self.max_reply_bytes
        try:
            self._lean = LeanChatClient(sdk, self.timeout, self.max_reply_bytes)
        except Exception:  # noqa: BLE001  (whatever it does not speak, the SDK does)
            self._lean = False
            return None
        return self._lean

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.close()
        lean, self._lean = self._lean, None
        if lean:
            await lean.aclose()


def _reply_parts(response: Any, scrub: Callable[[str], str]) -> tuple[dict, str | None, dict]:
    """``(message, finish_reason, usage)`` of a chat completion, each field of the type the
    protocol gives it; anything else fails the episode with a :class:`PolicyError` naming the
    field (a malformed reply must never reach the env, or the run)."""

    def bad(where: str, value: Any, kind: str) -> PolicyError:
        return PolicyError(scrub(f"the endpoint's reply is malformed: {where} is {str(value)[:100]!r}, not {kind}"))

    if not isinstance(response, dict):
        raise bad("the reply", response, "a JSON object")
    choices = response.get("choices")
    if not choices or not isinstance(choices, list):
        raise PolicyError("the endpoint answered with no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise bad("choices[0]", choice, "an object")
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        raise bad("choices[0].message", message, "an object")
    for key in ("content", "reasoning_content"):
        if not isinstance(message.get(key), (str, type(None))):
            raise bad(f"message.{key}", message[key], "text")
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad("message.tool_calls", calls, "a list")
        for i, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                    or not isinstance(function.get("arguments", ""), (str, dict)):
                raise bad(f"message.tool_calls[{i}]", call, "a function call (name, arguments)")
    finish = choice.get("finish_reason")
    if not isinstance(finish, (str, type(None))):
        raise bad("finish_reason", finish, "text")
    usage = response.get("usage") or {}
    if not isinstance(usage, dict):
        raise bad("usage", usage, "an object")
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise bad(f"usage.{key}", value, "a count")
    return message, finish, usage


def _without_none(value: Any) -> Any:
    """A tool call as the SDK's ``model_dump(exclude_none=True)`` gives it."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(getattr(exc, "message", exc))


@dataclass
class FunctionPolicy:
    """Your function ``(obs, info) -> action`` (sync or async) as a policy, or a baseline:
    ``solver`` (the env's reference solver: the ceiling), ``random`` (random text: the floor),
    ``empty`` (an empty reply: the floor of answering nothing)."""

    fn: Callable[..., Any] | None = None
    name: str = "function"
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.fn is None and self.name not in BASELINES:
            raise ValueError(f"policy must be a ChatPolicy, a function or one of {BASELINES}, got {self.name!r}")
        self._solvers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def describe(self) -> dict[str, Any]:
        fn = self.fn
        return {"kind": "baseline" if fn is None else "function", "name": self.name if fn is None else
                f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"}

    def scrub(self, text: str) -> str:
        return text

    async def __call__(self, env: Any, obs: str, info: dict[str, Any], *, seed: int | None = None) -> Turn:
        if self.name == "solver" and self.fn is None:
            if env not in self._solvers:
                self._solvers[env] = env.reference_solver()
            return Turn(action=self._solvers[env](obs, info))
        if self.name == "random" and self.fn is None:
            rng = random.Random(f"{seed}-{info.get('turn', 0)}")
            return Turn(action="".join(rng.choice("abcdefghijklmnopqrstuvwxyz <>{}\":,0123456789")
                                       for _ in range(rng.randint(0, 80))))
        if self.fn is None:
            return Turn(action="")
        out = self.fn(obs, info)
        if inspect.isawaitable(out):
            out = await out
        return out if isinstance(out, Turn) else Turn(action=str(out))


def as_policy(policy: Any) -> Any:
    """A :class:`ChatPolicy`, a baseline name, a function or anything with ``__call__``/``describe``."""
    if isinstance(policy, str):
        return FunctionPolicy(name=policy)
    if hasattr(policy, "describe") and hasattr(policy, "env_kwargs"):
        return policy
    if callable(policy):
        return FunctionPolicy(fn=policy)
    raise ValueError(f"policy must be a ChatPolicy, a function or one of {BASELINES}, got {policy!r}")
