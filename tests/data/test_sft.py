"""``benchmax-gym export-sft``: a run's successful scored episodes as chat JSON Lines, with the env's
tool schemas, that TRL's SFTTrainer tokenizes as it is."""

import json
import os
import re

import pytest

from benchmax_gym.cli import main
from benchmax_gym.eval import evaluate

ENV = "benchmax/Math-v0"
TASKS = [{"id": f"m{i}", "prompt": f"Compute: {a} * {b}", "answer": str(a * b)}
         for i, (a, b) in enumerate([(6, 7), (3, 5), (12, 4), (9, 9)])]


def half_right(obs, info):
    """Calls the calculator, then answers right when the product is even (two of the four tasks)."""
    if info.get("turn", 0) == 0:
        expression = re.search(r"Compute: (.*)", obs).group(1).strip()
        return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
    value = int(re.search(r"-?\d+", obs.split("<tool_response>")[-1]).group())
    return f"\\boxed{{{value if value % 2 == 0 else value + 1}}}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "run"
    result = evaluate(ENV, half_right, env_kwargs={"tasks": TASKS, "python_tool": False}, out=out)
    assert sorted(r["success"] for r in result.records) == [False, False, True, True]
    return out


def test_only_successful_episodes_are_written_with_tools_and_structured_calls(run_dir, capsys):
    assert main(["export-sft", str(run_dir), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 4 and summary["exported"] == 2 and summary["left_out"] == {"not successful": 2}
    rows = [json.loads(line) for line in open(run_dir / "sft.jsonl")]
    assert sorted(r["task_id"] for r in rows) == ["m0", "m2"]
    row = rows[0]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    call = row["messages"][2]["tool_calls"][0]["function"]
    assert call["name"] == "calculator" and isinstance(call["arguments"], dict)  # objects, as templates want
    assert row["messages"][3]["name"] == "calculator"
    tools = json.loads(row["tools"])
    assert [t["function"]["name"] for t in tools] == ["calculator"]  # the run's env_kwargs: no python tool
    # --min-reward 0 keeps every scored episode; an existing file is not overwritten silently
    with pytest.raises(SystemExit):
        main(["export-sft", str(run_dir)])
    assert "exists" in capsys.readouterr().err
    assert main(["export-sft", str(run_dir), "--min-reward", "0", "--overwrite", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exported"] == 4
    assert main(["export-sft", str(run_dir), "--no-tools", "--overwrite"]) == 0
    assert all("tools" not in json.loads(line) for line in open(run_dir / "sft.jsonl"))


def test_trl_sft_trainer_tokenizes_the_export(run_dir, tmp_path, capsys):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from benchmax_gym.testing.tokenizers import tiny_model, tiny_tokenizer

    out = tmp_path / "sft.jsonl"
    assert main(["export-sft", str(run_dir), "--out", str(out)]) == 0
    dataset = datasets.load_dataset("json", data_files=str(out), split="train")
    assert trl.data_utils.is_conversational(dataset[0])
    tokenizer = tiny_tokenizer("qwen")
    config = trl.SFTConfig(output_dir=str(tmp_path / "trainer"), max_steps=1, report_to=[], per_device_train_batch_size=1,
                           use_cpu=True, dataset_num_proc=None)
    trainer = trl.SFTTrainer(model=tiny_model(tokenizer), args=config, train_dataset=dataset,
                             processing_class=tokenizer)
    text = tokenizer.decode(trainer.train_dataset[0]["input_ids"])
    assert '{"name": "calculator", "arguments": {"expression":' in text  # the call, arguments as an object
    assert "<tools>" in text and '"name": "calculator"' in text  # the schemas, rendered by the template
    assert "\\boxed{" in text


def test_a_run_jsonl_file_exports_too(tmp_path, capsys):
    episodes = tmp_path / "episodes.jsonl"
    assert main(["run", ENV, "--policy", "solver", "--episodes", "3", "--jsonl", str(episodes), "--quiet", "--json",
                 "--env-arg", "python_tool=false"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["export-sft", str(episodes)])  # a file: --out must be said
    assert "--out" in capsys.readouterr().err
    out = tmp_path / "sft.jsonl"
    assert main(["export-sft", str(episodes), "--out", str(out), "--env-arg", "python_tool=false", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["exported"] == 3 and summary["env_id"] == ENV
    rows = [json.loads(line) for line in open(out)]
    assert all(r["messages"][-1]["role"] == "assistant" and r["reward"] == 1.0 for r in rows)


def test_a_malformed_transcript_is_left_out_and_counted_not_a_crash(tmp_path, capsys):
    """A hand-edited or foreign record (messages not chat messages) was an AttributeError/TypeError."""
    good = {"env_id": ENV, "outcome": "scored", "reward": 1.0, "task_id": "t",
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\\boxed{1}"}]}
    bad = [{**good, "messages": [1, 2]},
           {**good, "messages": [{"role": "assistant", "content": "x", "tool_calls": 5}]},
           {**good, "messages": [{"role": "assistant", "content": "x", "tool_calls": [5]}]}]
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("".join(json.dumps(r) + "\n" for r in [good, *bad]))
    out = tmp_path / "sft.jsonl"
    assert main(["export-sft", str(episodes), "--out", str(out), "--env-arg", "python_tool=false", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["exported"] == 1 and summary["left_out"] == {"malformed transcript": 3}


def test_tool_call_arguments_nested_too_deeply_are_kept_as_text_not_a_crash(tmp_path, capsys):
    """A foreign log's call whose ``arguments`` JSON nests past Python's recursion limit ended the
    export with a RecursionError; it is kept as the text it was (what ``chat_messages("hf")`` does
    with arguments that do not parse), the row after it exported too."""
    deep = "[" * 100_000 + "]" * 100_000
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": deep}}
    record = {"env_id": ENV, "outcome": "scored", "reward": 1.0, "task_id": "t",
              "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": "c1", "name": "calculator", "content": "Error"},
                           {"role": "assistant", "content": "\\boxed{1}"}]}
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps(record) + "\n" + json.dumps({**record, "task_id": "u"}) + "\n")
    out = tmp_path / "sft.jsonl"
    assert main(["export-sft", str(episodes), "--out", str(out), "--env-arg", "python_tool=false", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exported"] == 2
    rows = [json.loads(line) for line in open(out)]
    assert [r["messages"][1]["tool_calls"][0]["function"]["arguments"] for r in rows] == [deep, deep]


def _refused(capsys, *args):
    with pytest.raises(SystemExit) as exit_:
        main(["export-sft", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("name", ["rollouts.jsonl", "run.json"])
def test_out_that_is_the_run_it_reads_is_refused_and_the_run_kept(run_dir, capsys, name):
    """(--out RUN/rollouts.jsonl --overwrite replaced the run with its export: compare and
    export-sft then failed with 'rollouts.jsonl line 1 is corrupt'.)"""
    before = (run_dir / name).read_bytes()
    spelled = os.path.join(str(run_dir), ".", name)
    err = _refused(capsys, str(run_dir), "--out", spelled, "--overwrite")
    assert f"--out {spelled} is RUN's {name}" in err
    assert (run_dir / name).read_bytes() == before


def test_out_that_is_the_run_file_it_reads_is_refused_through_a_symlink(run_dir, tmp_path, capsys):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_bytes((run_dir / "rollouts.jsonl").read_bytes())
    (tmp_path / "link.jsonl").symlink_to(episodes)
    before = episodes.read_bytes()
    assert "is RUN" in _refused(capsys, str(episodes), "--out", str(tmp_path / "link.jsonl"), "--overwrite")
    assert episodes.read_bytes() == before


def test_env_other_than_the_runs_and_env_with_no_tools_are_refused(run_dir, tmp_path, capsys):
    """(A Math run was written with Wikipedia's tool schemas; --no-tools ignored --env.)"""
    out = str(tmp_path / "sft.jsonl")
    err = _refused(capsys, str(run_dir), "--out", out, "--env", "benchmax/Wikipedia-v0")
    assert f"--env benchmax/Wikipedia-v0: RUN {str(run_dir)!r} is a run of {ENV}" in err
    assert "--env: for the tools' schemas only" in _refused(capsys, str(run_dir), "--out", out, "--no-tools", "--env", ENV)
    assert "--env-arg: for the tools' schemas only" in _refused(capsys, str(run_dir), "--out", out, "--no-tools",
                                                                   "--env-arg", "python_tool=false")
    assert not os.path.exists(out)
    assert main(["export-sft", str(run_dir), "--out", out, "--env", ENV, "--json"]) == 0  # its own env: fine
    assert json.loads(capsys.readouterr().out)["exported"] == 2


def test_no_tools_exports_a_run_that_names_no_env(tmp_path, capsys):
    record = {"outcome": "scored", "reward": 1.0, "task_id": "t",
              "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\\boxed{1}"}]}
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps(record) + "\n")
    out = tmp_path / "sft.jsonl"
    assert "pass --env" in _refused(capsys, str(episodes), "--out", str(out))
    assert main(["export-sft", str(episodes), "--out", str(out), "--no-tools", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exported"] == 1
