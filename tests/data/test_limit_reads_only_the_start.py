"""A user's big task file (or folder of files) with a ``limit`` (eval's ``--tasks N``,
``task_args={"limit": N}``) is read only as far as its first N tasks: a bad line past them is never
read, so it cannot fail the load, and the tasks are those a full read gives. A bad line before the
limit still fails, naming the file and line."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmax_gym.core.tasks import _first_jsonl_rows, _first_parquet_rows, load_records, task_digest
from benchmax_gym.envs.crm.tasks import crmarena_tasks
from benchmax_gym.envs.math.datasets import gsm8k_tasks
from benchmax_gym.envs.wikipedia.tasks import hotpotqa_tasks

BROKEN = '{"question": oops\n'


def write_lines(path, rows, broken_at=None):
    """``rows`` as JSON Lines, with a line that is not JSON before row ``broken_at`` if given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row) + "\n" for row in rows]
    if broken_at is not None:
        lines.insert(broken_at, BROKEN)
    path.write_text("".join(lines))
    return path


def gsm8k_row(i):
    return {"question": f"Tom has {i} apples and buys 2 more. How many now?",
            "answer": f"{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}"}


def test_math_reads_a_folder_of_jsonl_files_only_as_far_as_its_limit(tmp_path):
    """The limit's tasks span the folder's first two files (read in name order); the second file
    breaks after them, the third (never opened) too: the full load failed on either."""
    sizes = {"part-0.jsonl": 3, "part-1.jsonl": 2000, "part-2.jsonl": 2000}
    start = {name: sum(list(sizes.values())[:k]) for k, name in enumerate(sizes)}
    for name in ("part-2.jsonl", "part-1.jsonl", "part-0.jsonl"):  # (created out of name order)
        rows = [gsm8k_row(start[name] + i) for i in range(sizes[name])]
        write_lines(tmp_path / "broken" / name, rows, broken_at=None if name == "part-0.jsonl" else 100)
        write_lines(tmp_path / "whole" / name, rows)

    limited = gsm8k_tasks(str(tmp_path / "broken"), split="train", limit=5).tasks
    whole = gsm8k_tasks(str(tmp_path / "whole"), split="train").tasks[:5]  # read whole, as before
    assert [t.id for t in limited] == [t.id for t in whole] == [f"gsm8k-{i}" for i in range(5)]
    assert [task_digest(t) for t in limited] == [task_digest(t) for t in whole]
    assert [t.answer for t in limited] == ["2", "3", "4", "5", "6"]

    with pytest.raises(ValueError, match=r"part-1\.jsonl line 101: not JSON"):  # (before the limit: still read)
        gsm8k_tasks(str(tmp_path / "broken"), split="train", limit=200)


def hotpotqa_row(i):
    title = f"Article {i}"
    return {"_id": f"q{i}", "question": f"Who wrote article {i}?", "answer": f"Author {i}", "type": "bridge",
            "level": "easy", "supporting_facts": [[title, 0]], "context": [[title, [f"Author {i} wrote it."]]]}


def crmarena_row(i):
    return {"idx": i, "task": "knowledge_qa", "query": f"What is policy {i}?", "answer": f"Policy {i}",
            "reward_metric": "fuzzy_match", "metadata": {"required": "Today's date: 2025-01-01"}}


@pytest.mark.parametrize("load, row, ids, broken_at", [
    (hotpotqa_tasks, hotpotqa_row, "q{}", 2000),
    (crmarena_tasks, crmarena_row, "crmarena-{}", 10),
], ids=["wikipedia-hotpotqa", "crm-crmarena"])
def test_a_jsonl_task_file_is_read_only_as_far_as_its_limit(tmp_path, load, row, ids, broken_at):
    rows = [row(i) for i in range(3000)]
    broken = write_lines(tmp_path / "tasks.jsonl", rows, broken_at=broken_at)

    tasks = load(broken, limit=5).tasks
    whole = load(write_lines(tmp_path / "whole.jsonl", rows)).tasks[:5]
    assert [t.id for t in tasks] == [t.id for t in whole] == [ids.format(i) for i in range(5)]
    assert [task_digest(t) for t in tasks] == [task_digest(t) for t in whole]

    with pytest.raises(ValueError, match=rf"tasks\.jsonl' line {broken_at + 1}: not JSON"):  # (before the limit)
        load(broken, limit=broken_at + 1)


