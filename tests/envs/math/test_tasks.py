"""Math tasks: the seeded generator and the dataset loaders, on the real benchmark samples."""

import json
import re
from pathlib import Path

import numpy as np
import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401  (registers the ids)

from benchmax_gym.envs.math.calculator import evaluate, format_number
from benchmax_gym.envs.math.rubric import is_equivalent
from benchmax_gym.envs.math.datasets import (
    gsm8k_gold,
    gsm8k_steps,
    gsm8k_tasks,
    hf_tasks,
    math500_tasks,
    numeric_expression,
)
from benchmax_gym.envs.math.generator import MathTaskConfig, generated_tasks, make_math_task

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
GSM8K = DATA / "gsm8k" / "train_sample500.jsonl"
MATH500 = DATA / "math500" / "test_first100.jsonl"
needs_data = pytest.mark.skipif(
    not DATA.is_dir(), reason=f"shared benchmark samples not found at {DATA}"
)

TEMPLATES = {
    "shopping", "travel", "sharing", "savings", "recipe",
    "inventory", "ages", "harvest", "wages", "classroom",
}  # fmt: skip

# -- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"operands": 1}, "operands"),
        ({"operands": 13}, "operands"),
        ({"operands": 3.0}, "operands"),
        ({"operands": True}, "operands"),
        ({"digits": 0}, "digits"),
        ({"digits": 10}, "digits"),
        ({"operations": ""}, "operations"),
        ({"operations": "+^"}, "operations"),
        ({"operations": ["+"]}, "operations"),
        ({"word_problems": 1.5}, "word_problems"),
        ({"word_problems": -0.1}, "word_problems"),
        ({"word_problems": "half"}, "word_problems"),
        ({"steps": 0}, "steps"),
        ({"steps": 7}, "steps"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MathTaskConfig(**kwargs)


def test_config_defaults_and_frozen():
    config = MathTaskConfig()
    expected = MathTaskConfig(operands=3, digits=2, operations="+-*", word_problems=0.5, steps=2)
    assert config == expected
    with pytest.raises(AttributeError):
        config.digits = 5


def test_generated_tasks_rejects_wrong_config():
    with pytest.raises(ValueError, match="difficulty must be a dict of MathTaskConfig"):
        generated_tasks("hard")
    with pytest.raises(ValueError, match="digits must be an int from 1 to 9"):
        generated_tasks({"digits": 20})
    assert generated_tasks({"digits": 2})[0] == generated_tasks(MathTaskConfig(digits=2))[0]


def test_an_unknown_difficulty_field_is_named_with_a_suggestion_at_make():
    """A typo in a difficulty knob says which field was meant and lists them all (it was the
    dataclass's bare ``__init__() got an unexpected keyword argument``)."""
    with pytest.raises(ValueError, match=r"^difficulty: unknown MathTaskConfig field 'digitz' \(did you mean "
                       r"'digits'\?\); its fields are operands, digits, operations, word_problems, steps$"):
        gym.make("benchmax/Math-v0", task_args={"difficulty": {"digitz": 3}})


# -- generator -----------------------------------------------------------------------------


def test_same_seed_and_index_give_the_same_task():
    config = MathTaskConfig(operations="+-*/")
    a, b = generated_tasks(config, seed=3), generated_tasks(config, seed=3)
    for i in (0, 1, 17, 2**40):
        assert a[i] == b[i]
    # order does not matter, and the raw function is deterministic too
    assert [a[i] for i in (5, 4, 3)] == [b[i] for i in (3, 4, 5)][::-1]
    make = lambda: make_math_task(np.random.default_rng([3, 9]), 9, config)  # noqa: E731
    assert make() == make() == a[9]


def test_different_indices_and_seeds_differ():
    source = generated_tasks(seed=0)
    prompts = [source[i].prompt for i in range(300)]
    assert len(set(prompts)) >= 295
    other = generated_tasks(seed=1)
    assert sum(source[i].prompt != other[i].prompt for i in range(100)) >= 95


def test_size():
    assert len(generated_tasks(size=10)) == 10
    assert len(generated_tasks()) > 10**15
    with pytest.raises(IndexError):
        generated_tasks(size=10)[10]


CONFIGS = [
    MathTaskConfig(),
    MathTaskConfig(operations="/", operands=4, digits=1, word_problems=0.0),
    MathTaskConfig(operations="+-*/", operands=6, digits=3, word_problems=0.0),
    MathTaskConfig(operations="-/", operands=12, digits=9, word_problems=0.0),
    MathTaskConfig(operands=2, digits=1, word_problems=1.0, steps=1),
    MathTaskConfig(word_problems=1.0, steps=3),
    MathTaskConfig(word_problems=1.0, steps=6),
    MathTaskConfig(operations="+-*/", word_problems=0.3, steps=4),
]


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
def test_every_generated_task_is_solvable_with_the_calculator(config):
    source = generated_tasks(config, seed=7)
    for i in range(300):
        task = source[i]
        assert task.id == f"gen-{i}"
        assert task.metadata["source"] == "generated"
        assert re.fullmatch(r"-?\d+", task.answer), task
        assert task.solution and all(isinstance(step, str) for step in task.solution)
        values = [evaluate(step) for step in task.solution]
        assert format_number(values[-1]) == task.answer, task
        if task.metadata["kind"] == "arithmetic":
            assert task.metadata["template"] == "expression"
            expression = task.prompt.removeprefix("Compute: ")
            assert expression != task.prompt
            assert format_number(evaluate(expression)) == task.answer, task
            assert len(task.solution) == config.operands - 1
        else:
            assert task.metadata["kind"] == "word_problem"
            assert task.metadata["template"] in TEMPLATES
            assert len(task.solution) == config.steps
            assert all(type(v) is int and v >= 0 for v in values), task
            assert task.prompt.rstrip().endswith("?")


def test_word_problem_probability_and_template_variety():
    words = generated_tasks(MathTaskConfig(word_problems=1.0), seed=0)
    kinds = {words[i].metadata["kind"] for i in range(100)}
    assert kinds == {"word_problem"}
    assert {words[i].metadata["template"] for i in range(300)} == TEMPLATES
    sums = generated_tasks(MathTaskConfig(word_problems=0.0), seed=0)
    assert {sums[i].metadata["kind"] for i in range(100)} == {"arithmetic"}
    mixed = generated_tasks(MathTaskConfig(word_problems=0.5), seed=0)
    share = sum(mixed[i].metadata["kind"] == "word_problem" for i in range(400)) / 400
    assert 0.4 < share < 0.6


def test_operations_are_respected():
    source = generated_tasks(MathTaskConfig(operations="*", operands=4, word_problems=0.0))
    for i in range(50):
        expression = source[i].prompt.removeprefix("Compute: ")
        assert set(re.findall(r"[-+*/]", expression)) == {"*"}
        assert len(re.findall(r"\d+", expression)) == 4


def test_divisions_are_exact_and_non_trivial():
    config = MathTaskConfig(operations="/", operands=3, digits=2, word_problems=0.0)
    source = generated_tasks(config)
    answers = [int(source[i].answer) for i in range(100)]
    assert all(10 <= a <= 99 for a in answers)  # the quotient is a 2-digit number


# -- GSM8K -----------------------------------------------------------------------------------


def test_gsm8k_helpers():
    text = "Natalia sold 48/2 = <<48/2=24>>24 clips.\nThen 48+24 = <<48+24=72>>72.\n#### 1,600"
    assert gsm8k_gold(text) == "1600"
    assert gsm8k_steps(text) == ["48/2", "48+24"]
    assert gsm8k_gold("no marker") is None


@needs_data
def test_gsm8k_sample():
    tasks = gsm8k_tasks(GSM8K)
    assert len(tasks) == 500
    first = tasks[0]
    assert first.id == "gsm8k-0"
    assert first.prompt.startswith("Natalia sold clips")
    assert first.answer == "72"
    assert first.solution == ["48/2", "48+24"]
    assert first.metadata == {"source": "gsm8k"}

    raw = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    with_commas = [i for i, r in enumerate(raw) if re.search(r"#### .*,", r["answer"])]
    assert with_commas, "the sample should contain a gold answer with a thousands separator"
    for i in with_commas:
        assert "," not in tasks[i].answer
        assert tasks[i].answer == raw[i]["answer"].rsplit("#### ", 1)[1].strip().replace(",", "")
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", tasks[i].answer) for i in range(len(tasks)))


@needs_data
def test_gsm8k_limit():
    assert len(gsm8k_tasks(GSM8K, limit=7)) == 7


# -- MATH-500 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "latex, expression",
    [
        ("18", "18"),
        ("-50", "-50"),
        ("1.25", "1.25"),
        (".5", "0.5"),
        ("007", "7"),
        ("1,600", "1600"),
        ("10{,}000", "10000"),
        ("10\\!000", "10000"),
        ("\\frac{14}{3}", "14/3"),
        ("\\dfrac{3}{2}", "3/2"),
        ("-\\frac{3}{56}", "-3/56"),
        ("\\frac{-3}{4}", "-3/4"),
        ("\\frac12", "1/2"),
        ("$42$", "42"),
        ("\\frac{1}{0}", None),
        ("1,-2", None),
        ("3\\sqrt{13}", None),
        ("\\pi", None),
        ("-\\frac{\\pi}{6}", None),
        ("90^\\circ", None),
        ("52_8", None),
        ("x=5", None),
        ("\\text{Evelyn}", None),
    ],
)
def test_numeric_expression(latex, expression):
    assert numeric_expression(latex) == expression


