"""A user's own documents and traces as they come (binary files named .txt, folders linking
elsewhere, BOMs, UTF-16, CRLF): a clear refusal naming the file, or tasks that play."""

import json

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.cli import main
from benchmax_gym.data import read_jsonl
from benchmax_gym.data.corpus import load_documents


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "cache"))


def cli(*argv):
    try:
        return main(list(argv))
    except SystemExit as exit_:
        return exit_.code


def test_a_binary_file_named_txt_is_refused_naming_it(tmp_path, capsys):
    """Mostly zero bytes decode as UTF-8: the file went into the index and the questions as text."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nThe good document was written in 1999.\n")
    (docs / "dump.txt").write_bytes(b"\x00" * 512 + b"Header 2020. Version 1.\x00\x01\x02")
    with pytest.raises(ValueError, match=r"dump\.txt: binary, not text"):
        load_documents(docs)
    assert cli("tasks", "from-corpus", str(docs), "--out", str(tmp_path / "t.jsonl"), "--quiet") == 2
    err = capsys.readouterr().err
    assert "dump.txt" in err and "Traceback" not in err
    assert not (tmp_path / "t.jsonl").exists()


def test_a_trace_file_linking_outside_the_folder_is_refused_naming_it(tmp_path, capsys):
    """As for documents: a logs folder from elsewhere linking ``x.json`` to another file of this
    machine put that file's conversations into the tasks written."""
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps([{"messages": [{"role": "user", "content": "the vault code is hunter2?"},
                                                {"role": "assistant", "content": "\\boxed{42}"}]}]))
    logs = tmp_path / "logs"
    logs.mkdir()
    good = {"messages": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "\\boxed{5}"}]}
    (logs / "a.jsonl").write_text(json.dumps(good) + "\n")
    (logs / "x.json").symlink_to(secret)
    out = tmp_path / "t.jsonl"
    assert cli("tasks", "from-traces", str(logs), "--env", "benchmax/Math-v0", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "x.json links outside the folder" in err and "Traceback" not in err
    assert not out.exists()
    (logs / "x.json").unlink()
    (logs / "same.json").symlink_to(logs / "a.jsonl")  # (a link inside the folder is read)
    assert cli("tasks", "from-traces", str(logs), "--env", "benchmax/Math-v0", "--out", str(out)) == 0
    assert [t["answer"] for t in read_jsonl(str(out), "tasks")] == ["5"]  # (both files read: one task, written once)
    assert "2 traces read, 1 task written" in capsys.readouterr().out


def test_messy_documents_make_tasks_that_play(tmp_path):
    """A BOM before a Markdown title, CRLF endings, UTF-16 and an empty file: the tasks written
    score 1.0 for their answer and 0.0 for another in the env the README names."""
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "river.md").write_bytes(b"\xef\xbb\xbf# Foo River\r\n\r\nThe Foo river is long. It was named in 1820 "
                                    b"by John Smith.\r\n")
    (docs / "sub" / "city.txt").write_bytes("Alpha city is a town. It was founded in 1901 by Mary Jones."
                                            .encode("utf-16"))
    (docs / "empty.txt").write_bytes(b"")
    out = tmp_path / "t.jsonl"
    assert cli("tasks", "from-corpus", str(docs), "--out", str(out), "--quiet", "--single-hop-only") == 0
    tasks = read_jsonl(str(out), "tasks")
    assert {t["answer"] for t in tasks} >= {"1820", "1901"}
    assert {t["solution"]["supporting"][0] for t in tasks} >= {"Foo River", "city"}
    for task in tasks:
        assert task["answer"] not in task["prompt"]
    env = gym.make("benchmax/Wikipedia-v0", tasks="file", task_args={"dataset": str(out)},
                   backend="local", backend_args={"corpus": str(docs)})
    try:
        for i, task in enumerate(tasks):
            for answer, reward in ((task["answer"], 1.0), ("1066", 0.0)):
                obs, _ = env.reset(seed=0, options={"task_index": i})
                assert task["prompt"] in str(obs)
                _, got, done, _, _ = env.step(f"<answer>{answer}</answer>")
                assert (got, done) == (reward, True)
    finally:
        env.close()


def test_a_trace_whose_prefix_already_gives_the_answer_is_skipped_and_counted(tmp_path, capsys):
    """"Are you sure?" after the answer: cut at the last user message, the task's own conversation
    held its reference, and any model repeating it scored 1.0."""
    logs = tmp_path / "logs.jsonl"
    logs.write_text(json.dumps({"messages": [
        {"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "\\boxed{5}"},
        {"role": "user", "content": "Are you sure?"}, {"role": "assistant", "content": "Yes. \\boxed{5}"}]}) + "\n")
    out = tmp_path / "t.jsonl"
    assert cli("tasks", "from-traces", str(logs), "--env", "benchmax/Math-v0", "--out", str(out), "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["kept"] == 0 and report["skipped"] == {"the reference already answered in the conversation": 1}
    assert not out.exists()
    assert cli("tasks", "from-traces", str(logs), "--env", "benchmax/Math-v0", "--out", str(out),
               "--turn", "first-user") == 0
    [task] = read_jsonl(str(out), "tasks")
    assert (task["messages"], task["answer"]) == ([{"role": "user", "content": "What is 2+3?"}], "5")


@pytest.mark.parametrize("tool_calls", ["notalist", [{"name": "calculator"}], [{"function": {"arguments": "{}"}}]],
                         ids=["not-a-list", "no-function", "no-name"])
def test_a_malformed_tool_call_is_said_as_such_not_as_an_unknown_tool(tmp_path, capsys, tool_calls):
    """A log whose tool_calls are not OpenAI's shape was reported as "unknown tool ''": the line
    now says what the shape must be."""
    logs = tmp_path / "logs.jsonl"
    logs.write_text(json.dumps({"messages": [
        {"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "", "tool_calls": tool_calls},
        {"role": "user", "content": "Go on."}, {"role": "assistant", "content": "\\boxed{5}"}]}) + "\n")
    assert cli("tasks", "from-traces", str(logs), "--env", "benchmax/Math-v0", "--out", str(tmp_path / "t.jsonl")) == 1
    said = capsys.readouterr().out
    assert "message 1: a tool call with no function name (tool_calls must be a list of" in said, said
    assert "unknown tool ''" not in said
