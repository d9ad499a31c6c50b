"""Component names never overwrite each other, and a reward function that never returns cannot
hang a step (helper 143)."""

import asyncio
import functools
import re
import sys
import threading
from pathlib import Path

import pytest

from benchmax_gym.core import ListTasks, RewardFn, Rubric, Task, ToolEnv, Toolset, gate
from benchmax_gym.core.group import GroupRubric
from benchmax_gym.core.rubric import milestones

REWARD_TIMEOUT = "reward_timeout"  # (how reward_errors starts for a leaf past its deadline)

sys.path.insert(0, str(Path(__file__).parent))
from sample_tools import add  # noqa: E402

HOSTILE = "a" * 40 + "!"  # (a+)+$ backtracks for hours on it


def contains(completion, word=""):
    return float(word in completion)


def correct(completion):
    return float("42" in completion)


def test_two_lambdas_and_two_partials_are_numbered_and_both_logged():
    rubric = Rubric([lambda completion: 1.0, lambda completion: 0.5,
                     functools.partial(contains, word="4"), functools.partial(contains, word="x")])
    reward, components, _ = rubric.score(completion="42")
    assert components == {"<lambda>": 1.0, "<lambda>#2": 0.5, "contains": 1.0, "contains#2": 0.0}
    assert reward == sum(components.values())
    assert rubric.with_weights({"contains#2": 3.0}).score(completion="x")[0] == 1.0 + 0.5 + 3.0


def test_a_nested_rubric_sharing_a_derived_name_is_numbered_and_the_users_own_names_stay():
    rubric = Rubric([correct, gate(lambda completion: 1.0, Rubric([correct, ("fmt", correct, 1.0)]))])
    assert rubric.names == ["correct", "<lambda>", "correct#2", "fmt"]
    # a derived name never takes one the user gave, wherever it stands
    assert Rubric([correct, ("correct", lambda completion: 0.0, 1.0)]).names == ["correct#2", "correct"]


def test_two_names_the_user_gave_that_clash_are_refused_naming_both():
    def other(completion):
        return 0.0

    with pytest.raises(ValueError, match=r"duplicate reward component name 'x'.*correct.*other"):
        Rubric([("x", correct, 1.0), gate(lambda completion: 1.0, Rubric([RewardFn("x", other)]))])
    with pytest.raises(ValueError, match=r"duplicate reward component name 'x'.*gate node"):
        Rubric([("x", correct, 1.0), gate(lambda completion: 1.0, correct, name="x")])


def test_a_dicts_key_that_is_another_components_name_is_numbered_not_written_over():
    rubric = Rubric([("parts", lambda completion: {"correct": 0.0, "format": 1.0}, 1.0), ("correct", correct, 1.0),
                     ("more", lambda completion: {"format": 0.0}, 1.0)])
    reward, components, _ = rubric.score(completion="42")
    assert components == {"correct#2": 0.0, "format": 1.0, "correct": 1.0, "format#2": 0.0}
    assert reward == 0.5 + 1.0 + 0.0  # parts' mean, correct, more


def test_group_names_are_numbered_and_never_write_over_the_members_own_components():
    group = GroupRubric([lambda rewards: [1.0] * len(rewards), lambda rewards: [{"correct": 0.25}] * len(rewards)])
    assert group.names == ["<lambda>", "<lambda>#2"]
    out = group.score([{"reward": 1.0, "reward_components": {"correct": 1.0}}])[0]
    assert out["reward_components"] == {"correct": 1.0, "<lambda>": 1.0, "correct#2": 0.25}
    assert out["group_components"] == {"<lambda>": 1.0, "correct#2": 0.25}
    with pytest.raises(ValueError, match="duplicate group reward component name 'g'"):
        GroupRubric([("g", lambda rewards: rewards, 1.0), ("g", lambda rewards: rewards, 1.0)])


def backtracks(completion):
    return float(bool(re.match(r"(a+)+$", completion)))


