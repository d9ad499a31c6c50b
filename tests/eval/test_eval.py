"""benchmax-gym eval against a real OpenAI-compatible server on loopback (a scripted model),
through the official openai SDK: native and text tool calling, the endpoint's failure modes,
concurrency, the run directory and resume, and the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.eval import ChatPolicy, EvalError, PolicyError, evaluate, load_run
from benchmax_gym.testing.openai_server import FakeChatServer

ENV = "benchmax/Math-v0"
ENV_KWARGS = {"python_tool": False}
KEY = "sk-test-0123456789abcdef"
CLI = [sys.executable, "-m", "benchmax_gym"]


@pytest.fixture(scope="module")
def answers():
    env = gym.make(ENV, **ENV_KWARGS)
    tasks = env.unwrapped.tasks
    out = {tasks[i].prompt: (i, tasks[i].answer) for i in range(12)}
    env.close()
    return out


def scripted(answers):
    """Task i % 3 == 0: right; 1: wrong; 2: a malformed call first, then right."""

    def reply(body):
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if prompt not in answers:  # the preflight's "ping"
            return {"content": "pong"}
        index, answer = answers[prompt]
        turns = sum(m["role"] == "assistant" for m in body["messages"])
        if index % 3 == 1:
            return {"content": "\\boxed{-987654}"}
        if index % 3 == 2 and turns == 0:
            if body.get("tools"):
                return {"tool_calls": [{"name": "calculator", "arguments": "{not json"}]}
            return {"content": "<tool_call>{not json</tool_call>"}
        return {"content": f"\\boxed{{{answer}}}"}

    return reply


def by_index(result):
    return {r["task_index"]: r for r in result.records}


@pytest.mark.parametrize("native", [True, False])
def test_a_scripted_model_is_scored_task_by_task(answers, native):
    with FakeChatServer(scripted(answers), api_key=KEY) as server:
        policy = ChatPolicy("test-model", base_url=server.url, api_key=KEY, native_tools=native, temperature=0.5)
        result = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=12, concurrency=4)
        bodies = list(server.requests)
    records = by_index(result)
    assert sorted(records) == list(range(12))
    for i, r in records.items():
        assert r["success"] is (i % 3 != 1) and r["error"] is None, (i, r["reward"])
        assert r["parse_errors"] == (1 if i % 3 == 2 else 0)
        assert r["turns"] == (2 if i % 3 == 2 else 1) and r["prompt_tokens"] > 0
    assert result.summary["episodes"] == 12
    chats = [b for b in bodies if b["messages"][-1]["content"] != "ping"]
    assert all(("tools" in b) is native and b["temperature"] == 0.5 for b in chats)
    assert all(isinstance(b.get("seed"), int) for b in chats)  # sampling seeded per pair


def test_each_task_k_times_and_the_same_run_twice_gives_the_same_records(answers):
    with FakeChatServer(scripted(answers)) as server:
        policy = ChatPolicy("test-model", base_url=server.url)
        one = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks="3:9", k=3, concurrency=8, seed=5)
        two = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks="3:9", k=3, concurrency=2, seed=5)
    assert [(r["task_index"], r["sample"]) for r in one.records] == [(i, s) for i in range(3, 9) for s in range(3)]
    strip = lambda rs: [(r["task_index"], r["sample"], r["seed"], r["reward"], r["turns"], r["parse_errors"]) for r in rs]  # noqa: E731
    assert strip(one.records) == strip(two.records)


def test_many_episodes_wait_on_the_model_at_once(answers):
    with FakeChatServer(scripted(answers), latency=0.3) as server:
        evaluate(ENV, ChatPolicy("test-model", base_url=server.url), env_kwargs=ENV_KWARGS, tasks=12,
                 concurrency=12, preflight=False)
        assert server.max_in_flight >= 8  # not one at a time


def test_retries_honour_retry_after_and_a_failing_endpoint_fails_only_its_episode(answers, tmp_path):
    faults = [{"status": 429, "retry_after": 0.05}, {"status": 500}, None,  # task 0: two retries, then fine
              *[{"status": 500, "message": f"upstream said {KEY}"}] * 3,  # task 1: out of retries
              {"delay": 3.0}, None, None,  # task 2 (two turns): past the timeout, then the retry succeeds
              {"malformed": True},  # task 3: a body that is not JSON (not retried)
              {"finish_reason": "length"}]  # task 4: cut by max tokens
    with FakeChatServer(scripted(answers), faults=faults) as server:
        policy = ChatPolicy("test-model", base_url=server.url, api_key=KEY, timeout=1.0, max_retries=2)
        result = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=6, concurrency=1, preflight=False, out=tmp_path / "run")
        requests = len(server.requests)
    r = by_index(result)
    assert r[0]["error"] is None and r[0]["success"]
    assert r[1]["error"] and "500" in r[1]["error"] and r[1]["reward"] is None and not r[1]["success"]
    assert r[2]["error"] is None  # the timed-out request was retried
    assert r[3]["error"].startswith("the endpoint's reply is not valid JSON") and r[3]["reward"] is None
    assert r[4]["finish_reason_length"] == 1
    assert r[5]["error"] is None and r[5]["success"]  # the run went on
    assert requests == 3 + 3 + 3 + 1 + 1 + 2
    for name in ("run.json", "rollouts.jsonl", "summary.json"):
        assert KEY not in (tmp_path / "run" / name).read_text()  # the key is never written
    assert "***" in r[1]["error"]


def test_preflight_fails_in_seconds_with_one_clear_line(answers):
    with FakeChatServer(scripted(answers), api_key=KEY) as server:
        cases = [
            (ChatPolicy("no-such-model", base_url=server.url, api_key=KEY), "does not serve model 'no-such-model'"),
            (ChatPolicy("test-model", base_url=server.url, api_key="sk-wrong"), "refused the API key"),
        ]
        for policy, says in cases:
            with pytest.raises(PolicyError, match=says):
                evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=2)
        assert len(server.requests) == 1  # only the preflight of the known model: no episode ran
    closed = FakeChatServer()
    with closed:
        url = closed.url
    start = time.monotonic()
    with pytest.raises(PolicyError, match="cannot reach http://127.0.0.1"):
        evaluate(ENV, ChatPolicy("test-model", base_url=url), env_kwargs=ENV_KWARGS, tasks=2)
    assert time.monotonic() - start < 60  # a hang guard


def test_python_functions_and_baselines_are_policies():
    async def answer_zero(obs, info):
        return "\\boxed{0}"

    for policy, mean in (("solver", 1.0), ("empty", 0.0), ("random", 0.0), (answer_zero, None), (lambda o, i: "x", 0.0)):
        result = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=6, concurrency=3)
        assert len(result.records) == 6 and all(r["error"] is None for r in result.records)
        if mean is not None:
            assert result.summary["mean_reward"]["value"] == mean, policy


def test_episodes_run_with_fewer_young_collections_and_the_settings_come_back():
    """The run collects its young generation less often (model replies make many short-lived
    containers); the caller's own GC settings are back afterwards, also when the run fails."""
    import gc

    seen = []

    def policy(obs, info):
        seen.append(gc.get_threshold())
        return "\\boxed{0}"

    old = gc.get_threshold()
    gc.set_threshold(900, 11, 12)
    try:
        evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=2)
        assert seen and all(t == (20_000, 11, 12) for t in seen)
        assert gc.get_threshold() == (900, 11, 12)
        class Stop(BaseException):  # what no episode records: it ends the run
            pass

        def stopping(obs, info):
            raise Stop

        with pytest.raises(Stop):
            evaluate(ENV, stopping, env_kwargs=ENV_KWARGS, tasks=1)
        assert gc.get_threshold() == (900, 11, 12)
    finally:
        gc.set_threshold(*old)


