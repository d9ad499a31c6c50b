"""OpenEnv both ways: every environment here served to OpenEnv clients, every OpenEnv server
played through the gym API. Needs the extra: ``pip install 'benchmax-gym[openenv]'``.

**Serve** (``benchmax-gym openenv-serve ENV_ID``, or :func:`build_app`): the id (built-in or
registered by you) behind OpenEnv's own server (``create_app``). The action is the model's reply
(``text``; or ``message``, an OpenAI assistant message, when the env speaks ``tool_format="openai"``);
the observation carries the env's ``text``, this turn's OpenAI ``messages``, the ``assistant``
message as the env recorded it (calls parsed), the ``tools`` at reset, ``reward``, ``done``,
``truncated``, and the rest of gym's ``info`` (``error``, ``reward_components``, ``task_id``...) as
``info`` (OpenEnv's serializer drops ``metadata`` on the wire, so ``metadata`` holds the same only
in-process). The state is the episode id, task id and index, and the turn. The ground truth stays
on the server, as in ``info``.

Which endpoint: **the WebSocket ``/ws``** (``EnvClient``, :class:`Client`, ``benchmax/OpenEnv-v0``):
one environment per connection, made at its first reset, closed (sandbox killed, workspace
deleted) when the client closes or disconnects, or after ``idle_timeout`` seconds without a
message; at most ``max_sessions`` at once (one more gets ``CAPACITY_REACHED``). OpenEnv's HTTP
``/reset`` and ``/step`` build a fresh environment per request: ``/reset`` returns a task's first
observation (a preview), ``/step`` has no episode and says to use ``/ws`` (a refusal that says
``done`` has no reward). Request bodies are bounded (16 MiB, as a WebSocket message is). Loopback
by default, refusing web pages (a ``Host`` or ``Origin`` that is not loopback: 403);
``auth_token`` (or ``BENCHMAX_GYM_OPENENV_TOKEN``) makes every request and WebSocket handshake
need ``Authorization: Bearer <token>``.

**Consume** (``gym.make("benchmax/OpenEnv-v0", base_url=...)``, :class:`OpenEnvEnv`): one session
per env over OpenEnv's client, text spaces kept, so ``make_vec``, ``eval`` and the wrappers work.
A server of ours round-trips exactly (the same observations, info, transcript and reward as the
env played in-process); any other OpenEnv server's text action goes into its one action field (or
is a JSON object of its fields) and its observation is shown as text. A step the server cannot
play (it died, did not answer in time, its environment raised) ends the episode as a failure
(``tool_unavailable``, ``tool_timeout``, ``env_error``; NaN), never a reward.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
import weakref
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import gymnasium as gym

from benchmax_gym.core.aio import OwnLoop
from benchmax_gym.core.checks import COUNT_MAX, positive_int, positive_number, seconds, url_fault
from benchmax_gym.core.env import ACTION_TOO_LONG, Episode, ToolEnv, utf8_safe
from benchmax_gym.core.formats import PARSE_ERROR
from benchmax_gym.core.outcomes import (ENV_ERROR, SCORED, TOOL_TIMEOUT, TOOL_UNAVAILABLE, failed_reward, is_failure,
                                        outcome_detail)
from benchmax_gym.core.spaces import UnicodeText
from benchmax_gym.core.tasks import Task
from benchmax_gym.core.tools import truncate
from benchmax_gym.core.users import UserUsage

log = logging.getLogger(__name__)

EXTRA = "pip install 'benchmax-gym[openenv]'"
TOKEN_ENV = "BENCHMAX_GYM_OPENENV_TOKEN"
#: error codes of the server's own refusals (the env's codes pass through unchanged)
BAD_ACTION, RESET_NEEDED, SESSION_CLOSED = "bad_action", "reset_needed", "session_closed"


def _require() -> None:
    try:
        _import_without_web_ui()
    except ImportError as exc:
        raise ImportError(f"OpenEnv support needs the openenv extra: {EXTRA} ({exc})") from None


_WEB_UI = "openenv.core.env_server.web_interface"
_WEB_UI_NAMES = ("create_web_interface_app", "WebInterfaceManager")


def _import_without_web_ui() -> None:
    """Import ``openenv.core`` without its Gradio web UI, which its package ``__init__`` imports
    (gradio: 5-7 s before ``openenv-serve`` listens) though ``create_app`` uses it only under
    ``ENABLE_WEB_INTERFACE``: the UI module is held back while the package loads (openenv treats it
    as not installed), then its names resolve on first use, so a later import still finds it."""
    if "openenv.core" in sys.modules or _WEB_UI in sys.modules:
        import openenv.core  # noqa: F401
        return
    sys.modules[_WEB_UI] = None  # type: ignore[assignment]
    try:
        import openenv.core  # noqa: F401
    finally:
        if sys.modules.get(_WEB_UI, False) is None:
            del sys.modules[_WEB_UI]
    for name in ("openenv.core.env_server", "openenv.core"):
        module = sys.modules[name]
        for attr in _WEB_UI_NAMES:
            if attr in vars(module) and getattr(module, attr) is None:
                delattr(module, attr)
        module.__getattr__ = _web_ui_getattr(module)  # type: ignore[attr-defined]


def _web_ui_getattr(module: Any) -> Any:
    """A module ``__getattr__`` that imports the web UI for its names and defers to the module's own."""
    previous = vars(module).get("__getattr__")

    def __getattr__(name: str) -> Any:
        if name in _WEB_UI_NAMES:
            import importlib

            return getattr(importlib.import_module(_WEB_UI), name)
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    return __getattr__


