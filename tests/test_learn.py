"""examples/learn/learn.py at toy size: every stage writes its artifacts, and each is what the next
stage (or a user reloading the run) needs. The real run is the example's own JSON (run.json)."""

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("tokenizers")

LEARN = Path(__file__).resolve().parents[1] / "examples" / "learn" / "learn.py"
TOY = ["--train-tasks", "48", "--eval-tasks", "8", "--vocab", "300", "--hidden", "16", "--layers", "1", "--heads", "2",
       "--sft-steps", "6", "--sft-batch", "8", "--rl-steps", "2", "--rl-batch", "4", "--group", "2",
       "--max-tokens", "48", "--turn-tokens", "16", "--sft-check", "2"]


def _learn():
    spec = importlib.util.spec_from_file_location("learn_example", LEARN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_dir():
    path = Path(tempfile.mkdtemp(prefix="benchmax-learn-"))
    _learn().main([*TOY, "--out", str(path), "--seed", "3"])
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_data_are_solver_transcripts_and_the_heldout_split_never_overlaps_them(run_dir):
    import gymnasium as gym

    learn = _learn()
    train = _jsonl(run_dir / "data" / "train.jsonl")
    assert len(train) == 48 and all(t["reward"] == 1.0 for t in train)
    assert all(any(m.get("tool_calls") for m in t["messages"]) and t["messages"][-1]["role"] == "assistant"
               for t in train)
    heldout = json.loads((run_dir / "data" / "heldout.json").read_text())
    assert heldout["heldout_tasks"] == 8 == len(heldout["heldout_indices"])
    run = json.loads((run_dir / "run.json").read_text())
    assert run["seeds"]["train_tasks"] != run["seeds"]["heldout_tasks"]
    env = gym.make(learn.ENV_ID, **run["env_kwargs"]["heldout"])  # the held-out prompts, made afresh
    prompts = {env.unwrapped.tasks[i].prompt for i in heldout["heldout_indices"]}
    env.close()
    assert not prompts & {t["prompt"] for t in train}


def test_the_tokenizer_reloads_with_a_chat_template_that_renders_tool_turns(run_dir):
    from transformers import AutoTokenizer

    from benchmax_gym.adapters.tokens import ChatTemplate

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    chat = ChatTemplate(tokenizer)
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}
    text = chat.render([{"role": "user", "content": "Compute: 2 + 3"},
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "content": "5"}], add_generation_prompt=True)
    assert "<tool_response>\n5\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    assert chat.decode(chat.encode("Compute: 12 * 34")) == "Compute: 12 * 34"


def test_sft_and_rl_checkpoints_reload_and_rl_logs_each_step(run_dir):
    from transformers import AutoModelForCausalLM

    loss = json.loads((run_dir / "sft" / "loss.json").read_text())
    assert len(loss) == 6 and loss[-1]["loss"] < loss[0]["loss"]  # the assistant-only loss falls
    # the stop rule probed training tasks every 2 steps from half way; a toy never reaches the target
    assert [e["step"] for e in loss if "probe_success" in e] == [4, 6]
    assert json.loads((run_dir / "run.json").read_text())["sft_steps_taken"] == 6
    sft = AutoModelForCausalLM.from_pretrained(run_dir / "sft")
    rl = AutoModelForCausalLM.from_pretrained(run_dir / "rl")
    shape = ("vocab_size", "hidden_size", "num_hidden_layers", "eos_token_id", "pad_token_id")
    assert [getattr(rl.config, k) for k in shape] == [getattr(sft.config, k) for k in shape]
    assert rl.config.use_cache  # saved ready to generate (the trainer turns the cache off)
    # (a toy model earns no reward: GRPO's advantages are 0 and its weights rightly stay put)
    steps = json.loads((run_dir / "rl" / "steps.json").read_text())
    assert [s["step"] for s in steps] == [1, 2] and all(0.0 <= s["success"] <= 1.0 for s in steps)
    assert all(0.0 <= s["zero_variance_groups"] <= 1.0 and s["entropy"] >= 0.0 for s in steps)
    history = json.loads((run_dir / "rl" / "log_history.json").read_text())
    assert [h["env/turns"] >= 1 for h in history if "env/turns" in h] == [True, True]  # TRLRollout's own logs


