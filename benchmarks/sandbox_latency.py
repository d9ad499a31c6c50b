"""Latency of running model code in the sandbox, against plain subprocesses. Prints one JSON object.

* server_start: the first call in a process, which starts the shared server (bubblewrap + Python
  + its preloaded modules), once per process (per level and preload);
* episode_first_call: the first call of a new episode on a running server (its workspace and
  namespaces are new: nothing is started at reset);
* trivial_call: ``pass``, back to back; trivial_call_after_think: the same 20 ms after the last
  call ended (as an episode's calls come, between model turns: the server has its next call's
  monitor ready by then); openpyxl_call: load, edit and save a small workbook;
* first_import: a new episode's first ``import openpyxl, numpy, pandas``, less its trivial call,
  with Excel-v0's old preload (``openpyxl``) and its current one (``openpyxl``, ``numpy``,
  ``pandas``, imported in the warm server);
* floors: ``python -c pass`` with this interpreter (in an editable install its ``.pth`` finder is
  imported at every start) and with a clean one (``-I -S``: no site, no ``.pth``), and the
  openpyxl script as a plain, unsandboxed subprocess.

Runs are interleaved round by round; every figure is the median (p50) and p99 over its samples.

    python benchmarks/sandbox_latency.py [--calls 200] [--starts 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openpyxl

from benchmax_gym.core.sandbox import Sandbox, resolve_level

OPENPYXL_CODE = (
    "import openpyxl\n"
    "wb = openpyxl.load_workbook('small.xlsx')\n"
    "ws = wb.active\n"
    "ws['C1'] = sum(c.value for c in ws['A'] if isinstance(c.value, int))\n"
    "wb.save('small.xlsx')\n"
)
IMPORTS = "import openpyxl, numpy, pandas"
OLD_EXCEL_PRELOAD = ("openpyxl",)
EXCEL_PRELOAD = ("openpyxl", "numpy", "pandas")


def small_workbook(path: Path) -> Path:
    wb = openpyxl.Workbook()
    ws = wb.active
    for i in range(1, 51):
        ws.append([i, f"item {i}", i * 1.5])
    wb.save(path)
    return path


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 2),
        "n": len(ordered),
    }


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--mode", default="auto", help="auto | bubblewrap | rlimits")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {k: [] for k in (
        "server_start", "episode_first_call", "trivial_call", "trivial_call_after_think", "openpyxl_call", "first_import_old_preload",
        "first_import_new_preload", "floor_python_c_pass", "floor_clean_python_c_pass", "floor_openpyxl_subprocess")}

    def server_start():  # the only sandbox of this preload: its server starts, and stops at close
        with Sandbox(mode=args.mode, preload=("openpyxl", "json")) as box:
            assert box.run("pass").error is None

    def first_import(preload, key):  # a new episode's first call, with and without the imports
        with Sandbox(mode=args.mode, preload=preload) as box:
            trivial = timed(lambda: box.run("pass"))
        with Sandbox(mode=args.mode, preload=preload) as box:
            t = time.perf_counter()
            assert box.run(IMPORTS).error is None
            samples[key].append(time.perf_counter() - t - trivial)

    with tempfile.TemporaryDirectory() as tmp:
        workbook = small_workbook(Path(tmp) / "small.xlsx")
        # warm servers, held for the whole run (the servers of the two Excel preloads too)
        box = Sandbox(mode=args.mode, preload=("openpyxl",))
        holders = [Sandbox(mode=args.mode, preload=p) for p in (OLD_EXCEL_PRELOAD, EXCEL_PRELOAD)]
        for holder in holders:
            holder.run("pass")
        box.put_file("small.xlsx", workbook)
        box.run("pass")
        assert box.run(OPENPYXL_CODE).error is None
        rounds = max(args.starts, 1)
        for r in range(rounds):
            samples["server_start"].append(timed(server_start))
            with Sandbox(mode=args.mode, preload=("openpyxl",)) as fresh:
                samples["episode_first_call"].append(timed(lambda: fresh.run("pass")))
            first_import(OLD_EXCEL_PRELOAD, "first_import_old_preload")
            first_import(EXCEL_PRELOAD, "first_import_new_preload")
            for _ in range(args.calls // rounds):
                samples["trivial_call"].append(timed(lambda: box.run("pass")))
            for _ in range(max(2, args.calls // rounds // 4)):
                time.sleep(0.02)
                samples["trivial_call_after_think"].append(timed(lambda: box.run("pass")))
            for _ in range(max(2, args.calls // rounds // 2)):
                samples["openpyxl_call"].append(timed(lambda: box.run(OPENPYXL_CODE)))
            for _ in range(2):
                samples["floor_python_c_pass"].append(
                    timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)))
                samples["floor_clean_python_c_pass"].append(
                    timed(lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)))
                samples["floor_openpyxl_subprocess"].append(
                    timed(lambda: subprocess.run([sys.executable, "-c", OPENPYXL_CODE], cwd=tmp, check=True)))
        box.close()
        for holder in holders:
            holder.close()

    print(json.dumps({
        "benchmark": "sandbox_latency",
        "level": resolve_level(args.mode),
        "first_import_code": IMPORTS,
        "old_preload": OLD_EXCEL_PRELOAD,
        "new_preload": EXCEL_PRELOAD,
        **{name: stats(values) for name, values in samples.items()},
    }))


if __name__ == "__main__":
    main()
