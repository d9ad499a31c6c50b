"""The benchmax-gym command, run as a user runs it."""

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.testing import play

CLI = [sys.executable, "-m", "benchmax_gym.cli"]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import run_in_process  # noqa: E402  (error and --help tests: the command's status and words)


def run(*args, check=True):
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_list_shows_ids_and_descriptions():
    out = run_in_process("list").stdout
    assert "benchmax/Math-v0" in out and "calculator" in out


def test_doctor_reports_the_sandbox_level():
    from benchmax_gym.core.sandbox import resolve_level

    out = run_in_process("doctor").stdout
    line = next(x for x in out.splitlines() if x.startswith("sandbox"))
    assert resolve_level("auto") in line
    assert "gymnasium" in out and "benchmax/Math-v0" in out


def test_doctor_says_where_libreoffice_is_or_how_to_install_it(monkeypatch):
    """Excel-v0's recalc="libreoffice" needs LibreOffice: doctor names its version and path (.ci/run
    installs it), or, where it is missing, the package and the recalc that does without."""
    from benchmax_gym.envs.excel import recalc

    line = next(x for x in run_in_process("doctor").stdout.splitlines() if x.startswith("libreoffice"))
    if recalc.soffice_executable():
        assert re.search(r"LibreOffice \d+\.\d+\S* at ", line) and f"at {recalc.soffice_executable()} " in line, line
    monkeypatch.setattr(recalc, "soffice_executable", lambda: None)
    line = next(x for x in run_in_process("doctor").stdout.splitlines() if x.startswith("libreoffice"))
    assert "not found" in line and "apt-get install libreoffice-calc-nogui" in line and "recalc='auto'" in line


def test_run_solver_prints_a_summary_table():
    out = run("run", "benchmax/Math-v0", "--policy", "solver", "--episodes", "20").stdout
    assert "mean reward   1.000" in out and "success rate  100.0%" in out
    assert "errors        0" in out and "wall time" in out


def test_run_random_writes_jsonl(tmp_path):
    path = tmp_path / "episodes.jsonl"
    out = run("run", "benchmax/Math-v0", "--policy", "random", "--episodes", "6", "--seed", "3",
              "--jsonl", str(path), "--json", "--quiet").stdout
    summary = json.loads(out)
    assert summary["episodes"] == 6 and summary["policy"] == "random"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seed"] for r in lines] == [3, 4, 5, 6, 7, 8]
    for record in lines:
        assert record["messages"][0]["role"] == "system"
        assert record["messages"][2]["role"] == "assistant"
        assert "reward" in record and "reward_components" in record


