"""What do faults cost, and does any episode get lost? Prints one JSON object.

The same ``--episodes`` scripted episodes (``benchmax_gym.testing.chaos``: Math-v0 tasks, a
calculator call then a right or wrong answer) are played clean and with faults injected, through
two paths:

* ``SubprocVectorEnv`` (``--envs`` envs over ``--workers`` worker processes, lock-step batches
  with ``send``/``recv``): a *kill* SIGKILLs the worker holding the episode mid-episode (each
  env of that worker loses its episode), a *tool timeout* calls a tool that hangs past
  ``--tool-timeout``, a *model error* is a policy that fails before its reply;
* TRL's rollout function (``TRLRollout``, ``--batch`` prompts per call, a scripted generation
  backend, envs in process): a *kill* SIGKILLs the sandbox server under a python call, a *tool
  timeout* as above, a *model error* is the backend returning ids outside the vocabulary.

Faults: ``--kill`` (10%), ``--tool-timeouts`` (5%) and ``--model-errors`` (2%) of the episodes,
exactly, at places drawn from ``--seed``. For each path: the outcome counts, how many episodes
ended with the outcome their fault must give (``as_expected`` of ``injected``, the neighbours of
a killed worker included), whether every episode is accounted for (one result each, none
missing), whether every scored episode equals the clean run's (ids, rewards, observations),
wall time against the clean run (and the part of it the hanging tools' own timeouts set: a
lock-step batch waits ``--tool-timeout`` for one), and the largest stall: the longest one batch waited
(``SubprocVectorEnv``: send to receive; TRL: one rollout call), against the bound
``step_timeout + 2 s``.

    python benchmarks/chaos.py [--episodes 1000] [--envs 8] [--workers 8] [--batch 16]
        [--step-timeout 5] [--tool-timeout 0.5] [--kill 0.10] [--tool-timeouts 0.05] [--model-errors 0.02]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import time

from _bench import need

need("trl", "trl", "transformers", "tokenizers")  # the TRL path and its tokenizer
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from benchmax_gym.core.outcomes import FAILURES  # noqa: E402
from benchmax_gym.testing import chaos  # noqa: E402
from benchmax_gym.testing.tokenizers import tiny_tokenizer  # noqa: E402

COMPARED = {"vector": ("outcome", "reward", "components", "observations"),
            "trl": ("outcome", "reward", "completion_ids", "env_mask", "components")}


def report(path: str, episodes: list, faulty: dict, clean: dict, seconds: float, clean_seconds: float,
           bound: float, batch: int, tool_timeout: float) -> dict:
    results, expected = faulty["results"], faulty["expected"]
    injected = collections.Counter(e.fault for e in episodes if e.fault)
    mismatched = [i for i, r in results.items() if i not in expected  # (a fault the model's own at rlimits)
                  and any(r[k] != clean["results"][i][k] for k in COMPARED[path])]
    failed_with_reward = [i for i, r in results.items() if r["outcome"] in FAILURES and r["reward"] is not None]
    stall = max(faulty["stalls"])
    # a batch holding a hanging tool waits tool_timeout for it: the floor the faults themselves set
    waits = len({i // batch for i, e in enumerate(episodes) if e.fault == "tool_timeout"}) * tool_timeout
    return {
        "outcomes": dict(sorted(collections.Counter(r["outcome"] for r in results.values()).items())),
        "injected": dict(sorted(injected.items())),
        "expected_failures": len(expected),
        "as_expected": sum(results[i]["outcome"] == o for i, o in expected.items()),
        "accounted_for": len(results) == len(episodes) and set(results) == set(range(len(episodes))),
        "episodes_with_a_result": len(results),
        "scored_equal_to_clean": not mismatched,
        "failed_with_a_reward": len(failed_with_reward),
        "seconds": round(seconds, 2),
        "clean_seconds": round(clean_seconds, 2),
        "slowdown": round(seconds / clean_seconds, 2),
        "waiting_on_tool_timeouts_s": round(waits, 2),
        "seconds_beyond_clean_and_timeouts": round(seconds - clean_seconds - waits, 2),
        "largest_stall_s": round(stall, 3),
        "clean_largest_stall_s": round(max(clean["stalls"]), 3),
        "stall_bound_s": bound,
        "within_stall_bound": stall <= bound,
        "batches": len(faulty["stalls"]),
        **({"worker_restarts": faulty["restarts"]} if "restarts" in faulty else {}),
        **({"sandbox_isolated": faulty["isolated"]} if "isolated" in faulty else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="TRL prompts per rollout call (groups of 4)")
    parser.add_argument("--step-timeout", type=float, default=5.0)
    parser.add_argument("--tool-timeout", type=float, default=0.5)
    parser.add_argument("--kill", type=float, default=0.10)
    parser.add_argument("--tool-timeouts", type=float, default=0.05)
    parser.add_argument("--model-errors", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths", default="vector,trl")
    args = parser.parse_args()

    rates = {"kill": args.kill, "tool_timeout": args.tool_timeouts, "model_error": args.model_errors}
    bound = args.step_timeout + 2.0
    answer = chaos.answers(args.tasks)
    out = {"benchmark": "chaos", "episodes": args.episodes, "fault_rates": rates, "step_timeout_s": args.step_timeout,
           "tool_timeout_s": args.tool_timeout}
    paths = args.paths.split(",")
    if "vector" in paths:
        episodes = chaos.plan(args.episodes, tasks=args.tasks, seed=args.seed, **rates)
        kwargs = dict(num_envs=args.envs, num_workers=args.workers, step_timeout=args.step_timeout,
                      tool_timeout=args.tool_timeout)
        t0 = time.perf_counter()
        clean = chaos.run_vector(episodes, answer, inject=False, **kwargs)
        clean_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        faulty = chaos.run_vector(episodes, answer, **kwargs)
        out["subproc_vector_env"] = report("vector", episodes, faulty, clean, time.perf_counter() - t0,
                                           clean_seconds, bound, args.envs, args.tool_timeout)
    if "trl" in paths:
        episodes = chaos.plan(args.episodes, tasks=args.tasks, group=4, seed=args.seed + 1, **rates)
        tokenizer = tiny_tokenizer("qwen")
        kwargs = dict(batch=args.batch, tool_timeout=args.tool_timeout)
        t0 = time.perf_counter()
        clean = chaos.run_trl(episodes, answer, tokenizer, inject=False, **kwargs)
        clean_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        faulty = chaos.run_trl(episodes, answer, tokenizer, **kwargs)
        out["trl_rollout"] = report("trl", episodes, faulty, clean, time.perf_counter() - t0, clean_seconds, bound,
                                    args.batch, args.tool_timeout)
    out.update(cpus=os.cpu_count(), python=platform.python_version())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
