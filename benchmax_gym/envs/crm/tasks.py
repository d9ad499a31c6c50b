"""CRM tasks: CRMArena's nine question types and two update types, generated from an org, and a
loader for task files in CRMArena's format.

A generated task's answer is computed by SQL from the org when the task is made (the ``*_SQL``
templates below; ``:name`` placeholders). The answer (for update tasks: the expected values of the
rows to change) lives only in ``Task.answer``; ``Task.solution`` holds the task's parameters for
the reference solver, which must still find the answer through the tools. Parameters are drawn
until the answer is unique (one top month, issue, agent or state), so prompts need no tie rules.
Relative periods ("the past 3 quarters") count back from ``Organization.Today``.

Every task has ``metadata = {"source", "type", "reward_metric"}``; ``reward_metric`` is
``exact_match`` or ``fuzzy_match`` (CRMArena's names) or ``db_state`` (update tasks).
"""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmax_gym.core.checks import boolean, optional, path_or_id, positive_int
from benchmax_gym.core.sources import GeneratedSource, SourceConfig, arg
from benchmax_gym.core.sqlite_heap import outside_query_bounds
from benchmax_gym.core.tasks import (
    GeneratedTasks, ListTasks, Task, check_unique_ids, load_records, numbered_jsonl, pick, rand_int, record_where,
    starts_json_array,
)
from benchmax_gym.envs.crm.org import CATEGORIES, HIGH_PRIORITY_RESPONSE_HOURS, MAX_TRANSFERS, REFUND_WINDOW_DAYS
from benchmax_gym.envs.crm.rubric import normalize

QA_TYPES = (
    "knowledge_qa", "monthly_trend_analysis", "top_issue_identification", "case_routing",
    "named_entity_disambiguation", "handle_time", "transfer_count", "policy_violation_identification",
    "best_region_identification",
)  # fmt: skip
UPDATE_TYPES = ("route_case", "close_case")
TASK_TYPES = QA_TYPES + UPDATE_TYPES
METRICS = ("exact_match", "fuzzy_match")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")

