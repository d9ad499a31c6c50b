"""TRL's GRPOTrainer on CPU with a tiny random model built here: a real training step through
rollout_func (multi-turn, token-exact) and through environment_factory."""

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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

    from flaky import scripted_by_kind

    scripted = scripted_by_kind(fault=None, wrong=1, kinds=2)  # one of each prompt's two answers is wrong
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
    assert env.final_answer(answer=answer) == "Answer recorded."  # the bare answer, as the schema asks
    assert Env.reward([""], environments=[env]) == [1.0] and set(env.reward_components.values()) == {1.0}
    assert env.calculator(expression="1+1").startswith("Error: the episode is over")
    env.reset(**rows[1])
    env.final_answer(answer=f"\\boxed{{{answer}}}")  # or boxed, as the env's prompt says
    assert Env.reward([""], environments=[env]) == [1.0]
    env.reset(**rows[0])  # a fresh episode: an unfinished one is graded as it stands
    assert Env.reward([[{"role": "assistant", "content": "no answer"}]], environments=[env]) == [0.0]


def test_a_grpo_step_through_environment_factory(output_dir):
    """With Qwen2.5's real template, which TRL knows how to parse tool calls from."""
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    Env = trl_environment("benchmax/Math-v0")
    trainer = GRPOTrainer(model=tiny_model(tokenizer), args=_config(output_dir), train_dataset=Env.dataset(8),
                          environment_factory=Env, reward_funcs=Env.reward, processing_class=tokenizer)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert any(key.startswith("rewards/") and Env.__name__ in key for key in logs)  # Env.reward is the reward
    assert all(isinstance(e, Env) for e in trainer.environments)


def test_a_reply_that_follows_the_prompt_earns_the_reward_through_trls_reward_path(output_dir):
    """The env's prompt says: reply without a tool call, the answer in \\boxed{}. TRL scores it
    through its own _calculate_rewards (completions and environments as it passes them)."""
    import gymnasium as gym
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    Env = trl_environment("benchmax/Math-v0")
    rows = Env.dataset(4)
    assert "without a tool call" in rows[0]["prompt"][0]["content"] and "\\boxed{}" in rows[0]["prompt"][0]["content"]
    trainer = GRPOTrainer(model=tiny_model(tokenizer), args=_config(output_dir), train_dataset=rows,
                          environment_factory=Env, reward_funcs=Env.reward, processing_class=tokenizer)
    twin = gym.make("benchmax/Math-v0")
    answers = []
    for row in rows:
        twin.reset(options={"task_index": row["task_index"]})
        answers.append(twin.unwrapped.episode.task.answer)
    twin.close()
    trainer.environments = [Env() for _ in rows]
    for env, row in zip(trainer.environments, rows):
        env.reset(**row)
    replies = [f"The answer is \\boxed{{{answers[0]}}}", f"\\boxed{{{answers[1]}}}", "I do not know", ""]
    completions = [[{"role": "assistant", "content": r}] for r in replies]
    rewards = trainer._calculate_rewards([dict(r) for r in rows], [r["prompt"] for r in rows], completions,
                                         [tokenizer.encode(r) for r in replies])
    assert rewards[:, 0].tolist() == [1.0, 1.0, 0.0, 0.0]


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


