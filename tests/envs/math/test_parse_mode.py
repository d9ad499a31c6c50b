"""The grader parses LaTeX answers with ANTLR's SLL prediction first and full LL only where SLL fails
(two-stage parsing, ``rubric._parse_sll_first``): faster, and every answer parses, fails and grades
exactly as with LL alone."""

import json
import re

import pytest
from antlr4.atn.ParserATNSimulator import ParserATNSimulator
from antlr4.atn.PredictionMode import PredictionMode
from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy, latex2sympy
from math_verify.parser import parse_latex_cached

from benchmax_gym.envs.math import rubric
from benchmax_gym.envs.math.rubric import is_equivalent


@pytest.fixture
def modes(monkeypatch):
    """The prediction mode of every decision the LaTeX parser makes; parse caches emptied first."""
    seen = []
    real = ParserATNSimulator.adaptivePredict

    def recording(self, *args):
        seen.append(self.predictionMode)
        return real(self, *args)

    monkeypatch.setattr(ParserATNSimulator, "adaptivePredict", recording)
    _clear_caches()
    return seen


def _clear_caches():
    parse_latex_cached.cache_clear()
    rubric._too_big.cache_clear()


def _ll_alone():
    """latex2sympy2_extended's own parser factory (LL), beneath the rubric's SLL-first one."""
    assert is_equivalent("\\frac{1}{2}", "0.5")  # (grading installs the rubric's, where it has one)
    return getattr(_Latex2Sympy.create_parser, "__wrapped__", _Latex2Sympy.create_parser)


def _outcome(text):
    try:
        return "parsed", repr(latex2sympy(text, normalization_config=None))
    except Exception as error:  # noqa: BLE001 - the failure and its message are compared
        return "failed", type(error).__name__, str(error)


def test_grading_parses_in_sll_mode(modes):
    """This tuple took LL ~150 ms to parse (20-40x SLL's): every decision was SLL."""
    assert is_equivalent("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})")
    assert modes and set(modes) == {PredictionMode.SLL}
    assert not is_equivalent("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{3})")


# syntax errors (in the parser, in the lexer: "#"), and "x^2", which SLL cannot parse and LL can
FALLBACKS = ["\\frac{1}{", "1 +* 2", "x^{2", "6 | 5", "(6=5)+0", "1 # 2", "3 \\cdot", "x^2", "p(n) = \\frac{n}{n^2 - 1}"]


@pytest.mark.parametrize("text", FALLBACKS)
def test_what_sll_cannot_parse_is_parsed_by_ll_with_its_result_or_error(text, modes, monkeypatch):
    ll_alone = _ll_alone()
    modes.clear()
    graded = _outcome(text)
    assert modes[0] == PredictionMode.SLL and PredictionMode.LL in modes  # SLL first, then LL from the start
    monkeypatch.setattr(_Latex2Sympy, "create_parser", ll_alone)
    assert graded == _outcome(text)  # the same sympy expression, or the same error and message


def test_math500_answers_grade_the_same_with_and_without_sll_first(shared_data, monkeypatch):
    """Each LaTeX gold (plain numbers never parse) against itself restated, its solution's boxed
    answer and a wrong variant (first digit changed, else "+1")."""
    records = [json.loads(line) for line in (shared_data / "math500" / "test_first100.jsonl").read_text().splitlines()]
    pairs = []
    for record in records:
        gold = record["answer"]
        if rubric._plain_number(gold) is not None:
            continue
        digit = re.search(r"\d", gold)
        wrong = gold + "+1" if digit is None else f"{gold[:digit.start()]}{(int(digit[0]) + 1) % 10}{gold[digit.end():]}"
        boxed = rubric._boxed_contents(record["solution"])[-1]
        pairs += [(gold, f"The answer is {gold}", True), (gold, boxed, True), (gold, wrong, False)]

    def grades():
        found = []
        for gold, predicted, _ in pairs:
            _clear_caches()
            found.append(is_equivalent(gold, predicted))
        return found

    ll_alone = _ll_alone()
    sll_first = grades()
    monkeypatch.setattr(_Latex2Sympy, "create_parser", ll_alone)
    assert sll_first == grades()
    assert len(pairs) > 90 and sll_first == [expected for _, _, expected in pairs]
