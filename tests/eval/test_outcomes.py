"""Issue 29 on the eval side: every record carries its outcome, a failed episode is never a score
(statistics are over scored + truncated episodes, the failure rate has its own CI), --retry-failed
re-runs exactly the failed pairs, and compare refuses runs whose failure rates differ."""

import asyncio
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.outcomes import FAILURES, OUTCOMES, SIGNAL
from benchmax_gym.eval import EvalError, load_run
from benchmax_gym.eval.policies import as_policy
from benchmax_gym.eval.runner import episode_seed, play_episode, read_rollouts
from benchmax_gym.eval.stats import format_summary, summarize
from benchmax_gym.testing.openai_server import FakeChatServer

ENV = "benchmax/Math-v0"
ENV_KWARGS = {"python_tool": False}
CLI = [sys.executable, "-m", "benchmax_gym"]
TASKS, K = 8, 2
FAILING = {(0, 0), (1, 1), (3, 0), (5, 1)}  # (task, sample) pairs whose model calls answer 500


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}


def cli(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env=clean_env())


@pytest.fixture(scope="module")
def answers():
    env = gym.make(ENV, **ENV_KWARGS)
    tasks = env.unwrapped.tasks
    out = {tasks[i].prompt: (i, tasks[i].answer) for i in range(TASKS)}
    env.close()
    return out


def scripted(answers):
    """Even tasks: right; odd: wrong (so the mean is neither 0 nor 1)."""

    def reply(body):
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if prompt not in answers:  # the preflight's ping
            return {"content": "pong"}
        index, answer = answers[prompt]
        return {"content": f"\\boxed{{{answer}}}" if index % 2 == 0 else "\\boxed{-987654}"}

    return reply


def lines_by_pair(path):
    out = {}
    for line in (path / "rollouts.jsonl").read_bytes().splitlines():
        record = json.loads(line)
        out[(record["task_index"], record["sample"])] = line
    return out


def test_failed_episodes_are_counted_apart_retried_exactly_and_compare_refuses_the_gap(answers, tmp_path):
    failing_seeds = {episode_seed(0, t, s) for t, s in FAILING}
    run, before = tmp_path / "run", tmp_path / "before-retry"
    args = ["eval", ENV, "--model", "test-model", "--tasks", str(TASKS), "-k", str(K), "--max-retries", "0",
            "--env-arg", "python_tool=false", "--quiet", "--no-plots", "--out", str(run)]
    with FakeChatServer(scripted(answers), fault_for=lambda body: {"status": 500} if body.get("seed") in
                        failing_seeds else None) as server:
        first = cli(*args, "--base-url", server.url, "--json")
        assert first.returncode == 0, first.stderr
        summary = json.loads(first.stdout)
        records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
        assert len(records) == TASKS * K and all(r["outcome"] in OUTCOMES for r in records)
        failed = {(r["task_index"], r["sample"]) for r in records if r["outcome"] in FAILURES}
        assert failed == FAILING
        assert all(r["outcome"] == "model_error" and r["reward"] is None and r["error"]
                   for r in records if (r["task_index"], r["sample"]) in FAILING)
        scored = [r["reward"] for r in records if r["outcome"] in SIGNAL]
        assert 0 < np.mean(scored) < 1  # a mean the failures would move if counted as 0
        assert summary["mean_reward"]["value"] == pytest.approx(np.mean(scored))
        assert summary["failed_episodes"] == len(FAILING) and summary["scored_episodes"] == len(scored)
        assert summary["failure_rate"]["value"] == pytest.approx(len(FAILING) / (TASKS * K))
        rate = summary["failure_rate"]
        assert rate["ci_low"] <= rate["value"] <= rate["ci_high"]
        assert summary["outcomes"] == {"model_error": len(FAILING), "scored": len(scored)}
        assert json.loads((run / "summary.json").read_text())["outcomes"] == summary["outcomes"]
        shutil.copytree(run, before)
        kept = {pair: line for pair, line in lines_by_pair(run).items() if pair not in FAILING}

        server.fault_for = None  # healthy now
        asked = len(server.requests)
        retry = cli(*args, "--base-url", server.url, "--retry-failed")
        assert retry.returncode == 0, retry.stderr
        retried_seeds = {body.get("seed") for body in server.requests[asked:]} - {None}
    assert retried_seeds == failing_seeds  # exactly the failed pairs, with their own seeds, nothing else
    after = lines_by_pair(run)
    assert len((run / "rollouts.jsonl").read_bytes().splitlines()) == TASKS * K and set(after) == set(kept) | FAILING
    assert all(after[pair] == line for pair, line in kept.items())  # the scored records, byte for byte
    assert all(json.loads(after[pair])["outcome"] == "scored" for pair in FAILING)
    assert all(json.loads(after[pair])["seed"] == episode_seed(0, *pair) for pair in FAILING)
    new_summary = json.loads((run / "summary.json").read_text())
    assert new_summary["failed_episodes"] == 0 and new_summary["failure_rate"]["value"] == 0
    assert "failure rate" in retry.stdout and "outcomes" in retry.stdout and "scored 16" in retry.stdout
    assert len(json.loads((run / "run.json").read_text())["retried"]) == 1

    refused = cli("compare", str(before), str(run))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "--max-failure-gap 0.05" in refused.stderr and "before-retry 0.250" in refused.stderr
    assert refused.stdout == ""
    warned = cli("compare", str(before), str(run), "--allow-failure-gap")
    assert warned.returncode == 0 and "warning" in warned.stderr and "failure rates" in warned.stdout
    wide = cli("compare", str(before), str(run), "--max-failure-gap", "0.3", "--json")
    assert wide.returncode == 0 and wide.stderr == ""
    assert json.loads(wide.stdout)["failure_rate"] == {"before-retry": 0.25, "run": 0.0}
    bad = cli("compare", str(before), str(run), "--max-failure-gap", "2")
    assert bad.returncode == 2 and "--max-failure-gap" in bad.stderr

    # a run directory written before outcomes: the outcome is derived, the statistics the same
    lines = [json.loads(line) for line in (before / "rollouts.jsonl").read_text().splitlines()]
    (before / "rollouts.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "outcome"}) + "\n"
                                                   for r in lines))
    _, old = load_run(before)
    assert [r["outcome"] for r in old] == [r["outcome"] for r in lines]
    assert summarize(old)["mean_reward"] == summary["mean_reward"]


