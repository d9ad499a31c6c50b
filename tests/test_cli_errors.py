"""Mistakes a new user makes on the command line: each is one line on stderr naming what was wrong
and how to fix it (exit status 2), never a traceback; Ctrl-C and a closed pipe leave no traceback."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "benchmax_gym"]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import run_in_process  # noqa: E402  (errors said before any work: the status and the line)


def cli(*args, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def one_line_error(out, *says):
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith("benchmax-gym: error: "), lines[0]
    for text in says:
        assert text in lines[0], lines[0]
    return lines[0]


def wait_for(condition, what):
    """Poll ``condition`` (a state, not a duration: the deadline only stops a hung test)."""
    deadline = time.monotonic() + 240
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "solver"
    done = cli("eval", "benchmax/Math-v0", "--policy", "solver", "--tasks", "3", "--out", str(out), "--quiet",
               "--no-plots")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    path = tmp_path_factory.mktemp("episodes") / "episodes.jsonl"
    done = cli("run", "benchmax/Math-v0", "--episodes", "3", "--jsonl", str(path), "--quiet")
    assert done.returncode == 0, done.stderr
    return path


# -- an id typed without its namespace or version, or in another case, names the registered one ---


@pytest.mark.parametrize("args", [
    ("run", "Excel-v0"),  # gymnasium: "Environment `Excel` doesn't exist." and nothing more
    ("run", "excel"),
    ("run", "benchmax/Math-v1"),
    ("eval", "math-v0", "--policy", "solver", "--out", "{tmp}/run"),
    ("mcp-serve", "Math-v0"),
    ("tasks", "from-traces", "{episodes}", "--env", "Math-v0", "--out", "{tmp}/tasks.jsonl"),
    ("export-sft", "{episodes}", "--env", "Math-v0", "--out", "{tmp}/sft.jsonl"),  # was a traceback
])
def test_an_unknown_id_names_the_registered_one_it_is_close_to(args, tmp_path, episodes):
    args = [a.format(tmp=tmp_path, episodes=episodes) for a in args]
    line = one_line_error(run_in_process(*args), "did you mean benchmax/")
    assert ("Excel-v0?" if "xcel" in " ".join(args) else "benchmax/Math-v0?") in line
    assert not any(tmp_path.iterdir())


# -- output paths that cannot be written: named with their flag, before any work where possible ---


def test_output_folders_that_are_files_are_named_with_their_flag(tmp_path, eval_run):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    one_line_error(run_in_process("new", "acme-x", "--dir", str(a_file)), f"--dir {a_file}", "Not a directory")
    one_line_error(run_in_process("compare", str(eval_run), str(eval_run), "--plots-dir", str(a_file)),
                   f"--plots-dir {a_file}: not a folder")
    one_line_error(run_in_process("compare", str(eval_run), str(eval_run), "--plots-dir", str(a_file / "plots")),
                   f"--plots-dir {a_file / 'plots'}", "Not a directory")
    line = one_line_error(run_in_process("eval", "benchmax/Math-v0", "--policy", "solver", "--tasks", "2", "--out",
                              str(a_file / "run")), f"--out {a_file / 'run'}", "Not a directory")
    assert "cannot make benchmax/Math-v0" not in line  # (the env was fine)
    assert a_file.read_text() == "not a folder\n"


@pytest.fixture
def unprivileged():
    """``(command prefix, env, folder)`` to run the CLI as a user whom file permissions bind: root
    reads and writes regardless, so as root it runs as nobody (setpriv), in a folder it can enter."""
    import shutil
    import tempfile

    prefix = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        if not shutil.which("setpriv") or subprocess.run([*prefix, sys.executable, "-c", "pass"]).returncode:
            pytest.skip("cannot run as an unprivileged user here")
    folder = tempfile.mkdtemp(prefix="benchmax-cli-")
    os.chmod(folder, 0o777)
    env = {**os.environ, "HOME": folder, "MPLCONFIGDIR": os.path.join(folder, ".mpl")}
    yield prefix, env, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_unreadable_input_and_read_only_output_are_one_line(unprivileged, episodes, eval_run):
    import shutil
    from pathlib import Path

    prefix, env, folder = unprivileged
    folder = Path(folder)

    def run_as_user(*args):
        return subprocess.run([*prefix, *CLI, *args], capture_output=True, text=True, timeout=300, cwd=folder,
                              env=env, stdin=subprocess.DEVNULL)

    secret = folder / "secret.jsonl"
    secret.write_text(episodes.read_text())
    secret.chmod(0)
    readable = folder / "episodes.jsonl"
    shutil.copy(episodes, readable)
    run = folder / "run"
    shutil.copytree(eval_run, run)
    read_only = folder / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    for args in (("tasks", "from-corpus", str(secret), "--out", str(folder / "t.jsonl")),
                 ("tasks", "from-traces", str(secret), "--env", "benchmax/Math-v0", "--out", str(folder / "t.jsonl")),
                 ("export-sft", str(secret), "--out", str(folder / "s.jsonl"))):
        one_line_error(run_as_user(*args), f"{secret}: Permission denied")
    for args, says in (
            (("tasks", "from-traces", str(readable), "--env", "benchmax/Math-v0", "--out", str(read_only / "t.jsonl")),
             f"--out {read_only / 't.jsonl'}: cannot create a file in {read_only}"),
            (("export-sft", str(readable), "--out", str(read_only / "s.jsonl")),
             f"--out {read_only / 's.jsonl'}: cannot create a file in {read_only}"),
            (("new", "acme-x", "--dir", str(read_only)), f"--dir {read_only}: cannot create the package"),
            (("compare", str(run), str(run), "--plots-dir", str(read_only / "plots")),
             f"--plots-dir {read_only / 'plots'}: cannot write the plots there"),
            (("eval", "benchmax/Math-v0", "--policy", "solver", "--tasks", "2", "--out", str(read_only / "run")),
             f"--out {read_only / 'run'}: cannot make the run directory")):
        one_line_error(run_as_user(*args), says, "Permission denied" if "cannot create a file" not in says else "")
    assert not any(read_only.iterdir())


# -- flags that would be ignored are refused ---------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (("mcp-serve", "benchmax/Math-v0", "--port", "9000"), "--port: for --transport http"),  # it served stdio
    (("mcp-serve", "benchmax/Math-v0", "--auth-token", "t", "--host", "0.0.0.0"), "--host, --auth-token"),
    (("run", "benchmax/Math-v0", "--episodes", "1", "--append"), "--append applies to --jsonl"),
    (("run", "benchmax/Math-v0", "--episodes", "1", "--overwrite"), "--overwrite applies to --jsonl"),
    (("run", "benchmax/Math-v0", "--episodes", "1", "--jsonl", ""), "--jsonl needs a file name"),
    (("--import", "mymodule.py", "list"), "--import mymodule, run from the folder that holds mymodule.py"),
    (("--import", "./envs/mymodule.py", "list"), "--import mymodule,"),
])
def test_flags_that_would_do_nothing_or_mislead_are_refused(args, says):
    one_line_error(run_in_process(*args), says)


# -- Ctrl-C, a closed pipe, two evals into one run ---------------------------------------------------


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


def test_ctrl_c_in_run_is_one_line_and_keeps_the_episodes_written(tmp_path):
    path = tmp_path / "episodes.jsonl"
    proc = subprocess.Popen([*CLI, "run", "benchmax/Math-v0", "--episodes", "1000000", "--jsonl", str(path),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: len(_lines(path)) >= 3, "three episodes written")
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert [x for x in err.splitlines() if x.strip()] == [
        f"interrupted; the finished episodes are in {path} (--append adds to it)"]
    records = [json.loads(line) for line in _lines(path)]
    assert [r["seed"] for r in records] == list(range(len(records)))


@pytest.mark.parametrize("args", [("list",), ("run", "benchmax/Math-v0", "--episodes", "2", "--quiet")])
def test_a_reader_that_leaves_is_no_traceback(args):
    """``benchmax-gym list | head -1``: the pipe closes before the output is written."""
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert err == "" and proc.returncode == 141, (proc.returncode, err[-3000:])


def test_a_second_eval_into_a_run_being_written_is_refused(tmp_path):
    out = tmp_path / "run"
    args = ["eval", "benchmax/Math-v0", "--policy", "solver", "--tasks", "20000", "--concurrency", "2",
            "--out", str(out), "--quiet", "--no-plots"]
    first = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        wait_for(lambda: _lines(out / "rollouts.jsonl"), "the first eval recording episodes")
        one_line_error(cli(*args), f"--out {out}: another eval is writing this run")
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.communicate(timeout=120)
    assert first.returncode == 130
    records = [json.loads(line) for line in _lines(out / "rollouts.jsonl")]
    pairs = [(r["task_index"], r["sample"]) for r in records]
    assert len(pairs) == len(set(pairs))  # (two writers repeated episodes, and the run could not be read)


def test_an_eval_refused_before_it_starts_leaves_no_folder(tmp_path):
    out = tmp_path / "new" / "run"
    one_line_error(run_in_process("eval", "benchmax/Math-v0", "--policy", "solver", "--tasks", "abc", "--out",
                                  str(out)), "--tasks")
    assert not any(tmp_path.iterdir())


def test_new_prints_a_cd_command_that_a_shell_runs(tmp_path):
    where = tmp_path / "my envs"
    done = cli("new", "acme-x", "--dir", str(where))
    assert done.returncode == 0, done.stderr
    assert f"cd {shlex.quote(str(where / 'acme-x'))} && pip install" in done.stdout


@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_mistyped_env_argument_is_the_envs_own_line_without_gymnasiums_suffix(command, tmp_path):
    """Gymnasium re-raises a creator's TypeError with "was raised from the environment creator for
    ID with kwargs (...)" added, which repeated every argument (an API key among them) after the
    env's own message and suggestion."""
    extra = ["--policy", "solver", "--tasks", "1", "--out", str(tmp_path / "run")] if command == "eval" else []
    out = run_in_process(command, "benchmax/Math-v0", *extra, "--env-arg", "max_turn=3", "--env-arg",
                         'api_key="sk-secret"')
    line = one_line_error(out, "cannot make benchmax/Math-v0: MathEnv got an unexpected keyword argument",
                          "(did you mean 'max_turns'?)")
    assert "was raised from" not in line and "sk-secret" not in line


