"""Simulated users: a third party in the episode who answers the model (issue 31).

Customer-service benchmarks (tau-bench, CRM-Service-v0) have three parties: the model, its tools,
and a customer who holds facts the model must ask for. An env made with ``user=`` has one::

    reset            -> obs = the task's prompt: the user's opening message
    reply with calls -> the tools answer (as in every env)
    reply, no call   -> addressed to the user: the simulator answers, as a ``user`` message
                        (info["messages"], the observation; reward 0, the episode goes on)
                     -> or the simulator is done (a stop token, ``None``, or ``UserReply(done=True)``):
                        the rubric grades the episode, terminated=True
    turn limit       -> graded as it stands, truncated=True (as in every env)
    simulator fails  -> (its endpoint down past retries; a reply cut off, holding a tool call,
                        a refusal, no text) outcome ``model_error``: ungraded, reward NaN,
                        truncated=True; a failure, never a reward (``deadline`` when the
                        episode's ``episode_timeout`` passes while it answers)

**The rule**: a reply without a tool call is addressed to the user; a reply with calls (or one
that tried and failed to parse) goes to the tools, text and all, and the user never sees it. So
in an env with a user the model cannot end the episode by answering: the user ends it (or the
turn limit; a terminal tool, where the env has one). A scripted simulator that raises, or
returns what is not text or says nothing without ending the conversation (``""``), ends the
episode with ``env_error`` (the environment broke, not the model).

What a port of a tau-bench-style benchmark still cannot say: a user with tools of their own
(tau2's "dual control"), and an episode that opens with the agent speaking first. The simulator sees the conversation from its side: the system prompt and
the tool traffic are left out, and only :meth:`UserSimulator.reply`'s arguments reach it; what it
is told in private (``task.private["user"]``: its facts and goal) never reaches the model's
observation, ``info`` or the episode record, except what the simulator itself chooses to say.

Two simulators:

* :class:`ScriptedUser` - a function ``fn(conversation, task) -> str | None | UserReply``,
  deterministic: for tests and generated tasks. Its turn is cut to ``max_reply_chars``
  (:data:`MAX_REPLY_CHARS`), with a marker, as an LLM user's is.
* :class:`LLMUser` - a model over any OpenAI-compatible endpoint, through eval's client
  (:class:`~benchmax_gym.eval.policies.ChatPolicy`: retries with backoff, a whole-reply timeout,
  a size cap, the API key never written). Its system prompt is its own instructions plus the
  task's ``task.private["user"]``; its calls, tokens and cost are counted in ``info["user"]``.
  In an episode of a seeded env (``reset(seed=...)``, and the episodes reset after it) each
  request carries a ``seed`` made from the env's seed, the episode and the request's number
  (:class:`UserSeeds`): a server that honours it (vLLM, SGLang) replays the same user.

A plain function passed as ``user=`` is a :class:`ScriptedUser`.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmax_gym.core.checks import positive_int
from benchmax_gym.core.formats import split_reasoning, utf8_safe
from benchmax_gym.core.outcomes import DEADLINE, ENV_ERROR, MODEL_ERROR
from benchmax_gym.core.tools import truncate

log = logging.getLogger(__name__)

#: what a simulator writes to end the conversation (tau-bench's convention); the text before it is said
STOP = "###STOP###"
_BROKEN_STOP = "### STOP ###"  # the stop token as a simulator sees it in the model's words
_CUT_OFF = ("length", "content_filter")  # finish reasons of a reply that stopped before its end
#: a simulator's turn is cut to this many characters (with a marker) before it enters the transcript
MAX_REPLY_CHARS = 8_000


class UserFailure(Exception):
    """The simulator could not answer for reasons not the model's (its endpoint down past its
    retries, a malformed reply): the episode ends with ``outcome`` (``model_error``), ungraded."""

    def __init__(self, message: str, outcome: str = MODEL_ERROR):
        super().__init__(message)
        self.outcome = outcome


@dataclass
class UserReply:
    """What the user says this turn; ``done``: the conversation is over (after ``content``, if any)."""

    content: str | None = None
    done: bool = False


@dataclass
class UserUsage:
    """One episode's simulator calls: what ``info["user"]`` reports (never the instructions)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None  # in the currency of the prices given (LLMUser(price=...)); None: no price
    seconds: float = 0.0
    #: the episode's seed for the simulator (:class:`UserSeeds`); None: the env was never seeded, none is sent
    seed: int | None = None
    #: indices in episode.messages of the conversation: the user's words and the replies addressed to them
    turns: set[int] = field(default_factory=set)

    def as_info(self) -> dict[str, Any]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cost": self.cost, "seconds": round(self.seconds, 6)}


