"""verl: the "benchmax" agent loop built exactly as verl's AgentLoopWorker builds one (hydra
instantiate from its registry) and run against a scripted LLM server returning verl's TokenOutput."""

import asyncio
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hydra
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.workers.rollout.replica import TokenOutput

from benchmax_gym.adapters.tokens import outcome_counts
from benchmax_gym.adapters.verl import BenchmaxAgentLoop, task_rows


class SolverServer:
    """verl's server manager ``generate`` with each trajectory answered by its task's solver."""

    def __init__(self, tokenizer, env_id):
        import gymnasium as gym

        self.tokenizer, self.env_id, self.gym = tokenizer, env_id, gym
        self.trajectories, self.requests = {}, []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.requests.append((request_id, sampling_params["max_tokens"]))
        if request_id not in self.trajectories:
            text = self.tokenizer.decode(prompt_ids)
            twin = self.gym.make(self.env_id)
            index = next(i for i in range(64) if twin.reset(options={"task_index": i})[0].split("\n\n")[-1] in text)
            obs, info = twin.reset(options={"task_index": index})
            self.trajectories[request_id] = [twin, obs, info, twin.unwrapped.reference_solver()]
        twin, obs, info, solver = self.trajectories[request_id]
        action = solver(obs, info)
        obs, _, term, trunc, info = twin.step(action)
        self.trajectories[request_id][1:3] = [obs, info]
        ids = self.tokenizer.encode(action, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def _agent_loop(tokenizer, server, response_length=2048, prompt_length=4096):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": prompt_length,
                                                                 "response_length": response_length}},
                               "data": {"apply_chat_template_kwargs": {}}})
    return hydra.utils.instantiate(config=_agent_loop_registry["benchmax"], trainer_config=DictConfigWrap(config),
                                   server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
                                   dataset_cls=None, data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))


def test_the_registered_agent_loop_plays_concurrent_trajectories_token_exact(qwen_tokenizer):
    from benchmax_gym.adapters import ChatTemplate, TokenSession
    from benchmax_gym.testing.tokenizers import model_ids

    server = SolverServer(qwen_tokenizer, "benchmax/Math-v0")
    rows = task_rows("benchmax/Math-v0", 4)
    loop = _agent_loop(qwen_tokenizer, server)
    assert isinstance(loop, BenchmaxAgentLoop)

    async def main():
        return await asyncio.gather(*(loop.run({"temperature": 1.0}, **row) for row in rows))

    outputs = asyncio.run(main())
    chat = ChatTemplate(qwen_tokenizer)
    for row, out in zip(rows, outputs):
        assert out.reward_score == 1.0 and out.extra_fields["reward_components"]["correct"] == 1.0
        assert out.extra_fields["reward_extra_info"] == {"reward": 1.0, "turns": out.extra_fields["reward_extra_info"]["turns"],
                                                         "tool_errors": 0.0, "truncated": 0.0, "turn_reward": 0.0,
                                                         **outcome_counts([{"env/outcome/scored": 1.0}])}
        # the same ids as a TokenSession fed the same replies (checked against the template elsewhere)
        reference = TokenSession("benchmax/Math-v0", chat)
        reference.reset(options={"task_index": row["extra_info"]["task_index"]})
        solver = reference.env.unwrapped.reference_solver()
        while not reference.done:
            reference.step(model_ids(chat, solver(reference.obs, reference.info)))
        assert out.prompt_ids == reference.episode.prompt_ids
        assert out.response_ids == reference.episode.completion_ids
        assert out.response_mask == reference.episode.loss_mask
        assert [lp for lp, m in zip(out.response_logprobs, out.response_mask) if m] == [-0.5] * sum(out.response_mask)
        reference.close()
    ids = [r for r, _ in server.requests]
    assert len(set(ids)) == 4 and len(ids) > 4  # one request id per trajectory, several turns each


def test_the_response_length_bounds_every_request_and_the_response(qwen_tokenizer):
    server = SolverServer(qwen_tokenizer, "benchmax/Math-v0")
    loop = _agent_loop(qwen_tokenizer, server, response_length=40)
    out = asyncio.run(loop.run({}, **task_rows("benchmax/Math-v0", 1)[0]))
    assert len(out.response_ids) <= 40 and len(out.response_mask) == len(out.response_ids)
    assert server.requests[0][1] == 40 and all(m <= 40 for _, m in server.requests)


