"""Answer extraction and math-verify equivalence, in the main thread and in worker threads."""

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmax_gym.envs.math.rubric import extract_answer, is_equivalent, well_formed

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
MATH500 = DATA / "math500" / "test_first100.jsonl"
needs_data = pytest.mark.skipif(
    not DATA.is_dir(), reason=f"shared benchmark samples not found at {DATA}"
)

# -- extraction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("The answer is \\boxed{42}.", "42"),
        ("So $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),
        ("\\boxed {7}", "7"),
        ("\\fbox{8}", "8"),
        ("\\boxed{ $9$ }", "9"),
        ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}"),
        ("<answer>42</answer>", "42"),
        ("<ANSWER>\n  1,600 \n</Answer>", "1,600"),
        ("<answer>1</answer> ... <answer>2</answer>", "2"),
        ("<answer>so it is \\boxed{5}</answer>", "5"),
        ("\\boxed{3} and then <answer>4</answer>", "3"),
        ("\\boxed{1} then \\boxed{2", "1"),  # an unclosed box is not an answer
        ("\\boxed{}", ""),
        ("The answer is 42.", None),
        ("", None),
        ("<answer>unclosed", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is \\boxed{42}.", True),
        ("<answer>42</answer>", True),
        ("<answer>\\boxed{42}</answer>", True),
        ("\\boxed{1} \\boxed{2}", False),
        ("\\boxed{1} \\boxed{2", False),
        ("\\boxed{1} <answer>2</answer>", False),
        ("<answer>1</answer><answer>2</answer>", False),
        ("\\boxed{}", False),
        ("<answer>  </answer>", False),
        ("no answer at all", False),
    ],
)
def test_well_formed(text, expected):
    assert well_formed(text) is expected


def test_extraction_tolerates_non_strings():
    assert extract_answer(None) is None
    assert well_formed(None) is False


# -- equivalence -----------------------------------------------------------------------------

PAIRS = [
    ("18", "18.0", True),
    ("18", "18", True),
    ("1600", "1,600", True),
    ("2220", "2,220.00", True),
    ("-50", "-50", True),
    ("\\frac{14}{3}", "14/3", True),
    ("\\frac{14}{3}", "\\dfrac{14}{3}", True),
    ("\\frac{3}{2}", "1.5", True),
    ("1.25", "5/4", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, pi/2)", True),
    ("\\text{Evelyn}", "Evelyn", True),
    ("\\text{Evelyn}", "\\text{Evelyn}", True),
    ("3\\sqrt{13}", "3*sqrt(13)", True),
    ("3\\sqrt{13}", "\\sqrt{117}", True),
    ("\\pi", "pi", True),
    ("-\\frac{\\pi}{6}", "-\\pi/6", True),
    ("10{,}000", "10000", True),
    ("6 - 5i", "6-5i", True),
    ("p - q", "p-q", True),
    ("18", "19", False),
    ("-50", "50", False),
    ("1600", "160", False),
    ("\\frac{14}{3}", "4.6", False),
    ("\\frac{14}{3}", "3/14", False),
    ("\\text{Evelyn}", "Bob", False),
    ("7", "3, 5, 7", False),
    ("3,5,7", "357", False),  # a list is not a number with thousands separators
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)", False),
    ("18", "", False),
    ("", "", False),
]


@pytest.mark.parametrize("gold, predicted, expected", PAIRS)
def test_is_equivalent(gold, predicted, expected):
    assert is_equivalent(gold, predicted) is expected


def test_is_equivalent_from_worker_threads():
    """math-verify's signal timeout cannot run in threads; the fallback must agree with it."""
    assert threading.current_thread() is threading.main_thread()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda pair: is_equivalent(pair[0], pair[1]), PAIRS * 2))
    assert results == [expected for _, _, expected in PAIRS * 2]


