"""Answers inside every length and structure bound that still took the grader seconds (simplify on
many terms, many integrals, a second parse), and a right value joined to junk by a connective
math-verify cannot read (``x \\vee 5``, read as 5)."""

import json

import pytest

from benchmax_gym.envs.math.rubric import correct, is_equivalent

# each took 1 s to the whole 5 s timeout, graded against these golds (2 cores)
SLOW = {
    "trig powers": ("p - q", r"\tan^5(8w) + \sec^3(4p) + \sec^4(9r) + \cot^4(7i) + \ln^4(8x) + \cos^2(1\theta)"),
    "functions of sums": ("\\frac{14}{3}", r"\sin(u+i) + \arcsin(z+w) + \cos(\beta-x_1) + \tan(q+r) + \cot(i+p) "
                                           r"+ \arcsin(k-e) + \cos(y-v) + \exp(e+v) + \sin(x_1+s) + \cot(r+v)"),
    "many names": ("\\cot x", "+".join("hvkwbnxdyrafpumgtzqsc" * 2) + r"+\theta+\gamma+\alpha+\beta"),
    "a pole in junk": ("\\frac{14}{3}", r"\cot(c+f) + \log(s-u) + \tan(u-x_1) + \ln(e-e) + \tan(\alpha+h) + \sin(q-h)"),
    "power of a sum": ("(x+y+z+1)^{20}", "(x+y+z+2)^{20}"),
}


@pytest.fixture
def simplified(monkeypatch):
    """Every difference math-verify hands to sympy's simplify, its costly last resort."""
    import math_verify.grader

    seen = []
    real = math_verify.grader.simplify

    def recording(expr, *args, **kwargs):
        seen.append(expr)
        return real(expr, *args, **kwargs)

    monkeypatch.setattr(math_verify.grader, "simplify", recording)
    return seen


@pytest.mark.parametrize("gold, answer", SLOW.values(), ids=SLOW.keys())
def test_an_answer_whose_value_differs_is_refused_without_simplify(gold, answer, simplified):
    assert is_equivalent(gold, answer, timeout=60) is False
    assert simplified == []  # was 1: its value at a point tells it apart at once


@pytest.mark.parametrize("gold, answer", [
    ("\\cot x", "\\frac{\\cos x}{\\sin x}"), ("x^5 - x^4 + x^3 - x^2 + x - 1", "\\frac{x^6 - 1}{x + 1}"),
    ("2k+2", "2(k+1)"), ("p - q", "-(q - p)"), ("\\frac{3\\sqrt{3}}{4}", "\\frac{3}{4}\\sqrt{3}"),
    ("1", "\\sin^2 x + \\cos^2 x"), ("x + 1", "\\frac{x^2 - 1}{x - 1}"), ("\\frac{1}{a b}", "\\frac{1}{a} \\cdot \\frac{1}{b}"),
    ("(x+y+z+1)^{2}", "(x+y+z)^2 + 2(x+y+z) + 1"), ("e^{x+y}", "e^x e^y"), ("\\sqrt{2} x", "\\sqrt{2x^2}"),
])
def test_equal_values_still_go_to_simplify_and_grade(gold, answer):
    """Equal everywhere: equal at the points, so simplify decides, as before (``\\sqrt{2x^2}`` is not
    ``\\sqrt{2} x`` for a negative x: equal at the points, simplify refuses it)."""
    assert is_equivalent(gold, answer, timeout=60) is (answer != "\\sqrt{2x^2}")
    assert not is_equivalent(gold, answer + " + 1", timeout=60)


@pytest.mark.parametrize("answer", [
    r"\int_0^1 x \, dx + \int_0^1 x \, dx + \int_0^1 x \, dx", r"\int x dx + \int x dx",
    r"\int_{0}^{1} x \, dx + \int_{0}^{1} x^{2} + 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11 + 12 \, dx",
    r"\iint x \, dx + \oint x",
])
def test_two_integrals_are_refused_before_the_parser_sees_them(answer, monkeypatch):
    """The parser's time grows about 4x an integral (8 took 11 s) and two with terms after them took
    1-4 s: refused unread, as too many bars or brackets are."""
    import math_verify

    monkeypatch.setattr(math_verify, "parse", lambda *a, **k: pytest.fail("parsed"))
    assert is_equivalent("5", answer) is False


