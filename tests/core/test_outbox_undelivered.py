"""A worker's Outbox whose last flush cannot write everything (the parent is not reading, or is
gone).

The flush wrote part of a frame, swallowed the timeout and said nothing: the worker went on as if
it was sent, and its next message on the same connection (the outbox's socket is a dup of it: one
open file) filled the torn frame with its own bytes, which the parent read as a message.
"""

import asyncio
import multiprocessing
import threading

import pytest

from benchmax_gym.core.aio import Outbox


def _outbox_with_a_message_waiting(conn, size: int) -> Outbox:
    """An outbox whose message is bigger than the socket holds: the rest waits in it."""
    async def play():
        outbox = Outbox(conn, asyncio.get_running_loop())
        outbox.send_bytes(b"r" * size)
        return outbox

    outbox = asyncio.run(play())
    assert outbox.left
    return outbox


def test_a_flush_the_parent_does_not_read_in_time_says_so_and_the_parent_never_reads_a_torn_frame():
    """The parent, reading at last, sees the worker's stream end, not a message made of two."""
    parent, child = multiprocessing.Pipe()
    outbox = _outbox_with_a_message_waiting(child, 2_000_000)
    failed = None
    try:
        outbox.flush(timeout=0.2)  # (nobody reads: it cannot finish)
    except OSError as exc:
        failed = exc

    sent = []

    def last_word():  # the worker's next message on the connection, bigger than the torn frame lacks
        try:
            child.send_bytes(b"w" * 4_000_000)
            sent.append("sent")
        except OSError as exc:
            sent.append(exc)

    sender = threading.Thread(target=last_word, daemon=True)
    sender.start()
    try:
        try:
            got = parent.recv_bytes()
        except (EOFError, OSError) as exc:  # (the stream's end, mid-message: the worker ended)
            got = exc
        assert not isinstance(got, bytes), (
            f"the parent read a {len(got)}-byte message that was never sent "
            f"({got.count(b'r')} bytes of one message, {got.count(b'w')} of the next)")
        assert isinstance(failed, OSError), "the flush said nothing of what it could not write"
        assert "could not be written" in str(failed)
        sender.join(60)
        assert len(sent) == 1 and isinstance(sent[0], BrokenPipeError), sent  # (not sent as if whole)
    finally:
        parent.close()
        sender.join(60)
        child.close()


def test_a_flush_to_a_parent_that_is_gone_says_so():
    parent, child = multiprocessing.Pipe()
    outbox = _outbox_with_a_message_waiting(child, 2_000_000)
    parent.close()
    with pytest.raises(OSError, match="could not be written"):
        outbox.flush(timeout=60)
    child.close()


def test_a_flush_the_parent_reads_raises_nothing():
    """(The common case: what waited goes out whole.)"""
    parent, child = multiprocessing.Pipe()
    outbox = _outbox_with_a_message_waiting(child, 2_000_000)
    read = []
    reader = threading.Thread(target=lambda: read.append(parent.recv_bytes()), daemon=True)
    reader.start()
    outbox.flush(timeout=60)
    reader.join(60)
    assert read == [b"r" * 2_000_000]
    child.send_bytes(b"last word")  # the connection is still the worker's to use
    assert parent.recv_bytes() == b"last word"
    parent.close()
    child.close()
