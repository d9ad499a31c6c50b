"""A group its rubric fails is a failure to every trainer, never a reward. A group function that
raises scores 0 with ``group_errors`` (eval keeps that record); verl already gave such groups
advantage 0, while TRL trained on the 0 (with ``combine="replace"``: the whole reward) and
OpenRLHF on it or on each member's own reward. Each trainer's own code path, as in the other
adapter tests."""

import asyncio
import math
import tempfile

import pytest

from benchmax_gym.core.group import GroupRubric, group_failed
from benchmax_gym.core.sandbox import remove_tree
from benchmax_gym.testing.tokenizers import model_ids, tiny_model

MATH = "benchmax/Math-v0"
FAILS = "gen-0"  # the id of Math-v0's task 0


def fussy(rewards, task):
    """A grader's bug on one task (task 0's group), fine on the others."""
    if task.id == FAILS:
        raise KeyError("difficulty")
    return [1.0] * len(rewards)


def test_group_failed_reads_a_records_group_errors_as_a_failure():
    rubric = GroupRubric([("fussy", fussy)], combine="replace")

    class Task:
        def __init__(self, id):
            self.id = id

    for task, failed in ((Task(FAILS), True), (Task("gen-1"), False)):
        scored = rubric.score([{"reward": 1.0, "outcome": "scored"}] * 2, task=task)
        assert [r["reward"] for r in scored] == [0.0 if failed else 1.0] * 2  # what eval keeps, said in group_errors
        assert [group_failed(r) for r in scored] == [failed] * 2
    assert group_failed({"reward": None, "outcome": "scored"}) and group_failed({"reward": 1.0, "outcome": "env_error"})


def test_trl_rollout_func_leaves_a_group_its_rubric_failed_out_and_logs_how_many():
    """A real GRPOTrainer step, 2 prompts x 3 samples, each sample right: task 0's group rubric
    raises. Its samples: reward None, no token in the loss (they were 0.0, trained on); task 1's
    scored; the step's logs count 3 in env/group_errors."""
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")

    def solver(trainer, sessions):
        ids = [model_ids(s.chat, s.env.unwrapped.reference_solver()(s.obs, s.info)) for s in sessions]
        return ids, [None] * len(ids)

    seen = []
    rollout = TRLRollout(MATH, tokenizer, generate=solver,
                         group_rubric=GroupRubric([("fussy", fussy)], combine="replace"))
    original = rollout.__call__

    class Spy(TRLRollout):
        def __call__(self, prompts, trainer):
            seen.append(original(prompts, trainer))
            return seen[-1]

    rollout.__class__ = Spy
    out_dir = tempfile.mkdtemp(prefix="benchmax-trl-group-errors-")
    try:
        args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=6, num_generations=3,
                          max_completion_length=2048, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                          save_strategy="no", shuffle_dataset=False)
        trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=rollout.reward, args=args,
                              train_dataset=rollout.dataset(2), rollout_func=rollout, processing_class=tokenizer)
        trainer.train()
    finally:
        rollout.close()
        remove_tree(out_dir)
    batch = seen[0]
    task_zero = [i for i, p in enumerate(batch["prompt_ids"]) if p == batch["prompt_ids"][0]]
    assert len(task_zero) == 3
    for i, (reward, mask) in enumerate(zip(batch["env_reward"], batch["env_mask"])):
        if i in task_zero:
            assert reward is None and sum(mask) == 0
        else:
            assert reward == 1.0 and sum(mask) > 0
    logged = [log["env/group_errors"] for log in trainer.state.log_history if "env/group_errors" in log]
    assert logged == [3.0]


def test_trl_environment_factory_reward_gives_a_failed_group_none_and_logs_it():
    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment(MATH, group_rubric=GroupRubric([("fussy", fussy)], combine="replace"))
    rows = Env.dataset(2)
    envs = [Env() for _ in range(4)]
    for env, row in zip(envs, [rows[0], rows[0], rows[1], rows[1]]):
        env.reset(**row)

    class Trainer:  # what TRL's log_metric keyword is bound to (GRPOTrainer._log_metric)
        logged = []

        def _log_metric(self, name, value):
            self.logged.append((name, value))

    completions = [[{"role": "assistant", "content": "\\boxed{1}"}]] * 4
    rewards = Env.reward(completions, environments=envs, log_metric=Trainer()._log_metric)
    assert rewards == [None, None, 1.0, 1.0]  # (task 0's group was [0.0, 0.0]: a reward)
    assert Trainer.logged == [("env/group_errors", 2)]
    rewards = Env.reward(completions[2:], environments=envs[2:], log_metric=Trainer()._log_metric)
    assert rewards == [1.0, 1.0] and Trainer.logged[-1] == ("env/group_errors", 0)
    for env in envs:
        env.env.close()


@pytest.mark.parametrize("broken", ["function", "rubric"])
def test_openrlhf_gives_a_group_its_rubric_failed_nan_scores(qwen_tokenizer, broken):
    """OpenRLHF's executor (group_size=2): a group function raising scored 0 (trained on); a
    rubric whose ascore raises left each member its own reward. Both are NaN now (dynamic
    filtering drops the group), and task 1's group is scored."""
    from test_openrlhf import ScriptedEngine, _params

    from benchmax_gym.adapters.openrlhf import make_executor, task_rows

    rubric = GroupRubric([("fussy", fussy)], combine="replace")
    if broken == "rubric":
        class Broken(GroupRubric):
            async def ascore(self, records, task=None):
                raise RuntimeError("the rubric's own bug")

        rubric = Broken([("fussy", fussy)], combine="replace")
    executor = make_executor(MATH, group_size=2, group_rubric=rubric)()
    rows = task_rows(MATH, 2)

    async def play(row):
        engine = ScriptedEngine(qwen_tokenizer, lambda ids, turn: "\\boxed{1}")
        return await executor.execute(row["prompt"], row["label"], _params(), 16384, qwen_tokenizer, engine)

    async def main():
        return await asyncio.gather(play(rows[0]), play(rows[0]), play(rows[1]), play(rows[1]))

    out = asyncio.run(main())
    if broken == "function":
        assert all(math.isnan(o["reward"]) and math.isnan(o["scores"]) for o in out[:2])
        assert [o["reward"] for o in out[2:]] == [1.0, 1.0]
    else:  # (the rubric fails every group)
        assert all(math.isnan(o["reward"]) for o in out)


def test_openrlhf_a_sample_left_waiting_past_group_timeout_fails_rather_than_keep_its_own_reward(qwen_tokenizer):
    """group_size=2, a rank that replaces the reward: the sibling never comes. The sample that
    waited kept its own 1.0, a value on another scale than its group's ranks; now NaN (its group
    cannot be scored whole; OpenRLHF's dynamic filtering drops it)."""
    from benchmax_gym.core.group import relative_rank
    from test_openrlhf import ScriptedEngine, _params

    from benchmax_gym.adapters.openrlhf import make_executor, task_rows

    executor = make_executor(MATH, group_size=2, group_timeout=0.5,
                             group_rubric=GroupRubric([("rank", relative_rank)], combine="replace"))()
    row = task_rows(MATH, 1)[0]
    solver = ScriptedEngine(qwen_tokenizer, lambda ids, turn: "\\boxed{1}")
    out = asyncio.run(executor.execute(row["prompt"], row["label"], _params(), 16384, qwen_tokenizer, solver))
    assert math.isnan(out["reward"]) and math.isnan(out["scores"])
