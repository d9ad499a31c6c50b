"""What do many Math-v0 environments with the python tool cost? Prints one JSON object.

``gym.make_vec("benchmax/Math-v0", num_envs=N)`` (the python tool on, the default), then, in order:
after ``reset``; after one step in which every environment runs a python call (and the most seen
while it ran); after a second such step. For each: the processes of the whole tree (this process,
the workers and everything under them), the processes under each worker (beyond the workers
themselves, which hold the environments), the tree's PSS (``/proc/PID/smaps_rollup``:
pages shared after fork counted once) and, for comparison, the sum of RSS (which counts them once
per process).

    python benchmarks/sandbox_scale.py [--envs 1024] [--workers 2]
    python benchmarks/sandbox_scale.py --episodes 1500   # the per-episode loop only

``--episodes N``: one ``gym.make("benchmax/Math-v0")`` in this process, N times ``reset`` and one
step running a python call; prints episodes/s, wall and CPU per episode (this process's, and the
sandbox server's with its calls'), the time inside ``sandbox._detach`` (umount2 of an episode's
tmpfs, on whichever thread runs it) and what the episode's close waits for it, and the time in
the id-file reads (``_given_ids``, ``_subid_pool_top``), each per episode, with how often each ran.

To measure another checkout (the code before a change), put it first on the path:
``PYTHONPATH=/path/to/checkout python benchmarks/sandbox_scale.py --envs 64``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import gymnasium as gym

import benchmax_gym
from _bench import alive, descendants, memory

CODE = "print(sum(range(10)))"
ACTION = '<tool_call>{"name": "python", "arguments": {"code": "' + CODE + '"}}</tool_call>'


def tree() -> list[int]:
    return [os.getpid(), *descendants()]


def snapshot(envs) -> dict:
    procs, pss, rss = 0, 0, 0
    for pid in tree():
        info = memory(pid)
        if info is None:
            continue
        procs += 1
        pss += info["pss"]
        rss += info["rss"]
    per_worker = [len(descendants(pid)) if alive(pid) else None for pid in envs.worker_pids]
    return {"processes": procs, "processes_under_each_worker": per_worker,
            "pss_mb": round(pss / 2**20, 1), "rss_sum_mb": round(rss / 2**20, 1)}


def peak_during(envs, fn) -> tuple[float, int, int]:
    """Run ``fn``; return its seconds, and the most processes seen in the tree and under one worker."""
    peak = [0, 0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], len(tree()))
            peak[1] = max([peak[1]] + [len(descendants(pid)) for pid in envs.worker_pids])
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return seconds, peak[0], peak[1]


def tree_cpu() -> dict[int, float]:
    """CPU seconds (user + system, with their reaped children's) of each live process below this one."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for pid in descendants():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    return out


def episode_loop(episodes: int) -> dict:
    """``episodes`` Math-v0 episodes (reset + one python step) in this process, instrumented."""
    from benchmax_gym.core import sandbox

    spent = {}

    def timing(name):
        real = getattr(sandbox, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                entry = spent.setdefault(name, [0.0, 0])
                entry[0] += time.perf_counter() - t
                entry[1] += 1

        setattr(sandbox, name, wrapper)
        return real

    reals = {name: timing(name) for name in ("_detach", "_given_ids", "_subid_pool_top")}
    # what an episode's close waits for its tmpfs to go (older code: the whole detach, on its thread)
    pool_method = "detach_episode" if hasattr(sandbox._Pool, "detach_episode") else "detach"
    real_method = getattr(sandbox._Pool, pool_method)

    def close_wait(self, path):
        t = time.perf_counter()
        try:
            return real_method(self, path)
        finally:
            entry = spent.setdefault("close_wait", [0.0, 0])
            entry[0] += time.perf_counter() - t
            entry[1] += 1

    setattr(sandbox._Pool, pool_method, close_wait)
    env = gym.make("benchmax/Math-v0", max_turns=10)
    try:
        env.reset(seed=0)
        env.step(ACTION)  # the server is up before the clock starts
        spent.clear()
        ok = 0
        below, cpu, start = tree_cpu(), os.times(), time.perf_counter()
        for i in range(episodes):
            env.reset(seed=i + 1)
            ok += "stdout:\n45" in env.step(ACTION)[0]
        env.reset(seed=0)  # the last episode's close is counted too
        seconds, after, below_after = time.perf_counter() - start, os.times(), tree_cpu()
    finally:
        env.close()
        for name, real in reals.items():
            setattr(sandbox, name, real)
        setattr(sandbox._Pool, pool_method, real_method)
    cpu_s = sum(after[:4]) - sum(cpu[:4])
    server_cpu_s = sum(t - below.get(pid, 0.0) for pid, t in below_after.items())
    return {"episodes": episodes, "calls_ok": ok, "episodes_per_s": round(episodes / seconds, 1),
            "wall_ms_per_episode": round(seconds / episodes * 1000, 3),
            "cpu_ms_per_episode": round(cpu_s / episodes * 1000, 3),  # this process
            "server_cpu_ms_per_episode": round(server_cpu_s / episodes * 1000, 3),  # the sandbox server and its calls
            **{f"{name.strip('_')}_ms_per_episode": round(spent.get(name, [0, 0])[0] / episodes * 1000, 4)
               for name in reals},  # detach: on whichever thread runs it
            "close_waits_for_detach_ms_per_episode": round(spent.get("close_wait", [0, 0])[0] / episodes * 1000, 4),
            **{f"{name.strip('_')}_runs": spent.get(name, [0, 0])[1] for name in reals}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=None, help="default: make_vec's (the number of CPUs)")
    parser.add_argument("--episodes", type=int, default=0,
                        help="measure N reset+step episodes of one Math-v0 env in this process instead")
    args = parser.parse_args()
    if args.episodes:
        print(json.dumps({"benchmark": "sandbox_scale", "mode": "episodes",
                          "code": os.path.dirname(os.path.dirname(os.path.abspath(benchmax_gym.__file__))),
                          **episode_loop(args.episodes)}))
        return

    kwargs = {} if args.workers is None else {"num_workers": args.workers}
    start = time.perf_counter()
    envs = gym.make_vec("benchmax/Math-v0", num_envs=args.envs, max_turns=10, step_timeout=600, **kwargs)
    made = time.perf_counter() - start
    try:
        start = time.perf_counter()
        _, infos = envs.reset(seed=0)
        reset_s = time.perf_counter() - start
        levels = sorted(set(infos["sandbox"]))
        time.sleep(1.0)  # anything started at reset has booted
        after_reset = snapshot(envs)
        steps = []
        for _ in range(2):
            out = {}

            def step():
                out["obs"] = envs.step([ACTION] * args.envs)[0]

            seconds, peak_tree, peak_worker = peak_during(envs, step)
            ok = sum("stdout:\n45" in obs for obs in out["obs"])
            time.sleep(0.5)
            steps.append({"seconds": round(seconds, 2), "calls_ok": ok, "peak_processes": peak_tree,
                          "peak_processes_under_a_worker": peak_worker, **snapshot(envs)})
    finally:
        envs.close()
    print(json.dumps({
        "benchmark": "sandbox_scale",
        "code": os.path.dirname(os.path.dirname(os.path.abspath(benchmax_gym.__file__))),
        "envs": args.envs,
        "workers": len(after_reset["processes_under_each_worker"]),
        "sandbox_level": levels,
        "make_vec_s": round(made, 2),
        "reset_s": round(reset_s, 2),
        "after_reset": after_reset,
        "after_python_step": steps[0],
        "after_second_python_step": steps[1],
    }))


if __name__ == "__main__":
    main()