TODAY = "(SELECT Today FROM Organization)"
TREND_SQL = f"""SELECT CAST(strftime('%m', c.CreatedDate) AS INTEGER) AS month, COUNT(*) AS cases
FROM "Case" c JOIN OrderItem i ON i.Id = c.OrderItemId__c
WHERE i.Product2Id = :product AND c.CreatedDate >= date({TODAY}, :window) AND c.CreatedDate < {TODAY}
GROUP BY month ORDER BY cases DESC, month"""
TOP_ISSUE_SQL = f"""SELECT c.IssueId__c AS issue, COUNT(*) AS cases
FROM "Case" c JOIN OrderItem i ON i.Id = c.OrderItemId__c
WHERE i.Product2Id = :product AND c.CreatedDate >= date({TODAY}, :window)
GROUP BY issue ORDER BY cases DESC, issue"""
ROUTING_SQL = f"""SELECT OwnerId AS agent, COUNT(*) AS closed FROM "Case"
WHERE Status = 'Closed' AND IssueId__c = :issue AND ClosedDate >= date({TODAY}, :window)
GROUP BY agent ORDER BY closed DESC, agent"""
HANDLE_TIME_SQL = f"""SELECT OwnerId AS agent, AVG(julianday(ClosedDate) - julianday(CreatedDate)) AS days,
COUNT(*) AS cases FROM "Case" WHERE Status = 'Closed' AND ClosedDate >= date({TODAY}, :window)
GROUP BY agent HAVING cases >= :min_cases ORDER BY days * :sign, agent"""
TRANSFER_SQL = f"""SELECT OldValue__c AS agent, COUNT(*) AS transfers FROM CaseHistory__c
WHERE Field__c = 'Owner Assignment' AND OldValue__c IS NOT NULL AND CreatedDate >= date({TODAY}, :window)
GROUP BY agent ORDER BY transfers DESC, agent"""
REGION_SQL = f"""SELECT a.BillingState AS state, AVG(julianday(c.ClosedDate) - julianday(c.CreatedDate)) AS days,
COUNT(*) AS cases FROM "Case" c JOIN Account a ON a.Id = c.AccountId
WHERE c.Status = 'Closed' AND c.CreatedDate >= date({TODAY}, :window)
GROUP BY state HAVING cases >= :min_cases ORDER BY days, state"""
ORDERED_PRODUCT_SQL = """SELECT DISTINCT i.Product2Id AS product FROM "Order" o
JOIN OrderItem i ON i.OrderId = o.Id JOIN Product2 p ON p.Id = i.Product2Id
JOIN ProductCategory pc ON pc.Id = p.ProductCategoryId
WHERE o.BillToContactId = :contact AND pc.Name = :category AND substr(o.EffectiveDate, 1, 7) = :month"""
ARTICLE_SQL = "SELECT Id, FAQ_Answer__c, Resolution__c FROM Knowledge__kav WHERE Title = :title"
RESOLUTION_SQL = "SELECT Resolution__c FROM Knowledge__kav WHERE IssueId__c = :issue AND Resolution__c IS NOT NULL"
# policy article title -> the cases (``case_id``) that violate it
POLICY_SQL = {
    "Refund policy": f"""SELECT c.Id AS case_id FROM "Case" c JOIN OrderItem i ON i.Id = c.OrderItemId__c
JOIN "Order" o ON o.Id = i.OrderId WHERE c.Resolution__c = 'Refund issued'
AND julianday(c.CreatedDate) - julianday(o.EffectiveDate) > {REFUND_WINDOW_DAYS}""",
    "First response policy for high-priority cases": f"""SELECT c.Id AS case_id FROM "Case" c WHERE c.Priority = 'High'
AND (julianday((SELECT MIN(MessageDate) FROM EmailMessage e WHERE e.ParentId = c.Id AND e.Incoming = 0))
- julianday(c.CreatedDate)) * 24 > {HIGH_PRIORITY_RESPONSE_HOURS}""",
    "Case transfer policy": f"""SELECT CaseId__c AS case_id FROM CaseHistory__c
WHERE Field__c = 'Owner Assignment' AND OldValue__c IS NOT NULL GROUP BY CaseId__c HAVING COUNT(*) > {MAX_TRANSFERS}""",
}


def policy_check_sql(title: str) -> str:
    """Returns a row when case ``:case`` violates the policy of article ``title``."""
    return f"SELECT case_id FROM ({POLICY_SQL[title]}) WHERE case_id = :case"


def sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def render_sql(sql: str, params: Mapping[str, Any]) -> str:
    """A template with its ``:name`` placeholders replaced by SQL literals (what ``query`` takes)."""
    return re.sub(r":(\w+)", lambda m: sql_literal(params[m.group(1)]) if m.group(1) in params else m.group(0), sql)


@dataclass(frozen=True)
class CRMTaskConfig:
    """Knobs of the task generator.

    Attributes:
        task_types: which types to draw from (names from :data:`TASK_TYPES`; a list or one name
            is accepted too).
    """

    task_types: tuple[str, ...] = TASK_TYPES

    def __post_init__(self):
        types = (self.task_types,) if isinstance(self.task_types, str) else self.task_types
        if not isinstance(types, (tuple, list)) or not types:
            raise ValueError(f"task_types must be a non-empty list of {TASK_TYPES}, got {self.task_types!r}")
        unknown = [t for t in types if t not in TASK_TYPES]
        if unknown:
            raise ValueError(f"task_types may only contain {TASK_TYPES}, got {unknown!r}")
        object.__setattr__(self, "task_types", tuple(dict.fromkeys(types)))


@dataclass(frozen=True)
class _Spec:
    """What a task builder returns; ``params`` are what the reference solver may use."""

    prompt: str
    answer: Any
    params: dict[str, Any]
    metric: str = "exact_match"


def _rows(con: sqlite3.Connection, sql: str, params: Mapping[str, Any]) -> list[tuple]:
    return con.execute(sql, dict(params)).fetchall()


