"""Run every benchmark in this folder, one after another, and gather their JSON in one file.

On a bigger machine, after ``pip install -e '.[eval,ray,openenv,trl,skyrl]' gem-llm`` (the extras
some scripts need, and the GEM peer; a script whose extra is missing is reported as skipped), one
command measures the whole set::

    python benchmarks/run_all.py --out results.jsonl

Each script runs in this interpreter with its defaults (the worker-count sweeps stop at
``os.cpu_count()``); the peers (GEM, skyrl-gym) run in this interpreter when they import here,
or in the ones ``$BENCHMAX_GEM_PYTHON`` / ``$BENCHMAX_SKYRL_PYTHON`` name. Each result is one
line: ``{"script", "cpu_count", "seconds", "result"}``, or ``"skipped"`` (the extra a script
needs, or why it failed, from its stderr) instead of ``"result"``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_BENCHMARKS = {"run_all.py"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmark_results.jsonl", help="where the JSON lines go")
    parser.add_argument("--only", help="comma-separated script names (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated script names to leave out")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per script")
    args = parser.parse_args()
    scripts = sorted(p.name for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name not in NOT_BENCHMARKS)
    if args.only:
        wanted = {name if name.endswith(".py") else f"{name}.py" for name in args.only.split(",")}
        unknown = wanted - set(scripts)
        if unknown:
            parser.error(f"--only: no benchmark {sorted(unknown)} (there are {scripts})")
        scripts = [s for s in scripts if s in wanted]
    skip = {name if name.endswith(".py") else f"{name}.py" for name in filter(None, args.skip.split(","))}
    with open(args.out, "w") as out:
        for script in scripts:
            if script in skip:
                continue
            start = time.monotonic()
            try:
                done = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True,
                                      timeout=args.timeout, cwd=HERE)
            except subprocess.TimeoutExpired:
                line = {"skipped": f"ran past --timeout {args.timeout:g} s"}
            else:
                try:  # one JSON object, or one per line
                    results = [json.loads(text) for text in done.stdout.splitlines() if text.strip()]
                    line = {"result": results[0] if len(results) == 1 else results} if (
                        done.returncode == 0 and results) else None
                except json.JSONDecodeError:
                    line = None
                if line is None:
                    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                    line = {"skipped": tail[-500:]}
            line = {"script": script, "cpu_count": os.cpu_count(), "seconds": round(time.monotonic() - start, 1),
                    **line}
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(f"{script}: {'done' if 'result' in line else line['skipped']} ({line['seconds']} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
