"""SubprocVectorEnv against Gymnasium's AsyncVectorEnv and SyncVectorEnv, and GEM's SyncVectorEnv.
Prints one JSON object.

Same environment, same actions, one run:
1. cheap tool: Math-v0's calculator, 64 envs: environment steps per second, over ``--rounds``
   interleaved rounds (median and range): ``SubprocVectorEnv`` with full infos (``subproc``:
   the caller reads none of them, so the object columns are never decoded; ``subproc_read``: it
   reads every value), with ``info_keys=["error", "reward_components"]`` (the lighter info mode), Gymnasium's
   ``AsyncVectorEnv`` and ``SyncVectorEnv`` on the same env, and GEM's own ``SyncVectorEnv`` over
   its ``ToolEnvWrapper`` with the same calculator (``step_overhead.py``'s peer, run in the
   interpreter ``--gem-python`` names; left out when it has no GEM). The episodes never end
   (``max_turns=10**9``): transcripts grow as in a long episode (``--max-turns N``: episodes of
   N turns, each env resetting, with a new generated task, every N + 1 steps; GEM's episodes
   never end);
2. scaling: the lighter-info ``SubprocVectorEnv`` at 64 and at ``--scale-envs`` (4,096) envs,
   interleaved rounds (``--scale-envs 0`` leaves it out);
3. heavy-tailed tool latency (an async sleep: 90% 5 ms, 10% 200 ms), 64 envs: steps per second,
   lock-step and ready-first (``send``/``recv``);
4. memory: resident (and proportional) set size of all processes for 64 and 256 envs;
5. the parent's own CPU (``time.process_time`` of this process, which never counts the workers)
   per environment step, lock-step calculator envs, for each size of ``--parent-envs`` (64 and
   1,024), with ``info_keys``, with full infos and with full infos all read by the caller
   (``full_infos_read``: the object columns are decoded when read), and the steps per second alongside, for each
   worker count of ``--sweep`` (1, 2, 4, 8, 16, capped at ``os.cpu_count()`` unless
   ``--past-cores``: the parent's CPU per step is still its own there, the steps per second are
   the cores' limit) and the default
   ``num_workers``, and the workers' CPU per step (all of them, from /proc); beside them, at the
   same sizes, Gymnasium's ``SyncVectorEnv`` (steps per second and its CPU per step: all its work
   is this process's) and GEM's ``SyncVectorEnv``, and ``per_worker_parent_us``: what one more
   worker costs the parent per batch (the slope of its CPU per batch over the sweep, ``info_keys``),
   the figure behind the default worker count; and ``parent_alone_full_infos_us_per_step``, the
   parent's work on such a batch (full infos, the default's messages) timed alone in this process,
   which a shared machine's load moves far less (``..._read_us_per_step``: every info value read too). The parent's serial work is the ceiling of a
   many-core machine (1 us of it per step caps every worker count at 1M steps/s); on a shared or
   small machine its CPU per step is the figure to compare, as wall-clock rates move with the
   load.

``--sections`` runs some of them (``parent,cheap,scale,tail,memory``; default all). ``--quick``:
one round of one second, sections ``parent,cheap`` unless named (about 90 s on 16 cores).

AsyncVectorEnv's figure swings widely from run to run on a 2-core machine (its 64 processes
compete for two cores): compare medians over rounds.

    python benchmarks/vector_throughput.py [--envs 64] [--seconds 3] [--rounds 3] [--scale-envs 4096]
        [--parent-envs 64,1024] [--sweep 1,2,4,8,16] [--past-cores] [--sections parent,cheap,scale,tail,memory] [--quick] [--max-turns N]
        [--gem-python PYTHON (default $BENCHMAX_GEM_PYTHON, else this interpreter when gem-llm imports
         here; without one GEM is skipped)]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import statistics
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

import benchmax_gym
from benchmax_gym.wrappers import SubprocVectorEnv
try:
    from benchmax_gym.wrappers.vector import default_workers
except ImportError:  # (an older checkout on PYTHONPATH, for before/after figures: its default)
    def default_workers(num_envs: int) -> int:
        return min(num_envs, os.cpu_count() or 1)

from _bench import cpu_seconds, descendants, memory as process_memory, peer_python
from step_overhead import ACTION as CALC, Peer  # the action (one calculator call) and the GEM peer


async def wait_ms(ms: float) -> str:
    """Wait, like a tool waiting on a remote service.

    Args:
        ms: milliseconds
    """
    await asyncio.sleep(ms / 1000)
    return "ok"


SLOW_ID = benchmax_gym.register_tool_env(
    "bench/HeavyTail-v0", tools=[wait_ms], tasks=[{"prompt": "wait", "answer": "ok"}],
    rubric=[lambda completion: 0.0], max_turns=10**9, tool_timeout=5,
)


def make_math(max_turns: int = 10**9):
    return gym.make("benchmax/Math-v0", python_tool=False, max_turns=max_turns)


math_env = make_math  # (main: a partial with --max-turns)


def slow_env():
    return gym.make(SLOW_ID)


def latency_action(rng: np.random.Generator) -> str:
    ms = 200 if rng.random() < 0.1 else 5
    return f'<tool_call>{{"name": "wait_ms", "arguments": {{"ms": {ms}}}}}</tool_call>'


def lockstep_rate(envs, actions_for, seconds: float, read: bool = False) -> float:
    """Steps per second; ``read``: the caller reads every info value of every batch."""
    envs.reset(seed=0)
    for _ in range(3):  # warm up
        envs.step(actions_for())
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        infos = envs.step(actions_for())[4]
        if read:
            for _ in infos.values():
                pass
        steps += envs.num_envs
    return steps / (time.perf_counter() - start)


def ready_first_rate(envs: SubprocVectorEnv, rng, seconds: float, batch: int) -> float:
    envs.reset(seed=0)
    envs.send([latency_action(rng) for _ in range(envs.num_envs)], np.arange(envs.num_envs))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        *_, ids = envs.recv(min_ready=batch)
        steps += len(ids)
        envs.send([latency_action(rng) for _ in ids], ids)
    rate = steps / (time.perf_counter() - start)
    envs.recv(min_ready=envs.num_envs)  # drain before closing
    return rate


def parent_cpu(envs, seconds: float, read: bool = False) -> dict:
    """Lock-step: the parent's CPU (this process only) per env step, and the steps per second;
    ``read``: the caller reads every info value of every batch (the object columns, decoded
    when first read, included)."""
    n = envs.num_envs
    actions = [CALC] * n
    envs.reset(seed=0)
    for _ in range(3):  # warm up
        envs.step(actions)
    pids = getattr(envs, "worker_pids", [])  # (none: Gymnasium's SyncVectorEnv, all in this process)
    workers = sum(map(cpu_seconds, pids))
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        infos = envs.step(actions)[4]
        if read:
            for _ in infos.values():
                pass
        steps += n
    cpu, wall = time.process_time() - cpu, time.perf_counter() - start
    workers = sum(map(cpu_seconds, pids)) - workers
    return {"parent_cpu_us_per_step": round(cpu / steps * 1e6, 3), "steps_per_s": round(steps / wall),
            "workers_cpu_us_per_step": round(workers / steps * 1e6, 3)}  # (at the clock tick's resolution)


def parent_alone(n: int, workers: int, seconds: float, read: bool = False) -> float:
    """The parent's own work on a lock-step batch, alone in this process (no workers running
    beside it, caches warm): decoding ``workers`` messages of ``n`` calculator envs' full infos
    as the workers send them and joining them into the batch, with the garbage collector as in
    a step (``read``: and reading every info value, the object columns decoded then); CPU
    microseconds per env step. A shared machine's load moves it far less than the lock-step
    figure, so before/after compare here best."""
    import pickle

    from benchmax_gym.wrappers import vector, worker

    envs = [math_env().unwrapped for _ in range(n)]
    for env in envs:
        env.reset(seed=0)
    for _ in range(3):
        rows = [(i, env.step(CALC)) for i, env in enumerate(envs)]
    bounds = np.linspace(0, n, workers + 1).astype(int)
    messages = [pickle.dumps(("batch", worker.pack_results(rows[a:b]))) for a, b in zip(bounds, bounds[1:])]
    del envs, rows
    parent = vector.SubprocVectorEnv.__new__(vector.SubprocVectorEnv)  # the parent's logic, no workers
    parent.num_envs, parent.single_observation_space = n, benchmax_gym.UnicodeText(10**6)

    def step():
        with vector._collections_paused():
            batch = parent._batch_columns([worker.unpack_results(pickle.loads(m)[1]) for m in messages])
        if read:
            for _ in batch[4].values():
                pass

    for _ in range(3):
        step()
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        step()
        steps += n
    return round((time.process_time() - cpu) / steps * 1e6, 3)


def median_range(values: list[float]) -> dict:
    return {"median": round(statistics.median(values)), "min": round(min(values)), "max": round(max(values))}


def memory(make, n: int) -> dict:
    envs = make(n)
    envs.reset(seed=0)
    gc.collect()
    time.sleep(0.5)
    procs = [os.getpid(), *descendants()]
    rss = pss = 0
    for info in filter(None, map(process_memory, procs)):
        rss += info["rss"]
        pss += info["pss"]
    envs.close()
    return {"envs": n, "processes": len(procs), "rss_mb": rss / 2**20, "pss_mb": pss / 2**20}


def gem_peer(args, result: dict) -> Peer | None:
    """GEM's stepping loop in the interpreter ``--gem-python`` names (None, with the reason in
    ``result``, when there is none)."""
    gem_python, skipped = peer_python("--gem-python", "BENCHMAX_GEM_PYTHON", "gem-llm", args.gem_python, "gem")
    if skipped:
        result["gem_skipped"] = skipped
        print(f"GEM {skipped}", file=sys.stderr)
        return None
    try:
        return Peer("gem", gem_python)
    except RuntimeError as exc:
        result["gem_skipped"] = str(exc)[-300:]
        return None


def parent_section(args, sizes: list[int], cpus: int, keys: list[str], gem: Peer | None) -> dict:
    """Per size: the worker sweep and the default worker count (parent CPU per env step, steps
    per second; medians over rounds), Gymnasium's and GEM's SyncVectorEnv alongside."""
    out: dict[str, dict] = {}
    for size in sizes:
        default = default_workers(size)
        counts = [w for w in map(int, args.sweep.split(",")) if (w <= cpus or args.past_cores) and w <= size] or [1]
        sweep: dict[str, dict] = {}
        for count in sorted({*counts, default}):
            for mode, info_keys, read in (("info_keys", keys, False), ("full_infos", None, False),
                                          ("full_infos_read", None, True)):
                runs = []
                for _ in range(args.rounds):
                    envs = SubprocVectorEnv([math_env] * size, num_workers=count, info_keys=info_keys)
                    runs.append(parent_cpu(envs, args.seconds, read))
                    envs.close()
                sweep.setdefault(str(count), {})[mode] = {
                    key: statistics.median(run[key] for run in runs) for key in runs[0]}
        entry: dict = {"by_workers": sweep, "default_workers": default,
                       "parent_alone_full_infos_us_per_step": statistics.median(
                           parent_alone(size, default, args.seconds) for _ in range(args.rounds)),
                       "parent_alone_full_infos_read_us_per_step": statistics.median(
                           parent_alone(size, default, args.seconds, True) for _ in range(args.rounds))}
        syncs = []
        for _ in range(args.rounds):
            envs = SyncVectorEnv([math_env] * size)
            syncs.append(parent_cpu(envs, args.seconds, True))
            envs.close()
        entry["gym_sync"] = {key: statistics.median(run[key] for run in syncs)
                             for key in ("parent_cpu_us_per_step", "steps_per_s")}
        if gem:
            entry["gem_sync_steps_per_s"] = round(statistics.median(
                gem.vector_rate(size, args.seconds) for _ in range(args.rounds)))
        at_default = sweep[str(default)]
        for mode in ("full_infos", "full_infos_read", "info_keys"):
            entry[f"default_{mode}_over_gym_sync"] = round(
                at_default[mode]["steps_per_s"] / entry["gym_sync"]["steps_per_s"], 3)
            if gem:
                entry[f"default_{mode}_over_gem_sync"] = round(
                    at_default[mode]["steps_per_s"] / entry["gem_sync_steps_per_s"], 3)
        if len(counts) > 1:  # one more worker's cost to the parent, per batch (the default's K)
            low, high = sweep[str(counts[0])]["info_keys"], sweep[str(counts[-1])]["info_keys"]
            entry["per_worker_parent_us"] = round(
                (high["parent_cpu_us_per_step"] - low["parent_cpu_us_per_step"]) * size / (counts[-1] - counts[0]), 2)
        out[str(size)] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale-envs", type=int, default=4096)
    parser.add_argument("--parent-envs", default="64,1024", help="env counts for the parent CPU figures")
    parser.add_argument("--sweep", default="1,2,4,8,16", help="worker counts for the parent CPU figures")
    parser.add_argument("--past-cores", action="store_true",
                        help="keep --sweep's worker counts above os.cpu_count() (what each worker costs the parent)")
    parser.add_argument("--sections", default=None, help="parent,cheap,scale,tail,memory (default all)")
    parser.add_argument("--quick", action="store_true", help="one round of 1 s; sections parent,cheap unless named")
    parser.add_argument("--gem-python", help="an interpreter with gem-llm (default: $BENCHMAX_GEM_PYTHON)")
    parser.add_argument("--max-turns", type=int, default=10**9,
                        help="the calculator episodes' length (default 10**9: they never end, transcripts grow)")
    args = parser.parse_args()
    global math_env
    math_env = functools.partial(make_math, max_turns=args.max_turns)
    if args.quick:
        args.rounds, args.seconds = 1, 1.0
    sections = set((args.sections or ("parent,cheap" if args.quick else "parent,cheap,scale,tail,memory")).split(","))
    n, secs = args.envs, args.seconds
    workers = os.cpu_count() or 1
    result = {"benchmark": "vector_throughput", "envs": n, "cpus": workers, "cpu_count": os.cpu_count(),
              "rounds": args.rounds, "seconds": secs, "max_turns": args.max_turns}
    keys = ["error", "reward_components"]
    gem = gem_peer(args, result) if sections & {"parent", "cheap"} else None

    if "parent" in sections:
        sizes = [int(size) for size in str(args.parent_envs).split(",")]
        result["parent_lockstep"] = parent_section(args, sizes, workers, keys, gem)

    makers = {
        "subproc": lambda k: SubprocVectorEnv([math_env] * k),  # (the default num_workers)
        "subproc_info_keys": lambda k: SubprocVectorEnv([math_env] * k, info_keys=keys),
        "subproc_read": lambda k: SubprocVectorEnv([math_env] * k),  # (the caller reads every info value)
        "async": lambda k: AsyncVectorEnv([math_env] * k, shared_memory=False),
        "sync": lambda k: SyncVectorEnv([math_env] * k),
    }
    if "cheap" in sections:
        rounds: dict[str, list[float]] = {name: [] for name in [*makers, *(["gem_sync"] if gem else [])]}
        for _ in range(args.rounds):
            for name, make in makers.items():
                envs = make(n)
                rounds[name].append(lockstep_rate(envs, lambda: [CALC] * n, secs, name.endswith("_read")))
                envs.close()
            if gem:
                rounds["gem_sync"].append(gem.vector_rate(n, secs))
        cheap = {name: median_range(values) for name, values in rounds.items()}
        for name in ("subproc", "subproc_read", "subproc_info_keys"):
            cheap[f"{name}_over_sync"] = cheap[name]["median"] / cheap["sync"]["median"]
            if gem:
                cheap[f"{name}_over_gem_sync"] = cheap[name]["median"] / cheap["gem_sync"]["median"]
        cheap["subproc_over_async"] = cheap["subproc"]["median"] / cheap["async"]["median"]
        result["cheap_tool_steps_per_s"] = cheap

    if args.scale_envs and "scale" in sections:
        scale: dict[str, list[float]] = {str(n): [], str(args.scale_envs): []}
        for _ in range(args.rounds):
            for count in (n, args.scale_envs):
                envs = makers["subproc_info_keys"](count)
                scale[str(count)].append(lockstep_rate(envs, lambda count=count: [CALC] * count, secs))
                envs.close()
        result["scaling_info_keys_steps_per_s"] = {
            **{count: median_range(values) for count, values in scale.items()},
            "change": statistics.median(scale[str(args.scale_envs)]) / statistics.median(scale[str(n)]) - 1,
        }

    if "tail" in sections:
        rng = np.random.default_rng(0)
        tail = {}
        for name, make in (
            ("subproc_lockstep", lambda: SubprocVectorEnv([slow_env] * n, num_workers=workers)),
            ("async", lambda: AsyncVectorEnv([slow_env] * n, shared_memory=False)),
            ("sync", lambda: SyncVectorEnv([slow_env] * n)),
        ):
            envs = make()
            tail[name] = lockstep_rate(envs, lambda: [latency_action(rng) for _ in range(n)], secs)
            envs.close()
        envs = SubprocVectorEnv([slow_env] * n, num_workers=workers)
        tail["subproc_ready_first"] = ready_first_rate(envs, rng, secs, batch=max(1, n // 8))
        envs.close()
        tail["ready_first_over_async"] = tail["subproc_ready_first"] / tail["async"]
        result["heavy_tail_steps_per_s"] = tail

    if "memory" in sections:
        mem = {}
        for count in (1, 64, 256):
            mem[str(count)] = memory(lambda k: SubprocVectorEnv([math_env] * k, num_workers=min(workers, k)), count)
        for count in ("64", "256"):
            extra = int(count) - 1
            mem[f"rss_mb_per_env_beyond_first_{count}"] = (mem[count]["rss_mb"] - mem["1"]["rss_mb"]) / extra
            mem[f"pss_mb_per_env_beyond_first_{count}"] = (mem[count]["pss_mb"] - mem["1"]["pss_mb"]) / extra
        mem["async_64"] = memory(lambda k: AsyncVectorEnv([math_env] * k, shared_memory=False), 64)
        result["memory"] = mem
    if gem:
        gem.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