def conversation(messages: list[dict[str, Any]], turns: set[int] | frozenset[int]) -> list[dict[str, str]]:
    """The conversation as the user saw it: the messages at indices ``turns`` (their own words and
    the model's replies addressed to them), as ``{role, content}``. The system prompt, tool calls,
    tool results, replies that failed to parse as calls and the engine's notes to the model (the
    last-turn warning) are never among them. In the model's replies the stop token is broken
    (``### STOP ###``): a simulator that repeats what it is told cannot end the conversation on
    the model's word."""
    talk = [{"role": messages[i]["role"], "content": str(messages[i].get("content") or "")} for i in sorted(turns)]
    for message in talk:
        if message["role"] == "assistant":
            message["content"] = break_stop(message["content"])
    return talk


def break_stop(text: str) -> str:
    """``text`` with every stop token broken (``### STOP ###``), those that breaking one would
    make too: in ``###STOP###STOP###`` the first token's closing ``###`` and the rest are a token."""
    while STOP in text:  # (each pass breaks a "###STOP" that no later pass can make again)
        text = text.replace(STOP, _BROKEN_STOP)
    return text


def user_reply(value: Any, max_chars: int = MAX_REPLY_CHARS) -> UserReply:
    """A simulator's return value as a :class:`UserReply`: ``None`` or a text holding
    :data:`STOP` ends the conversation (the text before the token is said). Anything else that
    says nothing (``""``, ``UserReply(None)``) or is not text fails (``env_error``). What is said
    is cut to ``max_chars`` with a marker saying so (:func:`~benchmax_gym.core.tools.truncate`,
    as a tool's output is): it enters the observation, ``info["messages"]``, the transcript and
    every later request to the simulator, and a scripted function may return megabytes. Its lone
    surrogates (an endpoint's ``"\\ud800"`` escape) become U+FFFD, as in a tool's output
    (:func:`~benchmax_gym.core.formats.utf8_safe`: no tokenizer takes one)."""
    if isinstance(value, UserReply):
        reply = value
    elif value is None:
        return UserReply(None, True)
    elif isinstance(value, str):
        reply = UserReply(value, False)
    else:  # (the environment's simulator broke, as when it raises: not an endpoint's failure)
        raise UserFailure(f"the user simulator returned {type(value).__name__}, not text, None or a UserReply",
                          ENV_ERROR)
    text = reply.content
    if text is not None and not isinstance(text, str):
        raise UserFailure(f"the user simulator's UserReply content is {type(text).__name__}, not text", ENV_ERROR)
    if text is not None and STOP in text:
        text, reply = text.split(STOP, 1)[0].strip(), UserReply(None, True)
        reply.content = text or None
    if not reply.done and not (text and text.strip()):  # (an empty turn: the model would answer nothing)
        raise UserFailure("the user simulator's reply has no text (and does not end the conversation)", ENV_ERROR)
    if reply.content is not None:
        said = utf8_safe(reply.content)
        said = said if len(said) <= max_chars else truncate(said, max_chars)
        if said is not reply.content:
            reply = UserReply(said, reply.done)
    return reply