@pytest.mark.timeout(120, method="thread")  # (SIGALRM free: pytest-timeout's signal method takes it, and a regex
def test_a_regex_that_backtracks_for_ever_scores_0_at_the_deadline_and_the_rest_still_scores():  # holds the GIL)
    rubric = Rubric([backtracks, correct], timeout=0.5)
    reward, components, errors = rubric.score(completion=HOSTILE + " 42")
    assert components == {"backtracks": 0.0, "correct": 1.0} and reward == 1.0
    assert errors["backtracks"].startswith(REWARD_TIMEOUT)
    assert rubric.score(completion="aaa") == (1.0, {"backtracks": 1.0, "correct": 0.0}, {})  # (the bound passes results)


def test_a_leaf_blocked_in_another_thread_is_abandoned_at_the_deadline():
    release = threading.Event()
    out = []

    def blocked(completion):
        release.wait()  # (a read that never returns)
        return 1.0

    rubric = Rubric([blocked, correct], timeout=0.5)
    worker = threading.Thread(target=lambda: out.append(rubric.score(completion="42")))
    worker.start()
    worker.join(60)
    release.set()
    assert out, "the score hung"
    reward, components, errors = out[0]
    assert (reward, components) == (1.0, {"blocked": 0.0, "correct": 1.0})
    assert errors["blocked"].startswith(REWARD_TIMEOUT)


def test_an_async_leaf_that_never_returns_scores_0_at_the_deadline():
    async def judge(completion):
        await asyncio.Event().wait()

    rubric = Rubric([judge, correct], timeout=0.5)
    reward, components, errors = asyncio.run(asyncio.wait_for(rubric.ascore(completion="42"), 60))
    assert (reward, components) == (1.0, {"judge": 0.0, "correct": 1.0})
    assert errors["judge"].startswith(REWARD_TIMEOUT)


def test_a_hanging_per_turn_leaf_leaves_the_step_scored_with_its_error():
    release = threading.Event()

    def stuck(tool_calls):
        release.wait(3600)
        return 1.0

    rubric = Rubric([correct, RewardFn("stuck", stuck, 0.1, per_turn=True),
                     milestones("hang", lambda tool_calls: (release.wait(3600), 1))], timeout=0.3)
    env = ToolEnv(tasks=ListTasks([Task("t0", "Add, then say 42.", "42")]), toolset=Toolset([add]), rubric=rubric,
                  system_prompt="Test.")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert "3" in obs and reward == 0.0 and not terminated
    assert set(info["reward_errors"]) == {"stuck", "hang"}
    assert all(e.startswith(REWARD_TIMEOUT) for e in info["reward_errors"].values())
    obs, reward, terminated, truncated, info = env.step("42")
    release.set()
    assert terminated and info["outcome"] == "scored" and reward == 1.0


def test_a_timeout_that_is_no_positive_number_is_refused_naming_it():
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        Rubric([correct], timeout=0)
    with pytest.raises(ValueError, match="reward_timeout must be a positive number"):
        Rubric([correct]).with_timeout(float("nan"))
    assert Rubric([correct]).with_timeout(None).score(completion="42")[0] == 1.0


def test_a_rubric_sent_to_another_process_keeps_its_bound_and_scores():
    """A vector worker or a Ray host gets the rubric pickled: a leaf without a ``reward_timeout`` of
    its own must still read as one (an ``object()`` marker arrived as another object, and every
    leaf scored 0 with a TypeError)."""
    import pickle

    rubric = pickle.loads(pickle.dumps(Rubric([correct], timeout=30)))
    reward, components, errors = rubric.score(completion="42")
    assert (reward, components, errors) == (1.0, {"correct": 1.0}, {})


def test_gym_make_takes_the_bound_and_names_a_bad_one():
    """``reward_timeout`` at make: the user's bound for every reward function of any env."""
    import time

    import gymnasium as gym

    from benchmax_gym import register_tool_env

    def stuck(completion):
        time.sleep(30)
        return 1.0

    env_id = register_tool_env("test143/Stuck-v0", tools=[add], tasks=[{"prompt": "Say 42.", "answer": "42"}],
                               rubric=[stuck, correct])
    env = gym.make(env_id, reward_timeout=2)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("42")
    env.close()
    assert terminated and reward == 1.0 and info["reward_errors"]["stuck"].startswith(REWARD_TIMEOUT)
    for bad in (0, -1, float("inf"), "soon", True):
        with pytest.raises(ValueError, match="reward_timeout"):
            gym.make("benchmax/Math-v0", reward_timeout=bad)
