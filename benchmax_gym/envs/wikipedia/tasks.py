"""Wikipedia tasks: generated multi-hop questions (the offline default), HotpotQA and Bamboogle.

* generated - questions over the seeded fictional :class:`Encyclopedia` (bridge and comparison,
  2-4 supporting articles). The encyclopedia of a ``(seed, entities)`` pair is built once per
  process and shared by every task and episode, so a reset costs a question, not a world.
* HotpotQA - the original JSON layout (``question``, ``answer``, ``type``, ``supporting_facts``,
  ``context``). Its context paragraphs are also a corpus (:func:`load_corpus`): with the ``local``
  backend over them the sample is a complete offline benchmark.
* Bamboogle - ``{Question, Answer}`` records (JSON array or JSON Lines), meant for the live backend.

A task's ``solution`` holds the supporting titles, in reading order, for the reference solver;
neither they nor the answer appear in ``metadata``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmax_gym.core.checks import (
    Checked, arg, config_of, existing_file, int_between, number_between, optional, positive_int,
)
from benchmax_gym.core.sources import GeneratedSource, SourceConfig
from benchmax_gym.core.tasks import (
    GeneratedTasks, ListTasks, Task, check_unique_ids, numbered_jsonl, starts_json_array,
)
from benchmax_gym.envs.wikipedia.backends import file_key, title_key
from benchmax_gym.envs.wikipedia.encyclopedia import Encyclopedia
from benchmax_gym.envs.wikipedia.rubric import normalize_answer


@dataclass(frozen=True)
class WikiTaskConfig(Checked):
    """Knobs of the generated encyclopedia and its questions.

    Attributes:
        entities: articles about entities in the encyclopedia (30-20000); more means more distractors.
        min_hops, max_hops: supporting articles per question (2-4).
        comparison: the share of comparison questions (the rest are bridge questions).
    """

    entities: int = arg(300, int_between(30, 20_000))
    min_hops: int = arg(2, int_between(2, 4))
    max_hops: int = arg(4, int_between(2, 4))
    comparison: float = arg(0.3, number_between(0.0, 1.0, " (a probability)"))

    def __post_init__(self):
        super().__post_init__()
        if self.min_hops > self.max_hops:
            raise ValueError(f"min_hops ({self.min_hops}) must not exceed max_hops ({self.max_hops})")


@functools.lru_cache(maxsize=8)
def encyclopedia(seed: int, entities: int) -> Encyclopedia:
    """The shared encyclopedia of ``seed`` (built once per process)."""
    return Encyclopedia(seed, entities)


@dataclass(frozen=True)
class GeneratedQuestions(GeneratedSource):
    """``tasks="generated"``: questions over the encyclopedia of ``task_seed``; ``difficulty`` is a
    :class:`WikiTaskConfig` or a dict of its fields."""

    difficulty: WikiTaskConfig = arg(None, config_of(WikiTaskConfig))

    def make_task(self, rng: np.random.Generator, index: int) -> Task:
        config = self.difficulty
        q = encyclopedia(self.task_seed, config.entities).question(rng, config.min_hops, config.max_hops,
                                                                   config.comparison)
        solution = {"supporting": list(q.supporting), **({"options": list(q.options)} if q.options else {})}
        return Task(
            id=f"gen-{index}", prompt=q.question, answer=q.answer, solution=solution,
            metadata={"source": "generated", "type": q.type, "hops": len(q.supporting)},
        )


def generated_tasks(config: WikiTaskConfig | None = None, *, seed: int = 0, size: int | None = None) -> GeneratedTasks:
    """Questions over the encyclopedia of ``seed``: item ``i`` is always the same question."""
    return GeneratedQuestions(difficulty=config, num_tasks=size, task_seed=seed).build(None)


@dataclass(frozen=True)
class QuestionFile(SourceConfig):
    """Questions from a local file: ``dataset`` (checked to exist at make) and ``limit``."""

    dataset: str = arg(MISSING, existing_file)
    limit: int | None = arg(None, optional(positive_int))


@dataclass(frozen=True)
class HotpotQA(QuestionFile):
    """``tasks="hotpotqa"``: a HotpotQA file in its original JSON layout."""

    name = "hotpotqa"

    def build(self, env: Any) -> ListTasks:
        return hotpotqa_tasks(self.dataset, limit=self.limit)


@dataclass(frozen=True)
class Bamboogle(QuestionFile):
    """``tasks="bamboogle"``: ``{Question, Answer}`` records (JSON array or JSON Lines)."""

    name = "bamboogle"

    def build(self, env: Any) -> ListTasks:
        return bamboogle_tasks(self.dataset, limit=self.limit)


@dataclass(frozen=True)
class TaskFile(QuestionFile):
    """``tasks="file"``: tasks in benchmax-gym's JSON Lines (``{id, prompt or messages, answer,
    solution: {supporting: [titles]}, metadata}``), as ``benchmax-gym tasks from-corpus`` writes
    them; played over ``backend="local"`` with ``backend_args={"corpus": the documents}``."""

    name = "file"

    def build(self, env: Any) -> ListTasks:
        from benchmax_gym.data import load_tasks

        tasks = load_tasks(self.dataset).tasks
        return ListTasks(tasks[:self.limit] if self.limit else tasks)


def _read_json_records(path: str | os.PathLike, what: str = "dataset", limit: int | None = None
                       ) -> list[tuple[str, Any]]:
    """``(where, record)`` of a JSON array (or one JSON value), or JSON Lines: ``where`` is how a
    user finds the record, ``"line N"`` of JSON Lines (as an editor numbers them, blank lines
    counted) or ``"record N"`` of an array (counted from 1). A line that is not UTF-8 JSON is an
    error naming the file and that line (as :func:`benchmax_gym.data.load_tasks` names them). With a
    ``limit``, JSON Lines are read only as far as its first ``limit`` records (a bad line past them
    is never read); an array is still parsed whole."""
    file = Path(path)
    if file.exists() and not file.is_file():  # a FIFO or a device: reading it blocked, or never ended
        raise ValueError(f"{what} {str(path)!r} is not a regular file")
    if not file.exists():
        raise FileNotFoundError(f"{what} {str(path)!r}: no such file")
    if limit is not None and not starts_json_array(file):
        try:
            return [(f"line {number}", record) for number, record in numbered_jsonl(file, what, limit=limit)]
        except ValueError:  # one JSON value over several lines, or a bad line: read whole, as without a limit
            pass
    raw = file.read_bytes()
    try:
        data = json.loads(raw)  # (bytes: a byte-order mark is read as one)
        return [(f"record {i}", record) for i, record in enumerate(data if isinstance(data, list) else [data], 1)]
    except RecursionError:
        raise ValueError(f"{what} {path}: JSON nested too deeply to read") from None  # (as data.corpus says it)
    except UnicodeDecodeError as exc:  # (as data.corpus says it, with the line)
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{what} {path}: not UTF-8 text (line {line}, byte {exc.start}); save it as UTF-8") from None
    except ValueError as exc:
        if raw.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"[":  # an array: its error names the line
            raise ValueError(f"{what} {str(path)!r} is not a JSON array: {exc}") from None
    del raw
    return [(f"line {number}", record) for number, record in numbered_jsonl(file, what)]


def _first_records(path: str | os.PathLike, limit: int | None) -> list[tuple[str, Any]]:
    """``(where, record)`` of the file's first ``limit`` records (all of them for None), ``where``
    naming the file and the record's line (or place in an array)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    records = _read_json_records(path, limit=limit)
    if not records:  # (was "tasks must not be empty", naming neither the argument nor the file)
        raise ValueError(f"dataset {str(path)!r} holds no questions")
    return [(f"dataset {str(path)!r} {place}", r) for place, r in (records[:limit] if limit else records)]


