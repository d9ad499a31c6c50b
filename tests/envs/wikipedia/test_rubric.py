"""HotpotQA's official EM/F1 rules: SQuAD normalisation, yes/no handling, answer extraction."""

import pytest

from benchmax_gym.core.rubric import final_answer
from benchmax_gym.envs.wikipedia.rubric import em, exact_match, f1, f1_score, normalize_answer


@pytest.mark.parametrize(
    "text, normal",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple, a pear ", "apple pear"),
        ("Greenwich Village, New York City", "greenwich village new york city"),
        ("3,677 seated", "3677 seated"),
        ("Théâtre", "théâtre"),
        ("", ""),
    ],
)
def test_squad_normalisation(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match_and_f1():
    assert exact_match("the Chief of Protocol", "Chief of Protocol") == 1.0
    assert f1_score("Chief of Protocol", "Chief of Protocol") == 1.0
    assert f1_score("Greenwich Village", "Greenwich Village, New York City") == pytest.approx(2 * 1 * 0.4 / 1.4)
    assert f1_score("Paris", "London") == 0.0
    assert exact_match("Paris", "London") == 0.0


@pytest.mark.parametrize(
    "prediction, gold, score",
    [
        ("yes", "yes", 1.0),
        ("Yes.", "yes", 1.0),
        ("no", "yes", 0.0),
        ("yes", "no", 0.0),
        ("yes it is", "yes", 0.0),        # differs from the special gold: no partial credit
        ("no", "no answer here", 0.0),    # a special prediction that differs scores 0
        ("noanswer", "noanswer", 1.0),
    ],
)
def test_yes_no_rule(prediction, gold, score):
    assert f1_score(prediction, gold) == score


def test_answer_extraction():
    assert final_answer("I think <answer>1875</answer>.") == "1875"
    assert final_answer("<answer>a</answer> then <ANSWER> b </ANSWER>") == "b"
    assert final_answer("1875") is None
    assert final_answer("<answer>1875") is None
    assert final_answer(None) is None


def test_components_from_completions():
    assert em("<answer>The Vorsa Press</answer>", "Vorsa Press") == 1.0
    assert f1("<answer>Vorsa</answer>", "Vorsa Press") == pytest.approx(2 / 3)
    assert em("Vorsa Press", "Vorsa Press") == 0.0  # no tags, no answer
    assert f1("<answer>x</answer>", ["Vorsa Press", "x"]) == 1.0  # list of aliases: best one
    assert f1("<answer>" + "word " * 1000 + "</answer>", "word") == 0.0  # absurdly long answers score 0


@pytest.mark.parametrize("gold", ["The", "a", "An!", ["the", "Paris"]])
def test_an_empty_answer_never_scores_even_against_a_gold_of_only_articles(gold):
    for reply in ("<answer></answer>", "<answer> . </answer>", "<answer>-</answer>"):
        assert em(reply, gold) == 0.0 and f1(reply, gold) == 0.0, (reply, gold)
    assert em("<answer>Paris</answer>", ["the", "Paris"]) == 1.0


def test_a_gold_of_only_articles_is_graded_with_them():
    """HotpotQA's script normalises "The The" (the band) to nothing: the right answer scored 0
    here (and F1 0 there), while any wordless answer got EM 1 there."""
    assert em("<answer>The The</answer>", "The The") == 1.0 and f1("<answer>the the.</answer>", "The The") == 1.0
    assert em("<answer>The</answer>", "The The") == 0.0 and 0 < f1("<answer>The</answer>", "The The") < 1
    assert em("<answer>A</answer>", "a") == 1.0 and em("<answer>the</answer>", "A") == 0.0
    assert em("<answer>the Paris</answer>", "Paris") == 1.0  # elsewhere the articles still go


def test_a_numeric_gold_is_graded_as_its_text():
    assert em("<answer>1875</answer>", 1875) == 1.0
    assert f1("<answer>1875</answer>", 1875) == 1.0
    assert em("<answer>3.5</answer>", [3.5, "three and a half"]) == 1.0
