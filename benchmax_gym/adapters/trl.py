"""TRL: train any benchmax-gym env with ``GRPOTrainer`` (``pip install 'benchmax-gym[trl]'``).

Two ways, as TRL offers them:

* :class:`TRLRollout`, a ``rollout_func``: benchmax-gym plays whole multi-turn episodes at the token
  level (:class:`~benchmax_gym.adapters.tokens.TokenSession`), generating with the trainer's own
  backend (vLLM when ``use_vllm``, else ``transformers``), and returns ``prompt_ids``,
  ``completion_ids``, ``logprobs``, ``env_mask`` (1 for model tokens) and the env's reward::

      rollout = TRLRollout("benchmax/Math-v0", tokenizer)
      trainer = GRPOTrainer(model, reward_funcs=rollout.reward, train_dataset=rollout.dataset(),
                            rollout_func=rollout, processing_class=tokenizer, args=GRPOConfig(...))

* :func:`trl_environment`, an ``environment_factory``: TRL runs the loop and calls the env's tools
  as methods (typed, documented), the task comes from the dataset row (``task_index``), and
  ``Env.reward`` (the reward function) grades the episode. The model ends an episode as the
  env's prompt says, with a reply without a tool call, or by calling ``final_answer``::

      Env = trl_environment("benchmax/Math-v0")
      trainer = GRPOTrainer(model, environment_factory=Env, reward_funcs=Env.reward,
                            train_dataset=Env.dataset(), ...)

  The class has no ``get_reward``: TRL calls that without the completion, so the reply that ends
  the episode (the answer, when the model follows the prompt) would never reach the env.
  ``Env.reward`` gets TRL's ``completions`` and ``environments``, steps each unfinished env with
  its completion's last reply, and returns the env's reward. In an env with a simulated user
  (CRM-Service-v0) the class also has ``message_user(message)``, a tool that sends the model's
  words to the user and returns their answer (TRL ends the loop at a reply without a call, so the
  conversation goes through a tool here); the user ending the conversation ends the episode.

The token budget (``max_completion_length``) follows the one rule of
:class:`~benchmax_gym.adapters.tokens.TokenSession`: each turn asks the backend for what is left
(sessions with the same budget generate together), env ids that would overflow end the episode
truncated and graded as it stands.

The env's reward components go into the trainer's logged metrics as ``env/<component>``, and
each batch's outcome counts as ``env/outcome/<name>``.

Per-turn rewards (a rubric's per-turn components, ``dense_rewards=True``; issue 30): GRPO scores a
whole completion, so the reward is the episode's return (every turn's reward summed), and
``env/turn_reward`` logs what the turns before the last paid. :class:`TRLRollout` also returns
``turn_rewards`` (each turn's reward, in turn order), which TRL hands to every reward function as
a keyword argument: a reward function of your own may weigh the turns as it likes.

Failed episodes (issue 29: a tool gone, a worker lost, a deadline; never the model's mistakes)
never enter the loss; nor do episodes whose generation failed (``model_error``: ``generate``
raised, or returned what are not token ids of the tokenizer). GRPOTrainer needs every sample of a group back, so a failed one is kept:
its reward is ``None`` (TRL reads it as NaN: "unscorable", left out of the group's nanmean and
nanstd, advantage 0) and its ``env_mask`` is all zero (no token in the loss). ``failed_group``
(:class:`TRLRollout`) says what happens to the rest of its group:

================  ===========================================================================
``renormalise``   (default) the group's baseline and std are over its scored samples only
``drop``          the whole group is left out: every reward ``None``, every mask zero
================  ===========================================================================

A group is what GRPOTrainer normalises over: ``num_generations`` consecutive samples of the batch
it gathers from every process (process 0's prompts, then process 1's, ...), one prompt's. Its
sampler spreads a group over processes (2 samples a prompt, 3 a process: ``[a, a, b]`` and
``[b, c, c]``), so on several processes ``failed_group`` and the group rubric gather what they
need from every process (``accelerate``'s ``gather_object``) and decide on the whole group, the
same on each; each process applies the decision to its own samples.

A group rubric that fails its group (raises, times out, or gives no finite score) makes each
member's reward ``None`` as a failed episode's, and each batch's logged ``env/group_errors``
counts such samples (0 on a clean batch), from ``rollout_func`` and ``Env.reward`` alike.

With ``environment_factory`` TRL owns the loop and the mask: ``Env.reward`` gives a failed
episode ``None`` (out of the baseline, advantage 0). TRL calls ``Env.reward`` on each process's
own samples; its group rubric gathers a split group's members the same way (its groups: runs of
``num_generations``, read from the trainer TRL's ``log_metric`` keyword is bound to).

Other reward functions beside the env's (your own functions, reward models) score a failed
episode's row too, and TRL sums the columns: it leaves a row out only when every column is NaN.
So before TRL gathers the rewards, every column of a failed episode's row is made NaN: your
plain functions are still called on the whole batch (its rows come batched) and their values for
those rows replaced by None; reward models (``nn.Module``) run on the whole batch (their forward
may be collective) and their scores for those rows are NaN. The row is left out of its group's
baseline and std, its advantage is 0, and the logged ``reward`` and ``rewards/<name>/mean`` are
over the other rows. A failed row: with ``environment_factory``, an env whose episode ended with
a failure outcome or that its class's ``Env.reward`` gave ``None`` (its group rubric failing its
group too); ``Env.reward`` is called before the other reward functions where there are others,
so an episode failing as it is graded is known (pass ``Env.reward`` itself: one called inside a
function of yours is not). With :class:`TRLRollout`, a sample whose ``env_reward`` is ``None``
(failed, or its group dropped); your functions get ``env_reward`` as a keyword too.

On several processes an exception on one process outside generation (its env's ``reset`` or
``step`` raising, a tokenizer error, ``Env.reward`` grading with a group rubric) would leave the
others waiting at their next gather until the backend's timeout. Instead the failing process
makes that gather carrying its error, and every process raises :class:`ProcessFailed` there,
naming the process and its exception (on the failing process, raised from it). A failure the env
reports as an episode's outcome stays a failed episode, as above. A reward function (yours, passed
with the env's, or the env's own) raising on one process does the same: its exception rides the
gather of rewards TRL makes after them (:func:`_rewards_together`; with ``environment_factory``
from the trainer's first batch on: the env's ``reset`` finds the trainer resetting it); so do
rewards that TRL's own checks after a reward function would refuse on one process (a wrong count,
a value torch cannot convert to a float). With ``environment_factory`` TRL itself resets each env
and calls its tools; an env raising there on one process (its ``reset``; a tool call's ``step``,
whose exception TRL would show the model as the tool's result) ends its episode failed and keeps
the error, that process's reward functions are not called (its reward models, ``nn.Module``
reward functions, run, their forward may be collective, and their scores are dropped; an
``Env.reward`` with a group rubric makes the group gathers the other processes make, its samples
all failed), and the error rides the same gather, naming the env's class and call
(``CalcTRLEnvironment.reset``), the error starting "GRPOTrainer's environments". On one process
a reset's is raised where it happens, and a tool call's when TRL scores the batch, before any
reward function (TRL would show it to the model as the tool's answer, and train on the episode; a
reward model would score it).
A value that cannot be pickled for a gather (in a record of your env, a score of your rubric) is its process's failure
too, named in the error (its path in what was sent).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import itertools
import json
import logging
import math
import pickle
import struct
import threading
import types
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from benchmax_gym.adapters.tokens import (
    TASK_KEY,
    ChatTemplate,
    TokenSession,
    check_chat_kwargs,
    make_env,
    outcome_counts,
    task_dataset,
)
from benchmax_gym.core import outcomes
from benchmax_gym.core.checks import mapping
from benchmax_gym.core.group import GroupRubric, group_failed, group_rubric_of

FAILED_GROUP = ("renormalise", "drop")
#: samples a batch's group rubric failed (raised, timed out, no finite score: reward None), logged
#: each batch a group rubric grades (0 on a clean one): such a sample is out of the loss, not 0
GROUP_ERRORS = "env/group_errors"

log = logging.getLogger(__name__)


def _require_trl() -> None:
    try:
        import trl  # noqa: F401
    except ImportError:
        raise ImportError("the TRL adapter needs TRL: pip install 'benchmax-gym[trl]'") from None


class TRLRollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that plays multi-turn episodes of ``env_id``.

    Args:
        env_id: any registered id (built-in or yours); rows of other envs (their
            :meth:`dataset`, concatenated) play their own env in the same batch.
        tokenizer: the model's tokenizer (checked here: a chat template that can render tool
            results is required).
        env_kwargs: ``gym.make`` arguments.
        chat_kwargs: :class:`ChatTemplate` options (``tool_role``, template variables).
        max_workers: threads stepping envs (tools that wait on I/O overlap).
        generate: ``generate(trainer, sessions) -> (ids, logprobs)``, one reply per session
            (its ``input_ids`` so far, at most its ``budget`` ids: the sessions of one call
            share it), to generate with another backend, called on each process on its own;
            the default is the trainer's own (:func:`generate_turn`), which on several processes
            is called in lock-step (:meth:`_lockstep`: its vLLM server mode, ZeRO-3 and FSDP
            are collective calls).
        failed_group: ``"renormalise"`` (default) or ``"drop"``: the group of a failed episode
            (a group: a prompt's ``num_generations`` samples, a run of GRPOTrainer's batch, on
            however many processes they are; see :class:`_Groups`).
        group_rubric: a :class:`~benchmax_gym.core.group.GroupRubric` over each group's
            ``num_generations`` episodes (default: the env's own, if any), all of them, on
            whichever processes; its rewards are ``env_reward``. A group that cannot be scored
            (its judge down) fails whole.
    """

    def __init__(self, env_id: str, tokenizer: Any, *, env_kwargs: dict[str, Any] | None = None,
                 chat_kwargs: dict[str, Any] | None = None, max_workers: int = 16, generate: Any = None,
                 failed_group: str = "renormalise", group_rubric: GroupRubric | None = None):
        _require_trl()
        if group_rubric is not None and not isinstance(group_rubric, GroupRubric):
            raise TypeError(f"group_rubric must be a GroupRubric, got {type(group_rubric).__name__}")
        self.group_rubric = group_rubric
        if failed_group not in FAILED_GROUP:
            raise ValueError(f"failed_group must be one of {FAILED_GROUP}, got {failed_group!r}")
        self.failed_group = failed_group
        if env_kwargs is not None:  # (a list of pairs was taken as a dict)
            mapping("env_kwargs", env_kwargs)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        make_env(env_id, self.env_kwargs).close()  # a wrong id or argument fails here, not mid-training
        self.chat = ChatTemplate(tokenizer, **check_chat_kwargs("chat_kwargs", chat_kwargs or {}))
        self._own_backend = generate is None  # the trainer's generation: in lock-step on several processes
        self.generate = generate or (lambda trainer, sessions: generate_turn(
            trainer, [s.input_ids for s in sessions], sessions[0].budget))
        self._sessions: dict[str, list[TokenSession]] = {}  # per env (its id and kwargs, as JSON)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="benchmax-trl")
        self.__name__ = "benchmax_rollout"

    def dataset(self, n: int | None = None) -> Any:
        """Rows for ``train_dataset``: the env's prompts, each marked with its task."""
        return task_dataset(self.env_id, n, env_kwargs=self.env_kwargs, mark_task=True)

    @staticmethod
    def reward(completions: list[Any], env_reward: list[float] | None = None, **kwargs: Any) -> list[float]:
        """The reward function to pass as ``reward_funcs``: the env's verified reward."""
        if env_reward is None:
            raise ValueError("env_reward is missing: use TRLRollout as the trainer's rollout_func")
        return [None if r is None else float(r) for r in env_reward]  # None: failed, TRL's "unscorable"

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        groups = _Groups.of(trainer, prompts)  # (raises, if it does, on every process alike)
        _rewards_together(trainer)
        with groups.together("TRLRollout"):
            return self._rollout(prompts, trainer, groups)

    def _rollout(self, prompts: list[Any], trainer: Any, groups: _Groups) -> dict[str, Any]:
        tasks = [_task_of(p) for p in prompts]
        budget = getattr(trainer, "max_completion_length", None) or getattr(trainer.args, "max_completion_length", None)
        sessions, used = [], {}
        for env, _ in tasks:  # reuse each env's sessions from batch to batch
            pool = self._sessions.setdefault(env, [])
            used[env] = used.get(env, 0) + 1
            if len(pool) < used[env]:
                spec = json.loads(env)
                pool.append(TokenSession(make_env(spec["env_id"], spec["env_kwargs"]), self.chat))
            sessions.append(pool[used[env] - 1])
        for session in sessions:
            session.max_tokens = budget
        tasks = [index for _, index in tasks]
        list(self._pool.map(lambda st: st[0].reset(options={"task_index": st[1]}), zip(sessions, tasks)))
        if groups.world > 1 and self._own_backend:
            self._lockstep(trainer, sessions, groups)
        while active := sorted((s for s in sessions if not s.done), key=lambda s: s.budget or 0):
            for _, group in itertools.groupby(active, key=lambda s: s.budget):  # each asks for what it has left
                self._turn(trainer, list(group))
        episodes = [s.episode for s in sessions]
        self._log(trainer, episodes)
        have_logprobs = all(e.logprobs is not None for e in episodes)
        masks, rewards = [e.loss_mask for e in episodes], [e.reward for e in episodes]
        group_errors = self._score_groups(groups, sessions, episodes, masks, rewards)
        if group_errors is not None and getattr(trainer, "_metrics", None) is not None:
            mode = "train" if getattr(trainer.model, "training", True) else "eval"
            trainer._metrics[mode][GROUP_ERRORS].append(group_errors)  # (0 on a clean batch)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes] if have_logprobs else None,
            "env_mask": masks,
            "env_reward": rewards,
            "turn_rewards": [list(e.turn_rewards) for e in episodes],  # reaches reward functions as a kwarg
        }

    def _turn(self, trainer: Any, group: list[TokenSession], lockstep: tuple[int, int | None] | None = None) -> None:
        """One reply for each session of ``group``, generated in one call, and its step. With
        ``lockstep`` ``(padding, budget)``: the trainer's generation, the call carrying
        ``padding`` more one-token prompts (their replies dropped) and asking for at most
        ``budget`` ids (a session's own budget cuts its reply in ``step``, where a call asking
        for that budget would have stopped it)."""
        try:
            if lockstep is not None:
                padding, budget = lockstep
                dummy = [self.chat.tokenizer.eos_token_id or 0]
                ids, logprobs = generate_turn(trainer, [s.input_ids for s in group] + [dummy] * padding, budget)
                ids, logprobs = ids[:len(group)], logprobs[:len(group)]
            else:
                ids, logprobs = self.generate(trainer, group)
            if len(ids) != len(group) or len(logprobs) != len(group):
                raise ValueError(f"{len(ids)} replies and {len(logprobs)} logprobs for {len(group)} sequences")
        except Exception as exc:  # the backend failed these episodes: model_error, never a reward
            for session in group:
                session.fail(outcomes.MODEL_ERROR, f"generate raised {type(exc).__name__}: {exc}")
            return
        list(self._pool.map(lambda a: a[0].step(*a[1:]), zip(group, ids, logprobs)))

    def _lockstep(self, trainer: Any, sessions: list[TokenSession], groups: _Groups) -> None:
        """Every process's turns, with the trainer's generation on several processes: each round
        every process calls it once, with as many prompts as the process with the most
        unfinished episodes (the rest padding), asking for the largest budget left, until no
        process has one. Its backends are collective (vLLM's server mode gathers every process's
        prompts and hands each the slice at ``process_index * len(prompts)``; DeepSpeed ZeRO-3
        and FSDP gather the weights): a process calling it more often, or with fewer prompts,
        than another would wait forever or take another process's replies. The round's plan is
        decided from gathered data only, the same on every process."""
        while True:
            active = [s for s in sessions if not s.done]
            budgets = [s.budget for s in active]
            plan = groups.gather((len(active), None if None in budgets else max(budgets, default=1)))
            most = max(n for n, _ in plan)
            if most == 0:
                return
            wanted = [b for n, b in plan if n]
            self._turn(trainer, active, lockstep=(most - len(active), None if None in wanted else max(wanted)))

    def _score_groups(self, groups: _Groups, sessions: list[TokenSession], episodes: list[Any],
                      masks: list[list[int]], rewards: list[float | None]) -> int | None:
        """The group rubric and ``failed_group``, each over a whole group (:meth:`_Groups.score`:
        on whichever processes it is), in place on this process's ``masks`` and ``rewards``; how
        many of this process's samples their group rubric failed (None: no group rubric)."""
        def record(i: int) -> dict[str, Any]:
            e = episodes[i]
            return {**e.record, "reward": e.reward, "outcome": e.outcome,
                    "reward_components": dict(e.reward_components)}

        rubrics = [self.group_rubric or group_rubric_of(s.env) for s in sessions]
        verdicts = groups.score(
            "TRLRollout", labels=[None] * len(sessions),  # a group: one of the layout's, whole
            failed=[bool(e.failed or r is None) for e, r in zip(episodes, rewards)],
            rubrics=rubrics, record=record,
            task=lambda i: getattr(sessions[i].env.unwrapped.episode, "task", None))
        for i, (score, lost) in enumerate(verdicts):
            if score is not None:
                rewards[i] = None if score[1] else score[0]
            if (score is not None and score[1]) or (lost and self.failed_group == "drop"):
                masks[i], rewards[i] = [0] * len(masks[i]), None
        return sum(bool(score and score[1]) for score, _ in verdicts) if any(rubrics) else None

    @staticmethod
    def _log(trainer: Any, episodes: list[Any]) -> None:
        """The env's reward components, turns and tool errors (means over the scored episodes),
        and the batch's outcome counts, in the trainer's logged metrics."""
        metrics = getattr(trainer, "_metrics", None)
        if metrics is None:
            return
        mode = "train" if getattr(trainer.model, "training", True) else "eval"
        scored = [e.metrics() for e in episodes if not e.failed]
        for name in sorted({k for m in scored for k in m if not k.startswith("env/outcome/")}):
            values = [m[name] for m in scored if name in m]
            metrics[mode][f"env/{name}"].append(sum(values) / len(values))
        for name, count in outcome_counts(episodes).items():
            metrics[mode][name].append(count)

    def close(self) -> None:
        for pool in self._sessions.values():
            for session in pool:
                session.close()
        self._sessions.clear()
        self._pool.shutdown(wait=False)


