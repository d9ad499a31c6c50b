"""The CRM tools, acting on the episode's private copy of the org (:class:`EpisodeDB`).

``query`` runs the model's SQL read-only, enforced by SQLite itself, not by looking at the text:
an authorizer allows only reads (no writes, ``ATTACH``, ``PRAGMA``, ``VACUUM``, ``load_extension``)
and ``PRAGMA query_only`` is on while it runs. Its cost is bounded two ways. At its deadline a
watchdog thread interrupts it (``Connection.interrupt``: SQLite stops at the next opcode, so a
recursive CTE that never ends, or one whose every row calls a function on a 900 KB value, stops
within one opcode's work of the deadline). Within one opcode the string functions whose built-in
cost is the product of their arguments' lengths (``instr``, ``replace``, ``trim``: a 500 KB needle
in a 1 MB haystack took 10 s a row) are replaced by linear ones with the same results,
``printf``'s ``%c`` repeats are capped (SQLite loops over 2**31 of them however big the result),
and LIKE/GLOB patterns are limited to 100 characters (a match costs up to the value's length
times the pattern's: a 1 MB value took 51 s against a 40,000-character pattern, 0.7 s against a
256-character GLOB class, 0.27 s at 100). Strings and blobs are limited to 1 MB. Rows are read
one at a time and reading stops at the row cap or once the output would pass the tool-output cap,
so 200 rows of 1 MB never sit in memory together. A query's temporary storage (the sorter of an
ORDER BY, GROUP BY, DISTINCT, materialised subqueries) stays in memory (``PRAGMA temp_store =
MEMORY``; on disk an ORDER BY over a recursive CTE wrote 500 MB of temp files within a 2 s timeout),
and SQLite's heap may grow by at most :data:`QUERY_MEMORY_BYTES` while a query runs (its hard heap
limit), past which the query fails with a clear error. Typed tools run parameterized SQL. Every
failure is a :class:`ToolError` and leaves the database as it was.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
import threading
import time
from typing import Any

from benchmax_gym.core.outcomes import ENV_ERROR
from benchmax_gym.core.sqlite_heap import HEAP as _HEAP
from benchmax_gym.core.sqlite_heap import QUERY_MEMORY_BYTES, outside_query_bounds, safe_from_query_bounds
from benchmax_gym.core.tools import ToolError, ToolFailure, tool
from benchmax_gym.envs.crm.org import CASE_PRIORITIES, CASE_STATUSES, RESOLUTIONS, sf_id

_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_FORBIDDEN_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts5"}
MAX_VALUE_BYTES = 1_000_000
MAX_PATTERN_CHARS = 100
_as_text = sqlite3.connect(":memory:", check_same_thread=False)  # SQLite's own number-to-text and printf
_as_text.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)


def _text(value: Any) -> Any:
    """A function argument as SQLite's string functions see it (str, bytes or None)."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    return _as_text.execute("SELECT CAST(? AS TEXT)", (value,)).fetchone()[0]


def _instr(haystack: Any, needle: Any) -> int | None:
    haystack, needle = _text(haystack), _text(needle)
    if haystack is None or needle is None:
        return None
    if isinstance(haystack, bytes) != isinstance(needle, bytes):  # SQLite compares them as text
        haystack = haystack.decode("utf-8", "replace") if isinstance(haystack, bytes) else haystack
        needle = needle.decode("utf-8", "replace") if isinstance(needle, bytes) else needle
    return haystack.find(needle) + 1


def _replace(text: Any, old: Any, new: Any) -> Any:
    text, old, new = (_text(v) for v in (text, old, new))
    if text is None or old is None or new is None:
        return None
    text, old, new = (v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in (text, old, new))
    if not old:
        return text
    if len(text) + max(0, len(new) - len(old)) * text.count(old) > MAX_VALUE_BYTES:
        raise sqlite3.DataError("string or blob too big")
    return text.replace(old, new)