def _unique_top(rows: list[tuple], key: int = 1, tolerance: float = 0.0) -> Any:
    """The first column of the first row when it beats the second row by more than ``tolerance``."""
    if not rows:
        return None
    if len(rows) > 1 and abs(rows[0][key] - rows[1][key]) <= tolerance:
        return None
    return rows[0][0]


def _period(rng: np.random.Generator) -> tuple[int, str]:
    """A look-back window: (months, the words for it)."""
    if rng.random() < 0.5:
        q = rand_int(rng, 1, 3)
        return 3 * q, f"the past {('one', 'two', 'three')[q - 1]} quarter{'s' * (q > 1)}"
    months = pick(rng, (2, 3, 4, 6, 8, 10))
    return months, f"the past {months} months"


def _product(rng, con) -> tuple[str, str]:
    return pick(rng, con.execute("SELECT Id, Name FROM Product2 ORDER BY Id").fetchall())


def _knowledge_qa(rng, con):
    category = pick(rng, [c for c, _ in CATEGORIES])
    if rng.random() < 0.5:
        title, pattern, unit = f"Warranty coverage for {category}", r"(\d+) months", " months"
        prompt = (f"A customer asks how long the warranty on our {category.lower()} lasts. What does the "
                  "knowledge base say? Answer with the period only.")
    else:
        title, pattern, unit = f"Returns and restocking fees for {category}", r"(\d+)%", "%"
        prompt = (f"A customer asks what restocking fee applies when they return opened {category.lower()}. "
                  "What does the knowledge base say? Answer with the fee only.")
    found = _rows(con, ARTICLE_SQL, {"title": title})
    if not found:
        return None
    answer = re.search(pattern, found[0][1]).group(1) + unit
    return _Spec(prompt=prompt, answer=answer, params={"title": title, "pattern": pattern, "unit": unit},
                 metric="fuzzy_match")


def _monthly_trend(rng, con):
    product_id, product = _product(rng, con)
    months, words = _period(rng)
    if months > 9:
        return None  # month names must be unambiguous within the window
    params = {"product": product_id, "window": f"-{months} months"}
    month = _unique_top(_rows(con, TREND_SQL, params))
    if month is None:
        return None
    prompt = f"In {words}, in which month did we get the most cases about the {product}? Answer with the month's name."
    return _Spec(prompt=prompt, answer=MONTHS[month - 1], params=params)


def _top_issue(rng, con):
    product_id, product = _product(rng, con)
    months, words = _period(rng)
    months = pick(rng, (months, 24))
    params = {"product": product_id, "window": f"-{months} months"}
    issue = _unique_top(_rows(con, TOP_ISSUE_SQL, params))
    if issue is None:
        return None
    when = "in the past two years" if months == 24 else f"in {words}"
    prompt = f"What was the most reported issue for the {product} {when}? Answer with the Issue__c Id."
    return _Spec(prompt=prompt, answer=issue, params=params)


def _routing_answer(rng, con, statuses: tuple[str, ...]):
    marks = ",".join("?" * len(statuses))
    cases = con.execute(f'SELECT Id, CaseNumber, IssueId__c, OwnerId FROM "Case" WHERE Status IN ({marks}) ORDER BY Id',
                        statuses).fetchall()
    if not cases:
        return None
    case_id, number, issue, owner = pick(rng, cases)
    months = pick(rng, (6, 12))
    params = {"issue": issue, "window": f"-{months} months", "case": case_id}
    agent = _unique_top(_rows(con, ROUTING_SQL, params))
    if agent is None or agent == owner:
        return None
    rule = f"the agent who closed the most cases with the same issue in the past {months} months"
    return number, rule, params, agent


def _case_routing(rng, con):
    found = _routing_answer(rng, con, ("New",))
    if found is None:
        return None
    number, rule, params, agent = found
    prompt = f"Case {number} was just opened. Which agent should it be routed to? Our rule: {rule}. Answer with the agent's User Id."
    return _Spec(prompt=prompt, answer=agent, params=params)


