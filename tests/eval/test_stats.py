"""Eval statistics against values computed by hand on small fixed inputs."""

import math

import pytest

from benchmax_gym.eval.plots import plot_compare, plot_run
from benchmax_gym.eval.stats import compare, format_compare, format_summary, pass_at_k, probability_of_improvement, summarize


def rec(task, sample, reward, success=None, **extra):
    return {"task_id": task, "task_index": int(task[1:]), "sample": sample, "reward": reward,
            "success": reward >= 1.0 if success is None else success, "metadata": extra.pop("metadata", {}),
            "turns": extra.pop("turns", 1), "tool_errors": extra.pop("tool_errors", 0),
            "parse_errors": extra.pop("parse_errors", 0), "prompt_tokens": 10, "completion_tokens": 5,
            "error": None, "finish_reason_length": extra.pop("finish_reason_length", 0)}


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 2 / 5),
    (5, 2, 2, 1 - (3 * 2) / (5 * 4)),  # 1 - C(3,2)/C(5,2)
    (5, 0, 3, 0.0),
    (5, 5, 1, 1.0),
    (4, 3, 2, 1.0),  # n - c < k: any 2 of 4 include a correct one
    (10, 3, 4, 1 - math.comb(7, 4) / math.comb(10, 4)),
])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_summary_of_a_small_run_by_hand():
    # t0: 1, 1 (both solved); t1: 0, 1; t2: 0, 0; t3: 0.5, 0.5
    records = [rec("t0", 0, 1.0), rec("t0", 1, 1.0), rec("t1", 0, 0.0), rec("t1", 1, 1.0),
               rec("t2", 0, 0.0, turns=3, tool_errors=2), rec("t2", 1, 0.0, parse_errors=1),
               rec("t3", 0, 0.5, metadata={"kind": "a"}), rec("t3", 1, 0.5, finish_reason_length=1)]
    s = summarize(records, seed=1)
    assert s["episodes"] == 8 and s["tasks"] == 4 and s["samples_per_task"] == {"min": 2, "max": 2}
    assert s["mean_reward"]["value"] == pytest.approx(4.0 / 8)
    assert s["success_rate"]["value"] == pytest.approx(3 / 8)
    # sorted rewards 0 0 0 .5 .5 1 1 1: the middle half is 0 .5 .5 1
    assert s["iqm"]["value"] == pytest.approx(0.5)
    # pass@1 per task 1, .5, 0, 0 -> .375; pass@2: 1, 1, 0, 0 -> .5
    assert s["pass_at_k"] == {"1": pytest.approx(0.375), "2": pytest.approx(0.5)}
    assert s["turns_mean"] == pytest.approx(10 / 8)
    assert s["tool_error_rate"] == pytest.approx(2 / 10) and s["parse_error_rate"] == pytest.approx(1 / 10)
    assert s["length_cut_turns"] == 1 and s["prompt_tokens_mean"] == 10
    assert s["by"] == {}  # one value of "kind" is no breakdown
    assert summarize(records, by=["kind"])["by"]["kind"] == {"None": {"episodes": 7, "mean_reward": pytest.approx(3.5 / 7), "success_rate": pytest.approx(3 / 7)},
                               "a": {"episodes": 1, "mean_reward": 0.5, "success_rate": 0.0}}
    for key in ("mean_reward", "success_rate", "iqm"):
        assert s[key]["ci_low"] <= s[key]["value"] <= s[key]["ci_high"], key
    assert summarize(records, seed=1) == s  # deterministic given the seed
    assert "pass@k" in format_summary(s) and "[" in format_summary(s)


def test_intervals_narrow_with_more_tasks():
    def run(tasks):
        return [rec(f"t{i}", 0, float(i % 2)) for i in range(tasks)]

    small, large = summarize(run(10))["mean_reward"], summarize(run(400))["mean_reward"]
    assert small["ci_low"] < 0.5 < small["ci_high"] and large["ci_low"] < 0.5 < large["ci_high"]
    assert large["ci_high"] - large["ci_low"] < (small["ci_high"] - small["ci_low"]) / 3


def test_unequal_samples_are_noted():
    s = summarize([rec("t0", 0, 1.0), rec("t0", 1, 0.0), rec("t1", 0, 1.0)])
    assert s["pass_at_k"].keys() == {"1"} and "1 to 2 samples" in s["notes"][0]


def test_probability_of_improvement_by_hand():
    assert probability_of_improvement([1, 1], [0, 0]) == 1.0
    assert probability_of_improvement([1, 0], [1, 0]) == 0.5
    assert probability_of_improvement([1, 0], [0, 0]) == pytest.approx(0.75)  # pairs: >,>,=,= -> (2 + 1) / 4


