"""``benchmax/Math-v0``: solve a math problem with a calculator; graded by math-verify."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmax_gym.core.env import ToolEnv
from benchmax_gym.core.sandbox import sandboxed_python
from benchmax_gym.core.tasks import Task, TaskSource, generator_config, given_tasks, source_name
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.math.rubric import math_rubric
from benchmax_gym.envs.math.solver import MathSolver
from benchmax_gym.envs.math.tasks import MathTaskConfig, generated_tasks, gsm8k_tasks, hf_tasks, math500_tasks
from benchmax_gym.envs.math.tools import calculator

SYSTEM_PROMPT = (
    "You are solving a math problem. Think step by step and use the tools for arithmetic "
    "(the calculator for expressions; python, when available, for longer computations). "
    "When you are done, reply without a tool call and put only the final answer in \\boxed{}, "
    "for example \\boxed{42}."
)

TASK_SOURCES = ("generated", "gsm8k", "math500", "hf")
PRELOAD = ("math", "fractions", "decimal", "itertools", "statistics", "json")  # warm in the sandbox


class MathEnv(ToolEnv):
    """Math problems with a ``calculator`` tool.

    Args:
        tasks: ``"generated"`` (default, offline), ``"gsm8k"``, ``"math500"``, ``"hf"`` (any
            dataset, with ``question_field``/``answer_field``), a TaskSource or a list of Tasks.
        dataset: hub id or local JSON/JSONL/Parquet path for the dataset sources.
        split, limit: which split, and at most how many tasks.
        numeric_only: MATH-500 only: keep problems whose answer is a number.
        question_field, answer_field: the record fields for ``tasks="hf"``.
        difficulty: generator knobs, a dict of :class:`MathTaskConfig` fields
            (``operands``, ``digits``, ``operations``, ``word_problems``, ``steps``).
        num_tasks: generated only: a finite set of this many tasks (default: unbounded).
        task_seed: generated only: which generated task set.
        python_tool: offer ``python(code)``, run in the episode's sandbox (see
            :mod:`benchmax_gym.core.sandbox`). Without bubblewrap it is left out with a warning.
        sandbox: ``"auto"`` (bubblewrap where available), ``"bubblewrap"``, or ``"rlimits"`` to
            run model code with resource limits only (no file-system or network isolation).
        sandbox_limits: per-call limits, a dict of :class:`SandboxLimits` fields; ``timeout``
            defaults to ``tool_timeout``.
        **engine_kwargs: the engine's options (``max_turns``, ``tool_format``, ``reward_weights``...).
    """

    def __init__(
        self,
        tasks: str | TaskSource | Sequence[Task] = "generated",
        *,
        dataset: str | Sequence[str] | None = None,
        split: str | None = None,
        limit: int | None = None,
        numeric_only: bool = False,
        question_field: str = "question",
        answer_field: str = "answer",
        difficulty: Mapping[str, Any] | MathTaskConfig | None = None,
        num_tasks: int | None = None,
        task_seed: int = 0,
        python_tool: bool = True,
        sandbox: str = "auto",
        sandbox_limits: Mapping[str, Any] | None = None,
        max_turns: int = 8,
        **engine_kwargs: Any,
    ):
        if tasks != "generated" and (difficulty is not None or num_tasks is not None or task_seed != 0):
            raise ValueError("difficulty, num_tasks and task_seed apply only to tasks='generated'")
        source = given_tasks(tasks)
        if source is None:
            source = _task_source(source_name(tasks, TASK_SOURCES), dataset, split, limit, numeric_only,
                                  question_field, answer_field, difficulty, num_tasks, task_seed)
        python, sandbox_config, level = sandboxed_python(
            "benchmax/Math-v0", enabled=python_tool, mode=sandbox, limits=sandbox_limits,
            timeout=engine_kwargs.get("tool_timeout", 10.0), preload=PRELOAD,
        )
        super().__init__(
            tasks=source,
            toolset=Toolset([calculator, *python]),
            rubric=math_rubric(),
            system_prompt=SYSTEM_PROMPT,
            max_turns=max_turns,
            sandbox=sandbox_config,
            **engine_kwargs,
        )
        self.sandbox_level = level

    def reference_solver(self) -> MathSolver:
        return MathSolver(self)


def _task_source(kind, dataset, split, limit, numeric_only, question_field, answer_field,
                 difficulty, num_tasks, task_seed) -> TaskSource:
    if kind != "math500" and numeric_only:
        raise ValueError("numeric_only applies only to tasks='math500'")
    if kind == "generated":
        if dataset is not None:
            raise ValueError("dataset applies only to tasks='gsm8k', 'math500' or 'hf'")
        return generated_tasks(generator_config(MathTaskConfig, difficulty), seed=task_seed, size=num_tasks)
    load: dict[str, Any] = {"split": split, "limit": limit}
    if dataset is not None:
        load["path"] = dataset
    if kind == "gsm8k":
        return gsm8k_tasks(**load)
    if kind == "math500":
        return math500_tasks(numeric_only=numeric_only, **load)
    if dataset is None:
        raise ValueError("tasks='hf' needs dataset= (a hub id or local files)")
    return hf_tasks(question_field=question_field, answer_field=answer_field, **load)
