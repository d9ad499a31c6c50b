"""Who plays an eval episode: a model behind an OpenAI-compatible endpoint, a baseline, or your function.

A policy is called once per turn as ``await policy(env, obs, info, seed=...)`` with the unwrapped
env (so it can read ``env.chat_messages()`` and ``env.tool_schemas``) and returns a :class:`Turn`:
the action text plus what the model reported (tokens, ``finish_reason``). ``env_kwargs`` are the
``gym.make`` arguments it needs (native tool calling makes the env speak ``tool_format="openai"``).
"""

from __future__ import annotations

import inspect
import json
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BASELINES = ("solver", "random", "empty")
HTTPX_CLIENTS = 8  # httpx clients a ChatPolicy spreads its requests over (one aiohttp client suffices)


class PolicyError(RuntimeError):
    """The policy could not produce a turn (the model endpoint kept failing); the episode is
    recorded as failed with this message and the run goes on."""


@dataclass
class Turn:
    """One model turn: the action the env steps with, and what the model reported about it."""

    action: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    model_seconds: float = 0.0
    reasoning: str | None = None  # a reasoning server's separate thinking (vLLM ``reasoning_content``)


@dataclass
class ChatPolicy:
    """A model behind an OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, SGLang, a proxy),
    through the official ``openai`` SDK's async client.

    Args:
        model: the served model name.
        base_url: the endpoint, e.g. ``http://localhost:8000/v1`` (default: the SDK's, OpenAI).
        api_key: the key (read it from an environment variable; it is never written anywhere).
        native_tools: pass the env's tools as schemas and read ``tool_calls`` (the env speaks
            ``tool_format="openai"``, tools left out of the system prompt); ``False``: the model
            writes calls as text in the env's own format (``hermes`` by default).
        temperature, top_p, max_tokens: sampling parameters (left to the server when None).
        timeout: seconds per request; max_retries: the SDK's retries with backoff on 408/409/429/5xx
            and connection errors, honouring ``Retry-After``.
        extra_body: more request fields (vLLM's ``top_k``, ``chat_template_kwargs``...).
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

    def __post_init__(self):
        self._clients: list[Any] = []
        self._httpx_only = False
        self._busy: list[int] = []

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
                http = openai.DefaultAioHttpClient(timeout=timeout or self.timeout)
            except RuntimeError:  # openai without its aiohttp extra
                self._httpx_only = True
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY",
                                  timeout=timeout or self.timeout, http_client=http,
                                  max_retries=self.max_retries if max_retries is None else max_retries)

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
        """``text`` with the API key blotted out (error messages may quote it)."""
        return text.replace(self.api_key, "***") if self.api_key else text

    async def preflight(self, timeout: float = 10.0) -> None:
        """One tiny request before any episode: an unreachable endpoint, an unknown model or a
        refused key fails here, in seconds, as one line (a :class:`PolicyError`)."""
        import openai

        client = self.client(max_retries=0, timeout=timeout, aiohttp=False)
        where = self.base_url or "the OpenAI API"
        try:
            await client.chat.completions.create(model=self.model, max_tokens=1,
                                                 messages=[{"role": "user", "content": "ping"}])
        except openai.AuthenticationError:
            raise PolicyError(f"{where} refused the API key (401)") from None
        except openai.NotFoundError as exc:
            raise PolicyError(f"{where} does not serve model {self.model!r} (404: {self.scrub(_message(exc))})") from None
        except openai.APITimeoutError:
            raise PolicyError(f"{where} did not answer within {timeout:g} s") from None
        except openai.APIConnectionError as exc:
            raise PolicyError(f"cannot reach {where}: {self.scrub(str(exc.__cause__ or exc))}") from None
        except openai.APIStatusError as exc:
            raise PolicyError(f"{where} answered {exc.status_code}: {self.scrub(_message(exc))}") from None
        finally:
            await client.close()

    async def __call__(self, env: Any, obs: str, info: dict[str, Any], *, seed: int | None = None) -> Turn:
        import openai

        params: dict[str, Any] = {"model": self.model, "messages": env.chat_messages("openai")}
        if self.native_tools and env.tool_schemas:
            params["tools"] = env.tool_schemas
        for key in ("temperature", "top_p", "max_tokens"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        if seed is not None:
            params["seed"] = seed
        params.update(self.extra_body or {})
        start = time.perf_counter()
        try:
            # The SDK's own request path (retries, Retry-After, typed errors), without create()'s
            # type-guided copy of every message (plain chat messages need none: ~2 ms a request)
            # and returning the JSON as it came (building ChatCompletion models cost more CPU than
            # the rest of a turn).
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
        seconds = time.perf_counter() - start
        if not isinstance(response, dict):
            raise PolicyError(self.scrub(f"the endpoint's reply is not a JSON object: {str(response)[:200]}"))
        choices = response.get("choices")
        if not choices or not isinstance(choices[0], dict):
            raise PolicyError("the endpoint answered with no choices")
        choice = choices[0]
        message = choice.get("message") or {}
        if self.native_tools:
            calls = [_without_none(c) for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            action = json.dumps({"role": "assistant", "content": message.get("content"), "tool_calls": calls},
                                ensure_ascii=False)
        else:
            action = message.get("content") or ""
        usage = response.get("usage") or {}
        return Turn(action=action, prompt_tokens=usage.get("prompt_tokens"),
                    completion_tokens=usage.get("completion_tokens"),
                    finish_reason=choice.get("finish_reason"), model_seconds=seconds,
                    reasoning=message.get("reasoning_content"))

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.close()


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