def test_a_server_that_fails_mid_trajectory_gives_model_error_and_no_loss_tokens(qwen_tokenizer):
    """The LLM server raising on a trajectory's second request (a 500, a timeout): that
    trajectory ends model_error, reward_score NaN, response_mask all 0; the others score."""
    import math

    class Failing(SolverServer):
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            # (the first trajectory to ask, on its second request: the smallest id, as before, was a
            # race - another trajectory's first request could come later with a smaller one)
            if request_id in self.trajectories and request_id == next(iter(self.trajectories)):
                raise TimeoutError("the rollout server did not answer")
            return await super().generate(request_id, prompt_ids, sampling_params, **kwargs)

    loop = _agent_loop(qwen_tokenizer, Failing(qwen_tokenizer, "benchmax/Math-v0"))

    async def main():
        return await asyncio.gather(*(loop.run({}, **row) for row in task_rows("benchmax/Math-v0", 3)))

    outputs = asyncio.run(main())
    failed = [o for o in outputs if o.extra_fields["reward_extra_info"]["env/outcome/model_error"] == 1.0]
    assert len(failed) == 1 and math.isnan(failed[0].reward_score) and not any(failed[0].response_mask)
    assert sorted(o.reward_score for o in outputs if o is not failed[0]) == [1.0, 1.0]


def test_an_env_in_the_agent_loop_config_file(qwen_tokenizer):
    server = SolverServer(qwen_tokenizer, "benchmax/Math-v0")
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 2048}},
                               "data": {}})
    entry = {"_target_": "benchmax_gym.adapters.verl.BenchmaxAgentLoop", "env_id": "benchmax/Math-v0",
             "env_kwargs": {"max_turns": 4}}
    loop = hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config), server_manager=server,
                                   tokenizer=qwen_tokenizer, processor=None, hf_model_type=None, dataset_cls=None,
                                   data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
    out = asyncio.run(loop.run({}, extra_info={"task_index": 2}, raw_prompt=[]))
    assert out.reward_score == 1.0


def test_a_wrong_env_in_the_config_fails_when_verl_builds_the_loop(qwen_tokenizer):
    import gymnasium as gym
    import pytest

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 64}}, "data": {}})
    for env_id, kwargs, error in [("benchmax/Mth-v0", {}, gym.error.Error), ("benchmax/Math-v0", {"max_turn": 2}, TypeError)]:
        entry = {"_target_": "benchmax_gym.adapters.verl.BenchmaxAgentLoop", "env_id": env_id, "env_kwargs": kwargs}
        with pytest.raises(Exception) as caught:
            hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config), server_manager=None,
                                    tokenizer=qwen_tokenizer, processor=None, hf_model_type=None, dataset_cls=None,
                                    data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
        assert isinstance(caught.value, error) or isinstance(caught.value.__cause__, error), caught.value
        assert ("Mth" if "Mth" in env_id else "max_turn") in str(caught.value)


# -- verl's own path in a fresh worker process, from the launch script's own overrides ----------

def _verl_run(tmp_path, env_ids, reply_tokens, response_length, n=2):
    import json

    import pandas as pd

    from launch import run_fresh, script_argv, tiny_model_dir

    data = tmp_path / "data" / "benchmax-math"
    data.mkdir(parents=True)
    rows = [r for env_id in env_ids for r in task_rows(env_id, n)]
    for name in ("train", "validation"):
        pd.DataFrame(rows).to_parquet(data / f"{name}.parquet")
    argv = script_argv("verl_math.sh", tmp_path, f"actor_rollout_ref.model.path={tiny_model_dir(tmp_path / 'model')}",
                       f"data.max_response_length={response_length}", "data.max_prompt_length=8192")
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"overrides": argv[2:], "reply_tokens": reply_tokens}))
    return run_fresh([Path(__file__).with_name("verl_worker.py"), spec])


