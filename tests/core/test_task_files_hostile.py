"""A user's own dataset files (``tasks="hf"``, ``DatasetTasks``) are untrusted input: a line that
is not UTF-8, JSON nested past the parser's depth, or a FIFO in place of a file fails at
``gym.make`` in one line naming the file (and line), never as a bare traceback or a wrong reason.
And a source that keeps only its first tasks (eval's ``--tasks N``) reads only those rows of a
Parquet file, with exactly the records, ids and digests of the full load."""

import os

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import DatasetTasks, Task, task_digest

MATH = "benchmax/Math-v0"


def make_hf(path, **task_args):
    return gym.make(MATH, tasks="hf", task_args={"dataset": str(path), **task_args}, python_tool=False)


def refusal(path) -> str:
    with pytest.raises(ValueError) as raised:
        make_hf(path)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_line_that_is_not_utf8_is_refused_naming_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "q1", "answer": "1"}\n\n{"question": "caf\xe9?", "answer": "2"}\n')
    assert "latin1.jsonl line 3: not UTF-8 text" in refusal(path)


@pytest.mark.parametrize("opener, closer", [("[", "]"), ('{"a": ', "}")], ids=["arrays", "objects"])
def test_json_nested_too_deeply_is_refused_naming_the_file_and_line(tmp_path, opener, closer):
    """(pyarrow's JSON reader, which datasets uses, crashed the process on this line.)"""
    path = tmp_path / "deep.jsonl"
    path.write_text('{"question": "q1", "answer": "1"}\n\n'
                    '{"question": "q2", "answer": "2", "x": ' + opener * 30_000 + "1" + closer * 30_000 + "}\n")
    assert "deep.jsonl line 3: JSON nested too deeply to read" in refusal(path)


def test_a_line_with_many_brackets_but_little_depth_is_read(tmp_path):
    path = tmp_path / "wide.jsonl"
    path.write_text('{"question": "q1", "answer": "1", "pairs": ' + str([[i, i] for i in range(3000)]) + "}\n")
    env = make_hf(path)
    assert env.unwrapped.tasks[0].prompt == "q1"



@pytest.mark.parametrize("question, got", [('["a"]', "list"), ('{"q": "a"}', "dict"), ("null", "null"), ('"  "', "blank")])
def test_a_question_that_is_not_text_is_refused_naming_the_field(tmp_path, question, got):
    """(A list became the prompt "['a']", null the prompt "None".)"""
    path = tmp_path / "odd.jsonl"
    path.write_text('{"question": "q1", "answer": "1"}\n{"question": ' + question + ', "answer": "2"}\n')
    with pytest.raises(ValueError, match=f"odd.jsonl' line 2: the question field 'question' must be text, got {got}$"):
        make_hf(path)

@pytest.mark.parametrize("in_folder", [False, True])
def test_a_fifo_is_refused_as_not_a_regular_file(tmp_path, in_folder):
    fifo = tmp_path / "tasks.jsonl"
    os.mkfifo(fifo)
    message = refusal(tmp_path if in_folder else fifo)
    assert f"{fifo} is not a regular file" in message, message


def _mixed_parquet(path, rows=60):
    """int, float, None, text, list and struct columns, over several row groups."""
    records = [{"question": f"What is {i} + {i}?", "answer": str(2 * i) if i % 7 else None,
                "level": i % 4 if i % 3 else None, "score": i / 7 if i % 2 else None,
                "tags": [f"t{i}", None] if i % 4 else [], "nothing": None,
                "extra": {"n": i, "weights": [1.5, None]} if i % 5 else None}
               for i in range(rows)]
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=8)


def _to_task(record, index):
    if record["answer"] is None:  # skipped: the limit counts tasks, not records
        return None
    return Task(id=f"mixed-{index}", prompt=record["question"], answer=record["answer"],
                metadata={"level": record["level"]}, private=dict(record))


def test_the_first_n_tasks_of_a_parquet_file_are_those_of_the_full_load_without_converting_it(
        tmp_path, monkeypatch):
    import datasets

    cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    path = tmp_path / "mixed.parquet"
    _mixed_parquet(path)
    limited = {n: DatasetTasks(str(path), _to_task, limit=n) for n in (1, 5, 20, 1000)}
    assert not list(cache.rglob("*.arrow")), "a limited load converted the whole file to Arrow"
    full = DatasetTasks(str(path), _to_task)
    assert list(cache.rglob("*.arrow")), "the full load is datasets' (this test compares with it)"
    assert len(full) == 51
    for n, source in limited.items():
        assert source.tasks == full.tasks[:n]
        assert [task_digest(t) for t in source.tasks] == [task_digest(t) for t in full.tasks[:n]]
    assert limited[1000].content_hash() == full.content_hash()
    assert limited[5].tasks[2].private == {"question": "What is 3 + 3?", "answer": "6", "level": None,
                                          "score": 3 / 7, "tags": ["t3", None], "nothing": None,
                                          "extra": {"n": 3, "weights": [1.5, None]}}


def test_a_limited_parquet_load_through_make_has_the_full_loads_first_tasks(tmp_path):
    path = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"question": [f"q{i}" for i in range(30)], "answer": [str(i) for i in range(30)]}),
                   path, row_group_size=4)
    full, limited = make_hf(path), make_hf(path, limit=6)
    tasks = [limited.unwrapped.tasks[i] for i in range(len(limited.unwrapped.tasks))]
    assert tasks == [full.unwrapped.tasks[i] for i in range(6)]
    assert [t.id for t in tasks] == [f"qa-{i}" for i in range(6)]


def test_a_broken_parquet_file_with_a_limit_is_still_refused_in_one_line(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_text("not a parquet file")
    with pytest.raises(ValueError, match=r"cannot read it as PARQUET: .*[Pp]arquet") as raised:
        make_hf(path, limit=3)
    assert "\n" not in str(raised.value)