def _jsonable(value: Any) -> Any:
    """What goes on the wire: JSON types only (a stray numpy number becomes its text), and text
    UTF-8 can carry: a lone surrogate (a JSON escape the model wrote, which the env echoes in the
    assistant turn or a call's arguments) becomes U+FFFD, as the env shows it: OpenEnv's serializer
    refuses one, which failed the whole step."""
    return json.loads(utf8_safe(json.dumps(value, default=str, ensure_ascii=False)))


@functools.cache
def _classes() -> SimpleNamespace:
    """OpenEnv's types are pydantic classes of the extra: defined on first use, so the base
    install imports this module without it."""
    _require()
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from openenv.core.generic_client import GenericEnvClient
    from pydantic import Field
    from websockets.asyncio.client import connect

    class BenchmaxGymAction(Action):
        """The model's reply: ``text``, or ``message`` (an OpenAI assistant message, for an env
        with ``tool_format="openai"``); exactly one of them."""

        text: str | None = Field(default=None, description="the model's reply, as text")
        message: dict[str, Any] | None = Field(default=None, description="an OpenAI assistant message "
                                               "(tool_format='openai' only)")

    class BenchmaxGymObservation(Observation):
        """What the env returned; ``info`` is gym's info less ``messages`` and ``tools``."""

        text: str = ""
        messages: list[dict[str, Any]] = Field(default_factory=list)
        assistant: dict[str, Any] | None = None
        tools: list[dict[str, Any]] | None = None
        info: dict[str, Any] = Field(default_factory=dict)
        truncated: bool = False
        tool_errors: int = 0

    class BenchmaxGymState(State):
        env_id: str = ""
        task_id: str | None = None
        task_index: int | None = None
        done: bool = False

    def refusal(code: str, message: str, done: bool) -> BenchmaxGymObservation:
        """A refused request; one that says ``done`` has no reward: no episode was graded (a client
        would record 0.0 as the episode's reward)."""
        info = {"error": code, "errors": [code]}
        return BenchmaxGymObservation(text=f"Error: {message}", info=info, metadata=info, done=done,
                                      reward=None if done else 0.0)

    class GymEnvironment(Environment):
        """One gym env per OpenEnv session, made at the session's first reset (OpenEnv also
        builds one per HTTP request and for ``/state`` and ``/metadata``: those stay cheap)."""

        SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own env, workspace and sandbox

        def __init__(self, env_id: str, env_kwargs: dict[str, Any], live: Any = None):
            super().__init__()
            self.env_id, self.env_kwargs = env_id, env_kwargs
            if live is not None:
                live.add(self)  # closed at the server's shutdown (OpenEnv leaves open sessions as they are)
            self.env: gym.Env | None = None
            self.closed = False
            self.episode_id: str | None = None

        def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any):
            if self.closed:
                return refusal(SESSION_CLOSED, "this session was closed (idle too long); connect again", True)
            if episode_id is not None and not isinstance(episode_id, str):  # (the state could not say it)
                raise ValueError(f"episode_id must be a string, got {type(episode_id).__name__}")
            if self.env is None:
                self.env = gym.make(self.env_id, **self.env_kwargs)
            try:
                obs, info = self.env.reset(seed=seed, options=options or None)
            except Exception as exc:  # the client is told what the env said; the session goes on
                raise _reset_failed(self.env_id, exc) from exc
            # (the state carries it: UTF-8 safe, else every state request fails)
            self.episode_id = utf8_safe(episode_id or self.env.unwrapped.episode.rollout_id)
            info = _jsonable(info)
            messages, tools = info.pop("messages"), info.pop("tools", None)
            return BenchmaxGymObservation(text=utf8_safe(obs), messages=messages, tools=tools, info=info,
                                          metadata=info)

        def step(self, action: BenchmaxGymAction, timeout_s: float | None = None, **kwargs: Any):
            if self.closed:
                return refusal(SESSION_CLOSED, "this session was closed (idle too long); connect again", True)
            base = self.env.unwrapped if self.env is not None else None
            if base is None or base.episode is None or base.episode.done:
                return refusal(RESET_NEEDED, "no episode is running: reset first (OpenEnv's HTTP /step builds a "
                               "fresh environment per request and never has one: play episodes over the "
                               "WebSocket /ws, e.g. with EnvClient)", True)
            if (action.text is None) == (action.message is None):
                return refusal(BAD_ACTION, "send exactly one of text (the model's reply) and message (an OpenAI "
                               "assistant message)", False)
            if action.message is not None and base.format.name != "openai":
                return refusal(BAD_ACTION, f"message is for tool_format='openai'; this environment speaks "
                               f"{base.format.name!r}: send the reply as text", False)
            obs, reward, terminated, truncated, info = self.env.step(
                action.text if action.text is not None else action.message)
            assistant = base.messages[-len(info["messages"]) - 1]  # the step's one assistant turn
            sent = _jsonable({"info": info, "assistant": assistant})
            info = sent["info"]
            return BenchmaxGymObservation(
                text=utf8_safe(obs), messages=info.pop("messages"), assistant=sent["assistant"], info=info,
                metadata=info,
                reward=None if reward != reward else reward,  # a failed episode's NaN: no reward (JSON has no NaN)
                done=terminated or truncated, truncated=truncated, tool_errors=base.episode.tool_errors)

        @property
        def state(self) -> BenchmaxGymState:
            episode = getattr(self.env.unwrapped, "episode", None) if self.env is not None else None
            if episode is None:
                return BenchmaxGymState(env_id=self.env_id)
            return BenchmaxGymState(env_id=self.env_id, episode_id=self.episode_id, step_count=episode.turn,
                                    task_id=episode.task.id, task_index=episode.index, done=episode.done)

        def get_metadata(self) -> EnvironmentMetadata:
            from benchmax_gym import __version__, registry

            entry = registry.ENVS.get(self.env_id)
            return EnvironmentMetadata(name=self.env_id, description=entry.description if entry else self.env_id,
                                       version=__version__)

        def close(self) -> None:
            self.closed = True
            env, self.env = self.env, None
            if env is not None:
                env.close()

    class Client(GenericEnvClient):
        """OpenEnv's ``GenericEnvClient`` (plain dicts, any server) that can send a bearer token
        (``auth_token``) and raises :class:`ServerError` with the server's error code."""

        def __init__(self, base_url: str, auth_token: str | None = None, **kwargs: Any):
            super().__init__(base_url, **kwargs)
            self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else None

        async def connect(self) -> "Client":
            if self._ws is None:
                loopback = urlsplit(self._ws_url).hostname in ("127.0.0.1", "localhost", "::1")
                try:
                    self._ws = await connect(
                        self._ws_url, open_timeout=self._connect_timeout, max_size=self._max_message_size,
                        additional_headers=self._headers, proxy=None if loopback else True)
                except Exception as exc:
                    raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
            return self

        async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
            try:
                await self._send(message)
            except Exception:  # closed: a server that refused the session (CAPACITY_REACHED) said why first
                try:
                    said = await self._receive()
                except Exception:
                    said = {}
                if said.get("type") == "error":
                    raise ServerError(said.get("data") or {}) from None
                raise
            response = await self._receive()
            if response.get("type") == "error":
                raise ServerError(response.get("data") or {})
            return response

    return SimpleNamespace(**{c.__name__: c for c in (
        BenchmaxGymAction, BenchmaxGymObservation, BenchmaxGymState, GymEnvironment, Client)})