def test_a_run_never_formats_its_result(monkeypatch):
    """asyncio's runner formats its main task's repr when it puts back the SIGINT handler; an
    eval's result (every record) is not that task's, so no repr of it is ever built."""
    import threading

    from benchmax_gym.eval.runner import EvalResult

    assert threading.current_thread() is threading.main_thread()  # (where asyncio swaps the handler)
    formatted = []
    monkeypatch.setattr(EvalResult, "__repr__", lambda self: formatted.append(1) or "EvalResult(...)")
    result = evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=4, concurrency=2)
    assert len(result.records) == 4 and formatted == []
    assert repr(result) == "EvalResult(...)" and formatted == [1]  # (the patch is the one repr uses)


def test_a_policy_that_raises_fails_its_episode_with_the_error():
    def broken(obs, info):
        raise RuntimeError("my policy broke")

    result = evaluate(ENV, broken, env_kwargs=ENV_KWARGS, tasks=2)
    assert all(r["error"] == "RuntimeError: my policy broke" and r["reward"] is None for r in result.records)


def test_tasks_selection_errors_are_clear():
    with pytest.raises(EvalError, match="unbounded: say how many"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS)
    with pytest.raises(EvalError, match="--tasks must be all, N or i:j"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks="some")
    with pytest.raises(EvalError, match="not a non-empty range"):
        evaluate(ENV, "solver", env_kwargs={**ENV_KWARGS, "task_args": {"num_tasks": 5}}, tasks="2:9")
    with pytest.raises(EvalError, match="--tasks 0: not a non-empty range of task indices from 0$"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=0)  # unbounded: no count to name ("the None tasks")
    with pytest.raises(EvalError, match="k must be a positive int"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=2, k=0)


