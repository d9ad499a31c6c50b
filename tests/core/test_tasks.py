"""Task sources: generated tasks, in-memory lists and dataset files."""

import json

import numpy as np
import pytest

from benchmax_gym.core.tasks import INFINITE, DatasetTasks, GeneratedTasks, ListTasks, Task, TaskSource, load_records


def make_sum(rng: np.random.Generator, index: int) -> Task:
    a, b = (int(x) for x in rng.integers(0, 1_000_000, size=2))
    return Task(id=f"sum-{index}", prompt=f"What is {a} + {b}?", answer=a + b, metadata={"a": a, "b": b})


# -- GeneratedTasks --------------------------------------------------------------------------


def test_generated_item_is_independent_of_order():
    forward = GeneratedTasks(make_sum, seed=3, size=50)
    backward = GeneratedTasks(make_sum, seed=3, size=50)
    items = [forward[i] for i in range(50)]
    reversed_items = [backward[i] for i in reversed(range(50))][::-1]
    assert items == reversed_items
    assert forward[17] == items[17]  # asking again gives the same item
    assert items[17].id == "sum-17"
    assert len({t.answer for t in items}) > 40  # items differ from each other


def test_generated_item_depends_on_seed():
    a = GeneratedTasks(make_sum, seed=1, size=10)
    b = GeneratedTasks(make_sum, seed=2, size=10)
    assert [a[i].prompt for i in range(10)] != [b[i].prompt for i in range(10)]
    assert [a[i] for i in range(10)] == [GeneratedTasks(make_sum, seed=1, size=10)[i] for i in range(10)]


def test_generated_item_independent_of_global_random_state():
    ts = GeneratedTasks(make_sum, seed=0, size=5)
    np.random.seed(1)
    first = ts[2]
    np.random.seed(2)
    np.random.random(100)
    assert ts[2] == first


def test_generated_size_bounds():
    ts = GeneratedTasks(make_sum, seed=0, size=5)
    assert len(ts) == 5
    assert ts[0].id == "sum-0" and ts[4].id == "sum-4"
    with pytest.raises(IndexError) as info:
        ts[7]
    message = str(info.value)
    assert "7" in message and "5" in message  # the bad index and the number of tasks
    with pytest.raises(IndexError):
        ts[5]
    with pytest.raises(IndexError):
        ts[-1]
    with pytest.raises(IndexError):
        ts[10**12]


@pytest.mark.parametrize("index", ["1", 1.0, None, True, [0]])
def test_generated_non_int_index_is_type_error(index):
    ts = GeneratedTasks(make_sum, seed=0, size=5)
    with pytest.raises(TypeError):
        ts[index]


def test_numpy_integer_index_is_accepted():
    ts = GeneratedTasks(make_sum, seed=0, size=5)
    assert ts[np.int64(3)] == ts[3]
    assert ts[np.int32(0)] == ts[0]


def test_generated_infinite_size():
    ts = GeneratedTasks(make_sum, seed=4)
    assert len(ts) == INFINITE
    big = INFINITE - 1
    assert ts[big] == ts[big]
    assert ts[big].id == f"sum-{big}"
    assert ts[10**12] != ts[10**12 + 1]
    with pytest.raises(IndexError):
        ts[INFINITE]
    with pytest.raises(IndexError):
        ts[-1]


@pytest.mark.parametrize("size", [0, -3, 2.5, "10"])
def test_generated_bad_size(size):
    with pytest.raises(ValueError):
        GeneratedTasks(make_sum, size=size)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", None])
def test_generated_bad_seed(seed):
    with pytest.raises(ValueError):
        GeneratedTasks(make_sum, seed=seed)


@pytest.mark.parametrize("size", [7, None])
def test_sample_index_uses_only_the_given_generator(size):
    ts = GeneratedTasks(make_sum, seed=0, size=size)
    a = [ts.sample_index(np.random.default_rng(11)) for _ in range(3)]
    assert len(set(a)) == 1  # same generator state -> same index
    rng1, rng2 = np.random.default_rng(99), np.random.default_rng(99)
    np.random.seed(0)
    first = [ts.sample_index(rng1) for _ in range(20)]
    np.random.seed(12345)  # the global state does not matter
    second = [ts.sample_index(rng2) for _ in range(20)]
    assert first == second
    assert all(isinstance(i, int) and 0 <= i < len(ts) for i in first)
    assert len(set(first)) > 1
    for i in first:
        ts[i]  # every sampled index is a valid task


