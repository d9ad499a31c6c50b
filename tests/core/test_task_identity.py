"""Task-set identity: a content hash of a source's tasks, in order, the same in every process;
reset's info carries it beside the task's id."""

import dataclasses
import subprocess
import sys

import gymnasium as gym

import benchmax_gym  # noqa: F401
from benchmax_gym.core.tasks import GeneratedTasks, ListTasks, Task


def tasks(*answers):
    return ListTasks([Task(id=str(i), prompt=f"q{i}", answer=a) for i, a in enumerate(answers)])


def test_the_hash_changes_with_any_task_and_with_their_order():
    base = tasks("1", "2").content_hash()
    assert base == tasks("1", "2").content_hash()
    assert base.startswith("sha256:")
    assert tasks("1", "3").content_hash() != base  # an answer changed, ids the same
    swapped = ListTasks([Task(id="1", prompt="q1", answer="2"), Task(id="0", prompt="q0", answer="1")])
    assert swapped.content_hash() != base
    with_files = ListTasks([Task(id="0", prompt="q0", answer="1", files={"a.xlsx": b"one"})])
    other_files = ListTasks([Task(id="0", prompt="q0", answer="1", files={"a.xlsx": b"two"})])
    assert with_files.content_hash() != other_files.content_hash()
    conversation = ListTasks([Task(id="0", prompt="", answer="1", messages=({"role": "user", "content": "a"},))])
    assert conversation.content_hash() != ListTasks([Task(id="0", prompt="", answer="1")]).content_hash()


def test_the_hash_is_computed_once():
    calls = []

    class Counting(ListTasks):
        def get(self, index):
            calls.append(index)
            return super().get(index)

    source = Counting([Task(id="0", prompt="q", answer="a")])
    assert source.content_hash() == source.content_hash()
    assert calls == [0]


def test_a_generated_source_hashes_its_settings_cheaply():
    def make(rng, index):
        return Task(id=str(index), prompt=str(int(rng.integers(100))), answer="x")

    unbounded = GeneratedTasks(make, seed=1)
    assert unbounded.content_hash() == GeneratedTasks(make, seed=1).content_hash()  # 2**62 tasks: not read
    assert unbounded.content_hash() != GeneratedTasks(make, seed=2).content_hash()
    assert unbounded.content_hash() != GeneratedTasks(make, seed=1, size=10).content_hash()


def test_equal_generated_sources_hash_once_per_process():
    """Each env of a vector env or an eval builds its own source: equal generators (the same
    function or equal configs), seeds and sizes read their first tasks once; anything else
    differs as before."""
    from benchmax_gym.envs.math.generator import GeneratedMath

    made = []

    def make(rng, index):
        made.append(index)
        return Task(id=str(index), prompt=str(int(rng.integers(100))), answer="x")

    first = GeneratedTasks(make, seed=7, size=50).content_hash()
    reads = len(made)
    assert reads > 0
    assert [GeneratedTasks(make, seed=7, size=50).content_hash() for _ in range(5)] == [first] * 5
    assert len(made) == reads
    assert GeneratedTasks(make, seed=8, size=50).content_hash() != first

    @dataclasses.dataclass(frozen=True)
    class Config:  # a family's settings: each env has its own, equal, instance
        digits: int

        def make(self, rng, index):
            made.append(index)
            return Task(id=str(index), prompt=str(int(rng.integers(10**self.digits))), answer="x")

    made.clear()
    assert len({GeneratedTasks(Config(2).make, seed=1).content_hash() for _ in range(4)}) == 1
    reads = len(made)
    assert GeneratedTasks(Config(3).make, seed=1).content_hash() != GeneratedTasks(Config(2).make, seed=1).content_hash()
    assert len(made) == 2 * reads  # Config(3)'s tasks read once, Config(2)'s not again
    easy, hard = GeneratedMath(difficulty={"operands": 2}), GeneratedMath(difficulty={"operands": 5})
    assert GeneratedMath(difficulty={"operands": 2}).build(None).content_hash() == easy.build(None).content_hash()
    assert hard.build(None).content_hash() != easy.build(None).content_hash()


def test_reset_info_carries_the_task_id_and_the_task_set_the_same_in_a_fresh_process():
    env = gym.make("benchmax/Math-v0")
    _, info = env.reset(seed=0, options={"task_index": 3})
    assert info["task_id"] == env.unwrapped.tasks[3].id
    assert info["task_set"] == env.unwrapped.tasks.content_hash()
    code = ("import gymnasium as gym, benchmax_gym\n"
            "print(gym.make('benchmax/Math-v0').reset(seed=5)[1]['task_set'])")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert fresh.stdout.strip() == info["task_set"], fresh.stderr
    other = gym.make("benchmax/Math-v0", task_args={"task_seed": 1})
    assert other.reset(seed=0)[1]["task_set"] != info["task_set"]
    env.close()
    other.close()


def test_a_dataset_source_keeps_its_hash_on_disk_under_its_fingerprint(tmp_path, monkeypatch):
    import json

    from benchmax_gym.core.tasks import DatasetTasks

    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"q": f"q{i}", "a": str(i)}) + "\n" for i in range(20)))

    def to_task(record, index):
        return Task(id=str(index), prompt=record["q"], answer=record["a"])

    first = DatasetTasks(str(data), to_task)
    digest = first.content_hash()
    assert digest == ListTasks(first.tasks).content_hash()  # the same content, the same hash
    assert list((tmp_path / "cache" / "task-sets").iterdir())
    second = DatasetTasks(str(data), to_task)
    second.tasks = second.tasks[::-1]  # a hash computed again would differ: this one comes from the cache
    assert second.content_hash() == digest
    assert DatasetTasks(str(data), to_task, limit=5).content_hash() != digest
