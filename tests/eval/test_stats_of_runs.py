"""Eval statistics as a user meets them: real runs (``evaluate`` with run directories), their
``summary.json``, and the CLI's ``compare`` over them.

- compare weighs each task the same in both runs (the summaries' episode weights where the runs'
  counts are in proportion), its difference inside its own interval, also when failures leave
  tasks unequal samples;
- with one task, intervals resample its episodes (and say so) instead of a zero-width interval
  that claims certainty; with one episode there is no interval;
- a score without a reward (or success) in rollouts.jsonl is refused with the file and line,
  never a NaN summary; a torn last line of that kind is dropped and its pair run again.
"""

import json
import math
import subprocess
import sys
import threading
from collections import Counter

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.eval import EvalError, evaluate, load_run
from benchmax_gym.eval.stats import format_summary, summarize

ENV = "benchmax/Math-v0"
ENV_KWARGS = {"python_tool": False}
CLI = [sys.executable, "-m", "benchmax_gym"]


@pytest.fixture(scope="module")
def answers():
    env = gym.make(ENV, **ENV_KWARGS)
    out = [env.unwrapped.tasks[i].answer for i in range(40)]
    env.close()
    return out


def scripted(answers, plan):
    """A policy: the ``n``-th call on task ``i`` (n from 0) does ``plan(i, n)``: "right", "wrong"
    or "fail" (raises: the episode fails as model_error)."""
    calls, lock = Counter(), threading.Lock()

    def policy(obs, info):
        with lock:
            index = info["task_index"]
            n = calls[index]
            calls[index] += 1
        what = plan(index, n)
        if what == "fail":
            raise RuntimeError("the endpoint timed out")
        return f"\\boxed{{{answers[index]}}}" if what == "right" else "\\boxed{-987654}"

    return policy


def inside(estimate):
    return estimate["ci_low"] <= estimate["value"] <= estimate["ci_high"]


def width(estimate):
    return estimate["ci_high"] - estimate["ci_low"]


def cli_compare(*args):
    out = subprocess.run([*CLI, "compare", *map(str, args)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def summary_of(path):
    return json.loads((path / "summary.json").read_text())


def test_compare_weighs_tasks_alike_in_both_runs_and_its_difference_lies_in_its_interval(answers, tmp_path):
    """Failures cluster on hard tasks (one scored sample of four there): each summary weighs its
    own episodes once (flaky 0.8, inflated by failing where it would score 0), but compare weighs
    each task the same in both runs (the harmonic mean of their counts: 1.6 for a hard task, 4 for
    an easy one), says so, and its difference lies in its interval."""
    hard = 10
    flaky = scripted(answers, lambda i, n: ("wrong" if n == 0 else "fail") if i < hard else "right")
    steady = scripted(answers, lambda i, n: "right" if i % 4 == 0 else "wrong")
    for name, policy in (("flaky", flaky), ("steady", steady)):
        evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=2 * hard, k=4, out=tmp_path / name, seed=1)
    result = json.loads(cli_compare(tmp_path / "steady", tmp_path / "flaky", "--json", "--allow-failure-gap"))
    mine, theirs = summary_of(tmp_path / "flaky"), summary_of(tmp_path / "steady")
    assert mine["tasks"] == theirs["tasks"] == result["shared_tasks"] == 2 * hard  # every task shared
    assert mine["samples_per_task"] != theirs["samples_per_task"]  # the unequal case
    for summary in (mine, theirs):
        assert inside(summary["mean_reward"]) and inside(summary["success_rate"])
    weights = [1.6 if i < hard else 4.0 for i in range(2 * hard)]  # 2 n m / (n + m): 1 and 4 samples, 4 and 4
    expected = {"flaky": sum(w for i, w in enumerate(weights) if i >= hard) / sum(weights),
                "steady": sum(w for i, w in enumerate(weights) if i % 4 == 0) / sum(weights)}
    assert result["mean_reward"] == pytest.approx(expected)
    assert any("unequal numbers of times" in note for note in result["notes"])
    difference = result["against_baseline"]["flaky"]["mean_difference"]
    assert difference["value"] == pytest.approx(expected["flaky"] - expected["steady"])
    assert inside(difference) and width(difference) > 0
    assert inside(result["against_baseline"]["flaky"]["probability_of_improvement"])
    assert result["intervals_over"] == "tasks"


def test_one_task_intervals_resample_its_episodes_and_say_so(answers, tmp_path):
    """One task played 8 times: the intervals (mean, success rate, IQM, failure rate) are over its
    samples, with positive width, never the point as its own interval."""
    plan = {0: "fail", 1: "wrong", 2: "right", 3: "right"}  # of every four calls
    result = evaluate(ENV, scripted(answers, lambda i, n: plan[n % 4]), env_kwargs=ENV_KWARGS, tasks=1, k=8,
                      out=tmp_path / "run", seed=1)
    summary = summary_of(tmp_path / "run")
    assert summary == json.loads(json.dumps(result.summary))
    assert summary["tasks"] == 1 and summary["scored_episodes"] == 6 and summary["failed_episodes"] == 2
    for key in ("mean_reward", "success_rate", "iqm", "failure_rate"):
        assert inside(summary[key]) and width(summary[key]) > 0, key
    assert summary["intervals_over"] == "episodes"
    text = format_summary(summary)
    assert "mean reward (95% CI over episodes)" in text and "one task: its CIs resample its 6 episodes" in text


def test_one_episode_has_no_interval(answers, tmp_path):
    summary = evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=1, k=1, out=tmp_path / "run").summary
    for key in ("mean_reward", "success_rate", "iqm", "failure_rate"):
        assert summary[key]["value"] == (0.0 if key == "failure_rate" else 1.0)
        assert summary[key]["ci_low"] is None and summary[key]["ci_high"] is None, key
    assert summary["intervals_over"] is None and "no CI" in format_summary(summary)


