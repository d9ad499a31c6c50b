"""Statistics of an eval run and of a comparison between runs, with confidence intervals.

Tasks are the unit of resampling: a benchmark is a sample of tasks, and samples of one task are
not independent of each other. So CIs are percentile bootstrap intervals over tasks
(``scipy.stats.bootstrap``, expanded for few tasks: :func:`_expanded`): a cluster bootstrap that
draws tasks with all their episodes (from ``TYPED_UNITS`` tasks on, :func:`summarize` draws how
many times each distinct task is drawn instead: the same bootstrap, its cost in distinct tasks;
:func:`_typed_intervals`). The mean reward and success rate weigh each episode once (tasks
with more scored samples weigh more), and so does each resample, so an estimate lies in its CI;
``compare``'s difference is the difference of the runs' means on the shared tasks, each task
weighed the same in both (as above where the runs' counts are in proportion), resampled paired
(the same tasks for both runs).
IQM is ``scipy.stats.trim_mean(x, 0.25)`` over episodes, its CI resampling tasks with all their
episodes. pass@k is the unbiased estimator of the Codex paper; the probability of improvement
is rliable's: per task, P(X > Y) + P(X = Y) / 2 over the two runs' episodes (the Mann-Whitney U
over n*m), averaged over tasks. (rliable itself does not import with this machine's pandas, and
its stratified bootstrap keeps tasks fixed, which gives no interval with one sample per task -
the common case for LLM evals.)

With one task there are no tasks to resample: the CIs resample its episodes instead - the
spread of that task's samples, not of a benchmark's tasks - and the result says so
(``intervals_over: "episodes"`` and a note); with one episode (in ``compare``: one episode of
the shared task in a run) there is no CI (``ci_low``/``ci_high`` None). Never a zero-width
interval standing for certainty it does not have: a share seen as all 0 or all 1 (every
resample the same) takes Wilson's score interval over the units (:func:`_wilson`), and a mean
reward that is the same for every episode, at neither 0 nor 1, has no CI, and so has any other
estimate every resample gives the same (the IQM of rewards mostly 0), with a note.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

MAX_GROUPS = 50  # a metadata key with more distinct values is not broken down by
MAX_SHOWN_GROUPS = 8  # the text summary shows this many groups of a key (summary.json has all)
MAX_COUNTED_VALUES = 64  # at most this many distinct rewards: IQM intervals from counts, not sorts
TYPED_UNITS = 1000  # from this many units, a summary resamples counts of distinct units (_typed_intervals)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` samples drawn from ``n`` (``c`` of them correct) is
    correct: ``1 - C(n-c, k) / C(n, k)``, as a product (no huge binomials)."""
    if not 0 <= c <= n or not 0 < k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 0 < k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _expanded(confidence: float, n: int) -> float:
    """The level to take percentiles at for a ``confidence`` interval from ``n`` units: Hesterberg's
    expanded percentile interval ("What teachers should know about the bootstrap", 2015). The plain
    percentile interval of a mean is about ``z * sqrt((n-1)/n)`` standard errors wide where the
    t interval is ``t(n-1)`` wide: too narrow for few tasks (95% intervals held the truth 86% of the
    time with 5 tasks, 92% with 10). Taking the percentiles at ``1 - 2 Phi(-sqrt(n/(n-1)) t(n-1))``
    makes up both; from a few hundred units it is ``confidence`` again."""
    from scipy.stats import norm, t

    if n < 2:
        return confidence
    return float(1 - 2 * norm.sf(math.sqrt(n / (n - 1)) * t.ppf((1 + confidence) / 2, n - 1)))


FEW_TASKS = 5  # below this many tasks a bootstrap interval is too narrow even expanded: a note says so


def _few_tasks_note(tasks: int) -> str:
    """Why the intervals from 2-4 tasks are rough: a resample of so few tasks cannot reach past
    their own spread (simulated: 95% intervals of a mean held the truth 53%, 79% and 88% of the
    time with 2, 3 and 4 tasks, expanded as :func:`_expanded`; 93% with 5)."""
    return (f"only {tasks} tasks: bootstrap CIs over so few tasks are too narrow (a 95% interval holds the truth "
            "about half the time with 2 tasks, 4 times in 5 with 3); read the per-task results instead")


def _intervals(n: int | tuple[int, ...], statistic: Callable[..., Any], *, seed: int, confidence: float,
               resamples: int) -> list[tuple[float | None, float | None]]:
    """Percentile bootstrap intervals (expanded: :func:`_expanded`) of each output of
    ``statistic(units, axis=-1)`` - a function of resampled unit indices (tasks; episodes where
    there is one task), vectorised over resamples, returning one row per output. ``n``: the
    units, or a tuple of counts of independent samples, each resampled on its own
    (``statistic(units_1, units_2, axis=-1)``). One resampling serves them all (each alone would
    draw the same indices from ``seed``). A sample of fewer than 2 units has nothing to resample:
    no interval (None, None), never the value as its own interval."""
    from scipy.stats import bootstrap

    sizes = (n,) if isinstance(n, (int, np.integer)) else tuple(n)
    if min(sizes) < 2:
        return [(None, None)] * len(np.atleast_1d(statistic(*(np.arange(m) for m in sizes), axis=-1)))
    level = _expanded(confidence, min(sizes))
    result = bootstrap(tuple(np.arange(m) for m in sizes), statistic, confidence_level=level, n_resamples=resamples,
                       batch=200, method="percentile", vectorized=True, paired=False, rng=np.random.default_rng(seed))
    low, high = np.atleast_1d(result.confidence_interval.low), np.atleast_1d(result.confidence_interval.high)
    return [(float(a), float(b)) for a, b in zip(low, high)]