def _trimmer(method: str):
    """SQLite's trim, ltrim or rtrim. Python's strip scans ``chars`` for every character it
    removes (a 500,000-character set over a 1 MB value took 8-12 s in one step, holding the
    GIL), so past a few distinct characters the ends are walked against a set."""
    def trim(text: Any, chars: Any = " ") -> Any:
        text, chars = _text(text), _text(chars)
        if text is None or chars is None:
            return None
        text, chars = (v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in (text, chars))
        chars = chars.partition("\x00")[0]  # SQLite reads the set as a C string
        if len(chars) > 64:
            keep = set(chars)
            if len(keep) > 64:
                start = 0 if method == "rstrip" else _run(text, keep)
                end = len(text) if method == "lstrip" else len(text) - _run(reversed(text), keep)
                return text[start:max(start, end)]
            chars = "".join(keep)
        return getattr(text, method)(chars)
    return trim


def _run(chars: Any, keep: set[str]) -> int:
    """How many of ``chars`` come before the first one not in ``keep``."""
    return sum(1 for _ in itertools.takewhile(keep.__contains__, chars))


_CONVERSION = re.compile(r"%[-+ #!0,]*(?:\d+|\*)?(?:\.(\*|\d*))?l{0,2}(.?)", re.S)


def _printf(*args: Any) -> Any:
    """SQLite's ``printf``/``format``, refusing (NULL, as SQLite does for a too-big result) a
    format whose ``%c`` repeats add up past :data:`MAX_VALUE_BYTES`: SQLite 3.40 loops once per
    repeat even after the result overflowed (``printf('%.*c', 2147483647, 'x')`` took 10 s, in
    one step the query deadline never sees). A ``*`` precision counts as the largest argument."""
    fmt = _text(args[0]) if args else None
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if isinstance(fmt, str) and "c" in fmt:
        star = 0
        repeats = 0
        for m in _CONVERSION.finditer(fmt):
            if m.group(2) != "c" or not m.group(1):
                continue
            if m.group(1) == "*":
                if not star:
                    star = max((abs(_int32(a)) for a in args[1:]), default=0) or 1
                repeats += star
            else:
                repeats += int(m.group(1)[-32:]) & 0x7FFFFFFF  # a uint32 in SQLite; 10**32 % 2**32 == 0
            if repeats > MAX_VALUE_BYTES:
                return None
    return _as_text.execute(f"SELECT printf({', '.join('?' * len(args))})", args).fetchone()[0] if args else None


def _int32(value: Any) -> int:
    """An argument as SQLite's printf reads a ``*`` width: int64, then truncated to a C int."""
    n = _as_text.execute("SELECT CAST(? AS INTEGER)", (value,)).fetchone()[0] or 0
    n &= 0xFFFFFFFF
    return n - (1 << 32) if n >= 1 << 31 else n


_LINEAR_FUNCTIONS = [("instr", 2, _instr), ("replace", 3, _replace), ("printf", -1, _printf), ("format", -1, _printf)] + [
    (name, n, _trimmer(method)) for name, method in (("trim", "strip"), ("ltrim", "lstrip"), ("rtrim", "rstrip"))
    for n in (1, 2)]


def _read_only(action: int, arg1: str | None, arg2: str | None, db_name: str | None, source: str | None) -> int:
    """SQLite authorizer for the model's SQL: reads and ordinary functions only."""
    if action not in _READ_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _FORBIDDEN_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<blob of {len(value)} bytes>"
    return value