def _named_entity(rng, con):
    count = con.execute("SELECT COUNT(*) FROM OrderItem").fetchone()[0]
    contact, category, month = con.execute(
        'SELECT o.BillToContactId, pc.Name, substr(o.EffectiveDate, 1, 7) FROM OrderItem i '
        'JOIN "Order" o ON o.Id = i.OrderId JOIN Product2 p ON p.Id = i.Product2Id '
        "JOIN ProductCategory pc ON pc.Id = p.ProductCategoryId ORDER BY i.Id LIMIT 1 OFFSET ?",
        (rand_int(rng, 0, count - 1),)).fetchone()
    params = {"contact": contact, "category": category, "month": month}
    products = _rows(con, ORDERED_PRODUCT_SQL, params)
    bought = con.execute('SELECT COUNT(DISTINCT i.Product2Id) FROM "Order" o JOIN OrderItem i ON i.OrderId = o.Id '
                         "WHERE o.BillToContactId = ?", (contact,)).fetchone()[0]
    if len(products) != 1 or bought < 2:
        return None
    name = con.execute("SELECT Name FROM Contact WHERE Id = ?", (contact,)).fetchone()[0]
    year, mon = month.split("-")
    prompt = (f'Contact {name} (Id {contact}) writes: "I have a problem with the item from your {category} range '
              f'that I ordered in {MONTHS[int(mon) - 1]} {year}." Which product do they mean? Answer with its Product2 Id.')
    return _Spec(prompt=prompt, answer=products[0][0], params=params)


def _top(con, sql: str, params: dict[str, Any], prompt: str, tolerance: float = 0.0) -> _Spec | None:
    """A task whose answer is the clear winner of ``sql`` (None when the top two are too close)."""
    winner = _unique_top(_rows(con, sql, params), tolerance=tolerance)
    return None if winner is None else _Spec(prompt=prompt, answer=winner, params=params)


def _handle_time(rng, con):
    months, words = _period(rng)
    fastest = bool(rng.random() < 0.5)
    params = {"window": f"-{months} months", "min_cases": 5, "sign": 1 if fastest else -1}
    return _top(con, HANDLE_TIME_SQL, params, tolerance=0.01, prompt=(
        f"Among agents who closed at least 5 cases in {words}, who had the {'shortest' if fastest else 'longest'} "
        "average handle time on those cases (handle time: ClosedDate minus CreatedDate)? Answer with the agent's User Id."))


def _transfer_count(rng, con):
    months, words = _period(rng)
    return _top(con, TRANSFER_SQL, {"window": f"-{months} months"}, prompt=(
        f"Which agent transferred cases to another agent most often in {words} (owner changes away from "
        "them recorded in CaseHistory__c)? Answer with the agent's User Id."))


def _policy_violation(rng, con):
    violators = {title: {r[0] for r in con.execute(sql)} for title, sql in POLICY_SQL.items()}
    target = pick(rng, [*POLICY_SQL, None])
    if target is None:
        anywhere = set().union(*violators.values())
        candidates = [r[0] for r in con.execute("SELECT Id FROM \"Case\" WHERE Status = 'Closed' ORDER BY Id")
                      if r[0] not in anywhere]
    else:
        others = set().union(*(v for t, v in violators.items() if t != target))
        candidates = sorted(violators[target] - others)
    if not candidates:
        return None
    case_id = pick(rng, candidates)
    answer = _rows(con, ARTICLE_SQL, {"title": target})[0][0] if target else "None"
    number = con.execute('SELECT CaseNumber FROM "Case" WHERE Id = ?', (case_id,)).fetchone()[0]
    prompt = (f"Review how case {number} was handled. Did it violate any of our support policies in the knowledge base? "
              "Answer with the Id of the violated Knowledge__kav article, or None if no policy was violated.")
    return _Spec(prompt=prompt, answer=answer, params={"case": case_id})


def _best_region(rng, con):
    months, words = _period(rng)
    return _top(con, REGION_SQL, {"window": f"-{months} months", "min_cases": 10}, tolerance=0.01, prompt=(
        f"Among states (the account's BillingState) with at least 10 closed cases created in {words}, which had the "
        "fastest average case closure time (ClosedDate minus CreatedDate)? Answer with the two-letter state code."))


