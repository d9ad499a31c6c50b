"""TRL's GRPOTrainer with ``environment_factory`` and reward models (``nn.Module`` reward
functions, which TRL calls itself: no function of the adapter runs) when an env fails: the env's
error is raised, never trained on with the reward model's score. On one process, a real
GRPOTrainer on CPU; on two (gloo, loopback only), one launch for those tests: this file run as a
script (``python test_trl_reward_models.py OUT_DIR``), each run through
``trl_two_processes._train``. There the error says the environments failed when they did."""

import sys
import tempfile

import pytest
from launch import in_gloo_group, two_processes_raised
from test_trl_first_batch import _errors
from test_trl_reset_fails import CALCULATOR, STORE, TOOL_DOWN, _register_tool_down

from benchmax_gym.core.sandbox import remove_tree

JUDGE = "the judge at 10.0.0.7 is unreachable"


def _reward_model(tokenizer):
    """A tiny random sequence-classification model, as TRL loads a reward model (one label)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    return Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=tokenizer.pad_token_id))


def _calculator_then_answer(tokenizer):
    """A scripted ``_generate_single_turn``: a calculator call in the first turn, then an answer."""
    turns = []

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
                if not turns else "\\boxed{4}")
        turns.append(text)
        return [tokenizer.encode(text) + [tokenizer.eos_token_id] for _ in prompt_ids], None

    return generate


@pytest.fixture
def output_dir():
    path = tempfile.mkdtemp(prefix="benchmax-trl-rm-")
    yield path
    remove_tree(path)


def _one_process_trainer(env_id, output_dir):
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")  # (TRL parses its tool calls)
    Env = trl_environment(env_id)
    args = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=64, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no")
    trainer = GRPOTrainer(model=tiny_model(tokenizer), args=args, processing_class=tokenizer,
                          reward_funcs=_reward_model(tokenizer), reward_processing_classes=tokenizer,
                          train_dataset=Env.dataset(2), environment_factory=Env)
    trainer._generate_single_turn = _calculator_then_answer(tokenizer)
    return trainer


def test_a_tool_call_whose_env_raises_is_raised_when_only_a_reward_model_scores(output_dir):
    """One process: the env raises in the model's calculator call (its store gone); no
    ``Env.reward`` among the reward functions to grade (and raise) it. Training stops with the
    env's own error; no step is trained on the reward model's score of the episode."""
    from test_trl_tool_raises import ENV_ID  # (registers it: Math-v0 whose tool calls raise)

    trainer = _one_process_trainer(ENV_ID, output_dir)
    with pytest.raises(ConnectionError, match="store at 10.0.0.7 is unreachable"):
        trainer.train()
    assert trainer.state.global_step == 0 and not trainer.state.log_history


def test_a_reward_model_alone_scores_episodes_where_no_env_fails(output_dir):
    """The same run with a calculator that works: the reward model's score is the reward."""
    trainer = _one_process_trainer("benchmax/Math-v0", output_dir)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert trainer.state.global_step == 1 and logs["tools/call_frequency"] > 0
    assert logs["reward"] == logs["rewards//mean"]  # (TRL names an unnamed model's column "")


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each process's runs raised (``failures<k>.json``, rewritten after each run); see
    :func:`launch.two_processes_raised`."""
    return two_processes_raised(__file__, tmp_path_factory.mktemp("trl-reward-models"))


@pytest.mark.parametrize("run, who, error, where", [
    ("model", "GRPOTrainer's environments", f"ConnectionError: {CALCULATOR}",
     "benchmaxtestToolDownOnOneProcessv0TRLEnvironment.calculator"),
    ("grade", "GRPOTrainer's environments", f"ConnectionError: step: {STORE}",
     "reward function 'benchmaxtestBreaksOnOneProcessv0TRLEnvironment'"),
    ("judge", "GRPOTrainer's reward functions", f"ConnectionError: {JUDGE}", "reward function 'judge'"),
], ids=["reward-model-only", "env-raises-grading", "judge-raises"])
def test_on_two_processes_the_error_says_what_failed(raised, run, who, error, where):
    """model: process 1's env raises in the model's calculator call and the only reward function
    is a reward model (no plain function to carry the failure to TRL's gather of the rewards);
    grade: process 1's env raises when Env.reward grades it; judge: a reward function of the
    user's raises on process 1, beside a reward model. Both processes stop with an error that
    starts with what failed (the environments, or the reward functions) and names process 1's
    exception and where it was raised; on process 1 that exception is its cause."""
    zero, one = _errors(raised, run)
    for said in (zero, one):
        assert said["message"].startswith(f"{who}: process 1 raised {error} ({where}"), said["message"]
    assert one["cause"] == error.split(": ", 1)[1] and zero["cause"] is None


def _runs(out_dir: str, rank: int) -> None:
    from trl_two_processes import BREAKS, _register_breaks, _train

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    _register_breaks()
    _register_tool_down()
    tokenizer = tiny_tokenizer("qwen2.5")  # (the one _train gives the trainer)
    raised = {}

    def judge(completions, **kwargs):
        if rank == 1:
            raise ConnectionError(JUDGE)
        return [0.5] * len(completions)

    def train(name, reward_funcs, env, generation=None):  # (TRL reads a processing class for models only)
        _train(out_dir, rank, raised, name, generation=generation, reward_funcs=reward_funcs,
               reward_processing_classes=[tokenizer] * len(reward_funcs), train_dataset=env.dataset(6),
               environment_factory=env)

    Env = trl_environment(TOOL_DOWN)
    train("model", [_reward_model(tokenizer)], Env, generation=_calculator_then_answer(tokenizer))
    Env = trl_environment(BREAKS, at="step")
    train("grade", [Env.reward], Env)
    Env = trl_environment("benchmax/Math-v0")
    train("judge", [_reward_model(tokenizer), judge], Env)


if __name__ == "__main__":
    in_gloo_group(sys.argv[1], _runs)