@pytest.mark.parametrize("gold, answer", [("1", r"\int_0^1 2x \, dx"), ("\\frac{1}{2}", r"\int_{0}^{1} x \, dx")])
def test_one_integral_still_grades(gold, answer):
    assert is_equivalent(gold, answer, timeout=60)
    assert not is_equivalent(gold + "+1", answer, timeout=60)


@pytest.fixture
def latex_parses(monkeypatch):
    """The texts latex2sympy parses (the huge-number check's parse and math-verify's)."""
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy

    seen, real = [], _Latex2Sympy.parse

    def recording(self, text, *args, **kwargs):
        seen.append(text)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(_Latex2Sympy, "parse", recording)
    return seen


@pytest.mark.parametrize("answer", [
    "b_{24} + y_{33} + z_{36} + x_{41} + x_{1} + y_{9} + b_{89} + z_{68} + x_{35} + b_{84} + a_{55} + x_{22}",
    r"\{8, e, i, 9, x, c, x_1, 5, w, v, \beta, 0, 18, 4, b, f, z, 20, 6, t, 128120487588397, 3, 14, k, 10\}",
    r"\frac{\sqrt{3}}{2} + \sin(\frac{\pi}{7}) \cdot 123456789012345678901234567890",
])
def test_an_answer_that_writes_its_numbers_out_is_parsed_once(answer, latex_parses):
    """No power, factorial, binomial or sum: its numbers are no longer than its text, so the
    huge-number check (a second parse, half the grading time of such an answer) is not needed."""
    from benchmax_gym.envs.math import rubric

    rubric._too_big.cache_clear()
    assert is_equivalent("p - q", answer) is False
    assert latex_parses.count(answer) == 1


@pytest.mark.parametrize("answer", [r"\sqrt{3^{10^{10}}}", r"\binom{3^{10^{10}}}{2}", "10^{10^{5}}", "9999!"])
def test_an_answer_that_can_grow_is_still_checked_for_huge_numbers(answer):
    assert is_equivalent("5", answer) is False


# -- a connective math-verify cannot read ------------------------------------------------------

CONNECTIVES = [r"\vee", r"\lor", r"\wedge", r"\land", r"\cup", r"\cap", r"\setminus", r"\oplus", r"\otimes",
               r"\odot", r"\sqcup", r"\bigvee", r"\&", "&", "∨", "∪", r"\text{ or }"]


@pytest.mark.parametrize("connective", CONNECTIVES)
def test_the_gold_joined_to_a_name_by_a_connective_scores_0(connective):
    for answer in (f"x {connective} 5", f"x {connective} x {connective} 5", f"y{connective}5"):
        assert not is_equivalent("5", answer), answer  # was 1: read as its last number, 5
        assert correct(f"So \\boxed{{{answer}}}.", "5") == 0.0


def test_real_golds_after_a_name_and_a_connective_score_0(shared_data):
    from benchmax_gym.envs.math.datasets import gsm8k_gold

    lines = (shared_data / "gsm8k" / "train_sample500.jsonl").read_text().splitlines()[:20]
    for gold in [gsm8k_gold(json.loads(line)["answer"]) for line in lines]:
        for connective in (r"\vee", r"\cup", r"\oplus"):
            assert correct(f"\\boxed{{n {connective} {gold}}}", gold) == 0.0, (gold, connective)
        assert correct(f"\\boxed{{n = {gold}}}", gold) == 1.0


@pytest.mark.parametrize("gold, answer", [
    (r"(-\infty, 3) \cup (5, \infty)", r"(-\infty,3)\cup(5,\infty)"),
    (r"(-\infty, 3) \cup (5, \infty)", r"\left(-\infty, 3\right) \cup \left(5, \infty\right)"),
    (r"(-\infty, -2) \cup (-2, \infty)", r"(-\infty, -2) \cup (-2, \infty)"),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}"),
    (r"\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}",
     r"\begin{pmatrix} -\frac{1}{3} \\ \frac{2}{3} \\ \frac{5}{3} \end{pmatrix}"),
])
def test_a_gold_with_that_shape_still_accepts_it(gold, answer):
    assert is_equivalent(gold, answer)
