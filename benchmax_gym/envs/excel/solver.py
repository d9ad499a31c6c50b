"""The reference solver: copies the answer cells from the answer workbook through ``write_cells``.

It proves every task is solvable through the tools and that the grader accepts what the tools
write. It reads the task's solution (the answer workbook), which a model never sees.
"""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import openpyxl
from openpyxl.cell.cell import MergedCell

from benchmax_gym.envs.excel.grading import expected_values
from benchmax_gym.envs.excel.tools import ISO_DATE, TIME

BATCH = 2_000  # cells per write_cells call (the tool takes at most 5,000)


def _json_value(value: Any) -> Any:
    """A cell value as write_cells takes it; text that would be read as a formula, a date or a time
    gets Excel's leading apostrophe."""
    if isinstance(value, str) and (value.startswith(("=", "'")) or ISO_DATE.match(value) or TIME.match(value)):
        return "'" + value
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return value.replace(tzinfo=None).isoformat()
    if isinstance(value, dt.timedelta) and value >= dt.timedelta(0):
        minutes, seconds = divmod(value.total_seconds(), 60)
        return f"{int(minutes // 60)}:{int(minutes % 60):02d}:{seconds:09.6f}".rstrip("0").rstrip(".")
    return value


def _open(source: bytes | str, **kwargs) -> openpyxl.Workbook:
    return openpyxl.load_workbook(io.BytesIO(source) if isinstance(source, bytes) else source, **kwargs)


def planned_writes(solution: dict[str, Any], input_sheets: list[str], recalc: str = "auto") -> list[tuple[str, dict[str, Any], bool]]:
    """``(sheet, {cell: value}, create_sheet)`` batches that turn the input into the answer.

    Each cell gets the answer workbook's own value; where Excel saved none (a formula cell with
    an empty cache), the value the grader expects for it.
    """
    values = _open(solution["workbook"], data_only=True)
    by_sheet: dict[str, dict[str, Any]] = {}
    for sheet, coordinate, expected in expected_values(solution["workbook"], solution["position"], recalc):
        cell = values[sheet][coordinate]
        if isinstance(cell, MergedCell):
            continue  # covered by its merged range's top-left cell
        value = cell.value if cell.value is not None else (None if expected == "" else expected)
        by_sheet.setdefault(sheet, {})[coordinate] = _json_value(value)
    writes = []
    for sheet, cells in by_sheet.items():
        items = list(cells.items())
        for start in range(0, len(items), BATCH):
            writes.append((sheet, dict(items[start:start + BATCH]), sheet not in input_sheets))
    return writes


class ExcelSolver:
    """``solver(obs, info) -> action``; one instance follows one environment's episodes."""

    def __init__(self, env: Any):
        self.env = env.unwrapped
        self.pending: list[tuple[str, dict[str, Any], bool]] = []

    def __call__(self, obs: str, info: dict[str, Any]) -> str:
        episode = self.env.episode
        if info.get("turn") == 0:
            sheets = episode.state["workbook"].book().sheetnames
            self.pending = planned_writes(episode.task.solution, sheets, self.env.recalc)
        if self.pending:
            batch = self.pending[: self.env.max_calls_per_action]
            self.pending = self.pending[len(batch):]
            return self.env.format.render_calls([
                ("write_cells", {"sheet": sheet, "cells": cells, **({"create_sheet": True} if create else {})})
                for sheet, cells, create in batch
            ])
        return "Done: the answer cells are filled in."
