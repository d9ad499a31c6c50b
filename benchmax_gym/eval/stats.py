"""Statistics of an eval run and of a comparison between runs, with confidence intervals.

Tasks are the unit of resampling: a benchmark is a sample of tasks, and samples of one task are
not independent of each other. So CIs are percentile bootstrap intervals over tasks
(``scipy.stats.bootstrap``); IQM is ``scipy.stats.trim_mean(x, 0.25)`` over episodes, its CI
resampling tasks with all their episodes. pass@k is the unbiased estimator of the Codex paper;
the probability of improvement is rliable's: per task, P(X > Y) + P(X = Y) / 2 over the two
runs' episodes (the Mann-Whitney U over n*m), averaged over tasks. (rliable itself does not
import with this machine's pandas, and its stratified bootstrap keeps tasks fixed, which gives
no interval with one sample per task - the common case for LLM evals.)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

MAX_GROUPS = 50  # a metadata key with more distinct values is not broken down by
MAX_SHOWN_GROUPS = 8  # the text summary shows this many groups of a key (summary.json has all)
MAX_COUNTED_VALUES = 64  # at most this many distinct rewards: IQM intervals from counts, not sorts


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` samples drawn from ``n`` (``c`` of them correct) is
    correct: ``1 - C(n-c, k) / C(n, k)``, as a product (no huge binomials)."""
    if not 0 <= c <= n or not 0 < k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 0 < k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _intervals(n: int, statistic: Callable[..., Any], *, seed: int, confidence: float,
               resamples: int) -> list[tuple[float, float]]:
    """Percentile bootstrap intervals of each output of ``statistic(tasks, axis=-1)`` - a function
    of resampled task indices, vectorised over resamples, returning one row per output. One
    resampling serves them all (each alone would draw the same indices from ``seed``); with one
    task the value is its own interval."""
    from scipy.stats import bootstrap

    if n < 2:
        values = np.atleast_1d(statistic(np.arange(n), axis=-1))
        return [(float(v), float(v)) for v in values]
    result = bootstrap((np.arange(n),), statistic, confidence_level=confidence, n_resamples=resamples, batch=200,
                       method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    low, high = np.atleast_1d(result.confidence_interval.low), np.atleast_1d(result.confidence_interval.high)
    return [(float(a), float(b)) for a, b in zip(low, high)]


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


def _groups(records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    if keys is None:
        seen: dict[str, set] = defaultdict(set)
        for r in records:
            for key, value in (r.get("metadata") or {}).items():
                if isinstance(value, (str, int, bool)) or value is None:
                    seen[key].add(value)
                else:
                    seen[key].add(object())  # not a category: rules the key out
        keys = [k for k, values in seen.items() if 1 < len(values) <= MAX_GROUPS
                and all(isinstance(v, (str, int, bool)) or v is None for v in values)]
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(keys):
        cells: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in records:
            cells[str((r.get("metadata") or {}).get(key))].append(r)
        out[key] = {value: {"episodes": len(rs), "mean_reward": float(np.mean([r["reward"] for r in rs])),
                            "success_rate": float(np.mean([bool(r["success"]) for r in rs]))}
                    for value, rs in sorted(cells.items())}
    return out


def _signal(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``scored`` and ``truncated`` episodes: the only ones whose reward is a score (issue 29)."""
    from benchmax_gym.core.outcomes import SIGNAL
    from benchmax_gym.eval.runner import outcome_of

    return [r for r in records if outcome_of(r) in SIGNAL]


def outcome_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many episodes ended with each outcome (only those that occur), by name."""
    from benchmax_gym.eval.runner import outcome_of

    return dict(sorted(Counter(outcome_of(r) for r in records).items()))


def failure_rate(records: Sequence[Mapping[str, Any]], *, seed: int = 0, confidence: float = 0.95,
                 resamples: int = 2000) -> dict[str, float | None]:
    """The share of failed episodes, with a bootstrap CI over tasks (by ``task_index``: a failed
    episode may have no task id): a run's failures cluster by task as its scores do."""
    from benchmax_gym.core.outcomes import is_failure
    from benchmax_gym.eval.runner import outcome_of

    if not records:
        return {"value": 0.0, "ci_low": None, "ci_high": None}
    index = {t: i for i, t in enumerate(sorted({r["task_index"] for r in records}))}
    owner = np.array([index[r["task_index"]] for r in records])
    sizes = np.bincount(owner, minlength=len(index)).astype(float)
    failed = np.bincount(owner, [float(is_failure(outcome_of(r))) for r in records], len(index))
    value = failed.sum() / sizes.sum()
    if value in (0.0, 1.0):  # every resample is the same: no bootstrap (it would warn of degenerate data)
        return _estimate(value, (float(value), float(value)))

    def per_resample(picked: np.ndarray, axis: int = -1) -> np.ndarray:
        picked = picked.astype(np.intp, copy=False)
        return (failed[picked].sum(axis=-1) / sizes[picked].sum(axis=-1))[None]

    (ci,) = _intervals(len(index), per_resample, seed=seed, confidence=confidence, resamples=resamples)
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


def summarize(records: Sequence[Mapping[str, Any]], *, seed: int = 0, confidence: float = 0.95,
              resamples: int = 2000, by: Sequence[str] | None = None) -> dict[str, Any]:
    """The statistics of one run's episode records (see :func:`benchmax_gym.eval.runner.play_episode`).

    ``by``: metadata keys to break results down by (default: every key with 2 to 50 categorical
    values). Deterministic given ``seed``. Every score statistic is over the ``scored`` and
    ``truncated`` episodes only (a failure is not a score of 0); ``failure_rate`` (with its CI) and
    ``outcomes`` (the count of each) account for the rest.
    """
    everything = records
    records = _signal(records)  # a failed episode has no score
    failed = len(everything) - len(records)
    accounting = {"failure_rate": failure_rate(everything, seed=seed, confidence=confidence, resamples=resamples),
                  "outcomes": outcome_counts(everything)}
    if not records:
        return {"episodes": len(everything), "scored_episodes": 0, "failed_episodes": failed, "tasks": 0,
                **accounting, "confidence": confidence,
                "notes": [f"all {failed} episodes failed (their errors are in rollouts.jsonl)" if failed
                          else "no episodes"]}
    tasks = _by_task(records)
    ids = sorted(tasks)
    rows = [tasks[t] for t in ids]
    sizes = np.array([len(rs) for rs in rows])
    # every episode once, grouped by task in ``ids`` order; ``owner``: each one's task
    rewards = np.array([r["reward"] for rs in rows for r in rs], dtype=float)
    successes = np.array([bool(r["success"]) for rs in rows for r in rs], dtype=float)
    owner = np.repeat(np.arange(len(ids)), sizes)
    # each task's sums: a resample of tasks (a cluster bootstrap) weighs each episode once, as the
    # point estimates (the means over episodes) do, so an interval always holds its estimate
    task_reward = np.bincount(owner, rewards, len(ids))
    task_success = np.bincount(owner, successes, len(ids))
    options = {"seed": seed, "confidence": confidence, "resamples": resamples}
    notes = []
    if failed:
        notes.append(f"{failed} failed episodes (the endpoint or env failed; errors in rollouts.jsonl) are left out "
                     "of every statistic")
    if sizes.min() != sizes.max():
        notes.append(f"tasks have {sizes.min()} to {sizes.max()} samples: pass@k goes up to {sizes.min()}, and "
                     "means weight each task by its samples")

    from scipy.stats import trim_mean

    distinct, codes = np.unique(rewards, return_inverse=True)
    if len(distinct) <= MAX_COUNTED_VALUES:
        # A resample is a count per task; with few distinct rewards, its IQM follows from how many
        # episodes hold each value (the sort trim_mean does is the costly part of a summary).
        per_task = np.zeros((len(ids), len(distinct)))
        np.add.at(per_task, (owner, codes.reshape(-1)), 1)
        by_task = np.column_stack([task_reward, task_success, sizes, per_task])

        def per_resample(picked: np.ndarray, axis: int = -1) -> np.ndarray:
            """Mean reward, success rate and IQM of the tasks ``picked`` (resampled task indices, batched)."""
            rows = picked.astype(np.intp, copy=False).reshape(-1, picked.shape[-1])
            offsets = len(ids) * np.arange(len(rows))[:, None]
            counts = np.bincount((rows + offsets).ravel(), minlength=rows.size).reshape(len(rows), len(ids))
            sums = counts.astype(float) @ by_task
            out = np.column_stack([sums[:, :2] / sums[:, 2:3], _iqm_of_counts(sums[:, 3:], distinct)])
            return out.T.reshape(3, *picked.shape[:-1])
    else:
        padded = np.full((len(ids), sizes.max()), np.nan)  # task x sample, NaN past a task's samples
        padded[owner, np.arange(len(rewards)) - np.repeat(np.cumsum(sizes) - sizes, sizes)] = rewards
        equal = sizes.min() == sizes.max()

        def per_resample(picked: np.ndarray, axis: int = -1) -> np.ndarray:
            """Mean reward, success rate and IQM of the tasks ``picked`` (resampled task indices, batched)."""
            picked = picked.astype(np.intp, copy=False)
            chosen = padded[picked].reshape(*picked.shape[:-1], -1)
            if equal:
                iqm = trim_mean(chosen, 0.25, axis=-1)
            else:
                iqm = np.array([trim_mean(row[~np.isnan(row)], 0.25) for row in chosen.reshape(-1, chosen.shape[-1])]
                               ).reshape(chosen.shape[:-1])
            episodes = sizes[picked].sum(axis=-1)
            return np.stack([task_reward[picked].sum(axis=-1) / episodes, task_success[picked].sum(axis=-1) / episodes,
                             iqm])

    reward_ci, success_ci, iqm_ci = _intervals(len(ids), per_resample, **options)
    solved = Counter(zip(sizes.tolist(), np.bincount(owner, successes, len(ids)).astype(int).tolist()))

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
        "by": _groups(records, by),
        "tool_error_rate": sum(int(r.get("tool_errors") or 0) for r in records) / turns if turns else 0.0,
        "parse_error_rate": sum(int(r.get("parse_errors") or 0) for r in records) / turns if turns else 0.0,
        "turns_mean": turns / len(records),
        "prompt_tokens_mean": _mean([r.get("prompt_tokens") for r in records]),
        "completion_tokens_mean": _mean([r.get("completion_tokens") for r in records]),
        "length_cut_turns": sum(int(r.get("finish_reason_length") or 0) for r in records),
        "confidence": confidence,
        "notes": notes,
        "zero_variance_groups": zero_variance_share(records),
        **_by_member(records, seed=seed, confidence=confidence, resamples=resamples),
    }


def zero_variance_share(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The share of tasks played at least twice whose graded episodes all got the same reward:
    GRPO groups whose advantages are all 0 (None: no task played twice). Failures are not in ``records``."""
    groups = [[r["reward"] for r in rs] for rs in _by_task(records).values() if len(rs) > 1]
    return sum(max(g) == min(g) for g in groups) / len(groups) if groups else None


def _by_member(records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Any]:
    """A mixture's run (records with ``member``, benchmax/Mix-v0): each member's own summary (CIs
    included) and its zero-variance share per difficulty level; nothing for another env's run."""
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
        summary["zero_variance_by_difficulty"] = {level: zero_variance_share(group) for level, group in sorted(levels.items())}
        summary.pop("by", None)
        out[name] = summary
    return {"by_member": out}


def probability_of_improvement(x: Sequence[float], y: Sequence[float]) -> float:
    """P(X > Y) + P(X = Y) / 2 for one task's episodes of two runs (Mann-Whitney U / (n m))."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(x, y).statistic / (len(x) * len(y)))


def compare(runs: Mapping[str, Sequence[Mapping[str, Any]]], *, baseline: str | None = None, seed: int = 0,
            confidence: float = 0.95, resamples: int = 2000) -> dict[str, Any]:
    """Paired comparison on the tasks every run has: per-task mean rewards, each run's mean
    difference from ``baseline`` (default: the first run) and its probability of improvement
    over it, with bootstrap CIs over tasks."""
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
    means = {name: np.array([np.mean([r["reward"] for r in grouped[name][t]]) for t in shared]) for name in names}
    against = {}
    for name in names:
        if name == baseline:
            continue
        diff = means[name] - means[baseline]
        poi = np.array([probability_of_improvement([r["reward"] for r in grouped[name][t]],
                                                   [r["reward"] for r in grouped[baseline][t]]) for t in shared])
        both = np.stack([diff, poi])
        diff_ci, poi_ci = _intervals(len(shared), lambda picked, axis=-1, both=both: both[
            :, picked.astype(np.intp, copy=False)].mean(axis=-1), **options)
        against[name] = {
            "mean_difference": _estimate(diff.mean(), diff_ci),
            "probability_of_improvement": _estimate(poi.mean(), poi_ci),
            "tasks_better": int((diff > 0).sum()), "tasks_worse": int((diff < 0).sum()),
            "tasks_tied": int((diff == 0).sum()),
        }
    return {
        "baseline": baseline,
        "runs": names,
        "shared_tasks": len(shared),
        "dropped_tasks": {name: len(grouped[name]) - len(shared) for name in names},
        "mean_reward": {name: float(means[name].mean()) for name in names},
        # over each run's episodes: means of runs failing at different rates are not comparable
        "failure_rate": {name: failure_rate(runs[name], seed=seed, confidence=confidence,
                                            resamples=resamples)["value"] for name in names},
        "against_baseline": against,
        "per_task": [{"task_id": t, **{name: float(means[name][i]) for name in names}} for i, t in enumerate(shared)],
        "confidence": confidence,
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
    level = f"{summary['confidence']:.0%} CI"
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
        if member.get("scored_episodes"):
            rows.append((f"member {name}", f"reward {_ci(member['mean_reward'])}  success {_ci(member['success_rate'])}"
                                           f"  (n={member['scored_episodes']})"))
    rows += [("note", n) for n in summary.get("notes", [])]
    return _table(rows)


def format_compare(result: Mapping[str, Any]) -> str:
    """A side-by-side table: each run's mean reward, its difference from the baseline and its
    probability of improvement over it."""
    level = f"{result['confidence']:.0%} CI"
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
    return "\n".join(lines)