@needs_data
def test_math500_sample():
    tasks = math500_tasks(MATH500)
    assert len(tasks) == 100
    first = tasks[0]
    assert first.id == "test/precalculus/807.json"
    assert first.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.solution is None
    assert first.metadata == {"source": "math500", "subject": "Precalculus", "level": 2}
    assert len({tasks[i].id for i in range(100)}) == 100


@needs_data
def test_math500_numeric_only():
    every = math500_tasks(MATH500)
    numeric = math500_tasks(MATH500, numeric_only=True)
    assert 0 < len(numeric) < len(every)
    answers = {numeric[i].answer for i in range(len(numeric))}
    assert "\\frac{14}{3}" in answers and "\\text{Evelyn}" not in answers
    for i in range(len(numeric)):
        task = numeric[i]
        (expression,) = task.solution
        value = evaluate(expression)
        assert is_equivalent(task.answer, format_number(value)), (task.answer, expression, value)


@needs_data
def test_math500_limit_counts_kept_tasks():
    assert len(math500_tasks(MATH500, numeric_only=True, limit=5)) == 5


# -- any dataset -----------------------------------------------------------------------------


@needs_data
def test_hf_tasks_field_mapping():
    tasks = hf_tasks(MATH500, question_field="problem", answer_field="answer")
    assert len(tasks) == 100
    assert tasks[2].answer == "\\frac{14}{3}"
    assert tasks[2].id == "test_first100-2"
    assert tasks[2].metadata == {"source": "test_first100"}


