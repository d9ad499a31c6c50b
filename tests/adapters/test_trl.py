"""TRL's GRPOTrainer on CPU with a tiny random model built here: a real training step through
rollout_func (multi-turn, token-exact) and through environment_factory."""

import tempfile

import pytest

from benchmax_gym.core.sandbox import remove_tree
from benchmax_gym.testing.tokenizers import model_ids, tiny_model



@pytest.fixture
def output_dir():
    path = tempfile.mkdtemp(prefix="benchmax-trl-")
    yield path
    remove_tree(path)


def _config(output_dir, **overrides):
    from trl import GRPOConfig

    args = dict(output_dir=output_dir, per_device_train_batch_size=4, num_generations=2, max_completion_length=48,
                max_steps=1, report_to=[], use_cpu=True, logging_steps=1, save_strategy="no")
    return GRPOConfig(**{**args, **overrides})


def test_a_grpo_step_with_the_trainers_own_generation(qwen_tokenizer, output_dir):
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    rollout = TRLRollout("benchmax/Math-v0", qwen_tokenizer, env_kwargs={"max_turns": 3})
    model = tiny_model(qwen_tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(model=model, reward_funcs=rollout.reward, args=_config(output_dir, learning_rate=1e-2),
                          train_dataset=rollout.dataset(8), rollout_func=rollout, processing_class=qwen_tokenizer)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["env/turns"] >= 1 and "env/reward/correct" in logs and "env/reward/format" in logs
    assert logs["completions/max_length"] <= 48  # the budget holds across turns
    rollout.close()
    assert before  # the step ran end to end (a random model earns no reward, so GRPO's loss is 0)


def test_a_grpo_step_on_multi_turn_episodes_that_earn_reward(qwen_tokenizer, output_dir):
    """Scripted replies (half right, half wrong) through a real trainer: rewards reach GRPO,
    env tokens are masked, and the weights move."""
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    order = []

    def scripted(trainer, sessions):
        ids = []
        for s in sessions:
            if id(s) not in order:
                order.append(id(s))
            reply = s.env.unwrapped.reference_solver()(s.obs, s.info)
            if s.info["turn"] > 0 and order.index(id(s)) % 2:  # one of each prompt's two answers is wrong
                reply = "The answer is \\boxed{-1}"
            ids.append(model_ids(s.chat, reply))
        return ids, [None] * len(ids)

    rollout = TRLRollout("benchmax/Math-v0", qwen_tokenizer, generate=scripted)
    seen = []
    original = rollout.__call__

    class Spy(TRLRollout):
        def __call__(self, prompts, trainer):
            out = original(prompts, trainer)
            seen.append(out)
            return out

    rollout.__class__ = Spy
    model = tiny_model(qwen_tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(model=model, reward_funcs=rollout.reward,
                          args=_config(output_dir, max_completion_length=2048, learning_rate=1e-2),
                          train_dataset=rollout.dataset(8), rollout_func=rollout, processing_class=qwen_tokenizer)
    trainer.train()
    out = seen[0]
    assert sorted(out["env_reward"]) != [out["env_reward"][0]] * len(out["env_reward"])  # rewards differ
    for mask in out["env_mask"]:
        assert 0 in mask and mask[-1] == 1  # env tokens between turns, the model's last turn ends it
    logs = trainer.state.log_history[0]
    assert logs["env/turns"] > 1 and logs["reward_std"] > 0
    moved = any(not (p.detach() == before[n]).all() for n, p in model.named_parameters())
    assert moved
    rollout.close()


def test_environment_factory_exposes_tools_as_typed_documented_methods():
    from transformers.utils import get_json_schema

    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment("benchmax/Math-v0")
    env = Env()
    schema = get_json_schema(env.calculator)
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert get_json_schema(env.final_answer)["function"]["parameters"]["required"] == ["answer"]
    rows = Env.dataset(3)
    env.reset(**rows[1])
    prompt = rows[1]["prompt"][-1]["content"]
    expression = prompt.split(":", 1)[1].strip()
    assert env.calculator(expression=expression).strip().lstrip("-").isdigit()
    answer = env.calculator(expression=expression).strip()
    assert env.final_answer(answer=f"\\boxed{{{answer}}}") == "Answer recorded."
    assert env.get_reward() == 1.0 and set(env.reward_components.values()) == {1.0}
    assert env.calculator(expression="1+1").startswith("Error: the episode is over")
    env.reset(**rows[0])  # a fresh episode: an unfinished one is graded as it stands
    assert env.get_reward() == 0.0


def test_a_grpo_step_through_environment_factory(output_dir):
    """With Qwen2.5's real template, which TRL knows how to parse tool calls from."""
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    Env = trl_environment("benchmax/Math-v0")
    trainer = GRPOTrainer(model=tiny_model(tokenizer), args=_config(output_dir), train_dataset=Env.dataset(8),
                          environment_factory=Env, processing_class=tokenizer)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert any(key.startswith("rewards/") and Env.__name__ in key for key in logs)  # get_reward is the reward
    assert all(isinstance(e, Env) for e in trainer.environments)


def test_bad_input_fails_at_construction(qwen_tokenizer):
    import gymnasium as gym

    from benchmax_gym.adapters import TemplateError
    from benchmax_gym.adapters.trl import TRLRollout

    with pytest.raises(gym.error.Error, match="Mth"):
        TRLRollout("benchmax/Mth-v0", qwen_tokenizer)
    with pytest.raises(TypeError, match="max_turn"):
        TRLRollout("benchmax/Math-v0", qwen_tokenizer, env_kwargs={"max_turn": 3})
    qwen_tokenizer_copy = type(qwen_tokenizer)(tokenizer_object=qwen_tokenizer.backend_tokenizer)
    with pytest.raises(TemplateError, match="chat template"):
        TRLRollout("benchmax/Math-v0", qwen_tokenizer_copy)
    rollout = TRLRollout("benchmax/Math-v0", qwen_tokenizer)
    with pytest.raises(ValueError, match="TRLRollout.dataset"):
        rollout([[{"role": "user", "content": "a prompt of my own"}]], None)
    rollout.close()
