"""The examples: each trainer's CPU smoke script runs (a tiny model generating real tokens), the
dataset writer's files feed the adapters, and the GPU scripts parse."""

import importlib.util
import json
from pathlib import Path

import datasets
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, argv=()):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(list(argv))


def test_trl_grpo_smoke_trains_a_step(tmp_path, monkeypatch):
    """It trains a step and leaves no output folder behind (each run left a trl-smoke-* in /tmp)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs = run_example("trl_grpo", ["--smoke"])
    assert logs["step"] == 1 and "env/reward" in logs and "env/reward/correct" in logs
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("trl-smoke-")]


def test_skyrl_smoke_plays_real_generations():
    results = run_example("skyrl_smoke")
    assert len(results) == 4
    for reward, metrics in results:
        assert 0.0 <= reward <= 1.0 and metrics["turns"] >= 1


def test_openrlhf_smoke_plays_real_generations():
    from benchmax_gym.adapters.openrlhf import task_rows
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    outputs = run_example("openrlhf_smoke")
    for row, out in zip(task_rows("benchmax/Math-v0", 4), outputs):
        assert out["action_ranges"] and len(out["rollout_log_probs"]) == len(out["observation_tokens"])
        start = out["action_ranges"][0][0]
        prompt = tokenizer.decode(out["observation_tokens"][:start])
        assert prompt.startswith("<|im_start|>system") and row["prompt"][-1]["content"] in prompt  # whole, not cut
        assert len(out["observation_tokens"]) - start <= 96 and set(out["extra_logs"]) >= {"reward", "truncated"}


def test_verl_smoke_plays_real_generations():
    outputs = run_example("verl_smoke")
    for out in outputs:
        assert len(out.response_ids) <= 256 and len(out.response_mask) == len(out.response_ids)
        assert sum(out.response_mask) > 0 and out.reward_score is not None


@pytest.mark.parametrize("trainer", ["skyrl", "verl", "openrlhf"])
def test_make_dataset_writes_rows_the_adapter_plays(trainer, tmp_path):
    run_example("make_dataset", [trainer, "benchmax/Math-v0", str(tmp_path), "--train", "5", "--validation", "2",
                                 "--env-kwargs", '{"max_turns": 3}'])
    if trainer == "openrlhf":
        rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
        assert [json.loads(r["label"]) for r in rows] == [
            {"env_id": "benchmax/Math-v0", "task_index": i, "env_kwargs": {"max_turns": 3}} for i in range(5)]
        return
    train = datasets.load_dataset("parquet", data_files=str(tmp_path / "train.parquet"))["train"]
    validation = datasets.load_dataset("parquet", data_files=str(tmp_path / "validation.parquet"))["train"]
    assert len(train) == 5 and len(validation) == 2
    row = validation[0]
    if trainer == "skyrl":
        import skyrl_gym

        import benchmax_gym.adapters.skyrl  # noqa: F401

        extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
        env = skyrl_gym.make(row["env_class"], env_config={}, extras=extras)
        history, _ = env.init(row["prompt"])
        assert history == row["prompt"] and env.env.unwrapped.max_turns == 3
        env.close()
    else:
        assert row["extra_info"] == {"env_id": "benchmax/Math-v0", "task_index": 5, "env_kwargs": {"max_turns": 3}}


def test_the_skyrl_script_names_what_a_fresh_process_loads(tmp_path):
    """skyrl_math.sh's real argv (uv's stub records it): SkyRL's entry point file, Hydra-style
    dotlist overrides (OmegaConf parses them as SkyRL's from_cli_overrides does), the env class
    the rows name, and none of the ``environment.skyrl_gym.benchmax`` route SkyRL 0.4's typed
    config rejects; in a fresh process the entry point's import registers "benchmax" and the
    rows make_dataset.py writes play. (SkyRL's own typed config checks these overrides in
    tests/adapters/test_skyrl.py.)"""
    from omegaconf import OmegaConf

    from launch import run_fresh, script_argv

    argv = script_argv("skyrl_math.sh", tmp_path)
    at = argv.index("python")
    main, overrides = argv[at + 1], argv[at + 2:]
    assert Path(main) == EXAMPLES / "skyrl_main.py" and "benchmax-gym[skyrl]" in argv[:at]
    config = OmegaConf.from_dotlist(overrides)
    assert config.environment.env_class == "benchmax" and "skyrl_gym" not in config.environment
    data = Path(config.data.train_data[0]).parent
    run_example("make_dataset", ["skyrl", "benchmax/Math-v0", str(data), "--train", "2", "--validation", "1"])
    script = tmp_path / "check.py"
    script.write_text(f"""
import json, datasets, skyrl_gym
import benchmax_gym.adapters.skyrl  # what skyrl_main.py's Ray entry point imports
rows = datasets.load_dataset("parquet", data_files={config.data.train_data[0]!r})["train"]
rewards = []
for row in rows:
    extras = {{k: v for k, v in row.items() if k not in ("prompt", "env_class")}}
    env = skyrl_gym.make({config.environment.env_class!r}, env_config=None, extras=extras)
    env.init(row["prompt"])
    rewards.append(env.step("<answer>0</answer>")["reward"])
    env.close()
print(json.dumps(rewards))
""")
    assert run_fresh([script]) == [0.0, 0.0]
    assert "from skyrl.train" in (EXAMPLES / "skyrl_main.py").read_text()  # its trainer: SkyRL 0.4's skyrl.train


@pytest.mark.parametrize("script", ["trl_grpo.py", "skyrl_smoke.py", "openrlhf_smoke.py", "verl_smoke.py"])
def test_each_smoke_script_names_the_readmes_cpu_install_line(script):
    readme = (EXAMPLES.parent / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| ") and f"`{script}" in line)
    install = row.split("|")[2].strip().strip("`")
    assert install.startswith("pip install") and install in (EXAMPLES / script).read_text()


def test_the_trl_script_builds_its_gpu_config_with_trls_grpoconfig_and_loads_its_env_in_a_fresh_process(tmp_path):
    """trl_grpo.py's own parser, its GPU arguments through TRL's GRPOConfig (its checks), and the
    env and adapter it names, in a fresh process."""
    from launch import run_fresh

    script = tmp_path / "check.py"
    script.write_text(f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("trl_grpo", {str(EXAMPLES / "trl_grpo.py")!r})
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
from trl import GRPOConfig
args = module.parse(["--use-vllm", "--max-steps", "7"])
config = GRPOConfig(**{{**module.grpo_config(args), "use_cpu": True, "bf16": False}})
from benchmax_gym.adapters.tokens import make_env
make_env(args.env_id).close()
import benchmax_gym.adapters.trl
print(json.dumps({{"max_steps": config.max_steps, "use_vllm": config.use_vllm, "env": args.env_id,
                  "num_generations": config.num_generations}}))
""")
    out = run_fresh([script])
    assert out == {"max_steps": 7, "use_vllm": True, "env": "benchmax/Math-v0", "num_generations": 8}


