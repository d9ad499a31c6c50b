"""benchmax/Mix-v0 as a user meets it (helper 151's audit): a scheduled curriculum still reports
its success rate, and a mixture task at a pinned difficulty is one task whatever level the
controller stands at (a GRPO group pinned to one level)."""

import gymnasium as gym

import benchmax_gym  # noqa: F401
from benchmax_gym.testing import play

WRONG = "\\boxed{not a number}"


def scheduled(**options):
    return {"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2, 3], "schedule": [(4, 1)],
                        **options}}


def test_a_scheduled_members_success_rate_is_its_recent_episodes_not_nan():
    """Under a fixed schedule the controller never filled its window: curriculum_stats() and each
    ended episode's info said success_rate NaN however many episodes were solved."""
    mix = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1}, python_tool=False, curriculum=scheduled())
    for k in range(3):  # level 0: solved, solved, wrong
        play(mix, seed=0 if k == 0 else None, **({"policy": lambda obs, info: WRONG} if k == 2 else {}))
    stats = mix.unwrapped.curriculum.stats()["Math-v0"]
    assert stats["level"] == 0 and stats["success_rate"] == 2 / 3
    play(mix)
    play(mix, policy=lambda obs, info: WRONG)  # the schedule moved to level 1: its own episodes from here
    stats = mix.unwrapped.curriculum.stats()["Math-v0"]
    assert stats["level"] == 1 and stats["success_rate"] == 0.0
    mix.close()


def test_a_vector_envs_ended_episodes_carry_a_scheduled_members_success_rate():
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=2, num_workers=2, members={"benchmax/Math-v0": 1},
                        python_tool=False, curriculum=scheduled())
    try:
        envs.reset(seed=0)
        _, _, terminated, _, info = envs.step([WRONG] * 2)
        assert terminated.all() and info["_success_rate"].all()
        assert list(info["success_rate"]) == [0.0, 0.0]
        assert envs.curriculum_stats()["Math-v0"]["success_rate"] == 0.0
    finally:
        envs.close()


LEVELS = {"Math-v0": {"levels": [{"task_args.difficulty.digits": 1, "task_args.num_tasks": 3},
                                 {"task_args.difficulty.digits": 2, "task_args.num_tasks": 8}]}}


def test_a_mixture_task_at_a_pinned_difficulty_is_the_same_task_whatever_the_current_level():
    """``options={"task_index": i, "difficulty": 1}`` wrapped i over the task count of the level
    the controller stood at, not of the level played: with the controller at level 0 (3 tasks)
    it played task 4 % 3 = 1 of level 1, at level 1 task 4: one GRPO group, two tasks."""
    mix = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1}, python_tool=False, curriculum=LEVELS)
    controller = mix.unwrapped.curriculum.members["Math-v0"]
    played = {}
    for current in (0, 1):
        controller.level = current  # (as the controller moves between a group's rollouts)
        for index in range(8):
            _, info = mix.reset(options={"task_index": index, "difficulty": 1})
            assert info["difficulty"] == 1
            played.setdefault(index, set()).add(info["task_id"])
    assert all(len(tasks) == 1 for tasks in played.values()), played
    assert len({t for tasks in played.values() for t in tasks}) == 8  # (every task of level 1, none wrapped)
    _, info = mix.reset(options={"task_index": 4})  # not pinned: the current level's own tasks (3: wrapped)
    assert info["difficulty"] == 1 and info["task_index"] == 4
    controller.level = 0
    _, info = mix.reset(options={"task_index": 4})
    assert info["difficulty"] == 0 and info["task_index"] == 4 % 3
    mix.close()


def test_a_member_that_cannot_be_made_at_make_is_named_there(tmp_path, caplog):
    """A member whose make failed for another reason than its arguments (a dataset file missing)
    was left silently to its first draw, which, in a vector env's worker, surfaced as env_error
    episodes whose text named the file but not the member."""
    missing = tmp_path / "none.jsonl"
    broken = ("broken", "benchmax/Math-v0", {"tasks": "hf", "task_args": {"dataset": str(missing)}})
    with caplog.at_level("WARNING", logger="benchmax_gym.mix"):
        mix = gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", 1.0), (broken, 1.0)], python_tool=False)
    said = [r.getMessage() for r in caplog.records if r.name == "benchmax_gym.mix"]
    assert len(said) == 1 and "'broken' (benchmax/Math-v0)" in said[0] and "FileNotFoundError" in said[0]
    assert str(missing) in said[0] and "first draw" in said[0]
    assert mix.unwrapped.built_members == ["Math-v0@0"]
    mix.close()


def test_a_vector_env_error_of_a_member_names_the_member(tmp_path):
    """A member that cannot be built fails its draws in a worker as env_error episodes; the
    mixture names the member in a note of the exception, which the worker's one-line error
    dropped: the parent read the missing file's name, not which member it was."""
    broken = ("broken", "benchmax/Math-v0", {"tasks": "hf", "task_args": {"dataset": str(tmp_path / "none.jsonl")}})
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=2, members=[("benchmax/Math-v0", 1.0), (broken, 1.0)],
                        python_tool=False)  # (in worker processes)
    try:
        _, infos = envs.reset(seed=0, options={"member": "broken"})
        errors = [e for e in infos["error"] if e]
        assert len(errors) == 2 and all("mixture member 'broken'" in e and "none.jsonl" in e for e in errors), errors
        assert all("mixture member 'broken'" in d for d in infos["outcome_detail"])
    finally:
        envs.close()
