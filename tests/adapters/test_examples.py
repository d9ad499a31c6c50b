"""The examples: each trainer's CPU smoke script runs (a tiny model generating real tokens), the
dataset writer's files feed the adapters, and the GPU scripts parse."""

import importlib.util
import json
import subprocess
from pathlib import Path

import datasets
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, argv=()):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(list(argv))


def test_trl_grpo_smoke_trains_a_step():
    logs = run_example("trl_grpo", ["--smoke"])
    assert logs["step"] == 1 and "env/reward" in logs and "env/reward/correct" in logs


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


@pytest.mark.parametrize("script", ["skyrl_math.sh", "openrlhf_math.sh", "verl_math.sh"])
def test_the_gpu_scripts_are_valid_shell(script):
    assert subprocess.run(["bash", "-n", str(EXAMPLES / script)]).returncode == 0


@pytest.mark.parametrize("script", ["trl_grpo.py", "skyrl_smoke.py", "openrlhf_smoke.py", "verl_smoke.py"])
def test_each_smoke_script_names_the_readmes_cpu_install_line(script):
    readme = (EXAMPLES.parent / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| ") and f"`{script}" in line)
    install = row.split("|")[2].strip().strip("`")
    assert install.startswith("pip install") and install in (EXAMPLES / script).read_text()
