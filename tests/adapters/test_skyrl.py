"""SkyRL: BenchmaxTextEnv driven exactly as SkyRL's generator drives a skyrl_gym env: a fresh env
per trajectory from ``skyrl_gym.make(env_class, env_config=DictConfig, extras=row)``, ``init``
and ``step`` in an executor's worker threads, many trajectories at once."""

import asyncio
import concurrent.futures
import copy
import glob
import os
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
    before = _workspaces()

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
    assert _workspaces() <= before  # every workspace removed


def _workspaces() -> set[str]:
    """The episodes' folders in the temp dir: the Excel workbooks' (``benchmax-excel-*``) and the
    sandboxes' pools. These live inside ``benchmax-gym-UID``, the sandbox's parent folder, which
    stays; this process makes it in the temp dir of the moment whenever it starts a pool, before
    or during the test, depending on whether an earlier test's env still holds a pool."""
    found = set(glob.glob(f"{tempfile.gettempdir()}/benchmax-*"))
    parent = f"{tempfile.gettempdir()}/benchmax-gym-{os.geteuid()}"
    return (found - {parent}) | set(glob.glob(f"{parent}/*"))


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


def test_a_row_naming_no_env_raises_and_a_row_naming_a_wrong_one_fails_its_trajectory():
    """No env_id at all is the dataset's format, raised when SkyRL makes the env; an unknown id or
    a bad argument (one row's) is that trajectory's ``env_error``, naming it, as OpenRLHF's adapter does: SkyRL
    gathers a batch without ``return_exceptions``, so raising ended the whole batch."""
    import json
    import math

    with pytest.raises(ValueError, match="env_id is missing.*env_id column"):
        skyrl_gym.make("benchmax", env_config=OmegaConf.create({}), extras={})
    env = skyrl_gym.make("benchmax", env_config={"env_id": "benchmax/Mth-v0"}, extras={})
    prompt = [{"role": "user", "content": "What is 6*7?"}]
    assert env.init(prompt)[0] == prompt  # the row's prompt: the model still gets one turn
    out = env.step("42")
    assert out["done"] and math.isnan(out["reward"]) and out["metadata"]["outcome"] == "env_error"
    assert "Mth" in out["metadata"]["outcome_detail"]
    env.close()
    env = skyrl_gym.make("benchmax", env_config={}, extras={"env_id": "benchmax/Math-v0",
                                                            "env_kwargs": json.dumps({"max_turn": 2})})
    env.init(prompt)
    out = env.step("42")
    assert math.isnan(out["reward"]) and "TypeError" in out["metadata"]["outcome_detail"]
    assert "max_turn" in out["metadata"]["outcome_detail"]
    env.close()


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


# SkyRL's typed config, for real. SkyRL 0.4's trainer, which owns it (SkyRLTrainConfig, validate_cfg),
# is PyPI's `skyrl` 0.4.0 (skyrl_math.sh's `--extra fsdp` is `skyrl[fsdp]`); `skyrl-train` stops at
# 0.3.1. Both say Python 3.12 (skyrl 0.4.0: Requires-Python >=3.12,<3.15; skyrl-train 0.1.0-0.3.1:
# ==3.12.*), so neither installs in this Python 3.11 venv. Its config code runs here all the same:
# the wheel goes into a folder with --no-deps --ignore-requires-python (plus the five modules its
# import chain needs that this venv lacks, pinned below) and runs in a fresh process beside this
# venv's torch, pydantic, omegaconf and skyrl-gym 0.4.0. One thing differs on 3.11:
# SkyRLTrainConfig.__post_init__ imports skyrl.backends, whose skyrl.tinker.types puts a
# typing.TypedDict in a pydantic model, which pydantic refuses before Python 3.12
# ("Please use `typing_extensions.TypedDict`"); the child aliases typing.TypedDict to
# typing_extensions' for that. SkyRL's own code is not changed. (A Python 3.12 venv would need
# PyPI's CUDA torch, several GB: __post_init__ imports torch too.)
SKYRL_TRAINER = ("skyrl==0.4.0", "loguru==0.7.3", "cloudpathlib==0.26.0", "pybase64==1.5.1", "jaxtyping==0.3.11",
                 "wadler-lindig==0.1.8")

