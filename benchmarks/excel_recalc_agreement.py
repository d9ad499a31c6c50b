"""How often each of Excel-v0's recalculations gives Excel's own values. Prints one JSON object.

Each SpreadsheetBench case's answer workbook (saved by Excel, with Excel's values cached) is
graded against itself as if it were the model's output: its formulas are computed by ``recalc``
(never taken from the file), so a case scores 1 only where the recalculation agrees with Excel at
every answer cell. Per recalc: the cases scored 1, those that were not (task, case, the first
mismatches), and seconds per grade. ``libreoffice`` is measured where LibreOffice is installed.

    python benchmarks/excel_recalc_agreement.py [--spreadsheetbench ../shared/data/spreadsheetbench]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import soffice_executable

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "spreadsheetbench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spreadsheetbench", type=Path, default=SAMPLES,
                        help="the directory holding dataset.json (default: the checkout's ../shared/data sample)")
    parser.add_argument("--recalc", nargs="+", default=["auto", "libreoffice"], choices=["auto", "libreoffice"])
    parser.add_argument("--limit", type=int, default=None, help="the first N tasks only")
    args = parser.parse_args()
    if not (args.spreadsheetbench / "dataset.json").is_file():
        sys.exit(f"excel_recalc_agreement.py: no dataset.json in {args.spreadsheetbench} (--spreadsheetbench DIR)")
    tasks = json.loads((args.spreadsheetbench / "dataset.json").read_text())[: args.limit]
    report: dict = {"cases": 0, "cpu_count": os.cpu_count()}
    for recalc in args.recalc:
        if recalc == "libreoffice" and soffice_executable() is None:
            report[recalc] = {"skipped": "LibreOffice is not installed (apt-get install libreoffice-calc-nogui)"}
            continue
        scored, missed, seconds = 0, [], []
        for task in tasks:
            for case in (1, 2, 3):
                answer = args.spreadsheetbench / "spreadsheet" / str(task["id"]) / f"{case}_{task['id']}_answer.xlsx"
                if not answer.is_file():
                    continue
                start = time.perf_counter()
                result = grade(answer, answer, task["answer_position"], recalc=recalc)
                seconds.append(time.perf_counter() - start)
                if result.solved:
                    scored += 1
                else:
                    missed.append({"task": task["id"], "case": case, "mismatches": [list(m) for m in result.mismatches[:3]],
                                   "notes": result.notes[:2]})
        report["cases"] = len(seconds)
        report[recalc] = {"scored_1": scored, "missed": missed,
                          "seconds_per_grade": sum(seconds) / len(seconds) if seconds else None}
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