def hotpotqa_tasks(path: str | os.PathLike, *, limit: int | None = None) -> ListTasks:
    """HotpotQA questions in the original JSON layout (json.load: ``context`` mixes strings and
    lists, which Arrow-based loaders cannot hold)."""
    tasks, places = [], []
    for i, (where, r) in enumerate(_first_records(path, limit)):
        if not isinstance(r, Mapping):
            raise ValueError(f"{where}: not a HotpotQA question (a JSON object), got {type(r).__name__}")
        missing = [k for k in ("question", "answer", "supporting_facts") if k not in r]
        if missing:
            raise ValueError(f"{where}: lacks HotpotQA field(s) {missing}")
        try:
            supporting = list(dict.fromkeys(str(title) for title, _ in r["supporting_facts"]))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: supporting_facts must be [title, sentence] "
                             f"pairs, got {r['supporting_facts']!r:.200}") from None
        tasks.append(Task(
            id=str(r.get("_id") or f"hotpotqa-{i}"), prompt=str(r["question"]), answer=_gold(r["answer"], where),
            solution={"supporting": supporting},
            metadata={"source": "hotpotqa", "type": r.get("type"), "level": r.get("level")},
        ))
        places.append(where)
    check_unique_ids(tasks, place=places.__getitem__)  # (two records with one _id: named by their places)
    return ListTasks(tasks)


def bamboogle_tasks(path: str | os.PathLike, *, limit: int | None = None) -> ListTasks:
    """Bamboogle-style ``{Question, Answer}`` records (any capitalisation of the two keys)."""
    tasks = []
    for i, (where, r) in enumerate(_first_records(path, limit)):
        fields = {str(k).lower(): v for k, v in r.items()} if isinstance(r, Mapping) else {}
        if "question" not in fields or "answer" not in fields:
            raise ValueError(f"{where}: needs Question and Answer fields")
        tasks.append(Task(
            id=f"bamboogle-{i}", prompt=str(fields["question"]), answer=_gold(fields["answer"], where),
            solution={"supporting": list(fields.get("supporting", []))}, metadata={"source": "bamboogle"},
        ))
    return ListTasks(tasks)