def test_hotpotqa_arrays_and_one_object_over_several_lines_are_read_whole_as_before(tmp_path):
    rows = [hotpotqa_row(i) for i in range(10)]
    array = tmp_path / "array.json"
    array.write_text(json.dumps(rows, indent=1))
    assert [t.id for t in hotpotqa_tasks(array, limit=3).tasks] == ["q0", "q1", "q2"]
    single = tmp_path / "single.json"
    single.write_text(json.dumps(rows[7], indent=2))
    assert [t.id for t in hotpotqa_tasks(single, limit=3).tasks] == ["q7"]


def first(rows, n):
    out = []
    for row in rows:
        out.append(row)
        if len(out) == n:
            break
    return out


def typed(rows):
    """Each record field by field, with each value's type: equal rows are equal in both."""
    return [[(key, type(value).__name__, value) for key, value in row.items()] for row in rows]


def varied_row(i):
    row = {"q": f"q{i}", "n": i, "x": i + 0.5, "ok": i % 2 == 0, "when": f"2021-03-{1 + i % 28:02d}",
           "tags": [i, i + 1], "nothing": None}
    if i % 3:
        row["extra"] = f"e{i}"  # (a key some rows lack: None in those)
    return row


def test_a_folder_of_jsonl_files_gives_the_first_records_datasets_gives(tmp_path):
    folder = tmp_path / "jsonl"
    for name, span in (("c.jsonl", range(7, 12)), ("a.jsonl", range(4)), ("b.jsonl", range(4, 7))):
        write_lines(folder / name, [varied_row(i) for i in span])

    fast = _first_jsonl_rows(str(folder), None, {}, 10)
    assert fast is not None  # (the full load's way: every file converted first)
    rows = first(fast, 10)
    whole = datasets.load_dataset("json", data_files=str(folder / "*.jsonl"), split="train",
                                  cache_dir=str(tmp_path / "hf"))
    assert [row["n"] for row in rows] == list(range(10))
    assert typed(rows) == typed(list(whole)[:10]) == typed(list(load_records(str(folder)))[:10])
    assert type(rows[0]["when"]).__name__ == "datetime"  # (datasets' reading of the text: kept)

    # a file whose rows lack a column: datasets gives it as None there (the first file's columns)
    write_lines(folder / "b.jsonl", [{k: v for k, v in varied_row(i).items() if k != "x"} for i in range(4, 7)])
    rows = first(_first_jsonl_rows(str(folder), None, {}, 10), 10)
    assert [row["x"] for row in rows[4:7]] == [None] * 3
    assert typed(rows) == typed(list(load_records(str(folder)))[:10])


def test_a_folder_of_parquet_files_gives_the_first_records_datasets_gives(tmp_path):
    folder = tmp_path / "parquet"
    folder.mkdir()
    for name, span in (("c.parquet", range(600, 900)), ("a.parquet", range(300)), ("b.parquet", range(300, 600))):
        pq.write_table(pa.Table.from_pylist([varied_row(i) for i in span]), folder / name, row_group_size=128)

    fast = _first_parquet_rows(str(folder), None, {})
    assert fast is not None  # (the full load's way: every file converted first)
    rows = first(fast, 700)
    whole = datasets.load_dataset("parquet", data_files=str(folder / "*.parquet"), split="train",
                                  cache_dir=str(tmp_path / "hf"))
    assert [row["n"] for row in rows] == list(range(700))
    assert typed(rows) == typed(list(whole)[:700]) == typed(list(load_records(str(folder)))[:700])

    # a file whose column has another type: datasets casts it to the first file's (floats to ints)
    pq.write_table(pa.Table.from_pylist([dict(varied_row(i), n=float(i)) for i in range(300, 600)]),
                   folder / "b.parquet")
    rows = first(_first_parquet_rows(str(folder), None, {}), 700)
    assert type(rows[300]["n"]) is int
    assert typed(rows) == typed(list(load_records(str(folder)))[:700])


def test_a_folder_whose_last_file_is_broken_loads_the_limits_tasks(tmp_path):
    """The third file is not Parquet (or has a line that is not JSON): never opened for 5 tasks."""
    for kind in ("jsonl", "parquet"):
        folder = tmp_path / kind
        folder.mkdir()
        for k in range(2):
            rows = [gsm8k_row(3 * k + i) for i in range(3)]
            if kind == "parquet":
                pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{k}.parquet")
            else:
                write_lines(folder / f"part-{k}.jsonl", rows)
        (folder / f"part-2.{kind}").write_text(BROKEN)
        tasks = gsm8k_tasks(str(folder), split="train", limit=5).tasks
        assert [t.answer for t in tasks] == ["2", "3", "4", "5", "6"], kind
        with pytest.raises(ValueError, match=rf"cannot read it as {'PARQUET' if kind == 'parquet' else 'JSON'}"):
            gsm8k_tasks(str(folder), split="train", limit=7)  # (the third file's tasks: the full load says why)
