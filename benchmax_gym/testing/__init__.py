"""Helpers for testing environments (yours too): play an episode, and real servers on loopback.

``play(env)`` runs one episode with the env's reference solver (or any policy) and returns what a
test asserts on. The servers speak real protocols on 127.0.0.1: :mod:`.mediawiki` (the MediaWiki
API, for Wikipedia-v0's live backend) and :mod:`.openai_server` (OpenAI chat completions, for eval).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

Policy = Callable[[str, dict[str, Any]], str]


@dataclass
class Played:
    """One finished episode: the final reward, how it ended, and every observation and info."""

    reward: float
    terminated: bool
    truncated: bool
    observations: list[str] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def info(self) -> dict[str, Any]:
        """The last step's info (``reward_components`` and the rest)."""
        return self.infos[-1]

    @property
    def transcript(self) -> str:
        """Every observation, joined: what the model saw."""
        return "\n".join(self.observations)


def play(env: gym.Env, policy: Policy | None = None, **reset_kwargs: Any) -> Played:
    """Reset ``env`` (``seed=``, ``options=``) and step ``policy(obs, info)`` to the end; the
    default policy is the env's reference solver."""
    episode = _episode(env.reset, env.step, policy or _reference_solver(env), reset_kwargs)
    try:
        episode.send(None)  # sync reset/step: nothing in it awaits
    except StopIteration as done:
        return done.value
    raise RuntimeError("a synchronous episode awaited")  # unreachable


async def aplay(env: gym.Env, policy: Policy | None = None, **reset_kwargs: Any) -> Played:
    """:func:`play` through the env's own ``areset``/``astep``."""
    base = env.unwrapped
    return await _episode(base.areset, base.astep, policy or _reference_solver(env), reset_kwargs)


def _reference_solver(env: gym.Env) -> Policy:
    """The env's reference solver, or an error that says what to pass instead."""
    try:
        return env.unwrapped.reference_solver()
    except NotImplementedError as exc:
        name = env.spec.id if env.spec else type(env.unwrapped).__name__
        raise NotImplementedError(f"{exc}; pass a policy, play(env, policy), or give {name} one "
                                  "with register_tool_env(..., solver=...)") from None


async def _episode(reset: Callable, step: Callable, act: Policy, reset_kwargs: dict[str, Any]) -> Played:
    """The one loop of :func:`play` and :func:`aplay` (``reset``/``step`` sync or async)."""
    obs, info = await _value(reset(**reset_kwargs))
    played = Played(0.0, False, False, [obs], [info])
    while not (played.terminated or played.truncated):
        obs, played.reward, played.terminated, played.truncated, info = await _value(step(act(obs, info)))
        played.observations.append(obs)
        played.infos.append(info)
    return played


async def _value(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


__all__ = ["Played", "aplay", "play"]