def test_sample_index_covers_the_range():
    ts = ListTasks([Task(str(i), f"p{i}") for i in range(4)])
    rng = np.random.default_rng(0)
    assert {ts.sample_index(rng) for _ in range(200)} == {0, 1, 2, 3}


# -- ListTasks -------------------------------------------------------------------------------


def test_list_tasks():
    tasks = [Task("a", "first", 1), Task("b", "second", 2)]
    ts = ListTasks(tasks)
    assert isinstance(ts, TaskSource)
    assert len(ts) == 2
    assert ts[0] is tasks[0] and ts[1] is tasks[1]
    with pytest.raises(IndexError):
        ts[2]
    with pytest.raises(IndexError):
        ts[-1]  # not Python's negative indexing
    tasks.append(Task("c", "third"))
    assert len(ts) == 2  # a copy of the list


def test_list_tasks_empty_is_error():
    with pytest.raises(ValueError):
        ListTasks([])


def test_task_is_frozen_with_defaults():
    t = Task("id", "prompt")
    assert t.answer is None and t.solution is None and dict(t.metadata) == {}
    with pytest.raises(Exception):
        t.prompt = "changed"


# -- DatasetTasks / load_records -------------------------------------------------------------

RECORDS = [
    {"question": "What is 1 + 1?", "answer": "2", "level": 1},
    {"question": "Ünïcödé: 漢字 😀?", "answer": "yes", "level": 2},
    {"question": "What is 3 * 4?", "answer": "12", "level": 1},
    {"question": "What is 10 / 4?", "answer": "2.5", "level": 3},
]


def to_task(record, index):
    return Task(id=f"t{index}", prompt=record["question"], answer=record["answer"], metadata={"level": record["level"]})


def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n", encoding="utf-8")
    return path


def write_json(path, records):
    path.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return path


def write_parquet(path, records):
    import datasets

    datasets.Dataset.from_list(records).to_parquet(str(path))
    return path


@pytest.fixture
def cache(tmp_path):
    return {"cache_dir": str(tmp_path / "hf-cache")}


@pytest.mark.parametrize(
    "writer, suffix", [(write_jsonl, ".jsonl"), (write_json, ".json"), (write_parquet, ".parquet")]
)
def test_load_records_from_local_files(tmp_path, cache, writer, suffix):
    path = writer(tmp_path / f"data{suffix}", RECORDS)
    ds = load_records(path, **cache)
    assert len(ds) == len(RECORDS)
    assert [dict(r) for r in ds] == RECORDS
    assert [dict(r) for r in load_records(str(path), **cache)] == RECORDS  # str or PathLike


@pytest.mark.parametrize(
    "writer, suffix", [(write_jsonl, ".jsonl"), (write_json, ".json"), (write_parquet, ".parquet")]
)
def test_dataset_tasks_from_local_files(tmp_path, cache, writer, suffix):
    path = writer(tmp_path / f"data{suffix}", RECORDS)
    ts = DatasetTasks(path, to_task, **cache)
    assert len(ts) == 4
    assert [t.prompt for t in (ts[i] for i in range(4))] == [r["question"] for r in RECORDS]
    assert ts[1] == Task("t1", "Ünïcödé: 漢字 😀?", "yes", metadata={"level": 2})
    with pytest.raises(IndexError):
        ts[4]


def test_directory_of_jsonl_files(tmp_path, cache):
    d = tmp_path / "shards"
    d.mkdir()
    write_jsonl(d / "part-1.jsonl", RECORDS[2:])
    write_jsonl(d / "part-0.jsonl", RECORDS[:2])
    (d / "README.md").write_text("not data")  # other files are ignored
    ts = DatasetTasks(d, to_task, **cache)
    assert [ts[i].prompt for i in range(len(ts))] == [r["question"] for r in RECORDS]  # files in name order


