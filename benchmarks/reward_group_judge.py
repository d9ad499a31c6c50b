"""What group and judged rewards cost (issue 30, sections 3 and 4). Prints JSON.

* ``group``: Math-v0 episodes played in-process by the reference solver (reset, a calculator
  call, the answer: today's final-only rubric scores the last step), then a ``GroupRubric``
  (relative rank, diversity penalty, best-of-k) over each task's k=8 records. ``overhead_fraction``
  is the group's time per episode over the whole episode's; ``group_over_final_rubric`` over the
  final-only rubric's own scoring.
* ``judge``: ``JudgeRubric`` pointwise judgments (distinct, cache off) against the scripted judge
  (``benchmax_gym.testing.openai_server --judge``, in its own process) answering after
  ``--latency`` s, ``--concurrency`` in flight; ideal is concurrency / latency judgments a second.
  ``rescore_*`` re-scores the same judgments from the on-disk cache (zero calls). ``sdk_floor`` is
  the official SDK alone (on aiohttp when installed) posting the same requests, C at a time: what
  any client reaches on this machine against this server. ``cpu_ms_per_*``: this process's CPU
  per judgment / call (the server runs in its own process): the judge's own cost beside the SDK's,
  a figure a loaded machine disturbs less than the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time

from _bench import need

need("eval", "openai")
import gymnasium as gym  # noqa: E402

import benchmax_gym  # noqa: E402, F401
from benchmax_gym.core.group import GroupRubric, best_of_k, diversity_penalty, relative_rank, score_groups  # noqa: E402
from benchmax_gym.core.judge import JudgeRubric  # noqa: E402
from benchmax_gym.core.tasks import Task  # noqa: E402


def group_cost(tasks: int, k: int) -> dict:
    env = gym.make("benchmax/Math-v0", python_tool=False)
    solver = env.unwrapped.reference_solver()
    records = []
    start = time.perf_counter()
    for task in range(tasks):
        for _ in range(k):
            obs, info = env.reset(options={"task_index": task})
            done = False
            while not done:
                obs, _, terminated, truncated, info = env.step(solver(obs, info))
                done = terminated or truncated
            records.append(env.unwrapped.episode_record())
    episode_s = (time.perf_counter() - start) / len(records)
    rubric, tasks = env.unwrapped.rubric, env.unwrapped.tasks
    contexts = [{"completion": r["actions"][-1], "answer": tasks.get(r["task_index"]).answer,
                 "task": tasks.get(r["task_index"]), "messages": r["messages"]} for r in records]
    start = time.perf_counter()
    for context in contexts:
        rubric.score(**context)
    final_s = (time.perf_counter() - start) / len(records)
    env.close()
    rubric = GroupRubric([("rank", relative_rank, 1.0), ("diverse", diversity_penalty, 0.1), best_of_k])
    score_groups(records[:k], rubric)  # warm
    start = time.perf_counter()
    scored = score_groups(records, rubric)
    group_s = (time.perf_counter() - start) / len(records)
    assert all(r["group_size"] == k for r in scored)
    return {"k": k, "episodes": len(records), "final_only_episode_us": round(1e6 * episode_s, 1),
            "final_rubric_us_per_episode": round(1e6 * final_s, 1),
            "group_rubric_us_per_episode": round(1e6 * group_s, 1),
            "group_over_final_rubric": round(group_s / final_s, 2),
            "overhead_fraction": round(group_s / episode_s, 4)}


async def judge_rate(url: str, judgments: int, concurrency: int, latency: float, cache_dir: str | None) -> dict:
    judge = JudgeRubric("test-model", url, api_key="x", max_concurrency=concurrency,
                        cache=cache_dir is not None, cache_dir=cache_dir)
    task = Task(id="t", prompt="What is 2 + 2?", answer="4")
    await asyncio.gather(*(judge.score(f"warm {i}: 4", task=task) for i in range(concurrency)))
    calls = judge.calls
    start, cpu = time.perf_counter(), time.process_time()
    scores = await asyncio.gather(*(judge.score(f"reply {i}: 4", task=task) for i in range(judgments)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert scores == [1.0] * judgments
    made = judge.calls - calls
    again = time.perf_counter()
    await asyncio.gather(*(judge.score(f"reply {i}: 4", task=task) for i in range(judgments)))
    cached_wall = time.perf_counter() - again
    await judge.aclose()
    ideal = concurrency / latency
    return {"concurrency": concurrency, "judgments": judgments, "calls": made, "wall_s": round(wall, 3),
            "judgments_per_s": round(judgments / wall, 1), "ideal_per_s": ideal,
            "fraction_of_ideal": round(judgments / wall / ideal, 3), "cpu_ms_per_judgment": round(1000 * cpu / judgments, 3),
            "rescore_calls": judge.calls - calls - made if cache_dir else None,
            "rescore_judgments_per_s": round(judgments / cached_wall, 1) if cache_dir else None}


async def sdk_floor(url: str, judgments: int, concurrency: int, latency: float) -> dict:
    import openai

    try:
        http = openai.DefaultAioHttpClient()
    except RuntimeError:
        http = None
    client = openai.AsyncOpenAI(base_url=url, api_key="x", http_client=http)
    judge = JudgeRubric("test-model", url)
    task = Task(id="t", prompt="What is 2 + 2?", answer="4")
    slots = asyncio.Semaphore(concurrency)

    async def one(i):
        body = {"model": "test-model", "messages": judge._messages(judge.prompt, judge._values(f"floor {i}: 4", task, None)),
                **judge.sampling}
        async with slots:
            await client.post("/chat/completions", body=body, cast_to=object)

    await asyncio.gather(*(one(i) for i in range(concurrency)))
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(judgments)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    await client.close()
    return {"calls_per_s": round(judgments / wall, 1), "fraction_of_ideal": round(judgments / wall / (concurrency / latency), 3),
            "cpu_ms_per_call": round(1000 * cpu / judgments, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=32, help="tasks for the group cost (k episodes each)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--judgments", type=int, default=1280)
    args = parser.parse_args()
    out = {"benchmark": "reward_group_judge", "group": group_cost(args.tasks, args.k)}
    server = subprocess.Popen([sys.executable, "-m", "benchmax_gym.testing.openai_server", "--judge",
                               "--latency", str(args.latency)], stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as cache:
            out["judge"] = asyncio.run(judge_rate(url, args.judgments, args.concurrency, args.latency, cache))
        out["judge"]["sdk_floor"] = asyncio.run(sdk_floor(url, args.judgments, args.concurrency, args.latency))
    finally:
        server.terminate()
        server.wait()
    out["judge"]["latency_s"] = args.latency
    print(json.dumps(out))


if __name__ == "__main__":
    main()