class SessionLost(ConnectionError):
    """The session with an OpenEnv server is gone (connection lost or refused, no answer in time);
    ``outcome``: how a step it cut short ends (``tool_unavailable``, ``tool_timeout``)."""

    def __init__(self, message: str, outcome: str = TOOL_UNAVAILABLE):
        super().__init__(message)
        self.outcome = outcome


class ServerError(RuntimeError):
    """An OpenEnv server's error message (``code``: ``VALIDATION_ERROR``, ``CAPACITY_REACHED``...)."""

    def __init__(self, data: dict[str, Any]):
        self.data, self.code = data, str(data.get("code", "UNKNOWN"))
        details = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in data.get("errors", ()))
        super().__init__(f"{data.get('message', 'error')}{': ' + details if details else ''} (code: {self.code})")


class ResetFailed(RuntimeError):
    """A session's environment raised in its reset: OpenEnv sends the message to a WebSocket
    client (``EXECUTION_ERROR``), and :func:`build_app` answers HTTP ``/reset`` with it."""


def _reset_failed(env_id: str, exc: Exception) -> ResetFailed:
    """What the server says of a reset that raised, to the client and in one line of its log (the
    traceback at debug level): the env's own message and, when that is no plain one, its type
    (a KeyError's bare key, a MemoryError's nothing; HTTP /reset was a 500 with a traceback)."""
    from benchmax_gym.serve import error_line

    said = error_line(exc)
    log.warning("benchmax-gym openenv-serve: %s: a session's reset failed: %s", env_id, said,
                exc_info=log.isEnabledFor(logging.DEBUG))
    return ResetFailed(f"the environment failed to reset: {said}")


