"""``benchmax-gym tasks from-traces``: eval's own rollouts and a gateway-style log become tasks that
start from the logged conversation; bad tool calls are reported, never silently dropped."""

import json

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.cli import main
from benchmax_gym.data import load_tasks
from benchmax_gym.eval import evaluate

ENV = "benchmax/Math-v0"


def call(name, arguments, id_="c1"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [call("calculator", {"expression": "2 + 3"})]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "\\boxed{5}"},
    {"role": "user", "content": "And that times 4?"},
    {"role": "assistant", "content": None, "tool_calls": [call("calculator", {"expr": "5 * 4"}, "c2")]},  # bad args
    {"role": "tool", "tool_call_id": "c2", "content": "Error"},
    {"role": "assistant", "content": "It is <answer>20</answer>."},
]


def write_log(path):
    lines = [
        json.dumps({"messages": CONVERSATION, "reward": 1.0}),
        json.dumps({"messages": [{"role": "user", "content": "Weather?"},
                                 {"role": "assistant", "content": "", "tool_calls": [call("weather", {"city": "Lima"})]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                                 {"role": "user", "content": "So 1+1?"},
                                 {"role": "assistant", "content": "\\boxed{2}"}], "reward": 1.0}),
        json.dumps({"request": {"messages": [{"role": "user", "content": "What is 9 - 9?"}]},
                    "response": {"choices": [{"message": {"role": "assistant", "content": "\\boxed{1}"}}]},
                    "reward": 0.0}),
        json.dumps({"messages": [{"role": "user", "content": "What is 8 * 6?"},
                                 {"role": "assistant", "content": '<tool_call>{"name": "abacus", "arguments": {}}</tool_call>'},
                                 {"role": "user", "content": "No abacus, just answer."},
                                 {"role": "assistant", "content": "\\boxed{48}"}], "reward": 1.0}),
        "this line is not JSON",
        json.dumps({"request": {"messages": [{"role": "user", "content": "What is 7 * 6?"}]},
                    "response": {"choices": [{"message": {"role": "assistant", "content": "\\boxed{42}"}}]},
                    "reward": 1.0}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def from_traces(capsys, *args):
    code = main(["tasks", "from-traces", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_eval_rollouts_become_tasks_that_replay_the_logged_question(tmp_path, capsys):
    run = evaluate(ENV, "solver", tasks=3, out=tmp_path / "run")
    assert all(r["success"] for r in run.records)
    out = tmp_path / "tasks.jsonl"
    code, report = from_traces(capsys, str(tmp_path / "run" / "rollouts.jsonl"), "--env", ENV, "--out", str(out),
                               "--keep", "success=true")
    assert code == 0 and report["traces"] == 3 and report["kept"] == 3 and report["calls_checked"] >= 3
    assert report["unknown_tools"] == {} and report["invalid_arguments"] == {}
    tasks = load_tasks(out)
    env = gym.make(ENV, tasks=tasks)
    logged = {r["task_id"]: r for r in run.records}
    assert sorted(t.metadata["trace_task_id"] for t in tasks.tasks) == sorted(logged)
    for i, task in enumerate(tasks.tasks):
        record = logged[task.metadata["trace_task_id"]]
        obs, info = env.reset(seed=0, options={"task_index": i})
        # the env's own system prompt once (the logged copy of it dropped), then the logged question
        assert [m["role"] for m in info["messages"]] == ["system", "user"]
        assert info["messages"][1]["content"] == record["messages"][1]["content"]
        _, reward, terminated, _, _ = env.step(f"\\boxed{{{tasks[i].answer}}}")
        assert terminated and reward == 1.0
    env.close()


def test_an_eval_run_folder_reads_its_rollouts_and_reports_no_skipped_records(tmp_path, capsys):
    """(run.json and summary.json of the folder were each reported as "not a chat trace".)"""
    evaluate(ENV, "solver", tasks=2, out=tmp_path / "run")
    (tmp_path / "run" / "notes.json").write_text(json.dumps({"by": "me"}))  # a file of the user's own: reported
    code, report = from_traces(capsys, str(tmp_path / "run"), "--env", ENV, "--out", str(tmp_path / "t.jsonl"))
    assert code == 0 and report["traces"] == 3 and report["kept"] == 2
    assert report["skipped"] == {"not a chat trace": 1} and report["examples"] == [
        "notes.json[1]: not a chat trace (no messages)"]


@pytest.mark.parametrize("given", ["file", "folder"])
def test_out_that_is_a_traces_file_it_reads_is_refused(tmp_path, capsys, given):
    """(--out LOGS --overwrite replaced the traces it read with the tasks.)"""
    (tmp_path / "logs").mkdir()
    log = write_log(tmp_path / "logs" / "gateway.jsonl")
    before = log.read_bytes()
    logs = str(log) if given == "file" else str(tmp_path / "logs")
    spelled = str(tmp_path / "logs" / "." / "gateway.jsonl")
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-traces", logs, "--env", ENV, "--out", spelled, "--overwrite"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--out {spelled} is the traces file" in err and len(err.strip().splitlines()) == 1
    assert log.read_bytes() == before


def test_a_gateway_log_is_cut_filtered_and_its_bad_calls_reported(tmp_path, capsys):
    log = write_log(tmp_path / "gateway.jsonl")
    out = tmp_path / "tasks.jsonl"
    code, report = from_traces(capsys, str(log), "--env", ENV, "--out", str(out), "--keep", "reward>=1")
    assert code == 0
    assert report["traces"] == 6 and report["kept"] == 2
    assert report["skipped"] == {"not a chat trace": 1, "not kept by --keep reward>=1": 1,
                                 "a bad tool call in the prefix": 2}
    assert report["unknown_tools"] == {"weather": 1, "abacus": 1}
    assert report["invalid_arguments"] == {"calculator": 1}
    assert any("gateway.jsonl:1: message 6: invalid arguments for calculator" in e for e in report["examples"])
    first, second = load_tasks(out).tasks
    # cut at the last user message: the earlier exchange is context, the reference the final answer
    assert [m["content"] for m in first.messages][-1] == "And that times 4?" and first.answer == "20"
    assert first.messages[0] == {"role": "system", "content": "You are terse."}
    assert second.messages == ({"role": "user", "content": "What is 7 * 6?"},) and second.answer == "42"
    env = gym.make(ENV, tasks=load_tasks(out))
    obs, info = env.reset(seed=0, options={"task_index": 0})
    assert info["messages"][0]["content"].endswith("You are terse.")  # merged into the env's system prompt
    assert [m["role"] for m in info["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    env.close()


def test_turn_choices_and_allowing_invalid_calls(tmp_path, capsys):
    log = write_log(tmp_path / "gateway.jsonl")
    code, report = from_traces(capsys, str(log), "--env", ENV, "--out", str(tmp_path / "a.jsonl"),
                               "--keep", "reward>=1", "--allow-invalid-calls", "--turn", "1")
    assert code == 0 and report["kept"] == 4
    first = load_tasks(tmp_path / "a.jsonl").tasks[0]
    assert [m["role"] for m in first.messages] == ["system", "user"]  # before the first assistant message
    assert first.answer == "20"  # the final answer is still the reference
    code, report = from_traces(capsys, str(log), "--env", ENV, "--out", str(tmp_path / "b.jsonl"),
                               "--keep", "reward>=1", "--turn", "final")
    assert report["kept"] == 1  # the bad calls are all in the prefix now: only the clean trace is left
    code, report = from_traces(capsys, str(log), "--env", ENV, "--out", str(tmp_path / "c.jsonl"),
                               "--keep", "reward>=1", "--turn", "final", "--allow-invalid-calls")
    first = load_tasks(tmp_path / "c.jsonl").tasks[0]
    assert report["kept"] == 4 and first.messages[-1]["role"] == "tool"  # all but the final reply


@pytest.mark.parametrize("args, says", [
    (["--keep", "reward~1"], "--keep must be"),
    (["--keep", "reward>=1.2.3"], "--keep 'reward>=1.2.3': '1.2.3' is not a number"),
    (["--turn", "middle"], "--turn must be"),
    (["--turn", "0"], "counts assistant messages from 1"),
    (["--env", "benchmax/Nope-v0"], "--env"),
])
def test_bad_options_fail_in_one_line(tmp_path, capsys, args, says):
    log = write_log(tmp_path / "gateway.jsonl")
    argv = ["tasks", "from-traces", str(log), "--out", str(tmp_path / "t.jsonl")]
    if "--env" not in args:
        argv += ["--env", ENV]
    with pytest.raises(SystemExit) as exit_:
        main(argv + args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "t.jsonl").exists()


def test_a_json_array_of_traces_is_read_whole(tmp_path, capsys):
    (tmp_path / "traces.json").write_text(json.dumps([{"messages": CONVERSATION[:5], "reward": 1.0},
                                                      {"messages": CONVERSATION[1:2], "reward": 1.0}], indent=2))
    code, report = from_traces(capsys, str(tmp_path / "traces.json"), "--env", ENV, "--out", str(tmp_path / "t.jsonl"))
    assert code == 0 and report["traces"] == 2 and report["kept"] == 1
    assert report["skipped"] == {"no reference answer": 1}  # the second trace has no reply to trust


def test_a_hostile_trace_is_reported_and_the_rest_still_read(tmp_path, capsys):
    """``tool_calls`` that is not a list (a broken or foreign log) was a TypeError that ended the command."""
    user, reply = {"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "\\boxed{2}"}
    lines = [{"messages": [user, {"role": "assistant", "content": "x", "tool_calls": 5}, user, reply]},
             {"messages": [user, reply], "reward": 1.0}]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, report = from_traces(capsys, str(log), "--env", ENV, "--out", str(tmp_path / "t.jsonl"))
    assert code == 0 and report["traces"] == 2 and report["kept"] == 1
    assert report["skipped"] == {"a bad tool call in the prefix": 1} and report["unknown_tools"] == {"(no name)": 1}


def test_a_blank_answer_field_is_no_reference(tmp_path, capsys):
    """A task whose reference is blank text would be scored against nothing: skipped and said."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"messages": CONVERSATION[1:5], "gold": gold}) + "\n" for gold in ("", "  ", "5")))
    code, report = from_traces(capsys, str(log), "--env", ENV, "--out", str(tmp_path / "t.jsonl"),
                               "--answer-field", "gold")
    assert code == 0 and report["kept"] == 1 and report["skipped"] == {"no reference answer": 2}
    assert [t.answer for t in load_tasks(tmp_path / "t.jsonl").tasks] == ["5"]


def test_a_byte_order_mark_loses_no_trace(tmp_path, capsys):
    """A file saved with a UTF-8 byte-order mark (Windows editors) lost its first trace (JSON Lines)
    or all of them (a JSON array), each counted as "not a chat trace"."""
    trace = {"messages": CONVERSATION[1:5], "reward": 1.0}
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "lines.jsonl").write_text(f"{json.dumps(trace)}\r\n{json.dumps(trace)}\r\n", encoding="utf-8-sig")
    (tmp_path / "logs" / "array.json").write_text(json.dumps([trace, trace]), encoding="utf-8-sig")
    code, report = from_traces(capsys, str(tmp_path / "logs"), "--env", ENV, "--out", str(tmp_path / "t.jsonl"))
    assert code == 0 and report["traces"] == 4 and report["skipped"] == {}
    assert report["kept"] == 1 and report["duplicates"] == 3  # (one task, four times: written once)


def test_an_unreadable_line_is_reported_with_its_file_line_and_why_and_the_rest_still_read(tmp_path, capsys):
    """A line in another encoding was a UnicodeDecodeError naming no file; JSON nested past Python's
    recursion limit (a line, or a tool call's arguments) a RecursionError traceback; both ended the
    command. Two logs of the same name in different folders are told apart."""
    good = json.dumps({"messages": CONVERSATION[1:5], "reward": 1.0}).encode()
    deep_arguments = "{\"expression\": " + "[" * 100_000 + "]" * 100_000 + "}"
    hostile = {"messages": [CONVERSATION[1], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": deep_arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "?"}, {"role": "user", "content": "Just answer."},
        {"role": "assistant", "content": "\\boxed{5}"}], "reward": 1.0}
    for folder in ("monday", "tuesday"):
        (tmp_path / "logs" / folder).mkdir(parents=True)
    latin = b'{"messages": [{"role": "user", "content": "caf'
    (tmp_path / "logs" / "monday" / "log.jsonl").write_bytes(
        latin + b'\xe9?"}]}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n" + good + b"\n")
    (tmp_path / "logs" / "tuesday" / "log.jsonl").write_text(json.dumps(hostile) + "\n" + good.decode() + "\n")
    code, report = from_traces(capsys, str(tmp_path / "logs"), "--env", ENV, "--out", str(tmp_path / "t.jsonl"))
    assert code == 0 and report["traces"] == 5 and report["kept"] == 1 and report["duplicates"] == 1  # (good twice)
    assert report["skipped"] == {"not a chat trace": 2, "a bad tool call in the prefix": 1}
    assert report["examples"][:2] == [f"monday/log.jsonl:1: not UTF-8 text (byte {len(latin)} of the line); save the file as UTF-8",
                                      "monday/log.jsonl:2: JSON nested too deeply to read"]
    assert report["examples"][2].startswith("tuesday/log.jsonl:1: message 1: invalid arguments for calculator")


def test_a_fifo_as_logs_is_refused_without_opening_it(tmp_path, capsys):
    """(Opening a FIFO blocks until a writer comes; it was called "no such file or folder".)"""
    import os

    fifo = tmp_path / "traces.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-traces", str(fifo), "--env", ENV, "--out", str(tmp_path / "t.jsonl")])
    assert exit_.value.code == 2 and "not a regular file or folder" in capsys.readouterr().err


def test_the_same_task_from_several_traces_is_written_once_and_counted(tmp_path, capsys):
    """A run of -k 4 holds each task's conversation four times: all were written, trace-0 and trace-1
    the same task, without a word. A task is its messages and answer (task_digest's identity without
    the id and the metadata saying where it came from): the same messages with another answer, or
    another conversation with the same answer, are tasks of their own."""
    question = [{"role": "user", "content": "What is 7 * 6?"}]
    record = {"request": {"messages": question}, "reward": 1.0,
              "response": {"choices": [{"message": {"role": "assistant", "content": "\\boxed{42}"}}]}}
    other_answer = json.loads(json.dumps(record))
    other_answer["response"]["choices"][0]["message"]["content"] = "\\boxed{43}"
    other_question = json.loads(json.dumps(record))
    other_question["request"]["messages"] = [{"role": "user", "content": "What is 6 * 7?"}]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [record, record, other_answer, record, other_question,
                                                          {**record, "task_id": "again"}]))
    out = tmp_path / "tasks.jsonl"
    code, report = from_traces(capsys, str(log), "--env", ENV, "--out", str(out))
    assert code == 0 and report["traces"] == 6 and report["kept"] == 3 and report["duplicates"] == 3
    tasks = load_tasks(out).tasks
    assert [(t.messages[-1]["content"], t.answer) for t in tasks] == [
        ("What is 7 * 6?", "42"), ("What is 7 * 6?", "43"), ("What is 6 * 7?", "42")]
    assert [t.metadata["trace"] for t in tasks] == ["log.jsonl:1", "log.jsonl:3", "log.jsonl:5"]  # the first kept
    assert main(["tasks", "from-traces", str(log), "--env", ENV, "--out", str(out), "--overwrite"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"6 traces read, 3 tasks written to {out} (3 duplicates left out: the same messages and answer as an "
        "earlier trace's)")


def test_the_summary_counts_one_trace_and_one_task_in_the_singular(tmp_path, capsys):
    log = tmp_path / "one.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "What is 7 * 6?"},
                                            {"role": "assistant", "content": "\\boxed{42}"}]}) + "\n")
    assert main(["tasks", "from-traces", str(log), "--env", ENV, "--out", str(tmp_path / "t.jsonl")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"1 trace read, 1 task written to {tmp_path / 't.jsonl'}"