def test_worker_thread_timeout_returns_false_on_time():
    # sympy needs ~3 s to tell these apart (a sum: no value check answers first); the caller must
    # get its answer after the timeout
    gold, predicted = "(x+y+z+1)^{12}", r"\sum_{k=0}^{12} \binom{12}{k} (x+y+z)^k"
    with ThreadPoolExecutor(max_workers=1) as pool:
        result = pool.submit(is_equivalent, gold, predicted, 0.3).result(timeout=60)  # (a hang guard)
        checking = [t for t in threading.enumerate() if t.name == "math-verify" and t.is_alive()]
    assert result is False
    assert checking  # answered while the check still runs: it did not wait for sympy
    # the abandoned check cannot be killed; let it finish so it does not slow the next tests
    for thread in checking:
        thread.join(60)


def test_no_timeout_warning_in_threads(monkeypatch, caplog):
    import math_verify.grader
    import math_verify.parser

    # math-verify warns once per process that its timeout is disabled; make it want to warn again
    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
    with caplog.at_level(logging.WARNING):
        with ThreadPoolExecutor(max_workers=1) as pool:
            assert pool.submit(is_equivalent, "\\frac{1}{7}", "1/7").result() is True
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


@pytest.mark.parametrize("bad", [None, 3, "\\frac{", "}}}{{{", "\\boxed{", "x" * 5000, "$$"])
def test_is_equivalent_never_raises(bad):
    assert is_equivalent("18", bad) in (True, False)
    assert is_equivalent(bad, "18") in (True, False)


@needs_data
def test_math500_gold_answers_match_themselves_and_their_solution_box():
    """Every MATH-500 gold in the sample is equivalent to itself and to the box in its solution."""
    from benchmax_gym.envs.math.rubric import extract_answer

    records = [json.loads(line) for line in MATH500.read_text().splitlines()]
    mismatches = []
    for r in records:
        boxed = extract_answer(r["solution"])
        if not (is_equivalent(r["answer"], r["answer"]) and is_equivalent(r["answer"], boxed)):
            mismatches.append((r["answer"], boxed))
    assert len(mismatches) <= 3, mismatches


# -- grading final replies through the environment: units, words, degrees, spacing ------------

RIGHT = [
    ("18", "\\boxed{18 dollars}"),
    ("18", "<answer>18 dollars</answer>"),
    ("18", "\\boxed{18 \\text{ dollars}}"),
    ("18", "<answer>The answer is 18</answer>"),
    ("18", "<answer>The answer is 18.</answer>"),
    ("18", "<answer>So the final answer is $18$.</answer>"),
    ("1600", "<answer>$1,600$ dollars</answer>"),
    ("5", "<answer>5 cm</answer>"),
    ("12", "\\boxed{12 square feet}"),
    ("\\frac{3}{2}", "<answer>3/2 cups</answer>"),
    ("90^\\circ", "\\boxed{90°}"),
    ("30", "\\boxed{30°}"),
    ("90^\\circ", "<answer>90 degrees</answer>"),
    ("6 - 5i", "\\boxed{6 - 5 i}"),
    ("-2 + 7i", "<answer>-2 + 7 i</answer>"),
    ("a+bi", "\\boxed{a + b i}"),
    ("2\\pi", "\\boxed{2\\pi \\text{ radians}}"),
]
WRONG = [
    ("180", "\\boxed{18 dollars}"),
    ("18", "\\boxed{180 dollars}"),
    ("18", "<answer>181 dollars</answer>"),
    ("3-4i", "\\boxed{3 + 4i}"),
    ("3-4i", "\\boxed{3 + 4 i}"),
    ("a+bi", "\\boxed{a - b i}"),
    ("90^\\circ", "\\boxed{9°}"),
    ("18", "<answer>18 is wrong, it is 19</answer>"),
    ("18", "<answer>The answer is not 18</answer>"),
    ("18", "<answer>18 is not the answer</answer>"),
    ("18", "<answer>18 dollars is wrong</answer>"),
    ("18", "<answer>18 or more</answer>"),
    ("18", "<answer>The answer is 18 or 19</answer>"),
    ("18", "<answer>Not 18 but 19</answer>"),
    ("18", "<answer>between 17 and 18</answer>"),
    ("18", "<answer>I think 17, not 18.</answer>"),
    ("18", "<answer>maybe 18</answer>"),
    ("18", "<answer>17 18 19</answer>"),
    ("18", "<answer>18 thousand</answer>"),
    ("5", "\\boxed{5 squared}"),
    ("3", "<answer>3 quarters</answer>"),
    ("18", "18 dollars"),  # no \boxed{} and no <answer>: no answer
    ("18", "The answer is 18"),
]


