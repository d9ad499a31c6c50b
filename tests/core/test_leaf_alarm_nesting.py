"""A reward leaf may use SIGALRM itself (Math's check does; so may a user's grader): once it
gives the handler back with the timer off, the next leaf must still be cut at its deadline
(it ran unbounded: a backtracking regex on the model's text hung step())."""

import subprocess
import sys

LEAF_WITH_ITS_OWN_ALARM_THEN_A_REGEX_THAT_NEVER_ENDS = r"""
import re
import signal
from benchmax_gym.core import Rubric

def own_alarm(completion):
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 5)
        return 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

def backtracks(completion):
    return float(bool(re.match(r"(a+)+$", completion)))

rubric = Rubric([own_alarm, backtracks], timeout=0.5)
for _ in range(2):  # (the second pass finds the timer the first armed, taken again)
    reward, components, errors = rubric.score(completion="a" * 40 + "!")
    print(reward, components["own_alarm"], components["backtracks"], errors["backtracks"].split(":")[0])
"""


def test_a_leaf_after_one_that_used_sigalrm_itself_is_still_cut_at_its_deadline():
    done = subprocess.run([sys.executable, "-c", LEAF_WITH_ITS_OWN_ALARM_THEN_A_REGEX_THAT_NEVER_ENDS],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1.0", "1.0", "0.0", "reward_timeout"] * 2, done.stdout


SCORES_THEN_EXITS_SLOWLY = r"""
import time

class SlowTeardown:  # (a module global torn down after the interpreter resets SIGALRM's handler)
    def __del__(self):
        time.sleep(3)

slow = SlowTeardown()
from benchmax_gym.core import Rubric

print(Rubric([lambda completion: 1.0], timeout=1).score(completion="x")[0])
"""


def test_a_script_that_scored_and_exits_is_not_killed_by_the_leaf_timer():
    """The timer stays armed after a pass (armed once a period); at exit it ended the process."""
    done = subprocess.run([sys.executable, "-c", SCORES_THEN_EXITS_SLOWLY], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.split()) == (0, ["1.0"]), done.stderr[-2000:]


LEAF_WHOSE_FIRST_IMPORT_OUTLASTS_ITS_TIMEOUT = r"""
import pathlib
import sys

folder = sys.argv[1]
sys.path.insert(0, folder)
pathlib.Path(folder, "slow_grader.py").write_text(
    "import time\nend = time.monotonic() + 0.8\nwhile time.monotonic() < end:\n    pass\nREADY = 1.0\n")
from benchmax_gym.core import Rubric

def uses_a_slow_import(completion):
    import slow_grader
    return slow_grader.READY

rubric = Rubric([uses_a_slow_import], timeout=0.2)
rubric.score(completion="x")  # (its import outlasts the timeout: this pass may be cut just after it)
for _ in range(2):
    reward, components, errors = rubric.score(completion="x")
    print(reward, sorted(errors))
"""


def test_a_leaf_cut_during_its_first_import_grades_once_the_import_is_done(tmp_path):
    """The leaf timer never fires inside an import: a package half imported stays broken for the
    process (sympy did: every later Math answer 0), and a module cut each time is slow each time,
    so every later pass timed out too."""
    done = subprocess.run([sys.executable, "-c", LEAF_WHOSE_FIRST_IMPORT_OUTLASTS_ITS_TIMEOUT, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["1.0 []"] * 2, done.stdout