def test_compare_with_one_shared_task_resamples_each_runs_episodes(answers, tmp_path):
    half = scripted(answers, lambda i, n: "right" if n % 2 else "wrong")
    evaluate(ENV, half, env_kwargs=ENV_KWARGS, tasks=1, k=8, out=tmp_path / "half", seed=1)
    evaluate(ENV, "empty", env_kwargs=ENV_KWARGS, tasks=1, k=8, out=tmp_path / "none", seed=1)
    result = json.loads(cli_compare(tmp_path / "none", tmp_path / "half", "--json"))
    row = result["against_baseline"]["half"]
    assert row["mean_difference"]["value"] == pytest.approx(
        summary_of(tmp_path / "half")["mean_reward"]["value"] - summary_of(tmp_path / "none")["mean_reward"]["value"])
    for key in ("mean_difference", "probability_of_improvement"):
        assert inside(row[key]) and width(row[key]) > 0, key
    assert result["intervals_over"] == "episodes"
    text = cli_compare(tmp_path / "none", tmp_path / "half")
    assert "CI over episodes" in text and "note: one shared task" in text
    # played once by a run: nothing to resample, no interval
    evaluate(ENV, "empty", env_kwargs=ENV_KWARGS, tasks=1, k=1, out=tmp_path / "once", seed=1)
    row = json.loads(cli_compare(tmp_path / "once", tmp_path / "half", "--json"))["against_baseline"]["half"]
    assert row["mean_difference"]["ci_low"] is None and row["probability_of_improvement"]["ci_high"] is None


BAD_SCORES = {
    "scored, reward null": lambda r: {**r, "reward": None},
    "truncated, reward null": lambda r: {**r, "outcome": "truncated", "truncated": True, "reward": None},
    "older record, reward null": lambda r: {k: v for k, v in {**r, "reward": None}.items() if k != "outcome"},
    "older record, reward NaN": lambda r: {k: v for k, v in {**r, "reward": float("nan")}.items() if k != "outcome"},
    "older record, reward text": lambda r: {k: v for k, v in {**r, "reward": "1.0"}.items() if k != "outcome"},
    "scored, success missing": lambda r: {k: v for k, v in r.items() if k != "success"},
    "scored, task id null": lambda r: {**r, "task_id": None},
}


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "run"
    evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=3, k=2, out=out, seed=1)
    return out


