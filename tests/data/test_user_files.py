"""A user's own task files and datasets are untrusted input: a bad file fails at ``gym.make`` naming
the file and line (not a traceback from inside ``datasets``), and a task without an answer is refused
at make, never scored against nothing."""

import json
import re

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.data import load_tasks

MATH = "benchmax/Math-v0"


def make_hf(path):
    return gym.make(MATH, tasks="hf", task_args={"dataset": str(path)}, python_tool=False)


@pytest.mark.parametrize("name, text, says", [
    ("bad_line.jsonl", '{"question": "q1", "answer": "1"}\n\n{"question": oops\n', r"bad_line\.jsonl line 3: not JSON"),
    # a byte-order mark (Windows editors write one) is not the error: line 3 is
    ("bom.jsonl", '\ufeff{"question": "q1", "answer": "1"}\n\n{"question": oops\n', r"bom\.jsonl line 3: not JSON"),
    ("not_object.jsonl", '{"question": "q1", "answer": "1"}\n[1, 2]\n', r"not_object\.jsonl line 2: expected a JSON object"),
    ("empty.jsonl", "", r"empty\.jsonl is empty"),
    ("ragged.csv", "question,answer\nq1,1\nq2,2,3\n", r"cannot read it as CSV: .*line 3"),
    ("broken.parquet", "not a parquet file", r"cannot read it as PARQUET: .*[Pp]arquet"),
])
def test_a_broken_local_dataset_fails_at_make_naming_the_file_and_line(tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=says) as raised:
        make_hf(path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize("tasks", [
    [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "What is 3 + 3?"}],
    [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "What is 3 + 3?", "answer": None}],
    [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "What is 3 + 3?", "answer": "  "}],
])
@pytest.mark.parametrize("env_id", [MATH, "benchmax/Wikipedia-v0"])
def test_a_task_without_an_answer_is_refused_at_make_naming_it(tasks, env_id):
    # (Math graded such a task against None: a reply of \boxed{None} scored 1.0)
    with pytest.raises(ValueError, match=r"tasks\[1\] \(id '1'\) has no answer"):
        gym.make(env_id, tasks=tasks)


def test_a_dataset_row_with_a_blank_answer_is_refused_at_make(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text('{"question": "q1", "answer": "1"}\n{"question": "q2", "answer": ""}\n')
    # refused naming the row: by the family's loader, or else at make (require_answers)
    with pytest.raises(ValueError, match=r"line 2: the answer field 'answer' is blank|id 'qa-1'\) has no answer"):
        make_hf(path)


def test_a_loaded_task_file_without_answers_is_refused_too(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2 + 2?"}) + "\n")
    with pytest.raises(ValueError, match=r"has no answer"):
        gym.make(MATH, tasks=load_tasks(path))


def test_load_tasks_names_the_file_and_line_of_a_bad_record(tmp_path):
    path = tmp_path / "tasks.jsonl"
    good = json.dumps({"prompt": "p", "answer": "1"})
    path.write_text(f"{good}\n\n{good}\n[1]\n")
    with pytest.raises(ValueError, match=r"tasks\.jsonl' line 4: "):
        load_tasks(path)
    calls = {"prompt": "", "answer": "1", "messages": [{"role": "user", "content": "x"},
                                                        {"role": "assistant", "content": "", "tool_calls": 5},
                                                        {"role": "tool", "tool_call_id": "c", "content": "r"}]}
    path.write_text(json.dumps(calls) + "\n")
    with pytest.raises(ValueError, match=r"line 1: .*\['tool_calls'\] must be a list of calls, got int"):
        load_tasks(path)
    with pytest.raises(ValueError, match=r"is a directory, not a JSON Lines file"):
        load_tasks(tmp_path)


def test_a_missing_tasks_file_is_said_to_be_one_naming_what_it_is(tmp_path):
    """A raw ``[Errno 2] No such file or directory`` named the file but not that it was the tasks;
    the error is still an OSError (callers that catch one keep working)."""
    from benchmax_gym.core.tasks import numbered_jsonl

    missing = tmp_path / "tasks.jsonl"
    with pytest.raises(FileNotFoundError, match=rf"^tasks: no such file '{re.escape(str(missing))}'$"):
        load_tasks(missing)
    with pytest.raises(FileNotFoundError, match=r"^RUN: no such file '.*nope\.jsonl'$"):
        numbered_jsonl(tmp_path / "nope.jsonl", "RUN")


def test_a_csv_dataset_keeps_its_cells_as_the_text_they_hold(tmp_path):
    """pandas' guesses changed answers (007 became 7.0, 1.50 became 1.5, NA and None missing):
    every cell is read as its text; only an empty one is missing."""
    from benchmax_gym.core import load_records

    path = tmp_path / "qa.csv"
    path.write_text('question,answer,note\nq1,007,\nq2,1.50,x\nq3,NA,\n"q,4",None,"a\nb"\n')
    assert list(load_records(path)) == [
        {"question": "q1", "answer": "007", "note": None}, {"question": "q2", "answer": "1.50", "note": "x"},
        {"question": "q3", "answer": "NA", "note": None}, {"question": "q,4", "answer": "None", "note": "a\nb"}]
    path.write_text("question,answer\nWhat is 3 / 2 to two places?,1.50\n")
    env = make_hf(path)
    assert env.unwrapped.tasks.get(0).answer == "1.50"
    env.close()


@pytest.mark.parametrize("ids, clash, lines", [
    ([1, "1"], r"tasks\[0\] and tasks\[1\] share the id '1'", r"jsonl' line 1 and line 2 share the id '1'"),
    (["a", "b", None, "2"], r"tasks\[2\] and tasks\[3\] share the id '2'", r"jsonl' line 3 and line 4 share the id '2'")])
def test_two_tasks_with_one_id_are_refused_at_make(tmp_path, ids, clash, lines):
    """Eval's records and statistics tell tasks apart by id: two tasks sharing one (1 and "1", or a
    task without an id at index 2 and an explicit "2") were pooled as one task."""
    tasks = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), **({"id": t} if t is not None else {})}
             for i, t in enumerate(ids)]
    with pytest.raises(ValueError, match=clash):
        gym.make(MATH, tasks=tasks)
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    with pytest.raises(ValueError, match=lines):
        load_tasks(path)
