"""SQLite's process-wide heap limit, shared by every episode of the process.

CRM's ``query`` runs model-written SQL whose temporary storage (a sort, a DISTINCT) stays in
memory, bounded by SQLite's hard heap limit while it runs (:data:`QUERY_MEMORY_BYTES` over the
heap in use). SQLite has no per-connection bound, so near that limit any SQLite allocation in the
process fails: another episode's look-up, a Wikipedia corpus search, a grader. Such work goes
through :func:`outside_query_bounds` (or the decorators :func:`safe_from_query_bounds` and
:func:`safe_grading`), which runs it once more with no query's bound in force; it is never charged
to its own episode's model.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sqlite3
import threading

from benchmax_gym.core.outcomes import ENV_ERROR, RewardFailure
from benchmax_gym.core.tools import ToolFailure

QUERY_MEMORY_BYTES = 256 * 2**20
"""What SQLite's heap may grow by while one ``query`` runs (its temporary storage is in memory)."""


class _HeapBound:
    """SQLite's process-wide hard heap limit, held at the heap in use plus
    :data:`QUERY_MEMORY_BYTES` for each ``query`` running (queries may run in several threads),
    and put back as it was (with the soft limit, which setting the hard one lowers) when the last
    one ends. SQLite has no per-connection bound: this is the one that holds a sort in memory.

    Being the process's, the limit fails any SQLite allocation once the heap nears it: another
    episode's query, look-up or search, not only the query that grew. So a query that fails for
    memory while another's bound was in force runs again :meth:`alone` (no other query starts
    meanwhile: its second verdict is its own), and other SQLite work runs through
    :func:`outside_query_bounds`, which retries it alone the same way."""

    def __init__(self, used, hard, soft) -> None:
        self._used, self._hard, self._soft = used, hard, soft
        self._reset()
        os.register_at_fork(after_in_child=self._after_fork)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._started = 0  # queries bounded so far: a query that sees it change had company
        self._waiting = 0  # callers waiting to run alone: queries wait behind them (else they could wait forever)
        self._alone: int | None = None  # the thread running alone
        self._before = (0, 0)

    def enter(self) -> tuple[int, bool]:
        """Bound the heap for one more query; the ticket to give :meth:`exit`."""
        with self._cond:
            self._cond.wait_for(lambda: self._alone is None and not self._waiting)
            self._started += 1
            return self._started, self._bound()

    def exit(self, ticket: tuple[int, bool]) -> bool:
        """End a query's bound; whether another query's was in force during it."""
        with self._cond:
            self._unbound()
            return ticket[1] or ticket[0] != self._started

    def _bound(self) -> bool:
        """Raise the limit for one more query; whether another is running."""
        if not self._running:
            self._before = (self._hard(-1), self._soft(-1))
        self._running += 1
        bound = self._used() + QUERY_MEMORY_BYTES
        if self._running > 1:
            bound = max(bound, self._hard(-1))
        if self._before[0]:
            bound = min(bound, self._before[0])  # a lower limit set by the user stays
        self._hard(bound)
        return self._running > 1

    def _unbound(self) -> None:
        self._running -= 1
        if not self._running:
            self._restore()
            self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, query: bool = False):
        """Run with no query's bound in force but, for a ``query``, its own: waits for the running
        queries to end (their deadlines bound the wait) and holds new ones back until done."""
        me = threading.get_ident()
        with self._cond:
            if self._alone == me:  # (already alone: nested work)
                mine = False
            else:
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: self._alone is None and not self._running)
                finally:
                    self._waiting -= 1
                self._alone, mine = me, True
            if query:
                self._bound()
        try:
            yield
        finally:
            with self._cond:
                if query:
                    self._unbound()
                if mine:
                    self._alone = None
                    self._cond.notify_all()

    def _restore(self) -> None:
        self._hard(self._before[0])
        self._soft(self._before[1])

    def _after_fork(self) -> None:  # a query of another thread was running: its bound stays no more
        running, before = self._running, self._before
        self._reset()
        if running:
            self._before = before
            self._restore()


def _heap_bound() -> _HeapBound | None:
    """The heap bound over the SQLite library Python's ``sqlite3`` runs on, or None where that
    library does not export its memory functions (a static build)."""
    try:
        import _sqlite3

        lib = ctypes.CDLL(_sqlite3.__file__)  # (the loaded module: its SQLite is the one found)
        functions = lib.sqlite3_memory_used, lib.sqlite3_hard_heap_limit64, lib.sqlite3_soft_heap_limit64
        version = lib.sqlite3_libversion_number
    except (ImportError, OSError, AttributeError):
        return None
    version.restype = ctypes.c_int
    major, minor, patch = sqlite3.sqlite_version_info
    if version() != major * 1_000_000 + minor * 1000 + patch:
        return None
    used, hard, soft = functions
    used.argtypes, hard.argtypes, soft.argtypes = [], [ctypes.c_int64], [ctypes.c_int64]
    used.restype = hard.restype = soft.restype = ctypes.c_int64
    return _HeapBound(used, hard, soft)


HEAP = _heap_bound()
"""The bound over the SQLite library Python's ``sqlite3`` runs on; None where it cannot be set."""


def outside_query_bounds(work, *args, **kwargs):
    """``work(*args, **kwargs)``: SQLite work other than a ``query`` (a look-up, an update, a
    search, grading), safe from the queries' heap bound. That bound is the process's, so while a
    query nears it any SQLite allocation in the process fails: such work that fails for memory
    runs once more with no query's bound in force (the wait is bounded by the queries'
    deadlines). Should it fail again, the ``MemoryError`` is the process's own shortage."""
    try:
        return work(*args, **kwargs)
    except MemoryError:
        if HEAP is None:
            raise
    with HEAP.alone():
        return work(*args, **kwargs)


def _safe(failure):
    """A decorator running ``fn`` through :func:`outside_query_bounds`, a shortage of memory even
    so raised as ``failure()``: the environment's, never the model's error nor a 0."""
    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                return outside_query_bounds(fn, *args, **kwargs)
            except MemoryError:
                raise failure() from None
        return run
    return decorate


#: a tool's SQLite work other than a ``query`` (a look-up, an update, a search)
safe_from_query_bounds = _safe(lambda: ToolFailure("SQLite ran out of memory", ENV_ERROR))
#: a grader reading SQLite
safe_grading = _safe(lambda: RewardFailure("SQLite ran out of memory while grading", ENV_ERROR))
