"""Chaos (issue 29): the same scripted episodes played clean and with real faults injected - a
vector worker SIGKILLed, a tool hanging past its timeout, an MCP server killed mid-episode, a
model server answering 500 or too late, a generation backend raising or returning garbage -
through every path an episode takes. Each failure must say what it was; no failure may reach a
reward, a baseline, a loss or a statistic; every scored episode must end exactly as in the clean
run of the same (task, seed, replies). Loopback only."""

import asyncio
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.outcomes import FAILURES, MODEL_ERROR, SCORED, SIGNAL, TOOL_TIMEOUT, TOOL_UNAVAILABLE
from benchmax_gym.testing import chaos

sys.path.insert(0, str(Path(__file__).parent / "adapters"))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TASKS = 8


@pytest.fixture(scope="module")
def answer():
    return chaos.answers(TASKS)


def children():
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def check_against_clean(faulty, clean, keys, mixed=True):
    """Every episode ended; each expected failure is what it should be and has no reward; every
    other episode is scored and equal, on ``keys``, to the clean run's."""
    results = faulty["results"]
    assert set(results) == set(clean["results"])  # nothing lost
    assert faulty["expected"], "no fault was injected"
    for index, outcome in faulty["expected"].items():
        assert results[index]["outcome"] == outcome, (index, results[index]["outcome"], outcome)
    for index, result in results.items():
        if index in faulty["expected"] and faulty["expected"][index] in FAILURES:
            assert result["reward"] is None and result["outcome"] in FAILURES
            continue
        assert result["outcome"] == SCORED
        assert {k: result[k] for k in keys} == {k: clean["results"][index][k] for k in keys}, index
    scored = [r["reward"] for r in results.values() if r["outcome"] in SIGNAL]
    assert not mixed or 0 < np.mean(scored) < 1  # right and wrong answers: a mean a fake 0 would move


def test_a_vector_env_loses_only_the_episodes_its_faults_hit():
    """SubprocVectorEnv, 2 workers of 2 envs: a SIGKILLed worker fails both episodes it held
    (env_error), a hanging tool fails its own (tool_timeout), a failed policy its own; the
    batched reward is NaN there and ``info["scored"]`` False; every other episode is the clean
    run's, observation for observation; no process is left behind."""
    before = {p.pid for p in children()}
    episodes = chaos.plan(24, tasks=TASKS, kill=0.1, tool_timeout=0.1, model_error=0.1, seed=1)
    answer = chaos.answers(TASKS)
    faulty = chaos.run_vector(episodes, answer, num_envs=4, num_workers=2, tool_timeout=2.0)
    clean = chaos.run_vector(episodes, answer, num_envs=4, num_workers=2, inject=False, tool_timeout=2.0)
    kills = {e for e, ep in enumerate(episodes) if ep.fault == "kill"}
    assert kills and all(faulty["expected"][e] == "env_error" for e in kills)
    assert sum(o == "env_error" for o in faulty["expected"].values()) > len(kills)  # their neighbours too
    assert faulty["restarts"] == len(kills)
    check_against_clean(faulty, clean, ("outcome", "reward", "components", "observations"))
    for result in faulty["results"].values():
        assert result["signal"] == (result["outcome"] in SIGNAL)
    assert all(r["outcome"] == SCORED for r in clean["results"].values())
    deadline = time.monotonic() + 10
    while {p.pid for p in children()} - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not {p.pid for p in children()} - before


def test_an_mcp_server_killed_mid_episode_fails_that_episode_only():
    """benchmax/MCP-v0 with its bundled server, played by its reference solver: the server
    SIGKILLed after an episode's first call ends that episode with tool_unavailable; the next
    episodes get a fresh server and end as they do clean."""
    env = gym.make("benchmax/MCP-v0")

    def play(kill_in):
        out = {}
        for seed in range(4):
            obs, info = env.reset(seed=seed)
            solver = env.unwrapped.reference_solver()
            seen, reward, info, done, turn = [obs], None, info, False, 0
            while not done:
                if seed in kill_in and turn == 1:
                    for connection in env.unwrapped.connections.values():
                        for pid in list(connection.pids):
                            os.kill(pid, signal.SIGKILL)
                obs, reward, terminated, truncated, info = env.step(solver(obs, info))
                seen.append(obs)
                done, turn = terminated or truncated, turn + 1
            failed = math.isnan(reward)
            out[seed] = {"outcome": info["outcome"], "reward": None if failed else reward,
                         "components": info["reward_components"], "observations": seen}
        return out

    try:
        clean = play(())
        faulty = play({1, 2})
    finally:
        env.close()
    expected = {1: TOOL_UNAVAILABLE, 2: TOOL_UNAVAILABLE}
    check_against_clean({"results": faulty, "expected": expected}, {"results": clean},
                        ("outcome", "reward", "components", "observations"), mixed=False)


