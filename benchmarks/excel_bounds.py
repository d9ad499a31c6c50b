"""What a hostile workbook costs the host's recalculation, with Excel-v0's memory bounds and
without them. Prints one JSON object.

Each case runs in a child process of its own (its peak RSS is the case's), under the grader's
recalculation deadline (``--time-limit``):

* ``many_ranges``: ``--ranges`` formulas, each summing its own 98,800-cell range (under the cut
  to the used area, so never cut);
* ``mmult``: ``SUM(MMULT(A1:AN,TRANSPOSE(A1:AN)))`` with N = ``--mmult-rows``: one numpy call
  on objects that holds the GIL, which no deadline interrupts.

``bounded`` is the library as shipped (refused as ``workbook_too_large``); ``unbounded`` lifts
``formulas_fixes.MAX_RANGES_CELLS`` and ``MAX_ARRAY_CELLS`` (what the code did before them).

    python benchmarks/excel_bounds.py [--ranges 40] [--mmult-rows 5000] [--time-limit 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASE = r"""
import io, json, resource, sys, time
import openpyxl
from benchmax_gym.envs.excel import formulas_fixes
from benchmax_gym.envs.excel.recalc import recalculate

case, size, limit, unbounded = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
if unbounded:
    formulas_fixes.MAX_RANGES_CELLS = formulas_fixes.MAX_ARRAY_CELLS = float("inf")
wb = openpyxl.Workbook()
ws = wb.active
ws["A1"] = 1
if case == "many_ranges":
    for i in range(size):
        ws.cell(row=1, column=28 + i, value=f"=SUM(A{1 + i}:Z{3800 + i})")
else:
    ws[f"A{size}"] = 2
    ws["C1"] = f"=SUM(MMULT(A1:A{size},TRANSPOSE(A1:A{size})))"
buf = io.BytesIO()
wb.save(buf)
started = time.monotonic()
try:
    recalculate(buf.getvalue(), time_limit=limit)
    outcome = "computed"
except Exception as exc:
    outcome = type(exc).__name__
print(json.dumps({"outcome": outcome, "returned_after_s": round(time.monotonic() - started, 2),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def run(case: str, size: int, limit: float, unbounded: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, case, str(size), str(limit), "1" if unbounded else "0"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        return {"failed": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranges", type=int, default=40, help="formulas over their own 98,800-cell ranges")
    parser.add_argument("--mmult-rows", type=int, default=5000, help="N of the MMULT outer product (N x N cells)")
    parser.add_argument("--time-limit", type=float, default=3.0, help="the recalculation's deadline, seconds")
    args = parser.parse_args()
    result = {"time_limit_s": args.time_limit}
    for case, size in (("many_ranges", args.ranges), ("mmult", args.mmult_rows)):
        result[case] = {"size": size, **{mode: run(case, size, args.time_limit, mode == "unbounded")
                                         for mode in ("bounded", "unbounded")}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
