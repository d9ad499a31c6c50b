"""A data command with nothing to write makes no file, leaves an existing one as it was, and exits 1:
an empty task set or SFT file in a pipeline's next step trains or evaluates on nothing, silently."""

import json

from benchmax_gym.cli import main

ENV = "benchmax/Math-v0"


def _wrong_run(tmp_path):
    record = {"env_id": ENV, "outcome": "scored", "reward": 0.0, "success": False, "task_id": "t",
              "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\\boxed{1}"}]}
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps(record) + "\n")
    return episodes


def test_export_sft_with_no_successful_episode_writes_nothing_and_fails(tmp_path, capsys):
    episodes, out = _wrong_run(tmp_path), tmp_path / "sft.jsonl"
    assert main(["export-sft", str(episodes), "--out", str(out), "--env-arg", "python_tool=false"]) == 1
    said = capsys.readouterr().out
    assert not out.exists()
    assert "0 of 1 episodes" in said and "nothing to export" in said and "1 not successful" in said
    out.write_text("yesterday's export\n")  # --overwrite with nothing to export does not empty it
    assert main(["export-sft", str(episodes), "--out", str(out), "--overwrite", "--json",
                 "--env-arg", "python_tool=false"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["exported"] == 0 and summary["out"] is None
    assert out.read_text() == "yesterday's export\n"


def test_from_corpus_keeping_no_question_writes_nothing_and_fails(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Hello there.\n")  # no fact to ask about: no candidate
    out, corpus = tmp_path / "tasks.jsonl", tmp_path / "corpus.jsonl"
    assert main(["tasks", "from-corpus", str(docs), "--out", str(out), "--corpus-out", str(corpus), "--quiet"]) == 1
    assert "0 tasks written (nothing kept: no file written)" in capsys.readouterr().out
    assert not out.exists() and not corpus.exists()
    out.write_text("yesterday's tasks\n")
    assert main(["tasks", "from-corpus", str(docs), "--out", str(out), "--overwrite", "--quiet", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["out"] is None
    assert out.read_text() == "yesterday's tasks\n"


def test_from_traces_keeping_no_task_says_the_old_file_stays(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "t.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    out = tmp_path / "tasks.jsonl"
    out.write_text("yesterday's tasks\n")
    assert main(["tasks", "from-traces", str(logs), "--env", ENV, "--out", str(out), "--overwrite"]) == 1
    assert f"0 tasks written ({out} left as it was)" in capsys.readouterr().out
    assert out.read_text() == "yesterday's tasks\n"
