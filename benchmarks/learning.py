"""Does a model get better through benchmax-gym? examples/learn/learn.py for several seeds; one JSON.

Each seed runs the whole example (solver data, tokenizer, tiny model, SFT, GRPO through
``TRLRollout``, held-out eval of both checkpoints) in a process of its own, and this prints, per
seed: held-out success after SFT and after SFT + GRPO (95% CIs), the paired difference with its
CI and whether it is above 0, the probability of improvement, tool use (share of episodes with a
well-formed call; parse and tool errors per turn) before and after, wall time per stage, peak
memory, and what GRPO's steps looked like (success, zero-variance groups, entropy, first and last
fifth). Target (issue #34): the difference's CI above 0 for the default seed and for at least 2
of 3 other seeds, each run within 15 minutes on a 2-core machine.

    python benchmarks/learning.py                              # seeds 0,1,2,3, one after another (CPU)
    python benchmarks/learning.py --jobs 4                     # in parallel, CPU threads split
    python benchmarks/learning.py --device cuda --jobs 4       # one GPU shared by the four runs
    python benchmarks/learning.py --seeds 0 -- --rl-steps 300  # flags after -- go to learn.py

Runs go under ``--out`` (a temporary folder, removed, unless given).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import need

need("trl", "trl", "transformers", "tokenizers", "torch", load=False)  # (learn.py imports them, not this)

LEARN = Path(__file__).resolve().parents[1] / "examples" / "learn" / "learn.py"


def run_seed(seed: int, out: Path, args: argparse.Namespace, threads: int, extra: list[str]) -> dict:
    """One seed's whole example in a subprocess; its figures from the run.json it writes."""
    folder = out / f"seed{seed}"
    cmd = [sys.executable, str(LEARN), "--out", str(folder), "--seed", str(seed), "--device", args.device,
           "--threads", str(threads), *extra]
    start = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "log.txt", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        tail = (folder / "log.txt").read_text(errors="replace").strip().splitlines()[-5:]
        return {"seed": seed, "failed": f"exit status {proc.returncode}", "log_tail": tail, "wall_seconds": wall}
    run = json.loads((folder / "run.json").read_text())
    return summarize(seed, run, wall)


def summarize(seed: int, run: dict, wall: float) -> dict:
    r = run["results"]
    steps = json.loads((Path(run["config"]["out"]) / "rl" / "steps.json").read_text())
    k = max(1, len(steps) // 5)

    def fifth(part: list[dict], key: str) -> float | None:
        values = [s[key] for s in part if s.get(key) is not None]
        return round(sum(values) / len(values), 4) if values else None

    diff = r["rl_minus_sft"]
    return {
        "seed": seed,
        "heldout_tasks": r["heldout_tasks"],
        "sft_success": r["success"]["sft"], "rl_success": r["success"]["rl"],
        "rl_minus_sft": diff, "improved": diff["ci_low"] is not None and diff["ci_low"] > 0,
        "probability_of_improvement": r["probability_of_improvement"],
        "tasks_better_worse_tied": r["tasks_better_worse_tied"],
        "tool_use": {name: {key: round(value, 4) for key, value in r["tool_use"][name].items()
                            if key in ("episodes_with_well_formed_call", "parse_errors_per_turn",
                                       "tool_errors_per_turn", "tool_calls_per_episode")}
                     for name in ("sft", "rl")},
        "sft_steps_taken": run.get("sft_steps_taken"),
        "rl_steps": {key: {"first_fifth": fifth(steps[:k], key), "last_fifth": fifth(steps[-k:], key)}
                     for key in ("success", "zero_variance_groups", "entropy")},
        "stage_seconds": {name: s["seconds"] for name, s in run["stages"].items()},
        "run_seconds": run.get("total_seconds"), "wall_seconds": wall,
        "peak_rss_mb": max(s["peak_rss_mb"] for s in run["stages"].values()),
        **({"peak_cuda_mb": max(s.get("peak_cuda_mb", 0) for s in run["stages"].values())}
           if any("peak_cuda_mb" in s for s in run["stages"].values()) else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="flags after -- go to examples/learn/learn.py unchanged")
    parser.add_argument("--seeds", default="0,1,2,3", help="comma-separated; the first is the default seed")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (passed to learn.py)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds run at once, each in its own process; CPU threads are split among them")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads per run (default: 1 with --jobs 1, else cores // jobs)")
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder, removed)")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds:
        parser.error("--seeds names no seed")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    jobs = min(args.jobs, len(seeds))
    threads = args.threads or (1 if jobs == 1 else max(1, (os.cpu_count() or 1) // jobs))

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="benchmax-learning-"))
    start = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda s: run_seed(s, out, args, threads, extra), seeds))
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    done = [r for r in results if "failed" not in r]
    others = [r for r in done if r["seed"] != seeds[0]]
    print(json.dumps({
        "benchmark": "learning", "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "device": args.device, "jobs": jobs, "threads_per_run": threads, "learn_flags": extra,
        "seeds": results,
        "summary": {
            "default_seed": seeds[0],
            "default_seed_improved": bool(done and done[0]["seed"] == seeds[0] and done[0]["improved"]),
            "other_seeds_improved": f"{sum(r['improved'] for r in others)} of {len(seeds) - 1}",
            "failed_seeds": [r["seed"] for r in results if "failed" in r],
            "slowest_run_seconds": max((r["run_seconds"] or 0 for r in done), default=None),
            "peak_rss_mb": max((r["peak_rss_mb"] for r in done), default=None),
        },
        "wall_seconds": round(time.perf_counter() - start, 1),
    }, indent=2))


if __name__ == "__main__":
    main()
