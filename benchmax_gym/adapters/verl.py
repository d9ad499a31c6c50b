"""verl: any benchmax-gym env as a verl agent loop (``pip install 'benchmax-gym[verl]'``).

A dataset row names its env and task in ``extra_info`` (rows from :func:`task_rows` do):
``{"env_id": ..., "task_index": ..., "env_kwargs": {...}}``, with ``agent_name: benchmax``; rows
of one batch may name different envs. verl's agent-loop workers are fresh Ray processes that
import nothing of this package, so name the loop in verl's agent-loop config file
(``actor_rollout_ref.rollout.agent.agent_loop_config_path``, ``examples/verl_agent_loops.yaml``):
its ``_target_`` imports this module in each worker. An entry may also fix the env::

    - name: benchmax                 # rows name their env
      _target_: benchmax_gym.adapters.verl.BenchmaxAgentLoop
    - name: benchmax_math
      _target_: benchmax_gym.adapters.verl.BenchmaxAgentLoop
      env_id: benchmax/Math-v0
      env_kwargs: {max_turns: 4}

(``import benchmax_gym.adapters.verl`` also registers ``"benchmax"`` with verl's ``@register``,
in the process that imports it.)

Each trajectory plays one episode at the token level (:class:`TokenSession`): the model's ids
as the server returned them, env turns rendered by the chat template, one ``request_id`` per
trajectory (the server's prefix cache holds), the response within ``response_length`` by
:class:`TokenSession`'s budget rule (each request asks for what is left, at least 1; env ids
that would overflow end the episode truncated, graded as it stands). The prompt must fit
``rollout.prompt_length`` (``data.max_prompt_length``): a longer one raises naming it (verl's
own loops cut such a prompt from the left, which would cut the env's instructions, and a
wider one fails verl's batch). The env is built, reset and stepped in a thread, off the
worker's event loop that serves the other trajectories; a trajectory that ends, fails or is
cancelled closes its env (after the env call running in that thread returns).

The env's reward is the trajectory's ``reward_score``. verl's post-processing reads the keys of
``reward_extra_info`` from a batch's first sample and indexes every sample with them, so that
dict holds only keys every env has (``reward``, ``turns``, ``tool_errors``, ``truncated``: the
budget cut it); the
env's own components (they differ between envs) are in ``extra_fields["reward_components"]``.
``reward_extra_info`` also holds ``env/outcome/<name>`` (1.0 for the episode's outcome), so a
batch's sums are its outcome counts.

Failed episodes (issue 29: a tool gone, a worker lost, a deadline; a ``generate`` call that
raised or returned garbage is ``model_error``; building, resetting or stepping the env raising
is ``env_error``) never enter the loss. verl gathers a batch's trajectories without
``return_exceptions``, so one that raised would fail the whole batch: every failure comes back as
a trajectory, with an all-zero ``response_mask`` (no token
in the loss), ``reward_score`` NaN (``None`` would turn off the batch's ``rm_scores``) and, when
``rollout.calculate_log_probs`` asks for them, ``response_logprobs`` even if no reply came (zeros:
verl stacks them with the other trajectories'); ``extra_fields["outcome_detail"]`` says why, in a
line ("" for the others). An env that failed before its prompt existed gets the row's
``raw_prompt`` through the template (one token if that does not fit ``prompt_length``; never
empty, a row of the actor's batch that would attend to no token at all). A row's unknown env id
or bad argument is such a failure too (``env_error``, the error naming it), as in the OpenRLHF and
SkyRL adapters: raising it failed the batch of every other row. What still raises: a row naming
no env at all, a prompt over ``prompt_length``, and a wrong env or argument in the agent loop
config file (when verl builds the loop), which are the configuration's, not one row's. verl's
own GRPO would average that NaN into the group, so train with the estimators registered here
(``algorithm.adv_estimator=...``), verl's GRPO over each group's scored trajectories:

=======================  =====================================================================
``benchmax_grpo``        the group's mean and std over its scored trajectories (renormalised);
                         failed ones get advantage 0
``benchmax_grpo_drop``   a group with a failure is left out: every advantage 0
=======================  =====================================================================

Group rewards (:mod:`benchmax_gym.core.group`): an agent loop plays one trajectory and never
sees its ``rollout.n`` siblings; the group first meets in the advantage step, over scores.
:func:`register_group_estimator` registers an estimator that applies a reward-only
``GroupRubric`` (a rank, best-of-k) there, then GRPO as ``benchmax_grpo``. A group its rubric
fails (a function that raises, times out or returns no finite score: ``group_errors``; a
``RewardFailure``) is a failure, never a reward: its trajectories get advantage 0, and each
step's metrics (verl's ``compute_data_metrics``, which the estimator's registration extends in its
process) count them, ``benchmax/group_errors`` (trajectories) and ``benchmax/group_errors/groups``,
with a warning naming the errors. (verl hands an estimator tensors and ``uid`` only, and reads no
metrics from it: the counts wait for the step's metrics in the process that computes advantages.)

verl computes advantages in its TaskRunner, a Ray worker that imports nothing of this package,
so the estimators exist there only when verl imports this module itself: name it in verl's
``VERL_USE_EXTERNAL_MODULES`` (imported by every ``import verl``), set for every Ray worker
through the runtime env, as ``examples/verl_math.sh`` does::

    algorithm.adv_estimator=benchmax_grpo
    +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=benchmax_gym.adapters.verl

(verl's reward metrics, ``critic/score/*``, are means over the batch: NaN when it holds a
failure; ``env/outcome/*`` counts them.)

Per-turn rewards (a rubric's per-turn components, ``dense_rewards=True``; issue 30): ``reward_score``
is the episode's return (verl puts it on the response's last token), and
``extra_fields["turn_scores"]`` holds each turn's reward in order, where verl's own tool agent loop
puts its per-turn scores (:meth:`TokenEpisode.token_rewards` lays them on each turn's last token
for a reward manager that wants them per token). ``reward_extra_info["turn_reward"]`` is what the
turns before the last paid.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import sys
import weakref
from collections import defaultdict
from typing import Any
from uuid import uuid4

from benchmax_gym.adapters.tokens import ChatTemplate, TokenEpisode, TokenSession, amake_env, make_env, task_dataset
from benchmax_gym.core.checks import mapping
from benchmax_gym.core import outcomes

try:  # torch too: a base install has neither, and the extra brings both
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
    from verl.trainer.ppo.core_algos import register_adv_est
except ImportError as exc:  # pragma: no cover - exercised by the missing-extra test in a bare venv
    raise ImportError(f"the verl adapter needs verl: pip install 'benchmax-gym[verl]' ({exc})") from None

log = logging.getLogger(__name__)


# verl builds an agent loop per trajectory (AgentLoopWorker._run_agent_loop): what does not change
# between them is made once per process. A ChatTemplate took ~11 ms to build with a 1k-token vocabulary
# (its byte table grows with the vocabulary), and the config check built and closed a whole env.
_CHECKED: set[str] = set()  # the (env_id, env_kwargs) a loop was built with, once made and closed
_TEMPLATES: "weakref.WeakKeyDictionary[Any, dict[str, ChatTemplate]]" = weakref.WeakKeyDictionary()


def _check_once(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Make and close the env once per configuration and process: a wrong id or argument fails
    when verl builds the loop, as before, for every loop built with it (failures are not kept)."""
    try:
        key = json.dumps([env_id, env_kwargs], sort_keys=True)
    except (TypeError, ValueError):  # (arguments JSON cannot hold: checked every time)
        key = None
    if key is None or key not in _CHECKED:
        make_env(env_id, env_kwargs).close()
        if key is not None:
            _CHECKED.add(key)