def test_openrlhf_rows_load_through_openrlhfs_prompt_dataset_with_the_scripts_flags_and_play(tmp_path):
    """make_dataset.py's train.jsonl read as openrlhf_math.sh reads it (its --data.* flags, through
    OpenRLHF's blending_datasets and PromptDataset: the chat template applied, so the prompt is
    text); openrlhf_agent.py's executor plays each (prompt, label) as the task and settings it names."""
    pytest.importorskip("openrlhf")
    import asyncio
    from types import SimpleNamespace

    from launch import script_argv
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets

    argv = script_argv("openrlhf_math.sh", tmp_path)
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--data.")}
    assert "--data.apply_chat_template" in argv
    dataset_path = Path(flag["--data.prompt_dataset"])
    if not dataset_path.is_absolute():
        dataset_path = tmp_path / dataset_path
    run_example("make_dataset", ["openrlhf", "benchmax/Math-v0", str(dataset_path.parent), "--train", "3",
                                 "--validation", "1", "--env-kwargs", '{"max_turns": 2}'])
    data = SimpleNamespace(input_key=flag["--data.input_key"], label_key=flag["--data.label_key"],
                           apply_chat_template=True, image_key="images")
    strategy = SimpleNamespace(args=SimpleNamespace(data=data, use_ms=False), print=lambda *a: None,
                               is_rank_0=lambda: False)

    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    rows = PromptDataset(blending_datasets(str(dataset_path), strategy=strategy), tokenizer, strategy)
    assert len(rows) == 3
    spec = importlib.util.spec_from_file_location("agent_module", EXAMPLES / "openrlhf_agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)  # as --train.agent_func_path loads it
    executor = agent.AgentExecutor()

    class Answer:
        """An engine that answers 0 at once: each task plays one graded turn."""

        async def generate(self, ids, params, multi_modal_data=None):
            reply = tokenizer.encode("\\boxed{0}", add_special_tokens=False) + [tokenizer.eos_token_id]
            return SimpleNamespace(outputs=[SimpleNamespace(token_ids=reply, logprobs=None)])

    async def play():
        return await asyncio.gather(*(executor.execute(prompt, label, SimpleNamespace(max_tokens=None, logprobs=None),
                                                       4096, tokenizer, Answer())
                                      for _, prompt, label, _ in (rows[i] for i in range(len(rows)))))

    outputs = asyncio.run(play())
    for i, out in enumerate(outputs):
        _, prompt, label, _ = rows[i]
        assert isinstance(prompt, str) and prompt.startswith("<|im_start|>system")
        assert json.loads(label) == {"env_id": "benchmax/Math-v0", "task_index": i, "env_kwargs": {"max_turns": 2}}
        assert out["reward"] == 0.0 and len(out["action_ranges"]) == 1 and out["extra_logs"]["turns"] == 1
