"""What serving an environment to OpenEnv adds to a step, and steps/s with many sessions. Prints
one JSON object.

A `benchmax-gym openenv-serve benchmax/Math-v0` process on loopback (python tool off, no turn
limit); every step is one calculator call, the cheapest real step, so the figures are the
transport's:

* per step: ``env.step`` in-process, against the same step on the server through OpenEnv's own
  WebSocket client (``GenericEnvClient``, awaited in a loop) and through ``benchmax/OpenEnv-v0``
  (``env.step``, synchronous, the gym API). The three alternate in rounds of 100, so drift in the
  machine's speed affects all alike. Overhead = served p50 (p99) - in-process p50 (p99);
* throughput: 64 sessions of OpenEnv's client stepping at once from one event loop, and
  ``gym.make_vec("benchmax/OpenEnv-v0", num_envs=64)`` stepped in lock-step (4 workers).

The server and the clients share this machine's cores.

    python benchmarks/openenv_overhead.py [--steps 3000] [--sessions 64] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
from _bench import need

need("openenv", "openenv.core")
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

import benchmax_gym  # noqa: E402, F401

ACTION = '<tool_call>{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3"}}</tool_call>'
ENV_ARGS = {"python_tool": False, "max_turns": 10**9}


def stats(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {"p50_ms": statistics.median(ordered) * 1e3,
            "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3}


def start_server(sessions: int) -> tuple[subprocess.Popen, str]:
    args = [a for k, v in ENV_ARGS.items() for a in ("--env-arg", f"{k}={json.dumps(v)}")]
    proc = subprocess.Popen([sys.executable, "-m", "benchmax_gym.cli", "openenv-serve", "benchmax/Math-v0", "--port", "0",
                             "--max-sessions", str(sessions + 8), *args], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if found := re.search(r"listening on (http://\S+)", line):
            return proc, found.group(1)
    raise RuntimeError(f"openenv-serve exited with {proc.wait()}")


async def client_steps(client: GenericEnvClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await client.step({"text": ACTION})
        out.append(time.perf_counter() - t)
    return out


async def many_sessions(url: str, sessions: int, seconds: float) -> dict[str, float]:
    clients = [GenericEnvClient(base_url=url) for _ in range(sessions)]
    await asyncio.gather(*(c.connect() for c in clients))
    await asyncio.gather(*(c.reset(seed=i) for i, c in enumerate(clients)))
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def run(client):
        count = 0
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            await client.step({"text": ACTION})
            latencies.append(time.perf_counter() - t)
            count += 1
        return count

    start = time.perf_counter()
    counts = await asyncio.gather(*(run(c) for c in clients))
    elapsed = time.perf_counter() - start
    await asyncio.gather(*(c.close() for c in clients))
    return {"sessions": sessions, "steps_per_s": sum(counts) / elapsed, **stats(latencies)}


def vector_lockstep(url: str, sessions: int, seconds: float) -> dict[str, float]:
    envs = gym.make_vec("benchmax/OpenEnv-v0", num_envs=sessions, num_workers=4, base_url=url)
    envs.reset(seed=0)
    actions = np.array([ACTION] * sessions, dtype=object)
    for _ in range(5):
        envs.step(actions)
    rounds, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(actions)
        rounds += 1
    elapsed = time.perf_counter() - start
    envs.close()
    return {"sessions": sessions, "workers": 4, "steps_per_s": rounds * sessions / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="steps per kind, in rounds of 100")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    args = parser.parse_args()

    proc, url = start_server(args.sessions)
    try:
        local = gym.make("benchmax/Math-v0", **ENV_ARGS)
        local.reset(seed=0)
        remote = gym.make("benchmax/OpenEnv-v0", base_url=url)
        remote.reset(seed=0)
        client = GenericEnvClient(base_url=url)
        loop = asyncio.new_event_loop()
        loop.run_until_complete(client.reset(seed=0))
        kinds: dict[str, list[float]] = {"in_process": [], "openenv_client": [], "gym_consumer": []}
        for r in range(max(1, args.steps // 100) + 1):  # round 0 warms up and is not kept
            timed = {"in_process": [], "gym_consumer": []}
            for name, env in (("in_process", local), ("gym_consumer", remote)):
                for _ in range(100):
                    t = time.perf_counter()
                    env.step(ACTION)
                    timed[name].append(time.perf_counter() - t)
            timed["openenv_client"] = loop.run_until_complete(client_steps(client, 100))
            if r:
                for name, samples in timed.items():
                    kinds[name] += samples
        loop.run_until_complete(client.close())
        loop.close()
        local.close()
        remote.close()
        per_step = {name: stats(samples) for name, samples in kinds.items()}
        base = per_step["in_process"]
        overhead = {name: {k: per_step[name][k] - base[k] for k in base} for name in ("openenv_client", "gym_consumer")}
        concurrent = asyncio.run(many_sessions(url, args.sessions, args.seconds))
        vector = vector_lockstep(url, args.sessions, args.seconds)
    finally:
        proc.terminate()
        proc.wait()
    print(json.dumps({
        "env": "benchmax/Math-v0 (calculator step)", "transport": "WebSocket /ws on 127.0.0.1",
        "cpus": os.cpu_count(), "steps_per_kind": len(kinds["in_process"]),
        "per_step": per_step, "overhead": overhead, "target_p50_ms": 1.0,
        "concurrent_openenv_client": concurrent, "make_vec_lockstep": vector,
    }, indent=1))


if __name__ == "__main__":
    main()