def _chat_template(tokenizer: Any, template_kwargs: dict[str, Any]) -> ChatTemplate:
    """The process's :class:`ChatTemplate` for this tokenizer and these arguments, shared by every
    trajectory's loop (its rendered skeletons with them)."""
    key = json.dumps(template_kwargs, sort_keys=True, default=repr)
    try:
        made = _TEMPLATES.setdefault(tokenizer, {})
    except TypeError:  # (a tokenizer with no weak reference or hash)
        return ChatTemplate(tokenizer, **template_kwargs)
    if key not in made:
        made[key] = ChatTemplate(tokenizer, **template_kwargs)
    return made[key]


@register("benchmax")
class BenchmaxAgentLoop(AgentLoopBase):
    """One benchmax-gym episode per trajectory, token-exact."""

    def __init__(self, *args: Any, env_id: str | None = None, env_kwargs: dict[str, Any] | None = None,
                 **kwargs: Any):
        if env_kwargs is not None:  # (a list of pairs was taken as a dict)
            mapping("env_kwargs", env_kwargs)
        super().__init__(*args, **kwargs)
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        if env_id:
            _check_once(env_id, self.env_kwargs)  # a wrong id or argument fails when verl builds the loop
        self.chat = _chat_template(self.tokenizer, self.apply_chat_template_kwargs)
        self.response_length = self.rollout_config.response_length
        if isinstance(self.response_length, bool) or not isinstance(self.response_length, int) \
                or self.response_length < 1:
            raise ValueError(f"rollout.response_length (data.max_response_length) must be a positive int, "
                             f"got {self.response_length!r}")
        self.prompt_length = getattr(self.rollout_config, "prompt_length", None)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = dict(kwargs.get("extra_info") or {})
        env_id = extra.get("env_id") or self.env_id
        if not env_id:
            raise ValueError("env_id is missing: give it in the row's extra_info or the agent loop config")
        task = extra.get("task_index")
        options = {"task_index": int(task)} if task is not None else None
        try:
            env = await amake_env(env_id, {**self.env_kwargs, **(extra.get("env_kwargs") or {})})
        except Exception as exc:  # (a row's unknown id or bad argument, a server that would not start)
            return self._output(self._env_failed(kwargs, f"{env_id} task {task}: building the env", exc),
                                sampling_params)
        session = TokenSession(env, self.chat, max_tokens=self.response_length)
        request_id = uuid4().hex  # one per trajectory: every turn extends the same prefix
        try:
            try:
                await session.areset(options=options)
            except Exception as exc:
                return self._output(self._env_failed(kwargs, f"{env_id} task {task}: reset", exc), sampling_params)
            if self.prompt_length is not None and len(session.episode.prompt_ids) > self.prompt_length:
                # verl pads prompts to this width and would fail its batch (a torch.cat of prompts of
                # different widths) after every trajectory played; cutting it would lose the env's prompt
                raise ValueError(
                    f"{env_id} task {task}: its prompt is {len(session.episode.prompt_ids)} tokens, "
                    f"rollout.prompt_length is {self.prompt_length}: raise data.max_prompt_length, or set "
                    "data.filter_overlong_prompts=True to leave such rows out")
            while not session.done:
                params = dict(sampling_params)
                params["max_tokens"] = session.budget
                try:
                    output = await self.server_manager.generate(request_id=request_id, prompt_ids=session.input_ids,
                                                                sampling_params=params)
                except Exception as exc:  # the server failed this trajectory: model_error, out of the loss
                    session.fail(outcomes.MODEL_ERROR, f"generate raised {type(exc).__name__}: {exc}")
                    break
                try:
                    await session.astep(output.token_ids, output.log_probs or None)
                except Exception as exc:  # the env failed this trajectory: env_error, out of the loss
                    session.fail(outcomes.ENV_ERROR, f"{env_id} task {task}: step raised {type(exc).__name__}: {exc}")
                    break
        finally:  # (shielded: a second cancel must not drop the close)
            try:
                await asyncio.shield(asyncio.to_thread(session.close))
            except Exception as exc:  # the episode is played and graded: a close that fails leaks, said
                log.warning("closing the env of %s task %s raised %s: %s", env_id, task, type(exc).__name__, exc)
        return self._output(session.episode, sampling_params)

    def _env_failed(self, kwargs: dict[str, Any], what: str, exc: Exception) -> TokenEpisode:
        """The trajectory of an env that failed before its prompt existed: ``env_error``, no
        response. Its prompt is the row's (``raw_prompt``, the env's opening messages as
        :func:`task_rows` wrote them) through the template, or one token where that cannot be
        rendered within ``prompt_length``: never empty (a row of the batch attending to nothing)."""
        error = f"{what} raised {type(exc).__name__}: {exc}"
        log.warning("episode failed (%s): %s", outcomes.ENV_ERROR, error)
        prompt_ids: list[int] = []
        messages = kwargs.get("raw_prompt")
        if messages is not None and len(messages):
            try:
                prompt_ids = self.chat.prompt_ids([dict(m) for m in messages])
            except Exception:  # noqa: BLE001  (a row the template cannot render: the one-token prompt)
                prompt_ids = []
        if not prompt_ids or (self.prompt_length is not None and len(prompt_ids) > self.prompt_length):
            token = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
            prompt_ids = [token]
        return TokenEpisode(prompt_ids=prompt_ids, reward=None, truncated=True, outcome=outcomes.ENV_ERROR,
                            info={"outcome": outcomes.ENV_ERROR, "error": error})

    def _output(self, episode: TokenEpisode, sampling_params: dict[str, Any]) -> AgentLoopOutput:
        logprobs = episode.logprobs
        if logprobs is None and sampling_params.get("logprobs"):
            # no reply brought any (a generate that failed first, an empty reply): verl stacks every
            # trajectory's logprobs with the first's, so one None among lists failed the whole batch
            logprobs = [0.0] * len(episode.completion_ids)
        # why it failed, in a line: the env's own (a tool gone) or the adapter's (an exception)
        detail = (episode.info.get("outcome_detail") or episode.info.get("error") or "") if episode.failed else ""
        return AgentLoopOutput(
            prompt_ids=episode.prompt_ids,
            response_ids=episode.completion_ids,
            response_mask=episode.loss_mask,
            response_logprobs=logprobs,
            reward_score=math.nan if episode.failed else episode.reward,  # NaN: failed (benchmax_grpo)
            num_turns=1 + 2 * len(episode.turns),
            metrics={},
            extra_fields={"reward_extra_info": episode.metrics(components=False),
                          "reward_components": dict(episode.reward_components),
                          "turn_scores": list(episode.turn_rewards), "tool_rewards": [],
                          "outcome_detail": outcomes.outcome_detail(detail)},
        )


