"""benchmax's ``compute_group_reward`` on subclasses of the real ``benchmax`` package's BaseEnv
(the pinned release predates the method; a subclass defines it as later releases declare it),
called where the group is held: records of one task, and eval's k samples."""

import gymnasium as gym
import pytest
from benchmax.envs.base_env import BaseEnv as PackageBaseEnv

from benchmax_gym import register_benchmax_env
from benchmax_gym.core.group import score_groups

ROWS = [{"prompt": "Name a fruit.", "ground_truth": "apple", "difficulty": "easy"},
        {"prompt": "Name a colour.", "ground_truth": "red", "difficulty": "hard"}]
CALLS = []


class Base(PackageBaseEnv):
    system_prompt = "Answer in one word."

    async def list_tools(self):
        return []

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        raise ValueError("no tools")

    async def init_rollout(self, rollout_id, **rollout_args):
        pass

    async def copy_to_workspace(self, rollout_id, src_path, dst_filename=None):
        pass

    async def copy_from_workspace(self, rollout_id, src_filename, dst_path):
        pass

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        return {"match": float(completion.strip().lower() == ground_truth)}


class Shipped(Base):
    """The signature benchmax 0.1.2.dev16-dev22 ship: a penalty for repeating a sibling."""

    async def compute_group_reward(self, rollout_ids, completions, ground_truths, **kwargs):
        CALLS.append({"ids": rollout_ids, "completions": completions, "truths": ground_truths, **kwargs})
        return [{"unique": -0.5 * (completions.count(c) - 1)} for c in completions]


class Named(Base):
    """A form naming transcripts, rows and termination reasons."""

    async def compute_group_reward(self, rollout_ids, messages_list, tasks, termination_reasons=None):
        CALLS.append({"messages": messages_list, "tasks": tasks, "reasons": termination_reasons})
        return [{"turns": float(sum(m["role"] == "assistant" for m in ms))} for ms in messages_list]


class Unusable(Base):
    async def compute_group_reward(self, rollout_ids, judge_handle):
        return [{} for _ in rollout_ids]


def records_of(env_id, replies, task_index=0):
    records = []
    for reply in replies:
        env = gym.make(env_id)
        env.reset(options={"task_index": task_index})
        env.step(reply)
        records.append(env.unwrapped.episode_record())
        env.close()
    return records


def test_the_shipped_signature_is_called_on_a_group_and_merged_with_compute_reward():
    env_id = register_benchmax_env("test/GroupShipped-v0", Shipped, ROWS)
    env = gym.make(env_id)
    rubric = env.unwrapped.group_rubric
    assert rubric is not None
    records = records_of(env_id, ["apple", "apple", "pear"])
    CALLS.clear()
    out = rubric.score(records)
    env.close()
    assert CALLS == [{"ids": ["0-0", "0-1", "0-2"], "completions": ["apple", "apple", "pear"],
                      "truths": ["apple"] * 3, "difficulty": ["easy"] * 3}]  # other row fields: per-rollout lists
    assert [r["reward"] for r in out] == [0.5, 0.5, 0.0]
    assert out[0]["reward_components"] == {"match": 1.0, "unique": -0.5}


def test_a_newer_named_form_gets_transcripts_rows_and_termination_reasons():
    env_id = register_benchmax_env("test/GroupNamed-v0", Named, ROWS)
    records = records_of(env_id, ["red", "blue"], task_index=1)
    records.append({**records[0], "reward": None, "outcome": "tool_timeout"})  # a failure: never passed
    CALLS.clear()
    out = score_groups(records, gym.make(env_id).unwrapped.group_rubric)
    (call,) = CALLS
    assert call["reasons"] == ["scored", "scored"] and len(call["messages"]) == 2
    assert call["tasks"][0]["ground_truth"] == "red" and call["tasks"][0]["difficulty"] == "hard"
    assert call["messages"][1][-1] == {"role": "assistant", "content": "blue"}
    assert [r["reward"] for r in out] == [2.0, 1.0, None]


def test_a_signature_it_cannot_call_fails_at_make_naming_the_parameter():
    env_id = register_benchmax_env("test/GroupUnusable-v0", Unusable, ROWS)
    with pytest.raises(TypeError, match="judge_handle"):
        gym.make(env_id)


def test_the_pinned_package_without_the_method_has_no_group_rubric():
    env_id = register_benchmax_env("test/GroupNone-v0", Base, ROWS)
    env = gym.make(env_id)
    assert not hasattr(PackageBaseEnv, "compute_group_reward")  # the pinned release predates it
    assert getattr(env.unwrapped, "group_rubric", None) is None
    env.close()


def test_eval_honours_compute_group_reward_for_its_k_samples():
    from benchmax_gym.eval import evaluate

    env_id = register_benchmax_env("test/GroupEval-v0", Shipped, ROWS)
    answers = iter(["apple", "apple", "fig", "red", "red", "red"])
    result = evaluate(env_id, lambda obs, info: next(answers), tasks="all", k=3, concurrency=1, preflight=False)
    assert [r["individual_reward"] for r in result.records] == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert [r["reward"] for r in result.records] == [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert result.summary["group_rubric"].startswith("GroupRubric([benchmax_group")


def test_a_sync_vector_env_group_uses_the_envs_own_compute_group_reward():
    from benchmax_gym.core.group import score_vector_group

    env_id = register_benchmax_env("test/GroupVector-v0", Shipped, ROWS)
    envs = gym.make_vec(env_id, num_envs=3, vectorization_mode="sync")
    try:
        envs.reset(options={"task_index": 0})  # SyncVectorEnv gives every env the same options
        _, rewards, terminated, _, _ = envs.step(["apple", "apple", "pear"])
        assert terminated.all() and list(rewards) == [1.0, 1.0, 0.0]
        assert [r["reward"] for r in score_vector_group(envs)] == [0.5, 0.5, 0.0]
    finally:
        envs.close()