class _Groups:
    """Which group each of this process's samples is in, as GRPOTrainer forms its groups: it
    gathers every process's batch in process order (process 0's samples, then process 1's, ...;
    each process gets as many) and normalises each run of ``num_generations`` samples
    (``num_generations_eval`` in eval) of that order, the run its sampler fills with one prompt.
    A group is its run's number: a sample's global position (``process_index * len(prompts)`` plus
    its place here) over ``num_generations``, so two groups of the same prompt text stay apart.

    A trainer without ``num_generations`` (a call from your own code), or a batch its groups do
    not fill or that puts other prompts in one, on one process: a group is a run of the same
    prompt, as before. On several processes a batch its groups do not fill is an error: the groups
    could not be told apart across them."""

    def __init__(self, keys: list[int], start: int, rank: int, world: int, size: int, n: int | None):
        self.keys, self.start, self.rank, self.world, self.size, self.n = keys, start, rank, world, size, n
        self.who = "TRLRollout"  # (named by together)
        self.finished = False  # no gather left: every process is past its last, or raised at it

    @classmethod
    def of(cls, trainer: Any, prompts: list[Any]) -> _Groups:
        accelerator = getattr(trainer, "accelerator", None)
        world = int(getattr(accelerator, "num_processes", 1) or 1)
        rank = int(getattr(accelerator, "process_index", 0) or 0) if world > 1 else 0
        training = getattr(getattr(trainer, "model", None), "training", True)
        n = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
        if not training and n is None:
            n = getattr(trainer, "num_generations", None)
        size, start = len(prompts), rank * len(prompts)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0 and (size * world) % n == 0:
            keys = [(start + i) // n for i in range(size)]
            texts = [json.dumps(p) for p in prompts]
            if world > 1 or all(texts[i] == texts[i - 1] for i in range(1, size) if keys[i] == keys[i - 1]):
                return cls(keys, start, rank, world, size, n)
        if world > 1:
            raise ValueError(f"TRLRollout on {world} processes needs the trainer's num_generations (got {n!r}) "
                             f"to divide the batch ({size} prompts a process)")
        runs = itertools.groupby(range(size), key=lambda i: json.dumps(prompts[i]))
        keys = [key for key, (_, run) in enumerate(runs) for _ in run]
        return cls(keys, 0, 0, 1, size, None)

    @classmethod
    def for_reward(cls, trainer: Any, tasks: list[Any]) -> _Groups:
        """The groups of a reward function's samples (``tasks``: each one's task): GRPOTrainer's,
        as :meth:`of` forms them, given the trainer; else (``n`` None) on one process runs of one
        task, and on several processes (``torch.distributed`` initialized: accelerate's
        ``PartialState``) keys the caller forms from the gathered order."""
        if trainer is not None and getattr(trainer, "accelerator", None) is not None \
                and getattr(trainer, "num_generations", None) is not None:
            return cls.of(trainer, tasks)
        world, rank = 1, 0
        with contextlib.suppress(ImportError):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                from accelerate import PartialState

                state = PartialState()
                world, rank = int(state.num_processes), int(state.process_index)
        if world == 1:
            return cls.of(None, tasks)
        return cls([], rank * len(tasks), rank, world, len(tasks), None)

    def owner(self, key: int) -> int:
        """The process holding the group's first sample: it scores the group's rubric."""
        return (key * self.n) // self.size  # (asked only when n is known)

    def gather(self, obj: Any, failure: str | None = None, kept: str | None = None) -> list[Any]:
        """``obj`` from every process, in process order (``gather_object``: a collective call
        every process makes); ``[obj]`` on one process, with no call. Each process's
        ``failure`` (see :meth:`together`) travels with it: if any process sent one, every
        process raises :class:`ProcessFailed` here. ``kept`` (a failure this process raises at a
        later gather) travels too, and is named in that error beside the others' failures, which
        would otherwise stop every process before it is raised. ``obj`` is pickled here, before
        the call: one that cannot be (a value of a user's env or rubric) is this process's
        failure, naming it, where ``gather_object`` would raise here alone and leave the others
        waiting."""
        if self.world == 1:
            return [obj]
        from accelerate.utils import gather_object

        unsendable = None
        try:
            data = pickle.dumps((failure, obj, kept))
        except Exception as exc:
            unsendable = exc
            data = pickle.dumps((f"{type(exc).__name__}: could not send {_unpicklable(obj)} to the other "
                                 f"processes: {exc}", None, kept))
        try:
            everyone = [pickle.loads(d) for d in gather_object([data])]
        except Exception:
            self.finished = True  # the call itself failed (a timeout, a process gone): another would too
            raise
        failures = {rank: f for rank, (f, _, _) in enumerate(everyone) if f is not None}
        if failures:
            self.finished = True
            failures.update({rank: k for rank, (f, _, k) in enumerate(everyone) if f is None and k is not None})
            raise ProcessFailed(self.who, failures, self.world) from unsendable
        return [o for _, o, _ in everyone]

    @contextlib.contextmanager
    def together(self, who: str):
        """Where an exception on one process (its env's reset or step, a tokenizer, a reward
        function) would leave the others waiting forever at their next gather: on several
        processes the failing process makes that gather instead, carrying its error, and every
        process raises :class:`ProcessFailed` there (on the failing one, from its own exception).
        The gathers and the trainer's generation alternate with work on each process alone, so
        the next collective call of the others is always a gather. Nothing is added on one
        process, nor to a gather without a failure."""
        self.who = who
        try:
            yield
        except Exception as exc:
            if self.world == 1 or self.finished:  # raised on every process alike, or no gather left
                raise
            try:
                self.gather(None, failure=f"{type(exc).__name__}: {exc}")
            except ProcessFailed as failed:
                raise failed from exc
            raise  # (unreachable: a gather carrying a failure raises)

    def score(self, who: str, labels: list[Any], failed: list[bool], rubrics: list[GroupRubric | None],
              record: Callable[[int], dict[str, Any]], task: Callable[[int], Any], kept: str | None = None,
              ) -> list[tuple[tuple[float | None, bool] | None, bool]]:
        """Each group scored whole by its rubric, however many processes GRPOTrainer's sampler
        spread it over. For each of this process's samples: ``(score, lost)``, what its group's
        rubric gave it (``(reward, failed)``; None without a rubric) and whether any member of its
        group failed or got no reward (for ``failed_group="drop"``).

        A group: the samples of one of this layout's groups with the same ``labels`` entry (on
        several processes without ``n``: a run of one label in the gathered order). Every process
        gathers every sample's position, label, failure and, where its group may be scored on
        another process, its record (``record``); the group's rubric (its first sample's,
        ``rubrics``) scores it once, on the process holding that sample (``task``: of a sample
        here); a second gather shares the scores when a scored group is split. The collective
        calls are the same on every process, in the same order, decided from gathered data only;
        none on one process. A rubric that raises fails its group rather than leaving the other
        processes waiting at the second gather. ``kept``: this process's failure, sent with the
        first gather (:meth:`gather`)."""
        self.who = who
        size, here = len(labels), range(self.start, self.start + len(labels))

        def elsewhere(i: int) -> bool:  # may sample i's group be scored on another process?
            if self.world == 1:
                return False
            if self.n is not None:
                return self.owner(self.keys[i]) != self.rank
            return self.rank > 0 and all(label == labels[0] for label in labels[:i + 1])  # a run from before

        mine = [_Sample(self.start + i, labels[i], failed[i], rubrics[i] is not None,
                        record(i) if rubrics[i] is not None and elsewhere(i) else None) for i in range(size)]
        everyone = self.gather({"size": size, "samples": mine}, kept=kept)
        if len({p["size"] for p in everyone}) > 1:  # the same on every process: all raise
            self.finished = True
            raise ValueError(f"{who}: the processes got batches of different sizes "
                             f"({[p['size'] for p in everyone]}); GRPOTrainer gives each the same")
        flat = [sample for payload in everyone for sample in payload["samples"]]  # global order
        if self.world == 1:
            keys = self.keys
        elif self.n is not None:
            keys = [s.pos // self.n for s in flat]
        else:  # runs of one label in the global order
            keys = list(itertools.accumulate(int(j > 0 and flat[j].label != flat[j - 1].label)
                                             for j in range(len(flat))))
        groups: dict[tuple[int, Any], list[_Sample]] = {}
        for key, s in zip(keys, flat):
            groups.setdefault((key, s.label), []).append(s)
        scores: dict[int, tuple[float | None, bool]] = {}  # position -> (reward, failed)
        for members in groups.values():
            first = members[0]
            if not first.scored or first.pos not in here:  # no rubric, or scored where its first sample is
                continue
            rubric = rubrics[first.pos - self.start]
            try:
                records = [record(s.pos - self.start) if s.pos in here else s.record for s in members]
                scored = rubric.score(records, task=task(first.pos - self.start))
            except Exception as exc:  # the group fails; the other processes still get its scores
                log.warning("group rubric %r raised; its group fails", rubric, exc_info=exc)
                scored = [{"reward": None, "outcome": outcomes.ENV_ERROR} for _ in members]
            for s, out in zip(members, scored):
                scores[s.pos] = (out.get("reward"), group_failed(out))  # (its rubric's error: no reward)
        if any(m[0].scored and m[0].pos // size != m[-1].pos // size for m in groups.values()):
            for shared in self.gather(scores):  # a scored group is split: its scores to every process
                scores.update(shared)
        self.finished = True

        def gone(s: _Sample) -> bool:  # it failed, or its group's rubric failed it or gave it no reward
            reward, bad = scores.get(s.pos, (0.0, False))
            return s.failed or bad or reward is None

        lost: dict[int, bool] = {}  # position -> its group lost a member
        for members in groups.values():
            lost.update(dict.fromkeys((s.pos for s in members), any(map(gone, members))))
        return [(scores.get(pos), lost[pos]) for pos in here]


class ProcessFailed(RuntimeError):
    """What every process raises when one raised during a rollout or a group's scoring on several
    processes (see ``_Groups.together``): ``failures`` maps each failing process's index to its
    exception (``"Type: message"``); on a failing process its own exception is the cause."""

    def __init__(self, who: str, failures: dict[int, str], world: int):
        self.failures = failures
        said = "; ".join(f"process {rank} raised {error}" for rank, error in sorted(failures.items()))
        super().__init__(f"{who}: {said} (every one of the {world} processes stops here, rather than "
                         "waiting for it at the next gather)")


# What a reward function that raised returns on several processes (see _rewards_together): a NaN
# whose payload no reward function gives (None is TRL's plain NaN), which TRL's gather carries bit
# for bit.
_RAISED_BITS = 0x7FC0FA11
_RAISED = struct.unpack("<f", struct.pack("<I", _RAISED_BITS))[0]


def _rewards_together(trainer: Any) -> bool:
    """Installed once per trainer around its ``_calculate_rewards`` (which calls every reward
    function, then gathers their rewards from every process), on one process and on several:

    * A failed episode's row has no reward in any column (:func:`_unscorable_rows`): the env's
      own reward functions (``Env.reward``, :class:`_EnvReward`) are called first, where there
      are others, so that an episode failing as it is graded is known; then every other plain
      reward function is called on the whole batch as usual and its values for those rows are
      replaced by None, and each reward model (``nn.Module``) runs on the whole batch (its forward
      may be collective) and its logits for those rows are NaN. TRL takes a row whose every
      column is NaN as unscorable: out of its group's baseline and std, advantage 0.
    * On several processes, a reward function (yours, or ``Env.reward``) raising on one process
      stops every process with :class:`ProcessFailed`, rather than leaving the others waiting at
      TRL's gather of the rewards: each plain reward function is wrapped so that an exception is
      kept and its rewards are :data:`_RAISED` (never a failed row's plain NaN); the failing
      process still makes TRL's gather, which so carries the failure to every process; there
      every process sees it and a gather of :class:`_Groups` (made only then) tells each which
      process raised what. Rewards that TRL's checks after the function would refuse (a count
      other than the completions', a value torch cannot convert) are checked in the wrapper and
      fail the same way; so does a batch in which an environment of this process kept its
      failure (:meth:`TRLEnvironment._keep`): its plain reward functions are not called (an
      ``Env.reward`` with a group rubric makes the others' group gathers, where they call it:
      :meth:`_EnvReward.unscored`), and its reward models still run, but their rewards are
      :data:`_RAISED`. The error says whether environments or reward functions failed. Nothing
      is gathered when nothing raises.
    * On one process an environment's kept failure is raised before the reward functions run
      (reward models alone would score the episode).

    True where failures are kept and raised together (several processes)."""
    accelerator = getattr(trainer, "accelerator", None)
    world = int(getattr(accelerator, "num_processes", 1) or 1)
    calculate = getattr(trainer, "_calculate_rewards", None)
    if getattr(calculate, "together", False):
        return world > 1
    if calculate is None or not hasattr(trainer, "reward_func_names"):
        return False
    import torch
    from trl.trainer.utils import is_async_callable

    rank = int(getattr(accelerator, "process_index", 0) or 0)

    def failed_environments() -> list[Any]:
        """This process's environments whose env raised (a failure kept, see TRLEnvironment._keep)."""
        return [e for e in getattr(trainer, "environments", None) or [] if getattr(e, "_failure", None) is not None]

    def checked(rewards: Any, n: int) -> list[Any]:
        """``rewards`` as TRL takes them after the function returns (None: NaN), refused where TRL
        would raise (here: on this process alone, after the others went on to its gather)."""
        rewards = [math.nan if r is None else r for r in rewards]
        if len(rewards) != n:
            raise ValueError(f"{len(rewards)} rewards returned for {n} completions (one each)")
        try:
            torch.zeros(n)[:] = torch.tensor(rewards, dtype=torch.float32)  # (TRL stores them in a column)
        except Exception as exc:
            raise ValueError(f"rewards torch cannot convert to float32 ({exc})") from exc
        return rewards

    def told(raised: dict[str, Exception]) -> str:
        """What the error says of this process's failures (``raised``: where -> what)."""
        return "; ".join(f"{type(exc).__name__}: {exc} ({where})" for where, exc in raised.items())

    def kept(func: Any, name: str, raised: dict[str, Exception]) -> Any:
        if world == 1:  # (an exception stops the one process where it is raised)
            return func

        def failed(exc: Exception, kwargs: dict[str, Any]) -> list[float]:
            if isinstance(exc, ProcessFailed):  # (Env.reward's gathers: raised on every process already)
                raise exc
            raised.setdefault(f"reward function {name!r}", exc)
            return [_RAISED] * len(kwargs["prompts"])

        if is_async_callable(func):
            async def call_async(**kwargs: Any) -> list[float | None]:
                try:
                    return checked(await func(**kwargs), len(kwargs["prompts"]))
                except Exception as exc:
                    return failed(exc, kwargs)
            return call_async

        def call(**kwargs: Any) -> list[float | None]:
            try:
                return checked(func(**kwargs), len(kwargs["prompts"]))
            except Exception as exc:
                return failed(exc, kwargs)
        return call

    def without(func: Any, rows: list[bool]) -> Any:
        """A plain reward function whose values for ``rows`` (failed episodes') are None; called on
        the whole batch as TRL calls it (a wrong count is left for TRL's own check)."""
        def unscored_rows(rewards: Any) -> Any:
            rewards = list(rewards)
            return [None if gone else r for r, gone in zip(rewards, rows)] if len(rewards) == len(rows) else rewards

        if is_async_callable(func):
            async def call_async(**kwargs: Any) -> Any:
                return unscored_rows(await func(**kwargs))
            return call_async
        return lambda **kwargs: unscored_rows(func(**kwargs))

    class WithoutRows(torch.nn.Module):
        """A reward model whose logits for ``rows`` (failed episodes') are NaN: it still runs on
        the whole batch (its forward may be collective)."""

        def __init__(self, model: Any, rows: list[bool]):
            super().__init__()
            self.model, self.rows = model, rows

        def forward(self, **inputs: Any) -> Any:
            logits = self.model(**inputs).logits
            rows = torch.tensor(self.rows, dtype=torch.bool, device=logits.device)
            return types.SimpleNamespace(logits=logits.masked_fill(rows.view(-1, *[1] * (logits.dim() - 1)), math.nan))

    def unscored(**kwargs: Any) -> list[float]:  # each plain function, where an environment failed
        return [_RAISED] * len(kwargs["prompts"])

    class UnscoredModel(torch.nn.Module):
        """A reward model, where an environment failed: it runs (its forward may be collective),
        its rewards are :data:`_RAISED` (float32, as TRL's column, so the NaN keeps its bits)."""

        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, **inputs: Any) -> Any:
            logits = self.model(**inputs).logits
            return types.SimpleNamespace(logits=torch.full(logits.shape, _RAISED, dtype=torch.float32,
                                                           device=logits.device))

    def reward_funcs(inputs: list[Any], prompts: list[Any], completions: list[Any], completion_ids: list[Any],
                     raised: dict[str, Exception]) -> list[Any]:
        """What TRL calls instead of each reward function: the env's own first (their rewards
        kept for TRL's call), then every other one without the failed episodes' rows."""
        funcs, names = trainer.reward_funcs, trainer.reward_func_names
        environments = getattr(trainer, "environments", None)
        if raised:  # an environment of this process failed: the batch raises on every process
            for f in funcs:  # (where the others call Env.reward: first, or its functions all Env.reward)
                if isinstance(f, _EnvReward):
                    try:
                        f.unscored(trainer, environments or [], kept=told(raised))
                    except ProcessFailed as failed:  # another process's grading raised at its gather
                        raise failed from next(iter(raised.values()))
            return [UnscoredModel(f) if isinstance(f, torch.nn.Module) else unscored for f in funcs]
        calls = [f if isinstance(f, torch.nn.Module) else kept(f, name, raised) for f, name in zip(funcs, names)]
        env_rewards: dict[int, list[Any]] = {}
        if environments is not None and any(not isinstance(f, _EnvReward) for f in funcs):
            kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                      "environments": environments, "trainer_state": getattr(trainer, "state", None),
                      "log_metric": getattr(trainer, "_log_metric", None)}  # (what Env.reward reads)
            for i, f in enumerate(funcs):
                if isinstance(f, _EnvReward):
                    env_rewards[i] = list(calls[i](**kwargs))
                    calls[i] = lambda _rewards=env_rewards[i], **_: _rewards
        rows = [] if raised else _unscorable_rows(inputs, environments, {funcs[i]: r for i, r in env_rewards.items()})
        if not any(rows):
            return calls
        return [c if i in env_rewards else WithoutRows(c, rows) if isinstance(c, torch.nn.Module)
                else kept(without(funcs[i], rows), names[i], raised) for i, c in enumerate(calls)]

    def calculate_rewards(*args: Any, **kwargs: Any) -> Any:
        batch = inspect.signature(calculate).bind(*args, **kwargs).arguments  # (TRL's names, as of 1.16)
        raised: dict[str, Exception] = {}  # where (a reward function, an env's call) -> what
        envs = getattr(trainer, "environments", None) or []
        if lost := failed_environments():
            where, exc = lost[0]._failure
            if world == 1:
                raise exc
            more = f"; {len(lost)} of its {len(envs)} environments failed" if len(lost) > 1 else ""
            raised[f"{type(lost[0]).__name__}.{where}{more}"] = exc
        funcs = trainer.reward_funcs
        try:
            trainer.reward_funcs = reward_funcs(batch.get("inputs") or [], batch.get("prompts"),
                                                batch.get("completions"), batch.get("completion_ids_list"), raised)
            rewards = calculate(*args, **kwargs)  # every process's, gathered
        finally:
            trainer.reward_funcs = funcs
        if world == 1 or not bool((rewards.float().view(torch.int32) == _RAISED_BITS).any()):
            return rewards
        said = told(raised)
        # an env's (kept, or raised grading it in Env.reward): the first failure here is one
        kept_errors = [e._failure[1] for e in failed_environments()]
        by_env = any(exc is kept_error for exc in raised.values() for kept_error in kept_errors)
        everyone = _Groups([], 0, rank, world, 0, None).gather((said or None, by_env))
        failures = {r: failure for r, (failure, _) in enumerate(everyone) if failure is not None}
        if not failures:
            return rewards  # (no process raised: a function's own NaN, TRL's "unscorable")
        envs_failed = {env for failure, env in everyone if failure is not None}  # {True}: only envs failed
        who = {frozenset({True}): "GRPOTrainer's environments", frozenset({False}): "GRPOTrainer's reward functions"
               }.get(frozenset(envs_failed), "GRPOTrainer's environments and reward functions")
        raise ProcessFailed(who, failures, world) from next(iter(raised.values()), None)

    calculate_rewards.together = True
    trainer._calculate_rewards = calculate_rewards
    return world > 1


def _unscorable_rows(inputs: list[Any], environments: list[Any] | None,
                     env_rewards: dict[Any, list[Any]]) -> list[bool]:
    """Which rows of this process's batch are failed episodes' (no reward): with
    ``environment_factory`` (``environments``: TRL's, in row order) an env whose episode ended
    with a failure outcome, or one its class's ``Env.reward`` (``env_rewards``: what each
    returned) gave None or NaN (graded failed, or its group rubric failed it); with
    :class:`TRLRollout` a sample whose ``env_reward`` (TRL hands it to reward functions from each
    row) is None (failed, or its group dropped)."""
    rows = [isinstance(row, dict) and "env_reward" in row and row["env_reward"] is None for row in inputs]
    for i, env in enumerate(environments or []):
        if i < len(rows) and isinstance(env, TRLEnvironment):
            mine = [r[i] for f, r in env_rewards.items() if type(env) is f.cls and i < len(r)]
            rows[i] = rows[i] or outcomes.is_failure(env.outcome) or any(r is None or r != r for r in mine)
    return rows


class _Sample(NamedTuple):
    """One sample, as :meth:`_Groups.score` gathers it from every process."""

    pos: int  # in GRPOTrainer's gathered batch
    label: Any  # its group's samples share it
    failed: bool
    scored: bool  # it has a group rubric
    record: dict[str, Any] | None  # where its group may be scored on another process


def _unpicklable(obj: Any, path: str = "the payload", depth: int = 0) -> str:
    """Where in ``obj`` (a payload that cannot be pickled) the value that cannot be is, as a path
    (``the payload['samples'][2].record['trace']``): the deepest part that still fails alone."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        parts = [(f".{name}", value) for name, value in zip(obj._fields, obj)]
    elif isinstance(obj, dict):
        parts = [(f"[{key!r}]", value) for key, value in obj.items()]
    elif isinstance(obj, (list, tuple)):
        parts = [(f"[{i}]", value) for i, value in enumerate(obj)]
    else:
        parts = []
    for step, value in parts if depth < 20 else []:
        try:
            pickle.dumps(value)
        except Exception:
            return _unpicklable(value, path + step, depth + 1)
    return f"{path} ({type(obj).__name__})"


def _task_of(prompt: Any) -> tuple[str, int]:
    """The env (its id and kwargs, as JSON: a pool key) and task index a dataset prompt carries."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and prompt[0].get(TASK_KEY) is not None:
        mark = json.loads(prompt[0][TASK_KEY])
        env = json.dumps({"env_id": mark["env_id"], "env_kwargs": mark.get("env_kwargs") or {}}, sort_keys=True)
        return env, int(mark["task_index"])
    raise ValueError("a prompt without its task: build train_dataset with TRLRollout.dataset() "
                     f"(its first message carries {TASK_KEY!r})")


def generate_turn(trainer: Any, input_ids: list[list[int]],
                  max_new_tokens: int | None = None) -> tuple[list[list[int]], list[list[float] | None]]:
    """One turn for each sequence with the trainer's own generation backend (vLLM or
    transformers), asking for at most ``max_new_tokens`` (``None``: the trainer's own limit)."""
    with _max_new_tokens(trainer, max_new_tokens):
        completion_ids, logprobs = trainer._generate_single_turn(input_ids, None, {}, 1)
    if logprobs is None:
        logprobs = [None] * len(completion_ids)
    return [list(c) for c in completion_ids], [list(lp) if lp is not None else None for lp in logprobs]


@contextlib.contextmanager
def _max_new_tokens(trainer: Any, n: int | None):
    """The trainer's generation limit set to ``n`` for one call: the vLLM generator's
    ``max_completion_length`` and the transformers ``generation_config`` (and the kwargs TRL
    applies over the model's), as GRPOTrainer reads them at each generation."""
    if n is None:
        yield
        return
    saved = []
    targets = [getattr(trainer, "vllm_generation", None), getattr(trainer, "generation_config", None)]
    for target, name in zip(targets, ("max_completion_length", "max_new_tokens")):
        if target is not None and hasattr(target, name):
            saved.append((target, name, getattr(target, name)))
            setattr(target, name, n)
    kwargs = getattr(trainer, "generation_kwargs", None)
    old = kwargs.get("max_new_tokens") if isinstance(kwargs, dict) else None
    if isinstance(kwargs, dict):
        kwargs["max_new_tokens"] = n
    try:
        yield
    finally:
        for target, name, value in saved:
            setattr(target, name, value)
        if isinstance(kwargs, dict):
            kwargs["max_new_tokens"] = old


# -- environment_factory --------------------------------------------------------------------------

_FAILED = "Error: the environment failed; this episode will not be scored."  # (what the model sees)
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


class TRLEnvironment:
    """Base of the classes :func:`trl_environment` makes: one env, its tools as methods."""

    env_id: str = ""
    env_kwargs: ClassVar[dict[str, Any]] = {}
    group_rubric: ClassVar[GroupRubric | None] = None

    def __init__(self):
        self.env = make_env(self.env_id, {**self.env_kwargs, "tool_format": "openai", "tools_in_prompt": False})
        self.reward: float | None = 0.0
        self.outcome: str | None = None  # how the episode ended (info["outcome"]); None while it runs
        self.reward_components: dict[str, float] = {}
        self.turn_rewards: list[float] = []  # each step's reward: per-turn rewards, then the final one
        self.done = False
        self._calls = 0
        self._lock = threading.Lock()
        self._keep_failures = False  # on several processes, under a trainer (see reset)
        self._failure: tuple[str, Exception] | None = None  # where the env raised, and what

    @classmethod
    def dataset(cls, n: int | None = None) -> Any:
        """Rows for ``train_dataset``: ``prompt`` (the env's opening messages, tools left to the
        chat template) and ``task_index``."""
        return task_dataset(cls.env_id, n, env_kwargs={**cls.env_kwargs, "tools_in_prompt": False})

    def reset(self, task_index: int | None = None, **row: Any) -> None:
        """Start the row's task; the prompt is already the env's (from :meth:`dataset`). The
        trainer resetting it is the first place this class sees it: its reward functions are made
        to fail together from this batch on (:func:`_rewards_together`), and where they are, the
        env raising here or in a tool call fails the batch there (:meth:`_keep`)."""
        self._keep_failures = _rewards_together(_trainer_resetting(self))
        self.reward, self.reward_components, self.done, self._calls = 0.0, {}, False, 0
        self.turn_rewards, self._failure, self.outcome = [], None, None
        options = {"task_index": int(task_index)} if task_index is not None else None
        try:
            self.env.reset(options=options)
        except Exception as exc:
            self._keep("reset", exc)

    def _keep(self, where: str, exc: Exception) -> None:
        """The env raised (its own failure: the model's mistakes are observations) in ``where``.
        On one process, or outside a trainer, a reset's is raised; a tool call's is kept, the
        model told the env failed, and :meth:`_grade` raises it (TRL would show it to the model as
        the tool's answer, and the episode would be graded and trained on). On several processes
        the process goes on to the collective calls the others make (TRL raising here would leave
        them waiting): the episode ends failed and the error is kept; every process raises it at
        TRL's gather of the rewards (:func:`_rewards_together`)."""
        if not self._keep_failures and where == "reset":
            raise exc
        # (a tool call's: TRL would show the exception to the model as the tool's answer, and the
        # episode would be graded; kept, it is raised when the episode is graded, on one process too)
        self._failure = self._failure or (where, exc)
        self.done, self.reward = True, None

    def _step(self, where: str, action: dict[str, Any]) -> tuple[Any, ...] | None:
        """The env's step, or None where it raised and its failure is kept (:meth:`_keep`)."""
        try:
            return self.env.step(action)
        except Exception as exc:
            self._keep(where, exc)
            return None

    def final_answer(self, answer: str) -> str:
        """Give your final answer. This ends the episode; call no tool after it.

        Args:
            answer: your final answer, as the task asks for it.

        Returns:
            A confirmation.
        """
        if not self.done:
            # every family's rubric reads the answer from <answer> tags (Math also from \boxed{})
            text = answer if "<answer>" in str(answer).lower() else f"<answer>{answer}</answer>"
            if (out := self._step("final_answer", {"role": "assistant", "content": text})) is None:
                return _FAILED
            self._end(*out)
        return "Answer recorded."

    def _grade(self, reply: str = "") -> float | None:
        """The env's verified reward; an episode the model has not ended ends with ``reply``
        (its last reply without a tool call: its answer), graded as it stands. In an env with a
        simulated user, ``reply`` goes to the user; if they talk on, the model has nothing more to
        say (TRL ended its turn): empty replies follow until the user ends it or the turn limit."""
        if self._failure is not None:
            raise self._failure[1]
        while not self.done:
            if (out := self._step("reward", {"role": "assistant", "content": reply})) is None:
                raise self._failure[1]  # (kept too: the error names the env as what failed)
            obs, reward, terminated, truncated, info = out
            if terminated or truncated:
                self._end(obs, reward, terminated, truncated, info)
            reply = ""
        return self.reward

    def _message_user(self, message: str) -> str:
        if self.done:
            return "Error: the episode is over."
        with self._lock:
            out = self._step("message_user", {"role": "assistant", "content": message})
        if out is None:
            return _FAILED
        obs, reward, terminated, truncated, info = out
        if terminated or truncated:
            self._end(obs, reward, terminated, truncated, info)
            return "The user ended the conversation."
        return obs

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.done:
            return "Error: the episode is over."
        with self._lock:
            self._calls += 1
            call = {"id": f"call_{self._calls}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)}}
            out = self._step(name, {"role": "assistant", "content": None, "tool_calls": [call]})
        if out is None:
            return _FAILED
        obs, reward, terminated, truncated, info = out
        text = "\n".join(m["content"] for m in info["messages"])
        if terminated or truncated:
            self._end(obs, reward, terminated, truncated, info)
        else:
            self.turn_rewards.append(float(reward))
        return text

    def _end(self, obs: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
        self.done, self.outcome = True, info.get("outcome")
        self.turn_rewards.append(float(reward))
        # the return (per-turn rewards included); a failed episode has no reward: TRL leaves None
        # out of the baseline (advantage 0)
        self.reward = None if outcomes.is_failure(self.outcome) else float(sum(self.turn_rewards))
        self.reward_components = dict(info.get("reward_components", {}))


def trl_environment(env_id: str, *, group_rubric: GroupRubric | None = None, **env_kwargs: Any) -> type[TRLEnvironment]:
    """A class for ``GRPOTrainer(environment_factory=...)``: ``reset(**row)``, one method per
    tool (typed signature, Google-style docstring from the tool's schema), ``final_answer``,
    and ``reward``: the reward function to pass as ``reward_funcs``. ``group_rubric`` (default:
    the env's own) scores each group (a prompt's ``num_generations`` samples, as GRPOTrainer
    normalises them) together, its members gathered from every process TRL's sampler spread them
    over (see ``_EnvReward``)."""
    _require_trl()
    if group_rubric is not None and not isinstance(group_rubric, GroupRubric):
        raise TypeError(f"group_rubric must be a GroupRubric, got {type(group_rubric).__name__}")
    env = make_env(env_id, {**env_kwargs, "tools_in_prompt": False})
    group_rubric = group_rubric or group_rubric_of(env)
    try:
        schemas = env.unwrapped.tool_schemas
        if not schemas:
            env.reset()  # MCP-v0 knows its tools once connected
            schemas = env.unwrapped.tool_schemas
    finally:
        env.close()
    methods: dict[str, Any] = {"env_id": env_id, "env_kwargs": dict(env_kwargs), "group_rubric": group_rubric}
    for schema in schemas:
        function = schema.get("function", schema)
        if function["name"] in ("reset", "get_reward", "reward", "final_answer") \
                or not function["name"].isidentifier():
            raise ValueError(f"tool {function['name']!r} cannot be a method name of a TRL environment")
        methods[function["name"]] = _tool_method(function)
    if env.unwrapped.user is not None:  # (a closed env keeps its attributes)
        if "message_user" in methods:
            raise ValueError("tool 'message_user' clashes with the method that talks to the simulated user")
        methods["message_user"] = message_user
    name = "".join(part for part in env_id.replace("/", "-").replace("_", "-").split("-") if part).replace(".", "")
    cls = type(f"{name}TRLEnvironment", (TRLEnvironment,), methods)
    cls.reward = _EnvReward(cls)
    return cls


def message_user(self, message: str) -> str:
    """Send a message to the user (the customer) and get their answer.

    Args:
        message: what you say to the user

    Returns:
        The user's answer, or a note that they ended the conversation.
    """
    return self._message_user(message)


class _EnvReward:
    """``Env.reward``: TRL's reward function for the envs of class ``cls``. An object, not a
    method: TRL offers every public method of an environment class to the model as a tool.

    With a group rubric (``cls.group_rubric``) each group is scored together, as
    :meth:`_Groups.score` does it: TRL calls a reward function on each process's own samples, and
    its sampler spreads a group over processes. A rubric that raises fails its group (every member
    ``None``).

    ``num_generations`` comes from the trainer that TRL's ``log_metric`` (a keyword every reward
    function gets) is bound to. Called without it (your own code): a group is a run of
    environments on the same task, in the order gathered from every process (process 0's, then
    process 1's, ...)."""

    def __init__(self, cls: type):
        self.cls = cls
        self.__name__ = cls.__name__  # TRL logs it as rewards/<class name>

    def __call__(self, completions: list[Any], environments: list[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        if environments is None:
            raise ValueError(f"environments is missing: pass environment_factory={self.cls.__name__} to GRPOTrainer")

        def grade() -> list[float | None]:
            return [e._grade(_last_reply(c)) if type(e) is self.cls else None
                    for c, e in zip(completions, environments)]

        trainer = getattr(kwargs.get("log_metric"), "__self__", None)  # TRL passes its trainer's bound method
        _rewards_together(trainer)  # (done at reset already, unless a subclass's reset skipped it)
        rubric = self.cls.group_rubric
        if rubric is None:
            return grade()
        # each sample's task: its group's label (None: another class's environment, not scored here)
        tasks = [e.env.unwrapped.episode.index if type(e) is self.cls else None for e in environments]
        groups = _Groups.for_reward(trainer, tasks)
        with groups.together(f"{self.__name__}.reward"):  # a grade raising here: on every process
            rewards = grade()
            verdicts = groups.score(
                f"{self.__name__}.reward", labels=tasks, failed=[r is None for r in rewards],
                rubrics=[None if task is None else rubric for task in tasks],
                record=lambda i: {**environments[i].env.unwrapped.episode_record(), "reward": rewards[i]},
                task=lambda i: environments[i].env.unwrapped.episode.task)
        if callable(kwargs.get("log_metric")):  # (TRL's: averaged over the logging step)
            kwargs["log_metric"](GROUP_ERRORS, sum(bool(score and score[1]) for score, _ in verdicts))
        return [r if score is None else None if score[1] else score[0] for r, (score, _) in zip(rewards, verdicts)]

    def unscored(self, trainer: Any, environments: list[Any], kept: str | None = None) -> None:
        """In place of grading, on a process one of whose environments kept its failure (the batch
        raises on every process at TRL's gather of the rewards, :func:`_rewards_together`): the
        gathers its group rubric makes on the other processes (:meth:`_Groups.score`), every
        sample here failed and unscored; else they would wait there for this process, gone on to
        TRL's gather. ``kept`` (that failure, as the error names it) goes with the first gather:
        where another process's grading raises there, every process stops there, naming both."""
        if self.cls.group_rubric is None:
            return
        none = [None] * len(environments)
        _Groups.for_reward(trainer, none).score(f"{self.__name__}.reward", labels=none, failed=[True] * len(none),
                                                rubrics=none, record=lambda i: {}, task=lambda i: None, kept=kept)


def _trainer_resetting(env: TRLEnvironment) -> Any:
    """The trainer whose batch is resetting ``env``, or None: TRL hands an environment's ``reset``
    only the dataset row, so it is read from the calling frames (GRPOTrainer's
    ``_generate_and_score_completions`` puts the batch's environments in ``self.environments``,
    then resets each): the first ``self`` whose ``environments`` hold ``env``."""
    frame = inspect.currentframe()
    for _ in range(10):  # reset's caller, a subclass's reset or two, a wrapper of the trainer's
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        environments = getattr(owner, "environments", None) if owner is not env else None
        if isinstance(environments, list) and any(e is env for e in environments):
            return owner
    return None


def _last_reply(completion: Any) -> str:
    """The completion's last assistant reply that calls no tool (TRL's conversational
    completions are message lists), else ``""``."""
    if isinstance(completion, str):
        return completion
    last = completion[-1] if completion else {}
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        content = last.get("content")
        return content if isinstance(content, str) else ""
    return ""


def _tool_method(function: dict[str, Any]):
    """A method calling tool ``function`` through the env, with the signature and docstring TRL
    (``transformers.utils.get_json_schema``) turns back into the tool's schema."""
    name = function["name"]
    params = function.get("parameters", {}).get("properties", {})
    required = set(function.get("parameters", {}).get("required", []))

    def method(self, **kwargs: Any) -> str:
        return self._call(name, {k: v for k, v in kwargs.items() if v is not None})

    ordered = sorted(params, key=lambda p: p not in required)  # required first (no default)
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    for p in ordered:
        kind = _JSON_TYPES.get(params[p].get("type"), str)
        annotations[p] = kind if p in required else kind | None
        parameters.append(inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotations[p],
                                            default=inspect.Parameter.empty if p in required else None))
    method.__signature__ = inspect.Signature(parameters, return_annotation=str)
    method.__annotations__ = annotations
    args = "\n".join(f"    {p}: {' '.join((params[p].get('description') or p).split())}" for p in ordered)
    description = " ".join((function.get("description") or name).split())
    method.__doc__ = f"{description}\n\nArgs:\n{args}\n\nReturns:\n    The tool's output." if ordered \
        else f"{description}\n\nReturns:\n    The tool's output."
    method.__name__ = method.__qualname__ = name
    return method