# -- eval against a loopback model server ------------------------------------------------------

def test_eval_counts_only_scored_episodes_and_a_retry_gives_the_clean_run(tmp_path, answer):
    """benchmax-gym eval (the Python API, in process) of 8 tasks x 2 samples against the
    loopback server: pairs whose requests get a 500, pairs whose replies come after the client's
    timeout, pairs whose tool hangs. Failures are out of the mean (the clean run's mean over the
    scored pairs, exactly); each scored record is the clean run's; --retry-failed against the
    healthy server leaves the run equal to the clean one."""
    from benchmax_gym.eval import evaluate
    from benchmax_gym.eval.policies import ChatPolicy
    from benchmax_gym.eval.runner import episode_seed
    from benchmax_gym.testing.openai_server import FakeChatServer

    pairs = {episode_seed(0, t, s): (t, s) for t in range(TASKS) for s in range(2)}
    # the client's timeout and the tools' (5 s each, run below): room for 16 episodes at once on a loaded machine
    faults = {(0, 1): {"status": 500}, (3, 0): {"status": 500}, (2, 1): {"delay": 8.0}, (5, 0): {"delay": 8.0}}
    hangs = {(1, 0), (6, 1)}

    def episode(pair, inject):
        t, s = pair
        fault = "tool_timeout" if inject and pair in hangs else None
        return chaos.Episode(t, 0, (t + s) % 3 != 0, fault)

    inject = [False]

    def reply(body):
        pair = pairs.get(body.get("seed"))
        if pair is None:
            return {"content": "pong"}  # the preflight
        last = body["messages"][-1]
        turn = 1 if last["role"] == "tool" or "<tool_response>" in str(last.get("content")) else 0
        return {"content": chaos.reply(episode(pair, inject[0]), turn, answer[pair[0]], inject[0])}

    def run(server, out, faulty, retry_failed=False):
        inject[0] = faulty
        server.fault_for = (lambda body: faults.get(pairs.get(body.get("seed")))) if faulty else None
        policy = ChatPolicy("test-model", base_url=server.url, api_key="sk-test-chaos-0123456789", native_tools=False,
                            timeout=5.0, max_retries=0)
        return evaluate(chaos.CHAOS_ID, policy, env_kwargs={"tool_timeout": 5.0},  # (its 0.5 s: too tight for 16 at once)
                        tasks=TASKS, k=2, concurrency=16, out=out, retry_failed=retry_failed)

    keys = ("reward", "reward_components", "messages", "actions", "turns", "outcome", "seed")
    with FakeChatServer(reply) as server:
        clean = run(server, tmp_path / "clean", False)
        faulty = run(server, tmp_path / "faulty", True)
        retried = run(server, tmp_path / "faulty", False, retry_failed=True)
    by_pair = {(r["task_index"], r["sample"]): r for r in faulty.records}
    clean_by_pair = {(r["task_index"], r["sample"]): r for r in clean.records}
    assert len(by_pair) == TASKS * 2
    for pair, record in by_pair.items():
        if pair in faults:
            assert record["outcome"] == MODEL_ERROR and record["reward"] is None
        elif pair in hangs:
            assert record["outcome"] == TOOL_TIMEOUT and record["reward"] is None
        else:
            assert {k: record[k] for k in keys} == {k: clean_by_pair[pair][k] for k in keys}, pair
    scored = [pair for pair, r in by_pair.items() if r["outcome"] in SIGNAL]
    summary = faulty.summary
    assert summary["mean_reward"]["value"] == pytest.approx(np.mean([clean_by_pair[p]["reward"] for p in scored]))
    assert summary["mean_reward"]["value"] != pytest.approx(sum(clean_by_pair[p]["reward"] for p in scored) / 16)
    assert summary["failed_episodes"] == 6 and summary["outcomes"] == {"model_error": 4, "scored": 10,
                                                                       "tool_timeout": 2}
    assert summary["failure_rate"]["value"] == pytest.approx(6 / 16)

    assert {(r["task_index"], r["sample"]): {k: r[k] for k in keys} for r in retried.records} == \
        {pair: {k: r[k] for k in keys} for pair, r in clean_by_pair.items()}
    assert retried.summary["mean_reward"] == clean.summary["mean_reward"]


