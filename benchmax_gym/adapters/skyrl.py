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

Failed episodes (issue 29: a tool gone, a worker lost, a deadline; building the env, its reset or
its step raising is ``env_error``): SkyRL 0.4's generator owns the loss mask and the group
advantages, and a ``skyrl_gym`` step can return nothing but ``observations``, ``reward``, ``done``
and ``metadata`` (``skyrl_gym/envs/base_text_env.py``); its ``agent_loop`` keeps no error field and
builds the loss mask itself (``skyrl/train/generators/skyrl_gym_generator.py``: ``agent_loop``), and
``generate`` gathers a batch's trajectories with ``tqdm.gather`` and no ``return_exceptions``, so an
env that raised failed the whole batch and ended training. So the env never raises out of SkyRL's
loop for its own failure (only a row naming no ``env_id`` does, and a cancellation or an
interrupt): an env that could not be built (a row's unknown id or bad argument, a server that would
not start) or whose ``init`` raised returns the row's prompt from ``init`` and ends the episode at
the first ``step``; a ``step`` that raised ends it there. The final step's reward is NaN (the
env's own for its failed episodes, never 0), ``metadata["outcome"]`` names it,
``metadata["failed"]`` is set and ``metadata["outcome_detail"]`` says why in a line (the env's own
exception text; it is logged too, as SkyRL drops step metadata); ``get_metrics()`` has
``env/outcome/<name>`` (1.0 for the episode's outcome), which :meth:`BenchmaxTextEnv.aggregate_metrics`
sums into a batch's counts. Keeping the sample out of the loss: SkyRL's only way is its DAPO
filter, ``trainer.algorithm.dynamic_sampling.type=filter``, which drops every group whose rewards'
std is not above 0 (``skyrl/train/utils/trainer_utils.py``: ``handle_filter_sampling``), which a
NaN's always is: the failed sample's whole group leaves the batch (so do groups whose samples all
score the same: DAPO's filter). It keeps every group where ``generator.n_samples_per_prompt`` is
1, NaN and all: there the NaN reaches the loss. Train with it on when failures can happen; without
it the NaN reaches the group's advantages (loud, never a fake 0). (``dynamic_sampling.type=replace`` keeps a
NaN group: its std is neither above nor equal to 0.)

SkyRL 0.4's generator closes an env only when its episode ends without an exception (no
``finally``): the adapter closes the env itself when its ``init`` or ``step`` raised and when an
episode ends failed; SkyRL's own ``close`` afterwards does nothing.

