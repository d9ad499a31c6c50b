"""A failed episode (issue 29: a tool's backend gone) has no reward in TRL's GRPOTrainer even when
other reward functions score the batch beside the env's own (a plain function of the user's, a
reward model): every column of its row is NaN, so TRL leaves it out of its group's baseline and
gives it advantage 0, and the other rows are normalised over the scored ones only. A real
GRPOTrainer on CPU, one step, on one process and on two (gloo, loopback only: this file run as a
script, ``python test_trl_failed_rows.py OUT_DIR``); ``benchmax-test/FlakyMath-v0`` fails an
episode whose action holds ``FAULT``."""

import math
import sys
import tempfile
from pathlib import Path

import pytest

from benchmax_gym.core.sandbox import remove_tree
from benchmax_gym.testing.tokenizers import tiny_model

#: the advantages GRPO gives two scored samples with different rewards: (x - mean) / (std + 1e-4)
SCORED_PAIR = 1 / math.sqrt(2)


@pytest.fixture
def output_dir():
    path = tempfile.mkdtemp(prefix="benchmax-trl-failed-rows-")
    yield path
    remove_tree(path)


def one(completions, **kwargs):
    """The user's own reward function: 1.0 for every completion, failed or not."""
    return [1.0] * len(completions)


def _config(output_dir):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=output_dir, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=2048, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no")


def _step(trainer):
    """One training step: the batch GRPOTrainer trains on (its advantages) and its logged metrics."""
    batches = []
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(original(inputs)) or batches[-1]
    trainer.train()
    return batches[0], trainer.state.log_history[0]


def _environment_factory_step(output_dir, extra, where="tool"):
    """environment_factory, one prompt's 3 samples: the first fails (``tool_unavailable``), the
    second answers right, the third wrong. ``where`` it fails: ``"tool"``, its calculator call
    (the reward functions: ``Env.reward``, then ``extra``), or ``"answer"``, the answer that ends
    it, as ``Env.reward`` grades it (``extra`` first: TRL calls it before ``Env.reward``)."""
    from flaky import ENV_ID
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")  # (TRL parses its tool calls)
    Env = trl_environment(ENV_ID, fail_marker="FAULT")
    trainer = GRPOTrainer(model=tiny_model(tokenizer), args=_config(output_dir), processing_class=tokenizer,
                          reward_funcs=[Env.reward, extra] if where == "tool" else [extra, Env.reward],
                          reward_processing_classes=[tokenizer, tokenizer],
                          train_dataset=Env.dataset(1), environment_factory=Env)
    calls = []

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if calls:  # the failed sample's next turn, after the tool's answer
            texts = ["\\boxed{0}"] * len(prompt_ids)
        else:
            answer = trainer.environments[1].env.unwrapped.episode.task.answer
            fails = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "FAULT"}}\n</tool_call>'
                     if where == "tool" else "FAULT \\boxed{0}")
            texts = [fails, f"\\boxed{{{answer}}}", "\\boxed{-1}"]
        calls.append(texts)
        return [tokenizer.encode(t) + [tokenizer.eos_token_id] for t in texts], None

    trainer._generate_single_turn = generate
    batch, logs = _step(trainer)
    assert [type(e).__name__ for e in trainer.environments] == [Env.__name__] * 3
    assert [e.done and e.reward is None for e in trainer.environments] == [True, False, False]  # the first failed
    return batch, logs


@pytest.mark.parametrize("where", ["tool", "answer"])
def test_environment_factory_a_failed_episode_is_unscorable_beside_a_reward_function_of_yours(output_dir, where):
    """The user's function gives the failed sample 1.0 too; that score is dropped: the failed
    sample's advantage is 0, the others' are normalised over the two scored samples (2.0 and 1.0:
    the env's reward plus the user's), and the logged reward is their mean."""
    batch, logs = _environment_factory_step(output_dir, one, where)
    advantages = batch["advantages"].tolist()
    assert advantages[0] == 0.0
    assert advantages[1:] == pytest.approx([SCORED_PAIR, -SCORED_PAIR], abs=1e-3)
    assert logs["reward"] == pytest.approx(1.5)  # (2.0 + 1.0) / 2: the failed sample's 1.0 is out
    assert logs["rewards/one/mean"] == 1.0


def test_environment_factory_a_failed_episode_is_unscorable_beside_a_reward_model(output_dir):
    """The same with a reward model (a tiny random one) listed before Env.reward, the episode
    failing as Env.reward grades its answer: the model still runs on the whole batch, its score
    of the failed sample is dropped (advantage 0)."""
    from test_trl_reward_models import _reward_model

    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    batch, logs = _environment_factory_step(output_dir, _reward_model(tiny_tokenizer("qwen2.5")), "answer")
    advantages = batch["advantages"].tolist()
    assert advantages[0] == 0.0
    assert advantages[1:] == pytest.approx([SCORED_PAIR, -SCORED_PAIR], abs=1e-2)  # (right: 1.0 more)
    assert math.isfinite(logs["rewards//mean"]) and math.isfinite(logs["reward"])


