"""Grading answers the way HotpotQA's official evaluation script does.

The answer is the last ``<answer>...</answer>`` of the final reply, the rule every family shares
(:func:`~benchmax_gym.core.rubric.final_answer`; no tags, no answer, score 0). Both it and
the gold are normalised as in SQuAD (lower-case, punctuation and the articles a/an/the removed,
white space collapsed); ``em`` is equality, ``f1`` the token-overlap F1, except that when either
side is ``yes``, ``no`` or ``noanswer`` and they differ F1 is 0 (so "no" never earns credit
against "yes, ..."). A gold given as a list of aliases scores the best of them. An answer with
no words scores 0 (HotpotQA's script gives ``<answer></answer>`` EM 1 against a gold such as "The"),
and a gold of only articles (the band "The The") keeps them on both sides: there the script scores
every wordless answer EM 1 and the right one F1 0.

Two more departures, for text the script was not written for. Both sides are NFKC-normalised and
lose Unicode punctuation as well as ASCII (the script kept "Arthur’s", "1939–1945", "“Paris”" and
a decomposed "é" apart from what they spell, scoring the right answer 0); accents stay, as there
("Zurich" is not "Zürich"), and so do numbers as written ("3" is not "three"). And where a task
records the ``options`` a comparison question chooses between (``task.solution["options"]``: the
generated comparison questions do), an answer that names an option that is not the gold scores 0:
"Khuyi Society or Skiamae Observatory" earned F1 0.57 against "Khuyi Society", more than a guess
(0.5) is worth, and the wrong "Thesind Society" earned 0.5 for the shared word.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

from benchmax_gym.core.rubric import RewardFn, Rubric, final_answer

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")
MAX_ANSWER_CHARS = 1_000


def normalize_answer(text: str, keep_articles: bool = False) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles (unless ``keep_articles``),
    collapse white space; NFKC first, and Unicode punctuation goes too."""
    text = unicodedata.normalize("NFKC", str(text)).lower().translate(_PUNCTUATION)
    if not text.isascii():  # Unicode punctuation too: curly quotes, dashes, "・", "«»"
        text = "".join(c for c in text if not unicodedata.category(c).startswith("P"))
    return " ".join((text if keep_articles else _ARTICLES.sub(" ", text)).split())


def _normalized(prediction: str, gold: str) -> tuple[str, str]:
    """Both normalised; with the articles kept where the gold is nothing else ("The The")."""
    keep = not normalize_answer(gold)
    return normalize_answer(prediction, keep), normalize_answer(gold, keep)


def exact_match(prediction: str, gold: str) -> float:
    pred, truth = _normalized(prediction, gold)
    return float(pred == truth)


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 with HotpotQA's rule for yes/no/noanswer."""
    pred, truth = _normalized(prediction, gold)
    if (pred in _SPECIAL or truth in _SPECIAL) and pred != truth:
        return 0.0
    pred_tokens, truth_tokens = pred.split(), truth.split()
    common = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def _golds(answer: str | Sequence[str]) -> list[str]:
    """The gold aliases; a lone number (a task list's ``answer=1875``) is its text."""
    if isinstance(answer, Sequence) and not isinstance(answer, (str, bytes)):
        return [str(a) for a in answer]
    return [str(answer)]


def _contains(tokens: list[str], part: list[str]) -> bool:
    return any(tokens[i:i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


def names_another_option(prediction: str, golds: Sequence[str], options: Sequence[str]) -> bool:
    """Whether ``prediction`` names one of a comparison question's ``options`` that no gold holds
    (a hedge, "A or B", or the wrong one): its words, in order, among the prediction's."""
    said = normalize_answer(prediction).split()
    gold_words = [normalize_answer(g).split() for g in golds]
    for option in options:
        words = normalize_answer(option).split()
        if words and not any(_contains(g, words) for g in gold_words) and _contains(said, words):
            return True
    return False


def _options(task) -> list[str]:
    solution = getattr(task, "solution", None)
    options = solution.get("options") if isinstance(solution, dict) else None
    return [str(o) for o in options] if isinstance(options, (list, tuple)) else []


def _best(metric, completion: str, answer, task=None) -> float:
    prediction = final_answer(completion)
    if prediction is None or len(prediction) > MAX_ANSWER_CHARS or not normalize_answer(prediction, True):
        return 0.0  # no answer; an empty one (or ".") is no answer either, whatever the gold
    golds = _golds(answer)
    if names_another_option(prediction, golds, _options(task)):
        return 0.0
    return max(metric(prediction, gold) for gold in golds)


def em(completion: str, answer, task=None) -> float:
    """Exact match of the tagged answer after normalisation."""
    return _best(exact_match, completion, answer, task)


def f1(completion: str, answer, task=None) -> float:
    """Token F1 of the tagged answer after normalisation (0 for an answer naming a wrong option)."""
    return _best(f1_score, completion, answer, task)


def wikipedia_rubric() -> Rubric:
    """``f1`` (weight 1) and ``em`` (weight 0, reported); reweight with ``reward_weights``."""
    return Rubric([RewardFn("f1", f1, 1.0), RewardFn("em", em, 0.0)])


# -- the dense signal (dense_rewards=True) ---------------------------------------------------


def supporting_opened(task, tool_calls: list, tool_results: list) -> tuple[list[str], int]:
    """Wikipedia's dense signal: the task's supporting articles (``task.solution["supporting"]``)
    that a ``get_article`` of this step opened (its result's heading names the article, so a
    failed call or a search listing the title reaches nothing). Each article pays once."""
    solution = task.solution if isinstance(task.solution, dict) else {}
    supporting = {str(t).casefold() for t in solution.get("supporting") or ()}
    reached = []
    for call, text in zip(tool_calls, tool_results):
        if call["name"] == "get_article" and isinstance(text, str) and text.startswith("# "):
            title = text[2:].split("\n", 1)[0].strip().casefold()
            if title in supporting:
                reached.append(title)
    return reached, len(supporting)