def test_list_of_files(tmp_path, cache):
    a = write_jsonl(tmp_path / "a.jsonl", RECORDS[:1])
    b = write_jsonl(tmp_path / "b.jsonl", RECORDS[1:3])
    ds = load_records([a, str(b)], **cache)
    assert [r["question"] for r in ds] == [r["question"] for r in RECORDS[:3]]


def test_to_task_returning_none_skips_records(tmp_path, cache):
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    seen = []

    def only_level_1(record, index):
        seen.append(index)
        return to_task(record, index) if record["level"] == 1 else None

    ts = DatasetTasks(path, only_level_1, **cache)
    assert seen == [0, 1, 2, 3]  # the record's index in the file is passed
    assert len(ts) == 2
    assert [ts[0].id, ts[1].id] == ["t0", "t2"]


def test_limit(tmp_path, cache):
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    assert [t.id for t in DatasetTasks(path, to_task, limit=2, **cache).tasks] == ["t0", "t1"]
    assert len(DatasetTasks(path, to_task, limit=100, **cache)) == 4
    # The limit counts usable tasks, not records.
    skip_first = DatasetTasks(path, lambda r, i: None if i == 0 else to_task(r, i), limit=2, **cache)
    assert [t.id for t in skip_first.tasks] == ["t1", "t2"]


@pytest.mark.parametrize("limit", [0, -1, True, 2.5])
def test_bad_limit_is_rejected(tmp_path, cache, limit):
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    with pytest.raises(ValueError, match="limit must be a positive int"):
        DatasetTasks(path, to_task, limit=limit, **cache)


def test_missing_local_looking_path_never_goes_to_the_hub(tmp_path, cache):
    for path in (str(tmp_path / "nope.jsonl"), "./data/train.jsonl", "train.parquet"):
        with pytest.raises(FileNotFoundError, match="no such file"):
            load_records(path, **cache)


def test_no_usable_tasks_is_error(tmp_path, cache):
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    with pytest.raises(ValueError, match="no usable tasks"):
        DatasetTasks(path, lambda r, i: None, **cache)


def test_missing_files_in_a_list(tmp_path, cache):
    present = write_jsonl(tmp_path / "a.jsonl", RECORDS)
    with pytest.raises(FileNotFoundError):
        load_records([present, tmp_path / "missing.jsonl"], **cache)
    with pytest.raises(FileNotFoundError):
        DatasetTasks([tmp_path / "missing-1.jsonl", tmp_path / "missing-2.jsonl"], to_task, **cache)


def test_missing_single_file(tmp_path, cache):
    with pytest.raises(FileNotFoundError):
        load_records(tmp_path / "missing.jsonl", **cache)


def test_mixed_file_kinds_is_error(tmp_path, cache):
    a = write_jsonl(tmp_path / "a.jsonl", RECORDS)
    b = write_parquet(tmp_path / "b.parquet", RECORDS)
    with pytest.raises(ValueError, match="one kind"):
        load_records([a, b], **cache)
    d = tmp_path / "mixed"
    d.mkdir()
    write_jsonl(d / "a.jsonl", RECORDS)
    write_parquet(d / "b.parquet", RECORDS)
    with pytest.raises(ValueError):
        DatasetTasks(d, to_task, **cache)


def test_json_and_jsonl_files_mix(tmp_path, cache):
    a = write_jsonl(tmp_path / "a.jsonl", RECORDS[:2])
    b = write_json(tmp_path / "b.json", RECORDS[2:])
    assert len(load_records([a, b], **cache)) == 4


def test_unsupported_file_kind_is_error(tmp_path, cache):
    path = tmp_path / "data.txt"
    path.write_text("What is 1 + 1?\n")
    with pytest.raises(ValueError):
        load_records(path, **cache)


def test_directory_without_data_files_is_error(tmp_path, cache):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "notes.txt").write_text("nothing here")
    with pytest.raises(ValueError, match="no data files"):
        load_records(d, **cache)


def test_hub_id_while_offline_is_one_clear_connection_error():
    """conftest sets HF_HUB_OFFLINE=1: a hub id that is not cached fails at once, in one line."""
    with pytest.raises(ConnectionError, match=r"^dataset 'openai/gsm8k': offline mode is on .*task_args=\{'dataset': PATH\} \(CLI: --env-arg task_args\.dataset=PATH\)$"):
        load_records("openai/gsm8k", name="main")