# -- trainers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    return tiny_tokenizer("qwen")


def group_advantages(rewards, groups, epsilon):
    """GRPO's advantages over each group's scored samples (None: failed, advantage 0)."""
    out = []
    for start in range(0, len(rewards), groups):
        group = rewards[start:start + groups]
        kept = np.array([r for r in group if r is not None], dtype=float)
        std = kept.std(ddof=1) if len(kept) > 1 else 1.0
        out += [0.0 if r is None else (r - kept.mean()) / (std + epsilon) for r in group]
    return np.array(out)


def test_trl_rollouts_lose_only_the_faulted_episodes_and_grpo_leaves_them_out(tokenizer, answer, tmp_path):
    """TRLRollout, 24 episodes in groups of 3: the sandbox server SIGKILLed under a python call
    (tool_unavailable), a hanging tool, a backend returning ids outside the vocabulary
    (model_error). Failed samples have reward None and no token in the loss; the others equal the
    clean run's ids, masks and rewards. One batch then goes through GRPOTrainer's own scoring
    step (its advantages: GRPO over each group's scored samples, 0 for the failed) and through
    verl's registered benchmax_grpo estimator (the same advantages)."""
    faults = ["tool_timeout", None, None, None, "kill", None, None, "model_error", None]
    episodes = chaos.plan(24, tasks=TASKS, group=3, seed=2)
    episodes = [chaos.Episode(e.task_index, e.seed, e.right, faults[i] if i < len(faults) else e.fault)
                for i, e in enumerate(episodes)]
    episodes[3] = chaos.Episode(1, episodes[3].seed, False, None)  # groups of right and wrong
    episodes[5] = chaos.Episode(1, episodes[5].seed, True, None)
    episodes[16] = chaos.Episode(5, episodes[16].seed, episodes[16].right, "kill")
    from benchmax_gym.core.sandbox import bubblewrap_status

    isolated = bubblewrap_status()[0]
    if not isolated:  # at rlimits, code that kills its sandbox server is the model's doing: no kill here
        episodes = [chaos.Episode(e.task_index, e.seed, e.right, None if e.fault == "kill" else e.fault)
                    for e in episodes]
    faulty = chaos.run_trl(episodes, answer, tokenizer, batch=9, tool_timeout=2.0)
    clean = chaos.run_trl(episodes, answer, tokenizer, batch=9, inject=False, tool_timeout=2.0)
    check_against_clean(faulty, clean, ("outcome", "reward", "completion_ids", "env_mask", "components"))
    for index, result in faulty["results"].items():
        if result["outcome"] in FAILURES:
            assert not any(result["env_mask"])  # no token of a failed episode in the loss
        else:
            assert any(result["env_mask"])

    batch = faulty["outputs"][0]  # 3 groups: a tool timeout, a clean one, a kill and a model error
    rewards = batch["env_reward"]
    assert [r is None for r in rewards] == [True, False, False, False, isolated, False, False, True, False]
    _trl_step_scores_only_signal(tokenizer, batch, rewards, tmp_path)
    _verl_estimator_scores_only_signal(batch, rewards)


def _trl_step_scores_only_signal(tokenizer, batch, rewards, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.testing.tokenizers import tiny_model

    rollout = TRLRollout(chaos.CHAOS_ID, tokenizer, env_kwargs={"python_tool": True})
    rows = rollout.dataset(TASKS)
    rollout.close()
    asked = []

    def replay(prompts, trainer):  # the chaos batch, as the trainer asked for it
        asked.append([json.loads(p[0]["benchmax_task"])["task_index"] for p in prompts])
        return batch

    args = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=9, num_generations=3,
                      max_completion_length=2048, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no", shuffle_dataset=False)
    trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=TRLRollout.reward, args=args,
                          train_dataset=rows.select([0, 1, 2]), rollout_func=replay, processing_class=tokenizer)
    scored = []
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: scored.append(original(inputs)) or scored[-1]
    trainer.train()
    assert asked == [[0] * 3 + [1] * 3 + [2] * 3]  # the groups the chaos batch holds
    out = scored[0]
    advantages = out["advantages"].view(-1).numpy()
    assert np.allclose(advantages, group_advantages(rewards, 3, 1e-4), atol=1e-5)
    loss_tokens = (out["completion_mask"] * out["tool_mask"]).sum(dim=1).numpy()
    assert all((n == 0) == (r is None) for n, r in zip(loss_tokens, rewards))