def _final_rewards(cases):
    """Each (gold, reply) played as a one-step episode of Math-v0; the rewards, in order."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401

    env = gym.make("benchmax/Math-v0", tasks=[{"prompt": "?", "answer": gold} for gold, _ in cases],
                   python_tool=False)
    rewards = []
    for i, (_, reply) in enumerate(cases):
        env.reset(seed=i, options={"task_index": i})
        _, _, terminated, _, info = env.step(reply)
        assert terminated
        rewards.append(info["reward_components"]["correct"])
    env.close()
    return rewards


def test_right_answers_in_words_units_degrees_and_spaced_complex_numbers_score_1():
    rewards = _final_rewards(RIGHT)
    assert [case for case, r in zip(RIGHT, rewards) if r != 1.0] == []


def test_wrong_answers_stay_at_0_whatever_words_surround_them():
    rewards = _final_rewards(WRONG)
    assert [case for case, r in zip(WRONG, rewards) if r != 0.0] == []


def _natural_forms(gold: str, gsm8k: bool) -> list[str]:
    forms = [f"\\boxed{{{gold}}}", f"<answer>{gold}</answer>", f"<answer>${gold}$</answer>",
             f"<answer>The answer is ${gold}$.</answer>", f"So the final answer is $\\boxed{{{gold}}}$."]
    if gsm8k:
        forms += [f"<answer>{gold} dollars</answer>", f"\\boxed{{\\${gold}}}", f"<answer>The answer is {gold}</answer>"]
        if "." not in gold and abs(int(gold)) >= 1000:
            forms.append(f"\\boxed{{{int(gold):,}}}")
    return forms


def test_every_benchmark_gold_grades_1_against_itself_in_its_natural_forms(shared_data):
    """No gold answer of the GSM8K and MATH-500 samples may fail against itself, however it is written."""
    from benchmax_gym.envs.math.rubric import correct
    from benchmax_gym.envs.math.datasets import gsm8k_gold

    math500 = [json.loads(x)["answer"] for x in (shared_data / "math500" / "test_first100.jsonl").read_text().splitlines()]
    gsm8k = [gsm8k_gold(json.loads(x)["answer"])
             for x in (shared_data / "gsm8k" / "train_sample500.jsonl").read_text().splitlines()]
    failures = [(gold, reply) for golds, is_gsm8k in ((math500, False), (gsm8k, True)) for gold in golds
                for reply in _natural_forms(gold, is_gsm8k) if correct(reply, gold) != 1.0]
    assert failures == []


# -- hedged, negated and percent forms of real gold answers -----------------------------------

def _real_golds(shared_data):
    from benchmax_gym.envs.math.datasets import gsm8k_gold

    math500 = [json.loads(x)["answer"] for x in (shared_data / "math500" / "test_first100.jsonl").read_text().splitlines()]
    gsm8k = [gsm8k_gold(json.loads(x)["answer"])
             for x in (shared_data / "gsm8k" / "train_sample500.jsonl").read_text().splitlines()]
    return math500, gsm8k


# each wraps the true answer G in a relation or a hedge: none of them states G
HEDGED = ["\\boxed{{\\neq {g}}}", "\\boxed{{\\ne {g}}}", "\\boxed{{\\ge {g}}}", "\\boxed{{\\geq {g}}}",
          "\\boxed{{\\le {g}}}", "\\boxed{{< {g}}}", "\\boxed{{\\approx {g}}}", "\\boxed{{\\pm {g}}}",
          "\\boxed{{{g} \\text{{ is wrong}}}}", "\\boxed{{{g}\\ \\text{{or more}}}}", "\\boxed{{{g} \\text{{ or less}}}}",
          "\\boxed{{\\text{{not }} {g}}}", "\\boxed{{\\text{{at least }} {g}}}", "\\boxed{{\\text{{maybe }} {g}}}",
          "<answer>$\\neq {g}$</answer>", "<answer>{g} \\text{{ is incorrect}}</answer>"]


def test_hedged_or_negated_true_answers_score_0(shared_data):
    """``\\neq G``, ``\\ge G``, ``G \\text{ is wrong}``... of every real gold G score 0 (math-verify alone gives 1)."""
    from benchmax_gym.envs.math.rubric import correct, hedges

    math500, gsm8k = _real_golds(shared_data)
    cases = [(gold, form.format(g=gold)) for gold in math500 + gsm8k for form in HEDGED
             if not hedges(form.format(g=gold)) <= hedges(gold)]  # skip a form the gold itself uses (1 \pm ...)
    assert len(cases) > 9000
    assert [(gold, reply) for gold, reply in cases if correct(reply, gold) != 0.0] == []


def test_a_difference_stated_in_words_is_no_hedge():
    # "how many more...": the answer may say so; "or more" and "more than" stay hedges
    assert is_equivalent("5", "5 \\text{ more}") and is_equivalent("5", "5\\text{ fewer apples}")
    assert not is_equivalent("5", "5 \\text{ or more}") and not is_equivalent("5", "\\text{more than } 5")


def test_a_gold_that_states_a_relation_still_matches_itself():
    for gold, reply in [("x \\neq 5", "\\boxed{x \\ne 5}"), ("1 \\pm \\sqrt{19}", "\\boxed{1 \\pm \\sqrt{19}}"),
                        ("x \\ge 3", "\\boxed{x \\geq 3}"), ("\\text{no}", "\\boxed{\\text{no}}")]:
        assert is_equivalent(gold, extract_answer(reply)), (gold, reply)


def _percent(value: str) -> list[str]:
    return [f"\\boxed{{{value}\\%}}", f"\\boxed{{{value}%}}", f"<answer>{value}\\%</answer>",
            f"<answer>{value} percent</answer>", f"\\boxed{{{value}\\text{{ percent}}}}"]


def test_percent_forms_of_true_answers_score_1_against_the_number_and_its_hundredth(shared_data):
    """The rule (module docstring): ``G\\%`` matches a gold of G and of G/100, for every real GSM8K gold."""
    from fractions import Fraction

    from benchmax_gym.envs.math.rubric import correct

    _, gsm8k = _real_golds(shared_data)
    failures = []
    for gold in gsm8k:
        hundredth = str(float(Fraction(gold) / 100))
        for reply in _percent(gold):
            if correct(reply, gold) != 1.0 or correct(reply, hundredth) != 1.0:
                failures.append((gold, reply))
        # and a gold written with the sign accepts the number and its hundredth
        if correct(f"\\boxed{{{gold}}}", f"{gold}\\%") != 1.0 or correct(f"\\boxed{{{hundredth}}}", f"{gold}\\%") != 1.0:
            failures.append((f"{gold}\\%", gold))
    assert failures == []


def test_percent_forms_of_wrong_answers_score_0(shared_data):
    """G+1 with a percent sign matches neither G nor G/100; G/100 without the sign does not match G."""
    from fractions import Fraction

    from benchmax_gym.envs.math.rubric import correct

    _, gsm8k = _real_golds(shared_data)
    failures = []
    for gold in gsm8k:
        value = Fraction(gold)
        hundredth = str(float(value / 100))
        for reply in _percent(str(value + 1) if value.denominator == 1 else str(float(value + 1))):
            if correct(reply, gold) != 0.0 or correct(reply, hundredth) != 0.0:
                failures.append((gold, reply))
        if value != 0 and correct(f"\\boxed{{{hundredth}}}", gold) != 0.0:
            failures.append((gold, hundredth))
    assert failures == []


@pytest.mark.parametrize("gold, predicted", [("20", "20\\%"), ("0.2", "20\\%"), ("\\frac{1}{5}", "20\\%"),
                                              ("12.5", "12.5\\%"), ("0.125", "12.5%"), ("20\\%", "0.2"),
                                              ("20\\%", "\\frac{1}{5}"), ("20\\%", "20")])
def test_percent_is_read_both_ways(gold, predicted):
    assert is_equivalent(gold, predicted) is True


@pytest.mark.parametrize("gold, predicted", [("20", "0.2"), ("0.2", "20"), ("20", "21\\%"), ("0.2", "2\\%"),
                                              ("20\\%", "0.2\\%"), ("20\\%", "2"), ("12.5", "1.25\\%")])
def test_percent_scales_only_where_a_sign_is(gold, predicted):
    assert is_equivalent(gold, predicted) is False


def test_plain_int_fast_path_agrees_with_the_full_comparison(monkeypatch):
    """Two plain ints are compared as ints without normalising: the same verdict as the full
    path for signs, leading zeros, -0, long numbers and near misses (spaces, plus signs, commas,
    decimals, non-ASCII digits) that must still take the full path."""
    import random
    import re

    from benchmax_gym.envs.math import rubric

    rng = random.Random(3)
    atoms = ["0", "-0", "7", "007", "-7", "42", "042", "-042", "1600", "1,600", "+7", " 7", "7 ", "7.0", "٧",
             "1" * 100, "1" * 101, "-" + "9" * 100, "10", "12345678901234567890"]
    pairs = [(rng.choice(atoms), rng.choice(atoms)) for _ in range(1500)] + [(a, a) for a in atoms]
    fast = [is_equivalent(g, p) for g, p in pairs]
    assert sum(rubric._PLAIN_INT.fullmatch(g) is not None and rubric._PLAIN_INT.fullmatch(p) is not None
               for g, p in pairs) > 300
    monkeypatch.setattr(rubric, "_PLAIN_INT", re.compile(r"(?!)"))  # the full path only
    assert [is_equivalent(g, p) for g, p in pairs] == fast


def test_extracting_answers_from_several_threads_gives_each_its_own():
    """extract_answer keeps the last reply it read (the rubric's two leaves read the same one):
    threads grading different replies at once each get their own reply's answer."""
    texts = [f"work {i} \\boxed{{{i}}}" if i % 3 else f"<answer>{i}</answer>" for i in range(300)] + ["none", ""]
    expected = [extract_answer(t) for t in texts]
    assert expected[1] == "1" and expected[3] == "3" and expected[-2] is None

    def grade(offset):
        return [extract_answer(texts[(i + offset) % len(texts)]) for i in range(len(texts) * 20)]

    with ThreadPoolExecutor(4) as pool:
        for offset, got in zip(range(4), pool.map(grade, range(4))):
            assert got == [expected[(i + offset) % len(texts)] for i in range(len(texts) * 20)]


HUGE_NUMBER_CHECK = """
import threading
from benchmax_gym.envs.math.rubric import is_equivalent
answers = ['3^{10^{10}}', '7^{9^{9^{9}}}', '\\\\frac{1}{3}^{-10^{10}}', '\\\\{3^{10^{10}}\\\\}', '(10^{9})!',
           '\\\\binom{3^{10^{10}}}{2}']  # (the last is evaluated by the parser itself)
out = []
worker = threading.Thread(target=lambda: out.extend(is_equivalent('2', a) for a in answers))
worker.start()
worker.join()
print(out, is_equivalent('3^{100}', '3^{100}'), is_equivalent('\\\\binom{10}{3}', '120'))
"""


def test_an_answer_with_a_huge_number_is_refused_before_sympy_holds_the_gil():
    """Outside the main thread ``3^{10^{10}}`` once hung the worker: sympy's exact power is one
    C call holding the GIL, so the grading thread's ``join(timeout)`` never returned - also when
    the parser evaluates it (``\\binom{3^{10^{10}}}{2}``), before the parsed answer is seen. Run in a
    child process so a regression fails instead of hanging the suite."""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", HUGE_NUMBER_CHECK], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("grading a huge power hung the worker")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[False, False, False, False, False, False] True True", done.stdout