def test_the_trainers_own_generation_asks_for_what_is_left(qwen_tokenizer, output_dir):
    """generate_turn sets GRPOTrainer's own limit for the call (and restores it): a real
    transformers generation of a random model stops at what was asked."""
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout, generate_turn

    rollout = TRLRollout("benchmax/Math-v0", qwen_tokenizer)
    trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=rollout.reward, args=_config(output_dir),
                          train_dataset=rollout.dataset(4), rollout_func=rollout, processing_class=qwen_tokenizer)
    seen = []
    original = trainer._generate_single_turn

    def spy(*args, **kwargs):
        seen.append((trainer.generation_config.max_new_tokens, trainer.generation_kwargs["max_new_tokens"]))
        return original(*args, **kwargs)

    trainer._generate_single_turn = spy
    prompts = [qwen_tokenizer.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")] * 3
    ids, _ = generate_turn(trainer, prompts, 5)
    assert seen == [(5, 5)] and all(1 <= len(i) <= 5 for i in ids)
    assert trainer.generation_config.max_new_tokens == 48 == trainer.generation_kwargs["max_new_tokens"]
    rollout.close()


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(budget=st.integers(1, 200), lengths=st.lists(st.integers(1, 90), min_size=1, max_size=8))
def test_budget_property_each_turn_asks_for_what_is_left(qwen_tokenizer, budget, lengths):
    """Sessions of one batch ask, turn by turn, for exactly what each has left (grouped by it),
    never 0; completions fit; an episode the budget cut is truncated and graded."""
    from types import SimpleNamespace

    from benchmax_gym.adapters.trl import TRLRollout

    asked, replies = [], list(lengths)
    call = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'

    def scripted(trainer, sessions):
        assert len({s.budget for s in sessions}) == 1  # one limit per call
        asked.extend((s.budget, budget - len(s.episode.completion_ids)) for s in sessions)
        out = []
        for s in sessions:
            n = replies.pop(0) if replies else 3
            ids = (s.chat.encode(call) + s.chat.encode(" x" * n))[:n] + [qwen_tokenizer.eos_token_id]
            out.append(ids[: s.budget])
        return out, [None] * len(out)

    rollout = TRLRollout("benchmax/Math-v0", qwen_tokenizer, env_kwargs={"max_turns": 4}, generate=scripted)
    trainer = SimpleNamespace(max_completion_length=budget, _metrics=None)
    out = rollout(list(rollout.dataset(3)["prompt"]), trainer)
    assert all(a == left and a >= 1 for a, left in asked)
    assert all(len(c) <= budget and m[-1] == 1 for c, m in zip(out["completion_ids"], out["env_mask"]))
    for session in rollout._sessions[next(iter(rollout._sessions))][:3]:
        assert session.episode.reward_components  # graded, cut or not
    rollout.close()


def test_a_grpo_step_on_a_batch_mixing_math_excel_and_crm_rows(qwen_tokenizer, output_dir):
    """One dataset of three envs: each row plays its own env, and the batch goes through
    GRPOTrainer's own post-processing (advantages, loss, logged metrics) in one step."""
    import datasets
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    envs = ["benchmax/Math-v0", "benchmax/Excel-v0", "benchmax/CRM-v0"]
    played = []

    def scripted(trainer, sessions):
        played.extend(s.env.spec.id for s in sessions)
        return [model_ids(s.chat, "<answer>1</answer>") for s in sessions], [None] * len(sessions)

    rollout = TRLRollout(envs[0], qwen_tokenizer, generate=scripted)
    rows = datasets.concatenate_datasets([TRLRollout(e, qwen_tokenizer).dataset(1) for e in envs])
    trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=rollout.reward,
                          args=_config(output_dir, per_device_train_batch_size=6, max_completion_length=4096,
                                       shuffle_dataset=False),
                          train_dataset=rows, rollout_func=rollout, processing_class=qwen_tokenizer)
    trainer.train()
    assert sorted(set(played)) == sorted(envs)  # each row played its own env
    logs = trainer.state.log_history[0]
    assert logs["env/turns"] == 1.0 and "env/reward/correct" in logs
    rollout.close()


def _flaky_grpo_step(qwen_tokenizer, output_dir, failed_group):
    """One GRPO step on FlakyMath: each prompt's 3 samples answer right, wrong, and lose their
    tool backend (a failure, issue 29). Returns the scored batch GRPOTrainer built and its logs."""
    from flaky import ENV_ID, scripted_by_kind
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    scripted = scripted_by_kind(fault=2, wrong=1)
    rollout = TRLRollout(ENV_ID, qwen_tokenizer, env_kwargs={"fail_marker": "FAULT"}, generate=scripted,
                         failed_group=failed_group)
    trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=rollout.reward,
                          args=_config(output_dir, per_device_train_batch_size=6, num_generations=3,
                                       max_completion_length=2048),
                          train_dataset=rollout.dataset(4), rollout_func=rollout, processing_class=qwen_tokenizer)
    batches = []
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(original(inputs)) or batches[-1]
    trainer.train()
    rollout.close()
    return batches[0], trainer.state.log_history[0]


def test_a_failed_sample_never_enters_the_loss_and_its_group_renormalises(qwen_tokenizer, output_dir):
    import torch

    batch, logs = _flaky_grpo_step(qwen_tokenizer, output_dir, "renormalise")
    mask = (batch["completion_mask"] * batch["tool_mask"]).sum(dim=1)
    advantages = batch["advantages"].view(-1, 3)
    assert (mask.view(-1, 3)[:, 2] == 0).all() and (mask.view(-1, 3)[:, :2] > 0).all()  # no failed token in the loss
    assert (advantages[:, 2] == 0).all()
    scored = torch.tensor([1.0, 0.0])  # what the group's other two earn, without the failed sample
    expected = (scored - scored.mean()) / (scored.std() + 1e-4)
    for group in advantages:
        assert torch.allclose(group[:2], expected)
    assert logs["env/outcome/tool_unavailable"] == 2 and logs["env/outcome/scored"] == 4
    assert logs["env/reward"] == 0.5  # over the scored episodes only


def test_failed_group_drop_leaves_the_whole_group_out(qwen_tokenizer, output_dir):
    batch, logs = _flaky_grpo_step(qwen_tokenizer, output_dir, "drop")
    assert (batch["tool_mask"] * batch["completion_mask"]).sum() == 0 and (batch["advantages"] == 0).all()
    assert logs["env/outcome/tool_unavailable"] == 2