def test_rollout_func_a_failed_episode_is_unscorable_beside_a_reward_function_of_yours(qwen_tokenizer, output_dir):
    """TRLRollout, 2 prompts of 3 samples (failed, right, wrong) with the user's function beside
    rollout.reward: each failed sample's advantage is 0 and its tokens are out of the loss; the
    scored two of each group are normalised over themselves."""
    from flaky import ENV_ID, scripted_by_kind
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    scripted = scripted_by_kind(fault=0, wrong=2)
    rollout = TRLRollout(ENV_ID, qwen_tokenizer, env_kwargs={"fail_marker": "FAULT"}, generate=scripted)
    config = _config(output_dir)
    config.per_device_train_batch_size = 6
    try:
        trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=[rollout.reward, one], args=config,
                              train_dataset=rollout.dataset(4), rollout_func=rollout, processing_class=qwen_tokenizer)
        batch, logs = _step(trainer)
    finally:
        rollout.close()
    assert logs["env/outcome/tool_unavailable"] == 2 and logs["env/outcome/scored"] == 4
    mask = (batch["completion_mask"] * batch["tool_mask"]).sum(dim=1).view(-1, 3)
    assert (mask[:, 0] == 0).all() and (mask[:, 1:] > 0).all()
    for group in batch["advantages"].view(-1, 3).tolist():
        assert group[0] == 0.0
        assert group[1:] == pytest.approx([SCORED_PAIR, -SCORED_PAIR], abs=1e-3)
    assert logs["reward"] == pytest.approx(1.5)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """What each process of a two-process run wrote (see :func:`_runs`)."""
    from launch import two_processes_raised

    return two_processes_raised(__file__, tmp_path_factory.mktemp("trl-failed-rows"))


def test_on_two_processes_a_failed_episode_is_unscorable_in_its_split_group(two_processes):
    """A real GRPOTrainer on two CPU processes (gloo, loopback only), environment_factory, 2
    samples a prompt and 3 a process: process 0 has [a, a, b], process 1 [b, c, c]. Process 1's
    b fails as Env.reward grades it; the user's function and a reward model, listed before
    Env.reward, score every row. Its row is NaN in every column on both processes' logs, its
    advantage is 0, b's other member (process 0's) is alone in its group's baseline (advantage 0),
    and groups a and c are normalised as usual."""
    zero, one = two_processes
    assert zero["failed"] == [False] * 3 and one["failed"] == [True, False, False]
    for run in (zero, one):
        assert run["error"] is None
        assert run["advantages"] == zero["advantages"]  # (TRL's gathered batch: the same on both)
        ones = run["rewards"]["one"]
        assert [math.isnan(r) for r in ones] == [False, False, False, True, False, False]
        assert [math.isnan(r) for r in run["rewards"][""]] == [False, False, False, True, False, False]
    advantages = zero["advantages"]
    assert advantages[2:4] == [0.0, 0.0]
    for pair in (advantages[0:2], advantages[4:6]):  # right, then wrong
        assert pair == pytest.approx([SCORED_PAIR, -SCORED_PAIR], abs=1e-2)


def _runs(out_dir, rank):
    """One GRPO step; this process writes its failed rows, TRL's gathered advantages and reward
    columns, and what training raised to ``failures<rank>.json``."""
    import json

    from flaky import ENV_ID
    from test_trl_reward_models import _reward_model
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    Env = trl_environment(ENV_ID, fail_marker="FAULT")
    args = GRPOConfig(output_dir=tempfile.mkdtemp(dir=out_dir), per_device_train_batch_size=3, num_generations=2,
                      max_completion_length=64, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no", dataloader_num_workers=0)
    trainer = GRPOTrainer(model=tiny_model(tokenizer), args=args, processing_class=tokenizer,
                          reward_funcs=[one, _reward_model(tokenizer), Env.reward],
                          reward_processing_classes=[tokenizer] * 3, train_dataset=Env.dataset(6),
                          environment_factory=Env)

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = [f"\\boxed{{{e.env.unwrapped.episode.task.answer}}}" for e in trainer.environments]
        if rank == 0:
            texts[1] = "\\boxed{-1}"  # a: [right, wrong]; b: right
        else:
            texts[0], texts[2] = "FAULT \\boxed{0}", "\\boxed{-1}"  # b fails; c: [right, wrong]
        return [tokenizer.encode(t) + [tokenizer.eos_token_id] for t in texts], None

    trainer._generate_single_turn = generate
    error = None
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001  (what the test reads)
        error = f"{type(exc).__name__}: {exc}"
    result = {"error": error, "failed": [e.reward is None for e in trainer.environments],
              "advantages": list(trainer._logs["advantages"]),
              "rewards": {name: list(values) for name, values in trainer._logs["rewards"].items()}}
    Path(out_dir, f"failures{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    from launch import in_gloo_group

    in_gloo_group(sys.argv[1], _runs)
