"""``benchmax/CRM-v0``: a customer-service agent over a Salesforce-style org in SQLite."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from benchmax_gym.core.checks import (
    existing_file, int_between, non_negative_int, optional, path, positive_int, positive_number,
)
from benchmax_gym.core.env import Episode, ToolEnv
from benchmax_gym.core.rubric import Rubric
from benchmax_gym.core.sources import GeneratedSource, SourceConfig, choose, task_source
from benchmax_gym.core.sqlite_heap import outside_query_bounds
from benchmax_gym.core.tasks import Task, TaskSource
from benchmax_gym.core.tools import Toolset
from benchmax_gym.core.users import LLMUser, UserSimulator
from benchmax_gym.envs.crm.org import DEFAULT_SIZE, MAX_SIZE, MIN_SIZE, Org, cached_org
from benchmax_gym.envs.crm.rubric import crm_rubric, rows_found
from benchmax_gym.envs.crm.service import SYSTEM_PROMPT as SERVICE_PROMPT
from benchmax_gym.envs.crm.service import GeneratedService, ServiceSolver, scripted_customer, service_rubric
from benchmax_gym.envs.crm.solver import CRMSolver
from benchmax_gym.envs.crm.tasks import CRMARENA_ORG_MISSING, CRMArena, GeneratedCRM
from benchmax_gym.envs.crm.tools import SERVICE_TOOLS, TOOLS, EpisodeDB

SYSTEM_PROMPT = (
    "You are a customer-service agent with access to the company's Salesforce CRM, stored in a SQLite "
    "database. Use the tools to look things up (read-only SQL with `query`, or the typed tools) and to "
    "change cases (`update_case`). Today's date is Organization.Today in the database; relative periods such "
    "as 'the past 3 months' or 'the past two quarters' (6 months) run from that date back that many months. "
    "Answer with exact values from the database (Ids are 18-character Salesforce Ids). When you are done, "
    "reply without a tool call and put only the final answer in <answer></answer>, for example "
    "<answer>0055g00000AbCdEAAZ</answer>; for a task that asks you to change records, just say you are done."
)

TASK_SOURCES = (GeneratedCRM, CRMArena)


class CRMEnv(ToolEnv):
    """CRMArena-style tasks over a generated org, with SQL and typed CRM tools.

    Args:
        tasks: a source by name with its ``task_args``: ``"generated"`` (default: tasks computed
            from the generated org; :class:`GeneratedCRM`: ``task_types`` - see
            :data:`~benchmax_gym.envs.crm.tasks.TASK_TYPES` - ``num_tasks``, ``task_seed``) or
            ``"crmarena"`` (:class:`CRMArena`: ``dataset`` a task file in CRMArena's format or a
            hub id, ``limit``, ``check_org_ids`` - refuse tasks naming Salesforce ids absent from
            ``org_db``, the wrong org); or one of those instances, a TaskSource or a list of Tasks.
        task_args: the named source's arguments.
        org_db: a SQLite file holding your own org (same object names as the generated one);
            the default is the generated org for ``(org_seed, org_size)``. CRMArena's tasks ask
            about CRMArena's own org, which is not included: they need it here.
        org_seed, org_size: which generated org, and its number of cases (agents: one per 40).
        cache_dir: where generated orgs are cached (default ``$BENCHMAX_GYM_CACHE`` or ``~/.cache/benchmax-gym``).
        query_max_rows: rows one ``query`` returns at most.
        query_timeout: seconds one ``query`` may run.
        **engine_kwargs: the engine's options (``max_turns``, ``tool_format``, ``reward_weights``...).
    """

    choices = {"task_args": TASK_SOURCES}
    #: what a variant of the family (CRM-Service-v0) replaces
    task_sources: tuple[type[SourceConfig], ...] = TASK_SOURCES
    tools: tuple = TOOLS
    family_prompt: str = SYSTEM_PROMPT

    def make_rubric(self) -> Rubric:
        return crm_rubric()

    def __init__(
        self,
        tasks: str | SourceConfig | TaskSource | Sequence[Task] = "generated",
        *,
        task_args: Mapping[str, Any] | None = None,
        org_db: str | os.PathLike | None = None,
        org_seed: int = 0,
        org_size: int = DEFAULT_SIZE,
        cache_dir: str | os.PathLike | None = None,
        query_max_rows: int = 200,
        query_timeout: float = 2.0,
        max_turns: int = 20,
        **engine_kwargs: Any,
    ):
        self.query_max_rows = positive_int("query_max_rows", query_max_rows)
        self.query_timeout = positive_number("query_timeout", query_timeout)
        non_negative_int("org_seed", org_seed)
        int_between(MIN_SIZE, MAX_SIZE, " (cases)")("org_size", org_size)
        cache_dir = optional(path)("cache_dir", cache_dir)  # ("" or [] fell back to the default cache)
        config = choose(tasks, task_args, self.task_sources, engine_kwargs)
        if isinstance(config, CRMArena) and org_db is None:
            raise ValueError(CRMARENA_ORG_MISSING)
        if org_db is not None:
            if isinstance(config, GeneratedSource):
                raise ValueError("org_db is for your own tasks (tasks='crmarena', a TaskSource or a list); "
                                 "generated tasks use the generated org (org_seed, org_size)")
            org_db = existing_file("org_db", org_db)  # (5 or [] raised os.stat's TypeError)
        self.org_db, self.org_name = org_db, f"s{org_seed}n{org_size}"
        self.org = Org(org_db if org_db is not None else cached_org(org_seed, org_size, cache_dir))
        source = task_source(self, config if config is not None else tasks, None, self.task_sources, {})
        super().__init__(
            tasks=source, toolset=Toolset(self.tools), rubric=self.make_rubric(), system_prompt=self.family_prompt,
            max_turns=max_turns, **engine_kwargs,
        )

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        episode.state["org"] = self.org
        db = outside_query_bounds(  # (another episode's query nearing its heap bound must not fail this reset)
            lambda: EpisodeDB(self.org.episode_copy(), self.query_max_rows, min(self.query_timeout, self.tool_timeout),
                              self.org.today(), max_chars=self.max_tool_output_chars))
        episode.state["db"] = db
        episode.resources.callback(db.con.close)

    def dense_signal(self):
        """``dense_rewards=True``: a read (query or look-up) returning the values the answer needs, in at most 10 rows,
        while the episode's reads showed at most 10 values of their kind (:func:`~benchmax_gym.envs.crm.rubric.rows_found`)."""
        return rows_found

    def reference_solver(self) -> CRMSolver:
        return CRMSolver(self)

    def close(self):
        super().close()
        self.org.close()



