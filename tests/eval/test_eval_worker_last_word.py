"""An eval worker whose last word (its run's end, or the error that stopped it) cannot reach
the parent.

The worker swallowed the failed send and exited 0; the parent said only "an eval worker exited
(status 0) without a word", and the worker's own error was nowhere. Now its gist goes to the
worker's stderr, it exits LAST_WORD_LOST, and the parent's error says what that status means.
"""

import subprocess
import sys

LAST_WORD_LOST = 75  # (benchmax_gym.core.aio.LAST_WORD_LOST: a status a supervisor may act on)

MUTED_SCRIPT = """
import os, socket, sys

from benchmax_gym.eval import evaluate


async def answer(obs, info):
    # ends this worker's side of its connection to the parent, as a send that fails does: the
    # record, then the worker's last word (the error that stopped it), cannot be written
    frame = sys._getframe()
    while frame.f_code.co_name != "_worker_main":
        frame = frame.f_back
    with socket.socket(fileno=os.dup(frame.f_locals["conn"].fileno())) as sock:
        sock.shutdown(socket.SHUT_WR)
    return "\\\\boxed{0}"


if __name__ == "__main__":
    try:
        evaluate("benchmax/Math-v0", answer, env_kwargs={"python_tool": False}, tasks=2, concurrency=2, workers=2)
    except RuntimeError as exc:
        print("RAISED", exc)
"""


def test_an_eval_worker_whose_last_word_cannot_be_sent_says_it_on_stderr_and_the_parent_says_why(tmp_path):
    script = tmp_path / "muted.py"
    script.write_text(MUTED_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    raised = out.stdout.splitlines()[-1]
    assert raised.startswith("RAISED an eval worker failed:"), out.stdout
    assert f"exited (status {LAST_WORD_LOST}): its last message could not be delivered; see its stderr" in raised
    lines = [line for line in out.stderr.splitlines() if "could not be delivered" in line]
    assert lines and all("failed" in line and "BrokenPipeError" in line for line in lines), out.stderr
