"""Group rewards through TRL, which hands the whole batch (each prompt's num_generations samples)
to the env side: TRLRollout's rollout_func and environment_factory's reward function."""

import tempfile

import pytest

from benchmax_gym.core.group import GroupRubric, diversity_penalty, relative_rank
from benchmax_gym.core.sandbox import remove_tree
from benchmax_gym.testing.tokenizers import model_ids, tiny_model


@pytest.fixture
def output_dir():
    path = tempfile.mkdtemp(prefix="benchmax-trl-group-")
    yield path
    remove_tree(path)


def test_rollout_func_scores_each_group_together_and_leaves_failures_out(qwen_tokenizer, output_dir):
    """FlakyMath, 3 samples a prompt: right, wrong, failed. The group rank is over the two scored
    ones; the failed sample stays out of the group and the loss."""
    from flaky import ENV_ID
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    order, seen = [], []

    def scripted(trainer, sessions):
        ids = []
        for s in sessions:
            if id(s) not in order:
                order.append(id(s))
            reply = s.env.unwrapped.reference_solver()(s.obs, s.info)
            kind = order.index(id(s)) % 3
            if kind == 2:
                reply = "FAULT " + reply
            elif kind == 1 and s.info["turn"] > 0:
                reply = "The answer is \\boxed{-1}"
            ids.append(model_ids(s.chat, reply))
        return ids, [None] * len(ids)

    rank = GroupRubric([("rank", relative_rank)], combine="replace")
    rollout = TRLRollout(ENV_ID, qwen_tokenizer, env_kwargs={"fail_marker": "FAULT"}, generate=scripted,
                         group_rubric=rank)
    original = rollout.__call__

    class Spy(TRLRollout):
        def __call__(self, prompts, trainer):
            seen.append(original(prompts, trainer))
            return seen[-1]

    rollout.__class__ = Spy
    args = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=6, num_generations=3,
                      max_completion_length=2048, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no")
    trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=rollout.reward, args=args,
                          train_dataset=rollout.dataset(4), rollout_func=rollout, processing_class=qwen_tokenizer)
    trainer.train()
    rollout.close()
    rewards = seen[0]["env_reward"]
    assert rewards == [1.0, 0.0, None] * 2  # rank among the scored two; the failed one is None
    assert all(sum(m) == 0 for m in seen[0]["env_mask"][2::3])


def test_environment_factory_reward_scores_each_run_of_one_task_together():
    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment("benchmax/Math-v0", group_rubric=GroupRubric([("diverse", diversity_penalty, 1.0)]))
    rows = Env.dataset(2)
    envs = [Env() for _ in range(4)]
    for env, row in zip(envs, [rows[0], rows[0], rows[1], rows[1]]):
        env.reset(**row)
    answer = envs[0].calculator(expression=rows[0]["prompt"][-1]["content"].split(":", 1)[1].strip()).strip()
    completions = [f"\\boxed{{{answer}}}", f"\\boxed{{{answer}}}", "\\boxed{1}", "\\boxed{2}"]
    rewards = Env.reward([[{"role": "assistant", "content": c}] for c in completions], environments=envs)
    assert rewards == [0.0, 0.0, 0.0, 0.0]  # right but alike (1 - 1 each); wrong and distinct
    with pytest.raises(TypeError, match="group_rubric"):
        trl_environment("benchmax/Math-v0", group_rubric=relative_rank)
