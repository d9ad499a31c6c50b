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


class RecordEpisodes(gym.Wrapper):
    """Append one JSON object per finished episode to ``path``.

    Each line holds ``env_id``, ``seed``, the episode's record (``task_id``, ``task_index``, ``messages`` (the whole OpenAI-style
    transcript, assistant turns included), ``actions`` (the model's raw text of each turn,
    reasoning and malformed calls included), ``turns``, ``tool_errors``: see
    :meth:`~benchmax_gym.core.env.ToolEnv.episode_record`), ``reward``, ``reward_components``,
    ``terminated``, ``truncated`` and ``errors`` (every step's error codes, parse errors included).
    The ground truth is not written.
    """

    def __init__(self, env: gym.Env, path: str | os.PathLike):
        super().__init__(env)
        self.path = os.fspath(path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        self._seed = seed
        self._errors: list[str] = []
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = super().step(action)
        self._errors += info.get("errors") or []
        if terminated or truncated:
            record = {
                "env_id": self.spec.id if self.spec else None,
                "seed": self._seed,
                **self.env.unwrapped.episode_record(),
                "reward": reward,
                "reward_components": info.get("reward_components", {}),
                "terminated": terminated,
                "truncated": truncated,
                "errors": self._errors,
            }
            self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            self._file.flush()
        return obs, reward, terminated, truncated, info

    def close(self):
        if not self._file.closed:
            self._file.close()
        super().close()