def _typed_intervals(rows: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *, seed: int,
                     confidence: float, resamples: int) -> list[tuple[float, float]]:
    """:func:`_intervals` for a statistic of the resampled units' summed ``rows`` (one row per
    unit: its episodes' sums), its cost in the distinct rows instead of the units. Drawing ``n``
    of ``n`` units with replacement takes each distinct row a Multinomial(``n``, its share) number
    of times, so drawing those counts is the same bootstrap (the same distribution of resamples,
    other random numbers than scipy's index draws). A run of 40,960 one-episode tasks has two
    distinct rows (reward 0 or 1): its summary's bootstrap took 1 s of a 2-core machine's CPU
    (and every core's on a 16-core one, BLAS's), which capped a fast eval's end. ``statistic(sums)``:
    ``sums`` is resamples x columns; one row per output. Percentile intervals, as scipy's, expanded
    as :func:`_intervals`' are."""
    distinct, counts = np.unique(rows, axis=0, return_counts=True)
    draws = np.random.default_rng(seed).multinomial(len(rows), counts / len(rows), size=resamples)
    theta = np.atleast_2d(statistic(draws.astype(float) @ distinct))
    tail = 50 * (1 - _expanded(confidence, len(rows)))
    low, high = np.percentile(theta, [tail, 100 - tail], axis=-1)
    return [(float(a), float(b)) for a, b in zip(low, high)]