def test_compare_a_run_better_on_every_task():
    base = [rec(f"t{i}", s, 0.0) for i in range(20) for s in range(2)]
    better = [rec(f"t{i}", s, 1.0) for i in range(20) for s in range(2)] + [rec("t99", 0, 1.0)]
    result = compare({"base": base, "better": better})
    row = result["against_baseline"]["better"]
    assert result["shared_tasks"] == 20 and result["dropped_tasks"] == {"base": 0, "better": 1}
    assert row["probability_of_improvement"]["value"] == 1.0 and row["tasks_better"] == 20
    assert row["mean_difference"]["value"] == 1.0 and row["mean_difference"]["ci_low"] > 0
    mixed = [rec(f"t{i}", s, float(i % 2)) for i in range(20) for s in range(2)]
    row = compare({"base": base, "mixed": mixed})["against_baseline"]["mixed"]
    assert row["probability_of_improvement"]["value"] == pytest.approx(0.75)
    assert row["mean_difference"]["ci_low"] < 0.5 < row["mean_difference"]["ci_high"]
    assert "P(improvement)" in format_compare(result)
    with pytest.raises(ValueError, match="share no task"):
        compare({"a": base, "b": [rec("t50", 0, 1.0)]})


def test_plots_are_png_files(tmp_path):
    records = [rec(f"t{i}", s, float((i + s) % 2)) for i in range(6) for s in range(3)]
    for path in plot_run(records, summarize(records), tmp_path) + plot_compare(
            compare({"a": records, "b": [{**r, "reward": 1.0} for r in records]}), tmp_path):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


@pytest.mark.parametrize("samples", [1, 4, "mixed"])
def test_intervals_from_reward_counts_match_the_sorting_path(samples, monkeypatch):
    """With few distinct rewards the IQM of each resample comes from counts; the intervals must be
    those of trim_mean over the resampled episodes (the path for many distinct rewards)."""
    import random

    import benchmax_gym.eval.stats as stats

    rnd = random.Random(7)
    records = [rec(f"t{t}", s, rnd.choice([0.0, 0.25, 0.5, 1.0]))
               for t in range(60) for s in range(rnd.randint(1, 5) if samples == "mixed" else samples)]
    counted = summarize(records, seed=2)
    monkeypatch.setattr(stats, "MAX_COUNTED_VALUES", 0)
    sorted_ = summarize(records, seed=2)
    for key in ("mean_reward", "success_rate", "iqm"):
        for bound in ("value", "ci_low", "ci_high"):
            assert counted[key][bound] == pytest.approx(sorted_[key][bound], abs=1e-12), (key, bound)
    assert counted["iqm"]["ci_low"] < counted["iqm"]["ci_high"]


def test_failed_episodes_are_left_out_and_said_so():
    records = [rec("t0", 0, 1.0), rec("t1", 0, 1.0), {**rec("t2", 0, 0.0), "reward": None, "error": "endpoint 500"}]
    s = summarize(records)
    assert s["episodes"] == 3 and s["scored_episodes"] == 2 and s["failed_episodes"] == 1
    assert s["mean_reward"]["value"] == 1.0 and s["tasks"] == 2  # not 2/3: a failure is no zero
    assert "1 failed, left out" in format_summary(s)
    everything_failed = summarize([{**rec("t0", 0, 0.0), "reward": None, "error": "x"}])
    assert "the one episode failed (its error is in rollouts.jsonl)" in format_summary(everything_failed)
    two_failed = summarize([{**rec(t, 0, 0.0), "reward": None, "error": "x"} for t in ("t0", "t1")])
    assert "all 2 episodes failed (their errors are in rollouts.jsonl)" in format_summary(two_failed)
    assert compare({"a": records, "b": [rec("t0", 0, 0.0), rec("t1", 0, 0.0), rec("t2", 0, 0.0)]})["shared_tasks"] == 2


def test_the_text_summary_says_how_many_groups_it_leaves_out():
    records = [rec(f"t{i}", 0, 1.0, metadata={"template": f"tpl{i}"}) for i in range(11)]
    line = next(x for x in format_summary(summarize(records)).splitlines() if x.startswith("by template"))
    assert line.count("(n=") == 8 and "(+3 more in summary.json)" in line


def test_plot_titles_name_the_env_and_model(tmp_path, monkeypatch):
    import matplotlib.axes

    titles = []
    real = matplotlib.axes.Axes.set

    def spy(self, **kwargs):
        titles.append(kwargs.get("title"))
        return real(self, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "set", spy)
    records = [rec(f"t{i}", 0, 1.0) for i in range(3)]
    run = {"env_id": "benchmax/Math-v0", "policy": {"kind": "chat", "model": "Qwen/Qwen3-8B"}}
    plot_run(records, summarize(records), tmp_path, run)
    assert len(titles) == 3 and all(t.endswith("\nbenchmax/Math-v0 - Qwen/Qwen3-8B") for t in titles)


