"""Excel-v0 episode costs against the floor of openpyxl itself. Prints one JSON object.

Per task source (generated; SpreadsheetBench when its directory is given): reset latency,
``read_range`` and ``write_cells`` step latency, grading (final step) latency, and the floor:
``openpyxl.load_workbook`` + ``save`` of the same input workbook. Also the resident memory each
live episode adds (this process plus its sandbox processes).

    python benchmarks/excel_episode.py [--spreadsheetbench ../shared/data/spreadsheetbench]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import openpyxl

import benchmax_gym  # noqa: F401
from _bench import descendants, memory


def ms(samples):
    ordered = sorted(samples)
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000}


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def floor_for(source) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        wb = openpyxl.load_workbook(io.BytesIO(source) if isinstance(source, bytes) else source)
        wb.save(Path(tmp) / "out.xlsx")
        return time.perf_counter() - t


def measure(env, episodes: int) -> dict:
    n = len(env.unwrapped.tasks) if len(env.unwrapped.tasks) < 10**9 else episodes
    resets, reads, writes, grades, floors = [], [], [], [], []
    for i in range(episodes):
        t = time.perf_counter()
        env.reset(options={"task_index": i % n})
        resets.append(time.perf_counter() - t)
        task = env.unwrapped.episode.task
        floors.append(floor_for(task.files["workbook.xlsx"]))
        sheet = env.unwrapped.episode.state["workbook"].book().sheetnames[0]
        t = time.perf_counter()
        env.step(call("read_range", sheet=sheet, range="A1:F20"))
        reads.append(time.perf_counter() - t)
        t = time.perf_counter()
        env.step(call("write_cells", sheet=sheet, cells={f"Z{r}": r for r in range(1, 11)}))
        writes.append(time.perf_counter() - t)
        t = time.perf_counter()
        env.step("done")
        grades.append(time.perf_counter() - t)
    out = {"episodes": episodes, "reset": ms(resets), "read_range": ms(reads), "write_cells": ms(writes),
           "grade": ms(grades), "floor_load_save": ms(floors)}
    out["reset_to_floor_ratio"] = out["reset"]["p50_ms"] / out["floor_load_save"]["p50_ms"]
    return out


def rss_all() -> int:
    return sum(m["rss"] for pid in [os.getpid(), *descendants()] if (m := memory(pid)))


def memory_per_episode(kwargs: dict, live: int) -> dict:
    envs = [gym.make("benchmax/Excel-v0", **kwargs) for _ in range(live)]
    envs[0].reset(seed=0)
    time.sleep(0.5)
    base = rss_all()
    for i, env in enumerate(envs[1:], 1):
        env.reset(seed=i)
        if env.unwrapped.episode.state.get("sandbox"):
            env.unwrapped.episode.state["sandbox"].run("pass")  # wait until the warm process is up
    time.sleep(0.5)
    total = rss_all()
    for env in envs:
        env.close()
    return {"live_episodes": live, "rss_mb_per_episode_beyond_first": (total - base) / (live - 1) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spreadsheetbench", help="a SpreadsheetBench directory in the original layout")
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--live", type=int, default=16)
    args = parser.parse_args()
    result = {"benchmark": "excel_episode"}
    sources = {"generated": {}}
    if args.spreadsheetbench:
        sources["spreadsheetbench"] = {"tasks": "spreadsheetbench", "dataset": args.spreadsheetbench}
    for name, kwargs in sources.items():
        for python_tool in (False, True):
            env = gym.make("benchmax/Excel-v0", python_tool=python_tool, **kwargs)
            key = f"{name}{'' if python_tool else '_no_python'}"
            result[key] = measure(env, args.episodes)
            result[key]["sandbox"] = env.unwrapped.sandbox_level
            env.close()
    result["memory_python_tool"] = memory_per_episode({}, args.live)
    result["memory_no_python"] = memory_per_episode({"python_tool": False}, args.live)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
