"""``benchmax/Math-v0``: solve a math problem with a calculator; graded by math-verify."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmax_gym.core.checks import boolean, mapping, optional, seconds
from benchmax_gym.core.env import ToolEnv
from benchmax_gym.core.sandbox import sandboxed_python
from benchmax_gym.core.sources import SourceConfig, task_source
from benchmax_gym.core.tasks import Task, TaskSource
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.math.rubric import intermediate_values, math_rubric
from benchmax_gym.envs.math.solver import MathSolver
from benchmax_gym.envs.math.datasets import GSM8K, MATH500, HFDataset
from benchmax_gym.envs.math.generator import GeneratedMath
from benchmax_gym.envs.math.tools import calculator

SYSTEM_PROMPT = (
    "You are solving a math problem. Think step by step and use the tools for arithmetic "
    "(the calculator for expressions; python, when available, for longer computations). "
    "When you are done, reply without a tool call and put only the final answer in \\boxed{}, "
    "for example \\boxed{42}."
)

TASK_SOURCES = (GeneratedMath, GSM8K, MATH500, HFDataset)
PRELOAD = ("math", "fractions", "decimal", "itertools", "statistics", "json")  # warm in the sandbox


class MathEnv(ToolEnv):
    """Math problems with a ``calculator`` tool.

    Args:
        tasks: a source by name with its ``task_args``: ``"generated"`` (default, offline;
            :class:`GeneratedMath`: ``difficulty``, ``num_tasks``, ``task_seed``), ``"gsm8k"``
            (:class:`GSM8K`: ``dataset``, ``split``, ``limit``), ``"math500"`` (:class:`MATH500`:
            also ``numeric_only``), ``"hf"`` (:class:`HFDataset`: also ``question_field``,
            ``answer_field``); or one of those instances, a TaskSource or a list of Tasks.
        task_args: the named source's arguments, e.g. ``{"dataset": "train.jsonl", "limit": 100}``.
        python_tool: offer ``python(code)``, run in the episode's sandbox (see
            :mod:`benchmax_gym.core.sandbox`). Without bubblewrap it is left out with a warning.
        sandbox: ``"auto"`` (bubblewrap where available), ``"bubblewrap"``, or ``"rlimits"`` to
            run model code with resource limits only (no file-system or network isolation).
        sandbox_limits: per-call limits, a dict of :class:`SandboxLimits` fields; ``timeout``
            defaults to ``tool_timeout``.
        **engine_kwargs: the engine's options (``max_turns``, ``tool_format``, ``reward_weights``...).
    """

    choices = {"task_args": TASK_SOURCES}

    def __init__(
        self,
        tasks: str | SourceConfig | TaskSource | Sequence[Task] = "generated",
        *,
        task_args: Mapping[str, Any] | None = None,
        python_tool: bool = True,
        sandbox: str = "auto",
        sandbox_limits: Mapping[str, Any] | None = None,
        max_turns: int = 8,
        **engine_kwargs: Any,
    ):
        source = task_source(self, tasks, task_args, TASK_SOURCES, engine_kwargs)
        python, sandbox_config = sandboxed_python(
            "benchmax/Math-v0", enabled=boolean("python_tool", python_tool), mode=sandbox,
            limits=optional(mapping)("sandbox_limits", sandbox_limits),
            # (checked here, as the engine would: else a bad one was called the sandbox's limit)
            timeout=seconds("tool_timeout", engine_kwargs.get("tool_timeout", 10.0)), preload=PRELOAD,
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

    def dense_signal(self):
        """``dense_rewards=True``: a calculator or python result equal to one of the solution's
        intermediate values (:func:`~benchmax_gym.envs.math.rubric.intermediate_values`)."""
        return intermediate_values

    def reference_solver(self) -> MathSolver:
        return MathSolver(self)
