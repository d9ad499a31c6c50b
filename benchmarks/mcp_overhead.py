"""What MCP-v0 adds to a tool call, over the bare SDK on the same server. Prints one JSON object.

* server start: ``gym.make`` + first ``reset`` (spawn, initialize, list_tools), and a bare SDK
  ``Client`` entering the same stdio server;
* tool call: ``env.step`` with one ``calculate`` call, against the floor: ``client.call_tool`` on
  the environment's own live session, awaited inside the loop that owns it (a loop of awaits,
  as an async program would make them), and the same bare call made one at a time from
  synchronous code. Env steps and bare calls alternate in rounds, so drift in the machine's
  speed affects both alike; the episode is reset every 100 steps (not timed);
* the same call through the SDK's own ``stdio_client`` on a second server process, for the
  transport (the environment reads stdio with its own linear-time transport).

* rollout throughput: steps/s of one env stepped in this thread, and of 4 envs in 2
  ``SubprocVectorEnv`` workers (each worker's event loop holds its envs' sessions).

    python benchmarks/mcp_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time

import gymnasium as gym
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import benchmax_gym  # noqa: F401

ACTION = '<tool_call>{"name": "calculate", "arguments": {"expression": "(12 + 7) * 3"}}</tool_call>'
SERVER = StdioServerParameters(command=sys.executable, args=["-m", "benchmax_gym.envs.mcp.example_server"])


def stats(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {"p50_ms": statistics.median(ordered) * 1e3, "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3}


async def bare_start() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        params = SERVER.model_copy(update={"cwd": tmp})
        start = time.perf_counter()
        async with Client(params):
            return time.perf_counter() - start


async def sdk_transport_calls(n: int) -> list[float]:
    """The same calls through the SDK's own ``stdio_client`` (the env uses its own stdio
    transport, see envs/mcp/stdio.py): shows that transport costs nothing on small messages."""
    with tempfile.TemporaryDirectory() as tmp:
        async with Client(SERVER.model_copy(update={"cwd": tmp})) as client:
            await floor_calls(client, 50)
            return await floor_calls(client, n)


async def floor_calls(client, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await client.call_tool("calculate", {"expression": "(12 + 7) * 3"})
        out.append(time.perf_counter() - t)
    return out


def throughput(num_envs: int, workers: int, rounds: int) -> float:
    if num_envs == 1:
        env = gym.make("benchmax/MCP-v0", max_turns=10**9)
        step, close = env.step, env.close
    else:
        envs = gym.make_vec("benchmax/MCP-v0", num_envs=num_envs, num_workers=workers, max_turns=10**9)
        step, close = (lambda action: envs.step((action,) * num_envs)), envs.close
        env = envs
    env.reset(seed=0)
    for _ in range(20):
        step(ACTION)
    start = time.perf_counter()
    for _ in range(rounds):
        step(ACTION)
    elapsed = time.perf_counter() - start
    close()
    return rounds * num_envs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    starts, bare = [], []
    for _ in range(3):
        t = time.perf_counter()
        env = gym.make("benchmax/MCP-v0", max_turns=10**9)
        env.reset(seed=0)
        starts.append(time.perf_counter() - t)
        env.close()
        bare.append(asyncio.run(bare_start()))

    env = gym.make("benchmax/MCP-v0", max_turns=10**9)
    env.reset(seed=0)
    aio = env.unwrapped.aio
    client = env.unwrapped.connections["server"].client
    steps, floor, from_sync = [], [], []
    rounds = max(1, args.calls // 100)
    for r in range(rounds + 1):  # round 0 warms up and is not kept
        env.reset(seed=0)
        s, f, y = [], [], []
        for _ in range(100):
            t = time.perf_counter()
            env.step(ACTION)
            s.append(time.perf_counter() - t)
        f = aio.run(floor_calls(client, 100))
        for _ in range(100):
            t = time.perf_counter()
            aio.run(client.call_tool("calculate", {"expression": "(12 + 7) * 3"}))
            y.append(time.perf_counter() - t)
        if r:
            steps += s
            floor += f
            from_sync += y
    env.close()
    sdk_transport = asyncio.run(sdk_transport_calls(args.calls))
    single, vector = throughput(1, 1, 500), throughput(4, 2, 250)

    result = {
        "benchmark": "mcp_overhead",
        "server_start_env": stats(starts),
        "server_start_bare_sdk": stats(bare),
        "tool_call_env": stats(steps),
        "tool_call_floor_sdk": stats(floor),
        "tool_call_floor_sdk_from_sync": stats(from_sync),
        "tool_call_sdk_stdio_client": stats(sdk_transport),
        "steps_per_s_one_env": single,
        "steps_per_s_4_envs_2_workers": vector,
    }
    result["overhead_ms_p50"] = result["tool_call_env"]["p50_ms"] - result["tool_call_floor_sdk"]["p50_ms"]
    result["overhead_over_sync_floor_ms_p50"] = (
        result["tool_call_env"]["p50_ms"] - result["tool_call_floor_sdk_from_sync"]["p50_ms"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