def derived_seed(*parts: Any) -> int:
    """A seed in ``[0, 2**31)`` made from ``parts``: the same parts, the same seed, in any process
    (not Python's ``hash``, which is salted per process)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


class UserSeeds:
    """The seeds an env gives its simulated user, one per episode: after ``reset(seed=s)``, the
    k-th episode (0: the seeded one; then those reset without a seed, as a vector env's autoreset
    does) gets ``derived_seed(s, k)``, so a seeded env replays its user's requests, seeds included;
    an env never seeded gets None (and :class:`LLMUser` sends no seed)."""

    __slots__ = ("base", "episodes")

    def __init__(self) -> None:
        self.base: int | None = None
        self.episodes = 0

    def reseed(self, seed: int | None) -> None:
        """``reset(seed=...)``'s seed (None: the episodes go on from the last seed, if any)."""
        if seed is not None:
            self.base, self.episodes = int(seed), 0

    def next(self) -> int | None:
        """The next episode's seed (None when never seeded)."""
        if self.base is None:
            return None
        self.episodes += 1
        return derived_seed(self.base, self.episodes - 1)


class UserSimulator:
    """The third party. Subclasses implement :meth:`reply` (or :meth:`areply` for I/O). A turn
    longer than ``max_reply_chars`` is cut to it, with a marker, before it enters the transcript."""

    max_reply_chars: int = MAX_REPLY_CHARS

    @property
    def is_async(self) -> bool:
        """Whether the engine awaits :meth:`areply` (on the env's loop in ``step``): a subclass
        that implements only ``areply`` is async."""
        return type(self).reply is UserSimulator.reply

    def reply(self, conversation: list[dict[str, str]], task: Any, usage: UserUsage) -> UserReply | str | None:
        """The user's next turn, given the conversation so far (:func:`conversation`) and the
        task (its ``private["user"]`` holds what the user knows). ``usage`` counts its calls."""
        raise NotImplementedError

    async def areply(self, conversation: list[dict[str, str]], task: Any, usage: UserUsage) -> UserReply | str | None:
        return self.reply(conversation, task, usage)

    def describe(self) -> dict[str, Any]:
        """What a run record may say about the simulator (never a key, never a task's instructions)."""
        return {"kind": type(self).__name__}

    async def aclose(self) -> None:
        """Release what the simulator holds for the running event loop (an env closing its loop)."""