def __getattr__(name: str) -> Any:
    """``BenchmaxGymAction``, ``BenchmaxGymObservation``, ``BenchmaxGymState``, ``GymEnvironment``
    and ``Client`` come from the extra, on first use."""
    if name in ("BenchmaxGymAction", "BenchmaxGymObservation", "BenchmaxGymState", "GymEnvironment", "Client"):
        return getattr(_classes(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- serve ----------------------------------------------------------------------------------------


def build_app(env_id: str, env_kwargs: dict[str, Any] | None = None, *, max_sessions: int = 64,
              idle_timeout: float = 600.0) -> Any:
    """OpenEnv's FastAPI app (``create_app``) serving ``env_id``, one environment per WebSocket
    session. The env is made and reset once first, as ``mcp-serve`` does: a bad id or argument,
    or an env that cannot start (an MCP server that exits), fails here, not in a client's session."""
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or not 0 < max_sessions <= COUNT_MAX:
        raise ValueError(f"max_sessions must be a positive int up to {COUNT_MAX:,}, got {max_sessions!r}")
    positive_number("idle_timeout", idle_timeout)
    kinds = _classes()
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.types import ConcurrencyConfig

    import benchmax_gym  # noqa: F401  (registers the ids)

    from benchmax_gym.serve import start_failure

    env_kwargs = dict(env_kwargs or {})
    probe = gym.make(env_id, **env_kwargs)
    try:
        probe.reset()  # (its servers and sandbox start at the first reset)
    except Exception as exc:  # (a plugin's KeyError or own exception class: named, not a traceback)
        if (said := start_failure(exc)) is exc:
            raise
        raise said from exc
    finally:
        probe.close()
    live: weakref.WeakSet = weakref.WeakSet()
    app = create_app(functools.partial(kinds.GymEnvironment, env_id, env_kwargs, live), kinds.BenchmaxGymAction,
                     kinds.BenchmaxGymObservation, env_name=env_id, concurrency_config=ConcurrencyConfig(
                         max_concurrent_envs=max_sessions, session_timeout=idle_timeout))

    async def close_sessions() -> None:
        for environment in list(live):
            await asyncio.to_thread(environment.close)

    app.router.on_shutdown.append(close_sessions)

    async def reset_failed(request: Any, exc: ResetFailed) -> Any:  # (handled here: no traceback logged)
        from starlette.responses import JSONResponse

        return JSONResponse({"detail": str(exc)}, status_code=500)

    app.add_exception_handler(ResetFailed, reset_failed)
    from mcp.server.transport_security import RequestBodyLimitMiddleware

    return _QuietDisconnects(RequestBodyLimitMiddleware(app, MAX_REQUEST_BYTES))


#: the largest HTTP request body (413 beyond): what uvicorn allows a WebSocket message (OpenEnv's
#: app reads a whole body into memory, several times its size, however big it is)
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class _QuietDisconnects:
    """ASGI wrapper of OpenEnv's app, for its WebSocket sessions.

    A client that vanished is not a server error: OpenEnv's ``/ws`` handler, having freed the
    session, answers the dead socket and lets starlette's ``WebSocketDisconnect`` (or, mid-step,
    a ``RuntimeError``: send after close) escape, which uvicorn logs as a traceback; so does a
    session the server's end cut short (Ctrl-C twice: cancelled while its environment closed).

    A ``/ws`` message OpenEnv reads outside its error handling (binary, JSON that is not an object,
    nests past the parser's depth or holds an int past its digit limit) would end the session,
    its episode lost; it is answered with an ``INVALID_JSON`` error instead, and the session goes
    on."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        from starlette.websockets import WebSocketDisconnect

        if scope["type"] == "websocket" and scope.get("path") == "/ws":
            receive = _objects_only(receive, send)
        try:
            await self.app(scope, receive, send)
        except (WebSocketDisconnect, RuntimeError, asyncio.CancelledError):  # (cancelled: a second Ctrl-C
            if scope["type"] != "websocket":  # ended the server while the session's environment closed)
                raise


def _objects_only(receive: Any, send: Any) -> Any:
    """``receive`` of a ``/ws`` session, answering the messages OpenEnv cannot read itself (the
    handler only receives between its replies, so nothing else is sending)."""

    async def checked() -> dict[str, Any]:
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return message
            problem = _not_a_message(message.get("text"))
            if problem is None:
                return message
            error = {"type": "error", "data": {"message": f"Invalid JSON: {problem}", "code": "INVALID_JSON"}}
            await send({"type": "websocket.send", "text": json.dumps(error)})

    return checked


def _not_a_message(text: str | None) -> str | None:
    """Why a /ws message is none OpenEnv's handler survives, or None (bad JSON it answers itself)."""
    if text is None:
        return "a message is JSON text, not binary"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    except (ValueError, RecursionError) as exc:  # nested past the parser's depth, an int past its digits
        return str(exc)
    if not isinstance(value, dict):
        return f'a message is a JSON object ({{"type": ..., "data": ...}}), got {type(value).__name__}'
    return None


def serve(env_id: str, *, host: str = "127.0.0.1", port: int = 8000, env_kwargs: dict[str, Any] | None = None,
          max_sessions: int = 64, idle_timeout: float = 600.0, auth_token: str | None = None,
          sockets: list | None = None) -> None:
    """Run :func:`build_app` until interrupted; ``auth_token`` defaults to ``BENCHMAX_GYM_OPENENV_TOKEN``.
    ``sockets``: from :func:`benchmax_gym.serve.listen` (default: listen here, before the app is
    built: a port in use is a ListenError first); closed when the server ends."""
    from benchmax_gym.serve import listen, run_http_app

    if sockets is None:
        sockets = listen(host, port)
    try:
        app = build_app(env_id, env_kwargs, max_sessions=max_sessions, idle_timeout=idle_timeout)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    token = auth_token if auth_token is not None else os.environ.get(TOKEN_ENV) or None
    run_http_app(app, host, port, token, "openenv-serve", sockets=sockets)


# -- consume --------------------------------------------------------------------------------------


class OpenEnvEnv(gym.Env[str, str]):
    """Any OpenEnv server as a Gymnasium text environment (``benchmax/OpenEnv-v0``).

    Args:
        base_url: the server, ``http://host:port`` (or ``ws://``); checked at ``gym.make``.
        auth_token: a bearer token (default: ``BENCHMAX_GYM_OPENENV_TOKEN``, which stays out of
            ``ps`` and of eval's run record).
        action_field: for a server not of ours, the action field the reply goes into (default:
            its only field; with several, the reply must be a JSON object of them).
        observation_field: the observation field shown as text (default: its only text field,
            else the observation as JSON).
        timeout: seconds a reset or step may take on the server; connect_timeout: to connect.

    The session opens at the first reset (on the loop of whoever drives it: a vector worker's,
    with no hop) and closes with ``close()``; a reset after a lost connection opens a new one.
    A step the server refuses as malformed is an observation (``info["error"] == "bad_action"``), so
    is one longer than ``max_action_chars`` (``action_too_long``: past the server's message limit
    the session would end). A step the server could not play ends the episode as a failure (issue
    29: NaN, never a reward), the server's message in ``info["outcome_detail"]``:
    ``tool_unavailable`` (the connection lost), ``tool_timeout`` (no answer within ``timeout``),
    ``env_error`` (the server's environment raised); so does a step after the server closed an
    idle session (``tool_unavailable``). A reset that fails raises, naming ``base_url``.
    Options pass to the server's reset as keywords (``{"task_index": 3}`` for ours).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}
    messages, chat_messages, render = ToolEnv.messages, ToolEnv.chat_messages, ToolEnv.render  # one transcript logic
    _mix: dict[str, Any] | None = None  # a served mixture's member and level, as its own record has them
    needs_event_loop = True  # every step waits on the network
    tasks = None  # the server's; eval takes a count (--tasks N)
    rubric = None

    def __init__(self, base_url: str | None = None, *, auth_token: str | None = None, action_field: str | None = None,
                 observation_field: str | None = None, timeout: float = 300.0, connect_timeout: float = 10.0,
                 max_action_chars: int = 1_000_000, max_observation_chars: int = 1_000_000,
                 render_mode: str | None = None, **unknown: Any):
        if unknown:
            hint = " (the served environment's options are set on the server: benchmax-gym openenv-serve " \
                   "ENV_ID --env-arg KEY=VALUE)"
            raise TypeError(f"OpenEnvEnv got unexpected keyword arguments {sorted(unknown)}{hint}")
        _require()  # before base_url: a missing extra is the first thing to fix
        # (a port that is no number or past 65535 passed, and failed in httpx naming no argument)
        fault = url_fault(base_url, ("http", "https", "ws", "wss"))
        if fault is not None:
            raise ValueError(f"base_url must be an OpenEnv server's http:// or ws:// URL, got {base_url!r}"
                             + ("" if fault.startswith("expected") else f": {fault}")
                             + " (the CLI: --env-arg base_url=http://HOST:PORT)")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.base_url, self.render_mode = base_url.rstrip("/"), render_mode
        self.timeout = seconds("timeout", timeout)  # (inf: OverflowError, "timestamp out of range")
        self.connect_timeout = seconds("connect_timeout", connect_timeout)
        token = auth_token if auth_token is not None else os.environ.get(TOKEN_ENV) or None
        self._token = token
        schema = self._schema(token)
        action_props = {k: v for k, v in schema["action"].get("properties", {}).items() if k != "metadata"}
        obs_props = {k: v for k, v in schema["observation"].get("properties", {}).items()
                     if k not in ("metadata", "done", "reward")}
        self.ours = schema["action"].get("title") == "BenchmaxGymAction"
        if self.ours and (action_field or observation_field):
            raise ValueError("action_field and observation_field are for other servers: this one is benchmax-gym's")
        if action_field is not None and action_field not in action_props:
            raise ValueError(f"action_field={action_field!r} is not a field of this server's action: "
                             f"{sorted(action_props)}")
        if observation_field is not None and observation_field not in obs_props:
            raise ValueError(f"observation_field={observation_field!r} is not a field of this server's observation: "
                             f"{sorted(obs_props)}")
        self.action_fields = sorted(action_props)
        self.action_field = action_field or (next(iter(action_props)) if len(action_props) == 1 else None)
        texts = [k for k, v in obs_props.items() if v.get("type") == "string"]
        self.observation_field = observation_field or (texts[0] if len(texts) == 1 else None)
        self.action_space = UnicodeText(positive_int("max_action_chars", max_action_chars))
        self.observation_space = UnicodeText(positive_int("max_observation_chars", max_observation_chars))
        self.aio = OwnLoop()
        weakref.finalize(self, self.aio.close)  # dropped without close(): its connection's tasks end quietly
        self.client: Any = None
        self.episode: Episode | None = None
        self.tool_schemas: list[dict[str, Any]] = []

    def _schema(self, token: str | None) -> dict[str, Any]:
        import httpx

        url = self.base_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1) + "/schema"
        try:
            response = httpx.get(url, headers={"Authorization": f"Bearer {token}"} if token else None,
                                 timeout=self.connect_timeout)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"no OpenEnv server answers at base_url={self.base_url!r}: {exc}") from None
        if response.status_code == 401:
            raise ConnectionError(f"the OpenEnv server at base_url={self.base_url!r} wants a bearer token: pass "
                                  f"auth_token= or set {TOKEN_ENV}" + (" (this one was refused)" if token else ""))
        try:
            schema = response.json() if response.status_code == 200 else None
        except ValueError:
            schema = None
        if not isinstance(schema, dict) or not {"action", "observation"} <= set(schema):
            raise ValueError(f"base_url={self.base_url!r} is not an OpenEnv server: GET /schema answered HTTP "
                             f"{response.status_code} without action and observation schemas")
        return schema

    # -- the session ------------------------------------------------------------------------------

    async def _send(self, kind: str, data: dict[str, Any]) -> Any:
        if self.client is None:
            self.client = _classes().Client(self.base_url, auth_token=self._token,
                                            connect_timeout_s=self.connect_timeout, message_timeout_s=self.timeout)
        try:
            return await (self.client.reset(**data) if kind == "reset" else self.client.step(data))
        except ServerError as exc:
            if exc.code == "VALIDATION_ERROR":
                raise
            await self._drop()
            if exc.code == "CAPACITY_REACHED":
                raise SessionLost(
                    f"the OpenEnv server at base_url={self.base_url!r} has no free session ({exc}); a server whose "
                    "environment does not set SUPPORTS_CONCURRENT_SESSIONS serves one at a time") from None
            raise RuntimeError(f"the OpenEnv server at base_url={self.base_url!r} failed: {exc}") from None
        except Exception as exc:  # lost, timed out or refused: the session is gone
            from websockets.exceptions import ConnectionClosed

            await self._drop()
            if isinstance(exc, TimeoutError):
                raise self._lost(f"did not answer within timeout={self.timeout:g} s", TOOL_TIMEOUT) from None
            raise self._lost(f"the connection closed ({exc})" if isinstance(exc, ConnectionClosed) else
                             str(exc) or type(exc).__name__) from None

    def _lost(self, what: str, outcome: str = TOOL_UNAVAILABLE) -> SessionLost:
        return SessionLost(f"OpenEnv server at base_url={self.base_url!r}: {what}; the episode is lost, "
                           "reset() opens a new session", outcome)

    async def _drop(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                await client.disconnect()
            except Exception:
                pass

    # -- Gymnasium API ----------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return self.aio.run(self._reset(seed, options))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return await self.aio.arun(self._reset(seed, options))

    def step(self, action: Any):
        return self.aio.run(self._step(action))

    async def astep(self, action: Any):
        return await self.aio.arun(self._step(action))

    async def _reset(self, seed: int | None, options: dict[str, Any] | None):
        data = {**(options or {}), **({} if seed is None else {"seed": seed})}
        for attempt in (1, 2):
            try:
                result = await self._send("reset", data)
            except ConnectionError:
                if attempt == 2 or self.episode is None:
                    raise
                continue  # the old session was lost: one more try on a new one
            if self.ours and result.observation.get("info", {}).get("error") == SESSION_CLOSED and attempt == 1:
                await self._drop()  # idled out on the server: a new session
                continue
            break
        payload = result.observation
        if self.ours:
            if payload["info"].get("error"):
                raise RuntimeError(f"the OpenEnv server at base_url={self.base_url!r}: {payload['text']}")
            obs, info = payload["text"], {**payload["info"], "messages": payload["messages"], "tools": payload["tools"]}
            task = Task(id=str(info.get("task_id")), prompt=payload["messages"][-1]["content"],
                        metadata=info.get("task_metadata") or {})
            index = info.get("task_index") or 0
        else:
            obs = self._text(payload)
            info = {"observation": payload, "turn": 0, "messages": [{"role": "user", "content": obs}], "tools": []}
            task, index = Task(id=str(payload.get("episode_id", "openenv")), prompt=obs), 0
        self.tool_schemas = info["tools"] or []
        self._mix = {"member": info["member"], "difficulty": info.get("difficulty")} if "member" in info else None
        self.episode = Episode(task=task, rollout_id="", index=int(index), messages=list(info["messages"]))
        return obs, info

    async def _step(self, action: Any):
        episode = self.episode
        if episode is None or episode.done:
            raise gym.error.ResetNeeded("call reset() before step()" if episode is None else
                                        "the episode has ended; call reset() before step()")
        if not isinstance(action, (str, dict)):
            raise TypeError(f"action must be a str (the model's reply) or a dict, got {type(action).__name__}")
        episode.actions.append(action if isinstance(action, str) else json.dumps(action))
        limit = self.action_space.max_length
        if len(episode.actions[-1]) > limit:  # refused here: past the server's message limit, the session ends
            return self._refused(ACTION_TOO_LONG, f"your reply has {len(episode.actions[-1])} characters; "
                                 f"the limit is {limit}. Nothing in it was run.")
        if self.ours:
            data = {"message": action} if isinstance(action, dict) else {"text": action}
        elif isinstance(action, dict):
            data = action
        elif self.action_field is not None:
            data = {self.action_field: action}
        else:
            try:
                data = json.loads(action)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                return self._refused(PARSE_ERROR, f"this environment's action is a JSON object with the fields "
                                     f"{self.action_fields}; your reply is not one.")
        try:
            result = await self._send("step", data)
        except ServerError as exc:  # VALIDATION_ERROR: the session goes on
            return self._refused(BAD_ACTION, f"the environment refused the action: {exc}")
        except SessionLost as exc:  # the server died, timed out or refused: not the model's doing
            return self._failed(exc.outcome, str(exc))
        except RuntimeError as exc:  # the server's environment raised
            return self._failed(ENV_ERROR, str(exc))
        payload, reward = result.observation, float(result.reward or 0.0)
        if self.ours and payload["info"].get("error") == SESSION_CLOSED:
            # the caller idled past the server's limit: the episode is gone with the session
            await self._drop()
            return self._failed(TOOL_UNAVAILABLE, str(self._lost("the server closed this session (idle past its "
                                                                  "--idle-timeout)")))
        if self.ours and payload["info"].get("error") == RESET_NEEDED:  # no episode there (a reset failed)
            await self._drop()
            return self._failed(ENV_ERROR, f"the OpenEnv server at base_url={self.base_url!r} has no episode "
                                f"running: {payload['text']}")
        if self.ours:
            obs, info = payload["text"], {**payload["info"], "messages": payload["messages"]}
            truncated = bool(payload["truncated"])
            terminated = bool(result.done) and not truncated
            if payload["assistant"] is not None:
                episode.messages.append(payload["assistant"])
            episode.turn, episode.tool_errors = info.get("turn", episode.turn), payload["tool_errors"]
        else:
            obs = self._text(payload)
            terminated, truncated = bool(result.done), False
            episode.turn += 1
            episode.messages.append({"role": "assistant", "content": episode.actions[-1]})
            info = {"observation": payload, "turn": episode.turn, "error": None, "errors": [],
                    "messages": [{"role": "user", "content": obs}]}
        episode.messages.extend(info["messages"])
        if isinstance(info.get("user"), dict):  # a served env's simulated user: its counters, as the record has them
            episode.user = UserUsage(**{k: v for k, v in info["user"].items() if k in UserUsage.__dataclass_fields__})
        episode.done = terminated or truncated
        if episode.done:  # how it ended: ours says; another server's episode ended as it graded it
            episode.outcome = info.get("outcome") if self.ours else info.setdefault("outcome", SCORED)
        if is_failure(episode.outcome):  # the server's failed episode: ungraded, NaN as ToolEnv returns it
            reward = failed_reward()
        elif episode.done and (not self.ours or "reward_components" in info):  # graded (as ToolEnv records it)
            episode.reward = float(reward)
            episode.reward_components = dict(info.get("reward_components") or {})
        return obs, reward, terminated, truncated, info

    def episode_record(self) -> dict[str, Any]:
        """:meth:`ToolEnv.episode_record` of the transcript here, with a served mixture's member."""
        record = ToolEnv.episode_record(self)
        if record and self._mix:
            record.update(self._mix)
        return record

    def _refused(self, code: str, message: str):
        """A step the client or the server refused: an observation saying why; the episode goes on."""
        episode = self.episode
        episode.turn += 0 if self.ours else 1
        note = {"role": "user", "content": f"Error: {message}"}
        said = truncate(episode.actions[-1], self.action_space.max_length)
        episode.messages += [{"role": "assistant", "content": said}, note]
        info = {"turn": episode.turn, "error": code, "errors": [code], "messages": [note]}
        return note["content"], 0.0, False, False, info

    def _failed(self, outcome: str, detail: str):
        """A step the server could not play (it died, timed out, its environment raised): the
        episode ends ungraded with ``outcome``, the server's message in ``info["outcome_detail"]``
        (the model is told only that the episode could not be graded), reward NaN, never 0."""
        episode = self.episode
        episode.turn += 1
        episode.done, episode.outcome = True, outcome
        note = {"role": "user", "content": f"Error: the environment failed ({outcome}); the episode could not be "
                                           "graded: it is over."}
        episode.messages += [{"role": "assistant", "content": episode.actions[-1]}, note]
        info = {"turn": episode.turn, "error": outcome, "errors": [outcome], "messages": [note],
                "outcome": outcome, "outcome_detail": outcome_detail(detail), "reward_components": {}}
        return note["content"], failed_reward(), False, True, info

    def _text(self, payload: dict[str, Any]) -> str:
        if self.observation_field is not None:
            value = payload.get(self.observation_field)
            return value if isinstance(value, str) else json.dumps(value)
        return json.dumps(payload, ensure_ascii=False)

    def server_state(self) -> dict[str, Any]:
        """The session's state on the server (``episode_id``, ``step_count``; ours add ``task_id``...)."""
        if self.client is None:
            return {}
        return self.aio.run(self.client.state())

    def reference_solver(self):
        raise NotImplementedError("OpenEnvEnv has no reference solver: the solution stays on the server")

    def close(self):
        if self.client is not None:
            try:
                self.aio.run(self._drop(), timeout=self.connect_timeout)
            except Exception:
                pass
        self.aio.close()
        super().close()