def _route_case(rng, con):
    found = _routing_answer(rng, con, ("New", "Working"))
    if found is None:
        return None
    number, rule, params, agent = found
    prompt = f"Route case {number} to the right agent (make them its owner). Our rule: {rule}. Change nothing else."
    return _Spec(prompt=prompt, answer={"Case": {params["case"]: {"OwnerId": agent}}}, params=params, metric="db_state")


def _close_case(rng, con):
    cases = con.execute("SELECT Id, CaseNumber, IssueId__c FROM \"Case\" WHERE Status IN ('Working', 'Escalated') "
                        "ORDER BY Id").fetchall()
    if not cases:
        return None
    case_id, number, issue = pick(rng, cases)
    resolution = _rows(con, RESOLUTION_SQL, {"issue": issue})
    if not resolution:
        return None
    prompt = (f"Case {number} is solved. Close it with the resolution our knowledge base recommends for its issue. "
              "Change nothing else.")
    return _Spec(prompt=prompt, answer={"Case": {case_id: {"Status": "Closed", "Resolution__c": resolution[0][0]}}},
                 params={"case": case_id}, metric="db_state")


_BUILDERS = {
    "knowledge_qa": _knowledge_qa, "monthly_trend_analysis": _monthly_trend, "top_issue_identification": _top_issue,
    "case_routing": _case_routing, "named_entity_disambiguation": _named_entity, "handle_time": _handle_time,
    "transfer_count": _transfer_count, "policy_violation_identification": _policy_violation,
    "best_region_identification": _best_region, "route_case": _route_case, "close_case": _close_case,
}  # fmt: skip


def make_crm_task(rng: np.random.Generator, index: int, con: sqlite3.Connection, config: CRMTaskConfig,
                  org_name: str) -> Task:
    """Task ``index`` drawn with ``rng`` from the org behind ``con`` (never written to).

    A drawn type whose parameters give no unique answer is drawn again (the same way each time).
    """
    first = pick(rng, config.task_types)
    for task_type in (first, *config.task_types):  # keep to the drawn type while it can be made
        spec = next((s for s in (_BUILDERS[task_type](rng, con) for _ in range(30)) if s is not None), None)
        if spec is not None:
            break
    else:
        raise ValueError(f"the org {org_name} has no task of types {config.task_types} with a unique answer; "
                         "use a bigger org_size")
    return Task(
        id=f"crm-{org_name}-{index}",
        prompt=spec.prompt,
        answer=spec.answer,
        solution={"type": task_type, "params": spec.params},
        metadata={"source": "generated", "type": task_type, "reward_metric": spec.metric},
    )


def outside_query_bounds_drawn(make, rng: np.random.Generator, *args: Any) -> Any:
    """``make(rng, *args)``, a task drawn by SQL from the org, safe from another episode's query
    nearing its heap bound (:func:`~benchmax_gym.core.sqlite_heap.outside_query_bounds`: a reset
    must not fail for it). Its second try draws from ``rng`` as it was: the same task."""
    drawn = rng.bit_generator.state

    def attempt():
        rng.bit_generator.state = drawn
        return make(rng, *args)
    return outside_query_bounds(attempt)


def generated_tasks(con: sqlite3.Connection, org_name: str, config: CRMTaskConfig | None = None, *,
                    seed: int = 0, size: int | None = None) -> GeneratedTasks:
    """Tasks over one org: item ``i`` of ``seed`` is always the same task (for the same org)."""
    config = CRMTaskConfig() if config is None else config
    return GeneratedTasks(lambda rng, i: outside_query_bounds_drawn(make_crm_task, rng, i, con, config, org_name),
                          seed=seed, size=size)


@dataclass(frozen=True)
class GeneratedCRM(GeneratedSource):
    """``tasks="generated"``: tasks computed from the generated org; ``task_types`` picks the kinds
    (default: all of :data:`TASK_TYPES`)."""

    task_types: Any = None

    def __post_init__(self):
        super().__post_init__()
        if self.task_types is not None:
            CRMTaskConfig(task_types=self.task_types)  # a bad type fails here, at make

    def build(self, env: Any) -> GeneratedTasks:
        config = CRMTaskConfig() if self.task_types is None else CRMTaskConfig(task_types=self.task_types)
        return generated_tasks(env.org.pristine, env.org_name, config, seed=self.task_seed, size=self.num_tasks)


