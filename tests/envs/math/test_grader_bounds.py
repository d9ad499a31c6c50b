"""Math grading against answers written to make the check slow or to break it for later answers."""

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmax_gym.envs.math.rubric import is_equivalent


@pytest.mark.parametrize("answer", ["(" * 990 + "1", "[" * 990 + "1", "{(" * 495 + "1", "{" * 900 + "1" + "}" * 90])
def test_hundreds_of_unclosed_brackets_are_refused_within_the_timeout(answer):
    """math-verify's parser (pure Python) spent 8-10 s on them before its own timeout started
    (the huge-number check's parse ran unbounded), with a 1 s timeout, in the main thread."""
    assert threading.current_thread() is threading.main_thread()
    started = time.perf_counter()
    assert is_equivalent("5", answer, timeout=1.0) is False
    # a hang guard only (no timing in tests): a parse outside the timeout shows as 8-10 s here,
    # which this bound does not catch on its own
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("answer", [r"\prod_{k=1}^{10^{6}} k", r"\sum_{i=1}^{10^{7}} \frac{1}{i}",
                                    r"\prod_{k=1}^{1000000} k"])
def test_a_sum_or_product_of_a_million_terms_is_refused_before_sympy_computes_it(answer):
    """sympy computes 10^6! or the 10^7th harmonic number in C calls that hold the GIL for
    seconds: a worker thread's check came back at its timeout but its abandoned thread went on
    computing, slowing the next episodes. Now nothing is left running."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(is_equivalent, "5", answer, 0.5).result() is False
    left = [t for t in threading.enumerate() if t.name == "math-verify"]
    for thread in left:
        thread.join(1.0)
    running = [t for t in left if t.is_alive()]
    for thread in running:  # (on failure: let it finish so it does not slow the next tests)
        thread.join(60)
    assert not running


@pytest.mark.parametrize("gold, answer", [("55", r"\sum_{k=1}^{10} k"), ("3628800", r"\prod_{k=1}^{10} k"),
                                          (r"\frac{\pi^2}{6}", r"\sum_{n=1}^{\infty} \frac{1}{n^2}"),
                                          ("5", r"\left(\frac{\left(10\right)}{\left\{2\right\}}\right)")])
def test_small_sums_products_and_nesting_still_grade(gold, answer):
    assert is_equivalent(gold, answer, timeout=60)  # (sympy's infinite sum took over the default 5 s on a loaded machine)
    assert not is_equivalent(gold + "+1", answer)


FIRST_CALL_TIMES_OUT = r"""
from benchmax_gym.envs.math.rubric import is_equivalent
print(is_equivalent("5", r"x^{x^{x^{x^{x^{x^{x}}}}}}", timeout=0.01))  # before sympy is imported
print(is_equivalent("7", "3+4"), is_equivalent("55", r"\sum_{k=1}^{10} k"))
"""


def test_a_timeout_during_the_first_check_leaves_the_grader_working():
    """An alarm inside sympy's import left it half imported: every later answer scored 0."""
    done = subprocess.run([sys.executable, "-c", FIRST_CALL_TIMES_OUT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "True"], done.stdout