class ScriptedUser(UserSimulator):
    """A deterministic user: ``fn(conversation, task)`` returns what the user says, or ``None``
    (or a text holding :data:`STOP`) when the conversation is over.

    Example::

        def customer(conversation, task):
            said = conversation[-1]["content"].lower()
            if "order number" in said:
                return f"It is {task.private['user']['order']}."
            return None  # anything else: thanks, bye

        register_tool_env("me/Support-v0", tools=[...], tasks=[...], rubric=..., user=customer)
    """

    def __init__(self, fn: Callable[..., Any], max_reply_chars: int = MAX_REPLY_CHARS):
        if not callable(fn):
            raise TypeError(f"user must be a UserSimulator or a function fn(conversation, task), got {fn!r}")
        self.fn = fn
        self.max_reply_chars = positive_int("ScriptedUser: max_reply_chars", max_reply_chars)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def reply(self, conversation, task, usage):
        usage.calls += 1
        return self.fn(conversation, task)

    async def areply(self, conversation, task, usage):
        usage.calls += 1
        out = self.fn(conversation, task)
        return await out if inspect.isawaitable(out) else out

    def describe(self) -> dict[str, Any]:
        fn = self.fn
        return {"kind": "scripted", "fn": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"}

    def __reduce__(self):  # a picklable function stays picklable wrapped (vector workers)
        return (ScriptedUser, (self.fn, self.max_reply_chars))


LLM_USER_PROMPT = (
    "You are playing a customer talking to a support agent. Stay in character: write only what the "
    "customer says, one short message at a time. Give a fact only when the agent asks for it, and only "
    "the facts below; never invent others (say you do not know). When your request is handled, or the "
    f"agent cannot help, end the conversation by writing {STOP} on its own."
)


@dataclass
class LLMUser(UserSimulator):
    """A user played by a model over an OpenAI-compatible endpoint (OpenAI, vLLM, SGLang...).

    Args:
        model, base_url, api_key, temperature, max_tokens, timeout, max_retries, extra_body:
            as :class:`~benchmax_gym.eval.policies.ChatPolicy` (the same client: retries with
            backoff on 429/5xx and timeouts, a whole-reply deadline, a size cap; the key, default
            ``$OPENAI_API_KEY``, is never written to a record, an info or an error).
        instructions: the simulator's own system prompt; the task's ``private["user"]`` (text or
            JSON) follows it. Neither is ever shown to the agent.
        price: ``(per million prompt tokens, per million completion tokens)``: the episode's
            ``info["user"]["cost"]``; ``None`` leaves the cost unknown.
        max_reply_chars: a longer reply is cut to this many characters, with a marker saying so,
            before it enters the transcript: it is kept in ``episode.messages`` and sent back to
            the simulator's endpoint every turn (its reply may be megabytes: the size cap is
            ``ChatPolicy``'s, 64 MB). A stop token after the cut still ends the conversation.

    A request that fails past its retries, or a reply cut off before its end (``finish_reason``
    ``length``, at ``max_tokens``, or ``content_filter``), ends the episode with ``model_error``
    (:class:`UserFailure`): half a turn may have lost what the user meant to say, or its stop. So
    does a reply that holds a tool call (a simulated user has none), a refusal (its text in the
    outcome's detail) or nothing but reasoning: reasoning in the text (``<think>...</think>``, a
    model served without a reasoning parser) is never said, nor read for a stop token.
    """

    model: str = ""
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    instructions: str = LLM_USER_PROMPT
    temperature: float | None = None
    max_tokens: int | None = 512
    timeout: float = 60.0
    max_retries: int = 4
    extra_body: dict[str, Any] | None = None
    price: tuple[float, float] | None = None
    max_reply_chars: int = MAX_REPLY_CHARS
    is_async = True

    def __post_init__(self):
        from benchmax_gym.eval.policies import ChatPolicy, check_client_args

        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"LLMUser: model must name the served model, got {self.model!r}")
        # (each failed every episode, not the make: a TypeError, the SDK's or httpx's errors)
        check_client_args("LLMUser: ", base_url=self.base_url, api_key=self.api_key, temperature=self.temperature,
                          max_tokens=self.max_tokens, timeout=self.timeout, max_retries=self.max_retries,
                          extra_body=self.extra_body)
        if not isinstance(self.instructions, str):
            raise ValueError(f"LLMUser: instructions must be text (the simulator's system prompt), "
                             f"got {self.instructions!r:.80}")
        if self.price is not None and not (isinstance(self.price, (tuple, list)) and len(self.price) == 2
                                           and all(isinstance(p, (int, float)) and p >= 0 for p in self.price)):
            raise ValueError(f"LLMUser: price must be (prompt, completion) per million tokens, got {self.price!r}")
        positive_int("LLMUser: max_reply_chars", self.max_reply_chars)
        self._policy = ChatPolicy(model=self.model, base_url=self.base_url, api_key=self.api_key, native_tools=False,
                                  temperature=self.temperature, max_tokens=self.max_tokens, timeout=self.timeout,
                                  max_retries=self.max_retries, extra_body=self.extra_body)
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # one client per event loop

    def __getstate__(self):  # clients belong to a loop and a process: a worker makes its own
        state = dict(self.__dict__)
        state.pop("_clients", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._clients = weakref.WeakKeyDictionary()

    def describe(self) -> dict[str, Any]:
        return {"kind": "llm", "model": self.model, "base_url": self.base_url, "price": self.price}

    def messages(self, conversation: list[dict[str, str]], task: Any) -> list[dict[str, str]]:
        """The request: the instructions and the task's private part as the system prompt, then
        the conversation with the roles swapped (the simulator speaks as the assistant)."""
        private = getattr(task, "private", {}).get("user") if task is not None else None
        if private is not None and not isinstance(private, str):
            private = json.dumps(private, ensure_ascii=False, indent=1)
        system = self.instructions + (f"\n\n{private}" if private else "")
        swapped = {"user": "assistant", "assistant": "user"}
        return [{"role": "system", "content": system},
                *({"role": swapped[m["role"]], "content": m["content"]} for m in conversation)]

    async def areply(self, conversation, task, usage):
        import openai

        from benchmax_gym.eval.policies import PolicyError, _message, _reply_parts

        policy = self._policy
        loop = asyncio.get_running_loop()
        lease = self._clients.get(loop)
        if lease is None:
            lease = self._clients[loop] = _Lease(policy.client(aiohttp=False))
        body: dict[str, Any] = {"model": self.model, "messages": self.messages(conversation, task)}
        for key in ("temperature", "max_tokens"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        if usage.seed is not None:  # a seeded episode: one seed a request (a seed in extra_body wins)
            body["seed"] = derived_seed(usage.seed, usage.calls)
        body.update(self.extra_body or {})
        start = time.perf_counter()
        usage.calls += 1
        lease.busy += 1
        try:
            try:
                response = await lease.client.post("/chat/completions", body=body, cast_to=object)
            finally:
                await lease.leave()
            message, finish, counts = _reply_parts(response, policy.scrub)
        except openai.OpenAIError as exc:
            detail = _message(exc) if isinstance(exc, openai.APIStatusError) else str(exc.__cause__ or exc)
            raise UserFailure(policy.scrub(f"the user simulator's endpoint failed: {type(exc).__name__}: {detail}")) \
                from None
        except PolicyError as exc:
            raise UserFailure(policy.scrub(f"the user simulator's endpoint failed: {exc}")) from None
        except ValueError as exc:
            raise UserFailure(policy.scrub(f"the user simulator's reply is not valid JSON: {exc}")) from None
        finally:
            usage.seconds += time.perf_counter() - start
        prompt, completion = counts.get("prompt_tokens") or 0, counts.get("completion_tokens") or 0
        usage.prompt_tokens += prompt
        usage.completion_tokens += completion
        if self.price is not None:
            usage.cost = (usage.cost or 0.0) + (prompt * self.price[0] + completion * self.price[1]) / 1e6
        if message.get("tool_calls"):  # (it was offered none: what it meant to do would be lost)
            names = ", ".join(str(c.get("function", {}).get("name")) for c in message["tool_calls"])
            raise UserFailure(policy.scrub(f"the user simulator's reply holds a tool call ({names:.200}): "
                                           "a simulated user has no tools"))
        if finish in _CUT_OFF:  # half a turn: what it was about to say (or its stop token) never came
            raise UserFailure(f"the user simulator's reply was cut off (finish_reason {finish!r}"
                              + (f"; LLMUser(max_tokens={self.max_tokens}) may be too low)" if finish == "length" else ")"))
        content = message.get("content")
        # a reasoning model served without a reasoning parser thinks in the text: its thoughts (the
        # private facts, a stop token it only considered) are neither said nor read for a stop
        content = split_reasoning(content)[1] if isinstance(content, str) else content
        if not isinstance(content, str) or not content.strip():
            refusal = message.get("refusal")
            if isinstance(refusal, str) and refusal.strip():
                raise UserFailure(policy.scrub(f"the user simulator refused: {truncate(refusal, 500)}"))
            raise UserFailure("the user simulator's reply has no text")
        said, stop, _ = policy.scrub(content).partition(STOP)  # (what follows a stop token is never said)
        return truncate(said, self.max_reply_chars) + stop

    def reply(self, conversation, task, usage):
        async def once():
            try:
                return await self.areply(conversation, task, usage)
            finally:
                await self.aclose()  # the loop asyncio.run made ends here: its client with it

        return asyncio.run(once())

    async def aclose(self) -> None:
        """Close the running loop's client (a simulator shared by envs keeps the others'): at once,
        or, while another env's request on this loop still uses it, when the last such request
        ends (a vector worker's envs share its loop; one closing must not cut the others' off).
        The loop's next request opens a new client."""
        lease = self._clients.pop(asyncio.get_running_loop(), None)
        if lease is not None:
            lease.closing = True
            if not lease.busy:
                await lease.client.close()


class _Lease:
    """One loop's client and the requests using it: closed by the last of them once ``closing``."""

    __slots__ = ("client", "busy", "closing")

    def __init__(self, client: Any):
        self.client, self.busy, self.closing = client, 0, False

    async def leave(self) -> None:
        self.busy -= 1
        if self.closing and not self.busy:
            try:
                await self.client.close()
            except Exception:  # noqa: BLE001  (the reply is in hand; a close that fails loses nothing)
                log.debug("closing the user simulator's client failed", exc_info=True)


def hear(user: UserSimulator, episode: Any, run_coroutine: Callable[[Any], Any]) -> UserReply | UserFailure:
    """The user's answer to the reply just appended to ``episode.messages`` (``step``'s path:
    an async simulator runs through ``run_coroutine``); a failure is returned, never raised."""
    usage = episode.user
    usage.turns.add(len(episode.messages) - 1)  # the reply just made, addressed to the user
    try:
        talk = conversation(episode.messages, usage.turns)
        if user.is_async:
            said = run_coroutine(_before_deadline(user.areply(talk, episode.task, usage), episode))
        else:
            said = user.reply(talk, episode.task, usage)
        return user_reply(said, _cap_of(user))
    except Exception as exc:  # noqa: BLE001  (the simulator's failure is an outcome, never a raise)
        return _failed(exc)


async def ahear(user: UserSimulator, episode: Any) -> UserReply | UserFailure:
    """:func:`hear` for ``astep``."""
    usage = episode.user
    usage.turns.add(len(episode.messages) - 1)
    try:
        talk = conversation(episode.messages, usage.turns)
        reply = user.areply(talk, episode.task, usage)
        return user_reply(await (_before_deadline(reply, episode) if user.is_async else reply), _cap_of(user))
    except Exception as exc:  # noqa: BLE001
        return _failed(exc)


def _cap_of(user: UserSimulator) -> int:
    """The simulator's ``max_reply_chars``; the default when it set none that is a positive int."""
    cap = getattr(user, "max_reply_chars", MAX_REPLY_CHARS)
    return cap if type(cap) is int and cap > 0 else MAX_REPLY_CHARS


async def _before_deadline(reply: Any, episode: Any) -> Any:
    """An async simulator's answer, cut off at the episode's deadline (``episode_timeout``)."""
    if episode.deadline is None:
        return await reply
    try:
        return await asyncio.wait_for(reply, max(episode.deadline - time.monotonic(), 0.0))
    except asyncio.TimeoutError:
        raise UserFailure("the episode's time limit passed while the user answered", DEADLINE) from None


def _failed(exc: Exception) -> UserFailure:
    """A simulator's exception as an outcome: its own :class:`UserFailure`, or ``env_error`` for
    a bug in it (a scripted function that raised): the environment broke, not the model."""
    if isinstance(exc, UserFailure):
        return exc
    log.error("the user simulator raised", exc_info=exc)
    return UserFailure(f"{type(exc).__name__}: {exc}", ENV_ERROR)


_FINAL_RULE = re.compile(r"A (reply|message) (without[^.]*?|that is not a tool call) is your final\s+answer and ends the episode\.")


def addressed_to_user(instructions: str) -> str:
    """A tool format's instructions with its final-answer rule replaced by the user rule: a
    reply without a call goes to the user, who ends the conversation."""
    return _FINAL_RULE.sub(lambda m: f"A {m.group(1)} {m.group(2)} is sent to the user, who answers you; the "
                           "conversation ends when the user is done.", instructions)


def as_user(user: Any) -> UserSimulator | None:
    """``user=`` as a :class:`UserSimulator`: ``None``, a simulator, or a function (scripted)."""
    if user is None or isinstance(user, UserSimulator):
        return user
    if callable(user):
        return ScriptedUser(user)
    raise TypeError(f"user must be None, a UserSimulator or a function fn(conversation, task), got {user!r}")


__all__ = ["LLMUser", "MAX_REPLY_CHARS", "STOP", "ScriptedUser", "UserFailure", "UserReply", "UserSeeds",
           "UserSimulator", "UserUsage", "ahear", "as_user", "conversation", "derived_seed", "hear", "user_reply"]
