"""``benchmax/CRM-v0``: a customer-service agent over a Salesforce-style org in SQLite."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from benchmax_gym.core.env import Episode, ToolEnv, positive_int, positive_number
from benchmax_gym.core.tasks import Task, TaskSource, given_tasks, source_name
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.crm.org import DEFAULT_SIZE, MAX_SIZE, MIN_SIZE, Org, cached_org
from benchmax_gym.envs.crm.rubric import crm_rubric
from benchmax_gym.envs.crm.solver import CRMSolver
from benchmax_gym.envs.crm.tasks import CRMARENA_ORG_MISSING, CRMTaskConfig, check_task_ids, crmarena_tasks, generated_tasks
from benchmax_gym.envs.crm.tools import TOOLS, EpisodeDB

SYSTEM_PROMPT = (
    "You are a customer-service agent with access to the company's Salesforce CRM, stored in a SQLite "
    "database. Use the tools to look things up (read-only SQL with `query`, or the typed tools) and to "
    "change cases (`update_case`). Today's date is Organization.Today in the database; relative periods such "
    "as 'the past 3 months' or 'the past two quarters' (6 months) run from that date back that many months. "
    "Answer with exact values from the database (Ids are 18-character Salesforce Ids). When you are done, "
    "reply without a tool call and put only the final answer in <answer></answer>, for example "
    "<answer>0055g00000AbCdEAAZ</answer>; for a task that asks you to change records, just say you are done."
)

TASK_SOURCES = ("generated", "crmarena")


class CRMEnv(ToolEnv):
    """CRMArena-style tasks over a generated org, with SQL and typed CRM tools.

    Args:
        tasks: ``"generated"`` (default: tasks computed from the generated org), ``"crmarena"``
            (``dataset=`` a task file in CRMArena's format, run against ``org_db``), a TaskSource
            or a list of Tasks.
        dataset: the CRMArena-format task file (JSON list or JSON Lines) or hub id.
        limit: at most this many CRMArena tasks.
        org_db: a SQLite file holding your own org (same object names as the generated one);
            the default is the generated org for ``(org_seed, org_size)``. CRMArena's tasks ask
            about CRMArena's own org, which is not included: they need it here.
        check_org_ids: with ``tasks="crmarena"``, refuse tasks that name Salesforce ids absent
            from ``org_db`` (the wrong org; a reference solver would still "score" by replaying
            the gold). ``False`` runs them anyway.
        org_seed, org_size: which generated org, and its number of cases (agents: one per 40).
        task_types: generated only: a list of types (see :data:`~benchmax_gym.envs.crm.tasks.TASK_TYPES`).
        num_tasks, task_seed: generated only: a finite set of this many tasks; which set.
        cache_dir: where generated orgs are cached (default ``$BENCHMAX_GYM_CACHE`` or ``~/.cache/benchmax-gym``).
        query_max_rows: rows one ``query`` returns at most.
        query_timeout: seconds one ``query`` may run.
        **engine_kwargs: the engine's options (``max_turns``, ``tool_format``, ``reward_weights``...).
    """

    def __init__(
        self,
        tasks: str | TaskSource | Sequence[Task] = "generated",
        *,
        dataset: str | None = None,
        limit: int | None = None,
        org_db: str | os.PathLike | None = None,
        org_seed: int = 0,
        org_size: int = DEFAULT_SIZE,
        task_types: Sequence[str] | str | None = None,
        num_tasks: int | None = None,
        task_seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
        query_max_rows: int = 200,
        query_timeout: float = 2.0,
        max_turns: int = 20,
        check_org_ids: bool = True,
        **engine_kwargs: Any,
    ):
        self.query_max_rows = positive_int("query_max_rows", query_max_rows)
        self.query_timeout = positive_number("query_timeout", query_timeout)
        if isinstance(org_seed, bool) or not isinstance(org_seed, int) or org_seed < 0:
            raise ValueError(f"org_seed must be a non-negative int, got {org_seed!r}")
        if isinstance(org_size, bool) or not isinstance(org_size, int) or not MIN_SIZE <= org_size <= MAX_SIZE:
            raise ValueError(f"org_size must be an int from {MIN_SIZE} to {MAX_SIZE} (cases), got {org_size!r}")
        generated = isinstance(tasks, str) and tasks == "generated"
        if not generated and (task_types is not None or num_tasks is not None or task_seed != 0):
            raise ValueError("task_types, num_tasks and task_seed apply only to tasks='generated'")
        if tasks == "crmarena" and org_db is None:
            raise ValueError(CRMARENA_ORG_MISSING)
        if org_db is not None:
            if generated:
                raise ValueError("org_db is for your own tasks (tasks='crmarena', a TaskSource or a list); "
                                 "generated tasks use the generated org (org_seed, org_size)")
            if not os.path.isfile(org_db):
                raise ValueError(f"org_db: no such file {os.fspath(org_db)!r}")
        self.org = Org(org_db if org_db is not None else cached_org(org_seed, org_size, cache_dir))
        source = self._task_source(tasks, dataset, limit, task_types, num_tasks, task_seed, org_seed, org_size)
        if tasks == "crmarena" and check_org_ids:
            check_task_ids(source, self.org, org_db)
        super().__init__(
            tasks=source, toolset=Toolset(TOOLS), rubric=crm_rubric(), system_prompt=SYSTEM_PROMPT,
            max_turns=max_turns, **engine_kwargs,
        )

    def _task_source(self, tasks, dataset, limit, task_types, num_tasks, task_seed, org_seed, org_size) -> TaskSource:
        given = given_tasks(tasks)
        if given is not None:
            return given
        source_name(tasks, TASK_SOURCES)
        if tasks == "crmarena":
            if dataset is None:
                raise ValueError("tasks='crmarena' needs dataset= (a task file in CRMArena's format)")
            return crmarena_tasks(dataset, limit=limit)
        if dataset is not None or limit is not None:
            raise ValueError("dataset and limit apply only to tasks='crmarena'")
        config = CRMTaskConfig() if task_types is None else CRMTaskConfig(task_types=task_types)
        return generated_tasks(self.org.pristine, f"s{org_seed}n{org_size}", config, seed=task_seed, size=num_tasks)

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        episode.state["org"] = self.org
        episode.state["db"] = EpisodeDB(self.org.episode_copy(), self.query_max_rows,
                                        min(self.query_timeout, self.tool_timeout), self.org.today(),
                                        max_chars=self.max_tool_output_chars)

    def close_episode(self, episode: Episode) -> None:
        db = episode.state.pop("db", None)
        if db is not None:
            db.con.close()

    def reference_solver(self) -> CRMSolver:
        return CRMSolver(self)

    def close(self):
        super().close()
        self.org.close()