def test_retry_failed_needs_a_run_to_retry(tmp_path):
    out = cli("eval", ENV, "--policy", "solver", "--tasks", "2", "--env-arg", "python_tool=false", "--quiet",
              "--no-plots", "--out", str(tmp_path / "none"), "--retry-failed")
    assert out.returncode == 2 and "--retry-failed" in out.stderr and len(out.stderr.strip().splitlines()) == 1


class Reporting(gym.Wrapper):
    """The env engine's side (issue 29): the last info may carry an outcome, a step may raise."""

    def __init__(self, env, outcome=None, truncate=False, raise_on_step=False, detail=None):
        super().__init__(env)
        self.outcome, self.truncate, self.raise_on_step, self.detail = outcome, truncate, raise_on_step, detail

    def step(self, action):
        if self.raise_on_step:
            raise RuntimeError("worker lost")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.truncate:
            terminated, truncated = False, True
        if self.outcome is not None:
            info = {**info, "outcome": self.outcome}
        if self.detail is not None:
            info["outcome_detail"] = self.detail
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("kwargs, outcome, scored", [
    ({}, "scored", True),
    ({"truncate": True}, "truncated", True),
    ({"outcome": "tool_timeout"}, "tool_timeout", False),
    ({"outcome": "truncated"}, "truncated", True),
    ({"raise_on_step": True}, "env_error", False),
])
def test_the_record_takes_the_envs_outcome_or_derives_it(kwargs, outcome, scored):
    env = Reporting(gym.make(ENV, **ENV_KWARGS), **kwargs)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        record = asyncio.run(play_episode(env, as_policy("solver"), 0, 0, 1, pool))
    env.close()
    assert record["outcome"] == outcome
    assert (record["reward"] is not None) == scored and (record["error"] is None) == scored
    if scored and not kwargs.get("truncate"):  # cut at its first step, the solver has not answered yet
        assert record["reward"] == 1.0


def test_the_record_says_why_the_env_failed_the_episode():
    env = Reporting(gym.make(ENV, **ENV_KWARGS), outcome="model_error", detail="a reward could not score: judge down")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        record = asyncio.run(play_episode(env, as_policy("solver"), 0, 0, 1, pool))
    env.close()
    assert record["outcome"] == "model_error" and record["error"] == "a reward could not score: judge down"


def record(task, sample, reward, outcome=None, **extra):
    r = {"task_index": task, "sample": sample, "task_id": str(task), "reward": reward, "success": reward == 1.0,
         "metadata": {}, "turns": 1, **extra}
    if outcome is not None:
        r["outcome"] = outcome
    return r


def test_statistics_count_scored_and_truncated_and_leave_every_failure_out():
    records = [record(0, 0, 1.0, "scored"), record(0, 1, 0.0, "truncated", truncated=True),
               record(1, 0, None, "tool_timeout", error="x"), record(1, 1, 1.0, "scored"),
               record(2, 0, None, "cancelled", error="x"), record(2, 1, 0.0, "scored")]
    summary = summarize(records)
    assert summary["mean_reward"]["value"] == pytest.approx(0.5) and summary["scored_episodes"] == 4
    assert summary["outcomes"] == {"cancelled": 1, "scored": 3, "tool_timeout": 1, "truncated": 1}
    assert summary["failure_rate"]["value"] == pytest.approx(2 / 6)
    assert summary["failure_rate"]["ci_low"] < summary["failure_rate"]["ci_high"]
    text = format_summary(summary)
    assert "failure rate (95% CI)  0.333 [" in text and "cancelled 1" in text
    # an older record: no outcome, derived from its error and truncated flag
    old = summarize([record(0, 0, 1.0), record(0, 1, None, error="the env's step raised X"),
                     record(1, 0, None, error="the endpoint failed"), record(1, 1, 0.0, truncated=True)])
    assert old["outcomes"] == {"env_error": 1, "model_error": 1, "scored": 1, "truncated": 1}
    everything_failed = summarize([record(0, 0, None, "model_error", error="x")])
    assert everything_failed["failure_rate"]["value"] == 1.0 and "model_error 1" in format_summary(everything_failed)


@pytest.mark.parametrize("bad, says", [({"outcome": "lost"}, "outcome is 'lost'"),
                                       ({"outcome": "model_error", "reward": 0.0}, "a failure, yet reward")])
def test_a_record_with_an_unknown_outcome_or_a_failure_with_a_reward_is_refused(tmp_path, bad, says):
    lines = [record(0, 0, 1.0, "scored"), {**record(0, 1, None, error="x"), **bad}, record(0, 2, 1.0, "scored")]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(EvalError, match=says):
        read_rollouts(tmp_path)
