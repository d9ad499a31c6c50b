"""Answer forms math-verify reads as their right side alone: a name before it stands (``x = 5``),
a constant that differs from it does not (``6 = 5``, ``6 \\vee 5``: one candidate before another)."""

import json

import pytest

from benchmax_gym.envs.math.rubric import correct, is_equivalent


@pytest.mark.parametrize("gold, predicted", [
    ("5", "x = 5"), ("5", "\\boxed{x=5}"), ("5", "a = 5"), ("5", "x_1 = 5"), ("5", "\\alpha = 5"),
    ("5", "f(2) = 5"), ("5", "2 + 3 = 5"), ("5", "10 - 5 = 5"), ("5", "5 = 5"), ("5", "y = 2x = 5"),
    ("\\frac{1}{2}", "p = \\frac{1}{2}"), ("x = 5", "5"), ("5", "x \\to 5"), ("5", "x \\in \\{5\\}"),
    ("[3, 5]", "x \\in [3, 5]"), ("5", "n \\mid 5"), ("\\frac{1}{2}", "\\frac{2}{4} = \\frac{1}{2}"),
])
def test_an_answer_after_a_name_or_a_true_equation_scores_1(gold, predicted):
    assert is_equivalent(gold, predicted)


@pytest.mark.parametrize("gold, predicted", [
    ("5", "6 = 5"), ("5", "6=5"), ("5", "x = 6 = 5"), ("5", "6 = x = 5"), ("5", "\\frac{5}{6} = 5"),
    ("\\frac{1}{2}", "1 = \\frac{1}{2}"), ("5", "7 \\equiv 5"),
    # one candidate, a connective, another: math-verify read the last alone
    ("5", "6 \\vee 5"), ("5", "6 \\lor 4 \\lor 5"), ("5", "6 \\wedge 5"), ("5", "6 \\to 5"), ("5", "6 \\Rightarrow 5"),
    ("5", "6 \\implies 5"), ("5", "6 \\iff 5"), ("5", "6 := 5"), ("5", "6 \\therefore 5"), ("5", "6 \\in 5"),
    ("5", "6 \\setminus 5"), ("5", "6 \\mapsto 5"), ("5", "6 \\mid 5"), ("5", "6 \\bmod 5"),
])
def test_a_false_equation_or_a_candidate_before_the_answer_scores_0(gold, predicted):
    assert not is_equivalent(gold, predicted)  # was 1: the right side alone was read
    assert correct(f"So \\boxed{{{predicted}}}.", gold) == 0.0


def test_real_golds_as_a_false_equation_score_0_and_after_a_name_1(shared_data):
    """GSM8K's gold G: ``x = G`` scores 1, ``G + 1 = G`` and ``G + 1 \\vee G`` score 0."""
    from benchmax_gym.envs.math.datasets import gsm8k_gold

    lines = (shared_data / "gsm8k" / "train_sample500.jsonl").read_text().splitlines()[:25]
    golds = [gsm8k_gold(json.loads(line)["answer"]) for line in lines]
    for gold in golds:
        wrong = int(float(gold)) + 1
        assert correct(f"\\boxed{{x = {gold}}}", gold) == 1.0, gold
        assert correct(f"\\boxed{{{wrong} = {gold}}}", gold) == 0.0, gold
        assert correct(f"\\boxed{{{wrong} \\vee {gold}}}", gold) == 0.0, gold