def test_the_comparison_plot_names_env_and_models(tmp_path, monkeypatch):
    import matplotlib.axes

    seen = []
    real_set, real_plot = matplotlib.axes.Axes.set, matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "set", lambda self, **kw: (seen.append(kw.get("title")),
                                                                         real_set(self, **kw))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, *a, **kw: (seen.append(kw.get("label")),
                                                                              real_plot(self, *a, **kw))[1])
    records = [rec(f"t{i}", 0, float(i % 2)) for i in range(4)]
    runs = {"a": {"env_id": "benchmax/Math-v0", "policy": {"kind": "chat", "model": "m1"}},
            "b": {"env_id": "benchmax/Math-v0", "policy": {"kind": "baseline", "name": "solver"}}}
    plot_compare(compare({"a": records, "b": records}), tmp_path, runs)
    assert "a (benchmax/Math-v0 - m1)" in seen and "b (benchmax/Math-v0 - solver)" in seen
    assert "Runs per task\nbenchmax/Math-v0" in seen


@pytest.mark.parametrize("rewards", [[0.0, 1.0], [0.0, 0.25, 0.5, 0.75, 1.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9,
                                                  0.05, 0.15, 0.35, 0.45, 0.55, 0.65, 0.85, 0.95]])
def test_each_estimate_lies_in_its_interval_when_tasks_have_unequal_samples(rewards):
    """Failures cluster on hard tasks, leaving them fewer scored samples: the means weigh each
    episode once, and so must their intervals (both ways of computing them)."""
    records = [rec(f"h{t}", 0, rewards[0], success=False) for t in range(50)]
    records += [rec(f"e{t}", s, rewards[(t + s) % len(rewards) or -1] if len(rewards) > 2 else 1.0, success=True)
                for t in range(50) for s in range(10)]
    s = summarize(records, seed=1)
    for name in ("mean_reward", "success_rate"):
        assert s[name]["ci_low"] <= s[name]["value"] <= s[name]["ci_high"], (name, s[name])


@pytest.mark.parametrize("outcome", [0.0, 1.0])
def test_a_share_seen_all_zero_or_all_one_has_wilsons_interval_over_tasks_never_zero_width(outcome):
    """10 tasks, 3 samples each, every one solved (or none): the bootstrap's resamples are all the
    same and its interval had zero width, [1.000, 1.000]; Wilson's score interval over the 10
    tasks is n / (n + z^2) at the open end (0.722 at 95%)."""
    from scipy.stats import norm

    records = [{"task_id": str(t), "task_index": t, "reward": outcome, "success": bool(outcome), "outcome": "scored"}
               for t in range(10) for _ in range(3)]
    summary = summarize(records)
    z2 = norm.ppf(0.975) ** 2
    edge = 10 / (10 + z2)
    expected = (edge, 1.0) if outcome else (0.0, 1 - edge)
    for name in ("success_rate", "mean_reward", "iqm"):
        assert summary[name]["value"] == outcome
        assert (summary[name]["ci_low"], summary[name]["ci_high"]) == pytest.approx(expected), name
    assert (summary["failure_rate"]["ci_low"], summary["failure_rate"]["ci_high"]) == pytest.approx((0.0, 1 - edge))
    assert "[1.000, 1.000]" not in format_summary(summary) and "[0.000, 0.000]" not in format_summary(summary)


def test_a_mean_reward_the_same_for_every_episode_between_0_and_1_has_no_interval():
    records = [{"task_id": str(t), "task_index": t, "reward": 0.5, "success": False, "outcome": "scored"}
               for t in range(10) for _ in range(2)]
    summary = summarize(records)
    assert summary["mean_reward"]["ci_low"] is None and summary["iqm"]["ci_low"] is None
    assert any("every episode scored 0.5" in note for note in summary["notes"])
    assert summary["success_rate"]["ci_high"] == pytest.approx(1 - 10 / (10 + 1.959963984540054 ** 2))