def test_quiet_silences_the_progress_bars_of_datasets_loading_a_file(tmp_path):
    rows = [json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) for i in range(3)]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    args = ["run", "benchmax/Math-GSM8K-v0", "--env-arg", f"task_args.dataset={tmp_path / 'train.jsonl'}"]
    loud = cli(*args, "--json")
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert "Generating train split" in loud.stderr  # (datasets draws it as it converts the file)
    (tmp_path / "train.jsonl").write_text("\n".join(rows[:2]) + "\n")  # (a new file: converted again)
    quiet = cli(*args, "--json", "--quiet")
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["episodes"] == 2, quiet.stderr[-2000:]
    assert "Generating train split" not in quiet.stderr
    assert quiet.stderr.strip() == "", quiet.stderr[-2000:]


def test_quiet_in_process_leaves_the_callers_progress_bar_settings_as_they_were(monkeypatch, capsys):
    """--quiet turns datasets' bars off for its command only: main() called in-process (a notebook,
    a test) gave every later subprocess and load of that process no bars (the CI's own run of the
    test above failed so)."""
    import datasets

    from benchmax_gym.cli import main

    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    datasets.enable_progress_bars()
    assert main(["run", "benchmax/Math-v0", "--episodes", "1", "--quiet", "--json"]) == 0
    assert "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ and datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        assert main(["run", "benchmax/Math-v0", "--episodes", "1", "--quiet", "--json"]) == 0
        assert not datasets.is_progress_bar_enabled()  # (off before: off after)
    finally:
        datasets.enable_progress_bars()


