"""A mixture's episodes in trainer logs: each member apart, as ``env/<member>/...``."""

import skyrl_gym
from omegaconf import OmegaConf

import benchmax_gym  # noqa: F401
from benchmax_gym.adapters import ChatTemplate, TokenSession
from benchmax_gym.adapters.skyrl import BenchmaxTextEnv
from benchmax_gym.testing.tokenizers import play_tokens, tiny_tokenizer

MEMBERS = [("benchmax/Math-v0", 0.5), ("benchmax/Wikipedia-v0", 0.5)]


def test_token_episodes_carry_per_member_metrics_that_trls_log_prefixes_with_env():
    session = TokenSession("benchmax/Mix-v0", ChatTemplate(tiny_tokenizer("qwen")),
                           env_kwargs={"members": MEMBERS, "python_tool": False})
    seen = {}
    for member in ("Math-v0", "Wikipedia-v0"):
        play_tokens(session, options={"member": member})
        metrics = session.episode.metrics()
        seen[member] = metrics
        assert metrics[f"{member}/reward"] == metrics["reward"] == session.episode.reward
        assert metrics[f"{member}/turns"] == metrics["turns"] and metrics[f"{member}/difficulty"] == 0.0
        assert all(k.startswith(f"reward/{member}/") for k in metrics if k.startswith("reward/"))
    assert not any(k.startswith("Wikipedia-v0/") for k in seen["Math-v0"])
    assert "Math-v0/reward" not in session.episode.metrics(components=False)  # (first-sample-keyed trainers)
    session.close()


def test_skyrl_metrics_name_the_member_and_aggregate_apart():
    cfg = OmegaConf.create({"benchmax": {"env_id": "benchmax/Mix-v0", "env_kwargs": {"members": MEMBERS}}})
    metrics = []
    for index in range(4):  # the mixture's task list alternates members
        env = skyrl_gym.make("benchmax", env_config=cfg["benchmax"], extras={"task_index": index})
        env.init([])
        out = env.step("\\boxed{0} I do not know")
        assert out["done"]
        metrics.append(env.get_metrics())
        env.close()
    members = {k.split("/")[1] for m in metrics for k in m if k.startswith("env/") and not k.startswith("env/outcome/")}
    assert members == {"Math-v0", "Wikipedia-v0"}
    aggregated = BenchmaxTextEnv.aggregate_metrics(metrics)
    assert aggregated["env/Math-v0/reward"] == 0.0 and aggregated["env/Wikipedia-v0/turns"] == 1.0
