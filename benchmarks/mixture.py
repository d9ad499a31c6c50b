"""Mixtures and curricula (``benchmax/Mix-v0``): prints one JSON object.

* ``shares``: three members weighted 0.5/0.3/0.2 (``benchmax/Math-v0`` thrice, named, so resets
  are cheap), ``--resets`` real resets: each member's share in every window of 256 consecutive
  resets against its weight; the largest deviation, in points, for stratified and random sampling
  (target: at most 2 points, stratified).
* ``step_overhead``: ``step()`` of a one-member mixture against the member's own ``step()`` (both
  made with ``gym.make``; a calculator call, ``python_tool=False``), interleaved rounds, medians
  (target: at most 5%).
* ``curriculum``: a simulated learner on ``benchmax/Math-v0`` through the mixture: an episode is
  solved (the reference solver plays it) with probability ``sigmoid(1.5 * (skill - level))``, else
  answered wrong; each solved episode raises ``skill`` by ``--learn``. GRPO-style groups of k=8
  rollouts of one task at one level. The controller moves ``digits`` (levels 0-5) from the rewards
  the env itself sees, band 0.3-0.7; the baseline draws each group's level uniformly. Reported
  after warm-up (the first quarter of groups): the mean success, the share of windows of 64
  episodes inside the band, and the share of zero-variance groups (all 8 rewards equal), each
  for the controller and for the uniform baseline.

    python benchmarks/mixture.py [--resets 4096] [--rounds 7] [--steps 1000] [--groups 300] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import gymnasium as gym
import numpy as np

import benchmax_gym  # noqa: F401  (registers the ids)

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3 - 4 / 2"}}</tool_call>'
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
WINDOW = 256


def shares(resets: int, sampling: str) -> dict:
    members = [((name, "benchmax/Math-v0", {"python_tool": False}), w) for name, w in WEIGHTS.items()]
    env = gym.make("benchmax/Mix-v0", members=members, sampling=sampling)
    drawn = [env.reset(seed=0)[1]["member"]] + [env.reset()[1]["member"] for _ in range(resets - 1)]
    env.close()
    names = list(WEIGHTS)
    codes = np.array([names.index(m) for m in drawn])
    onehot = np.eye(len(names))[codes]
    sums = np.cumsum(np.vstack([np.zeros(len(names)), onehot]), axis=0)
    windows = (sums[WINDOW:] - sums[:-WINDOW]) / WINDOW  # every window of 256 consecutive resets
    deviation = np.abs(windows - np.array([WEIGHTS[n] for n in names]))
    return {"resets": resets, "windows": int(len(windows)),
            "max_deviation_points": round(float(deviation.max()) * 100, 2),
            "mean_abs_deviation_points": round(float(deviation.mean()) * 100, 3),
            "overall_shares": {n: round(float(onehot[:, i].mean()), 4) for i, n in enumerate(names)}}


def step_times(env: gym.Env, steps: int, options: dict | None) -> list[float]:
    env.reset(options=options)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        env.step(CALC)
        times.append(time.perf_counter() - t)
    return times


def overhead(rounds: int, steps: int) -> dict:
    own = gym.make("benchmax/Math-v0", python_tool=False, max_turns=10**9)
    mix = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1.0}, python_tool=False, max_turns=10**9)
    ours, theirs, ratios = [], [], []
    for _ in range(rounds):
        a = step_times(own, steps, None)
        b = step_times(mix, steps, None)
        theirs += a
        ours += b
        ratios.append(statistics.median(b) / statistics.median(a))
    own.close()
    mix.close()
    member, mixed = statistics.median(theirs), statistics.median(ours)
    return {"member_step_us": round(member * 1e6, 2), "mix_step_us": round(mixed * 1e6, 2),
            "overhead_pct": round((mixed / member - 1) * 100, 2),
            "overhead_pct_round_range": [round((min(ratios) - 1) * 100, 2), round((max(ratios) - 1) * 100, 2)]}


def learner(groups: int, k: int, learn: float, adaptive: bool, seed: int) -> dict:
    """One run of the simulated learner (see the module docstring)."""
    from benchmax_gym.testing import play

    rng = np.random.default_rng(seed)
    curriculum = {"Math-v0": {"window": 32}} if adaptive else None
    env = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1.0}, python_tool=False, group_size=k,
                   curriculum=curriculum or {"Math-v0": {"window": 32, "schedule": [(0, 0)]}})
    controller = env.unwrapped.curriculum
    levels = len(controller.members["Math-v0"].levels)
    skill, successes, solved, zero, complete, level_trace = 0.0, [], [], 0, 0, []
    warm = groups // 4
    for g in range(groups):
        level = controller.level("Math-v0") if adaptive else int(rng.integers(levels))
        level_trace.append(level)
        rewards = []
        for _ in range(k):
            p = 1.0 / (1.0 + math.exp(-1.5 * (skill - level)))
            options = {"member": "Math-v0", "task_index": g, "difficulty": level}
            if rng.random() < p:
                info = play(env, env.unwrapped.reference_solver(), options=options).info
            else:
                env.reset(options=options)
                info = env.step("\\boxed{no idea}")[4]
            rewards.append(info["mix_episode"]["reward"])
            solved.append(info["mix_episode"]["success"])  # full marks, as the env itself judged
            if solved[-1]:
                skill += learn
        if g >= warm:
            successes += solved[-k:]
            complete += 1
            zero += max(rewards) == min(rewards)
    env.close()
    windows = [np.mean(successes[i:i + 64]) for i in range(0, len(successes) - 63, 64)]
    return {"mean_success_after_warmup": round(float(np.mean(successes)), 3),
            "share_of_64_episode_windows_in_band": round(float(np.mean([0.3 <= w <= 0.7 for w in windows])), 3),
            "zero_variance_group_share": round(zero / complete, 3),
            "final_level": level_trace[-1], "final_skill": round(skill, 2),
            "controller_zero_variance_by_level": {str(lv): round(v, 3) for lv, v in
                                                  controller.stats()["Math-v0"]["zero_variance"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resets", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--learn", type=float, default=0.004, help="skill gained per solved episode")
    parser.add_argument("--quick", action="store_true", help="a short run (tests)")
    args = parser.parse_args()
    if args.quick:
        args.resets, args.rounds, args.steps, args.groups = 600, 2, 100, 24
    out = {"python": platform.python_version(), "machine": platform.machine(),
           "shares": {"weights": WEIGHTS, "window": WINDOW,
                      "stratified": shares(args.resets, "stratified"), "random": shares(args.resets, "random")},
           "step_overhead": overhead(args.rounds, args.steps)}
    k = 8
    adaptive = learner(args.groups, k, args.learn, True, seed=0)
    uniform = learner(args.groups, k, args.learn, False, seed=0)
    out["curriculum"] = {"k": k, "groups": args.groups, "band": [0.3, 0.7], "levels": "Math digits 1-6",
                         "controller": adaptive, "uniform_difficulty": uniform,
                         "zero_variance_reduction_points": round(
                             (uniform["zero_variance_group_share"] - adaptive["zero_variance_group_share"]) * 100, 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