def _gold(answer: Any, where: str) -> str | list[str]:
    """An answer as the rubric compares it: text, or a non-empty list of aliases (a number in
    the file, ``"Answer": 1875``, is its text: graded as it was, the right answer scored 0).
    A null answer stays None, which the environment refuses naming the task (as text it was the
    gold "None"); one with no words to compare (".") is refused here: every reply scored 0."""
    if isinstance(answer, (list, tuple)):
        aliases = [str(a) for a in answer if a is not None and normalize_answer(str(a), keep_articles=True)]
        if not aliases:
            raise ValueError(f"{where}: has no answer (got {answer!r})")
        return aliases
    if answer is None or not str(answer).strip():
        return answer
    if not normalize_answer(str(answer), keep_articles=True):
        raise ValueError(f"{where}: has no words in its answer {answer!r} to grade")
    return str(answer)


def load_corpus(path: str | os.PathLike) -> tuple[list[dict[str, str]], str]:
    """``({title, text} records, a hash of the file)`` from JSON Lines or a JSON array of
    ``{title, text}`` records, or from a HotpotQA file (its context paragraphs; the first
    paragraph of a title wins); or from a folder or file of documents (text, Markdown, HTML:
    :func:`benchmax_gym.data.corpus.load_documents`), hashed by their content. A document given
    twice (one title, one text) is kept once; see :func:`read_corpus`."""
    records, key, _ = read_corpus(path)
    return records, key


def read_corpus(path: str | os.PathLike) -> tuple[list[dict[str, str]], str, int]:
    """:func:`load_corpus`'s records and hash, and how many duplicates it dropped. Two records of
    one title (as the index compares titles: case and spacing aside) and one text are one
    document: the second is dropped (indexed twice, search returned both, spending the model's
    context on the same text). Two ``{title, text}`` records of one title with different texts are
    refused naming both places (the index keeps one article a title: the second was silently
    never searchable); a HotpotQA question's context paragraph of a title seen before is dropped,
    its first paragraph wins (the benchmark's own paragraphs, which the questions are about)."""
    file = Path(path)
    if _documents(file):  # your documents (benchmax_gym.data.corpus)
        from benchmax_gym.data.corpus import corpus_records, read_documents
        from benchmax_gym.envs.wikipedia.backends import records_digest

        documents, dropped = read_documents(file)
        records = corpus_records(documents)
        return records, records_digest(records), dropped
    corpus: list[dict[str, str]] = []
    seen: dict[str, tuple[str, str, bool]] = {}  # title key -> (where, text, from a {title, text} record)
    dropped = 0

    def add(title: str, text: str, where: str, own: bool) -> None:
        nonlocal dropped
        key = title_key(title.strip())
        first = seen.get(key) if key else None
        if first is None:
            if key:
                seen[key] = (where, text, own)
            corpus.append({"title": title, "text": text})
        elif first[1].strip() == text.strip() or not (own and first[2]):
            dropped += 1  # the same document again (or a HotpotQA paragraph: the first wins)
        else:
            raise ValueError(f"corpus {str(path)!r} {first[0]} and {where} both hold the title {title!r}, with "
                             "different texts: the index keeps one article a title; give each its own title "
                             "or merge their texts")

    for place, r in _read_json_records(file, "corpus"):
        where = f"corpus {str(path)!r} {place}"
        if isinstance(r, Mapping) and "context" in r:
            try:
                paragraphs = [(str(t), "".join(map(str, sentences)).strip()) for t, sentences in r["context"]]
            except (TypeError, ValueError):
                raise ValueError(f"{where}: context must be [title, [sentences]] pairs, "
                                 f"got {r['context']!r:.200}") from None
            for title, text in paragraphs:
                add(title, text, place, False)
        elif isinstance(r, Mapping) and "title" in r and "text" in r:
            title, text = r["title"], r["text"]  # (null or a list was indexed as the text "None", "['a']")
            if not isinstance(text, str):
                raise ValueError(f"{where}: 'text' must be text, got {_kind(text)}")
            if not isinstance(title, (str, int, float)) or isinstance(title, bool):
                raise ValueError(f"{where}: 'title' must be text, got {_kind(title)}")
            add(str(title), text, place, True)
        else:
            raise ValueError(f"{where}: neither {{title, text}} nor a HotpotQA question")
    if not corpus:
        raise ValueError(f"corpus {str(path)!r} has no articles")
    return corpus, file_key(file), dropped


def lazy_corpus(path: str | os.PathLike) -> tuple[Callable[[], list[dict[str, str]]], str]:
    """:func:`load_corpus` with the records loaded only when called: a JSON corpus is keyed by its
    bytes alone, read in chunks, so an environment over an index already built never parses it
    (a 190 MB corpus once cost every ``gym.make`` 1.2 s and 600 MB); documents are read to be keyed."""
    if _documents(Path(path)):
        records, key = load_corpus(path)
        return (lambda: records), key
    return (lambda: load_corpus(path)[0]), file_key(path)


def _documents(file: Path) -> bool:
    """Whether ``file`` is documents (a folder, text, Markdown, HTML) rather than a JSON corpus."""
    return file.is_dir() or file.suffix.lower() not in (".json", ".jsonl")


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {json.dumps(value, default=str)[:60]}"
