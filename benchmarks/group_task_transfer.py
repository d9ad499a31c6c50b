"""What ``score_vector_group`` moves from worker processes to read each env's task: the whole
Episode (``get_attr("episode")``, what it did) against the task alone (``call("episode_task")``,
after ``call("has_wrapper_attr", "episode_task")``, what it does). Prints one JSON object.

A ``SubprocVectorEnv`` of ``--envs`` Math-v0 envs (``python_tool=False``: its episodes can be
pickled at all; Math's Python sandbox, CRM's database connection cannot) plays long episodes:
``--turns`` calculator calls each, so each transcript holds that many tool calls and results.
Then, ``--repeats`` times each, interleaved: the episodes fetched, the tasks fetched. ``bytes``:
the pickled size (highest protocol) of what came back, summed over the envs (what crossed the
pipes, within the framing); ``ms``: the median wall time of one fetch for all envs, and its range.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time

import gymnasium as gym

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.wrappers import SubprocVectorEnv

from step_overhead import ACTION as CALC  # one calculator call


def make(turns: int) -> gym.Env:
    return gym.make("benchmax/Math-v0", python_tool=False, max_turns=turns + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=16, help="environments (default 16)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--turns", type=int, default=200, help="calculator calls per episode (default 200)")
    parser.add_argument("--repeats", type=int, default=20, help="fetches of each kind (default 20)")
    args = parser.parse_args()
    if min(args.envs, args.workers, args.turns, args.repeats) < 1 or args.workers > args.envs:
        parser.error("every count must be at least 1, and --workers at most --envs")

    envs = SubprocVectorEnv([lambda: make(args.turns)] * args.envs, num_workers=args.workers)
    try:
        envs.reset(seed=0)
        for _ in range(args.turns):
            envs.step([CALC] * args.envs)
        times: dict[str, list[float]] = {"episode": [], "task": []}
        sizes: dict[str, int] = {}
        for _ in range(args.repeats):
            start = time.perf_counter()
            episodes = envs.get_attr("episode")
            times["episode"].append(time.perf_counter() - start)
            start = time.perf_counter()
            assert all(envs.call("has_wrapper_attr", "episode_task"))
            tasks = envs.call("episode_task")
            times["task"].append(time.perf_counter() - start)
            sizes = {"episode": sum(len(pickle.dumps(e, pickle.HIGHEST_PROTOCOL)) for e in episodes),
                     "task": sum(len(pickle.dumps(t, pickle.HIGHEST_PROTOCOL)) for t in tasks)}
        assert [e.task.id for e in episodes] == [t.id for t in tasks]
        turns = [len(e.messages) for e in episodes]
    finally:
        envs.close()

    def ms(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values) * 1e3, 3), "min": round(min(values) * 1e3, 3),
                "max": round(max(values) * 1e3, 3)}

    print(json.dumps({
        "envs": args.envs, "workers": args.workers, "turns": args.turns, "messages_per_episode": max(turns),
        "repeats": args.repeats,
        "whole_episode": {"bytes": sizes["episode"], "ms": ms(times["episode"])},
        "task_only": {"bytes": sizes["task"], "ms": ms(times["task"])},
        "bytes_ratio": round(sizes["episode"] / sizes["task"], 1),
        "time_ratio": round(statistics.median(times["episode"]) / statistics.median(times["task"]), 1),
    }))


if __name__ == "__main__":
    sys.exit(main())