def _verl_estimator_scores_only_signal(batch, rewards):
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import benchmax_gym.adapters.verl  # noqa: F401  (registers benchmax_grpo)

    width = max(len(m) for m in batch["env_mask"])
    scores, masks = torch.zeros(len(rewards), width), torch.zeros(len(rewards), width)
    for i, (reward, mask) in enumerate(zip(rewards, batch["env_mask"])):
        scores[i, len(mask) - 1] = math.nan if reward is None else reward
        masks[i, :len(mask)] = torch.tensor(mask, dtype=torch.float32)
    advantages, _ = get_adv_estimator_fn("benchmax_grpo")(
        token_level_rewards=scores, response_mask=masks, index=np.array([str(i // 3) for i in range(len(rewards))]),
        config=None)
    per_sample = advantages.sum(-1) / masks.sum(-1).clamp(min=1)
    assert not torch.isnan(advantages).any()
    assert np.allclose(per_sample.numpy(), group_advantages(rewards, 3, 1e-6), atol=1e-5)


def test_trl_a_generate_that_raises_fails_its_sequences_with_model_error(tokenizer, answer):
    """The backend raising (a server answering 500, a request timing out) on one call: the
    sequences of that call end with model_error, reward None; the rollout goes on."""
    from types import SimpleNamespace

    from benchmax_gym.adapters.trl import TRLRollout

    calls = []

    def generate(trainer, sessions):
        calls.append(len(sessions))
        if len(calls) == 2:
            raise TimeoutError("the generation server did not answer in 30 s")
        return [s.chat.encode(chaos.call("calculator", expression="1+1")) + [tokenizer.eos_token_id]
                if s.info["turn"] == 0 else s.chat.encode("\\boxed{2}") + [tokenizer.eos_token_id]
                for s in sessions], [None] * len(sessions)

    rollout = TRLRollout(chaos.CHAOS_ID, tokenizer, generate=generate)
    out = rollout(list(rollout.dataset(2)["prompt"]), SimpleNamespace(max_completion_length=2048, _metrics=None))
    sessions = next(iter(rollout._sessions.values()))
    assert [s.episode.outcome for s in sessions[:2]] == [MODEL_ERROR] * 2 and out["env_reward"] == [None, None]
    assert "TimeoutError" in sessions[0].episode.record["error"] and not any(out["env_mask"][0])
    rollout.close()


def test_openrlhf_an_engine_that_fails_gives_a_nan_score_never_a_zero(tokenizer, answer):
    """OpenRLHF's executor with an engine that raises (a 500) and one that returns garbage ids:
    model_error, scores NaN (its dynamic filter drops the group); a healthy engine scores."""
    from benchmax_gym.adapters.openrlhf import make_executor, task_rows
    from benchmax_gym.testing.tokenizers import ScriptedEngine

    from types import SimpleNamespace

    def raising(ids, turn):
        if turn == 1:
            raise RuntimeError("500 Internal Server Error")
        return script(ids, turn)

    class Garbage(ScriptedEngine):
        async def generate(self, prompt_ids, sampling_params, multi_modal_data=None):
            out = await super().generate(prompt_ids, sampling_params, multi_modal_data)
            out.outputs[0].token_ids = [-5]
            return out

    script = lambda ids, turn: chaos.reply(chaos.Episode(0, 0, True), turn, answer[0])  # noqa: E731
    executor = make_executor(chaos.CHAOS_ID)()
    row = task_rows(chaos.CHAOS_ID, 1)[0]

    async def play(engine):
        return await executor.execute(row["prompt"], row["label"], SimpleNamespace(max_tokens=None, logprobs=None),
                                      16384, tokenizer, engine)

    healthy, raised, garbage = (asyncio.run(play(engine(tokenizer, fn)))
                                for engine, fn in ((ScriptedEngine, script), (ScriptedEngine, raising), (Garbage, script)))
    assert healthy["scores"] == 1.0 and healthy["extra_logs"]["env/outcome/scored"] == 1.0
    for out in (raised, garbage):
        assert math.isnan(out["scores"]) and math.isnan(out["reward"])
        assert out["extra_logs"]["env/outcome/model_error"] == 1.0
