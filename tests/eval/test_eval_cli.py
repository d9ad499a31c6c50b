"""The eval command as a user meets it (issue #27 items 12, 17, 20): Ctrl-C, a base URL without
/v1, the API key from OPENAI_API_KEY, help with defaults, errors in flag words, resume's notice."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmax_gym.testing.openai_server import FakeChatServer

ENV = "benchmax/Math-v0"
CLI = [sys.executable, "-m", "benchmax_gym"]
KEY = "sk-test-0123456789abcdef"
BASE = ["--env-arg", "python_tool=false", "--quiet", "--no-plots"]


def answer(body):
    return {"content": "\\boxed{0}"}


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return {**env, **extra}


def eval_cli(*args, env=None, timeout=300):
    return subprocess.run([*CLI, "eval", ENV, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env())


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_says_how_far_it_got_and_how_to_resume(tmp_path, workers):
    out = tmp_path / "run"
    with FakeChatServer(answer, latency=0.3) as server:
        cmd = [*CLI, "eval", ENV, "--model", "test-model", "--base-url", server.url, "--tasks", "40",
               "--concurrency", "2", "--workers", workers, "--out", str(out), *BASE]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        rollouts = out / "rollouts.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not rollouts.exists() or len(rollouts.read_text().splitlines()) < 3):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
        records = [json.loads(line) for line in rollouts.read_text().splitlines()]
        cancelled = [r for r in records if r["outcome"] == "cancelled"]
        done = len(records) - len(cancelled)
        # the episodes waiting on the model when Ctrl-C came (in the workers too): recorded, never a score
        assert cancelled and all(r["reward"] is None and "interrupted" in r["error"] for r in cancelled)
        assert stderr.strip() == (f"interrupted: {done}/40 done ({len(cancelled)} in flight recorded as "
                                  "cancelled: resuming runs them again); rerun the same command to resume")
        again = subprocess.run([*cmd[:-2], "--no-plots"], capture_output=True, text=True, timeout=300,
                               env=clean_env())  # progress on: it says it resumes
    assert again.returncode == 0, again.stderr
    assert f"resuming: {done} of 40 done" in again.stderr
    final = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert len(final) == 40 and {(r["task_index"], r["sample"]) for r in final} == {(t, 0) for t in range(40)}
    assert all(r["outcome"] == "scored" for r in final)  # the cancelled pairs ran again


def test_a_base_url_without_v1_is_named_and_a_missing_key_is_not_called_refused(tmp_path):
    with FakeChatServer(answer, api_key=KEY) as server:
        bare = server.url[:-len("/v1")]
        out = eval_cli("--model", "test-model", "--base-url", bare, "--tasks", "2", "--out", str(tmp_path / "a"), *BASE,
                       env=clean_env(OPENAI_API_KEY=KEY))
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"add /v1 (--base-url {bare}/v1)" in out.stderr and "does not serve model" not in out.stderr
        out = eval_cli("--model", "test-model", "--base-url", server.url, "--tasks", "2", "--out", str(tmp_path / "b"),
                       *BASE)
        assert out.returncode == 2 and "none was given: set OPENAI_API_KEY" in out.stderr
        assert "refused" not in out.stderr
        # OPENAI_API_KEY is used as the SDK uses it, and its name (never the key) is recorded
        out = eval_cli("--model", "test-model", "--base-url", server.url, "--tasks", "2", "--out",
                       str(tmp_path / "c"), *BASE, env=clean_env(OPENAI_API_KEY=KEY))
        assert out.returncode == 0, out.stderr
    run = json.loads((tmp_path / "c" / "run.json").read_text())
    assert run["api_key_env"] == "OPENAI_API_KEY" and KEY not in json.dumps(run)


def test_help_shows_defaults_and_errors_speak_flags(tmp_path):
    text = subprocess.run([*CLI, "eval", "--help"], capture_output=True, text=True, timeout=120).stdout
    for default in ("(default: 1)", "(default: all)", "(default: 64)", "(default: 120)", "(default: 4)",
                    "(default: native)", "(default: OPENAI_API_KEY)"):
        assert default in " ".join(text.split()), default
    text = subprocess.run([*CLI, "compare", "--help"], capture_output=True, text=True, timeout=120).stdout
    assert "(default: 0)" in text
    out = eval_cli("--policy", "solver", "--out", str(tmp_path / "x"), *BASE)  # Math's default tasks: unbounded
    assert out.returncode == 2 and "--tasks N" in out.stderr and "tasks=N" not in out.stderr
    out = eval_cli("--policy", "solver", "--tasks", "some", "--out", str(tmp_path / "x"), *BASE)
    assert out.returncode == 2 and "--tasks must be all, N or i:j" in out.stderr
    out = eval_cli("--policy", "solver", "--tasks", "2", "-k", "0", "--out", str(tmp_path / "x"), *BASE)
    assert out.returncode == 2 and "-k must be a positive integer" in out.stderr


def test_a_killed_worker_is_one_line_saying_how_to_resume(tmp_path):
    """An eval worker killed mid-run (the OOM killer): the other worker finishes its episodes and
    the command ends with one line naming the worker's end and how to resume (a traceback before)."""
    import psutil

    out = tmp_path / "run"
    with FakeChatServer(answer, latency=0.05) as server:
        cmd = [*CLI, "eval", ENV, "--base-url", server.url, "--model", "test-model", "--tasks", "0:40",
               "--concurrency", "2", "--workers", "2", "--out", str(out), *BASE]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env(OPENAI_API_KEY=KEY))
        try:
            deadline = time.monotonic() + 120
            while len(server.requests) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            forkserver = [p for p in psutil.Process(proc.pid).children(recursive=True)
                          if "forkserver" in " ".join(p.cmdline())]
            workers = [w for f in forkserver for w in f.children()]
            assert len(workers) == 2, workers
            workers[0].kill()
            _, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "an eval worker failed: an eval worker exited (status -9)" in lines[0]
    assert lines[0].endswith(f"the episodes done are kept in {out}: rerun the same command to resume")


NO_MATPLOTLIB = ("import sys\n"
                 "class Missing:\n"
                 "    def find_spec(self, name, path=None, target=None):\n"
                 "        if name.split('.')[0] == 'matplotlib':\n"
                 "            raise ModuleNotFoundError(\"No module named 'matplotlib'\", name=name)\n"
                 "sys.meta_path.insert(0, Missing())\n"
                 "from benchmax_gym.cli import main\n"
                 "sys.exit(main(sys.argv[1:]))\n")


def test_without_the_plots_extra_eval_says_it_made_no_pngs_and_compare_is_one_line(tmp_path):
    """A base install has no matplotlib: eval wrote its run with no PNGs and said nothing (a user
    looked for plots the README promised), and `compare --plots-dir` was a traceback."""
    def cli(*args):
        return subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, *args], capture_output=True, text=True,
                              timeout=300, env=clean_env(), cwd=tmp_path)

    for name, policy in (("a", "solver"), ("b", "random")):
        out = cli("eval", ENV, "--policy", policy, "--tasks", "3", "--out", name, "--env-arg", "python_tool=false")
        assert out.returncode == 0, out.stderr[-2000:]
        assert not list((tmp_path / name).glob("*.png"))
        notes = json.loads((tmp_path / name / "summary.json").read_text())["notes"]
        assert any("pip install 'benchmax-gym[plots]'" in note for note in notes)
        assert "no PNGs" in out.stdout
    out = cli("compare", "a", "b", "--plots-dir", "p")
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and "pip install 'benchmax-gym[plots]'" in out.stderr
    assert not (tmp_path / "p").exists()