def _grpo_over_scored(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                      config: Any, drop: bool, epsilon: float = 1e-6,
                      scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_grpo_outcome_advantage`` with failed trajectories (a NaN score) out of
    their group's mean and std and given advantage 0; ``drop``: their whole group gets 0.
    ``scores``: the trajectories' scores, when not the sum of ``token_level_rewards``."""
    norm = True if config is None else config.get("norm_adv_by_std_in_grpo", True)
    scores = token_level_rewards.sum(dim=-1) if scores is None else scores
    failed = torch.isnan(scores)
    advantages = torch.zeros_like(scores)
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, key in enumerate(index):
        groups[key].append(i)
    with torch.no_grad():
        for members in groups.values():
            kept = [i for i in members if not failed[i]]
            if not kept or (drop and len(kept) < len(members)):
                continue
            group = scores[kept]
            mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(kept) == 1 else (group.mean(), group.std())
            advantages[kept] = (group - mean) / (std + epsilon) if norm else group - mean
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("benchmax_grpo")
def benchmax_grpo(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                  config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO over each group's scored trajectories: failures out of the baseline, advantage 0."""
    return _grpo_over_scored(token_level_rewards, response_mask, index, config, drop=False)


@register_adv_est("benchmax_grpo_drop")
def benchmax_grpo_drop(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                       config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO with every group that holds a failed trajectory left out (advantage 0)."""
    return _grpo_over_scored(token_level_rewards, response_mask, index, config, drop=True)


def register_group_estimator(name: str, group_rubric: Any, *, drop: bool = False) -> str:
    """Register ``name`` as a verl advantage estimator (``algorithm.adv_estimator=name``) that
    scores each ``rollout.n`` group (verl's ``uid``) with ``group_rubric`` and then runs GRPO over
    the group-scored rewards, failed trajectories out (as ``benchmax_grpo``; ``drop``: as
    ``benchmax_grpo_drop``). verl's agent loops play one trajectory each; the group first meets
    at the advantage step, which sees scores and ``uid`` only, so ``group_rubric``'s functions may
    ask for ``rewards`` alone (``relative_rank``, ``best_of_k``); one that reads transcripts is
    refused here. Register in the driver process (the one that runs the trainer). A group the rubric
    fails gets advantage 0, counted in the step's metrics as ``benchmax/group_errors`` (module docstring)."""
    from benchmax_gym.core.group import GroupRubric

    if not isinstance(group_rubric, GroupRubric):
        raise TypeError(f"group_rubric must be a GroupRubric, got {type(group_rubric).__name__}")
    readers = [f.name for f in group_rubric.funcs if set(f.params) - {"rewards"}]
    if readers:
        raise ValueError(f"group_rubric: verl's advantage step sees scores only, and {readers} read more than "
                         "rewards: score such groups with eval or TRL (see the README's Group rewards)")

    @register_adv_est(name)
    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                  config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from benchmax_gym.core.group import group_failed, score_groups

        raw = token_level_rewards.sum(dim=-1)
        keys = list(index) if index is not None else [0] * len(raw)
        records = [{"task_id": str(key), "reward": None if math.isnan(s) else s,
                    "outcome": "env_error" if math.isnan(s) else "scored"} for key, s in zip(keys, raw.tolist())]
        scored = score_groups(records, group_rubric)
        # a group its rubric failed is a failure (advantage 0), never the 0 its component scored
        failed = [i for i, (before, after) in enumerate(zip(records, scored))
                  if before["reward"] is not None and group_failed(after)]
        _report_group_errors(name, [keys[i] for i in failed],
                             {str(keys[i]): scored[i].get("group_errors") or scored[i].get("error") for i in failed})
        out = set(failed)
        scores = torch.tensor([math.nan if r["reward"] is None or i in out else r["reward"]
                               for i, r in enumerate(scored)], dtype=raw.dtype, device=raw.device)
        return _grpo_over_scored(token_level_rewards, response_mask, keys, config, drop, scores=scores)

    estimator.__name__ = name
    _count_in_step_metrics()
    return name


GROUP_ERRORS = "benchmax/group_errors"
"""The step metric: trajectories of the step whose group rubric failed (advantage 0); with
``/groups``, the groups."""
_PENDING: dict[str, float] = {}  # the last advantage step's counts, until verl computes that step's metrics


def _report_group_errors(name: str, failed_keys: list[Any], errors: dict[str, Any]) -> None:
    """Count this advantage step's failed groups for the step's metrics, and say why in a warning."""
    _PENDING.update({GROUP_ERRORS: float(len(failed_keys)), f"{GROUP_ERRORS}/groups": float(len(errors))})
    if errors:
        shown = "; ".join(f"uid {key}: {why}" for key, why in list(errors.items())[:5])
        log.warning("%s: the group rubric failed %d group(s), %d trajectories, given advantage 0: %s%s",
                    name, len(errors), len(failed_keys), shown, " ..." if len(errors) > 5 else "")


def _with_group_errors(compute_data_metrics: Any) -> Any:
    @functools.wraps(compute_data_metrics)
    def with_group_errors(*args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = compute_data_metrics(*args, **kwargs)
        metrics.update(_PENDING)
        _PENDING.clear()
        return metrics

    with_group_errors.benchmax_group_errors = True
    return with_group_errors


def _count_in_step_metrics() -> None:
    """Make verl's ``compute_data_metrics`` (its trainer's per-step metrics) carry the last advantage
    step's :data:`GROUP_ERRORS`: in ``metric_utils``, which ``ray_trainer`` imports it from, and in
    ``ray_trainer`` itself when that is imported already. Once per process."""
    from verl.trainer.ppo import metric_utils

    if not getattr(metric_utils.compute_data_metrics, "benchmax_group_errors", False):
        metric_utils.compute_data_metrics = _with_group_errors(metric_utils.compute_data_metrics)
    trainer = sys.modules.get("verl.trainer.ppo.ray_trainer")
    bound = getattr(trainer, "compute_data_metrics", None)
    if trainer is not None and not getattr(bound, "benchmax_group_errors", False):
        trainer.compute_data_metrics = metric_utils.compute_data_metrics


def task_rows(env_id: str, n: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
    """Rows for verl's RLHFDataset (parquet): ``prompt``, ``agent_name``, ``extra_info``."""
    rows = task_dataset(env_id, n, env_kwargs=env_kwargs).to_list()
    extra = {"env_kwargs": env_kwargs} if env_kwargs else {}  # (parquet cannot hold an empty struct)
    return [{"prompt": r["prompt"], "agent_name": "benchmax", "data_source": env_id,
             "extra_info": {"env_id": env_id, "task_index": r["task_index"], **extra}} for r in rows]
