"""Generated math tasks (the offline default): arithmetic expressions and multi-step word problems.

Generated tasks are built so that the reference solver can prove them solvable through the
environment's own tool: every solution step is a calculator expression, and each step's value
is computed *with the calculator* while the task is built, so the last step's formatted output
is the answer by construction. Divisions are made exact and word-problem quantities stay
non-negative, so every answer is an integer that string and math-verify grading agree on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from benchmax_gym.core.checks import Checked, arg, config_of, int_between, number_between
from benchmax_gym.core.sources import GeneratedSource
from benchmax_gym.core.tasks import GeneratedTasks, Task
from benchmax_gym.core.tasks import pick as _pick, rand_int as _int, sample as _sample
from benchmax_gym.envs.math.calculator import evaluate, format_number

OPERATIONS = "+-*/"


def _operations(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string of {OPERATIONS!r}, got {value!r}")
    unknown = sorted(set(value) - set(OPERATIONS))
    if unknown:
        raise ValueError(f"{name} may only contain {OPERATIONS!r}, got {''.join(unknown)!r}")
    return value


@dataclass(frozen=True)
class MathTaskConfig(Checked):
    """Difficulty knobs of the generator.

    Attributes:
        operands: numbers in an arithmetic expression (2-12).
        digits: digits of each number in an arithmetic expression (1-9); a dividend may be
            longer, since divisions are built to be exact.
        operations: which of ``+ - * /`` arithmetic expressions use.
        word_problems: probability that a task is a word problem rather than an expression.
        steps: chained stages in a word problem (1-6); its solution has exactly this many steps.
    """

    operands: int = arg(3, int_between(2, 12))
    digits: int = arg(2, int_between(1, 9))
    operations: str = arg("+-*", _operations)
    word_problems: float = arg(0.5, number_between(0.0, 1.0, " (a probability)"))
    steps: int = arg(2, int_between(1, 6))


def make_math_task(rng: np.random.Generator, index: int, config: MathTaskConfig) -> Task:
    """Task ``index`` drawn with ``rng``: an arithmetic expression or a multi-step word problem."""
    if rng.random() < config.word_problems:
        template = _pick(rng, tuple(_TEMPLATES))
        work = _Work()
        prompt = _TEMPLATES[template](rng, config.steps, work)
        kind = "word_problem"
    else:
        template = "expression"
        work = _Work(allow_negative=True)
        root = _expression(rng, config.operands, config, work)
        prompt = f"Compute: {_render(root)}"
        kind = "arithmetic"
    return Task(
        id=f"gen-{index}",
        prompt=prompt,
        answer=work.answer,
        solution=list(work.steps),
        metadata={"source": "generated", "kind": kind, "template": template},
    )


@dataclass(frozen=True)
class GeneratedMath(GeneratedSource):
    """``tasks="generated"``: ``difficulty`` is a :class:`MathTaskConfig` or a dict of its fields."""

    difficulty: MathTaskConfig = arg(None, config_of(MathTaskConfig))

    def make_task(self, rng: np.random.Generator, index: int) -> Task:
        return make_math_task(rng, index, self.difficulty)


def generated_tasks(
    config: MathTaskConfig | None = None, *, seed: int = 0, size: int | None = None
) -> GeneratedTasks:
    """The generated task source: item ``i`` of ``seed`` is always the same task."""
    return GeneratedMath(difficulty=config, num_tasks=size, task_seed=seed).build(None)


# -- helpers --------------------------------------------------------------------------------


class _Work:
    """The solution steps; each value is computed by the calculator the model will use."""

    def __init__(self, allow_negative: bool = False):
        self.allow_negative = allow_negative
        self.steps: list[str] = []
        self.value: int | None = None

    def __call__(self, expression: str) -> int:
        value = evaluate(expression)
        if type(value) is not int or (value < 0 and not self.allow_negative):
            raise RuntimeError(f"generator bug: step {expression!r} gave {value!r}")
        self.steps.append(expression)
        self.value = value
        return value

    def said(self, sentences: list[str], expression: str, sentence: str) -> int:
        """A step and the sentence that tells it."""
        sentences.append(sentence)
        return self(expression)

    @property
    def answer(self) -> str:
        return format_number(self.value)





def _divisors(n: int, low: int, high: int) -> list[int]:
    return [d for d in range(low, high + 1) if n % d == 0]


def _list(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# -- arithmetic expressions ------------------------------------------------------------------


class _Node(NamedTuple):
    """An expression tree node: a number (no ``op``) or ``left op right``, with its value."""

    value: int
    op: str | None = None
    left: "_Node | None" = None
    right: "_Node | None" = None


def _number(rng: np.random.Generator, digits: int, multiple_of: int = 1) -> int:
    """``multiple_of`` times a ``digits``-digit number (2-9 for one digit).

    Scaling (rather than rounding to a multiple in range) keeps quotients non-trivial:
    ``x / 12`` becomes ``684 / 12``, not ``12 / 12``.
    """
    low, high = (2, 9) if digits == 1 else (10 ** (digits - 1), 10**digits - 1)
    return multiple_of * _int(rng, low, high)


def _expression(
    rng: np.random.Generator, n: int, config: MathTaskConfig, work: _Work, multiple_of: int = 1
) -> _Node:
    """A random tree of ``n`` numbers whose value is a multiple of ``multiple_of``.

    Divisions are exact by construction: ``x / d`` has a single-number divisor ``d`` and a
    left side built to be a multiple of ``d`` (sums, differences and one factor of a product
    of multiples are multiples). Steps are recorded bottom-up, so the last one is the root.
    """
    if n == 1:
        return _Node(_number(rng, config.digits, multiple_of))
    op = _pick(rng, config.operations)
    if op == "/":
        divisor = _number(rng, config.digits)
        left = _expression(rng, n - 1, config, work, multiple_of * divisor)
        right = _Node(divisor)
    else:
        k = _int(rng, 1, n - 1)
        left_multiple, right_multiple = multiple_of, multiple_of
        if op == "*":  # one factor carries the multiple
            if rng.random() < 0.5:
                left_multiple, right_multiple = multiple_of, 1
            else:
                left_multiple, right_multiple = 1, multiple_of
        left = _expression(rng, k, config, work, left_multiple)
        right = _expression(rng, n - k, config, work, right_multiple)
    value = work(f"{_operand(left.value)} {op} {_operand(right.value)}")
    return _Node(value, op, left, right)


def _operand(value: int) -> str:
    return f"({value})" if value < 0 else str(value)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def _render(node: _Node) -> str:
    """Infix text with only the parentheses the tree needs."""
    if node.op is None:
        return str(node.value)
    return f"{_child(node.left, node, False)} {node.op} {_child(node.right, node, True)}"


def _child(child: _Node, parent: _Node, is_right: bool) -> str:
    text = _render(child)
    if child.op is None:
        return text
    mine, theirs = _PRECEDENCE[child.op], _PRECEDENCE[parent.op]
    # a + (b - c) == a + b - c and a * (b * c) == a * b * c; every other equal-precedence
    # right operand (a - (b + c), a / (b * c), a * (b / c)) keeps its parentheses
    associative = parent.op == "+" or (parent.op == "*" and child.op == "*")
    if mine < theirs or (is_right and mine == theirs and not associative):
        return f"({text})"
    return text


# -- word problems ---------------------------------------------------------------------------
#
# Each template writes a story of ``steps`` stages, records one calculator step per stage with
# ``work`` and returns the problem text. Quantities never go negative; divisions are exact.


@dataclass(frozen=True)
class _Person:
    name: str
    she: str  # "she" / "he"

    @property
    def her(self) -> str:
        return "her" if self.she == "she" else "his"

    @property
    def She(self) -> str:  # noqa: N802 - reads naturally in templates
        return self.she.capitalize()


_NAMES = (
    ("Maria", "she"), ("Liam", "he"), ("Aisha", "she"), ("Kenji", "he"), ("Sofia", "she"),
    ("Mateo", "he"), ("Priya", "she"), ("Noah", "he"), ("Chloe", "she"), ("Omar", "he"),
    ("Elena", "she"), ("Lucas", "he"), ("Fatima", "she"), ("Diego", "he"), ("Hana", "she"),
    ("Samuel", "he"), ("Zara", "she"), ("Ivan", "he"), ("Grace", "she"), ("Tariq", "he"),
)  # fmt: skip


def _people(rng: np.random.Generator, k: int) -> list[_Person]:
    return [_Person(*p) for p in _sample(rng, _NAMES, k)]


_THEN = ("Then", "After that", "Next", "Later")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


def _shopping(rng: np.random.Generator, steps: int, work: _Work) -> str:
    items = (
        ("notebook", "notebooks", 2, 9), ("pen", "pens", 1, 4), ("book", "books", 8, 25),
        ("mug", "mugs", 4, 12), ("T-shirt", "T-shirts", 9, 20), ("plant", "plants", 5, 15),
        ("scarf", "scarves", 10, 30), ("puzzle", "puzzles", 6, 18),
    )  # fmt: skip
    (p,) = _people(rng, 1)
    change = steps >= 2 and rng.random() < 0.5
    parts, total = [], 0
    for i, (_, plural, low, high) in enumerate(_sample(rng, items, steps - int(change))):
        qty, price = _int(rng, 2, 9), _int(rng, low, high)
        parts.append(f"{qty} {plural} for ${price} each")
        total = work(f"{qty} * {price}" if i == 0 else f"{total} + {qty} * {price}")
    text = f"{p.name} buys {_list(parts)}."
    if change:
        bill = next(b for b in (20, 50, 100, 200, 500, 1000) if b > total)
        work(f"{bill} - {total}")
        return (
            f"{text} {p.She} pays with a ${bill} bill. "
            f"How much change does {p.she} get, in dollars?"
        )
    return text + f" How much does {p.she} spend in total, in dollars?"


def _travel(rng: np.random.Generator, steps: int, work: _Work) -> str:
    (p,) = _people(rng, 1)
    verb, low, high = _pick(rng, (("drives", 6, 18), ("cycles", 2, 5), ("rides a scooter", 3, 8)))
    ask_time = rng.random() < 0.5
    sentences, total = [], 0
    for i in range(steps):
        speed, hours = 5 * _int(rng, low, high), _int(rng, 1, 5)
        lead = p.name if i == 0 else f"{_pick(rng, _THEN)}, {p.she}"
        if ask_time:
            sentences.append(f"{lead} {verb} {speed * hours} km at {speed} km/h.")
            step = f"{speed * hours} / {speed}"
        else:
            sentences.append(f"{lead} {verb} for {hours} hours at {speed} km/h.")
            step = f"{speed} * {hours}"
        total = work(step if i == 0 else f"{total} + {step}")
    if ask_time:
        question = "How many hours does the whole trip take?"
    else:
        question = f"How many kilometers does {p.she} travel in total?"
    return " ".join(sentences) + " " + question


def _sharing(rng: np.random.Generator, steps: int, work: _Work) -> str:
    thing, container = _pick(
        rng, (("stickers", "packs"), ("cookies", "boxes"), ("marbles", "bags"), ("cards", "decks"))
    )
    (p,) = _people(rng, 1)
    friends = _int(rng, 2, 8)
    if steps == 1:
        total = friends * _int(rng, 2, 15)
        work(f"{total} / {friends}")
        return (
            f"{p.name} has {total} {thing} and shares them equally among {friends} friends. "
            f"How many {thing} does each friend get?"
        )
    count, per = _int(rng, 2, 9), _int(rng, 4, 24)
    total = work(f"{count} * {per}")
    sentences = [f"{p.name} has {count} {container} with {per} {thing} in each."]
    for i in range(steps - 2):
        last = i == steps - 3
        if not last and total > 10 and rng.random() < 0.5:
            given = _int(rng, 1, total // 2)
            total = work(f"{total} - {given}")
            friend = _pick(rng, (f"{p.her} cousin", "a neighbor", "a classmate", "a friend"))
            sentences.append(f"{p.She} gives {given} {thing} to {friend}.")
        else:
            more = _int(rng, 3, 20)
            if last:  # make the final share exact
                more += -(total + more) % friends
            total = work.said(sentences, f"{total} + {more}", f"{p.She} gets {more} more {thing}.")
    if steps == 2:
        friends = _pick(rng, _divisors(total, 2, 9))  # count (2-9) always divides total
    work(f"{total} / {friends}")
    sentences.append(
        f"{p.She} shares all the {thing} equally among {friends} friends. "
        f"How many {thing} does each friend get?"
    )
    return " ".join(sentences)


def _savings(rng: np.random.Generator, steps: int, work: _Work) -> str:
    (p,) = _people(rng, 1)
    weekly, weeks = _int(rng, 3, 40), _int(rng, 2, 12)
    total = work(f"{weekly} * {weeks}")
    sentences = [f"{p.name} saves ${weekly} every week for {weeks} weeks."]
    things = _sample(rng, ("book", "video game", "pair of shoes", "concert ticket", "backpack"), 5)
    for i in range(steps - 1):
        kind = _int(rng, 0, 2)
        if kind == 0 and total >= 2:
            cost = _int(rng, 1, total - 1)
            total = work.said(sentences, f"{total} - {cost}",
                              f"{_pick(rng, _THEN)}, {p.she} spends ${cost} on a {things[i]}.")
        elif kind == 1:
            gift = _int(rng, 5, 60)
            total = work.said(sentences, f"{total} + {gift}", f"{p.She} gets ${gift} as a gift.")
        else:
            weekly, weeks = _int(rng, 3, 40), _int(rng, 2, 8)
            total = work.said(sentences, f"{total} + {weekly} * {weeks}",
                              f"{p.She} then saves ${weekly} a week for {weeks} more weeks.")
    return " ".join(sentences) + f" How much money does {p.name} have now, in dollars?"


def _recipe(rng: np.random.Generator, steps: int, work: _Work) -> str:
    ingredient, unit = _pick(
        rng, (("flour", "grams"), ("sugar", "grams"), ("milk", "milliliters"), ("rice", "grams"))
    )
    (p,) = _people(rng, 1)
    per, servings = _int(rng, 5, 60), _int(rng, 2, 12)
    if steps == 1:
        work(f"{per} * {servings}")
        return (
            f"A recipe uses {per} {unit} of {ingredient} per serving. "
            f"How many {unit} of {ingredient} are needed for {servings} servings?"
        )
    base = _int(rng, 2, 8)
    per = work(f"{base * per} / {base}")
    total = work(f"{per} * {servings}")
    sentences = [
        f"A recipe for {base} servings uses {base * per} {unit} of {ingredient}.",
        f"{p.name} makes {servings} servings.",
    ]
    extras = _sample(rng, ("a sauce", "a glaze", "a second batch of dough", "the topping"), 4)
    repeated = False
    for i in range(steps - 2):
        if not repeated and rng.random() < 0.4:
            repeated, times = True, _int(rng, 2, 4)
            total = work.said(sentences, f"{total} * {times}",
                              f"{p.She} cooks the same amount {times} times this month.")
        else:
            extra = _int(rng, 10, 200)
            total = work.said(sentences, f"{total} + {extra}",
                              f"{p.She} also uses {extra} {unit} of {ingredient} for {extras[i]}.")
    return " ".join(sentences) + f" How many {unit} of {ingredient} does {p.she} use in total?"


def _inventory(rng: np.random.Generator, steps: int, work: _Work) -> str:
    items = _pick(rng, ("apples", "light bulbs", "water bottles", "notebooks", "batteries"))
    shop = _pick(rng, ("store", "warehouse", "school shop"))
    stock = _int(rng, 40, 400)
    sentences = [f"A {shop} has {stock} {items}."]
    for day in _DAYS[:steps]:
        if stock > 10 and rng.random() < 0.5:
            sold = _int(rng, 1, stock - 1)
            stock = work.said(sentences, f"{stock} - {sold}", f"On {day}, it sells {sold} {items}.")
        else:
            boxes, per_box = _int(rng, 2, 9), _int(rng, 6, 24)
            stock = work.said(sentences, f"{stock} + {boxes} * {per_box}",
                              f"On {day}, it receives {boxes} boxes with {per_box} {items} in each.")
    question = f"How many {items} does the {shop} have at the end of {_DAYS[steps - 1]}?"
    return " ".join(sentences) + " " + question


def _ages(rng: np.random.Generator, steps: int, work: _Work) -> str:
    people = _people(rng, steps + 1)
    age = _int(rng, 4, 14)
    sentences = [f"{people[0].name} is {age} years old."]
    for prev, person in zip(people, people[1:]):
        choices = (
            ["older"] * 2 * (age <= 90)
            + ["younger"] * (age > 3)
            + ["times"] * (age <= 33)
            + ["half"] * (age % 2 == 0 and age >= 8)
        )
        kind = _pick(rng, choices)
        if kind == "older":
            diff = _int(rng, 1, min(30, 100 - age))
            age = work.said(sentences, f"{age} + {diff}",
                            f"{person.name} is {diff} years older than {prev.name}.")
        elif kind == "younger":
            diff = _int(rng, 1, age - 1)
            age = work.said(sentences, f"{age} - {diff}",
                            f"{person.name} is {diff} years younger than {prev.name}.")
        elif kind == "times":
            times = _int(rng, 2, 3)
            age = work(f"{age} * {times}")
            how = ("twice", "three times")[times - 2]
            sentences.append(f"{person.name} is {how} as old as {prev.name}.")
        else:
            age = work.said(sentences, f"{age} / 2", f"{person.name} is half as old as {prev.name}.")
    return " ".join(sentences) + f" How old is {people[-1].name}?"


def _harvest(rng: np.random.Generator, steps: int, work: _Work) -> str:
    crops = (("tomatoes", "tomato plants"), ("apples", "apple trees"), ("peppers", "pepper plants"))
    crop, plant = _pick(rng, crops)
    (p,) = _people(rng, 1)
    rows, per_row = _int(rng, 2, 9), _int(rng, 3, 15)
    value = work(f"{rows} * {per_row}")
    sentences = [f"{p.name} plants {rows} rows of {per_row} {plant}."]
    question = f"How many {plant} does {p.she} plant?"
    partners = _int(rng, 2, 5)
    if steps >= 2:
        each = _int(rng, 2, 12)
        value = work.said(sentences, f"{value} * {each}", f"Each one gives {each} {crop}.")
        question = f"How many {crop} does {p.she} harvest?"
    if steps >= 3:
        box = _pick(rng, _divisors(value, 2, 12))  # rows (2-9) always divides the harvest
        value = work.said(sentences, f"{value} / {box}", f"{p.She} packs all the {crop} into boxes of {box}.")
        question = f"How many boxes does {p.she} fill?"
    if steps >= 4:
        price = _int(rng, 3, 15)  # at least 3 dollars, so there is a profit to split below
        value = work.said(sentences, f"{value} * {price}", f"{p.She} sells every box for ${price}.")
        question = f"How much money does {p.she} make, in dollars?"
    if steps >= 5:
        if steps >= 6:  # leave a profit that splits evenly
            partners = min(partners, value - 1)
            cost = value - partners * _int(rng, 1, (value - 1) // partners)
        else:
            cost = _int(rng, 1, value - 1)
        value = work.said(sentences, f"{value} - {cost}", f"Seeds and tools cost {p.her} ${cost}.")
        question = f"What is {p.her} profit, in dollars?"
    if steps >= 6:
        value = work(f"{value} / {partners}")
        others = f"{partners - 1} partner{'s' * (partners > 2)}"
        sentences.append(f"{p.She} splits the profit equally with {others}, {partners} in all.")
        question = "How many dollars does each person get?"
    return " ".join(sentences) + " " + question


def _wages(rng: np.random.Generator, steps: int, work: _Work) -> str:
    (p,) = _people(rng, 1)
    rate, hours = _int(rng, 10, 40), _int(rng, 2, 9)
    value = work(f"{rate} * {hours}")
    sentences = [f"{p.name} earns ${rate} an hour and works {hours} hours a day."]
    question = f"How much does {p.she} earn in one day, in dollars?"
    stages = [
        ("days", f"How much does {p.she} earn in total, in dollars?"),
        ("bonus", f"How much does {p.she} get in total, in dollars?"),
        ("rent", "How much money is left, in dollars?"),
        ("half", f"How much does {p.she} save, in dollars?"),
        ("gift", f"How much is in {p.her} savings account now, in dollars?"),
    ]
    for stage, stage_question in stages[: steps - 1]:
        if stage == "days":
            days = _int(rng, 3, 6)
            value = work.said(sentences, f"{value} * {days}", f"{p.She} works {days} days this week.")
        elif stage == "bonus":
            bonus = 5 * _int(rng, 2, 20)
            value = work.said(sentences, f"{value} + {bonus}", f"{p.She} also gets a ${bonus} bonus.")
        elif stage == "rent":
            rent = _int(rng, 1, value - 2)
            if steps >= 5:  # what is left must halve exactly
                rent += (value - rent) % 2
            value = work.said(sentences, f"{value} - {rent}", f"{p.She} pays ${rent} for rent.")
        elif stage == "half":
            value = work.said(sentences, f"{value} / 2", f"{p.She} saves half of what is left.")
        else:
            gift = _int(rng, 5, 50)
            value = work.said(sentences, f"{value} + {gift}",
                              f"{p.her.capitalize()} grandmother adds ${gift} to {p.her} savings.")
        question = stage_question
    return " ".join(sentences) + " " + question


def _classroom(rng: np.random.Generator, steps: int, work: _Work) -> str:
    classes, size = _int(rng, 2, 8), _int(rng, 18, 32)
    value = work(f"{classes} * {size}")
    sentences = [f"A school has {classes} classes with {size} students each."]
    question = "How many students are there in total?"
    team = _int(rng, 3, 6)
    if steps >= 2:
        absent = _int(rng, 1, 15)
        if steps >= 3:  # the students present must split into whole teams
            absent += (value - absent) % team
        value = work.said(sentences, f"{value} - {absent}", f"Today {absent} students are absent.")
        question = "How many students are at school today?"
    if steps >= 3:
        value = work.said(sentences, f"{value} / {team}",
                          f"The students at school are split into teams of {team}.")
        question = "How many teams are there?"
    if steps >= 4:
        balls = _int(rng, 2, 5)
        value = work.said(sentences, f"{value} * {balls}", f"Each team gets {balls} balls.")
        question = "How many balls are handed out?"
    if steps >= 5:
        lost = _int(rng, 1, value - 1)
        value = work.said(sentences, f"{value} - {lost}", f"By the end of the day, {lost} balls are lost.")
        question = "How many balls are returned?"
    if steps >= 6:
        bought = 2 * _int(rng, 3, 20)
        value = work.said(sentences, f"{value} + {bought}", f"The school buys {bought} new balls.")
        question = "How many balls does the school have now?"
    return " ".join(sentences) + " " + question


_TEMPLATES: dict[str, Callable[[np.random.Generator, int, _Work], str]] = {
    "shopping": _shopping,
    "travel": _travel,
    "sharing": _sharing,
    "savings": _savings,
    "recipe": _recipe,
    "inventory": _inventory,
    "ages": _ages,
    "harvest": _harvest,
    "wages": _wages,
    "classroom": _classroom,
}