@needs_data
def test_hf_tasks_answer_transform_matches_gsm8k_loader():
    generic = hf_tasks(GSM8K, answer_transform=gsm8k_gold, limit=50)
    specific = gsm8k_tasks(GSM8K, limit=50)
    assert [generic[i].answer for i in range(50)] == [specific[i].answer for i in range(50)]
    assert [generic[i].prompt for i in range(50)] == [specific[i].prompt for i in range(50)]


@needs_data
def test_hf_tasks_wrong_mapping_names_the_fields():
    with pytest.raises(ValueError) as caught:
        hf_tasks(GSM8K, question_field="prompt")
    message = str(caught.value)
    assert "'prompt'" in message and "'question'" in message and "'answer'" in message
    with pytest.raises(ValueError, match="'solution_text'"):
        hf_tasks(MATH500, question_field="problem", answer_field="solution_text")


@pytest.mark.parametrize("answer, said", [(None, "null"), ("  ", "blank")])
def test_a_record_with_a_null_or_blank_answer_is_refused_naming_it(tmp_path, answer, said):
    """A null answer (what `datasets` fills in for a missing key) became the gold text "None",
    which `\\boxed{None}` matched."""
    path = tmp_path / "mine.jsonl"
    rows = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": answer}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=f"mine.jsonl' line 2: the answer field 'answer' is {said}"):
        tasks = hf_tasks(str(path))
        [tasks[i] for i in range(len(tasks))]
