"""Math datasets: GSM8K, MATH-500 and any question/answer dataset (hub ids or local files)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any

from benchmax_gym.core.checks import boolean, optional, path_or_id, positive_int, text
from benchmax_gym.core.sources import SourceConfig, arg
from benchmax_gym.core.tasks import DatasetTasks, Task, record_where


_GSM8K_MARK = re.compile(r"<<([^<>]*)>>")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")


def gsm8k_gold(solution: str) -> str | None:
    """The number after ``#### `` in a GSM8K answer, without thousands separators (``1,600``)."""
    _, sep, tail = str(solution).rpartition("####")
    if not sep:
        return None
    gold = tail.strip().splitlines()[0].strip() if tail.strip() else ""
    return gold.replace(",", "") or None


def gsm8k_steps(solution: str) -> list[str]:
    """The expressions of GSM8K's calculator marks ``<<expr=result>>`` (the ``expr`` parts)."""
    return [m.rpartition("=")[0].strip() for m in _GSM8K_MARK.findall(str(solution)) if "=" in m]


def gsm8k_tasks(
    path: str | os.PathLike | Sequence[str | os.PathLike] = "openai/gsm8k",
    *,
    split: str | None = None,
    limit: int | None = None,
) -> DatasetTasks:
    """GSM8K (hub config ``main``, split ``train`` by default) or local files in its format."""

    def to_task(record: Mapping[str, Any], index: int) -> Task | None:
        _require(record, ("question", "answer"), path)
        gold = gsm8k_gold(record["answer"])
        if gold is None:
            return None
        return Task(
            id=f"gsm8k-{index}",
            prompt=_question(record["question"], "question", index, path),
            answer=gold,
            solution=gsm8k_steps(record["answer"]),
            metadata={"source": "gsm8k"},
        )

    name = None if _is_local(path) else "main"
    return DatasetTasks(path, to_task, split=split or "train", name=name, limit=limit)


_LATEX_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d+)?|\.\d+)")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac(?:\{([+-]?\d+)\}\{(\d+)\}|(\d)(\d))")


def numeric_expression(answer: str) -> str | None:
    """A calculator expression for a LaTeX answer that is a plain number, else None.

    Accepts integers, decimals, negatives, thousands separators (``10{,}000``, ``10\\!000``,
    ``1,600``) and simple fractions (``\\frac{14}{3}``, ``-\\dfrac{3}{2}``, ``\\frac12``).
    """
    text = str(answer).strip().strip("$").replace("\\!", "").replace("{,}", ",").replace("\\,", ",")
    text = re.sub(r"\s+", "", text)
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if _LATEX_NUMBER.fullmatch(text):
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("+-")
        if "." not in digits:
            return sign + str(int(digits))  # "007" is not a Python literal
        return sign + ("0" + digits if digits.startswith(".") else digits)
    match = _LATEX_FRACTION.fullmatch(text)
    if match:
        sign = match.group(1)
        num, den = match.group(2) or match.group(4), match.group(3) or match.group(5)
        if int(den) == 0:
            return None
        negative = (sign == "-") != num.startswith("-")
        return f"{'-' if negative else ''}{int(num.lstrip('+-'))}/{int(den)}"
    return None


def math500_tasks(
    path: str | os.PathLike | Sequence[str | os.PathLike] = "HuggingFaceH4/MATH-500",
    *,
    split: str | None = None,
    limit: int | None = None,
    numeric_only: bool = False,
) -> DatasetTasks:
    """MATH-500 (split ``test`` on the hub) with LaTeX gold answers graded by math-verify.

    Problems whose answer is a number also get ``solution=[expression]`` for the calculator;
    ``numeric_only=True`` keeps only those.
    """

    def to_task(record: Mapping[str, Any], index: int) -> Task | None:
        _require(record, ("problem", "answer"), path)
        _answered(record["answer"], "answer", index, path)
        answer = str(record["answer"])
        expression = numeric_expression(answer)
        if numeric_only and expression is None:
            return None
        return Task(
            id=str(record.get("unique_id") or f"math500-{index}"),
            prompt=_question(record["problem"], "problem", index, path),
            answer=answer,
            solution=[expression] if expression is not None else None,
            metadata={
                "source": "math500",
                "subject": record.get("subject"),
                "level": record.get("level"),
            },
        )

    default_split = "train" if _is_local(path) else "test"  # local JSON files load as "train"
    return DatasetTasks(path, to_task, split=split or default_split, limit=limit)