@pytest.mark.parametrize("case", list(BAD_SCORES))
def test_a_score_without_a_reward_is_refused_naming_the_file_and_line(run_dir, case):
    """Resume, load_run and the CLI's compare refuse it (it was NaN in every statistic, or a
    crash), and the run's summary.json is left as it was - never a NaN summary."""
    path = run_dir / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = json.dumps(BAD_SCORES[case](json.loads(lines[1])))
    path.write_text("\n".join(lines) + "\n")
    before = (run_dir / "summary.json").read_bytes()
    says = f"{run_dir}: rollouts.jsonl line 2 is corrupt"
    with pytest.raises(EvalError, match=f"^{says}"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=3, k=2, out=run_dir, seed=1)
    assert (run_dir / "summary.json").read_bytes() == before and path.read_text().splitlines() == lines
    with pytest.raises(EvalError, match=f"^{says}"):
        load_run(run_dir)
    out = subprocess.run([*CLI, "compare", str(run_dir), str(run_dir)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "rollouts.jsonl line 2 is corrupt" in out.stderr and "Traceback" not in out.stderr


def test_a_torn_last_line_without_a_reward_is_dropped_and_run_again(run_dir):
    """The repair path treats it as any torn last line (a run killed while writing): removed,
    its pair played again, and the summary is a number."""
    path = run_dir / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    path.write_text("\n".join([*lines[:-1], json.dumps({**last, "reward": None})]))  # no newline: torn
    result = evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=3, k=2, out=run_dir, seed=1)
    assert len(result.records) == 6 and all(r["reward"] == 1.0 for r in result.records)
    summary = summary_of(run_dir)
    assert summary["mean_reward"]["value"] == 1.0 and not math.isnan(summary["mean_reward"]["ci_low"])
    assert len(load_run(run_dir)[1]) == 6


def test_summarize_names_a_score_without_a_number():
    records = [{"task_id": "t0", "task_index": 0, "sample": 0, "reward": 1.0, "success": True, "outcome": "scored"},
               {"task_id": "t1", "task_index": 1, "sample": 0, "reward": None, "success": False, "outcome": "scored"}]
    with pytest.raises(ValueError, match="'t1' .*sample 0: a scored episode with reward None"):
        summarize(records)


def scores(task_samples, reward):
    return [{"task_id": f"t{t}", "task_index": t, "sample": s, "reward": reward(t, s), "success": reward(t, s) >= 1,
             "outcome": "scored", "metadata": {}, "turns": 1} for t, samples in task_samples for s in range(samples)]


@pytest.mark.parametrize("distinct", [3, 200])
def test_one_task_intervals_are_the_same_both_ways_of_computing_them(distinct, monkeypatch):
    """Few distinct rewards: IQM from counts; many: from sorts. Over episodes, as over tasks, they agree."""
    import benchmax_gym.eval.stats as stats

    records = scores([(0, 40)], lambda t, s: (s * 7 % distinct) / distinct)
    counted = summarize(records, seed=3)
    monkeypatch.setattr(stats, "MAX_COUNTED_VALUES", 0)
    sorted_ = summarize(records, seed=3)
    for key in ("mean_reward", "success_rate", "iqm"):
        for bound in ("value", "ci_low", "ci_high"):
            assert counted[key][bound] == pytest.approx(sorted_[key][bound], abs=1e-12), (key, bound)
    assert width(counted["mean_reward"]) > 0 and counted["intervals_over"] == "episodes"


def test_each_member_of_a_mixture_says_what_its_intervals_resample():
    """A mixture's member summaries: one with several tasks resamples tasks, one with a single task
    its episodes, one with a single episode has none - never a zero-width interval."""
    records = [{**r, "member": "many"} for r in scores([(t, 2) for t in range(6)], lambda t, s: float(t % 2))]
    records += [{**r, "member": "one", "task_id": "u0"} for r in scores([(10, 6)], lambda t, s: float(s % 2))]
    records += [{**r, "member": "single", "task_id": "v0"} for r in scores([(20, 1)], lambda t, s: 1.0)]
    members = summarize(records)["by_member"]
    assert [members[m]["intervals_over"] for m in ("many", "one", "single")] == ["tasks", "episodes", None]
    assert width(members["many"]["mean_reward"]) > 0 and width(members["one"]["mean_reward"]) > 0
    assert members["single"]["mean_reward"]["ci_low"] is None


def test_each_member_of_a_mixture_counts_its_own_failed_episodes():
    """A member whose endpoint fails half its episodes: its summary says so (it said 0 failures
    and a failure rate of 0: the failed episodes were dropped before the members were split)."""
    members = [("benchmax/Math-v0", 0.5), ("benchmax/Wikipedia-v0", 0.5)]
    calls = Counter()

    def policy(obs, info):
        if info["member"] == "Wikipedia-v0":
            calls[info["task_id"]] += 1
            if calls[info["task_id"]] % 2:
                raise RuntimeError("the endpoint timed out")
        return "\\boxed{1} <answer>1</answer>"

    result = evaluate("benchmax/Mix-v0", policy, env_kwargs={"members": members, "python_tool": False}, tasks=6, k=2,
                      concurrency=1)
    wiki = [r for r in result.records if r.get("member") == "Wikipedia-v0"]
    failed = sum(r["outcome"] == "model_error" for r in wiki)
    assert 0 < failed < len(wiki)
    summary = result.summary["by_member"]["Wikipedia-v0"]
    assert summary["episodes"] == len(wiki) and summary["failed_episodes"] == failed
    assert summary["scored_episodes"] == len(wiki) - failed
    assert summary["failure_rate"]["value"] == pytest.approx(failed / len(wiki))
    assert summary["outcomes"]["model_error"] == failed
    assert result.summary["by_member"]["Math-v0"]["failed_episodes"] == 0
    assert f"(n={len(wiki) - failed}, {failed} failed)" in format_summary(result.summary)
