"""eval as a user runs it for real: a disk that fills up mid-run, a resume with other flags, an
endpoint that rate-limits by date, cuts its replies short or leaves out ``usage``."""

import json
import resource
import socket
import subprocess
import sys
import threading
import time
from email.utils import formatdate
from pathlib import Path

import pytest

from benchmax_gym.eval import ChatPolicy, EvalError, evaluate
from benchmax_gym.testing.openai_server import FakeChatServer

ENV = "benchmax/Math-v0"
ENV_KWARGS = {"python_tool": False}
CLI = [sys.executable, "-m", "benchmax_gym"]


def answer(body):
    return {"content": "\\boxed{0}"}


def records_of(folder: Path) -> list[dict]:
    text = (folder / "rollouts.jsonl").read_text()
    assert not text or text.endswith("\n"), "a torn last line"
    return [json.loads(line) for line in text.splitlines()]  # every line whole


# -- a disk that fills up ----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_stops_the_run_in_one_line_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path, workers):
    """A file size limit stands in for a full disk (Python ignores SIGXFSZ: writes past it fail
    with EFBIG, the one crossing it is cut short). The run said "cannot make the env"; with
    --workers each record after the first failure printed a traceback from the event loop and
    the run played every episode on, unrecorded; the line cut short stayed in the file."""
    args = ["eval", ENV, "--policy", "solver", "--tasks", "30", "-k", "2", "--concurrency", "4", "--workers",
            str(workers), "--env-arg", "python_tool=false", "--quiet", "--no-plots"]
    out = tmp_path / "run"

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    full = subprocess.run([*CLI, *args, "--out", str(out)], capture_output=True, text=True, timeout=300,
                          preexec_fn=small_disk)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-3000:]
    assert full.stderr.strip() == (f"benchmax-gym: error: --out {out}: cannot write the run there "
                                   f"({out / 'rollouts.jsonl'}: File too large)")
    written = records_of(out)
    assert 0 < len(written) < 60 and not (out / "summary.json").exists()
    resumed = subprocess.run([*CLI, *args, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    fresh = subprocess.run([*CLI, *args, "--out", str(tmp_path / "fresh")], capture_output=True, text=True,
                           timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    pairs = sorted((r["task_index"], r["sample"]) for r in records_of(out))
    assert pairs == [(i, s) for i in range(30) for s in range(2)]  # each once: none lost, none twice
    assert json.loads((out / "summary.json").read_text()) == json.loads((tmp_path / "fresh" / "summary.json").read_text())


# -- resuming with other flags -------------------------------------------------------------------------


def test_a_resume_with_other_settings_names_the_flag_and_a_longer_timeout_may_retry_the_failed(tmp_path):
    """The refusal said only "other settings (policy)" for a changed model, temperature, timeout
    or base URL alike; and --retry-failed with a longer --timeout (the failures were timeouts)
    was refused, though the model is asked the same."""
    out = tmp_path / "run"
    slow = {"delay": 0.5}
    with FakeChatServer(answer, models=("m1", "m2"), fault_for=lambda body: slow) as server:
        def policy(model="m1", **kw):
            return ChatPolicy(model, base_url=server.url, **{"timeout": 0.1, "max_retries": 0, **kw})

        first = evaluate(ENV, policy(), env_kwargs=ENV_KWARGS, tasks=3, out=out, preflight=False)
        assert [r["outcome"] for r in first.records] == ["model_error"] * 3
        for changed, says in [(policy("m2"), '--model "m1" then, "m2" now'),
                              (policy(temperature=0.5), "--temperature none then, 0.5 now"),
                              (policy(native_tools=False), '--tool-mode "native" then, "text" now')]:
            with pytest.raises(EvalError, match=r"other settings \(policy\): " + says):
                evaluate(ENV, changed, env_kwargs=ENV_KWARGS, tasks=3, out=out, preflight=False)
        with pytest.raises(EvalError, match=r"other settings \(seed\): --seed 0 then, 4 now"):
            evaluate(ENV, policy(), env_kwargs=ENV_KWARGS, tasks=3, out=out, seed=4, preflight=False)
        with pytest.raises(EvalError, match=r'--env-arg \{"python_tool": false\} then, \{\} now'):
            evaluate(ENV, policy(), tasks=3, out=out, preflight=False)
        retried = evaluate(ENV, policy(timeout=30.0), env_kwargs=ENV_KWARGS, tasks=3, out=out, retry_failed=True,
                           preflight=False)
    assert [r["outcome"] for r in retried.records] == ["scored"] * 3
    assert [r["outcome"] for r in records_of(out)] == ["scored"] * 3
    assert json.loads((out / "summary.json").read_text())["outcomes"] == {"scored": 3}


# -- the endpoint ----------------------------------------------------------------------------------


def cut_short(conn: socket.socket) -> None:
    """A server that declares a whole reply, sends its first bytes and closes the connection."""
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return
            data += got
        conn.sendall(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"id": "x", "choi')


@pytest.fixture
def cutting_server():
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=cut_short, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    server.close()


@pytest.mark.parametrize("transport", ["lean", "sdk"])
def test_replies_cut_short_fail_every_sample_as_model_error_and_the_run_finishes(tmp_path, cutting_server, transport):
    policy = ChatPolicy("m", base_url=cutting_server, transport=transport, max_retries=1, timeout=30)
    result = evaluate(ENV, policy, env_kwargs=ENV_KWARGS, tasks=3, k=2, preflight=False, out=tmp_path / "run")
    assert {r["outcome"] for r in result.records} == {"model_error"} and len(result.records) == 6
    assert all(r["reward"] is None and r["error"].startswith("APIConnectionError") for r in result.records)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary == result.summary and summary["outcomes"] == {"model_error": 6}
    assert summary["failure_rate"]["value"] == 1.0


def test_retry_after_as_an_http_date_is_honoured_on_both_transports():
    sent = []

    def first_refused(body):
        """The first request of each run gets a date 1-2 s (whole seconds) after it arrived (made
        as it arrives: a date made before the run's setup could be past by then, on a loaded machine)."""
        if sent:
            return None
        sent.append(1)
        return {"status": 429, "headers": {"retry-after": formatdate(time.time() + 2, usegmt=True)}}

    with FakeChatServer(answer, fault_for=first_refused) as server:
        for transport in ("lean", "sdk"):
            sent.clear()
            server.arrivals[:] = []
            result = evaluate(ENV, ChatPolicy("test-model", base_url=server.url, transport=transport),
                              env_kwargs=ENV_KWARGS, tasks=1, preflight=False)
            assert result.records[0]["outcome"] == "scored" and len(server.arrivals) == 2
            assert server.arrivals[1] - server.arrivals[0] >= 0.9  # the date's wait, not the SDK's own ~0.5 s


def test_a_run_whose_endpoint_reports_no_usage_says_its_tokens_are_unknown_not_zero(tmp_path):
    bare = {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "\\boxed{0}"},
                                    "finish_reason": "stop"}]}
    with FakeChatServer(answer, fault_for=lambda body: {"body": bare}) as server:
        result = evaluate(ENV, ChatPolicy("test-model", base_url=server.url), env_kwargs=ENV_KWARGS, tasks=2,
                          preflight=False, out=tmp_path / "run")
    assert [r["outcome"] for r in result.records] == ["scored"] * 2
    assert all(r["prompt_tokens"] is None for r in result.records)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["usage"] == {"prompt_tokens": None, "completion_tokens": None}


@pytest.mark.parametrize("extra, says", [({"stream": True}, "stream is not supported"),
                                         ({"n": 4}, "n=4 is not supported")])
def test_streaming_and_n_completions_a_request_are_refused_when_the_policy_is_made(extra, says):
    """A streamed reply (server-sent events) failed every episode as malformed; ``n`` > 1 had the
    server make n completions a turn, all but the first thrown away."""
    with pytest.raises(ValueError, match=says):
        ChatPolicy("m", base_url="http://127.0.0.1:9/v1", extra_body=extra)
    ChatPolicy("m", base_url="http://127.0.0.1:9/v1", extra_body={"n": 1, "stream": False, "top_k": 5})