def test_same_seed_same_episodes(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        run("run", "benchmax/Math-v0", "--policy", "random", "--episodes", "4", "--jsonl", str(path), "--quiet")
    strip = lambda p: [json.loads(x)["messages"] for x in p.read_text().splitlines()]  # noqa: E731
    assert strip(a) == strip(b)


def test_run_mcp_example_out_of_the_box():
    summary = json.loads(run("run", "benchmax/MCP-v0", "--policy", "solver", "--episodes", "3", "--json", "--quiet").stdout)
    assert summary["mean_reward"] == 1.0 and summary["errors"] == 0


def test_env_args_reach_gym_make(shared_data):
    out = run("run", "benchmax/Math-v0", "--episodes", "5", "--json", "--quiet",
              "--env-arg", "tasks=gsm8k", "--env-arg", f"task_args.dataset={shared_data / 'gsm8k' / 'train_sample500.jsonl'}").stdout
    assert json.loads(out)["mean_reward"] == 1.0


@pytest.mark.parametrize(
    "args, says",
    [
        (("run", "benchmax/Nope-v0"), "benchmax-gym list"),
        (("run", "benchmax/Math-v0", "--env-arg", "max_turns=0"), "max_turns"),
        (("run", "benchmax/Math-v0", "--episodes", "0"), "--episodes"),
        (("run", "benchmax/Math-v0", "--env-arg", "task_args.=3"), "KEY.FIELD=VALUE"),
        (("run", "benchmax/Math-v0", "--env-arg", "task_args=3", "--env-arg", "task_args.limit=2"),
         "task_args is already set to a value that is not a dict"),
        # a repeated key kept only the last, silently
        (("run", "benchmax/Math-v0", "--env-arg", "max_turns=2", "--env-arg", "max_turns=3"),
         "--env-arg 'max_turns=3': max_turns is already set by --env-arg 'max_turns=2'; give each argument once"),
        (("run", "benchmax/Math-v0", "--env-arg", "task_args.num_tasks=3", "--env-arg", "task_args={}"),
         "task_args is already set by --env-arg 'task_args.num_tasks=3'"),
        # a field a whole dict already set: the field's value won, silently
        (("run", "benchmax/Math-v0", "--env-arg", 'task_args={"num_tasks": 5}', "--env-arg", "task_args.num_tasks=3"),
         "task_args.num_tasks is already set by --env-arg 'task_args={\"num_tasks\": 5}'"),
        (("run", "benchmax/Math-v0", "--env-arg", "task_args.num_task=3"),
         "unknown task_args key 'num_task' (did you mean 'num_tasks'?)"),
    ],
)
def test_bad_input_is_a_clear_error(args, says):
    out = run_in_process(*args)
    assert out.returncode != 0 and says in out.stderr
    assert "Traceback" not in out.stderr


def test_a_field_adds_to_a_whole_dict_that_lacks_it():
    """``task_args='{...}'`` then ``task_args.FIELD=...``: one dict with both (only a field
    given twice is refused, above)."""
    from benchmax_gym.cli import _parse_env_args

    assert _parse_env_args(['task_args={"dataset": "x.jsonl"}', "task_args.limit=3", "a.b.c=1", "a.b.d=2"]) == {
        "task_args": {"dataset": "x.jsonl", "limit": 3}, "a": {"b": {"c": 1, "d": 2}}}


def test_python_dash_m_benchmax_gym_is_the_command():
    out = subprocess.run([sys.executable, "-m", "benchmax_gym", "list"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "benchmax/Math-v0" in out.stdout


# -- which episodes run: each task once, k rollouts per task, or sampled ------------------------


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_finite_task_list_runs_each_task_exactly_once_by_default(shared_data, tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    out = run("run", "benchmax/Math-v0", "--env-arg", "tasks=gsm8k", "--json", "--quiet", "--jsonl", str(path),
              "--env-arg", f"task_args.dataset={shared_data / 'gsm8k' / 'train_sample500.jsonl'}").stdout
    summary = json.loads(out)
    assert summary["episodes"] == summary["tasks"] == 500 and summary["mode"] == "each task once"
    ids = [r["task_id"] for r in _records(path)]
    assert len(set(ids)) == 500 and ids == [f"gsm8k-{i}" for i in range(500)]
    assert summary["mean_reward"] == 1.0


def test_rollouts_per_task_run_each_task_k_times(tmp_path):
    path = tmp_path / "k.jsonl"
    out = run("run", "benchmax/Math-v0", "--policy", "random", "--env-arg", "task_args.num_tasks=4", "-k", "3",
              "--json", "--quiet", "--jsonl", str(path)).stdout
    summary = json.loads(out)
    assert summary["episodes"] == 12 and summary["tasks"] == 4 and summary["mode"] == "each task 3 times"
    assert "pass_at_k" in summary
    records = _records(path)
    assert Counter(r["task_id"] for r in records) == {r["task_id"]: 3 for r in records}
    assert [r["seed"] for r in records] == list(range(12))
    assert len({json.dumps(r["messages"]) for r in records}) > 4  # rollouts of a task differ


def test_an_unbounded_task_list_takes_first_tasks_with_k():
    summary = json.loads(run("run", "benchmax/Math-v0", "-k", "2", "--first-tasks", "5", "--json", "--quiet").stdout)
    assert summary["episodes"] == 10 and summary["tasks"] == 5 and summary["pass_at_k"] == 1.0
    # the README's first command: 20 sampled episodes of the unbounded generated tasks
    summary = json.loads(run("run", "benchmax/Math-v0", "--policy", "solver", "--episodes", "20", "--json").stdout)
    assert summary["episodes"] == 20 and summary["mode"] == "sampled" and summary["mean_reward"] == 1.0


# -- every error code counts in the summary ------------------------------------------------------


def test_summary_counts_every_step_error_per_code():
    summary = json.loads(run("run", "benchmax/Math-v0", "--policy", "random", "--episodes", "12", "--seed", "3",
                             "--json", "--quiet").stdout)
    env = gym.make("benchmax/Math-v0")  # the same episodes, counted here
    env.action_space.seed(3)
    counts: Counter = Counter()
    for i in range(12):
        for info in play(env, lambda obs, info: env.action_space.sample(), seed=3 + i).infos[1:]:
            counts.update(info["errors"])
    env.close()
    assert counts["parse_error"] > 0
    assert summary["errors_by_code"] == dict(counts) and summary["errors"] == sum(counts.values())


# -- --jsonl never appends by surprise; bad paths and arguments are one clear line ---------------


def _one_line_error(out, *says):
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for text in says:
        assert text in lines[0], lines[0]


def test_jsonl_refuses_an_existing_file_unless_append_or_overwrite(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text("keep me\n")
    base = ("run", "benchmax/Math-v0", "--episodes", "2", "--quiet", "--jsonl", str(path))
    _one_line_error(run_in_process(*base), "exists", "--append", "--overwrite")
    assert path.read_text() == "keep me\n"
    assert run_in_process(*base, "--append").returncode == 0
    lines = path.read_text().splitlines()
    assert lines[0] == "keep me" and len(lines) == 3
    assert run_in_process(*base, "--overwrite").returncode == 0
    assert [r["seed"] for r in _records(path)] == [0, 1]
    _one_line_error(run_in_process(*base, "--append", "--overwrite"), "--append", "--overwrite")


def test_jsonl_that_is_a_file_the_env_reads_is_refused(tmp_path, monkeypatch):
    """(--jsonl over the env's own dataset, --overwrite: the tasks were replaced by the episodes.)"""
    dataset = tmp_path / "train.jsonl"
    dataset.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    (tmp_path / "link.jsonl").symlink_to(dataset)
    monkeypatch.chdir(tmp_path)
    out = run_in_process("run", "benchmax/Math-v0", "--env-arg", "tasks=gsm8k", "--env-arg",
                         "task_args.dataset=./train.jsonl", "--jsonl", "link.jsonl", "--overwrite", "--quiet")
    _one_line_error(out, "--jsonl link.jsonl is the file of --env-arg task_args.dataset=./train.jsonl")
    assert dataset.read_text() == '{"question": "1+1?", "answer": "#### 2"}\n'


@pytest.mark.parametrize("where", ["missing/dir/e.jsonl", "."])
def test_jsonl_bad_path_is_one_line_exit_2(tmp_path, where):
    path = tmp_path / where
    _one_line_error(run_in_process("run", "benchmax/Math-v0", "--episodes", "1", "--jsonl", str(path)), "--jsonl")
    assert not (tmp_path / "missing").exists()


def test_misspelt_env_arg_suggests_the_argument():
    _one_line_error(run_in_process("run", "benchmax/Math-v0", "--env-arg", "task=gsm8k"), "did you mean 'tasks'")
    with pytest.raises(TypeError, match="did you mean 'max_turns'"):
        gym.make("benchmax/CRM-v0", max_turn=3)
    with pytest.raises(TypeError, match=r"did you mean task_args=\{'difficulty': ...\}"):
        gym.make("benchmax/Excel-v0", dificulty={"rows": 5})
    with pytest.raises(ValueError, match="unknown task_args key 'dificulty' \\(did you mean 'difficulty'\\?\\); "
                                         "tasks='generated' takes num_tasks, task_seed, difficulty"):
        gym.make("benchmax/Excel-v0", task_args={"dificulty": {"rows": 5}})
    with pytest.raises(TypeError, match="unexpected keyword argument 'zzz' was"):
        gym.make("benchmax/Wikipedia-v0", zzz=1)
    # a knob of a source's own config, one level down (a new user's digits=3 got no suggestion)
    with pytest.raises(TypeError, match=r"'digits' \(did you mean task_args=\{'difficulty': \{'digits': ...\}\}\?\)"):
        gym.make("benchmax/Math-v0", digits=3)
    with pytest.raises(TypeError, match=r"'min_hop' \(did you mean task_args=\{'difficulty': \{'min_hops': ...\}\}"):
        gym.make("benchmax/Wikipedia-v0", min_hop=2)


@pytest.mark.parametrize(
    "args, says",
    [
        (("-k", "2", "--episodes", "4"), "--episodes"),
        (("-k", "2"), "--first-tasks"),
        (("-k", "0", "--first-tasks", "3"), "-k"),
    ],
)
def test_episode_selection_errors_are_one_line(args, says):
    _one_line_error(run_in_process("run", "benchmax/Math-v0", *args), says)


# -- a hub dataset while offline or unreachable: one line, at once -------------------------------


def test_hub_dataset_while_offline_fails_fast_in_one_line():
    start = time.perf_counter()
    out = run("run", "benchmax/Math-v0", "--env-arg", "tasks=gsm8k", check=False)  # conftest: HF_HUB_OFFLINE=1
    _one_line_error(out, "openai/gsm8k", "offline")
    assert time.perf_counter() - start < 60


def test_hub_dataset_with_an_unreachable_endpoint_fails_fast_in_one_line(tmp_path, refused_port):
    port = refused_port
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"))
    script = (  # counts the TCP connects to the hub's port: datasets alone retries them for ~25 s
        "import socket, gymnasium as gym, benchmax_gym, datasets\n"
        "tries, connect = [], socket.socket.connect\n"
        "socket.socket.connect = lambda self, address: tries.append(address) or connect(self, address)\n"
        "try:\n"
        "    gym.make('benchmax/Math-v0', tasks='gsm8k')\n"
        "except ConnectionError as exc:\n"
        f"    print(sum(isinstance(a, tuple) and a[1] == {port} for a in tries), exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.stdout, out.stderr[-2000:]
    tries, message = out.stdout.split(" ", 1)
    assert "unreachable" in message and f"127.0.0.1:{port}" in message and "\n" not in message.strip()
    assert tries == "1"  # one refused connect, then the error: no retries
    cli = subprocess.run([*CLI, "run", "benchmax/Math-v0", "--env-arg", "tasks=gsm8k"], capture_output=True,
                         text=True, timeout=300, env=env)
    _one_line_error(cli, "unreachable")


def test_mcp_serve_bad_env_arg_is_one_line_exit_2():
    done = subprocess.run([sys.executable, "-m", "benchmax_gym", "mcp-serve", "benchmax/Math-v0", "--env-arg", "task=x"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "did you mean 'tasks'" in done.stderr


GEO = """
import benchmax_gym

def lookup(city: str) -> str:
    \"\"\"Look up a city's country.

    Args:
        city: the city's English name
    \"\"\"
    return {"Lima": "Peru"}.get(city, "unknown")

def correct(completion: str, answer: str) -> float:
    return float(completion.strip() == "<answer>" + answer + "</answer>")

class Solver:
    def __init__(self, env):
        self.env = env

    def __call__(self, obs, info):
        return "<answer>" + self.env.episode.task.answer + "</answer>"

for name, extra in (("me/Geo-v0", {}), ("me/GeoSolved-v0", {"solver": Solver})):
    benchmax_gym.register_tool_env(name, tools=[lookup], rubric=[correct], max_turns=3,
                                   tasks=[{"prompt": "Which country is Lima in?", "answer": "Peru"}], **extra)
"""


def test_run_of_an_env_without_a_solver_says_use_random_in_one_line(tmp_path):
    (tmp_path / "geo.py").write_text(GEO)
    out = subprocess.run([*CLI, "--import", "geo", "run", "me/Geo-v0", "--episodes", "1", "--quiet"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        "benchmax-gym: error: no reference solver for me/Geo-v0: use --policy random (or pass solver= to "
        "register_tool_env)"]
    random = subprocess.run([*CLI, "--import", "geo", "run", "me/Geo-v0", "--policy", "random", "--episodes", "1",
                             "--json", "--quiet"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert random.returncode == 0, random.stderr


def test_run_plays_the_solver_given_to_register_tool_env(tmp_path):
    (tmp_path / "geo.py").write_text(GEO)
    out = subprocess.run([*CLI, "--import", "geo", "run", "me/GeoSolved-v0", "--json", "--quiet"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["success_rate"] == 1.0


def test_openenv_id_without_the_extra_names_the_install_in_one_line():
    """The extra is simulated missing: ``sys.modules["openenv"] = None`` makes its import fail."""
    code = ("import sys; sys.modules['openenv'] = None; from benchmax_gym.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    for extra in ([], ["--env-arg", "base_url=http://127.0.0.1:9"]):
        out = subprocess.run([sys.executable, "-c", code, "run", "benchmax/OpenEnv-v0", "--episodes", "1", *extra],
                             capture_output=True, text=True, timeout=120)
        _one_line_error(out, "pip install 'benchmax-gym[openenv]'")


@pytest.mark.parametrize("args, says", [
    (("launch", "--nodes", "0"), "--nodes must be at least 1, got 0"),
    (("launch", "--nodes", "0", "--print-yaml"), "--nodes must be at least 1"),
    (("launch", "--env-host-slots", "0", "--print-yaml"), "--env-host-slots must be at least 1"),
    (("launch", "--port", "70000", "--print-yaml"), "--port must be a port number"),
    (("launch", "--sky-python", "/nonexistent"), "--sky-python /nonexistent: no such executable"),
    (("launch", "--sky-python", "/nonexistent", "--down"), "--sky-python /nonexistent: no such executable"),
    (("mcp-serve", "benchmax/Mth-v0"), "did you mean benchmax/Math-v0?"),
    (("mcp-serve", "benchmax/Math-v0", "--transport", "http", "--max-sessions", "0"),
     "--max-sessions must be at least 1"),
])
def test_launch_and_mcp_serve_errors_are_standard_usage_errors(args, says):
    out = run_in_process(*args)
    _one_line_error(out, "benchmax-gym: error: ", says)


def _extras_in_setup_cfg():
    import configparser
    from pathlib import Path

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    return config.options("options.extras_require")


def test_doctor_lists_every_extra_of_setup_cfg_and_whether_it_is_installed():
    lines = run_in_process("doctor").stdout.splitlines()
    for extra in _extras_in_setup_cfg():
        line = next((x for x in lines if x.split()[:2] == ["extra", extra]), None)
        assert line is not None, (extra, lines)
        assert "installed (" in line or "missing" in line or "venv of its own" in line


def test_doctor_names_what_an_extra_misses_and_the_pip_command(monkeypatch):
    from importlib import metadata

    from benchmax_gym import cli

    real = metadata.version

    def version(name):
        if name == "openai":
            raise metadata.PackageNotFoundError(name)
        return "0.0.1" if name == "ray" else real(name)

    monkeypatch.setattr(metadata, "version", version)
    rows = dict(cli.extras_rows())
    assert rows["extra eval"] == "missing openai (1 of 2 there): pip install 'benchmax-gym[eval]'"  # httptools is
    assert rows["extra ray"].startswith("missing ray 0.0.1 (wants ==") and "benchmax-gym[ray]" in rows["extra ray"]


def test_doctor_says_the_gpu_only_extras_need_a_gpu_machine_and_gives_the_readmes_cpu_install(monkeypatch):
    """``pip install 'benchmax-gym[openrlhf]'`` (and ``[verl]``) was the hint, which fails on CPU building
    flash-attn, deepspeed, vLLM: README.md's CPU table installs their smoke tests otherwise."""
    from importlib import metadata

    from benchmax_gym import cli

    real = metadata.version

    def version(name):
        if name in ("openrlhf", "verl", "openai"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    status = cli.extras_status()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for extra, script in (("openrlhf", "openrlhf_smoke.py"), ("verl", "verl_smoke.py")):
        line = status[extra]["cpu_install"]
        assert status[extra]["state"] == (f"missing {extra}: pip install 'benchmax-gym[{extra}]' on a GPU machine (it "
                                          f"does not install on CPU); for {script} on CPU: {line} (README.md, Train "
                                          "with a trainer)")
        assert f"| {extra.replace('openrlhf', 'OpenRLHF')} (`{script}`) | `{line}` |" in readme  # the table's row
        assert not status[extra]["installed"]
    assert status["eval"]["cpu_install"] is None
    assert status["eval"]["state"].endswith(": pip install 'benchmax-gym[eval]'")


@pytest.mark.parametrize("command", ["", "list", "doctor", "run", "eval", "compare", "mcp-serve", "launch",
                                     "openenv-serve", "new", "tasks", "tasks from-corpus", "tasks from-traces",
                                     "export-sft"])
def test_help_has_no_restructuredtext_markup(command):
    import re

    out = run_in_process(*command.split(), "--help").stdout
    assert "usage:" in out
    assert not re.search(r"``|:[a-z]+:`", out), out


# -- errors a user meets: one line, exit 2 for a bad argument and 1 for an env that cannot start -------

FAILING_MCP = """
import sys
import gymnasium as gym

gym.register("me/NoKey-v0", entry_point="benchmax_gym.envs.mcp.env:MCPEnv", kwargs=dict(
    server={"command": sys.executable, "args": ["-c", "import sys; sys.exit('API_KEY not set')"]},
    tasks=[{"prompt": "p"}], reward=lambda completion: 0.0))
"""


@pytest.mark.parametrize("command", [("run", "--quiet"), ("mcp-serve",), ("mcp-serve", "--transport", "http",
                                                                            "--port", "0")])
def test_an_mcp_server_that_fails_to_start_is_one_line_exit_1(tmp_path, command):
    (tmp_path / "nokey.py").write_text(FAILING_MCP)
    out = subprocess.run([*CLI, "--import", "nokey", command[0], "me/NoKey-v0", *command[1:]], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("benchmax-gym: error: "), out.stderr
    assert "me/NoKey-v0" in lines[0] and "failed to start" in lines[0] and "API_KEY not set" in lines[0]


@pytest.mark.parametrize("command", ["run", "mcp-serve"])
def test_a_missing_env_arg_file_is_one_line_exit_2(tmp_path, command):
    missing = tmp_path / "missing.jsonl"
    out = run_in_process(command, "benchmax/Math-v0", "--env-arg", "tasks=gsm8k", "--env-arg",
                         f"task_args.dataset={missing}")
    _one_line_error(out, "cannot make benchmax/Math-v0", str(missing))


@pytest.mark.parametrize("args, says", [
    (("run", "benchmax/Math-v0", "--seed", "-1", "--episodes", "1"), "--seed must be 0 or more, got -1"),
    (("mcp-serve", "benchmax/Math-v0", "--seed", "-1"), "--seed must be 0 or more, got -1"),
    (("eval", "benchmax/Math-v0", "--policy", "solver", "--seed", "-1"), "--seed must be 0 or more, got -1"),
    (("eval", "benchmax/Math-v0", "--policy", "solver", "--timeout", "0"), "--timeout must be a positive number"),
    (("eval", "benchmax/Math-v0", "--policy", "solver", "--max-retries", "-1"), "--max-retries must be 0 or more"),
    (("eval", "benchmax/Math-v0", "--policy", "solver", "--max-tokens", "0"), "--max-tokens must be at least 1"),
    (("run", "benchmax/Math-v0", "--env-arg", "oops"), "--env-arg expects KEY=VALUE"),
])
def test_bad_numbers_are_one_line_exit_2(tmp_path, args, says):
    extra = ("--out", str(tmp_path / "run")) if args[0] == "eval" else ()
    out = run_in_process(*args, *extra)
    _one_line_error(out, "benchmax-gym: error: ", says)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["mcp-serve", "openenv-serve"])
@pytest.mark.parametrize("port", ["-1", "70000", "abc"])
def test_a_bad_port_is_refused_at_argument_parsing(command, port):
    """Port 0 (any free one) is served by the tests of both servers; 70000 used to wrap round to 4464."""
    extra = ("--transport", "http") if command == "mcp-serve" else ()
    out = run_in_process(command, "benchmax/Math-v0", *extra, f"--port={port}")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "listening" not in out.stderr, out.stderr
    assert "error: argument --port: " in out.stderr.splitlines()[-1], out.stderr


def test_an_eval_that_scored_nothing_shows_its_commonest_error_on_one_bounded_line():
    from benchmax_gym.cli import _commonest_error

    long = "the env's reset raised RuntimeError: " + "x" * 2000 + "\nits stderr ended with:\nFATAL: missing API_KEY"
    said = _commonest_error([{"outcome": "env_error", "error": long}] * 3
                            + [{"outcome": "model_error", "error": "HTTP 500"}])
    assert said.startswith(": env_error: the env's reset raised RuntimeError: xxx") and "\n" not in said
    assert said.endswith("FATAL: missing API_KEY (in 3 of 4 episodes)") and len(said) < 360, said
    assert _commonest_error([{"outcome": "model_error", "error": "HTTP 500"}]) == ": model_error: HTTP 500"