class EpisodeDB:
    """One episode's database: a private in-memory copy of the org plus the query limits.

    Attributes:
        con: the connection (autocommit; typed updates use explicit transactions).
        max_rows: rows ``query`` returns at most (the rest are cut with a note).
        timeout: seconds a ``query`` may run.
        today: the org's "today" (``Organization.Today``), the date updates are stamped with.
        touched: the Ids of the cases ``update_case`` changed (the only rows that can differ from
            the org: graders compare just those).
        tool_changes: rows ``update_case`` wrote; SQLite's ``total_changes`` beyond it would be a
            write that bypassed the tools (graders count it as collateral).
    """

    def __init__(self, con: sqlite3.Connection, max_rows: int, timeout: float, today: str | None,
                 max_chars: int = 8_000):
        self.con = con
        self.max_rows = max_rows
        self.timeout = timeout
        self.max_chars = max_chars
        self.today = today
        self.touched: set[str] = set()
        self.tool_changes = 0
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        con.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
        con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        con.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_PATTERN_CHARS)
        for name, n_args, function in _LINEAR_FUNCTIONS:
            con.create_function(name, n_args, function, deterministic=True)
        if _HEAP is not None:  # else (no heap bound in this build) temp data goes to files, as by default
            con.execute("PRAGMA temp_store = MEMORY")

    def read(self, sql: str, params: tuple = ()) -> tuple[list[str], list[tuple], bool]:
        """Run ``sql`` read-only within the limits: ``(columns, rows, truncated)``.

        Rows are read one at a time; reading stops after ``max_rows`` rows or once the text of
        the rows read passes ``max_chars`` (the rest could not be shown anyway). Out of memory
        while another query's bound was in force too (the limit is the process's: the other may
        have taken it), it runs once more alone, under its own bound only.
        """
        self._read_only(True)
        try:
            ticket = _HEAP.enter() if _HEAP is not None else None  # (None: temp data goes to files)
            try:
                return self._read(sql, params)
            except MemoryError:
                pass
            finally:
                shared = ticket is not None and _HEAP.exit(ticket)
            if shared:
                with _HEAP.alone(query=True):
                    try:
                        return self._read(sql, params)
                    except MemoryError:
                        pass
            raise ToolError(f"the query needed more than {QUERY_MEMORY_BYTES >> 20} MB of working memory (sorting, "
                            "grouping or DISTINCT over too many rows) and was stopped; narrow it with WHERE, "
                            "aggregate, or add LIMIT") from None
        finally:
            self._read_only(False)

    @safe_from_query_bounds
    def _read_only(self, on: bool) -> None:
        """The model's SQL may only read while ``on``: ``query_only`` and the authorizer."""
        if not on:
            self.con.set_authorizer(None)
        self.con.execute(f"PRAGMA query_only = {'ON' if on else 'OFF'}")
        if on:
            self.con.set_authorizer(_read_only)

    def _read(self, sql: str, params: tuple) -> tuple[list[str], list[tuple], bool]:
        """One run of :meth:`read`; SQLite's out-of-memory (the heap bound) is the caller's."""
        _WATCHDOG.arm(self.con, time.monotonic() + self.timeout)
        try:
            cur = self.con.execute(sql, params)
            rows, size, truncated = [], 0, False
            for row in cur:
                if len(rows) == self.max_rows or size > self.max_chars:
                    truncated = True
                    break
                rows.append(row)
                size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
            columns = [d[0] for d in cur.description or ()]
            cur.close()
        except sqlite3.OperationalError as exc:
            _broken(exc)
            if "pattern too complex" in str(exc):
                raise ToolError(f"LIKE and GLOB patterns are limited to {MAX_PATTERN_CHARS} characters") from None
            if str(exc) == "interrupted":
                raise ToolError(f"the query ran longer than {self.timeout:g} s and was stopped") from None
            raise ToolError(_sql_message(exc)) from None
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
            _broken(exc)
            raise ToolError(_sql_message(exc)) from None
        finally:
            _WATCHDOG.disarm(self.con)
        return columns, rows, truncated

    def row(self, sql: str, params: tuple = ()) -> dict[str, Any] | None:
        cur = self.con.execute(sql, params)
        found = cur.fetchone()
        return None if found is None else dict(zip([d[0] for d in cur.description], found))

    def rows(self, sql: str, params: tuple = ()) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


