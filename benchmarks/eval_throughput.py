"""Eval harness throughput against a loopback OpenAI-compatible server with a fixed reply latency.

The scripted model (``benchmax_gym.testing.openai_server``, in its own process so it does not share
this process's CPU) answers every request after ``--latency`` seconds: a calculator call, then an
answer, so each Math-v0 episode makes two model calls and one tool call. With ``--concurrency C``
the ideal rate is C / latency calls per second. Each level runs twice (10 and 40 episodes per
concurrent slot): ``fraction_of_ideal`` is the longer run's, whole (making the envs and the
summary's statistics included); ``steady_fraction_of_ideal`` is the rate between the two runs (the
fixed costs cancel out), what a long eval gets. The harness's own CPU is this process's CPU time
over the longer run's calls. ``sdk_floor`` is the official SDK alone (the same call path: ``post`` returning the JSON) sending the same first request
of an episode, C at a time, with no environment: what any harness on this SDK and machine can reach.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from _bench import need

need("eval", "openai")
from benchmax_gym.eval import ChatPolicy, evaluate  # noqa: E402

ENV_KWARGS = {"python_tool": False}


def timed(policy, episodes, concurrency, workers=1):
    cpu, wall = time.process_time(), time.perf_counter()
    result = evaluate("benchmax/Math-v0", policy, env_kwargs=ENV_KWARGS, tasks=episodes, concurrency=concurrency,
                      preflight=False, workers=workers)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    calls = sum(r["turns"] for r in result.records)
    assert not any(r["error"] for r in result.records), "a model call failed"
    return wall, cpu, calls


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
                wall, cpu, calls = timed(policy, 40 * concurrency, concurrency, workers)
                steady = (calls - short[2]) / (wall - short[0])
                runs.append({
                    "concurrency": concurrency, "workers": workers, "episodes": calls // 2, "model_calls": calls,
                    "wall_s": round(wall, 3),
                    "calls_per_s": round(calls / wall, 1), "ideal_calls_per_s": ideal,
                    "fraction_of_ideal": round(calls / wall / ideal, 3),
                    "steady_fraction_of_ideal": round(steady / ideal, 3),
                    # workers > 1: the parent's CPU only (the workers' is not counted here)
                    "harness_cpu_ms_per_call": round(1000 * cpu / calls, 3) if workers == 1 else None,
                    "harness_cpu_ms_per_episode": round(2000 * cpu / calls, 3) if workers == 1 else None,
                    "sdk_floor": asyncio.run(sdk_floor(url, concurrency, 40 * concurrency)) if workers == args.workers[0] else None,
                })
    finally:
        server.terminate()
        server.wait()
    print(json.dumps({"benchmark": "eval_throughput", "mode": args.mode, "latency_s": args.latency, "runs": runs}))


if __name__ == "__main__":
    main()