def test_environment_factory_gives_a_failed_episode_no_reward():
    """A tool whose backend is gone mid-episode (FlakyMath task 1): Env.reward gives None, which
    TRL's _calculate_rewards reads as unscorable (NaN: out of the baseline), never 0."""
    from flaky import ENV_ID

    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment(ENV_ID, fail_tasks=[1])
    env = Env()
    env.reset(task_index=1)
    env.calculator(expression="1+1")
    assert env.done and Env.reward([""], environments=[env]) == [None]
    env.reset(task_index=0)
    assert Env.reward([[{"role": "assistant", "content": "no answer"}]], environments=[env]) == [0.0]


def test_a_simulated_customers_turns_are_outside_env_mask_in_a_grpo_step(qwen_tokenizer, output_dir, customer_words):
    """Issue 31: through rollout_func and a real GRPO step, the customer's answers are environment
    tokens (``env_mask`` 0), the agent's turns around them 1, and the episodes earn their reward."""
    from customer import SERVICE, split_by_mask
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    solvers, seen = {}, []

    def scripted(trainer, sessions):
        ids = []
        for s in sessions:
            if s.info["turn"] == 0:
                solvers[id(s)] = s.env.unwrapped.reference_solver()
            ids.append(model_ids(s.chat, solvers[id(s)](s.obs, s.info)))
        return ids, [None] * len(ids)

    class Spy(TRLRollout):
        def __call__(self, prompts, trainer):
            out = super().__call__(prompts, trainer)
            seen.append(out)
            return out

    rollout = Spy(SERVICE, qwen_tokenizer, generate=scripted)
    trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=rollout.reward,
                          args=_config(output_dir, per_device_train_batch_size=2, max_completion_length=4096),
                          train_dataset=rollout.dataset(1), rollout_func=rollout, processing_class=qwen_tokenizer)
    trainer.train()
    out = seen[0]
    assert out["env_reward"] == [1.0, 1.0]
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        env_text, model_text = split_by_mask(qwen_tokenizer, ids, mask)
        for said in customer_words(0)[:-1]:
            assert said in env_text and said not in model_text
    rollout.close()


def test_environment_factory_talks_to_a_simulated_customer_through_message_user():
    """Issue 31: TRL ends its loop at a reply without a call, so with a simulated user the class
    has a ``message_user`` tool; the reference agent's plan played through the methods earns 1."""
    from customer import SERVICE

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.envs.crm.service import service_plan

    Env = trl_environment(SERVICE)
    env = Env()
    env.reset(task_index=0)
    plan = service_plan(env.env.unwrapped.episode.task)
    step, heard = next(plan), []
    while True:
        name, arguments = step
        result = env.message_user(arguments) if name == "say" else getattr(env, name)(**arguments)
        heard.append(result)
        try:
            step = plan.send(result)
        except StopIteration:
            break
    assert "order number is" in heard[0] and heard[-1] == "The user ended the conversation."
    assert Env.reward(completions=[[]], environments=[env]) == [1.0]
    assert "message_user" not in dir(trl_environment("benchmax/Math-v0"))
    env.env.close()


def test_per_turn_rewards_reach_grpo_as_the_return_and_reward_functions_as_turn_rewards(qwen_tokenizer, output_dir):
    """dense_rewards (issue 30) through a real GRPO step: the env reward is the return, every reward
    function gets ``turn_rewards``, and ``env/turn_reward`` is logged."""
    from trl import GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    def solver(trainer, sessions):
        ids = [model_ids(s.chat, s.env.unwrapped.reference_solver()(s.obs, s.info)) for s in sessions]
        return ids, [None] * len(ids)

    rollout = TRLRollout("benchmax/Math-v0", qwen_tokenizer, generate=solver,
                         env_kwargs={"dense_rewards": True, "python_tool": False})
    received = []

    def per_turn(completions, turn_rewards, **kwargs):
        received.extend(turn_rewards)
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=[rollout.reward, per_turn],
                          args=_config(output_dir, max_completion_length=2048), train_dataset=rollout.dataset(8),
                          rollout_func=rollout, processing_class=qwen_tokenizer)
    trainer.train()
    assert len(received) == 4 and all(t == [pytest.approx(0.2), 1.0] for t in received)
    logs = trainer.state.log_history[0]
    assert logs["env/turn_reward"] == pytest.approx(0.2) and logs["env/reward"] == pytest.approx(1.2)
    rollout.close()


def test_environment_factory_sums_per_turn_rewards_and_pays_a_repeat_nothing():
    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment("benchmax/Math-v0", dense_rewards=True, python_tool=False)
    env = Env()
    env.reset(task_index=0)
    steps = env.env.unwrapped.episode.task.solution
    for expression in [*steps, steps[0]]:
        env.calculator(expression=expression)
    answer = env.env.unwrapped.episode.task.answer
    reward = Env.reward([[{"role": "assistant", "content": f"\\boxed{{{answer}}}"}]], environments=[env])
    share = 0.2 / len(steps)
    assert env.turn_rewards == pytest.approx([share] * len(steps) + [0.0, 1.0])
    assert reward == [pytest.approx(1.2)] and env.reward_components["dense"] == 1.0
    env.env.close()