USERS = ("scripted", "llm")


class CRMServiceEnv(CRMEnv):
    """``benchmax/CRM-Service-v0``: the agent talks with a simulated customer who holds the facts
    it must ask for, and works the org (refunds, case updates) under a policy (see
    :mod:`benchmax_gym.envs.crm.service` and SERVICE.md).

    Args:
        tasks: ``"generated"`` (default; :class:`~benchmax_gym.envs.crm.service.GeneratedService`:
            ``task_types`` from ``refund_request``, ``case_status``, ``num_tasks``, ``task_seed``),
            a TaskSource or a list of Tasks (each with ``private["user"]``, ``answer`` as the
            generated ones have them).
        user: ``"scripted"`` (default: :func:`~benchmax_gym.envs.crm.service.scripted_customer`,
            deterministic), ``"llm"`` (an :class:`~benchmax_gym.core.users.LLMUser` made with
            ``user_args``: ``model``, ``base_url``, ``api_key``, ``price``...), or your own
            simulator or function ``fn(conversation, task)``.
        user_args: the ``"llm"`` simulator's arguments (checked at make: a bad one is named, ``user_args: timeout ...``).
        **kwargs: as :class:`CRMEnv` (``org_seed``, ``org_size``, ``max_turns``...).
    """

    task_sources = (GeneratedService,)
    choices = {"task_args": task_sources}
    tools = SERVICE_TOOLS
    family_prompt = SERVICE_PROMPT

    def __init__(self, tasks: Any = "generated", *, user: Any = "scripted",
                 user_args: Mapping[str, Any] | None = None, **kwargs: Any):
        if user_args is not None and not isinstance(user_args, Mapping):
            raise ValueError(f"user_args must be a dict of LLMUser's arguments, got {user_args!r}")
        if isinstance(user, str):
            if user not in USERS:
                raise ValueError(f"user must be one of {USERS}, a UserSimulator or a function, got {user!r}")
            if user_args and user != "llm":
                raise ValueError("user_args apply only to user='llm'")
            if user == "llm":
                if not user_args or "model" not in user_args:
                    raise ValueError("user='llm' needs user_args={'model': ..., 'base_url': ...} (an OpenAI-compatible endpoint)")
                try:
                    user = LLMUser(**user_args)
                except (TypeError, ValueError) as exc:  # (an unknown key; a bad value, named)
                    raise ValueError(f"user_args: {str(exc).removeprefix('LLMUser: ')}") from None
            else:
                user = scripted_customer
        elif user_args:
            raise ValueError("user_args apply only to user='llm'")
        elif not (callable(user) or isinstance(user, UserSimulator)):  # (None played with no customer at all)
            raise ValueError(f"user must be one of {USERS}, a UserSimulator or a function, got {user!r:.80}")
        super().__init__(tasks, user=user, **kwargs)

    def make_rubric(self) -> Rubric:
        return service_rubric()

    def reference_solver(self) -> ServiceSolver:
        return ServiceSolver(self)
