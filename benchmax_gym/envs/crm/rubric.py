"""Grading CRM episodes: CRMArena's metrics for questions, the database state for updates.

* ``exact_match``: the normalised answer equals the normalised gold answer (SQuAD normalisation:
  lower case, no punctuation, no articles, single spaces). A gold list of several items must be
  matched as a set by an answer listing them (separated by commas, semicolons or lines).
* ``fuzzy_match``: token F1 between answer and gold (SQuAD's), the best over gold alternatives.
* ``db_state`` (update tasks): every expected ``(table, row, column)`` value holds in the episode's
  database, and nothing else changed: other rows of the tables the tools write (``Case``,
  ``CaseHistory__c``) and other columns of the target rows must equal the pristine org, except the
  audit rows the update logged for the target rows and the ``ClosedDate`` a status change stamps.
  Only the cases ``update_case`` touched can differ (the model's SQL cannot write), so only their
  rows are compared; any write SQLite counts beyond ``update_case``'s own is collateral too.

The answer is the last ``<answer>...</answer>`` of the final reply, the rule every family shares
(:func:`~benchmax_gym.core.rubric.final_answer`); a reply without one scores 0 on a question.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Mapping
from typing import Any

from benchmax_gym.core.rubric import RewardFn, Rubric, final_answer
from benchmax_gym.core.sqlite_heap import safe_grading

_ARTICLES = re.compile(r"\b(a|an|the)\b")
WRITABLE_TABLES = {"Case": "Id", "CaseHistory__c": "CaseId__c"}  # table -> the column naming its case
STAMPED_COLUMNS = ("ClosedDate",)


def normalize(text: str) -> str:
    """SQuAD's answer normalisation."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


_LIST_SEPARATORS = re.compile(r"[,;\n]")


