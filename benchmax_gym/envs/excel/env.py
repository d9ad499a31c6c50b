"""``benchmax/Excel-v0``: change a spreadsheet as asked; graded cell by cell at the answer positions."""

from __future__ import annotations

import os
import shutil
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from benchmax_gym.core.env import Episode, ToolEnv
from benchmax_gym.core.outcomes import ENV_ERROR, RewardFailure
from benchmax_gym.core.rubric import RewardFn, Rubric
from benchmax_gym.core.sandbox import sandboxed_python
from benchmax_gym.core.checks import boolean, mapping, one_of, optional, seconds
from benchmax_gym.core.sources import SourceConfig, task_source
from benchmax_gym.core.tempdirs import owned_tempdir
from benchmax_gym.core.tasks import DatasetTasks, ListTasks, Task, TaskSource
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.excel.generator import GeneratedSheets
from benchmax_gym.envs.excel.grading import correct_cells, grade
from benchmax_gym.envs.excel.recalc import RECALC_MODES, RecalcUnavailable, hold_worker, soffice_executable
from benchmax_gym.envs.excel.solver import ExcelSolver
from benchmax_gym.envs.excel.spreadsheetbench import SpreadsheetBench
from benchmax_gym.envs.excel.tools import WORKBOOK, WorkbookFile, describe_workbook, list_sheets, read_range, write_cells

SYSTEM_PROMPT = (
    "You are an expert spreadsheet assistant. You are given an Excel workbook and a request. Change "
    "the workbook so that the cells at the answer position hold what the request asks for, using the "
    "tools. Values or formulas both count: formulas are recalculated before grading. When the workbook "
    "is done, reply without a tool call (a short summary is fine); the workbook is graded as it is then."
)
# recalc="none" grades the values saved in the file, and a formula written in the episode has none
CACHED_ONLY = ("Values or formulas both count: formulas are recalculated before grading.",
               "Write values: formulas are not recalculated before grading, so a formula you write counts as "
               "empty (only the values saved in the file count).")

RUN_PYTHON_DOC = (
    "Run Python 3 code in the workspace, where the workbook is ./workbook.xlsx, and return its exit "
    "status, stdout and stderr. openpyxl is installed (load with openpyxl.load_workbook('workbook.xlsx') "
    "and save back to the same file). Files persist between calls; Python variables do not. No network.\n\n"
    "Args:\n    code: the Python source to run"
)



TASK_SOURCES = (GeneratedSheets, SpreadsheetBench)
TASK_SHAPE = ("each Excel-v0 task needs files={'workbook.xlsx': <input xlsx: bytes or a path>} and "
              "answer={'workbook': <answer xlsx: bytes or a path>, 'position': <answer cells, e.g. \"'Sheet1'!B2:B9\">} "
              "(a task dict cannot carry files: give benchmax_gym.Task objects)")


def _workbook_problem(what: str, value: Any) -> str | None:
    """Why ``value`` cannot be a workbook (bytes, or the path of an existing file), or None."""
    if isinstance(value, (bytes, bytearray)):
        return None if value else f"{what} is empty bytes"
    if isinstance(value, (str, os.PathLike)):
        return None if os.path.isfile(value) else f"{what} is not an existing file: {os.fspath(value)!r}"
    return f"{what} must be bytes or a path, got {type(value).__name__}"


def check_task(task: Task, where: str) -> None:
    """Refuse a task Excel-v0 cannot play or grade (no input workbook, an answer that is not
    ``{'workbook', 'position'}``): else its reset failed as the model's tool error, or its grade
    was a TypeError scored 0."""
    files, answer = task.files, task.answer
    if not isinstance(files, Mapping) or WORKBOOK not in files:
        problem = f"it has no files[{WORKBOOK!r}] (files: {sorted(files) if isinstance(files, Mapping) else files!r})"
    elif not isinstance(answer, Mapping) or not {"workbook", "position"} <= set(answer):
        problem = f"its answer is {answer!r:.120}"
    elif not isinstance(answer["position"], str) or not answer["position"].strip():
        problem = f"its answer['position'] must be a non-empty string, got {answer['position']!r:.80}"
    else:
        problem = (_workbook_problem(f"files[{WORKBOOK!r}]", files[WORKBOOK])
                   or _workbook_problem("answer['workbook']", answer["workbook"]))
    if problem:
        raise ValueError(f"{where} (id {task.id!r}): {problem}; {TASK_SHAPE}")
