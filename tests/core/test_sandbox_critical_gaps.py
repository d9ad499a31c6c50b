"""A sandbox close the garbage collector runs in a thread at the edges of a sandbox lock.

The collector runs finalizers (a dropped sandbox's close, a dropped pool lease) in whichever
thread allocates; ``_critical`` keeps such a close for when the thread lets go of its locks. A
collection just after the lock was taken (before the thread was marked as holding it) or just
before it was let go (after the mark was put back) ran the close there, which took the same lock
and waited for itself for ever; and closes kept while a body that raised held the lock were lost
(a workspace, a pool lease never let go).
"""

import gc
import threading
import weakref

import pytest

from benchmax_gym.core.sandbox import _critical, _when_free


class _EdgeLock:
    """A real lock that runs ``hook`` at one edge of holding it: just after taking it
    (``"taken"``) or just before letting it go (``"letting go"``), where a collection may fall."""

    def __init__(self, edge: str):
        self.lock, self.edge, self.hook = threading.Lock(), edge, None

    def __enter__(self):
        self.lock.acquire()
        if self.edge == "taken" and self.hook:
            self.hook()
        return self

    def __exit__(self, *exc):
        if self.edge == "letting go" and self.hook:
            self.hook()
        self.lock.release()


def _in_a_thread(body) -> None:
    """``body()`` in a thread of its own (its own ``_critical`` state); its error raised here;
    a thread that waits for itself fails the test after 60 s rather than hanging it."""
    errors = []

    def run():
        try:
            body()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "a close the collector ran took the lock its own thread held"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("edge", ["taken", "letting go"])
def test_a_close_the_collector_runs_at_a_locks_edge_waits_until_it_is_let_go(edge):
    """As Sandbox.close does: kept while the thread holds a sandbox lock, else taking it."""
    lock, closed = _EdgeLock(edge), []

    def close():
        if _when_free(close):
            return
        with _critical(lock):
            closed.append("closed")

    def collect():  # a sandbox dropped in a reference cycle, freed by the collector right here
        lock.hook = None
        dropped = type("Sandbox", (), {})()
        dropped.cycle = dropped
        weakref.finalize(dropped, close)
        del dropped
        gc.collect()

    def body():
        lock.hook = collect
        with _critical(lock):
            pass
        assert closed == ["closed"]  # run once the lock was let go, in this thread

    _in_a_thread(body)


def test_closes_kept_while_a_body_that_raised_held_the_lock_still_run():
    """The body's error goes on to its caller; the closes it met run as the lock is let go."""
    ran = []

    def body():
        with pytest.raises(ValueError, match="the body's own"):
            with _critical(threading.Lock()):
                with _critical(threading.Lock()):  # (an inner lock: kept until the outermost goes)
                    assert _when_free(lambda: ran.append("workspace removed"))
                    raise ValueError("the body's own error")
        assert ran == ["workspace removed"]

    _in_a_thread(body)


def test_a_kept_close_that_fails_does_not_stop_the_others_nor_hide_the_bodys_error(caplog):
    """One failing close is logged; the next still runs, and the caller sees its own error."""
    ran = []

    def failing():
        raise OSError("the workspace could not be removed")

    def body():
        with pytest.raises(KeyError):
            with _critical(threading.Lock()):
                _when_free(failing)
                _when_free(lambda: ran.append("lease let go"))
                raise KeyError("the body's own")
        assert ran == ["lease let go"]

    _in_a_thread(body)
    assert "the workspace could not be removed" in caplog.text
