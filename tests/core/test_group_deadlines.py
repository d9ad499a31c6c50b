"""Group reward functions are bounded as a rubric's leaves are: one past its deadline scores 0
for every member with a ``reward_timeout`` error, the group's other scores and each member's own
reward stay. And ``map_leaves`` whose callback renames leaves checks the names again."""

import asyncio
import threading

import pytest

from benchmax_gym.core.group import GroupRubric, relative_rank
from benchmax_gym.core.rubric import REWARD_TIMEOUT, Rubric


def record(reward, text):
    return {"task_index": 0, "reward": reward, "outcome": "scored", "actions": [text],
            "reward_components": {"correct": reward}}


GROUP = [record(1.0, "a"), record(0.0, "b")]


@pytest.fixture
def release():
    """An event a hung group function waits on, set when the test ends (an abandoned helper thread ends too)."""
    event = threading.Event()
    yield event
    event.set()


def _check_hung(out, name):
    for member, own in zip(out, (1.0, 0.0)):
        assert member["group_components"] == {"rank": own, name: 0.0}  # the other group score stays
        assert member["reward"] == own + own  # own reward + rank, the hung one's 0
        assert member["group_errors"][name].startswith(f"{REWARD_TIMEOUT}: did not return within 0.3 s")


def test_a_sync_group_function_past_its_deadline_scores_0_with_a_reward_timeout(release):
    def hangs(completions):
        release.wait(30)  # (a regex backtracking on the model's text, a blocking read)
        return [1.0] * len(completions)

    rubric = GroupRubric([("rank", relative_rank), ("hangs", hangs)], timeout=0.3)
    _check_hung(rubric.score(GROUP), "hangs")
    # from another thread (SIGALRM is the main thread's): in a helper thread, abandoned at the deadline
    box = []
    thread = threading.Thread(target=lambda: box.append(rubric.score(GROUP)))
    thread.start()
    thread.join(60)
    _check_hung(box[0], "hangs")


def test_an_async_group_function_past_its_deadline_scores_0_with_a_reward_timeout():
    async def stalls(completions):
        await asyncio.sleep(30)
        return [1.0] * len(completions)

    out = GroupRubric([("rank", relative_rank), ("stalls", stalls)], timeout=0.3).score(GROUP)
    _check_hung(out, "stalls")


def test_a_group_functions_own_reward_timeout_wins_and_a_bad_timeout_is_refused(release):
    def hangs(completions):
        release.wait(30)
        return [1.0] * len(completions)

    hangs.reward_timeout = 0.3
    _check_hung(GroupRubric([("rank", relative_rank), ("hangs", hangs)], timeout=None).score(GROUP), "hangs")
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds or None"):
        GroupRubric([relative_rank], timeout=0)
    hangs.reward_timeout = -1
    with pytest.raises(ValueError, match="reward_timeout of 'hangs' must be a positive number"):
        GroupRubric([("hangs", hangs)])


def _a(completion):
    return 1.0


def _b(completion):
    return 0.5


def test_map_leaves_that_renames_a_leaf_onto_another_name_is_checked_again():
    given = Rubric([("a", _a, 1.0), ("b", _b, 1.0)])
    with pytest.raises(ValueError, match="duplicate reward component name 'b'"):
        given.map_leaves(lambda f: f._copy(name="b") if f.name == "a" else f)
    derived = Rubric([_a, _b])  # names derived from the functions: '_a', '_b'
    renamed = derived.map_leaves(lambda f: f._copy(name="_b") if f.name == "_a" else f)
    assert renamed.names == ["_b", "_b#2"]  # the derived name taken is numbered, never written over
    assert renamed.score(completion="x") == (1.5, {"_b": 1.0, "_b#2": 0.5}, {})
    assert derived.map_leaves(lambda f: f._copy(name="first") if f.name == "_a" else f).names == ["first", "_b"]