# imported once in the warm sandbox, so the model's own `import` costs nothing (a missing one is skipped)
PRELOAD = ("openpyxl", "numpy", "pandas")


class ExcelEnv(ToolEnv):
    """Spreadsheet tasks with ``list_sheets``, ``read_range``, ``write_cells`` and ``run_python``.

    Args:
        tasks: a source by name with its ``task_args``: ``"generated"`` (default, offline;
            :class:`GeneratedSheets`: ``difficulty`` - ``rows``, ``multi_sheet``, ``task_types`` -
            ``num_tasks``, ``task_seed``) or ``"spreadsheetbench"`` (:class:`SpreadsheetBench`:
            ``dataset`` a local directory in the original layout, an archive or its URL,
            ``limit``, ``cache_dir``); or one of those instances, a TaskSource or a list of Tasks.
        task_args: the named source's arguments.
        recalc: how formulas are computed before grading: ``"auto"`` (the ``formulas`` package),
            ``"libreoffice"`` (headless LibreOffice: ``gym.make`` fails where it is not installed)
            or ``"none"`` (the values saved in the file, as upstream grades; the prompt then asks
            for values).
        python_tool, sandbox, sandbox_limits: the sandboxed ``run_python`` tool, as in Math-v0.
        **engine_kwargs: the engine's options; ``reward_weights`` defaults to ``solved`` only.
    """

    choices = {"task_args": TASK_SOURCES}

    def __init__(
        self,
        tasks: str | SourceConfig | TaskSource | Sequence[Task] = "generated",
        *,
        task_args: Mapping[str, Any] | None = None,
        recalc: str = "auto",
        python_tool: bool = True,
        sandbox: str = "auto",
        sandbox_limits: Mapping[str, Any] | None = None,
        max_turns: int = 20,
        **engine_kwargs: Any,
    ):
        self.recalc = one_of(*RECALC_MODES)("recalc", recalc)
        if self.recalc == "libreoffice" and soffice_executable() is None:  # (else every episode's grade fails)
            raise ValueError("recalc='libreoffice' needs LibreOffice, and neither soffice nor libreoffice is on "
                             "PATH (Debian: apt-get install libreoffice-calc-nogui); recalc='auto' computes "
                             "formulas with the formulas package")
        source = task_source(self, tasks, task_args, TASK_SOURCES, engine_kwargs)
        if isinstance(source, (ListTasks, DatasetTasks)):  # (held in memory: all checked now; others at reset)
            for i, task in enumerate(source.tasks):
                check_task(task, f"tasks[{i}]")
        python, sandbox_config = sandboxed_python(
            "benchmax/Excel-v0", enabled=boolean("python_tool", python_tool), mode=sandbox,
            limits=optional(mapping)("sandbox_limits", sandbox_limits),
            # (checked here, as the engine would: else a bad one was called the sandbox's limit)
            timeout=seconds("tool_timeout", engine_kwargs.get("tool_timeout", 10.0)), preload=PRELOAD,
            name="run_python", description=RUN_PYTHON_DOC,
        )
        rubric = Rubric([RewardFn("solved", self._solved, 1.0), RewardFn("cells", self._cells, 0.0)])
        super().__init__(
            tasks=source, toolset=Toolset([list_sheets, read_range, write_cells, *python]), rubric=rubric,
            system_prompt=SYSTEM_PROMPT.replace(*CACHED_ONLY) if self.recalc == "none" else SYSTEM_PROMPT,
            max_turns=max_turns, sandbox=sandbox_config, **engine_kwargs,
        )
        self.case_results: dict[str, dict[int, bool]] = {}  # SpreadsheetBench id -> case -> solved
        # the recalculation worker stops when the last Excel env of the process closes (or is collected)
        self._worker_claim = weakref.finalize(self, hold_worker())

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._worker_claim()

    # -- episode state ------------------------------------------------------------------------

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        check_task(episode.task, f"task {episode.index}")  # (a lazy source's: the env's error, never the model's)
        box = episode.state.get("sandbox")
        if box is not None:
            for name, source in episode.task.files.items():
                box.put_file(name, source)
            workspace = box.workspace
        else:
            workspace = owned_tempdir("excel")  # (a process killed mid-episode: the next one removes it)
            episode.resources.callback(shutil.rmtree, workspace, ignore_errors=True)
            for name, source in episode.task.files.items():
                target = workspace / name
                if isinstance(source, bytes):
                    target.write_bytes(source)
                else:
                    shutil.copyfile(source, target)
        episode.state["workbook"] = WorkbookFile(workspace / WORKBOOK, timeout=self.tool_timeout, recalc=self.recalc)
        if "dense" in self.rubric.names:  # answer cells right from the start are no one's progress
            answer = episode.task.answer
            episode.state["dense_baseline"] = correct_cells(
                episode.state["workbook"].data, answer["workbook"], answer["position"], recalc=self.recalc)[0]

    def task_prompt(self, task: Task) -> str:
        workbook = self.episode.state["workbook"]
        return f"{task.prompt}\n\n{describe_workbook(workbook)}"

    def dense_signal(self):
        """``dense_rewards=True``: after a step that wrote (``write_cells`` or ``run_python``), each
        answer cell that now holds its right value pays once (cells right before any write never do)."""
        return self._cells_done

    def _cells_done(self, episode: Episode, answer: Mapping[str, Any], tool_calls: list) -> tuple[set, int]:
        state = episode.state
        if not any(c["name"] in ("write_cells", "run_python") for c in tool_calls):
            return set(), 0  # nothing written: nothing to pay
        right, total = correct_cells(state["workbook"].data, answer["workbook"], answer["position"], recalc=self.recalc)
        baseline = state.get("dense_baseline", set())
        return right - baseline, total - len(baseline)

    def reference_solver(self) -> ExcelSolver:
        return ExcelSolver(self)

    # -- grading -----------------------------------------------------------------------------

    def _grade(self, episode: Episode, answer: Mapping[str, Any]):
        result = episode.state.get("grade")
        if result is None:
            # The output is read only through the workbook's safe reader (never a path the model
            # could point elsewhere); the answer comes from the task, never from the workspace.
            try:
                result = grade(episode.state["workbook"].data, answer["workbook"], answer["position"],
                               recalc=self.recalc)
            except RecalcUnavailable as exc:  # the grader's machinery failed: no grade, not a 0
                raise RewardFailure(f"the workbook could not be graded: {exc}", ENV_ERROR) from exc
            episode.state["grade"] = result
            meta = episode.task.metadata
            if meta.get("source") == "spreadsheetbench":
                self.case_results.setdefault(str(meta["spreadsheet_id"]), {})[int(meta["case"])] = bool(result.solved)
        return result

    def _solved(self, episode: Episode, answer: Mapping[str, Any]) -> float:
        return float(self._grade(episode, answer).solved)

    def _cells(self, episode: Episode, answer: Mapping[str, Any]) -> float:
        return float(self._grade(episode, answer).cells)

    def spreadsheetbench_scores(self, spreadsheet_id: str) -> dict[str, float] | None:
        """Soft (fraction of cases solved) and hard (all cases solved) scores over the cases of
        ``spreadsheet_id`` this environment has graded so far."""
        cases = self.case_results.get(str(spreadsheet_id))
        if not cases:
            return None
        return {"soft": sum(cases.values()) / len(cases), "hard": float(all(cases.values())), "cases": len(cases)}

    def final_info(self, episode: Episode) -> dict[str, Any]:
        """``grade_notes``: why a workbook graded as it did, where it was out of the ordinary (a
        file refused, a sheet missing, a recalculation fallback); SpreadsheetBench's scores."""
        info: dict[str, Any] = {}
        graded = episode.state.get("grade")
        if graded is not None and graded.notes:
            info["grade_notes"] = list(graded.notes)
        meta = episode.task.metadata
        if meta.get("source") == "spreadsheetbench":
            info["spreadsheetbench"] = self.spreadsheetbench_scores(meta["spreadsheet_id"])
        return info

