"""Math's own SIGALRM deadline must hand the caller's timer back armed: the rubric bounds every
leaf on that timer, and a check that left it off let a later leaf in the same pass run unbounded
(a backtracking regex on the model's text hung step())."""

import signal
import subprocess
import sys

import pytest

from benchmax_gym.envs.math.rubric import is_equivalent

MATH_THEN_A_REGEX_THAT_NEVER_ENDS = r"""
import re
from benchmax_gym.core import Rubric
from benchmax_gym.envs.math.rubric import correct

REPLY, GOLD = "\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"
correct(REPLY, GOLD)  # (imports done, parses cached: the check in the rubric is quick)

def math(completion, answer):
    return correct(completion, answer)

def backtracks(completion):
    return float(bool(re.match(r"(a+)+$", "a" * 40 + "!")))

reward, components, errors = Rubric([math, backtracks], timeout=0.5).score(completion=REPLY, answer=GOLD)
print(reward, components["math"], components["backtracks"], errors["backtracks"].split(":")[0])
"""


def test_a_leaf_after_the_math_check_is_still_cut_at_its_deadline():
    done = subprocess.run([sys.executable, "-c", MATH_THEN_A_REGEX_THAT_NEVER_ENDS], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1.0", "1.0", "0.0", "reward_timeout"], done.stdout


def _own_alarm(seconds):
    """Arms the caller's timer with a handler of its own; returns what fired and the handler."""
    fired = []

    def handler(signum, frame):
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return fired, handler, previous


@pytest.mark.timeout(120, method="thread")  # (SIGALRM free: pytest-timeout's signal method takes it)
def test_the_callers_timer_and_handler_are_given_back_with_the_time_they_had_left():
    fired, handler, previous = _own_alarm(30)
    try:
        assert is_equivalent("\\frac{1}{2}", "\\frac{2}{4}")  # (through math-verify, under its own alarm)
        assert signal.getsignal(signal.SIGALRM) is handler
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        assert fired == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