def test_an_estimate_every_resample_gives_alike_though_episodes_differ_has_no_interval():
    """Rewards mostly 0 (3 of 80 episodes solved): every resample's IQM is 0, and the summary
    showed IQM 0.000 [0.000, 0.000]. And tasks each solved once in two samples: every resample's
    mean is 0.5. Neither is certainty: no CI, with a note; the estimates that vary keep theirs."""
    def record(t, k, reward):
        return {"task_id": str(t), "task_index": t, "sample": k, "reward": reward, "success": reward == 1.0,
                "outcome": "scored"}

    mostly_zero = summarize([record(t, k, float((t, k) in {(0, 0), (0, 1), (5, 0)}))
                             for t in range(20) for k in range(4)])
    assert mostly_zero["iqm"] == {"value": 0.0, "ci_low": None, "ci_high": None}
    assert mostly_zero["mean_reward"]["ci_low"] < mostly_zero["mean_reward"]["ci_high"]
    assert any("gave the same IQM" in note for note in mostly_zero["notes"])
    assert "[0.000, 0.000]" not in format_summary(mostly_zero)

    halves = summarize([record(t, k, float(k)) for t in range(10) for k in range(2)])
    for name in ("mean_reward", "success_rate"):
        assert halves[name] == {"value": 0.5, "ci_low": None, "ci_high": None}, name
    assert any("gave the same mean reward and success rate" in note for note in halves["notes"])
    assert "[0.500, 0.500]" not in format_summary(halves)


def test_a_comparison_whose_resamples_are_all_the_same_shows_its_uncertainty_or_none():
    """Two runs that solved every one of 10 tasks differ by 0 in every resample: the bootstrap gave
    0.000 [0.000, 0.000]. A difference of rewards of 0 or 1 takes Newcombe's score interval (from
    each run's Wilson interval); any other has no CI, nor has a probability of improvement that
    every resample gives alike."""
    def run(reward):
        return [{"task_id": str(t), "task_index": t, "reward": reward, "success": reward == 1.0, "outcome": "scored"}
                for t in range(10) for _ in range(3)]

    result = compare({"a": run(1.0), "b": run(1.0), "c": run(0.0), "h": run(0.5)})
    edge = 1 - 10 / (10 + 1.959963984540054 ** 2)  # the open end of Wilson's interval of 10 of 10
    same, none, half = (result["against_baseline"][k] for k in "bch")
    assert (same["mean_difference"]["ci_low"], same["mean_difference"]["ci_high"]) == pytest.approx((-edge, edge))
    assert (none["mean_difference"]["ci_low"], none["mean_difference"]["ci_high"]) == pytest.approx(
        (-1.0, -1.0 + math.hypot(edge, edge)))
    assert half["mean_difference"]["ci_low"] is None and half["mean_difference"]["value"] == -0.5
    assert all(r["probability_of_improvement"]["ci_low"] is None for r in (same, none, half))
    assert "[0.000, 0.000]" not in format_compare(result) and "[-1.000, -1.000]" not in format_compare(result)


@pytest.mark.parametrize("samples", [1, "mixed"])
def test_a_large_runs_intervals_from_counts_of_distinct_tasks_match_scipys_bootstrap(samples, monkeypatch):
    """From TYPED_UNITS tasks on, a summary draws how many times each distinct task row is
    resampled (multinomial) instead of the tasks' indices: the same bootstrap, other random
    numbers. Its intervals must agree with scipy's index bootstrap to within the resampling's own
    noise, for the means, the IQM and the failure rate, and hold their estimates."""
    import random

    import benchmax_gym.eval.stats as stats

    rnd = random.Random(11)
    records = []
    for t in range(1500):
        for s in range(rnd.randint(1, 3) if samples == "mixed" else 1):
            record = rec(f"t{t}", s, rnd.choice([0.0, 0.0, 0.5, 1.0]))
            records.append({**record, "task_index": t, "outcome": "env_error" if rnd.random() < 0.05 else "scored"})
    typed_calls = []
    real = stats._typed_intervals
    monkeypatch.setattr(stats, "_typed_intervals", lambda *a, **k: typed_calls.append(1) or real(*a, **k))
    typed = summarize(records, seed=3)
    assert len(typed_calls) == 2  # the scores' and the failure rate's
    monkeypatch.setattr(stats, "TYPED_UNITS", 10**9)
    indexed = summarize(records, seed=3)
    assert len(typed_calls) == 2
    for key in ("mean_reward", "success_rate", "iqm", "failure_rate"):
        a, b = typed[key], indexed[key]
        assert a["value"] == b["value"], key
        assert a["ci_low"] <= a["value"] <= a["ci_high"], key
        width = b["ci_high"] - b["ci_low"]
        assert width > 0, key
        assert abs(a["ci_low"] - b["ci_low"]) < 0.12 * width and abs(a["ci_high"] - b["ci_high"]) < 0.12 * width, (
            key, a, b)
    assert summarize(records, seed=3) == indexed and summarize(records, seed=4) != indexed
    monkeypatch.setattr(stats, "TYPED_UNITS", 1000)
    assert summarize(records, seed=3) == typed  # deterministic given the seed