# -- an id a user's module registers, and a bad task met at run time -------------------------------


@pytest.mark.parametrize("args, command", [
    (("run", "unimported/Geo-v0", "--episodes", "1"), "run"),
    (("eval", "unimported/Geo-v0", "--policy", "random", "--out", "{tmp}/run"), "eval"),
    (("mcp-serve", "unimported/Geo-v0"), "mcp-serve"),
    (("openenv-serve", "unimported/Geo-v0", "--port", "0"), "openenv-serve"),
    (("tasks", "from-traces", "{episodes}", "--env", "unimported/Geo-v0", "--out", "{tmp}/t.jsonl"),
     "tasks from-traces"),
    (("export-sft", "{episodes}", "--env", "unimported/Geo-v0", "--out", "{tmp}/sft.jsonl"), "export-sft"),
])
def test_an_id_not_found_says_how_to_import_the_module_that_registers_it(args, command, tmp_path, episodes):
    """Gymnasium's "Namespace me not found. Have you installed the proper package for me?" was all:
    an id of the user's own module is found only with the global --import, before the command.
    (A namespace no test registers: Gymnasium words an id of a known namespace otherwise.)"""
    args = [a.format(tmp=tmp_path, episodes=episodes) for a in args]
    line = one_line_error(run_in_process(*args), "Namespace unimported not found", "`benchmax-gym list`")
    assert line.endswith(f"needs it imported first: benchmax-gym --import MODULE {command} ..."), line
    assert not any(tmp_path.iterdir())


def test_an_id_found_through_import_still_runs(tmp_path):
    (tmp_path / "geo_hint_module.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('me/GeoHint-v0', entry_point='benchmax_gym.envs.math.env:MathEnv')\n")
    done = run_in_process("--import", "geo_hint_module", "run", "me/GeoHint-v0", "--episodes", "1", "--quiet",
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "episodes      1 (sampled; 1 distinct task)\n" in done.stdout, done.stdout  # (not "1 distinct tasks")


LAZY_BAD_TASKS = """
import gymnasium as gym
from benchmax_gym.core.tasks import Task, TaskSource


class Lazy(TaskSource):  # each task made when played: Excel-v0 checks it at reset, not at make
    def __len__(self):
        return 2

    def get(self, index):
        return Task(id=f"t{index}", prompt="fix the sheet", answer={"workbook": b"x", "position": "A1"})


gym.register("me/LazyBadExcel-v0", entry_point=lambda **kw: gym.make("benchmax/Excel-v0", tasks=Lazy(), **kw))
"""


def test_a_bad_task_of_a_lazy_source_is_one_line_exit_1_in_run(tmp_path):
    """A ValueError at reset (Excel-v0's check of a task made when played) was a traceback: run caught
    only RuntimeError and OSError there. It is an env error at run time, exit 1, as eval records it
    as the episode's env_error."""
    (tmp_path / "lazy_bad_tasks.py").write_text(LAZY_BAD_TASKS)
    done = run_in_process("--import", "lazy_bad_tasks", "run", "me/LazyBadExcel-v0", "--episodes", "1", "--quiet",
                          cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("benchmax-gym: error: me/LazyBadExcel-v0: the env's reset raised "
                                                   "ValueError: task "), lines
    assert "needs files={'workbook.xlsx'" in lines[0]
