"""Final answers written to make math-verify's LaTeX parser run until the grader's timeout (bars,
nested brackets, script chains: time exponential in their count) are refused before it sees them,
graded as the model's wrong answer; real answers still grade."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.envs.math.rubric import correct, is_equivalent

HOSTILE = {
    "bars": "1|2|" * 10 + "5",  # 0.8 s to parse at 20 bars, doubling every 4 more
    "many bars": "1|2|" * 124 + "5",  # (the reported one)
    "norm bars": "1\\|2\\|" * 6 + "5",
    "vert bars": "1\\vert 2\\vert " * 6 + "5",
    "nested fractions": "\\frac{" * 16 + "1" + "}{2}" * 16,
    "nested braces": "{" * 16 + "1" + "}" * 16,
    "nested brackets": "(" * 16 + "1" + ")" * 16,
    "nested square roots": "\\sqrt{" * 20 + "2" + "}" * 20,
    "tower": "2^{" * 20 + "1" + "}" * 20,
    "unbraced tower": "x^" * 24 + "1",
    "script chain": "x^2_" * 8 + "1",
    "list of brackets": ",".join(["(1)"] * 50),
    "list of nested brackets": ",".join(["((((1))))"] * 8),
}


@pytest.fixture
def parses(monkeypatch):
    """Every LaTeX string math-verify is asked to read (its ``parse`` and its LaTeX parser)."""
    import math_verify
    import math_verify.parser

    seen = []
    for module, name in ((math_verify, "parse"), (math_verify.parser, "latex2sympy")):
        real = getattr(module, name)

        def recording(text, *args, _real=real, **kwargs):
            seen.append(text)
            return _real(text, *args, **kwargs)

        monkeypatch.setattr(module, name, recording)
    return seen


@pytest.mark.parametrize("form", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_pathological_answer_scores_0_without_math_verify(form, parses):
    """Each took the whole 5 s timeout (a thread held, CPU spent), for every sample that wrote it."""
    started = time.perf_counter()
    assert is_equivalent("5", form) is False
    assert correct(f"So \\boxed{{{form}}}.", "5") == 0.0
    assert correct(f"<answer>{form}</answer>", "5") == 0.0
    assert parses == []
    assert time.perf_counter() - started < 60  # a hang guard only


def test_in_a_worker_thread_no_check_thread_is_left_running(parses):
    """Off the main thread the check runs in a daemon thread abandoned at the timeout: a hostile
    answer left one parsing in the background. Refused first, none is started."""
    before = {t for t in threading.enumerate() if t.name == "math-verify"}
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(is_equivalent, "5", HOSTILE["bars"], 0.5).result() is False
    assert parses == []
    assert {t for t in threading.enumerate() if t.name == "math-verify"} <= before


@pytest.mark.parametrize("gold, answer", [
    ("|x - 1| + |x + 2|", "|x+2|+|x-1|"), ("x^2", "|x|^2"), ("2|x - 1|", "2\\left|x - 1\\right|"),
    ("\\frac{2}{\\sqrt{5}}", "\\frac{1}{\\sqrt{1+\\left(\\frac{1}{2}\\right)^{2}}}"),
    ("x_1^2 + x_2^2", "x_{1}^{2}+x_{2}^{2}"), ("(1, 2), (3, 4), (5, 6)", "(1,2),(3,4),(5,6)"),
    ("\\begin{pmatrix} 1/3 & 2/3 \\\\ 2/3 & -1/3 \\end{pmatrix}",
     "\\begin{pmatrix} \\frac{1}{3} & \\frac{2}{3} \\\\ \\frac{2}{3} & -\\frac{1}{3} \\end{pmatrix}"),
])
def test_answers_with_bars_brackets_and_scripts_still_grade(gold, answer):
    """The bounds are several times what real answers use: these still reach math-verify."""
    assert is_equivalent(gold, answer, timeout=60)
    assert not is_equivalent(gold, answer + "+1", timeout=60)


@pytest.mark.parametrize("gold, answer", [("e^{-x^2}", "\\exp(-x^{2})"), ("e^{x^{2}}", "e^{x^2}"),
                                          ("2^{n+1}", "2 \\cdot 2^{n}"), ("x^{y^{2}}", "x^{y^2}")])
def test_a_power_with_a_name_in_its_exponent_grades(gold, answer):
    """The huge-number bound took ``e^{-x^2}`` for a number of 10**11 digits: no such answer, not
    even the gold itself, could score 1. A power of a name is never computed."""
    assert is_equivalent(gold, gold) and is_equivalent(gold, answer)
    assert not is_equivalent(gold, answer + "+1")


def test_through_the_env_a_hostile_answer_is_a_wrong_answer_and_real_answers_score_1(shared_data, parses):
    """The refusal is the model's wrong answer (reward 0, no reward error), not a failed grading;
    every MATH-500 sample gold, boxed as a reply, still scores 1."""
    path = str(shared_data / "math500" / "test_first100.jsonl")
    env = gym.make("benchmax/Math-v0", tasks="math500", task_args={"dataset": path}, python_tool=False)
    golds = [task.answer for task in env.unwrapped.tasks.tasks]
    assert golds == [json.loads(line)["answer"] for line in open(path)]
    env.reset(options={"task_index": 0})
    _, reward, terminated, _, info = env.step(f"After all that, \\boxed{{{HOSTILE['bars']}}}")
    assert terminated and reward == 0.0
    assert info["reward_components"] == {"correct": 0.0, "format": 1.0}
    assert not info.get("reward_errors")
    assert parses == []
    wrong = []
    for index, gold in enumerate(golds):
        env.reset(options={"task_index": index})
        _, reward, *_ = env.step(f"So the answer is $\\boxed{{{gold}}}$.")
        if reward != 1.0:
            wrong.append(gold)
    assert not wrong
    env.close()


def test_a_long_or_tangled_gold_is_still_matched_by_its_own_text(parses):
    """The bounds are for what math-verify must parse: a gold past them (a dataset's 5x5 matrix of
    fractions, 400 characters and 52 brackets) is still matched by the same text (white space
    aside), with no parse, and any other text is not equivalent."""
    from benchmax_gym.envs.math.rubric import MAX_ANSWER_CHARS, _tangled, is_equivalent

    gold = "\\begin{pmatrix} " + " \\\\ ".join(" & ".join(f"\\frac{{{i}}}{{{j + 2}}}" for i in range(5))
                                                for j in range(5)) + " \\end{pmatrix}"
    assert len(gold) > MAX_ANSWER_CHARS and _tangled(gold)
    assert is_equivalent(gold, gold)
    assert is_equivalent(gold, "  " + gold.replace(" & ", "  &  ") + "\n")
    assert not is_equivalent(gold, gold.replace("\\frac{4}{6}", "\\frac{4}{7}"))
    assert parses == []