@dataclass(frozen=True)
class CRMArena(SourceConfig):
    """``tasks="crmarena"``: a task file in CRMArena's format, run against the env's ``org_db``;
    tasks naming Salesforce ids absent from it are refused unless ``check_org_ids=False``."""

    name = "crmarena"
    dataset: Any = arg(MISSING, path_or_id)
    limit: int | None = arg(None, optional(positive_int))
    check_org_ids: bool = arg(True, boolean)

    def build(self, env: Any) -> ListTasks:
        tasks = crmarena_tasks(self.dataset, limit=self.limit)
        if self.check_org_ids:
            outside_query_bounds(check_task_ids, tasks, env.org, env.org_db)
        return tasks


CRMARENA_ORG_MISSING = (
    "tasks='crmarena' needs org_db=: CRMArena's tasks ask about CRMArena's own Salesforce org, which is "
    "not included in benchmax-gym (and the generated org has none of its records). Export that org to "
    "a SQLite file with one table per object under the same names (Account, Contact, Case, User, "
    "Order, OrderItem, Product2, Knowledge__kav, ...) and pass org_db=PATH")

# 15- or 18-character Salesforce ids: a 3-character key prefix, then base-62 characters
_SF_ID = re.compile(r"\b[0-9A-Za-z]{3}[0-9A-Za-z]{12}(?:[0-9A-Za-z]{3})?\b")


def check_task_ids(tasks: ListTasks, org: Any, org_db: Any) -> None:
    """Refuse tasks that name Salesforce ids (of the object types the org has) missing from it."""
    ids: set[str] = set()
    for table in org.tables:
        columns = {r[1] for r in org.pristine.execute(f'PRAGMA table_info("{table}")')}
        if "Id" in columns:
            ids.update(r[0] for r in org.pristine.execute(f'SELECT Id FROM "{table}"') if isinstance(r[0], str))
    prefixes = {i[:3] for i in ids}
    ids |= {i[:15] for i in ids}
    missing: dict[str, str] = {}
    for task in tasks:
        text = " ".join([task.prompt, *(task.answer if isinstance(task.answer, list) else [str(task.answer)])])
        for token in _SF_ID.findall(text):
            if token[:3] in prefixes and any(c.isdigit() for c in token[3:]) and token not in ids:
                missing.setdefault(token, task.id)
    if missing:
        shown = ", ".join(f"{token} ({task_id})" for token, task_id in list(missing.items())[:3])
        raise ValueError(
            f"{len(missing)} Salesforce id(s) named by the tasks are not in org_db {os.fspath(org_db)!r}, e.g. "
            f"{shown}: these tasks ask about another org. CRMArena's org is not included in benchmax-gym; "
            "pass the SQLite export of the org the tasks were written for, or check_org_ids=False to run anyway")


