"""SkyRL: any benchmax-gym env as a ``skyrl_gym`` text env (``pip install 'benchmax-gym[skyrl]'``).

``import benchmax_gym.adapters.skyrl`` registers ``"benchmax"`` with ``skyrl_gym.register``.
SkyRL's generator makes a fresh env per trajectory, ``skyrl_gym.make("benchmax",
env_config=..., extras=row)``, possibly from worker threads, then calls ``init``, ``step`` until
done, ``get_metrics`` and ``close``. Set ``environment.env_class=benchmax`` and let the dataset
rows name everything else: ``env_id``, ``task_index`` and ``env_kwargs`` (JSON) are columns of
the rows :func:`task_rows` (``examples/make_dataset.py skyrl``) writes, so one dataset may mix
envs. SkyRL 0.4's typed config has no place for them: its ``environment.skyrl_gym`` section
takes only its own envs' fields and rejects ``skyrl_gym.benchmax`` (``Invalid fields``). A
``env_config`` with ``env_id`` / ``env_kwargs`` (a SkyRL build that passes one) is read as the
rows' defaults.

The env's opening messages replace the row's prompt (the env owns its system prompt and task
text); its reward components are in ``metadata`` and ``get_metrics()``. SkyRL's generator owns
the token loop (it renders the observations with the chat template and enforces its own
generation limits), so the token budget is SkyRL's there.

Per-turn rewards (a rubric's per-turn components, ``dense_rewards=True``; issue 30): each step's
``reward`` is the env's own step reward, which SkyRL's generator places on that turn's last token
(its per-step rewards); the final step's is the final reward (plus that step's per-turn value).
``get_metrics()["turn_reward"]`` is what the steps before the last paid.

Failed episodes (issue 29: a tool gone, a worker lost, a deadline): SkyRL's generator owns the
loss mask and the group advantages too, and a ``skyrl_gym`` step can return nothing but
``observations``, ``reward``, ``done`` and ``metadata``. So the env reports the failure and
leaves no fake score: the final step's reward is NaN (the env's own, never 0),
``metadata["outcome"]`` names it and ``metadata["failed"]`` is set; ``get_metrics()`` has
``env/outcome/<name>`` (1.0 for the episode's outcome), which :meth:`BenchmaxTextEnv.aggregate_metrics`
sums into a batch's counts. Keeping the sample out of the loss and the baseline is the trainer's
to do (skyrl-train's generator: not installed here, not done by this adapter). Policy: the
failed trajectory goes back with its NaN, so skyrl-train's group advantages turn NaN (loud, never
a fake 0); drop trajectories whose ``metadata["failed"]`` is set before the trainer's step.

SkyRL 0.4's generator closes an env only when its episode ends without an exception (no
``finally``): an env whose ``init`` or ``step`` raises would keep its MCP servers and sandboxes
until garbage collection. So the adapter closes the env itself there, before the exception goes
on, and when an episode ends failed; SkyRL's own ``close`` afterwards does nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from benchmax_gym.adapters.tokens import make_env, outcome_counts, task_dataset
from benchmax_gym.core import outcomes

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError:  # pragma: no cover - exercised by the missing-extra test in a bare venv
    raise ImportError("the SkyRL adapter needs skyrl-gym: pip install 'benchmax-gym[skyrl]'") from None

ENV_CLASS = "benchmax"

log = logging.getLogger(__name__)


def _get(config: Any, key: str, default: Any = None) -> Any:
    """A key of SkyRL's env_config (an OmegaConf DictConfig or a dict)."""
    if config is None:
        return default
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    if value is not None and type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    return value


