"""SkyRL: BenchmaxTextEnv driven exactly as SkyRL's generator drives a skyrl_gym env: a fresh env
per trajectory from ``skyrl_gym.make(env_class, env_config=DictConfig, extras=row)``, ``init``
and ``step`` in an executor's worker threads, many trajectories at once."""

import asyncio
import concurrent.futures
import copy
import glob
import tempfile

import pytest
import skyrl_gym
from omegaconf import OmegaConf

from benchmax_gym.adapters.skyrl import BenchmaxTextEnv, task_rows


def _config(env_id, **env_kwargs):
    # SkyRL reads skyrl_gym_cfg.get(env_class) from its Hydra config: an OmegaConf DictConfig
    return OmegaConf.create({"benchmax": {"env_id": env_id, "env_kwargs": env_kwargs}})


async def _agent_loop(executor, cfg, row, reply, max_turns=8):
    """SkyRLGymGenerator.agent_loop's env calls, with a scripted model (``reply(history)``)."""
    loop = asyncio.get_running_loop()
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    extras["max_turns"] = max_turns
    env = skyrl_gym.make(row["env_class"], env_config=cfg.get(row["env_class"]), extras=extras)
    chat_history, _ = await loop.run_in_executor(executor, env.init, copy.deepcopy(row["prompt"]))
    done, rewards = False, []
    while not done:
        action = reply(chat_history)
        out = await loop.run_in_executor(executor, env.step, action)
        chat_history += [{"role": "assistant", "content": action}, *out["observations"]]
        rewards.append(out["reward"])
        done = out["done"]
    metrics = env.get_metrics()
    await loop.run_in_executor(executor, env.close)
    return chat_history, rewards, out, metrics


def _solver(env_id, task_index, **env_kwargs):
    """A scripted model for one trajectory: the env's solver, fed from a twin env's obs/info."""
    import gymnasium as gym

    twin = gym.make(env_id, **env_kwargs)
    obs, info = twin.reset(options={"task_index": task_index})
    solver = twin.unwrapped.reference_solver()
    state = {"obs": obs, "info": info}

    def reply(history):
        action = solver(state["obs"], state["info"])
        obs, _, term, trunc, info = twin.step(action)
        state.update(obs=obs, info=info)
        if term or trunc:
            twin.close()
        return action

    return reply


@pytest.mark.parametrize("env_id", ["benchmax/Math-v0", "benchmax/Excel-v0"])
def test_concurrent_trajectories_from_worker_threads_each_play_their_own_task(env_id, tmp_path, monkeypatch):
    # a temp root of this test's own: other tests (parallel workers) use /tmp meanwhile
    tmp_path.chmod(0o711)  # a sandbox's unprivileged uid must reach its workspace inside
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    rows = task_rows(env_id, 6)
    cfg = _config(env_id)
    before = set(glob.glob(f"{tempfile.gettempdir()}/benchmax-*"))

    async def main():
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            return await asyncio.gather(*(
                _agent_loop(executor, cfg, row, _solver(env_id, row["task_index"])) for row in rows * 2))

    results = asyncio.run(main())
    for row, (history, rewards, last, metrics) in zip(rows * 2, results):
        assert history[:2] == row["prompt"]  # its own task's prompt, no cross-talk
        assert rewards[-1] > 0 and set(last["metadata"]["reward_components"].values()) == {1.0}
        assert metrics["turns"] == len(rewards) and metrics["tool_errors"] == 0
    aggregated = BenchmaxTextEnv.aggregate_metrics([m for *_, m in results])
    assert all(aggregated[f"reward/{k}"] == 1.0 for k in results[0][2]["metadata"]["reward_components"])
    assert set(glob.glob(f"{tempfile.gettempdir()}/benchmax-*")) <= before  # every workspace removed


def test_observations_are_openai_messages_the_template_renders():
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    row = task_rows("benchmax/Math-v0", 1)[0]
    env = skyrl_gym.make("benchmax", env_config=_config("benchmax/Math-v0")["benchmax"], extras=dict(row))
    history, metadata = env.init(row["prompt"])
    assert metadata["tools"][0]["function"]["name"] == "calculator"
    out = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>')
    assert out["observations"][0]["role"] == "tool" and out["observations"][0]["content"] == "42"
    text = tokenizer.apply_chat_template(history + [{"role": "assistant", "content": "x"}] + out["observations"],
                                         tokenize=False)
    assert "<tool_response>\n42\n</tool_response>" in text
    out = env.step("not a tool call and no boxed answer")
    assert out["done"] and out["reward"] == 0.0
    env.close()


def test_bad_configuration_fails_when_skyrl_makes_the_env():
    with pytest.raises(ValueError, match="env_id is missing.*env_id column"):
        skyrl_gym.make("benchmax", env_config=OmegaConf.create({}), extras={})
    with pytest.raises(Exception, match="Mth"):
        skyrl_gym.make("benchmax", env_config={"env_id": "benchmax/Mth-v0"}, extras={})
    with pytest.raises(TypeError, match="max_turn"):
        skyrl_gym.make("benchmax", env_config={"env_id": "benchmax/Math-v0", "env_kwargs": {"max_turn": 2}}, extras={})


def test_a_mixed_dataset_plays_each_rows_env_and_skyrl_aggregates_the_metrics():
    """Rows of Math, Excel and CRM under one env_class, no env config (SkyRL 0.4's typed config
    has no place for one): each row plays its own env; skyrl_gym's aggregation takes them all."""
    from skyrl_gym.metrics import aggregate_for_environment

    rows = [r for env_id in ("benchmax/Math-v0", "benchmax/Excel-v0", "benchmax/CRM-v0") for r in task_rows(env_id, 2)]

    async def main():
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            return await asyncio.gather(*(_agent_loop(executor, {}, row, lambda h: "<answer>1</answer>") for row in rows))

    results = asyncio.run(main())
    for row, (history, rewards, last, metrics) in zip(rows, results):
        assert history[:2] == row["prompt"] and last["done"]
    aggregated = aggregate_for_environment("benchmax", [m for *_, m in results])
    assert aggregated["turns"] == 1.0 and "reward/correct" in aggregated
