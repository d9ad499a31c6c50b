"""The CPU an eval run's summary (statistics with bootstrap CIs) costs at the end of a large run.
Prints one JSON object.

Synthetic episode records (``--tasks`` tasks x ``--samples`` samples, rewards 0 or 1 at 70%, 3
metadata groups) summarized as ``benchmax-gym eval`` does at the end of a run, with the counted
bootstrap (from ``TYPED_UNITS`` tasks on: counts of distinct tasks drawn from a multinomial) and
with scipy's index bootstrap (``indexed``: what every size used before), in this process: CPU
seconds (all threads: numpy's matrix products may run on every core) and wall seconds of each, and
their mean-reward intervals side by side (the same bootstrap: they agree to the resampling's
noise). A 1,024-slot eval of 40 episodes per slot is 40,960 one-episode tasks. ``compare``: the
paired comparison of two such runs (``benchmax-gym compare``), the same tasks with other rewards.

    python benchmarks/eval_summary.py [--tasks 40960] [--samples 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import benchmax_gym.eval.stats as stats


def records(tasks: int, samples: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for t in range(tasks):
        for s in range(samples):
            reward = float(rng.random() < 0.7)
            out.append({"task_index": t, "sample": s, "task_id": f"t{t}", "outcome": "scored", "reward": reward,
                        "success": reward == 1.0, "turns": 2, "tool_errors": 0, "parse_errors": 0,
                        "metadata": {"level": t % 3}, "error": None})
    return out


def medians(call, rounds: int) -> tuple[dict, object]:
    """Median CPU and wall seconds of ``rounds`` calls of ``call()``, and its last result."""
    cpu, wall = [], []
    for _ in range(rounds):
        c, w = time.process_time(), time.perf_counter()
        result = call()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {"cpu_s": round(statistics.median(cpu), 3), "wall_s": round(statistics.median(wall), 3)}, result


def timed(rows: list[dict], rounds: int, indexed: bool) -> dict:
    saved = stats.TYPED_UNITS
    stats.TYPED_UNITS = 10**12 if indexed else saved
    try:
        times, summary = medians(lambda: stats.summarize(rows), rounds)
    finally:
        stats.TYPED_UNITS = saved
    return {**times, "mean_reward": summary["mean_reward"]}


def timed_compare(runs: dict[str, list[dict]], rounds: int) -> dict:
    times, result = medians(lambda: stats.compare(runs), rounds)
    (row,) = result["against_baseline"].values()
    return {**times, "mean_difference": row["mean_difference"],
            "probability_of_improvement": row["probability_of_improvement"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=40960)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = records(args.tasks, args.samples)
    stats.summarize(rows[:100])  # (scipy's imports, once)
    result = {"benchmark": "eval_summary", "tasks": args.tasks, "samples": args.samples, "rounds": args.rounds,
              "counted": timed(rows, args.rounds, indexed=False), "indexed": timed(rows, args.rounds, indexed=True),
              "compare": timed_compare({"a": rows, "b": records(args.tasks, args.samples, seed=1)}, args.rounds)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
