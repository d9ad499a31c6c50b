"""Eval harness throughput against a loopback OpenAI-compatible server with a fixed reply latency.

The scripted model (``benchmax_gym.testing.openai_server``, in its own process so it does not share
this process's CPU) answers every request after ``--latency`` seconds: a calculator call, then an
answer, so each Math-v0 episode makes two model calls and one tool call. With ``--concurrency C``
the ideal rate is C / latency calls per second. Each level runs twice (10 and 40 episodes per
concurrent slot): ``fraction_of_ideal`` is the longer run's, whole (making the envs and the
summary's statistics included); ``steady_fraction_of_ideal`` is the rate between the two runs (the
fixed costs cancel out), what a long eval gets. The harness's own CPU is this process's CPU time
over the longer run's calls, its ``--workers`` processes' included (``harness_cpu_ms_per_call``;
``parent_cpu_ms_per_call`` is this process alone); ``server_cpu_ms_per_call`` is the loopback
server's (one process): when it nears ``1000 / calls_per_s`` ms, the server, not the harness,
caps the run. ``sdk_floor`` is the official SDK alone (the same call path: ``post`` returning the JSON) sending the same first request
of an episode, C at a time, with no environment: what any harness on this SDK and machine can reach.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time

from _bench import cpu_seconds, need

need("eval", "openai")
from benchmax_gym.eval import ChatPolicy, evaluate  # noqa: E402

ENV_KWARGS = {"python_tool": False}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # (the workers, once they exit and are reaped)
    return usage.ru_utime + usage.ru_stime


def timed(policy, episodes, concurrency, workers=1, server=None):
    """(wall s, this process's CPU s, model calls, CPU s with the workers', the server's CPU s)."""
    server_cpu = cpu_seconds(server) if server else None
    cpu, children, wall = time.process_time(), _children_cpu(), time.perf_counter()
    result = evaluate("benchmax/Math-v0", policy, env_kwargs=ENV_KWARGS, tasks=episodes, concurrency=concurrency,
                      preflight=False, workers=workers)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    total = cpu + _children_cpu() - children
    if server_cpu is not None:
        server_cpu = cpu_seconds(server) - server_cpu
    calls = sum(r["turns"] for r in result.records)
    assert not any(r["error"] for r in result.records), "a model call failed"
    return wall, cpu, calls, total, server_cpu


async def sdk_floor(url, concurrency, calls):
    """Bare ``AsyncOpenAI`` (on aiohttp when installed) posting a chat request, no environment."""
    import gymnasium as gym
    import openai

    env = gym.make("benchmax/Math-v0", tool_format="openai", tools_in_prompt=False, **ENV_KWARGS)
    env.reset(seed=0)
    body = {"model": "test-model", "messages": env.unwrapped.chat_messages(), "tools": env.unwrapped.tool_schemas}
    env.close()
    try:
        http = openai.DefaultAioHttpClient()
    except RuntimeError:
        http = None
    client = openai.AsyncOpenAI(base_url=url, api_key="x", http_client=http)
    slots = asyncio.Semaphore(concurrency)

    async def one():
        async with slots:
            await client.post("/chat/completions", body=body, cast_to=object)

    await asyncio.gather(*(one() for _ in range(concurrency)))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await client.close()
    return {"calls_per_s": round(calls / wall, 1), "fraction_of_ideal": round(calls / wall / (concurrency * 10), 3),
            "cpu_ms_per_call": round(1000 * cpu / calls, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--mode", choices=("native", "text"), default="native")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "benchmax_gym.testing.openai_server", "--latency", str(args.latency)],
                              stdout=subprocess.PIPE, text=True)
    runs = []
    try:
        url = server.stdout.readline().strip()
        policy = ChatPolicy("test-model", base_url=url, native_tools=args.mode == "native")
        timed(policy, 8, 8)  # warm up
        for concurrency in args.concurrency:
            for workers in args.workers:
                ideal = concurrency / args.latency
                short = timed(policy, 10 * concurrency, concurrency, workers)
                wall, cpu, calls, total, server_cpu = timed(policy, 40 * concurrency, concurrency, workers, server.pid)
                steady = (calls - short[2]) / (wall - short[0])
                runs.append({
                    "concurrency": concurrency, "workers": workers, "episodes": calls // 2, "model_calls": calls,
                    "wall_s": round(wall, 3),
                    "calls_per_s": round(calls / wall, 1), "ideal_calls_per_s": ideal,
                    "fraction_of_ideal": round(calls / wall / ideal, 3),
                    "steady_fraction_of_ideal": round(steady / ideal, 3),
                    "harness_cpu_ms_per_call": round(1000 * total / calls, 3),
                    "harness_cpu_ms_per_episode": round(2000 * total / calls, 3),
                    "parent_cpu_ms_per_call": round(1000 * cpu / calls, 3),
                    "server_cpu_ms_per_call": round(1000 * server_cpu / calls, 3),
                    "server_busy_share": round(server_cpu / wall, 3),  # of one core: near 1, the server caps it
                    "sdk_floor": asyncio.run(sdk_floor(url, concurrency, 40 * concurrency)) if workers == args.workers[0] else None,
                })
    finally:
        server.terminate()
        server.wait()
    print(json.dumps({"benchmark": "eval_throughput", "mode": args.mode, "latency_s": args.latency,
                      "cpu_count": os.cpu_count(), "runs": runs}))


if __name__ == "__main__":
    main()