def test_the_launch_script_runs_a_mixed_batch_through_a_fresh_agent_loop_worker(tmp_path):
    """verl_math.sh's overrides composed with verl's Hydra schema; a fresh AgentLoopWorker finds
    "benchmax" through the config file alone; Math + Excel + CRM rows in one batch get through
    verl's post-processing (its reward_extra_keys come from the first sample)."""
    envs = ["benchmax/Math-v0", "benchmax/Excel-v0", "benchmax/CRM-v0"]
    out = _verl_run(tmp_path, envs, reply_tokens=24, response_length=1024)
    assert out["imported_adapter"]  # by the config file's _target_, in the worker itself
    assert out["env_ids"] == [e for e in envs for _ in range(2)]
    assert sorted(out["reward_extra_keys"]) == sorted(["reward", "tool_errors", "truncated", "turns", "turn_reward",
                                                       *outcome_counts([])])
    assert {"correct"} <= set(out["components"][0]) and out["components"][0] != out["components"][-1]
    assert out["responses_shape"] == [6, 1024]


def test_replies_cut_by_response_length_fit_verls_width_and_are_graded(tmp_path):
    """The issue's case through verl's own post-processing: replies longer than what is left
    (CRM included: its cut used to raise ResetNeeded); responses fit ``response_length``."""
    out = _verl_run(tmp_path, ["benchmax/Math-v0", "benchmax/CRM-v0"], reply_tokens=30, response_length=40, n=1)
    assert out["responses_shape"] == [2, 40]
    assert all(1 <= r["max_tokens"] <= 40 for r in out["requests"])
    assert out["truncated"] == [1.0, 1.0] and all(out["components"])  # cut, graded as it stands


class LengthServer:
    """Replies of scripted lengths (a tool call padded with text), honouring max_tokens."""

    def __init__(self, tokenizer, lengths):
        self.tokenizer, self.lengths, self.requests = tokenizer, list(lengths), []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        limit = sampling_params["max_tokens"]
        self.requests.append(limit)
        length = self.lengths.pop(0) if self.lengths else 4
        call = self.tokenizer.encode('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', add_special_tokens=False)
        ids = (call + self.tokenizer.encode(" x" * length, add_special_tokens=False))[:length]
        ids = (ids + [self.tokenizer.eos_token_id])[:limit]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(response_length=st.integers(1, 160), lengths=st.lists(st.integers(1, 90), max_size=5))
def test_budget_property_every_request_within_what_is_left(qwen_tokenizer, response_length, lengths):
    server = LengthServer(qwen_tokenizer, lengths)
    loop = _agent_loop(qwen_tokenizer, server, response_length=response_length)
    out = asyncio.run(loop.run({}, **task_rows("benchmax/Math-v0", 1)[0]))
    assert all(1 <= m <= response_length for m in server.requests)
    assert len(out.response_ids) <= response_length and len(out.response_mask) == len(out.response_ids)
    assert out.response_mask[-1] == 1  # never ends on env ids cut short
    assert out.extra_fields["reward_components"]  # graded, cut or not


def test_a_prompt_longer_than_prompt_length_fails_naming_it_before_anything_is_generated(qwen_tokenizer):
    """verl pads prompts to ``prompt_length``: a longer one made a wider row, and its batch's
    torch.cat failed after every trajectory had played. One that fits exactly plays."""
    import pytest

    row = task_rows("benchmax/Math-v0", 1)[0]
    fits = asyncio.run(_agent_loop(qwen_tokenizer, SolverServer(qwen_tokenizer, "benchmax/Math-v0")).run({}, **row))
    width = len(fits.prompt_ids)
    server = SolverServer(qwen_tokenizer, "benchmax/Math-v0")
    with pytest.raises(ValueError, match=f"prompt is {width} tokens, rollout.prompt_length is {width - 1}.*"
                                         "data.max_prompt_length"):
        asyncio.run(_agent_loop(qwen_tokenizer, server, prompt_length=width - 1).run({}, **row))
    assert server.requests == []
    out = asyncio.run(_agent_loop(qwen_tokenizer, server, prompt_length=width).run({}, **row))
    assert out.prompt_ids == fits.prompt_ids and out.reward_score == 1.0