def crmarena_tasks(path: str | os.PathLike, *, limit: int | None = None) -> ListTasks:
    """Tasks from a file in CRMArena's format: a JSON list or JSON Lines of
    ``{idx, type (or task), query, answer, reward_metric, metadata}`` (other local formats and hub
    ids such as ``Salesforce/CRMArena`` go through ``datasets``). ``answer`` is a string or a list of
    strings, where a null item means "None" (see :func:`crmarena_gold`); ``metadata["required"]``,
    when present, is context the agent must see (CRMArena's convention) and is added to the prompt,
    as is ``metadata["optional"]`` (definitions of quarters and seasons, say)."""
    path = os.fspath(path)
    where: Callable[[int], str]
    if Path(path).suffix in (".json", ".jsonl") and Path(path).is_file():
        if starts_json_array(path):
            try:
                records = json.loads(Path(path).read_bytes().removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
            except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
                raise ValueError(f"tasks {path!r}: not a JSON array of tasks ({type(exc).__name__}: {exc})") from None
            where = lambda i: f"tasks {path!r} record {i + 1}"  # noqa: E731
        else:  # JSON Lines, read only as far as the limit: a bad line is named by its number
            numbered = numbered_jsonl(path, "tasks", limit=limit)
            records = [record for _, record in numbered]
            where = lambda i: f"tasks {path!r} line {numbered[i][0]}"  # noqa: E731
    else:  # other local formats, or a hub id (Salesforce/CRMArena keeps its tasks in the "test" split)
        records = list(load_records(path, split=None if os.path.exists(path) else "test"))
        where = lambda i: record_where(path, i, "tasks")  # noqa: E731
    tasks = []
    for i, record in enumerate(records):
        if limit is not None and len(tasks) >= limit:
            break
        tasks.append(_crmarena_task(record, i, functools.partial(where, i)))
    if not tasks:
        raise ValueError(f"no tasks in {path!r}")
    try:
        check_unique_ids(tasks)
    except ValueError:  # said naming the two records' places (two records with one idx)
        check_unique_ids(tasks, place=where)
    return ListTasks(tasks)


def crmarena_gold(answer: Any, where: str) -> str | list[str]:
    """A CRMArena record's gold answer: its text, or its list of texts.

    CRMArena writes "no such record" (a case whose agent violated no policy) as a null item,
    ``"answer": [null]``, and grades it as the text "None" (its evaluator turns ``[None]`` into
    ``["None"]``), as the generated ``policy_violation_identification`` tasks do: a null item is the
    gold "None" here too. A null answer itself (what ``datasets`` fills in for a missing key), an
    empty list, or an answer or item with no words (an empty reply would match it) is refused,
    naming the record."""
    if answer is None:
        raise ValueError(f"{where}: the answer is null; CRMArena writes a 'None' answer (no matching "
                         "record) as [null], and every task needs an answer")
    items = list(answer) if isinstance(answer, (list, tuple)) else [answer]
    if not items:
        raise ValueError(f"{where}: the answer is an empty list; every task needs an answer")
    golds = ["None" if a is None else str(a) for a in items]
    for gold in golds:
        if not normalize(gold):
            raise ValueError(f"{where}: the answer {gold!r} has no words to match (an empty reply "
                             "would); every task needs an answer")
    return golds if isinstance(answer, (list, tuple)) else golds[0]


def _crmarena_task(record: Any, i: int, place: Callable[[], str]) -> Task:
    """The task of ``record``; ``place()`` says where it is (worked out for an error only: for a
    folder of files it reads them again)."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{place()}: expected an object, got {type(record).__name__}")
    missing = [k for k in ("query", "answer", "reward_metric") if k not in record]
    task_type = record.get("type", record.get("task"))
    if missing or task_type is None:
        raise ValueError(f"{place()}: missing field(s) {missing + (['type'] if task_type is None else [])}")
    metric = record["reward_metric"]
    if metric not in METRICS:
        raise ValueError(f"{place()}: reward_metric must be one of {METRICS}, got {metric!r}")
    try:
        answer = crmarena_gold(record["answer"], "")
    except ValueError as exc:  # (its message is ": why")
        raise ValueError(f"{place()}{exc}") from None
    metadata = record.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata.strip().startswith("{") else {"required": metadata}
        except (ValueError, RecursionError) as exc:  # (a bare JSONDecodeError named neither file nor record)
            raise ValueError(f"{place()}: metadata is text that starts as a JSON object but is not one ({exc})") from None
    if not isinstance(metadata, Mapping):  # (a list failed as an AttributeError)
        raise ValueError(f"{place()}: metadata must be an object or text, got {type(metadata).__name__}")
    prompt = str(record["query"])
    for part in ("required", "optional"):  # context CRMArena shows the agent (optional: quarter/season definitions)
        if metadata.get(part):
            prompt = f"{prompt}\n\n{metadata[part]}"
    idx = record.get("idx", i)
    return Task(id=f"crmarena-{idx}", prompt=prompt, answer=answer, solution=None,
                metadata={"source": "crmarena", "type": str(task_type), "reward_metric": metric, "idx": idx})
