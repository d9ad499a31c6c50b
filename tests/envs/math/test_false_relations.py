"""Answers math-verify cannot read as LaTeX, which it reads as one number of their text (``6 | 5``,
``6 \\stackrel{?}{=} 5``, ``(6=5)+0``: 5), and answers with a modulus after them (``5 \\pmod{7}``):
a constant that differs from the number read is one candidate before another and scores 0; an
absolute value, a name, or a congruence that holds modulo the answer's modulus stands."""

import json

import pytest

from benchmax_gym.envs.math.rubric import correct, is_equivalent


@pytest.mark.parametrize("predicted", [
    "6 | 5", "6 \\vert 5", "6 \\| 5", "\\{6\\} | 5", "\\left(6\\right) | 5", "|6| | 5", "|-6| \\stackrel{?}{=} 5",
    "(6=5)+0", "6 \\stackrel{?}{=} 5", "6 \\overset{?}{=} 5", "6 \\stackrel{\\text{?}}{=} 5",
    "6 \\text{ (mod } 5)", "\\text{(mod} 5)", "(\\bmod 5)", "6 \\equiv 5 \\pmod{7}", "6 ≡ 5 \\pmod{7}",
])
def test_a_candidate_before_the_number_read_scores_0(predicted):
    assert not is_equivalent("5", predicted)  # was 1: math-verify read the 5 alone
    assert correct(f"So \\boxed{{{predicted}}}.", "5") == 0.0


@pytest.mark.parametrize("predicted", [
    "|-5|", "\\left|-5\\right|", "\\lvert -5 \\rvert", "|3-8|", "|-3| + 2", "|x| = 5", "|-5| = 5", "x = |-5|",
    "|-5| \\stackrel{?}{=} 5", "2 + 3 \\stackrel{?}{=} 5", "n | 5", "5 | 5", "x \\to 5", "n \\mid 5",
])
def test_an_absolute_value_a_name_or_a_true_relation_still_scores_1(predicted):
    assert is_equivalent("5", predicted)


@pytest.mark.parametrize("gold, predicted", [
    ("5", "5 \\pmod{7}"), ("5", "5\\pmod 7"), ("5", "5 \\text{ (mod } 7)"), ("5", "5 \\quad (\\bmod 7)"),
    ("5", "5 \\; (\\operatorname{mod} 7)"), ("5", "x \\equiv 5 \\pmod{7}"), ("5", "x \\equiv 5 \\ (\\text{mod}\\ 7)"),
    ("5", "12 \\equiv 5 \\pmod{7}"), ("5", "-2 \\equiv 5 \\pmod 7"), ("5", "12 \\equiv 5 \\mod 7"),
    ("5", "12 ≡ 5 \\pmod 7"),
    ("5 \\pmod{7}", "5"), ("5 \\pmod{7}", "5 \\pmod 7"),
])
def test_an_answer_with_its_modulus_scores_1(gold, predicted):
    assert is_equivalent(gold, predicted)  # most were 0: \pmod was read as letters, (mod 7) as 7
    assert correct(f"The residue is $\\boxed{{{predicted}}}$.", gold) == 1.0


@pytest.mark.parametrize("gold, predicted", [
    ("5", "6 \\pmod{7}"), ("5", "12 \\pmod{7}"), ("5", "x \\equiv 12 \\pmod 7"), ("5", "6 \\equiv 5 \\mod 7"),
    ("5", "6 \\text{ (mod } 7)"), ("5 \\pmod{7}", "5 \\pmod{8}"), ("5", "\\pmod{5}"),
])
def test_a_wrong_residue_or_modulus_scores_0(gold, predicted):
    """The least residue is the answer: ``12 \\pmod{7}`` is not 5 (a congruence that shows it is)."""
    assert not is_equivalent(gold, predicted)


def test_real_golds_after_a_differing_constant_score_0_and_with_a_modulus_1(shared_data):
    """GSM8K's gold G: ``G+1 | G``, ``G+1 \\stackrel{?}{=} G``, ``(G+1=G)+0``, ``G+1 \\text{ (mod } G)``
    score 0; ``|-G|``, ``G \\pmod{G+1}`` and ``2G+1 \\equiv G \\pmod{G+1}`` score 1."""
    from benchmax_gym.envs.math.datasets import gsm8k_gold

    lines = (shared_data / "gsm8k" / "train_sample500.jsonl").read_text().splitlines()[:20]
    golds = [gsm8k_gold(json.loads(line)["answer"]) for line in lines]
    for gold in [gold for gold in golds if gold.isdigit()]:
        other = int(gold) + 1
        for wrong in (f"{other} | {gold}", f"{other} \\stackrel{{?}}{{=}} {gold}", f"({other}={gold})+0",
                      f"{other} \\text{{ (mod }} {gold})"):
            assert correct(f"\\boxed{{{wrong}}}", gold) == 0.0, wrong
        congruence = f"{int(gold) + other} \\equiv {gold} \\pmod{{{other}}}"
        for right in (f"|-{gold}|", f"{gold} \\pmod{{{other}}}", congruence):
            assert correct(f"\\boxed{{{right}}}", gold) == 1.0, right