class BenchmaxTextEnv(BaseTextEnv):
    """One benchmax-gym episode behind SkyRL's ``BaseTextEnv``."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = dict(extras or {})
        env_id = extras.get("env_id") or _get(env_config, "env_id")
        if not env_id:
            raise ValueError("env_id is missing: give the row an env_id column (examples/make_dataset.py skyrl writes it)")
        row_kwargs = extras.get("env_kwargs") or {}
        if isinstance(row_kwargs, str):  # parquet rows carry them as JSON
            row_kwargs = json.loads(row_kwargs)
        kwargs = {**(_get(env_config, "env_kwargs") or {}), **row_kwargs}
        if extras.get("max_turns") and "max_turns" not in kwargs:
            kwargs["max_turns"] = int(extras["max_turns"])  # SkyRL's generator sets extras["max_turns"]
        self.env = make_env(env_id, kwargs)
        self.max_turns = self.env.unwrapped.max_turns
        self.task_index = extras.get("task_index")
        self.seed = extras.get("seed")
        self.reward_components: dict[str, float] = {}
        self.turn_rewards: list[float] = []
        self.tool_errors = 0
        self.outcome: str | None = None
        self.member: str | None = None  # a mixture's member (benchmax/Mix-v0), once the episode ended
        self.reward = 0.0
        self._closed = False

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        options = {"task_index": int(self.task_index)} if self.task_index is not None else None
        try:
            _, info = self.env.reset(seed=self.seed, options=options)
            return self.env.unwrapped.chat_messages("hf"), {"tools": info["tools"], "task_id": info["task_id"]}
        except BaseException:
            self._release()
            raise

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        try:
            _, reward, terminated, truncated, info = self.env.step(action)
        except BaseException:
            self._release()
            raise
        self.turn_rewards.append(float(reward))
        done = terminated or truncated
        metadata = {"error": info.get("error"), "task_id": info.get("task_id")}
        if done:
            self.outcome = info.get("outcome")
            metadata.update(outcome=self.outcome, failed=outcomes.is_failure(self.outcome))
            self.reward_components = dict(info.get("reward_components", {}))
            self.member, self.reward = info.get("member"), float(reward)
            self.tool_errors = self.env.unwrapped.episode_record().get("tool_errors", 0)
            metadata["reward_components"] = self.reward_components
            if metadata["failed"]:
                self._release()
        observations = [] if done else [dict(m) for m in info["messages"]]
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward), done=done, metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        mine = self.outcome if self.outcome in outcomes.OUTCOMES else outcomes.SCORED
        member = {}
        if self.member and not outcomes.is_failure(self.outcome):  # a mixture's member, seen apart
            member = {f"env/{self.member}/reward": self.reward, f"env/{self.member}/turns": self.turns,
                      f"env/{self.member}/tool_errors": self.tool_errors}
        return {"turns": self.turns, "tool_errors": self.tool_errors, **member,
                "turn_reward": float(sum(self.turn_rewards[:-1])),
                **{f"reward/{k}": v for k, v in self.reward_components.items()},
                **{name: float(name == f"env/outcome/{mine}") for name in outcome_counts([])}}

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """skyrl_gym's means, except ``env/outcome/<name>``: a batch's counts."""
        from skyrl_gym.metrics import default_aggregate_metrics

        out = default_aggregate_metrics([{k: v for k, v in m.items() if not k.startswith("env/outcome/")}
                                         for m in metrics])
        return {**out, **outcome_counts(metrics)}

    def close(self) -> None:
        """Close the env, once (the adapter may have closed it already: see :meth:`_release`)."""
        if not self._closed:
            self._closed = True
            self.env.close()

    def _release(self) -> None:
        """Close the env now: its ``init`` or ``step`` raised, or its episode ended failed. SkyRL
        0.4's generator closes an env only after an episode that ends without an exception (no
        ``finally``), so an env whose step raises would keep its servers and sandboxes until
        garbage collection. A close that raises here is logged as a leak: the step's own error,
        or its failed episode, is what the caller gets."""
        try:
            self.close()
        except Exception as exc:
            log.warning("closing the env after its episode failed raised %s: %s (its resources may leak)",
                        type(exc).__name__, exc)


def task_rows(env_id: str, n: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
    """Dataset rows in SkyRL's format for ``env_id``: ``prompt``, ``env_class``, and the extras
    the env reads (``env_id``, ``task_index``, ``env_kwargs`` as JSON), so no config is needed."""
    rows = task_dataset(env_id, n, env_kwargs=env_kwargs).to_list()
    return [{"prompt": r["prompt"], "env_class": ENV_CLASS, "env_id": env_id, "task_index": r["task_index"],
             "env_kwargs": json.dumps(env_kwargs)} for r in rows]


def register(env_class: str = ENV_CLASS) -> None:
    """Register :class:`BenchmaxTextEnv` with ``skyrl_gym`` (done on import; idempotent)."""
    import skyrl_gym

    if env_class not in skyrl_gym.registry:
        skyrl_gym.register(id=env_class, entry_point=BenchmaxTextEnv)


register()
