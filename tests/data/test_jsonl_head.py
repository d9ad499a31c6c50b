"""``eval --tasks N`` of a JSON Lines dataset reads the file's first rows only (``datasets`` converted
the whole file first: slow and memory-hungry for a large one, and a bad line anywhere failed it),
and gives the tasks, ids and task set the whole file's reading gives for those rows."""

import json

from benchmax_gym.cli import main
from benchmax_gym.core.tasks import ListTasks, task_digest
from benchmax_gym.envs.math.datasets import gsm8k_tasks, hf_tasks

ENV = "benchmax/Math-v0"


def write(path, rows, tail=""):
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)
    return path


def eval_first(tmp_path, source, path, n, *extra):
    out = tmp_path / f"run-{path.stem}"
    code = main(["eval", ENV, "--policy", "solver", "--tasks", str(n), "--env-arg", f"tasks={source}",
                 "--env-arg", f"task_args.dataset={path}", *extra, "--env-arg", "python_tool=false",
                 "--out", str(out), "--quiet", "--no-plots", "--json"])
    assert code == 0
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return json.loads((out / "run.json").read_text())["task_set"], sorted(records, key=lambda r: r["task_index"])


def test_eval_tasks_n_of_a_jsonl_file_never_reads_past_its_first_rows(tmp_path):
    rows = [{"question": f"Tom has {i} apples and buys 2 more. How many now?",
             "answer": f"{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}"} for i in range(3)]
    broken = write(tmp_path / "broken.jsonl", rows, '{"question": oops\n' + json.dumps(rows[0]) + "\n")
    task_set, records = eval_first(tmp_path, "gsm8k", broken, 3)

    whole_file = write(tmp_path / "whole" / "broken.jsonl", rows * 2)  # the same rows, every line good
    whole = gsm8k_tasks(str(whole_file), split="train").tasks[:3]  # read whole, as before
    assert [r["task_id"] for r in records] == [t.id for t in whole] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]
    assert [r["task_digest"] for r in records] == [task_digest(t).hex()[:32] for t in whole]
    assert task_set == ListTasks(whole).content_hash()
    assert all(r["reward"] == 1.0 for r in records)


def test_the_first_rows_read_as_the_whole_file_reads_them(tmp_path):
    """What ``datasets`` makes of JSON Lines rows stays: a column of date-like text as datetimes
    (the answer ``2021-03-04 00:00:00``), a key other rows lack as None."""
    rows = [{"q": "When did it open?", "a": "2021-03-04", "tags": ["x"]},
            {"q": "When did it close?", "a": "2021-03-05 10:00:00", "tags": []},
            {"q": "When did it reopen?", "a": "2022-01-01", "extra": 1}]
    head = write(tmp_path / "head.jsonl", rows, "not json\n")
    task_set, records = eval_first(tmp_path, "hf", head, 3, "--env-arg", "task_args.question_field=q",
                                   "--env-arg", "task_args.answer_field=a")

    whole = hf_tasks(str(write(tmp_path / "whole" / "head.jsonl", rows)), question_field="q", answer_field="a",
                     split="train").tasks
    assert whole[0].answer == "2021-03-04 00:00:00"  # (datasets' reading of the file: kept)
    assert [r["task_id"] for r in records] == [t.id for t in whole]
    assert [r["task_digest"] for r in records] == [task_digest(t).hex()[:32] for t in whole]
    assert task_set == ListTasks(whole).content_hash()