_SKYRL_CONFIG_CHILD = r"""
import json, sys, typing, typing_extensions
typing.TypedDict = typing_extensions.TypedDict  # pydantic's rule for Python < 3.12 (see the test file)
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.utils import validate_cfg  # what skyrl.train.entrypoints.main_base imports
results = []
for overrides in json.loads(sys.argv[1]):
    try:
        cfg = SkyRLTrainConfig.from_cli_overrides(overrides)  # skyrl_main.py's main(), then validate_cfg
        validate_cfg(cfg)
    except Exception as e:
        results.append({"error": f"{type(e).__name__}: {e}"})
        continue
    gym = cfg.environment.skyrl_gym
    results.append({"env_class": cfg.environment.env_class, "strategy": cfg.trainer.strategy,
                    "train_data": list(cfg.data.train_data), "n_samples": cfg.generator.n_samples_per_prompt,
                    "max_turns": cfg.generator.max_turns, "logger": cfg.trainer.logger,
                    # what SkyRLGymGenerator passes skyrl_gym.make as env_config for the env class:
                    "env_config": getattr(gym, cfg.environment.env_class, dict())})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def skyrl_config(cached_target):
    """``skyrl_config([overrides, ...])``: for each override list, what SkyRL 0.4's own
    ``SkyRLTrainConfig.from_cli_overrides`` + ``validate_cfg`` made of it, or the error they raised."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    target = cached_target(".pip-target-skyrl-0.4.0", "--no-deps", "--ignore-requires-python", *SKYRL_TRAINER)
    root = str(Path(__file__).resolve().parents[2])

    def run(cases):
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join([target, root])}
        out = subprocess.run([sys.executable, "-c", _SKYRL_CONFIG_CHILD, json.dumps(cases)], capture_output=True,
                             text=True, timeout=300, env=environ, cwd=target)
        assert out.returncode == 0, out.stderr[-4000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    run.target = target
    return run


def test_skyrl_math_sh_validates_with_skyrls_own_typed_config_and_the_old_route_is_rejected(skyrl_config, tmp_path):
    """skyrl_math.sh's real overrides (a stub uv records them) go through SkyRL 0.4's own
    SkyRLTrainConfig.from_cli_overrides and validate_cfg, as skyrl_main.py's main() does; the
    route the docstring used to give (a ``benchmax`` key under environment.skyrl_gym, with or
    without Hydra's ``+``) is refused by that same code."""
    from pathlib import Path

    from launch import EXAMPLES, script_argv

    argv = script_argv("skyrl_math.sh", tmp_path)
    at = argv.index("python")
    overrides = argv[at + 2:]
    main = (EXAMPLES / "skyrl_main.py").read_text()
    assert "SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])" in main and "validate_cfg(cfg)" in main
    main_base = Path(skyrl_config.target, "skyrl/train/entrypoints/main_base.py").read_text()
    assert "from skyrl.train.utils import validate_cfg" in main_base  # the validate_cfg skyrl_main.py imports
    old = "environment.skyrl_gym.benchmax.env_id=benchmax/Math-v0"
    script, old_route, plus_route = skyrl_config([overrides, overrides + [old], overrides + ["+" + old]])
    assert script == {"env_class": "benchmax", "strategy": "fsdp", "n_samples": 8, "max_turns": 4,
                      "logger": "console", "env_config": {},
                      "train_data": [str(tmp_path / "data/benchmax-math/train.parquet")]}, script
    assert old_route["error"].startswith("ValueError: Invalid fields {'benchmax'} for SkyRLGymConfig"), old_route
    assert plus_route["error"].startswith("ValueError: The '+' prefix"), plus_route


def test_the_adapters_docstring_gives_the_route_skyrls_typed_config_takes(skyrl_config):
    """The docstring's route: ``environment.env_class=benchmax`` and nothing else in SkyRL's
    config (SkyRL's generator then makes the env with ``env_config={}`` and the row as extras,
    which plays); ``skyrl_gym.benchmax`` rejected with ``Invalid fields``, as it says."""
    import benchmax_gym.adapters.skyrl as adapter

    doc = " ".join(adapter.__doc__.split())
    assert "``environment.env_class=benchmax``" in doc and "rejects ``skyrl_gym.benchmax`` (``Invalid fields``)" in doc
    (docstring_route, rejected) = skyrl_config([["environment.env_class=benchmax", "trainer.logger=console"],
                                                ["environment.skyrl_gym.benchmax.env_kwargs.max_turns=3"]])
    assert docstring_route["env_class"] == "benchmax" and docstring_route["env_config"] == {}, docstring_route
    assert "Invalid fields {'benchmax'}" in rejected["error"], rejected
    row = task_rows("benchmax/Math-v0", 1)[0]
    env = skyrl_gym.make("benchmax", env_config=docstring_route["env_config"],
                         extras={k: v for k, v in row.items() if k not in ("prompt", "env_class")})
    env.init(row["prompt"])
    assert env.step("<answer>0</answer>")["done"]
    env.close()


def test_a_failed_episode_reports_its_outcome_and_skyrl_aggregates_the_counts():
    """FlakyMath's task 1 loses its tool backend: its last step says so (outcome, failed, reward
    NaN, never a fake 0) and skyrl_gym's aggregation counts the outcomes of the batch."""
    import math

    from flaky import ENV_ID
    from skyrl_gym.metrics import aggregate_for_environment

    rows = task_rows(ENV_ID, 3, fail_tasks=[1])

    async def main():
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            return await asyncio.gather(*(_agent_loop(executor, {}, row, _solver("benchmax/Math-v0", row["task_index"]))
                                          for row in rows))

    results = asyncio.run(main())
    lasts = [last for _, _, last, _ in results]
    assert [last["metadata"]["outcome"] for last in lasts] == ["scored", "tool_unavailable", "scored"]
    assert [last["metadata"]["failed"] for last in lasts] == [False, True, False]
    assert math.isnan(lasts[1]["reward"]) and lasts[0]["reward"] == lasts[2]["reward"] == 1.0
    aggregated = aggregate_for_environment("benchmax", [m for *_, m in results])
    assert aggregated["env/outcome/tool_unavailable"] == 1.0 and aggregated["env/outcome/scored"] == 2.0
    assert aggregated["env/outcome/deadline"] == 0.0 and "turns" in aggregated


def test_a_simulated_customer_answers_as_a_user_observation(customer_words):
    """Issue 31: the customer's answer comes back as a ``user`` observation (SkyRL's generator
    appends observations with loss mask 0); the episode ends when the customer is done, and what
    only the customer knows (its task's private part) is in no observation or metadata."""
    from customer import SERVICE

    row = task_rows(SERVICE, 1)[0]
    cfg = _config(SERVICE)

    async def main():
        with concurrent.futures.ThreadPoolExecutor(2) as executor:
            return await _agent_loop(executor, cfg, row, _solver(SERVICE, row["task_index"]))

    history, rewards, last, metrics = asyncio.run(main())
    said = customer_words(row["task_index"])
    asked = next(i for i, m in enumerate(history) if m["role"] == "assistant")
    assert history[asked + 1] == {"role": "user", "content": said[0]}
    assert rewards[-1] == 1.0 and last["metadata"]["reward_components"]["resolved"] == 1.0
    import gymnasium as gym

    env = gym.make(SERVICE)
    goal = env.unwrapped.tasks[row["task_index"]].private["user"]["goal"]
    env.close()
    assert goal not in str(history) + str(last)


def test_per_turn_rewards_are_skyrls_per_step_rewards():
    """dense_rewards (issue 30): each step output's reward is that turn's; they sum to the return."""
    kwargs = {"dense_rewards": True, "python_tool": False}
    rows = task_rows("benchmax/Math-v0", 2, **kwargs)

    async def main():
        with concurrent.futures.ThreadPoolExecutor(2) as executor:
            return await asyncio.gather(*(_agent_loop(executor, _config("benchmax/Math-v0"), row,
                                                      _solver("benchmax/Math-v0", row["task_index"], **kwargs))
                                          for row in rows))

    for history, rewards, last, metrics in asyncio.run(main()):
        assert rewards == [pytest.approx(0.2), 1.0]  # the solver's calls reach every intermediate value, then the answer
        assert last["metadata"]["reward_components"]["dense"] == 1.0 and metrics["turn_reward"] == pytest.approx(0.2)
    plain = asyncio.run(_agent_loop(concurrent.futures.ThreadPoolExecutor(1), _config("benchmax/Math-v0"),
                                    task_rows("benchmax/Math-v0", 1)[0], _solver("benchmax/Math-v0", 0)))
    assert plain[1] == [0.0, 1.0] and plain[3]["turn_reward"] == 0.0  # off by default: as before