# -- the run directory -------------------------------------------------------------------------


def test_the_run_directory_records_everything_and_refuses_foreign_or_different_runs(tmp_path):
    out = tmp_path / "run"
    result = evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=4, k=2, out=out)
    run = json.loads((out / "run.json").read_text())
    assert run["env_id"] == ENV and run["k"] == 2 and run["policy"] == {"kind": "baseline", "name": "solver"}
    assert run["versions"]["benchmax-gym"] and run["started"] and run["ended"] and "host" in run
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 8 and json.loads((out / "summary.json").read_text()) == result.summary
    record = json.loads(lines[0])
    assert record["messages"][0]["role"] == "system" and record["actions"] and record["reward_components"]
    assert "answer" not in json.dumps(record["metadata"])
    with pytest.raises(EvalError, match=r"other settings \(k\)"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=4, k=3, out=out)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(EvalError, match="not a benchmax-gym eval run"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=4, out=foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    (out / "rollouts.jsonl").write_text("{broken\n" + "\n".join(lines) + "\n")
    with pytest.raises(EvalError, match="line 1 is corrupt"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=4, k=2, out=out)


def test_a_killed_run_resumes_with_only_the_missing_pairs(answers, tmp_path):
    out = tmp_path / "run"
    with FakeChatServer(scripted(answers), latency=0.2) as server:
        cmd = [*CLI, "eval", ENV, "--model", "test-model", "--base-url", server.url, "--tasks", "12", "-k", "2",
               "--concurrency", "2", "--env-arg", "python_tool=false", "--out", str(out), "--quiet", "--no-plots"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        rollouts = out / "rollouts.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not rollouts.exists() or len(rollouts.read_text().splitlines()) < 5):
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        with open(rollouts, "a") as f:
            f.write('{"task_index": 11, "sam')  # a record cut short by the kill
        done = {(json.loads(x)["task_index"], json.loads(x)["sample"]) for x in rollouts.read_text().splitlines()[:-1]}
        assert 5 <= len(done) < 24
        before = len(server.requests)
        out2 = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out2.returncode == 0, out2.stderr
        resumed = server.requests[before:]
    run, records = load_run(out)
    pairs = [(r["task_index"], r["sample"]) for r in records]
    assert sorted(pairs) == [(i, s) for i in range(12) for s in range(2)]  # each pair once
    assert run["resumed"]
    # the second run asked the model only about missing pairs (one preflight, then 1-2 turns each)
    assert len(resumed) <= 1 + 2 * (24 - len(done))


def test_cli_eval_and_compare(tmp_path):
    for policy in ("solver", "empty"):
        out = subprocess.run([*CLI, "eval", ENV, "--policy", policy, "--tasks", "6", "-k", "2", "--quiet",
                              "--env-arg", "python_tool=false", "--out", str(tmp_path / policy)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert str(tmp_path / policy) in out.stdout
    out = subprocess.run([*CLI, "compare", str(tmp_path / "empty"), str(tmp_path / "solver"), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)
    bad = subprocess.run([*CLI, "eval", ENV, "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--model NAME" in bad.stderr and "Traceback" not in bad.stderr
    bad = subprocess.run([*CLI, "eval", ENV, "--model", "m", "--api-key-env", "NO_SUCH_VAR_X", "--out",
                          str(tmp_path / "x")], capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "NO_SUCH_VAR_X"})
    assert bad.returncode == 2 and "NO_SUCH_VAR_X: the variable is not set" in bad.stderr
    assert not Path(tmp_path / "x").exists()


def test_workers_split_the_episodes_and_give_the_same_records(answers, tmp_path):
    with FakeChatServer(scripted(answers)) as server:
        policy = ChatPolicy("test-model", base_url=server.url, api_key=KEY)
        one = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=12, k=2, concurrency=4, seed=3)
        two = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=12, k=2, concurrency=4, seed=3, workers=2,
                       out=tmp_path / "run")
    strip = lambda rs: [(r["task_index"], r["sample"], r["seed"], r["reward"], r["turns"], r["parse_errors"]) for r in rs]  # noqa: E731
    assert strip(two.records) == strip(one.records) and len(two.records) == 24
    assert len((tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()) == 24
    assert KEY not in (tmp_path / "run" / "rollouts.jsonl").read_text()
    with pytest.raises(EvalError, match="workers must be a positive int"):
        evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=2, workers=0)


WORKERS_SCRIPT = """
import json, os, pathlib, sys

from benchmax_gym.eval import evaluate
from benchmax_gym.eval.runner import _worker_context


def mark_and_answer(obs, info):  # leaves a mark where the variable says, in the process it runs in
    pathlib.Path(os.environ["BMX_TEST_MARKS"], str(os.getpid())).touch()
    return "\\\\boxed{0}"


if __name__ == "__main__":
    errors = []
    for folder in sys.argv[1:]:
        os.environ["BMX_TEST_MARKS"] = folder
        result = evaluate("benchmax/Math-v0", mark_and_answer, env_kwargs={"python_tool": False}, tasks=4,
                          concurrency=2, workers=2)
        errors += [r["error"] for r in result.records]
    import multiprocess.forkserver

    print(json.dumps({"errors": errors, "me": os.getpid(), "method": _worker_context().get_start_method(),
                      "server": multiprocess.forkserver._forkserver._forkserver_pid}))
"""


def test_workers_start_with_the_environment_of_their_run(tmp_path):
    """Workers start from a fork server that the first run starts (it imports the package once,
    not each worker); a later run's workers still see the environment variables as they are
    when that run starts, as spawned ones would, and each run has processes of its own."""
    script = tmp_path / "two_runs.py"
    script.write_text(WORKERS_SCRIPT)
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    out = subprocess.run([sys.executable, str(script), *map(str, folders)], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["errors"] == [None] * 8
    first, second = ({int(p.name) for p in folder.iterdir()} for folder in folders)
    assert len(first) == len(second) == 2 and not first & second and report["me"] not in first | second
    assert report["method"] == "forkserver" and report["server"]  # (Linux: the fork server's children)


def test_a_worker_message_the_c_pickler_refuses_still_reaches_the_parent():
    """Workers send records with the C pickler (dill was 40x slower a record); what it refuses
    (a function in a record) goes by dill, and the parent reads either."""
    import multiprocess as mp

    from benchmax_gym.eval.runner import _dumps, _receive

    parent, child = mp.Pipe()
    child.send_bytes(_dumps(("record", {"reward": 1.0, "metadata": {"seen": [1, 2]}})))
    child.send_bytes(_dumps(("record", {"reward": 0.5, "metadata": {"f": lambda x: x + 1}})))
    assert _receive(parent) == ("record", {"reward": 1.0, "metadata": {"seen": [1, 2]}})
    kind, record = _receive(parent)
    assert kind == "record" and record["reward"] == 0.5 and record["metadata"]["f"](1) == 2
    parent.close()
    child.close()


def test_episode_record_has_the_reward_and_components_eval_writes():
    """The README says episode_record() is what eval writes: the reward and its components too."""
    env = gym.make(ENV, **ENV_KWARGS)
    obs, info = env.reset(seed=0, options={"task_index": 0})
    assert env.unwrapped.episode_record()["reward"] is None  # not graded yet
    _, reward, *_, info = env.step(f"\\boxed{{{env.unwrapped.episode.task.answer}}}")
    record = env.unwrapped.episode_record()
    assert record["reward"] == reward == 1.0 and record["reward_components"] == info["reward_components"]
    assert record["reward_components"]
    env.close()
    result = evaluate(ENV, "solver", env_kwargs=ENV_KWARGS, tasks=1)
    assert result.records[0]["reward"] == 1.0 and result.records[0]["reward_components"]


BUSY_PARENT_SCRIPT = """
import json, os, sys, time

import benchmax_gym
from benchmax_gym.eval import evaluate, runner


def echo(text: str) -> str:
    '''Echo the text.

    Args:
        text: what to echo
    '''
    return text


benchmax_gym.register_tool_env(  # records of ~500 KB: more than a pipe holds
    "testing/BigRecords-v0", tools=[echo], tasks=[{"prompt": f"{i} " + "p" * 500_000, "answer": "0"} for i in range(16)],
    rubric=[lambda completion, answer: float(completion == answer)])


def answer(obs, info):  # notes the moment of each call, in the worker it runs in; a model's time
    with open(os.environ["BMX_TEST_CALLS"], "a") as calls:
        calls.write(f"{time.monotonic()}\\n")
    time.sleep(0.05)
    return "0"


if __name__ == "__main__":
    busy, add = [], runner._Sink.add

    def slow_add(self, record):  # the parent busy for 4 s with the first record
        if not busy:
            busy.append(time.monotonic())
            time.sleep(4)
            busy.append(time.monotonic())
        add(self, record)

    runner._Sink.add = slow_add
    result = evaluate("testing/BigRecords-v0", answer, tasks=16, concurrency=2, workers=2)
    print(json.dumps({"busy": busy, "records": [[r["task_index"], r["reward"], r["error"]] for r in result.records]}))
"""


def test_workers_play_on_while_the_parent_is_busy_reading(tmp_path):
    """An eval worker never blocks on the parent: while the parent is busy (here 4 s with one
    record; in a big run, reading the other workers' records), the worker's episodes go on and
    their records wait in the worker, none lost. A worker that blocked writing to a full pipe
    stalled every episode it held."""
    script = tmp_path / "busy_parent.py"
    script.write_text(BUSY_PARENT_SCRIPT)
    calls = tmp_path / "calls"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env={**os.environ, "BMX_TEST_CALLS": str(calls)})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["records"] == [[i, 1.0, None] for i in range(16)]
    start, end = report["busy"]
    during = [t for t in map(float, calls.read_text().split()) if start < t < end]
    assert len(during) >= 6, f"{len(during)} of 16 calls while the parent was busy"


ORPHAN_SCRIPT = """
import os, time

from benchmax_gym.eval import evaluate


def answer(obs, info):  # notes which worker played, and when
    with open(os.environ["BMX_TEST_CALLS"], "a") as calls:
        calls.write(f"{os.getpid()} {time.monotonic()}\\n")
    time.sleep(0.02)
    return "\\\\boxed{0}"


if __name__ == "__main__":
    evaluate("benchmax/Math-v0", answer, env_kwargs={"python_tool": False}, tasks=4000, concurrency=2, workers=2)
"""


def test_workers_whose_parent_is_gone_stop_playing(tmp_path):
    """A parent killed mid-run (SIGKILL, an OOM kill): its workers stop at their next record
    instead of playing the rest of their episodes against the model for nobody."""
    import psutil

    script = tmp_path / "orphans.py"
    script.write_text(ORPHAN_SCRIPT)
    calls = tmp_path / "calls"
    run = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stderr=subprocess.DEVNULL,
                           env={**os.environ, "BMX_TEST_CALLS": str(calls)})
    try:
        deadline = time.monotonic() + 120  # (a hang guard: the workers start in moments)
        while time.monotonic() < deadline and len({line.split()[0] for line in _lines(calls)}) < 2:
            time.sleep(0.1)
        workers = {int(line.split()[0]) for line in _lines(calls)}
        assert len(workers) == 2
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) and psutil.Process(pid).status() !=
                                              psutil.STATUS_ZOMBIE for pid in workers):
        time.sleep(0.2)
    left = [pid for pid in workers if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "workers played on with their parent gone"
    assert len(_lines(calls)) < 2 * 400  # (each had 2,000 episodes: it stopped at its next record)


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


PROMPT_RECORDS_SCRIPT = """
import json, time

from benchmax_gym.eval import evaluate, runner


def answer(obs, info):  # a policy that never yields to the worker's event loop
    time.sleep(0.02)
    return "\\\\\\\\boxed{0}"


if __name__ == "__main__":
    arrived, add = [], runner._Sink.add

    def noted_add(self, record):
        arrived.append(time.monotonic())
        add(self, record)

    runner._Sink.add = noted_add
    start = time.monotonic()
    evaluate("benchmax/Math-v0", answer, env_kwargs={"python_tool": False}, tasks=60, concurrency=2, workers=2)
    print(json.dumps({"start": start, "arrived": arrived}))
"""


def test_records_reach_the_parent_as_episodes_finish(tmp_path):
    """Each record goes up as its episode ends (the run directory, the progress bar and a resume
    after a crash rely on it), even from a worker whose policy never yields to its event loop."""
    script = tmp_path / "prompt_records.py"
    script.write_text(PROMPT_RECORDS_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    arrived = report["arrived"]
    assert len(arrived) == 60
    # 30 episodes of >= 20 ms per worker: the first records come well before the last
    assert arrived[9] < arrived[-1] - 0.3, [round(t - report["start"], 3) for t in arrived]
