"""A vector worker's own loop, with no parent: what caps ``SubprocVectorEnv`` on a many-core machine.
Prints one JSON object.

One process builds a ``_Worker`` (the loop ``SubprocVectorEnv``'s workers run) over ``--envs``
Math-v0 calculator envs and steps them lock-step (``step_all``) for ``--seconds``, its messages
pickled as a worker's are, but sent nowhere: CPU microseconds per env step (user and kernel),
new memory pages per step, and the garbage collector's share (``gc_us_per_step``; its full
passes, ``full_gc_us_per_step``: with never-ending episodes every transcript stays alive, so
these passes walk a heap that grows all run). ``--copies 1,16`` runs that many such processes at once (capped
at ``os.cpu_count()``), each timing itself: how the machine's cores slow each other when all are
busy (median and slowest copy). Beside it, a plain Python loop timed the same way (``spin``),
the machine's own slowdown under full load with no memory to speak of.

The lock-step ceiling of W workers over N envs with no parent at all is
``N / (N / W * slowest_us_per_step)`` steps per microsecond: the figure that
``vector_throughput.py`` rates can be read against.

    python benchmarks/worker_loop.py [--envs 64] [--seconds 3] [--copies 1,16] [--max-turns N]
        [--info keys|full]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

KEYS = ("error", "reward_components")


def one(kind: str, envs: int, seconds: float, max_turns: int, info: str) -> dict:
    """One copy's figures (run in a process of its own)."""
    import resource

    if kind == "spin":
        start, cpu, loops = time.perf_counter(), time.process_time(), 0
        while time.perf_counter() - start < seconds:
            total = 0
            for k in range(1000):
                total += k * k
            loops += 1
        return {"us_per_1000_adds": round((time.process_time() - cpu) / loops * 1e6, 3)}

    import asyncio
    import gc
    import pickle

    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    import benchmax_gym  # noqa: F401  (registers the ids)
    from benchmax_gym.wrappers import worker
    from step_overhead import ACTION

    sent: list[bytes] = []
    fns = {i: (lambda: gym.make("benchmax/Math-v0", python_tool=False, max_turns=max_turns)) for i in range(envs)}
    loop = asyncio.new_event_loop()
    w = worker._Worker(fns, AutoresetMode.NEXT_STEP, False, lambda m: sent.append(pickle.dumps(m, protocol=5)),
                       loop, KEYS if info == "keys" else None)
    for i in range(envs):
        w._finish_now(w._reset(i, 0, None))
    actions = [ACTION] * envs
    gc.freeze()  # as a worker process does
    gc.set_threshold(20_000, 10, 10)  # (benchmax_gym.core.env.fewer_collections)

    def batch() -> None:
        w.handle("step_all", (0, actions))
        loop.run_until_complete(asyncio.sleep(0))  # (results a general-path batch delivers on the loop)
        sent.clear()

    for _ in range(5):
        batch()
    collector = [0.0, 0.0, 0.0]  # CPU s in the garbage collector's passes, by generation
    started = [0.0]

    def timed_collection(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            collector[info["generation"]] += time.process_time() - started[0]

    gc.callbacks.append(timed_collection)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        batch()
        steps += envs
    after = resource.getrusage(resource.RUSAGE_SELF)
    gc.callbacks.remove(timed_collection)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"us_per_step": round(cpu / steps * 1e6, 3),
            "gc_us_per_step": round(sum(collector) / steps * 1e6, 3),
            "full_gc_us_per_step": round(collector[2] / steps * 1e6, 3),
            "kernel_us_per_step": round((after.ru_stime - before.ru_stime) / steps * 1e6, 3),
            "page_faults_per_step": round((after.ru_minflt - before.ru_minflt) / steps, 3)}


def copies(n: int, kind: str, args) -> dict:
    """``n`` copies at once: the median and slowest copy of each figure."""
    cmd = [sys.executable, __file__, "--one", kind, "--envs", str(args.envs), "--seconds", str(args.seconds),
           "--max-turns", str(args.max_turns), "--info", args.info]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    results = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a copy failed (status {proc.returncode})")
        results.append(json.loads(out))
    return {key: {"median": round(statistics.median(r[key] for r in results), 3),
                  "slowest": round(max(r[key] for r in results), 3)} for key in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=64, help="envs in the worker (1,024 over 16 workers: 64)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--copies", default="1,16", help="how many copies at once (capped at os.cpu_count())")
    parser.add_argument("--max-turns", type=int, default=10**9,
                        help="episode length (default 10**9: never-ending episodes, as vector_throughput.py)")
    parser.add_argument("--info", choices=("keys", "full"), default="keys",
                        help=f"info_keys={list(KEYS)} (as vector_throughput.py) or full infos")
    parser.add_argument("--one", choices=("worker", "spin"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.envs, args.seconds, args.max_turns, args.info)))
        return
    cpus = os.cpu_count() or 1
    counts = sorted({min(int(c), cpus) for c in args.copies.split(",")})
    result: dict = {"benchmark": "worker_loop", "cpu_count": cpus, "envs": args.envs, "seconds": args.seconds,
                    "max_turns": args.max_turns, "info": args.info, "by_copies": {}}
    for n in counts:
        result["by_copies"][str(n)] = {"worker": copies(n, "worker", args), "spin": copies(n, "spin", args)}
    top = result["by_copies"][str(counts[-1])]["worker"]["us_per_step"]
    # lock-step with no parent: every worker steps its envs; the slowest copy sets the pace
    result["lockstep_ceiling_steps_per_s"] = round(counts[-1] / (top["slowest"] * 1e-6))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