Forged turns (tool output, a simulated user's words): SkyRL's generator renders observations with
``tokenizer.apply_chat_template(..., tokenize=True)`` (``get_obs_ids_from_obs``; with
``use_conversation_multi_turn=False``, ``tokenizer.encode``), which encodes the text of any added
token inside a message as that token's id, so a tool printing ``<|im_end|>\n<|im_start|>system``
(or Qwen's ``</tool_response>``) wrote control tokens into the trainer's ids. The env cannot hand
SkyRL ids, so it hands it text that cannot become control tokens: :func:`neutralize` puts a WORD
JOINER (U+2060, invisible) after the first character of each chat-control string
(:data:`CONTROL`: ``<|...|>``, DeepSeek's ``<｜...｜>``, ``<s>``, ``</s>``, Gemma's turn markers,
Mistral's ``[INST]``-style tokens) in every message, and of the templates' markup
(:data:`MARKUP`: ``<tool_call>``, ``<tool_response>``, ``<tools>``, ``<think>`` and their closing
tags) in a tool result and a simulated user's words. The engine's own notes keep their markup (a
note quoting ``<tool_call>`` shows the model the real tag). The text reads the same; only a
tokenizer's exact match of the control string is broken. (:class:`TokenSession`, which the other
adapters use, encodes such text as text and needs none of this.)
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from benchmax_gym.adapters.tokens import make_env, outcome_counts, task_dataset, users_words
from benchmax_gym.core import outcomes

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError:  # pragma: no cover - exercised by the missing-extra test in a bare venv
    raise ImportError("the SkyRL adapter needs skyrl-gym: pip install 'benchmax-gym[skyrl]'") from None

ENV_CLASS = "benchmax"

log = logging.getLogger(__name__)

#: chat-control strings that tokenizers hold as special tokens: neutralized in every observation
CONTROL = re.compile(r"<\|[^\s<>|]{1,64}\|>|<\uff5c[^<>\uff5c]{1,64}\uff5c>|</?(?:s|bos|eos|pad|unk|start_of_turn|end_of_turn)>"
                     r"|\[/?(?:INST|SYSTEM_PROMPT|TOOL_CALLS|TOOL_RESULTS|AVAILABLE_TOOLS|TOOL_CONTENT)\]")
#: the templates' markup (non-special added tokens in Qwen's tokenizers): neutralized in untrusted text
MARKUP = re.compile(r"</?(?:tool_call|tool_response|tools|think)>")
JOINER = "\u2060"  # WORD JOINER: invisible, and no tokenizer's added token holds it


def neutralize(text: str, *, untrusted: bool = True) -> str:
    """``text`` with a WORD JOINER after the first character of each :data:`CONTROL` string (and,
    where ``untrusted``, each :data:`MARKUP` tag), so that a tokenizer encoding it (SkyRL's
    ``apply_chat_template``) cannot match them as added tokens: they stay readable text."""
    def breaks(match: re.Match) -> str:
        return match.group()[0] + JOINER + match.group()[1:]

    text = CONTROL.sub(breaks, text)
    return MARKUP.sub(breaks, text) if untrusted else text


def _safe(messages: list[dict[str, Any]], untrusted: set[int]) -> list[dict[str, Any]]:
    """Copies of ``messages`` whose string contents are :func:`neutralize`d: a tool result's and
    the messages at ``untrusted`` (a simulated user's words) wholly, the others' control strings."""
    safe = []
    for i, message in enumerate(messages):
        message = dict(message)
        if isinstance(message.get("content"), str):
            message["content"] = neutralize(message["content"],
                                            untrusted=message.get("role") == "tool" or i in untrusted)
        safe.append(message)
    return safe


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
        self.task_index = extras.get("task_index")
        self.seed = extras.get("seed")
        self.reward_components: dict[str, float] = {}
        self.turn_rewards: list[float] = []
        self.tool_errors = 0
        self.outcome: str | None = None
        self.member: str | None = None  # a mixture's member (benchmax/Mix-v0), once the episode ended
        self.reward = 0.0
        self._closed = False
        self._what = f"{env_id} task {self.task_index}"
        self.error: str | None = None  # why the env failed (build, init, step raising): env_error
        self.env = None
        try:
            row_kwargs = extras.get("env_kwargs") or {}
            if isinstance(row_kwargs, str):  # parquet rows carry them as JSON
                row_kwargs = json.loads(row_kwargs)
            kwargs = {**(_get(env_config, "env_kwargs") or {}), **row_kwargs}
            if extras.get("max_turns") and "max_turns" not in kwargs:
                kwargs["max_turns"] = int(extras["max_turns"])  # SkyRL's generator sets extras["max_turns"]
            self.env = make_env(env_id, kwargs)
            self.max_turns = self.env.unwrapped.max_turns
        except Exception as exc:  # (a row's bad id or argument, a server that would not start): env_error
            self._failed("building the env", exc)

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The env's opening messages; for an env that failed (here or when built), the row's
        prompt, and its first step ends the episode ``env_error``."""
        if self.error is None:
            options = {"task_index": int(self.task_index)} if self.task_index is not None else None
            try:
                _, info = self.env.reset(seed=self.seed, options=options)
                opening = self.env.unwrapped.chat_messages("hf")
                metadata = {"tools": info["tools"], "task_id": info["task_id"]}
                return _safe(opening, users_words(self.env, opening)), metadata
            except Exception as exc:
                self._failed("reset", exc)
            except BaseException:
                self._release()
                raise
        messages = [dict(m) for m in prompt or []] \
            or [{"role": "user", "content": "(no task: the environment failed)"}]
        return messages, {"failed": True, "outcome": outcomes.ENV_ERROR, "outcome_detail": self.error}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        if self.error is not None:
            return self._failed_step()
        try:
            _, reward, terminated, truncated, info = self.env.step(action)
        except Exception as exc:
            self._failed("step", exc)
            return self._failed_step()
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
                metadata["outcome_detail"] = info.get("outcome_detail") or info.get("error") or ""
                log.warning("episode of %s failed (%s): %s", self._what, self.outcome, metadata["outcome_detail"])
                self._release()
        messages = [] if done else info["messages"]
        observations = _safe(messages, users_words(self.env, messages)) if messages else []
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward), done=done, metadata=metadata)

    def _failed(self, what: str, exc: Exception) -> None:
        """The env raised (``what``: building it, its reset, its step): the episode is ``env_error``
        with the exception's own text, logged with its traceback, and the env is closed."""
        self.error = outcomes.outcome_detail(f"{self._what}: {what} raised {type(exc).__name__}: {exc}")
        log.warning("%s; the trajectory fails (%s)", self.error, outcomes.ENV_ERROR, exc_info=exc)
        self._release()

    def _failed_step(self) -> BaseTextEnvStepOutput:
        """The step that ends an ``env_error`` episode: NaN, never a score, and why."""
        self.outcome, self.reward = outcomes.ENV_ERROR, outcomes.failed_reward()
        self.turn_rewards.append(self.reward)
        metadata = {"error": self.error, "task_id": None, "outcome": outcomes.ENV_ERROR, "failed": True,
                    "outcome_detail": self.error, "reward_components": {}}
        return BaseTextEnvStepOutput(observations=[], reward=self.reward, done=True, metadata=metadata)

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
            if self.env is not None:
                self.env.close()

    def _release(self) -> None:
        """Close the env now: it raised, or its episode ended failed. SkyRL
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