class _Watchdog:
    """One daemon thread per process that interrupts each armed connection at its deadline.

    A progress handler (Python, every 10,000 opcodes) let a query whose opcodes each cost a
    millisecond (``instr`` over a 900 KB blob, row after row) run 2.7 s past a 2 s timeout;
    ``interrupt`` is thread-safe and SQLite checks it between opcodes. Arming costs a dict entry
    (the thread is woken only for a deadline earlier than the one it waits for); disarming under
    the same lock means no interrupt lands once a query is done."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # (the thread does not exist in a child)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, sqlite3.Connection]] = {}
        self._waiting_until = float("inf")
        self._thread: threading.Thread | None = None

    def arm(self, con: sqlite3.Connection, deadline: float) -> None:
        with self._cond:
            self._due[id(con)] = (deadline, con)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="crm-query-watchdog", daemon=True)
                self._thread.start()
            elif deadline < self._waiting_until:
                self._cond.notify()

    def disarm(self, con: sqlite3.Connection) -> None:
        with self._cond:
            self._due.pop(id(con), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for key, (deadline, con) in list(self._due.items()):
                    if deadline <= now:
                        del self._due[key]
                        con.interrupt()
                self._waiting_until = min((d for d, _ in self._due.values()), default=float("inf"))
                self._cond.wait(None if not self._due else self._waiting_until - now)


_WATCHDOG = _Watchdog()


def _sql_message(exc: Exception) -> str:
    text = str(exc)
    if "authoriz" in text or "prohibited" in text or "readonly" in text or "query_only" in text:
        return (f"{text}: query is read-only (SELECT and WITH ... SELECT only; no writes, ATTACH, PRAGMA "
                "or extensions); use update_case to change a case")
    if "one statement at a time" in text:
        return "send one SQL statement per query call"
    return f"SQL error: {text}"


def _db(episode) -> EpisodeDB:
    db = episode.state["db"]
    try:
        db.con.total_changes  # noqa: B018 - raises once the episode's database is gone
    except sqlite3.ProgrammingError as exc:
        raise ToolFailure(f"the CRM database is unusable ({exc})", ENV_ERROR) from None
    return db


#: SQLite's primary result codes for a database that broke under us, never for a model's query
_BROKEN = {sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOTADB}


def _broken(exc: Exception) -> None:
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _BROKEN:
        raise ToolFailure(f"the CRM database is unusable ({exc})", ENV_ERROR) from None


@tool(inline=True)
def query(sql: str, episode) -> str:
    """Run one read-only SQL (SQLite) statement on the CRM database and return the rows as JSON.

    Table names are Salesforce object names; quote the SQL keywords "Case" and "Order". Dates are
    ISO text ('2025-03-01T14:05:00'); today's date is Organization.Today.

    Args:
        sql: one SELECT (or WITH ... SELECT) statement
    """
    db = _db(episode)
    columns, rows, truncated = db.read(sql)
    cut = db.max_chars  # a longer value could not be shown whole anyway
    out: dict[str, Any] = {}
    if truncated:  # first, so it survives when the output is cut to the tool-output cap
        out["truncated"] = True
        out["note"] = (f"only the first {len(rows)} rows are shown (at most {db.max_rows} rows and "
                       f"{db.max_chars} characters); aggregate or add LIMIT/WHERE to see the rest")
    out["columns"] = columns
    out["rows"] = [[v[:cut] + "...[cut]" if isinstance(v, str) and len(v) > cut else _jsonable(v) for v in r]
                   for r in rows]
    return json.dumps(out, ensure_ascii=False, default=str)


def _tables(db: EpisodeDB) -> list[str]:
    return [r[0] for r in db.con.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
        "AND name NOT LIKE '%_fts%' ORDER BY name")]


def _columns(db: EpisodeDB, table: str) -> list[str]:
    keys = {r[3]: f"{r[2]}.{r[4]}" for r in db.con.execute(f'PRAGMA foreign_key_list("{table}")')}
    cols = []
    for _, name, kind, notnull, _, pk in db.con.execute(f'PRAGMA table_info("{table}")'):
        text = f"{name} {kind or 'ANY'}"
        if pk:
            text += " PRIMARY KEY"
        if name in keys:
            text += f" -> {keys[name]}"
        cols.append(text)
    return cols


@tool(inline=True)
@safe_from_query_bounds
def describe_schema(episode) -> str:
    """List every table (Salesforce object) with its columns and foreign keys."""
    db = _db(episode)
    lines = [f"{t}({', '.join(_columns(db, t))})" for t in _tables(db)]
    lines.append('Quote "Case" and "Order" in SQL. Full-text search over Knowledge__kav: search_knowledge.')
    return "\n".join(lines)


@tool(inline=True)
@safe_from_query_bounds
def describe_object(name: str, episode) -> str:
    """Describe one table: its columns and foreign keys, its row count and one sample row.

    Args:
        name: the object's name, e.g. "Case" or "CaseHistory__c"
    """
    db = _db(episode)
    tables = _tables(db)
    real = next((t for t in tables if t.lower() == name.strip().strip('"').lower()), None)
    if real is None:
        raise ToolError(f"no object named {name!r}; the objects are {', '.join(tables)}")
    count = db.con.execute(f'SELECT COUNT(*) FROM "{real}"').fetchone()[0]
    sample = db.row(f'SELECT * FROM "{real}" LIMIT 1')
    return json.dumps({"object": real, "columns": _columns(db, real), "rows": count, "sample": sample},
                      ensure_ascii=False, default=str)


def _key(value: str) -> str:
    """A look-up key as the model wrote it, stripped. A lone surrogate (JSON's ``"\\ud800"``)
    is no text SQLite can take, so no Id has one: it becomes ``?`` and the look-up finds nothing
    (was: the tool failed with a UnicodeEncodeError)."""
    return value.strip().encode("utf-8", "replace").decode("utf-8")


def _find_case(db: EpisodeDB, case_id: str) -> dict[str, Any]:
    key = _key(case_id)
    found = db.row('SELECT * FROM "Case" WHERE Id = ? OR CaseNumber = ?', (key, key))
    if found is None:
        raise ToolError(f"no Case with Id or CaseNumber {case_id!r}")
    return found


@tool(inline=True)
@safe_from_query_bounds
def get_case(case_id: str, episode) -> str:
    """Get a case with its history (creation, owner changes, closing) and its emails.

    Args:
        case_id: the case's 18-character Id or its CaseNumber
    """
    db = _db(episode)
    case = _find_case(db, case_id)
    case["history"] = db.rows("SELECT Field__c, OldValue__c, NewValue__c, CreatedDate FROM CaseHistory__c "
                              "WHERE CaseId__c = ? ORDER BY CreatedDate, Id", (case["Id"],))
    case["emails"] = db.rows("SELECT Id, Subject, FromAddress, ToAddress, Incoming, MessageDate FROM EmailMessage "
                             "WHERE ParentId = ? ORDER BY MessageDate", (case["Id"],))
    return json.dumps(case, ensure_ascii=False)


def fts_query(text: str) -> str:
    """Free text -> an FTS5 query that never has syntax errors: its words, OR-ed, quoted."""
    words = re.findall(r"\w+", text.lower())
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


@tool(inline=True)
@safe_from_query_bounds
def search_knowledge(query: str, episode, limit: int = 5) -> str:  # noqa: A002 - the model-facing name
    """Full-text search of the knowledge base (Knowledge__kav articles, ranked by relevance).

    Args:
        query: words to look for, e.g. "warranty robot vacuums"
        limit: how many articles to return (1-20)
    """
    if not 1 <= limit <= 20:
        raise ToolError(f"limit must be from 1 to 20, got {limit}")
    match = fts_query(query)
    if not match:
        raise ToolError("query has no words to search for")
    db = _db(episode)
    found = db.rows(
        "SELECT k.Id, k.ArticleNumber, k.Title, k.Summary, k.FAQ_Answer__c, k.Category__c, k.IssueId__c, "
        "k.Resolution__c FROM Knowledge__kav_fts f JOIN Knowledge__kav k ON k.rowid = f.rowid "
        "WHERE Knowledge__kav_fts MATCH ? ORDER BY bm25(Knowledge__kav_fts) LIMIT ?", (match, limit))
    return json.dumps(found, ensure_ascii=False) if found else f"no articles match {query!r}"


@tool(inline=True)
@safe_from_query_bounds
def get_order_history(contact_id: str, episode) -> str:
    """A contact's orders, newest first, each with its items (product, category, quantity, price).

    Args:
        contact_id: the contact's 18-character Id
    """
    db = _db(episode)
    if db.row("SELECT Id FROM Contact WHERE Id = ?", (_key(contact_id),)) is None:
        raise ToolError(f"no Contact with Id {contact_id!r}")
    orders = db.rows('SELECT Id, OrderNumber, EffectiveDate, Status FROM "Order" WHERE BillToContactId = ? '
                     "ORDER BY EffectiveDate DESC, Id", (_key(contact_id),))
    for order in orders:
        order["items"] = db.rows(
            "SELECT i.Id, i.Product2Id, p.Name AS Product, c.Name AS Category, i.Quantity, i.UnitPrice "
            "FROM OrderItem i JOIN Product2 p ON p.Id = i.Product2Id "
            "LEFT JOIN ProductCategory c ON c.Id = p.ProductCategoryId WHERE i.OrderId = ? ORDER BY i.Id",
            (order["Id"],))
    return json.dumps(orders, ensure_ascii=False)


@tool(inline=True)
@safe_from_query_bounds
def get_live_chat_transcript(case_id: str, episode) -> str:
    """The live-chat transcripts of a case (who, when, and the conversation).

    Args:
        case_id: the case's Id or CaseNumber
    """
    db = _db(episode)
    case = _find_case(db, case_id)
    chats = db.rows("SELECT Id, OwnerId, ContactId, Status, StartTime, EndTime, Body FROM LiveChatTranscript "
                    "WHERE CaseId = ? ORDER BY StartTime", (case["Id"],))
    return json.dumps(chats, ensure_ascii=False) if chats else f"case {case['CaseNumber']} has no live-chat transcript"


@tool(inline=True)
@safe_from_query_bounds
def update_case(case_id: str, episode, status: str | None = None, owner_id: str | None = None,
                priority: str | None = None, resolution: str | None = None) -> str:
    """Update a case's status, owner, priority or resolution; each change is logged in CaseHistory__c.

    Args:
        case_id: the case's Id or CaseNumber
        status: New, Working, Escalated or Closed (closing needs a resolution)
        owner_id: the Id of an active User to own the case
        priority: Low, Medium or High
        resolution: Replacement sent, Refund issued, Troubleshooting resolved, Repair scheduled or No fault found
    """
    db = _db(episode)
    case = _find_case(db, case_id)
    if status is None and owner_id is None and priority is None and resolution is None:
        raise ToolError("nothing to update: give status, owner_id, priority or resolution")
    if status is not None and status not in CASE_STATUSES:
        raise ToolError(f"status must be one of {', '.join(CASE_STATUSES)}; got {status!r}")
    if priority is not None and priority not in CASE_PRIORITIES:
        raise ToolError(f"priority must be one of {', '.join(CASE_PRIORITIES)}; got {priority!r}")
    if resolution is not None and resolution not in RESOLUTIONS:
        raise ToolError(f"resolution must be one of {', '.join(RESOLUTIONS)}; got {resolution!r}")
    if owner_id is not None:
        user = db.row("SELECT Id, IsActive FROM User WHERE Id = ?", (_key(owner_id),))
        if user is None or not user["IsActive"]:
            raise ToolError(f"no active User with Id {owner_id!r}")
        owner_id = user["Id"]
    if status == "Closed" and not (resolution or case["Resolution__c"]):
        raise ToolError("closing a case needs a resolution")
    changes = {"Status": status, "OwnerId": owner_id, "Priority": priority, "Resolution__c": resolution}
    changes = {k: v for k, v in changes.items() if v is not None and v != case[k]}
    if not changes:
        return f"case {case['CaseNumber']} already has these values; nothing changed"
    _write_case(db, case, changes)
    shown = {k: v for k, v in changes.items() if k != "ClosedDate"}
    return f"case {case['CaseNumber']} updated: " + ", ".join(f"{k} = {v}" for k, v in shown.items())


_HISTORY_FIELDS = {"Status": "Status", "OwnerId": "Owner Assignment", "Priority": "Priority", "Resolution__c": "Resolution"}


def _write_case(db: EpisodeDB, case: dict[str, Any], changes: dict[str, Any],
                extra_history: tuple[tuple[str, Any, Any], ...] = ()) -> None:
    """Apply ``changes`` to ``case`` and log each (and ``extra_history``: ``(field, old, new)``
    rows) in CaseHistory__c, in one transaction; the rows written count as the tools' own."""
    now = (db.today or time.strftime("%Y-%m-%d")) + "T12:00:00"
    if "Status" in changes:
        changes["ClosedDate"] = now if changes["Status"] == "Closed" else None
    history = [(name, case[k], changes[k]) for k, name in _HISTORY_FIELDS.items() if k in changes]
    count = db.con.execute("SELECT COUNT(*) FROM CaseHistory__c").fetchone()[0]
    written_before = db.con.total_changes
    with db.con:  # one transaction: all of it or nothing
        db.con.execute("BEGIN")
        db.con.execute(f'UPDATE "Case" SET {", ".join(f"{k} = ?" for k in changes)} WHERE Id = ?',
                       (*changes.values(), case["Id"]))
        for field, old, new in (*history, *extra_history):
            count += 1
            db.con.execute("INSERT INTO CaseHistory__c VALUES (?, ?, ?, ?, ?, ?)",
                           (sf_id("CaseHistory__c", 10**9 + count), case["Id"], field, old, new, now))
    db.touched.add(case["Id"])
    db.tool_changes += db.con.total_changes - written_before


@tool(inline=True)
@safe_from_query_bounds
def issue_refund(case_id: str, amount: float, episode) -> str:
    """Refund the customer for the order item of a case and close the case with the resolution
    'Refund issued'; the refund is logged in CaseHistory__c (Field__c 'Refund', NewValue__c the amount).
    Whether a refund is allowed is the service policy's call, not this tool's.

    Args:
        case_id: the case's Id or CaseNumber
        amount: the amount to refund, more than 0 and at most the item's UnitPrice times Quantity
    """
    db = _db(episode)
    case = _find_case(db, case_id)
    if case["Status"] == "Closed":
        raise ToolError(f"case {case['CaseNumber']} is closed; a refund needs an open case")
    if db.row("SELECT Id FROM CaseHistory__c WHERE CaseId__c = ? AND Field__c = 'Refund'", (case["Id"],)):
        raise ToolError(f"case {case['CaseNumber']} was already refunded")
    item = db.row("SELECT ROUND(UnitPrice * Quantity, 2) AS total FROM OrderItem WHERE Id = ?",
                  (case["OrderItemId__c"],))
    if item is None or item["total"] is None:
        raise ToolError(f"case {case['CaseNumber']} has no order item to refund")
    # (checked as it is logged, in cents: 0.004 passed as more than 0, then was a refund of 0.00)
    if not (isinstance(amount, (int, float)) and 0 < round(amount, 2) <= item["total"]):
        raise ToolError(f"amount must be more than 0 and at most {item['total']:.2f} (the item's price), got {amount!r}")
    refund = f"{round(float(amount), 2):.2f}"
    _write_case(db, case, {"Status": "Closed", "Resolution__c": "Refund issued"}, (("Refund", None, refund),))
    return f"refunded {refund} on case {case['CaseNumber']}; the case is closed with the resolution 'Refund issued'"


TOOLS = (query, describe_schema, describe_object, get_case, search_knowledge, get_order_history,
         get_live_chat_transcript, update_case)
SERVICE_TOOLS = (*TOOLS, issue_refund)  # CRM-Service-v0: a customer's request may need a refund
