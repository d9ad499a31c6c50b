"""Answers with an operator math-verify cannot read, which it reads as the last number of their
text (``7 ** 5``, ``7 // 5``, ``7 @ 5``, ``6 \\\\ 5``, ``7 === 5``: 5), score only where every
number around the operator agrees; and roots nested a few levels deep (``\\sqrt{\\sqrt{16}}``)
grade, while the bound on numbers too big to compute still holds under them."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmax_gym.envs.math.rubric import correct, is_equivalent

# each scored 1 against a gold of 5: math-verify read the 5 alone
JUNK = [
    "7 ** 5", "7 // 5", "7 @ 5", "7 @@ 5", "7 % 5", "7 %% 5", "7 \\% 5", "7 ^^ 5", "7 # 5", "7 ? 5", "7 ~ 5",
    "7 .. 5", "7 ... 5", "7 += 5", "7 *= 5", "7 /= 5", "7 :: 5", "7 ::= 5", "6 ?= 5",
    "6 \\\\ 5", "6 \\cr 5", "6 \\hline 5", "6 \\text{, } 5", "\\frac{6}{1} | 5", "\\sqrt{36} ** 5",
    "7 === 5", "7 =/= 5", "7 = = 5", "7 ==== 5",
]


@pytest.mark.parametrize("predicted", JUNK)
def test_a_number_before_an_unreadable_operator_scores_0(predicted):
    assert not is_equivalent("5", predicted)
    assert correct(f"So the answer is \\boxed{{{predicted}}}.", "5") == 0.0


@pytest.mark.parametrize("gold, predicted", [
    ("5", "x = 5;"), ("5", "# 5"), ("5", "5 \\text{ cm}^2"), ("5", "x_1 = 5"), ("5", "2 + 3 = 5"),
    ("2", "x^2 = 4 \\Rightarrow x = 2"), ("5", "x = 2 + 3 = 5"), ("5", "|-5|"), ("5", "\\left| -5 \\right|"),
    ("|{-5}|", "5"), ("\\left| -5 \\right|", "5"), ("\\left| -5 \\right|", "|-5|"), ("5", "12 \\equiv 5 \\pmod{7}"),
    ("\\frac{1}{2}", "1/2"), ("5000", "5{,}000"), ("\\{x \\mid x > 0\\}", "\\{x \\mid x > 0\\}"),
])
def test_truly_equal_forms_still_score_1(gold, predicted):
    assert is_equivalent(gold, predicted)
    assert correct(f"\\boxed{{{predicted}}}", gold) == 1.0


@pytest.mark.parametrize("gold, predicted", [
    ("2", "\\sqrt{\\sqrt{\\sqrt{\\sqrt{65536}}}}"), ("2", "\\sqrt{\\sqrt{\\sqrt{\\sqrt{\\sqrt{4294967296}}}}}"),
    ("2", "\\sqrt{" * 6 + "18446744073709551616" + "}" * 6), ("\\frac{1}{2}", "\\sqrt{\\sqrt{\\sqrt{\\sqrt{\\frac{1}{65536}}}}}"),
    ("2", "((65536^{1/2})^{1/2})^{1/4}"), ("3", "\\sqrt[3]{\\sqrt{729}}"),
])
def test_nested_roots_grade(gold, predicted):
    assert is_equivalent(gold, predicted)  # the first four were 0: each root counted as a power of 10
    assert not is_equivalent(gold + "+1", predicted)


@pytest.mark.parametrize("answer", [
    "\\sqrt{\\sqrt{\\sqrt{\\sqrt{9^{9^{9}}}}}}", "\\sqrt{\\sqrt{\\sqrt{\\sqrt{2^{2^{30}}}}}}",
    "\\sqrt{\\sqrt{2^{1000000}}}", "(7^{123456789})^{1/2}",
])
def test_a_root_of_a_number_too_big_to_compute_is_still_refused(answer):
    """Computing 9^{9^9} holds the GIL in one C call no timeout stops: a root over it must not
    let it through. Graded in a worker thread, whose check is abandoned at its timeout."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(is_equivalent, "3", answer, 0.5).result() is False
    left = [t for t in threading.enumerate() if t.name == "math-verify"]
    for thread in left:
        thread.join(1.0)
    running = [t for t in left if t.is_alive()]
    for thread in running:  # a hang guard only (on failure: let it finish so it does not slow the next tests)
        thread.join(60)
    assert not running