def test_envs_are_built_reset_and_stepped_off_the_workers_event_loop(qwen_tokenizer, monkeypatch):
    """verl's worker serves every trajectory from one event loop: a CRM database copy or tool
    run on it would stall the others. Each env call here runs in another thread."""
    import threading

    import benchmax_gym.adapters.tokens as tokens
    from benchmax_gym.envs.crm.env import CRMEnv

    threads = []
    make_env = tokens.make_env  # (what the agent loop's amake_env calls, in its thread)
    monkeypatch.setattr(tokens, "make_env", lambda *a: threads.append(("make", threading.get_ident())) or make_env(*a))
    for name in ("reset", "step"):
        original = getattr(CRMEnv, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            threads.append((_name, threading.get_ident()))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(CRMEnv, name, spy)
    server = LengthServer(qwen_tokenizer, [20, 20])
    loop = _agent_loop(qwen_tokenizer, server, response_length=256)
    row = task_rows("benchmax/CRM-v0", 1)[0]
    threads.clear()

    async def main():
        return threading.get_ident(), await loop.run({}, **row)

    loop_thread, out = asyncio.run(main())
    assert {name for name, _ in threads} == {"make", "reset", "step"}
    assert all(ident != loop_thread for _, ident in threads), (loop_thread, threads)


class FlakyServer(SolverServer):
    """The solver's replies, or (``kind``) a wrong final answer, or a reply that loses the tool
    backend (FlakyMath's injected failure)."""

    def __init__(self, tokenizer, kind):
        super().__init__(tokenizer, "benchmax/Math-v0")
        self.kind, self.turns = kind, {}

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        out = await super().generate(request_id, prompt_ids, sampling_params, **kwargs)
        turn = self.turns[request_id] = self.turns.get(request_id, -1) + 1
        text = {"fault": "FAULT", "wrong": "<answer>-1</answer>" if turn else None}.get(self.kind)
        if text is None:
            return out
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def _flaky_batch(qwen_tokenizer):
    """Two groups of three trajectories (right, wrong, failed) as verl's trainer holds them for
    its advantage step: rewards on each response's last token, response masks, uids."""
    import numpy as np
    import torch
    from flaky import ENV_ID
    from verl.protocol import DataProto

    rows = task_rows(ENV_ID, 2, fail_marker="FAULT")
    loops = {kind: _agent_loop(qwen_tokenizer, FlakyServer(qwen_tokenizer, kind)) for kind in ("right", "wrong", "fault")}

    async def main():
        return await asyncio.gather(*(loops[k].run({}, **row) for row in rows for k in loops))

    outputs = asyncio.run(main())
    width = max(len(o.response_ids) for o in outputs)
    rewards, masks = torch.zeros(len(outputs), width), torch.zeros(len(outputs), width, dtype=torch.int64)
    for i, out in enumerate(outputs):
        rewards[i, len(out.response_ids) - 1] = out.reward_score
        masks[i, :len(out.response_mask)] = torch.tensor(out.response_mask)
    uids = np.array([str(i // 3) for i in range(len(outputs))], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": masks},
                               non_tensors={"uid": uids})
    return data, outputs


def test_a_failed_trajectory_never_enters_the_loss_and_its_group_renormalises(qwen_tokenizer):
    """verl's advantage step with benchmax_grpo, looked up in verl's registry and called as
    ray_trainer.compute_advantage calls it (that module needs torchdata, not installed): the failed
    trajectory has no token in the loss and advantage 0; the others get the advantages GRPO gives
    their group without it. benchmax_grpo_drop leaves the group out."""
    import math

    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    def compute_advantage(data, adv_estimator):  # ray_trainer.compute_advantage's call for such estimators
        return get_adv_estimator_fn(adv_estimator)(
            token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
            config=None, index=data.non_tensor_batch["uid"])[0]

    data, outputs = _flaky_batch(qwen_tokenizer)
    assert [o.extra_fields["reward_extra_info"]["env/outcome/tool_unavailable"] for o in outputs] == [0, 0, 1] * 2
    assert [o.reward_score for o in outputs][:2] == [1.0, 0.0] and math.isnan(outputs[2].reward_score)
    failed = data.batch["response_mask"].view(2, 3, -1)[:, 2]
    assert failed.sum() == 0 and all(any(o.response_ids) for o in outputs)  # generated, masked out
    advantages = compute_advantage(data, adv_estimator="benchmax_grpo")
    scores = (advantages.sum(-1) / data.batch["response_mask"].sum(-1).clamp(min=1)).view(2, 3)
    scored = torch.tensor([1.0, 0.0])
    expected = (scored - scored.mean()) / (scored.std() + 1e-6)
    assert torch.allclose(scores[:, :2], expected.expand(2, 2)) and (scores[:, 2] == 0).all()
    assert not torch.isnan(advantages).any()
    data, _ = _flaky_batch(qwen_tokenizer)
    assert (compute_advantage(data, adv_estimator="benchmax_grpo_drop") == 0).all()


def test_a_group_estimator_ranks_each_uid_group_without_its_failures(qwen_tokenizer):
    """register_group_estimator: verl's advantage step, looked up in verl's registry, scores each
    group with a reward-only GroupRubric (here best-of-k), failures out, then GRPO."""
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from benchmax_gym.adapters.verl import register_group_estimator
    from benchmax_gym.core.group import GroupRubric, best_of_k, diversity_penalty

    import pytest

    with pytest.raises(ValueError, match="diverse"):
        register_group_estimator("benchmax_test_diverse", GroupRubric([("diverse", diversity_penalty)]))
    seen = []

    def spy(rewards):
        seen.append(list(rewards))
        return best_of_k(rewards)

    name = register_group_estimator("benchmax_test_best_of_k", GroupRubric([("best", spy)], combine="replace"))
    data, _ = _flaky_batch(qwen_tokenizer)
    advantages = get_adv_estimator_fn(name)(
        token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
        config=None, index=data.non_tensor_batch["uid"])[0]
    assert seen == [[1.0, 0.0], [1.0, 0.0]]  # each uid group's scored members only
    scores = (advantages.sum(-1) / data.batch["response_mask"].sum(-1).clamp(min=1)).view(2, 3)
    scored = torch.tensor([1.0, 0.0])
    expected = (scored - scored.mean()) / (scored.std() + 1e-6)
    assert torch.allclose(scores[:, :2], expected.expand(2, 2)) and (scores[:, 2] == 0).all()


def test_the_launch_script_trains_with_benchmax_grpo_in_verls_own_processes(tmp_path):
    """verl_math.sh asks for benchmax_grpo, which only importing the adapter registers: verl's
    driver imports nothing of ours, and advantages are computed in its TaskRunner, a Ray worker.
    The script's overrides, composed with verl's Hydra schema, ask for no critic and
    name VERL_USE_EXTERNAL_MODULES in the Ray runtime env; a fresh process with that env (as Ray
    starts the TaskRunner) resolves the estimator through verl's registry alone, and it keeps a
    failed trajectory (NaN) out of its group."""
    import json
    import os
    import subprocess
    import sys

    from launch import run_fresh, script_argv, tiny_model_dir

    argv = script_argv("verl_math.sh", tmp_path, f"actor_rollout_ref.model.path={tiny_model_dir(tmp_path / 'model')}")
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    compose = tmp_path / "compose.py"
    compose.write_text(
        "import json, os, sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from omegaconf import OmegaConf\n"
        "from verl.trainer import main_ppo\n"
        "from verl.trainer.ppo.utils import need_critic\n"
        "with initialize_config_dir(config_dir=os.path.join(os.path.dirname(main_ppo.__file__), 'config'), "
        "version_base=None):\n"
        "    config = compose(config_name='ppo_trainer', overrides=json.loads(sys.argv[1]))\n"
        "print(json.dumps({'adv_estimator': config.algorithm.adv_estimator, 'critic': need_critic(config), "
        "'env_vars': OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env.env_vars), "
        "'ours': [m for m in sys.modules if m.startswith('benchmax_gym')]}))\n")
    config = run_fresh([compose, json.dumps(argv[2:])])
    assert config["adv_estimator"] == "benchmax_grpo" and not config["critic"]
    assert config["ours"] == []  # the driver never imports the adapter: the estimator must come another way
    task_runner = (
        "import json, math, sys, torch\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        f"fn = get_adv_estimator_fn({config['adv_estimator']!r})\n"
        "rewards = torch.zeros(3, 2); rewards[:, -1] = torch.tensor([1.0, 0.0, math.nan])\n"
        "adv, _ = fn(token_level_rewards=rewards, response_mask=torch.ones(3, 2), index=['a', 'a', 'a'], config=None)\n"
        "print(json.dumps({'module': fn.__module__, 'advantages': adv[:, 0].tolist()}))\n")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, **config["env_vars"], "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", task_runner], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["module"] == "benchmax_gym.adapters.verl"
    first, second, failed = result["advantages"]
    assert first > 0 > second and failed == 0.0


def test_a_simulated_customers_turns_have_response_mask_0(qwen_tokenizer, customer_words):
    """Issue 31: the customer's answers are in the response with mask 0 (never in the loss)."""
    from customer import SERVICE, split_by_mask

    loop = _agent_loop(qwen_tokenizer, SolverServer(qwen_tokenizer, SERVICE), response_length=4096)
    out = asyncio.run(loop.run({}, extra_info={"task_index": 0, "env_id": SERVICE}))
    assert out.reward_score == 1.0
    env_text, model_text = split_by_mask(qwen_tokenizer, out.response_ids, out.response_mask)
    for said in customer_words(0)[:-1]:
        assert said in env_text and said not in model_text


def test_per_turn_rewards_are_verls_turn_scores_and_the_score_is_the_return(qwen_tokenizer):
    """dense_rewards (issue 30): ``turn_scores`` holds each turn's reward, ``reward_score`` their sum."""
    server = SolverServer(qwen_tokenizer, "benchmax/Math-v0")
    rows = task_rows("benchmax/Math-v0", 2, dense_rewards=True, python_tool=False)
    loop = _agent_loop(qwen_tokenizer, server)

    async def main():
        return await asyncio.gather(*(loop.run({"temperature": 1.0}, **row) for row in rows))

    for out in asyncio.run(main()):
        assert len(out.extra_fields["turn_scores"]) == 2 and out.extra_fields["turn_scores"][1] == 1.0
        assert abs(out.extra_fields["turn_scores"][0] - 0.2) < 1e-9 and abs(out.reward_score - 1.2) < 1e-9
        assert abs(out.extra_fields["reward_extra_info"]["turn_reward"] - 0.2) < 1e-9
        assert out.num_turns == 1 + 2 * len(out.extra_fields["turn_scores"])


def test_loops_built_per_trajectory_share_the_template_and_check_the_env_once(qwen_tokenizer, monkeypatch):
    """verl builds an agent loop per trajectory: the chat template (its byte table, its rendered
    skeletons) is made once per tokenizer and arguments, the env configuration made and closed
    once; a wrong configuration still fails every loop built with it, and loops sharing a template
    still play their own trajectories."""
    import pytest

    from benchmax_gym.adapters import verl as adapter

    import weakref

    monkeypatch.setattr(adapter, "_CHECKED", set(), raising=False)  # (as in a fresh worker: other tests built loops here)
    monkeypatch.setattr(adapter, "_TEMPLATES", weakref.WeakKeyDictionary(), raising=False)
    built = []
    real = adapter.make_env
    monkeypatch.setattr(adapter, "make_env", lambda env_id, kwargs: built.append(env_id) or real(env_id, kwargs))
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 2048}},
                               "data": {}})
    server = SolverServer(qwen_tokenizer, "benchmax/Math-v0")

    def build(kwargs):
        entry = {"_target_": "benchmax_gym.adapters.verl.BenchmaxAgentLoop", "env_id": "benchmax/Math-v0",
                 "env_kwargs": kwargs}
        return hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config), server_manager=server,
                                       tokenizer=qwen_tokenizer, processor=None, hf_model_type=None, dataset_cls=None,
                                       data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))

    loops = [build({"max_turns": 4}) for _ in range(3)]
    assert built == ["benchmax/Math-v0"]
    assert loops[0].chat is loops[1].chat is loops[2].chat
    build({"max_turns": 5})  # another configuration: checked too
    assert built == ["benchmax/Math-v0"] * 2
    for _ in range(2):
        with pytest.raises(Exception, match="max_turn"):
            build({"max_turn": 2})
    assert built == ["benchmax/Math-v0"] * 4

    async def play():
        return await asyncio.gather(*(loop.run({}, extra_info={"task_index": i}, raw_prompt=[])
                                      for i, loop in enumerate(loops)))

    assert [out.reward_score for out in asyncio.run(play())] == [1.0, 1.0, 1.0]
