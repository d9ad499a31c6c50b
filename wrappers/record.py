"""Write each finished episode (transcript, reward, components) to a JSON Lines file.

Example::

    env = RecordEpisodes(gym.make("benchmax/Math-v0"), "episodes.jsonl")
"""

from __future__ import annotations

import json
import os
from typing import Any

import gymnasium as gym

from benchmax_gym.core.env import ResetResult, StepResult
from benchmax_gym.core.outcomes import CANCELLED, is_failure


class RecordEpisodes(gym.Wrapper):
    """Append one JSON object per finished episode to ``path``.

    Each line holds ``env_id``, ``seed``, the episode's record (``task_id``, ``task_index``, ``messages`` (the whole OpenAI-style
    transcript, assistant turns included), ``actions`` (the model's raw text of each turn,
    reasoning and malformed calls included), ``turns``, ``tool_errors``: see
    :meth:`~benchmax_gym.core.env.ToolEnv.episode_record`), ``reward``, ``reward_components``,
    ``terminated``, ``truncated`` and ``errors`` (every step's error codes, parse errors included).
    The ground truth is not written. Every line has the episode's ``outcome``: a failed episode's
    ``reward`` is ``null`` (never its step's NaN, which is not JSON), and an episode abandoned
    after its first step (reset or closed before it ended) is written as ``cancelled``.
    """

    def __init__(self, env: gym.Env, path: str | os.PathLike):
        super().__init__(env)
        self.path = os.fspath(path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._seed: int | None = None
        self._in_flight = False  # stepped and not ended

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        self._abandon()
        self._seed = seed
        self._errors: list[str] = []
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = super().step(action)
        self._errors += info.get("errors") or []
        self._in_flight = not (terminated or truncated)
        if terminated or truncated:
            failed = is_failure(info.get("outcome"))
            self._write(None if failed else reward, info.get("reward_components", {}), terminated, truncated)
        return obs, reward, terminated, truncated, info

    def _abandon(self) -> None:
        """An episode stopped from outside mid-way: written as ``cancelled``, without a reward."""
        if self._in_flight and not self._file.closed:
            self._in_flight = False
            self._write(None, {}, False, False, outcome=CANCELLED)

    def _write(self, reward, components, terminated, truncated, **extra) -> None:
        record = {
            "env_id": self.spec.id if self.spec else None,
            "seed": self._seed,
            **self.env.unwrapped.episode_record(),
            "reward": reward,
            "reward_components": components,
            "terminated": terminated,
            "truncated": truncated,
            "errors": self._errors,
            **extra,
        }
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()

    def close(self):
        self._abandon()
        if not self._file.closed:
            self._file.close()
        super().close()