def test_eval_compare_and_run_record(run_dir):
    for name in ("sft", "rl"):
        records = _jsonl(run_dir / f"eval_{name}" / "rollouts.jsonl")
        assert len(records) == 8 and {r["task_index"] for r in records} == set(
            json.loads((run_dir / "data" / "heldout.json").read_text())["heldout_indices"])
        summary = json.loads((run_dir / f"eval_{name}" / "summary.json").read_text())
        assert {"value", "ci_low", "ci_high"} <= set(summary["success_rate"]) and "iqm" in summary
        assert set(summary["tool_use"]) >= {"episodes_with_well_formed_call", "parse_errors_per_turn",
                                            "tool_errors_per_turn"}
    compare = json.loads((run_dir / "compare.json").read_text())
    assert compare["shared_tasks"] == 8 and "probability_of_improvement" in compare["against_baseline"]["rl"]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["config"]["seed"] == 3 and run["versions"]["torch"] and run["versions"]["trl"]
    assert set(run["stages"]) == {"1_data", "2_tokenizer_model", "3_sft", "5a_eval_sft", "4_rl", "5b_eval_rl",
                                  "6_plots"}
    assert all(s["seconds"] >= 0 and s["peak_rss_mb"] > 0 for s in run["stages"].values())
    better, worse, tied = run["results"]["tasks_better_worse_tied"]
    assert better + worse + tied == 8  # the printed table, as the README shows it:
    assert f"; tasks better/worse/tied {better}/{worse}/{tied}\n" in _learn().table(run["results"], run)
    figures = json.loads((run_dir / "plots" / "figures.json").read_text())
    assert len(figures["rl_steps"]) == 2 and set(figures["eval"]) == {"sft", "rl"}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (run_dir / "plots" / "learning.png").stat().st_size > 0


def test_bad_flags_name_the_argument(capsys):
    with pytest.raises(SystemExit):
        _learn().parse(["--rl-batch", "6", "--group", "4"])
    assert "--rl-batch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _learn().parse(["--sft-target", "25"])  # a success rate, not a percentage
    assert "--sft-target" in capsys.readouterr().err


def test_a_second_run_with_the_same_seed_is_the_same(run_dir):
    again = Path(tempfile.mkdtemp(prefix="benchmax-learn-"))
    try:
        _learn().main([*TOY, "--out", str(again), "--seed", "3"])
        for name in ("data/train.jsonl", "data/heldout.json", "sft/loss.json", "rl/steps.json",
                     "eval_sft/rollouts.jsonl", "eval_rl/rollouts.jsonl"):
            assert (again / name).read_text() == (run_dir / name).read_text(), name
    finally:
        shutil.rmtree(again, ignore_errors=True)


def test_sft_stops_at_the_first_probe_that_reaches_the_target(run_dir):
    """The stop rule itself: probes from half of --sft-steps, every --sft-check steps, and stops
    at the first whose success reaches --sft-target (the probe here is a fixed skill curve)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmax_gym.adapters.tokens import ChatTemplate

    learn = _learn()
    args = learn.parse([*TOY, "--sft-steps", "10", "--sft-check", "2", "--sft-target", "0.5"])
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    run = json.loads((run_dir / "run.json").read_text())
    episodes = learn.solver_episodes(ChatTemplate(tokenizer), run["env_kwargs"]["train"], 8)
    model = AutoModelForCausalLM.from_pretrained(run_dir / "sft")
    probed, log = [], []

    def probe(m):
        probed.append(len(log))
        return [0.1, 0.6, 0.9][len(probed) - 1]

    assert learn.sft(model, episodes, args, tokenizer.pad_token_id, log, probe=probe) == 8
    assert probed == [6, 8] and len(log) == 8 and log[-1]["probe_success"] == 0.6


def test_the_wikipedia_family_runs_the_same_pipeline(tmp_path):
    """--family wikipedia: Wikipedia-v0's generated two-hop questions, the same stages; each task
    seed makes its own encyclopedia, so the held-out questions are about unseen entities."""
    _learn().main(["--family", "wikipedia", "--train-tasks", "8", "--eval-tasks", "2", "--vocab", "300",
                   "--hidden", "16", "--layers", "1", "--heads", "2", "--sft-steps", "2", "--sft-batch", "4",
                   "--rl-steps", "1", "--rl-batch", "2", "--group", "2", "--max-tokens", "128", "--turn-tokens", "24",
                   "--out", str(tmp_path)])
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["env_id"] == "benchmax/Wikipedia-v0" and run["data"]["solver_success"] == 1.0
    train = _jsonl(tmp_path / "data" / "train.jsonl")
    assert {c["function"]["name"] for t in train for m in t["messages"] for c in m.get("tool_calls") or []} >= {
        "search", "get_article"}
    summary = json.loads((tmp_path / "eval_rl" / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["by"]["type"]["bridge"]["episodes"] == 2  # broken down by type
    assert len(_jsonl(tmp_path / "eval_rl" / "rollouts.jsonl")) == 2 and (tmp_path / "rl" / "steps.json").exists()
