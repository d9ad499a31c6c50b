"""Eval harness throughput against a loopback OpenAI-compatible server with a fixed reply latency.

The scripted model (``benchmax_gym.testing.openai_server``, in processes of its own so it does not
share this process's CPU; ``--server-processes`` of them on one port) answers every request after
``--latency`` seconds: a calculator call, then an answer, so each Math-v0 episode makes two model
calls and one tool call. With ``--concurrency C`` the ideal rate is C / latency calls per second.
``--latency-jitter J`` spreads each reply's wait uniformly over ``[1 - J, 1 + J]`` times the
latency (the mean, and so the ideal rate, stay the same): with every reply taking exactly the
latency, slots that start together keep coming back together, so each worker meets its replies
in bursts; a real server's spread breaks such bursts up.
Each (transport, concurrency, workers) runs twice (``--episodes-per-slot SHORT LONG`` episodes per
concurrent slot): ``fraction_of_ideal`` is the longer run's, whole (starting workers, making the
envs and the summary's statistics included; the workers' fork server starts once a process, in
the warm-up before, timed as ``fork_server_start``); ``steady_fraction_of_ideal`` is the rate between the
two runs (the fixed costs cancel out), what a long eval gets. ``harness_cpu_ms_per_call`` is the
CPU time of this process and its ``--workers`` processes over the longer run's model calls
(``steady_harness_cpu_ms_per_call``: between the two runs; ``parent_cpu_ms_per_call``: this
process alone; ``harness_kernel_cpu_ms_per_call``: the part spent in the kernel, where loopback
TCP does part of the receiving end's work too); ``server_cpu_ms_per_call`` is every server
process's, and ``server_busy_cores`` how many cores they kept busy (near ``--server-processes``:
the server, not the harness, caps the run). Where the time beyond the latency goes, per model
call: ``model_call_ms``, the call as the policy saw it (the server's latency, the HTTP round trip,
the wait for the worker's event loop to read the reply); ``episode_ms_per_call``, the episodes'
own time (that, plus the env's reset, steps and reward); ``slot_ms_per_call``, a slot's wall time
(that, plus what happens between episodes: sending the record, starting, the summary). ``env_cpu_ms_per_call`` is the environment's own share (reset, steps, reward: the same
episodes played in a loop with no model). ``client_alone`` is a client with no environment sending
an episode's first request, C at a time, in one process: ``lean`` (ChatPolicy's default path) and
``sdk`` (the official SDK's ``post``, on aiohttp when installed): what any harness on that client
and machine can reach. Worker counts stop at ``os.cpu_count()``. Prints JSON.

``--quick`` fits the whole default sweep (concurrency 64, 256, 1,024; workers 1, 4, 8, 16) in about
two minutes on a 16-core machine.
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

from _bench import cpu_seconds, descendants, need

need("eval", "openai", "httptools")
from benchmax_gym.eval import ChatPolicy, evaluate  # noqa: E402

ENV_KWARGS = {"python_tool": False}
CALL = json.dumps({"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}]})
ANSWER = json.dumps({"role": "assistant", "content": "\\boxed{2}", "tool_calls": []})


def _cpu() -> tuple[float, float, float]:
    """(this process's CPU s, with the workers', the kernel's share of that). The workers are the
    children of the fork server they start from (its own CPU, importing once, counts too), or of
    this process where they are spawned."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # (spawned workers, once they exit and are reaped)
    server, server_kernel = _fork_server_cpu()
    return (me.ru_utime + me.ru_stime, me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + server,
            me.ru_stime + kids.ru_stime + server_kernel)


def _fork_server_cpu() -> tuple[float, float]:
    """(CPU s, the kernel's part) of the eval workers' fork server and its exited children, from
    /proc/PID/stat (utime, stime, cutime, cstime); zeros before it starts."""
    from multiprocess import forkserver

    pid = forkserver._forkserver._forkserver_pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            utime, stime, cutime, cstime = map(int, f.read().rsplit(")", 1)[1].split()[11:15])
    except (OSError, TypeError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (utime + stime + cutime + cstime) / tick, (stime + cstime) / tick


def _server_cpu(pid: int) -> float:
    return sum(cpu_seconds(p) or 0.0 for p in [pid, *descendants(pid)])


def timed(policy, episodes, concurrency, workers=1, server=None):
    """(wall s, this process's CPU s, model calls, CPU s with the workers', the server's CPU s,
    the kernel's part of the harness's CPU s, (the model calls' seconds, the episodes' seconds))."""
    server_cpu = _server_cpu(server) if server else None
    before, wall = _cpu(), time.perf_counter()
    result = evaluate("benchmax/Math-v0", policy, env_kwargs=ENV_KWARGS, tasks=episodes, concurrency=concurrency,
                      preflight=False, workers=workers)
    wall = time.perf_counter() - wall
    cpu, total, system = (b - a for a, b in zip(before, _cpu()))
    if server_cpu is not None:
        server_cpu = _server_cpu(server) - server_cpu
    calls = sum(r["turns"] for r in result.records)
    assert not any(r["error"] for r in result.records), "a model call failed"
    model = sum(t["model_seconds"] for r in result.records for t in r["turn_log"])
    episodes = sum(r["seconds"] for r in result.records)
    return wall, cpu, calls, total, server_cpu, system, (model, episodes)


def env_alone(episodes: int) -> float:
    """ms of CPU per model call that the env itself spends (reset, the tool call, the reward)."""
    import gymnasium as gym

    env = gym.make("benchmax/Math-v0", tool_format="openai", tools_in_prompt=False, **ENV_KWARGS)
    base = env.unwrapped
    cpu = time.process_time()
    for i in range(episodes):
        env.reset(seed=i, options={"task_index": i})
        base.chat_messages("openai")
        env.step(CALL)
        base.chat_messages("openai")
        env.step(ANSWER)
        base.episode_record()
    cpu = time.process_time() - cpu
    env.close()
    return round(1000 * cpu / (2 * episodes), 3)


async def client_alone(kind, url, concurrency, calls, latency):
    """A client with no environment posting an episode's first request, ``concurrency`` at a time."""
    import gymnasium as gym
    import openai

    env = gym.make("benchmax/Math-v0", tool_format="openai", tools_in_prompt=False, **ENV_KWARGS)
    env.reset(seed=0)
    body = {"model": "test-model", "messages": env.unwrapped.chat_messages(), "tools": env.unwrapped.tool_schemas}
    env.close()
    if kind == "lean":
        policy = ChatPolicy("test-model", base_url=url, api_key="x")
        post, close = policy._lean_client().post, policy.aclose
    else:
        try:
            http = openai.DefaultAioHttpClient()
        except RuntimeError:
            http = None
        client = openai.AsyncOpenAI(base_url=url, api_key="x", http_client=http)
        post, close = (lambda b: client.post("/chat/completions", body=b, cast_to=object)), client.close
    slots = asyncio.Semaphore(concurrency)

    async def one():
        async with slots:
            await post(body)

    await asyncio.gather(*(one() for _ in range(concurrency)))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await close()
    return {"calls_per_s": round(calls / wall, 1),
            "fraction_of_ideal": round(calls / wall / (concurrency / latency), 3),
            "cpu_ms_per_call": round(1000 * cpu / calls, 3)}


def raise_open_files() -> None:
    """A socket per request in flight, on each side: the soft limit (often 1,024) up to the hard
    one, here and in the server processes (they inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 16, hard))
        except (ValueError, OSError):
            pass


def start_server(latency: float, processes: int, jitter: float = 0.0) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([sys.executable, "-m", "benchmax_gym.testing.openai_server", "--latency", str(latency),
                               "--latency-jitter", str(jitter), "--processes", str(processes)], stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().strip()
    if not url:
        raise SystemExit(f"the loopback server did not start (status {server.wait()})")
    return server, url


def main() -> None:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--latency-jitter", type=float, default=0.0, metavar="J",
                        help="each reply waits latency times a uniform draw in [1 - J, 1 + J] (mean: latency; "
                             "default 0: every reply takes exactly --latency)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 16],
                        help="eval --workers counts (those above os.cpu_count() are left out)")
    parser.add_argument("--transports", nargs="+", choices=("lean", "sdk"), default=["lean"],
                        help="ChatPolicy transports the harness runs with")
    parser.add_argument("--mode", choices=("native", "text"), default="native")
    parser.add_argument("--server-processes", type=int, default=max(1, cores // 2),
                        help="loopback server processes on one port (default: half the cores: at ~0.4 ms a "
                             "request, concurrency 1,024 needs about four busy ones)")
    parser.add_argument("--episodes-per-slot", type=int, nargs=2, default=[10, 40], metavar=("SHORT", "LONG"))
    parser.add_argument("--quick", action="store_true",
                        help="3 and 12 episodes per slot, shorter client-alone runs: the whole default sweep "
                             "in about two minutes on 16 cores")
    parser.add_argument("--no-client-alone", action="store_true", help="skip the client-alone runs")
    args = parser.parse_args()
    short_n, long_n = (3, 12) if args.quick else args.episodes_per_slot
    raise_open_files()
    workers_sweep = [w for w in args.workers if w <= cores] or [1]
    server, url = start_server(args.latency, args.server_processes, args.latency_jitter)
    runs, alone, fork_server = [], {}, None
    try:
        warm = ChatPolicy("test-model", base_url=url, native_tools=args.mode == "native")
        timed(warm, 8, 8)  # imports, first connections
        if max(workers_sweep) > 1:  # the workers' fork server starts (and imports) once a process, here
            started = _fork_server_cpu()[0], time.perf_counter()
            timed(warm, 8, 8, 2)
            fork_server = {"wall_s": round(time.perf_counter() - started[1], 3),
                           "cpu_s": round(_fork_server_cpu()[0] - started[0], 3)}
        for concurrency in args.concurrency:
            ideal = concurrency / args.latency
            if not args.no_client_alone:
                calls = (4 if args.quick else long_n) * concurrency
                alone[str(concurrency)] = {kind: asyncio.run(client_alone(kind, url, concurrency, calls, args.latency))
                                           for kind in ("lean", "sdk")}
            for transport in args.transports:
                policy = ChatPolicy("test-model", base_url=url, native_tools=args.mode == "native", transport=transport)
                for workers in workers_sweep:
                    short = timed(policy, short_n * concurrency, concurrency, workers)
                    wall, cpu, calls, total, server_cpu, system, waited = timed(
                        policy, long_n * concurrency, concurrency, workers, server.pid)
                    steady = (calls - short[2]) / (wall - short[0])
                    runs.append({
                        "transport": transport, "concurrency": concurrency, "workers": workers,
                        "episodes": calls // 2, "model_calls": calls, "wall_s": round(wall, 3),
                        "calls_per_s": round(calls / wall, 1), "ideal_calls_per_s": ideal,
                        "fraction_of_ideal": round(calls / wall / ideal, 3),
                        "steady_fraction_of_ideal": round(steady / ideal, 3),
                        "harness_cpu_ms_per_call": round(1000 * total / calls, 3),
                        "steady_harness_cpu_ms_per_call": round(1000 * (total - short[3]) / (calls - short[2]), 3),
                        "harness_kernel_cpu_ms_per_call": round(1000 * system / calls, 3),
                        "parent_cpu_ms_per_call": round(1000 * cpu / calls, 3),
                        "server_cpu_ms_per_call": round(1000 * server_cpu / calls, 3),
                        "server_busy_cores": round(server_cpu / wall, 3),
                        "model_call_ms": round(1000 * waited[0] / calls, 2),
                        "episode_ms_per_call": round(1000 * waited[1] / calls, 2),
                        "slot_ms_per_call": round(1000 * wall * concurrency / calls, 2),
                    })
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait()
    print(json.dumps({"benchmark": "eval_throughput", "mode": args.mode, "latency_s": args.latency,
                      "latency_jitter": args.latency_jitter,
                      "cpu_count": cores, "server_processes": args.server_processes,
                      "env_cpu_ms_per_call": env_alone(200 if args.quick else 1000),
                      "client_alone": alone, "fork_server_start": fork_server, "runs": runs}))


if __name__ == "__main__":
    main()