def hf_tasks(
    path: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    question_field: str = "question",
    answer_field: str = "answer",
    split: str | None = None,
    name: str | None = None,
    limit: int | None = None,
    answer_transform: Callable[[Any], Any] | None = None,
) -> DatasetTasks:
    """Any dataset with a question and an answer field (hub id or local files).

    ``answer_transform`` turns the raw answer into the gold answer (e.g. :func:`gsm8k_gold`);
    records it maps to ``None`` are skipped. By default the answer is the field's text, stripped.
    """
    label = _label(path)
    transform = answer_transform or (lambda value: str(value).strip())

    def to_task(record: Mapping[str, Any], index: int) -> Task | None:
        _require(record, (question_field, answer_field), path)
        _answered(record[answer_field], answer_field, index, path)
        gold = transform(record[answer_field])
        if gold is None:
            return None
        return Task(
            id=f"{label}-{index}",
            prompt=_question(record[question_field], question_field, index, path),
            answer=gold,
            metadata={"source": label},
        )

    return DatasetTasks(path, to_task, split=split, name=name, limit=limit)


def _require(record: Mapping[str, Any], fields: Sequence[str], path: Any) -> None:
    missing = [f for f in fields if f not in record]
    if missing:
        raise ValueError(
            f"dataset {_label(path)!r} has no field {', '.join(map(repr, missing))}; "
            f"available fields: {', '.join(map(repr, record))}"
        )


def _answered(value: Any, field: str, index: int, path: Any) -> None:
    """A record's answer is there: null (what ``datasets`` fills in for a missing key) or blank
    would become the gold text ``"None"`` or ``""``, which a reply could match."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{record_where(path, index)}: the answer field {field!r} is "
                         f"{'null' if value is None else 'blank'}; every task needs an answer")


def _question(value: Any, field: str, index: int, path: Any) -> str:
    """A record's question as the prompt's text: text or a number; a list, a mapping, null or
    blank would become a prompt such as ``"['a']"`` or ``"None"``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        got = "null" if value is None else "blank" if isinstance(value, str) else type(value).__name__
        raise ValueError(f"{record_where(path, index)}: the question field {field!r} must be "
                         f"text, got {got}")
    return str(value)


def _is_local(path: Any) -> bool:
    paths = path if isinstance(path, (list, tuple)) else [path]
    return all(os.path.exists(os.fspath(p)) for p in paths)


def _label(path: Any) -> str:
    """A short name for ids and metadata: ``openai/gsm8k`` -> ``gsm8k``, ``a/x.jsonl`` -> ``x``."""
    first = path[0] if isinstance(path, (list, tuple)) and path else path
    text = os.fspath(first).rstrip("/\\")
    base = os.path.basename(text) or text
    return base.split(".")[0] if _is_local(path) else base


# -- typed sources (``tasks="gsm8k"``, ``task_args={...}``) ------------------------------------


@dataclass(frozen=True)
class MathDataset(SourceConfig):
    """A dataset by hub id or local files: ``dataset``, ``split``, at most ``limit`` tasks."""

    dataset: Any = arg(MISSING, path_or_id)
    split: str | None = arg(None, optional(text))
    limit: int | None = arg(None, optional(positive_int))


@dataclass(frozen=True)
class GSM8K(MathDataset):
    """``tasks="gsm8k"``: the hub's ``openai/gsm8k`` or local files in its format."""

    name = "gsm8k"
    dataset: Any = arg("openai/gsm8k", path_or_id)

    def build(self, env: Any) -> DatasetTasks:
        return gsm8k_tasks(self.dataset, split=self.split, limit=self.limit)


@dataclass(frozen=True)
class MATH500(MathDataset):
    """``tasks="math500"``: MATH-500; ``numeric_only`` keeps problems whose answer is a number."""

    name = "math500"
    dataset: Any = arg("HuggingFaceH4/MATH-500", path_or_id)
    numeric_only: bool = arg(False, boolean)

    def build(self, env: Any) -> DatasetTasks:
        return math500_tasks(self.dataset, split=self.split, limit=self.limit, numeric_only=self.numeric_only)


@dataclass(frozen=True)
class HFDataset(MathDataset):
    """``tasks="hf"``: any dataset with a question and an answer field."""

    name = "hf"
    question_field: str = arg("question", text)
    answer_field: str = arg("answer", text)

    def build(self, env: Any) -> DatasetTasks:
        return hf_tasks(self.dataset, question_field=self.question_field, answer_field=self.answer_field,
                        split=self.split, limit=self.limit)