def exact_match(prediction: str, gold: str | list[str]) -> float:
    """A gold list is matched as a set by the answer's items, separated by commas, semicolons or
    lines (a bulleted list too; a trailing separator adds no item)."""
    golds = gold if isinstance(gold, list) else [gold]
    if len(golds) == 1:
        return float(normalize(prediction) == normalize(golds[0]))
    items = {normalize(p) for p in _LIST_SEPARATORS.split(prediction) if any(ch.isalnum() for ch in p)}
    return float(items == {normalize(g) for g in golds})


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize(prediction).split(), normalize(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def fuzzy_match(prediction: str, gold: str | list[str]) -> float:
    golds = gold if isinstance(gold, list) else [gold]
    return max(token_f1(prediction, g) for g in golds)


METRIC_FUNCTIONS = {"exact_match": exact_match, "fuzzy_match": fuzzy_match}


def collateral_changes(con, pristine, expected: Mapping[str, Mapping[str, Mapping[str, Any]]],
                       touched: set[str]) -> int:
    """How many rows changed beyond what ``expected`` asks for, comparing ``con`` with ``pristine``.

    Only ``update_case`` writes (``query`` is read-only by SQLite's authorizer), and it records the
    cases it ``touched``: the rows of :data:`WRITABLE_TABLES` that belong to those cases are the
    only ones that can differ, so only they are compared (milliseconds, whatever the org's size).
    """
    targets = {row_id for rows in expected.values() for row_id in rows}
    marks = ",".join("?" * len(touched))
    changed = 0
    for table, case_column in WRITABLE_TABLES.items():
        query = f'SELECT * FROM "{table}" WHERE "{case_column}" IN ({marks}) ORDER BY rowid'
        cur = pristine.execute(query, tuple(touched))
        names = [d[0] for d in cur.description]
        before = {r[0]: r for r in cur}
        after = {r[0]: r for r in con.execute(query, tuple(touched))}
        for row_id, old in before.items():
            new = after.get(row_id)
            if new == old:
                continue
            if new is None or row_id not in targets:
                changed += 1
                continue
            free = set(expected.get(table, {}).get(row_id, {})) | set(STAMPED_COLUMNS)
            if any(a != b for name, a, b in zip(names, old, new) if name not in free):
                changed += 1
        # audit rows the update logged are expected for the target cases, collateral for others
        changed += sum(1 for row_id, new in after.items()
                       if row_id not in before and new[names.index(case_column)] not in targets)
    return changed


@safe_grading
def grade(completion: str | None, episode) -> dict[str, float]:
    """``{"correct", "untouched"}`` for the episode, computed once (both components share it)."""
    state = episode.state
    if "grade" in state:
        return state["grade"]
    task = episode.task
    db = state["db"]
    expected = task.answer if task.metadata.get("reward_metric") == "db_state" else {}
    collateral = db.con.total_changes - db.tool_changes  # writes that bypassed update_case: none expected
    if db.touched:
        collateral += collateral_changes(db.con, state["org"].pristine, expected, db.touched)
    if expected:
        score = float(collateral == 0 and all(
            _value(db.con, table, row_id, column) == value
            for table, rows in expected.items() for row_id, columns in rows.items()
            for column, value in columns.items()
        ))
    else:
        metric = METRIC_FUNCTIONS[task.metadata.get("reward_metric", "exact_match")]
        prediction = final_answer(completion)
        score = 0.0 if prediction is None else metric(prediction, task.answer)
    state["grade"] = {"correct": score, "untouched": float(collateral == 0)}
    return state["grade"]


def _value(con, table: str, row_id: str, column: str) -> Any:
    found = con.execute(f'SELECT "{column}" FROM "{table}" WHERE Id = ?', (row_id,)).fetchone()
    return None if found is None else found[0]


def correct(completion: str, episode) -> float:
    """The task's metric: exact_match or fuzzy_match of the answer, or db_state for updates."""
    return grade(completion, episode)["correct"]


def untouched(completion: str, episode) -> float:
    """1.0 when no row changed beyond what the task asks for (reported; weight 0 by default)."""
    return grade(completion, episode)["untouched"]


def crm_rubric() -> Rubric:
    return Rubric([RewardFn("correct", correct, 1.0), RewardFn("untouched", untouched, 0.0)])


# -- the dense signal (dense_rewards=True) ---------------------------------------------------

DENSE_MAX_ROWS = 10  # a read returning more rows than this (a table dumped whole) reaches nothing
DENSE_MAX_CANDIDATES = 10  # a value pays only while the episode's reads showed at most this many of its kind
_READS = ("query", "get_case", "search_knowledge", "get_order_history", "get_live_chat_transcript")
_SALESFORCE_ID = re.compile(r"[a-z0-9]{15}(?:[a-z0-9]{3})?")  # (normalised: lower case)


def _gold_values(answer: Any) -> list[str]:
    """What the answer needs: a question's answer (each item of a list), an update's new values."""
    if isinstance(answer, Mapping):
        return [str(v) for rows in answer.values() if isinstance(rows, Mapping)
                for columns in rows.values() if isinstance(columns, Mapping) for v in columns.values()]
    if isinstance(answer, (list, tuple)):
        return [str(a) for a in answer]
    return [str(answer)]


def _cells(value: Any, out: list[str]) -> None:
    if isinstance(value, Mapping):
        for v in value.values():
            _cells(v, out)
    elif isinstance(value, list):
        for v in value:
            _cells(v, out)
    elif value is not None:
        out.append(normalize(value))


def kind(value: str) -> str:
    """What the alternatives of a (normalised) value look like: for a Salesforce Id, the Ids of
    the same object (its key prefix); else values of the same shape (each run of digits a 9, of
    letters an a: a state code, a status and a month name are all ``a``, ``12 months`` is ``9 a``)."""
    if _SALESFORCE_ID.fullmatch(value) and any(ch.isdigit() for ch in value):
        return f"id {value[:3]} {len(value)}"
    return re.sub(r"[a-z]+", "a", re.sub(r"\d+", "9", value))


def rows_found(answer: Any, episode, tool_calls: list, tool_results: list) -> tuple[list[int], int]:
    """CRM's dense signal: the values the answer needs (see :func:`_gold_values`) that a read of
    this step returned, precision-aware. A value counts when a returned cell equals it or, for a
    value of two words or more in a typed tool's result (a knowledge article's text), holds it: a
    ``query`` can build any cell, such as every resolution joined in one. It counts only from a
    result of at most :data:`DENSE_MAX_ROWS` rows (a table dumped whole reaches nothing), and only
    while such results of the episode (this step's included) have shown at most
    :data:`DENSE_MAX_CANDIDATES` distinct values of its :func:`kind`: a read that narrows the
    answer down pays, listing every agent does not, in wide rows, in many calls or chunk by chunk
    over several turns. update_case's own messages never count. Each value pays once."""
    gold = [normalize(g) for g in _gold_values(answer)]
    gold = [g for g in dict.fromkeys(gold) if g]
    kinds = {kind(g) for g in gold}
    state = episode.state if episode is not None else {}
    shown: dict[str, set[str]] = state.setdefault("dense_shown", {})  # kind -> the values the reads showed
    found: set[int] = set()
    for call, text in zip(tool_calls, tool_results):
        if call["name"] not in _READS or not isinstance(text, str):
            continue
        try:
            result = json.loads(text)
        except ValueError:
            continue
        rows = result.get("rows") if isinstance(result, dict) and "rows" in result else result
        if isinstance(rows, list) and len(rows) > DENSE_MAX_ROWS:
            continue
        cells: list[str] = []
        _cells(rows, cells)
        for c in cells:
            if (k := kind(c)) in kinds:
                shown.setdefault(k, set()).add(c)
        phrases = call["name"] != "query"
        found.update(i for i, g in enumerate(gold)
                     if any(c == g or (phrases and " " in g and f" {g} " in f" {c} ") for c in cells))
    reached = [i for i in sorted(found) if len(shown.get(kind(gold[i]), ())) <= DENSE_MAX_CANDIDATES]
    return reached, len(gold)
