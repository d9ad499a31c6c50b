"""Eval harness throughput against a loopback OpenAI-compatible server with a fixed reply latency.

The scripted model (``benchmax_gym.testing.openai_server``, in its own process so it does not share
this process's CPU) answers every request after ``--latency`` seconds: a calculator call, then an
answer, so each Math-v0 episode makes two model calls and one tool call. With ``--concurrency C``
the ideal rate is C / latency calls per second; the harness's own CPU per episode is this
process's CPU time over the episodes. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmax_gym.eval import ChatPolicy, evaluate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=640)
    parser.add_argument("--mode", choices=("native", "text"), default="native")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "benchmax_gym.testing.openai_server", "--latency", str(args.latency)],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        policy = ChatPolicy("test-model", base_url=url, native_tools=args.mode == "native")
        evaluate("benchmax/Math-v0", policy, env_kwargs={"python_tool": False}, tasks=8, concurrency=8)  # warm up
        cpu, wall = time.process_time(), time.perf_counter()
        result = evaluate("benchmax/Math-v0", policy, env_kwargs={"python_tool": False}, tasks=args.episodes,
                          concurrency=args.concurrency, preflight=False)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        server.terminate()
        server.wait()
    calls = sum(r["turns"] for r in result.records)
    ideal = args.concurrency / args.latency
    print(json.dumps({
        "benchmark": "eval_throughput", "mode": args.mode, "latency_s": args.latency, "concurrency": args.concurrency,
        "episodes": len(result.records), "model_calls": calls, "failed": sum(r["error"] is not None for r in result.records),
        "mean_reward": sum(r["reward"] for r in result.records) / len(result.records),
        "wall_s": round(wall, 3), "calls_per_s": round(calls / wall, 1), "ideal_calls_per_s": ideal,
        "fraction_of_ideal": round(calls / wall / ideal, 3),
        "harness_cpu_ms_per_episode": round(1000 * cpu / len(result.records), 3),
        "harness_cpu_ms_per_call": round(1000 * cpu / calls, 3),
    }))


if __name__ == "__main__":
    main()