def _wilson(value: float, n: int, confidence: float) -> tuple[float, float]:
    """The interval of a share seen as all 0 or all 1 over ``n`` units (tasks; episodes with one
    task): every bootstrap resample is then the same, and its percentile interval of zero width
    claimed a certainty 10 tasks do not give. Wilson's score interval (``scipy.stats.binomtest``)
    over the units, not the episodes: a task's samples are not independent of each other."""
    from scipy.stats import binomtest

    ci = binomtest(round(value * n), n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def _newcombe(p: float, q: float, n: int, m: int, confidence: float) -> tuple[float, float]:
    """The interval of the difference ``p - q`` of two shares over ``n`` and ``m`` units from
    each one's Wilson interval (Newcombe's hybrid score method, 1998): for a difference whose
    bootstrap resamples are all the same (both runs solved every task, say), where the percentile
    interval has zero width. Treats the runs as independent: wider than a paired interval."""
    lp, up = _wilson(p, n, confidence)
    lq, uq = _wilson(q, m, confidence)
    d = p - q
    return float(d - math.hypot(p - lp, uq - q)), float(d + math.hypot(up - p, q - lq))


def _tango_paired(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float]:
    """The interval of ``mean(x) - mean(y)`` for paired 0/1 outcomes (one per task and run): Tango's
    score interval (1998), the differences ``D`` whose score statistic, with the discordant cells'
    restricted maximum likelihood, is within the normal quantile. Where the tasks that differ all
    differ one way no bootstrap resample crosses 0, and the percentile interval stopped at 0 exactly
    (a 95% interval held the truth 86% of the time at 10 tasks; this one 97%, and 95% at 50)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    n = len(x)
    b, c = int(((x == 1) & (y == 0)).sum()), int(((x == 0) & (y == 1)).sum())
    z, estimate = float(norm.ppf(0.5 + confidence / 2)), (b - c) / n

    def score(d: float) -> float:
        if d == estimate:
            return 0.0
        w = -b - c + (2 * n - b + c) * d
        q = (math.sqrt(w * w + 8 * n * c * d * (1 - d)) - w) / (4 * n)  # the cell (0, 1)'s restricted MLE
        variance = n * (2 * q + d * (1 - d))
        return (b - c - n * d) / math.sqrt(variance) if variance > 0 else math.copysign(math.inf, b - c - n * d)

    edge = 1 - 1e-12
    low = -1.0 if score(-edge) <= z else brentq(lambda d: score(d) - z, -edge, estimate)
    high = 1.0 if score(edge) >= -z else brentq(lambda d: score(d) + z, estimate, edge)
    return float(low), float(high)


def _units(owner: np.ndarray, clusters: int) -> tuple[np.ndarray, str | None]:
    """What a bootstrap resamples, for items (episodes) owned by ``clusters`` tasks (``owner``:
    each one's task, sorted): the tasks when there are 2 or more (a cluster bootstrap); with one
    task, its episodes - then the interval is the spread of that task's samples, not of a
    benchmark's tasks (said as ``"episodes"``); with one episode, nothing (None). Returns each
    item's unit (sorted) and what the units are."""
    if clusters > 1:
        return owner, "tasks"
    return np.arange(len(owner)), "episodes" if len(owner) > 1 else None


def _estimate(value: float, ci: tuple[float | None, float | None]) -> dict[str, float | None]:
    return {"value": float(value), "ci_low": ci[0], "ci_high": ci[1]}


def _by_task(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    tasks: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        tasks[str(r["task_id"])].append(r)
    return dict(tasks)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def _codes(labels: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct ``labels`` (sorted) and each label's index among them."""
    distinct = sorted(set(labels))
    index = {label: i for i, label in enumerate(distinct)}
    return distinct, np.fromiter(map(index.__getitem__, labels), np.intp, len(labels))


def _groups(records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None, rewards: np.ndarray,
            successes: np.ndarray) -> dict[str, dict[str, Any]]:
    """Episodes, mean reward and success rate per value of each metadata key of ``keys`` (None:
    each key with 2 to ``MAX_GROUPS`` categorical values); ``rewards`` and ``successes``: the
    records' own, in their order. One pass over the records per key, the means by ``bincount``."""
    metadata = [r.get("metadata") or {} for r in records]
    if keys is None:
        keys = []
        for key in set().union(*metadata):
            present = [m[key] for m in metadata if key in m]
            if not all(isinstance(v, (str, int, bool)) or v is None for v in present):
                continue  # a list, a dict, a float: not a category
            # counted as the groups are labelled: 1 and True are one value to a set but two groups,
            # 1 and "1" two values but one group "1"
            if 1 < len({str(v) for v in present}) <= MAX_GROUPS:
                keys.append(key)
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(keys):
        labels, codes = _codes([str(m.get(key)) for m in metadata])
        counts = np.bincount(codes, minlength=len(labels))
        reward_sums = np.bincount(codes, rewards, len(labels))
        success_sums = np.bincount(codes, successes, len(labels))
        out[key] = {label: {"episodes": int(counts[i]), "mean_reward": float(reward_sums[i] / counts[i]),
                            "success_rate": float(success_sums[i] / counts[i])}
                    for i, label in enumerate(labels)}
    return out


def _outcomes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each record's outcome (:func:`benchmax_gym.eval.runner.outcome_of`), in order."""
    from benchmax_gym.eval.runner import outcome_of

    return [outcome_of(r) for r in records]


def _signal(records: Sequence[Mapping[str, Any]], outcomes: Sequence[str] | None = None) -> list[Mapping[str, Any]]:
    """The ``scored`` and ``truncated`` episodes: the only ones whose reward is a score (issue 29).
    One without a finite reward is a ValueError naming it (it would be NaN in every statistic);
    ``read_rollouts`` refuses such a record in a run directory. ``outcomes``: the records' own."""
    from benchmax_gym.core.outcomes import SIGNAL

    out = []
    for r, outcome in zip(records, outcomes or _outcomes(records)):
        if outcome in SIGNAL:
            reward = r.get("reward")
            number = type(reward) is float or isinstance(reward, numbers.Real) and not isinstance(reward, bool)
            if not number or not math.isfinite(reward):
                raise ValueError(f"task {r.get('task_id')!r} (index {r.get('task_index')!r}) sample "
                                 f"{r.get('sample')!r}: a {outcome} episode with reward {reward!r}, not a number")
            out.append(r)
    return out


def outcome_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many episodes ended with each outcome (only those that occur), by name."""
    return dict(sorted(Counter(_outcomes(records)).items()))


def failure_rate(records: Sequence[Mapping[str, Any]], *, seed: int = 0, confidence: float = 0.95,
                 resamples: int = 2000, outcomes: Sequence[str] | None = None) -> dict[str, float | None]:
    """The share of failed episodes, with a bootstrap CI over tasks (by ``task_index``: a failed
    episode may have no task id): a run's failures cluster by task as its scores do. With one
    task the CI resamples its episodes; with one episode there is none (``ci_low`` None).
    ``outcomes``: the records' own, when known."""
    from benchmax_gym.core.outcomes import FAILURES

    if not records:
        return {"value": 0.0, "ci_low": None, "ci_high": None}
    distinct, owner = _codes([r["task_index"] for r in records])
    unit, over = _units(owner, len(distinct))  # (each task's episodes need not be together: sums by unit)
    units = int(unit.max()) + 1
    sizes = np.bincount(unit, minlength=units).astype(float)
    flags = np.fromiter((o in FAILURES for o in (outcomes or _outcomes(records))), float, len(records))
    failed = np.bincount(unit, flags, units)
    value = failed.sum() / sizes.sum()
    if over is None:
        return _estimate(value, (None, None))
    if value in (0.0, 1.0):  # every resample is the same: no bootstrap (it would warn of degenerate data)
        return _estimate(value, _wilson(value, units, confidence))

    options = {"seed": seed, "confidence": confidence, "resamples": resamples}
    if units >= TYPED_UNITS:
        (ci,) = _typed_intervals(np.column_stack([failed, sizes]), lambda sums: sums[:, 0] / sums[:, 1], **options)
        return _estimate(value, ci)

    def per_resample(picked: np.ndarray, axis: int = -1) -> np.ndarray:
        picked = picked.astype(np.intp, copy=False)
        return (failed[picked].sum(axis=-1) / sizes[picked].sum(axis=-1))[None]

    (ci,) = _intervals(units, per_resample, **options)
    return _estimate(value, ci)


def _iqm_of_counts(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``trim_mean(x, 0.25)`` of each row's multiset: ``counts[r, j]`` copies of ``values[j]``
    (sorted ascending). The kept middle is positions ``[low, total - low)`` of the sorted episodes."""
    total = counts.sum(axis=-1)
    low = np.floor(0.25 * total)
    high = total - low
    end = np.cumsum(counts, axis=-1)
    kept = np.clip(np.minimum(end, high[:, None]) - np.maximum(end - counts, low[:, None]), 0, None)
    return kept @ values / (high - low)


def _all_failed(n: int) -> str:
    return "the one episode failed" if n == 1 else f"all {n} episodes failed"


def summarize(records: Sequence[Mapping[str, Any]], *, seed: int = 0, confidence: float = 0.95,
              resamples: int = 2000, by: Sequence[str] | None = None) -> dict[str, Any]:
    """The statistics of one run's episode records (see :func:`benchmax_gym.eval.runner.play_episode`).

    ``by``: metadata keys to break results down by (default: every key with 2 to 50 categorical
    values). Deterministic given ``seed``. Every score statistic is over the ``scored`` and
    ``truncated`` episodes only (a failure is not a score of 0); ``failure_rate`` (with its CI) and
    ``outcomes`` (the count of each) account for the rest.

    Means weigh each episode once; their CIs are a cluster bootstrap that resamples tasks (with
    all their episodes) and weighs episodes as the means do, so each estimate lies in its CI.
    ``intervals_over`` says what the CIs resample: ``"tasks"``; with one task, ``"episodes"``
    (its samples: the CI is the spread over this task's samples, not over tasks - a note says
    so); with one episode, None (no CI: ``ci_low`` and ``ci_high`` are None, a note says why).
    """
    everything = records
    outcomes = _outcomes(everything)
    records = _signal(everything, outcomes)  # a failed episode has no score
    failed = len(everything) - len(records)
    accounting = {"failure_rate": failure_rate(everything, seed=seed, confidence=confidence, resamples=resamples,
                                               outcomes=outcomes),
                  "outcomes": dict(sorted(Counter(outcomes).items()))}
    if not records:
        return {"episodes": len(everything), "scored_episodes": 0, "failed_episodes": failed, "tasks": 0,
                **accounting, "confidence": confidence,
                "notes": [_all_failed(failed) + (" (its error is in rollouts.jsonl)" if failed == 1 else
                                                  " (their errors are in rollouts.jsonl)") if failed
                          else "no episodes"]}
    ids, task_of = _codes([str(r["task_id"]) for r in records])
    # every episode once, grouped by task in ``ids`` order (each task's in the records' order);
    # ``owner``: each one's task
    grouped = np.argsort(task_of, kind="stable")
    owner = task_of[grouped]
    sizes = np.bincount(owner, minlength=len(ids))
    record_rewards = np.array([r["reward"] for r in records], dtype=float)
    record_successes = np.array([bool(r["success"]) for r in records], dtype=float)
    rewards, successes = record_rewards[grouped], record_successes[grouped]
    # What a resample draws (``unit``: each episode's, in order): tasks, or with one task its
    # episodes. Each unit's sums: a resample of units weighs each episode once, as the point
    # estimates (the means over episodes) do, so an interval always holds its estimate.
    unit, over = _units(owner, len(ids))
    units = int(unit[-1]) + 1
    unit_sizes = np.bincount(unit, minlength=units)
    unit_reward = np.bincount(unit, rewards, units)
    unit_success = np.bincount(unit, successes, units)
    options = {"seed": seed, "confidence": confidence, "resamples": resamples}
    notes = []
    if failed:
        notes.append(f"{failed} failed episodes (the endpoint or env failed; errors in rollouts.jsonl) are left out "
                     "of every statistic")
    if sizes.min() != sizes.max():
        notes.append(f"tasks have {sizes.min()} to {sizes.max()} samples: pass@k goes up to {sizes.min()}, and "
                     "means weight each task by its samples")
    if over == "episodes":
        notes.append(f"one task: its CIs resample its {len(rewards)} episodes - the spread of this task's samples, "
                     "not of a benchmark's tasks (that takes 2 or more tasks)")
    elif over is None:
        notes.append("one episode: no CI (nothing to resample)")
    elif units < FEW_TASKS:
        notes.append(_few_tasks_note(units))

    from scipy.stats import trim_mean

    distinct, codes = np.unique(rewards, return_inverse=True)
    if len(distinct) <= MAX_COUNTED_VALUES:
        # A resample is a count per task; with few distinct rewards, its IQM follows from how many
        # episodes hold each value (the sort trim_mean does is the costly part of a summary).
        per_unit = np.zeros((units, len(distinct)))
        np.add.at(per_unit, (unit, codes.reshape(-1)), 1)
        by_unit = np.column_stack([unit_reward, unit_success, unit_sizes, per_unit])

        def of_sums(sums: np.ndarray) -> np.ndarray:
            """Mean reward, success rate and IQM of resamples given as their units' summed rows."""
            return np.column_stack([sums[:, :2] / sums[:, 2:3], _iqm_of_counts(sums[:, 3:], distinct)]).T

        def per_resample(picked: np.ndarray, axis: int = -1) -> np.ndarray:
            """Mean reward, success rate and IQM of the units ``picked`` (resampled unit indices, batched)."""
            rows = picked.astype(np.intp, copy=False).reshape(-1, picked.shape[-1])
            offsets = units * np.arange(len(rows))[:, None]
            counts = np.bincount((rows + offsets).ravel(), minlength=len(rows) * units).reshape(len(rows), units)
            return of_sums(counts.astype(float) @ by_unit).reshape(3, *picked.shape[:-1])
    else:
        padded = np.full((units, unit_sizes.max()), np.nan)  # unit x sample, NaN past a unit's samples
        padded[unit, np.arange(len(rewards)) - np.repeat(np.cumsum(unit_sizes) - unit_sizes, unit_sizes)] = rewards
        equal = unit_sizes.min() == unit_sizes.max()

        def per_resample(picked: np.ndarray, axis: int = -1) -> np.ndarray:
            """Mean reward, success rate and IQM of the units ``picked`` (resampled unit indices, batched)."""
            picked = picked.astype(np.intp, copy=False)
            chosen = padded[picked].reshape(*picked.shape[:-1], -1)
            if equal:
                iqm = trim_mean(chosen, 0.25, axis=-1)
            else:
                iqm = np.array([trim_mean(row[~np.isnan(row)], 0.25) for row in chosen.reshape(-1, chosen.shape[-1])]
                               ).reshape(chosen.shape[:-1])
            episodes = unit_sizes[picked].sum(axis=-1)
            return np.stack([unit_reward[picked].sum(axis=-1) / episodes, unit_success[picked].sum(axis=-1) / episodes,
                             iqm])

    if units >= TYPED_UNITS and len(distinct) <= MAX_COUNTED_VALUES:
        reward_ci, success_ci, iqm_ci = _typed_intervals(by_unit, of_sums, **options)
    else:
        reward_ci, success_ci, iqm_ci = _intervals(units, per_resample, **options)
    if over is not None and successes.min() == successes.max():
        success_ci = _wilson(successes[0], units, confidence)
    if over is not None and rewards.min() == rewards.max():  # every episode scored the same
        if rewards[0] in (0.0, 1.0):  # a reward of 0 or 1 throughout: a share, as success is
            reward_ci = iqm_ci = _wilson(rewards[0], units, confidence)
        else:
            reward_ci = iqm_ci = (None, None)
            notes.append(f"every episode scored {rewards[0]:g}: no CI for the mean reward or IQM (an interval "
                         "would need the rewards' bounds; the success rate's is Wilson's over the "
                         f"{units} {over})")
    flat = [label for label, ci in (("mean reward", reward_ci), ("success rate", success_ci), ("IQM", iqm_ci))
            if ci[0] is not None and ci[0] == ci[1]]
    if flat:  # every resample the same though the episodes differ (the IQM of mostly-0 rewards, say)
        reward_ci, success_ci, iqm_ci = ((None, None) if ci[0] is not None and ci[0] == ci[1] else ci
                                         for ci in (reward_ci, success_ci, iqm_ci))
        notes.append(f"every resample of the {over} gave the same {' and '.join(flat)}, though the episodes differ "
                     "(the IQM, when most rewards are equal): no CI, as a zero-width interval would claim a "
                     "certainty the sample does not give")
    solved = Counter(zip(sizes.tolist(), np.bincount(owner, successes, len(ids)).astype(int).tolist()))

    starts = np.cumsum(sizes) - sizes
    played_again = sizes > 1  # GRPO groups whose advantages are all 0: tasks played twice or more, one reward
    same = (np.maximum.reduceat(rewards, starts) == np.minimum.reduceat(rewards, starts))[played_again]
    turns = sum(int(r.get("turns") or 0) for r in records)
    return {
        "episodes": len(everything),
        "scored_episodes": len(records),
        "tasks": len(ids),
        "samples_per_task": {"min": int(sizes.min()), "max": int(sizes.max())},
        "failed_episodes": failed,
        **accounting,
        "mean_reward": _estimate(rewards.mean(), reward_ci),
        "success_rate": _estimate(successes.mean(), success_ci),
        "iqm": _estimate(trim_mean(rewards, 0.25), iqm_ci),
        # tasks with the same (samples, successes) share their pass@k: computed once per pair
        "pass_at_k": {str(k): sum(pass_at_k(n, c, k) * m for (n, c), m in solved.items()) / len(ids)
                      for k in range(1, int(sizes.min()) + 1)},
        "by": _groups(records, by, record_rewards, record_successes),
        "tool_error_rate": sum(int(r.get("tool_errors") or 0) for r in records) / turns if turns else 0.0,
        "parse_error_rate": sum(int(r.get("parse_errors") or 0) for r in records) / turns if turns else 0.0,
        "turns_mean": turns / len(records),
        "prompt_tokens_mean": _mean([r.get("prompt_tokens") for r in records]),
        "completion_tokens_mean": _mean([r.get("completion_tokens") for r in records]),
        "length_cut_turns": sum(int(r.get("finish_reason_length") or 0) for r in records),
        "confidence": confidence,
        "intervals_over": over,
        "notes": notes,
        "zero_variance_groups": float(same.mean()) if len(same) else None,
        **_by_member(everything, seed=seed, confidence=confidence, resamples=resamples),
    }


def zero_variance_share(records: Sequence[Mapping[str, Any]],
                        tasks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> float | None:
    """The share of tasks played at least twice whose graded episodes all got the same reward:
    GRPO groups whose advantages are all 0 (None: no task played twice). Failures are not in
    ``records``; ``tasks``: ``records`` grouped by task already."""
    groups = [[r["reward"] for r in rs] for rs in (tasks or _by_task(records)).values() if len(rs) > 1]
    return sum(max(g) == min(g) for g in groups) / len(groups) if groups else None


def _by_member(records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Any]:
    """A mixture's run (records with ``member``, benchmax/Mix-v0): each member's own summary (CIs
    included) and its zero-variance share per difficulty level; nothing for another env's run.
    ``records``: every episode, failed ones too, so each member's failures are counted as its own."""
    members: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("member") is not None:
            members[str(r["member"])].append(r)
    if not members:
        return {}
    out = {}
    for name, rs in sorted(members.items()):
        summary = summarize([{k: v for k, v in r.items() if k != "member"} for r in rs], by=[], **options)
        levels: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in rs:
            levels[str(r.get("difficulty", 0))].append(r)
        summary["zero_variance_by_difficulty"] = {level: zero_variance_share(_signal(group))
                                                  for level, group in sorted(levels.items())}
        summary.pop("by", None)
        out[name] = summary
    return {"by_member": out}


def probability_of_improvement(x: Sequence[float], y: Sequence[float]) -> float:
    """P(X > Y) + P(X = Y) / 2 for one task's episodes of two runs (Mann-Whitney U / (n m))."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(x, y).statistic / (len(x) * len(y)))


def _poi_by_task(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`probability_of_improvement` of each task's pair of samples: one scipy call for all the
    tasks of each pair of sample counts (a call a task cost 0.6-0.8 ms of scipy's own overhead:
    0.3-0.4 s at 500 tasks, against 1-3 ms batched, on 2 cores)."""
    from scipy.stats import mannwhitneyu

    poi = np.empty(len(xs))
    shapes: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (x, y) in enumerate(zip(xs, ys)):
        shapes[len(x), len(y)].append(i)
    for (n, m), tasks in shapes.items():
        u = mannwhitneyu(np.array([xs[i] for i in tasks]), np.array([ys[i] for i in tasks]), axis=1).statistic
        poi[tasks] = u / (n * m)
    return poi


def _poi_of_counts(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`probability_of_improvement` of each row pair: ``x[r, j]`` and ``y[r, j]`` episodes of
    the two runs hold the ``j``-th distinct reward (sorted ascending)."""
    below = np.cumsum(y, axis=-1) - y  # episodes of y under each value
    return (x * (below + 0.5 * y)).sum(axis=-1) / (x.sum(axis=-1) * y.sum(axis=-1))


def compare(runs: Mapping[str, Sequence[Mapping[str, Any]]], *, baseline: str | None = None, seed: int = 0,
            confidence: float = 0.95, resamples: int = 2000) -> dict[str, Any]:
    """Paired comparison on the tasks every run has (their ``scored`` and ``truncated`` episodes).

    ``mean_reward``: each run's mean over its episodes of the shared tasks, each task weighed the
    same in every run: by the harmonic mean of the runs' sample counts of it. Where the runs' counts
    are in proportion (the same ``-k``, the same failures) that weighs each episode once, as
    :func:`summarize` does (it is the mean ``summarize`` gives those episodes); where they are not
    (failures on other tasks, an unfinished run), each run weighing its own episodes would weigh
    the tasks differently, and two runs alike on every task could differ (a note says so). Each
    run's ``mean_difference`` from ``baseline`` (default: the first run) is the difference of those
    means, with a paired cluster bootstrap CI: a resample draws tasks, the same for both runs, and
    weighs them as the means do, so the difference lies in its CI (with one 0/1 reward per task and
    run, Tango's score interval for paired proportions instead: see :func:`_tango_paired`). The probability of
    improvement is rliable's: per task, P(X > Y) + P(X = Y) / 2 over the two runs' episodes,
    averaged over tasks (each task once), its CI from the same resamples. ``per_task`` and
    ``tasks_better`` / ``tasks_worse`` / ``tasks_tied`` are over each task's mean reward.

    With one shared task there are no tasks to resample: the CIs resample each run's episodes of
    that task on their own (``intervals_over`` is ``"episodes"``, and a note says the CIs are
    over samples of one task, not over tasks); with only one episode of it in a run, there is no
    CI (None; ``intervals_over`` None).
    """
    names = list(runs)
    if len(names) < 2:
        raise ValueError("compare needs at least two runs")
    baseline = names[0] if baseline is None else baseline
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {names}")
    grouped = {name: _by_task(_signal(records)) for name, records in runs.items()}
    shared = sorted(set.intersection(*(set(g) for g in grouped.values())))
    if not shared:
        raise ValueError("the runs share no task")
    options = {"seed": seed, "confidence": confidence, "resamples": resamples}
    # each run's rewards on each shared task
    rewards = {name: [np.array([r["reward"] for r in grouped[name][t]], dtype=float) for t in shared]
               for name in names}
    sizes = {name: np.array([len(v) for v in rewards[name]], dtype=float) for name in names}
    means = {name: np.array([v.mean() for v in rewards[name]]) for name in names}  # per task
    # Each task's weight, the same in every run (each run weighing its own episodes would weigh the
    # tasks unlike: a run failing on the hard tasks would gain from it); in proportion to each run's
    # sample counts where those are in proportion, so then each episode weighs once.
    weights = len(names) / sum(1 / sizes[name] for name in names)
    sums = {name: weights * means[name] for name in names}  # what a resample of tasks adds up
    overall = {name: float(sums[name].sum() / weights.sum()) for name in names}
    notes: list[str] = []
    unlike = [name for name in names if not np.allclose(sizes[name] / sizes[name].sum(), weights / weights.sum())]
    if unlike:
        notes.append(f"the runs played the shared tasks unequal numbers of times ({', '.join(unlike)}: failures, "
                     "or an unfinished run): each task weighs the same in every run (the harmonic mean of its "
                     "sample counts), so a mean here is not its run's summary over these tasks")
    over: str | None = "tasks"
    if len(shared) == 1:
        few = [name for name in names if sizes[name][0] < 2]
        over = None if few else "episodes"
        notes.append(f"one shared task: no CI ({', '.join(few)} played it once; nothing to resample)" if few else
                     "one shared task: the CIs resample each run's episodes of it - the spread of this task's "
                     "samples, not of a benchmark's tasks (that takes 2 or more shared tasks)")
    elif len(shared) < FEW_TASKS:
        notes.append(_few_tasks_note(len(shared)))
    against = {}
    for name in names:
        if name == baseline:
            continue
        diff = means[name] - means[baseline]
        poi = _poi_by_task(rewards[name], rewards[baseline])
        if over == "episodes":  # one task: each run's episodes resampled on their own (they are not paired)
            x, y = rewards[name][0], rewards[baseline][0]
            distinct, codes = np.unique(np.concatenate([x, y]), return_inverse=True)
            x_codes, y_codes = codes[:len(x)], codes[len(x):]

            def counts(chosen: np.ndarray, m: int = len(distinct)) -> np.ndarray:
                rows = chosen.reshape(-1, chosen.shape[-1])
                flat = (rows + m * np.arange(len(rows))[:, None]).ravel()
                return np.bincount(flat, minlength=len(rows) * m).reshape(len(rows), m).astype(float)

            def statistic(ix: np.ndarray, iy: np.ndarray, axis: int = -1, x=x, y=y, xc=x_codes, yc=y_codes,
                          counts=counts) -> np.ndarray:
                ix, iy = ix.astype(np.intp, copy=False), iy.astype(np.intp, copy=False)
                out = np.stack([x[ix].mean(axis=-1) - y[iy].mean(axis=-1),
                                _poi_of_counts(counts(xc[ix]), counts(yc[iy])).reshape(ix.shape[:-1])])
                return out

            diff_ci, poi_ci = _intervals((len(x), len(y)), statistic, **options)
        else:  # tasks, paired: the same resampled tasks for both runs
            by_task = np.column_stack([sums[name] - sums[baseline], weights, poi])

            def statistic(picked: np.ndarray, axis: int = -1, by_task=by_task) -> np.ndarray:
                rows = picked.astype(np.intp, copy=False).reshape(-1, picked.shape[-1])
                n = len(by_task)
                chosen = np.bincount((rows + n * np.arange(len(rows))[:, None]).ravel(),
                                     minlength=len(rows) * n).reshape(len(rows), n).astype(float)
                total = chosen @ by_task
                out = np.stack([total[:, 0] / total[:, 1], total[:, 2] / rows.shape[1]])
                return out.reshape(2, *picked.shape[:-1])

            diff_ci, poi_ci = _intervals(len(shared), statistic, **options)
        pairs = over == "tasks" and all(len(v) == 1 and v[0] in (0.0, 1.0) for run in (name, baseline)
                                        for v in rewards[run])
        if pairs:  # one 0/1 outcome per task and run: paired proportions (the bootstrap's interval was too narrow)
            diff_ci = _tango_paired(np.concatenate(rewards[name]), np.concatenate(rewards[baseline]), confidence)
        if diff_ci[0] is not None and diff_ci[0] == diff_ci[1]:  # every resample the same: no spread shown
            units = [len(shared)] * 2 if over == "tasks" else [int(sizes[name][0]), int(sizes[baseline][0])]
            binary = all(np.isin(v, (0.0, 1.0)).all() for run in (name, baseline) for v in rewards[run])
            diff_ci = _newcombe(overall[name], overall[baseline], *units, confidence) if binary else (None, None)
        if poi_ci[0] is not None and poi_ci[0] == poi_ci[1]:
            poi_ci = (None, None)
        if None in (*diff_ci, *poi_ci) and over is not None:
            notes.append(f"{name}: every resample of the {over} gave the same value, so no bootstrap interval "
                         "shows its uncertainty: the difference of rewards of 0 or 1 takes Newcombe's score "
                         "interval, anything else has no CI")
        against[name] = {
            "mean_difference": _estimate(overall[name] - overall[baseline], diff_ci),
            "probability_of_improvement": _estimate(poi.mean(), poi_ci),
            "tasks_better": int((diff > 0).sum()), "tasks_worse": int((diff < 0).sum()),
            "tasks_tied": int((diff == 0).sum()),
        }
    if len(against) > 1:  # several looks at one baseline: one of them may exclude 0 by chance
        notes.append(f"{len(against)} runs compared with {baseline}: each CI is {confidence:.0%} on its own, "
                     f"not for all at once (for that, Bonferroni: {1 - (1 - confidence) / len(against):.1%} each)")
    return {
        "baseline": baseline,
        "runs": names,
        "shared_tasks": len(shared),
        "dropped_tasks": {name: len(grouped[name]) - len(shared) for name in names},
        "mean_reward": overall,
        "episodes": {name: int(sizes[name].sum()) for name in names},
        # over each run's episodes: means of runs failing at different rates are not comparable
        "failure_rate": {name: failure_rate(runs[name], seed=seed, confidence=confidence,
                                            resamples=resamples)["value"] for name in names},
        "against_baseline": against,
        "per_task": [{"task_id": t, **{name: float(means[name][i]) for name in names}} for i, t in enumerate(shared)],
        "confidence": confidence,
        "intervals_over": over,
        "notes": notes,
    }


def _ci(estimate: Mapping[str, Any]) -> str:
    if estimate.get("ci_low") is None:
        return f"{estimate['value']:.3f}"
    return f"{estimate['value']:.3f} [{estimate['ci_low']:.3f}, {estimate['ci_high']:.3f}]"


def _table(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _accounting_rows(summary: Mapping[str, Any], level: str) -> list[tuple[str, str]]:
    """The failure rate (CI) and the count by outcome (summaries written before outcomes have neither)."""
    rows = []
    if "failure_rate" in summary:
        rows.append((f"failure rate ({level})", _ci(summary["failure_rate"])))
    if summary.get("outcomes"):
        rows.append(("outcomes", "  ".join(f"{name} {n}" for name, n in summary["outcomes"].items())))
    return rows


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as a compact text table (CIs as [low, high])."""
    if not summary.get("episodes") or (not summary.get("scored_episodes") and "outcomes" not in summary):
        return "; ".join(summary.get("notes") or ["no episodes"])
    if not summary.get("scored_episodes"):  # every episode failed: the accounting is all there is
        level = f"{summary.get('confidence', 0.95):.0%} CI"
        return _table([("episodes", f"{summary['episodes']}, none scored"), *_accounting_rows(summary, level),
                       *[("note", n) for n in summary.get("notes", [])]])
    level = _level(summary)
    rows = [
        ("episodes", f"{summary['episodes']} over {summary['tasks']} tasks ({summary['failed_episodes']} failed"
                     f"{', left out' if summary['failed_episodes'] else ''})"),
        *_accounting_rows(summary, level),
        (f"mean reward ({level})", _ci(summary["mean_reward"])),
        (f"success rate ({level})", _ci(summary["success_rate"])),
        (f"IQM ({level})", _ci(summary["iqm"])),
        ("pass@k", "  ".join(f"@{k} {v:.3f}" for k, v in summary["pass_at_k"].items())),
        ("turns per episode", f"{summary['turns_mean']:.2f}"),
        ("tool / parse errors", f"{summary['tool_error_rate']:.3f} / {summary['parse_error_rate']:.3f} per turn"),
    ]
    if summary.get("completion_tokens_mean") is not None:
        rows.append(("tokens per episode", f"{summary['prompt_tokens_mean']:.0f} prompt, "
                                           f"{summary['completion_tokens_mean']:.0f} completion"))
    if summary.get("length_cut_turns"):
        rows.append(("turns cut by max tokens", str(summary["length_cut_turns"])))
    for key, cells in summary.get("by", {}).items():
        more = f"  (+{len(cells) - MAX_SHOWN_GROUPS} more in summary.json)" if len(cells) > MAX_SHOWN_GROUPS else ""
        rows.append((f"by {key}", "  ".join(f"{v}: {c['mean_reward']:.3f} (n={c['episodes']})"
                                            for v, c in list(cells.items())[:MAX_SHOWN_GROUPS]) + more))
    for name, member in summary.get("by_member", {}).items():
        failed = f", {member['failed_episodes']} failed" if member.get("failed_episodes") else ""
        if member.get("scored_episodes"):
            rows.append((f"member {name}", f"reward {_ci(member['mean_reward'])}  success {_ci(member['success_rate'])}"
                                           f"  (n={member['scored_episodes']}{failed})"))
        elif member.get("failed_episodes"):
            rows.append((f"member {name}", _all_failed(member["failed_episodes"])))
    rows += [("note", n) for n in summary.get("notes", [])]
    return _table(rows)


def _level(result: Mapping[str, Any]) -> str:
    """The CI columns' label: the level, and what the CIs resample when not tasks."""
    over = result.get("intervals_over", "tasks")
    if over is None:
        return "no CI"
    return f"{result['confidence']:.0%} CI" + (" over episodes" if over == "episodes" else "")


def format_compare(result: Mapping[str, Any]) -> str:
    """A side-by-side table: each run's mean reward, its difference from the baseline and its
    probability of improvement over it."""
    level = _level(result)
    width = max(len(n) for n in result["runs"])
    rates = result.get("failure_rate") or {}
    lines = [f"{result['shared_tasks']} shared tasks; baseline {result['baseline']}"
             + (f"; failure rates {', '.join(f'{n} {rates[n]:.3f}' for n in result['runs'])}" if rates else ""),
             f"{'run':<{width}}  {'mean reward':>11}  {'difference (' + level + ')':<30}  P(improvement) ({level})"]
    for name in result["runs"]:
        row = result["against_baseline"].get(name)
        diff = _ci(row["mean_difference"]) if row else "-"
        poi = _ci(row["probability_of_improvement"]) if row else "-"
        lines.append(f"{name:<{width}}  {result['mean_reward'][name]:>11.3f}  {diff:<30}  {poi}")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)
