"""What a user scripting ``benchmax-gym`` relies on, the same in every command: a mistyped command,
choice or option names the close one; an env argument's error never repeats the arguments (a key
among them); an env that cannot start is one line and exit status 1, and so is a run that scored
or wrote nothing; each --help says what the command does, every option's default, and examples that run;
NO_COLOR means no colours, even on a terminal."""

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("benchmax-gym")  # the installed console script
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "benchmax_gym"]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import run_in_process  # noqa: E402  (a usage error's status and words; the script: below)

FAILING_MCP = """
import sys
import gymnasium as gym

gym.register("me/NoKey-v0", entry_point="benchmax_gym.envs.mcp.env:MCPEnv", kwargs=dict(
    server={"command": sys.executable, "args": ["-c", "import sys; sys.exit('API_KEY not set')"]},
    tasks=[{"prompt": "p"}], reward=lambda completion: 0.0))
"""


def cli(*args, cwd=None, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL)


def error_line(out, status):
    """The one line on stderr of a command that ended with ``status``, no traceback."""
    assert out.returncode == status, (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert lines and "error: " in lines[-1], lines
    return lines[-1]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    path = tmp_path_factory.mktemp("episodes") / "episodes.jsonl"
    done = cli("run", "benchmax/Math-v0", "--episodes", "2", "--jsonl", str(path), "--quiet")
    assert done.returncode == 0, done.stderr
    return path


# -- typos ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, usage, says", [
    (("lsit",), "", "did you mean list?"),
    (("tasks", "from-corpu", "docs"), " tasks", "did you mean from-corpus?"),
    (("run", "benchmax/Math-v0", "--policy", "solvr"), " run", "did you mean solver?"),
    (("run", "benchmax/Math-v0", "--epsiodes", "2"), " run", "--epsiodes: did you mean --episodes?"),
    (("run", "benchmax/Math-v0", "--polcy=random"), " run", "--polcy: did you mean --policy?"),
    (("eval", "benchmax/Math-v0", "--policy", "solver", "--out", "x", "--tsks", "2"), " eval",
     "--tsks: did you mean --tasks?"),
    (("tasks", "from-traces", "logs", "--env", "e", "--out", "o", "--kep", "all"), " tasks from-traces",
     "--kep: did you mean --keep?"),
    (("export-sft", "run", "--ovewrite"), " export-sft", "--ovewrite: did you mean --overwrite?"),
])
def test_a_mistyped_command_choice_or_option_names_the_close_one(args, usage, says, tmp_path):
    """argparse listed every choice and, for an option, said only "unrecognized arguments" under the
    top level's usage; now the close one is named, under the usage of the command it was given to."""
    out = run_in_process(*args, cwd=tmp_path)
    line = error_line(out, 2)
    assert says in line, line
    assert out.stderr.startswith(f"usage: benchmax-gym{usage} ["), out.stderr
    assert not any(tmp_path.iterdir())


# -- an env argument's error, an env that cannot start ------------------------------------------------


@pytest.mark.parametrize("command", [
    ("tasks", "from-traces", "{episodes}", "--env", "benchmax/Math-v0", "--out", "{tmp}/tasks.jsonl"),
    ("export-sft", "{episodes}", "--env", "benchmax/Math-v0", "--out", "{tmp}/sft.jsonl"),
    ("export-sft", "{episodes}", "--out", "{tmp}/sft.jsonl"),  # the run's env id
])
def test_the_data_commands_say_a_mistyped_env_argument_without_repeating_the_arguments(command, tmp_path, episodes):
    """As run and eval do: Gymnasium's suffix ("was raised from the environment creator for ID with
    kwargs {...}") repeated every argument, an API key among them, on the terminal and in CI logs."""
    args = [a.format(tmp=tmp_path, episodes=episodes) for a in command]
    out = run_in_process(*args, "--env-arg", "max_turn=3", "--env-arg", 'api_key="sk-secret"')
    line = error_line(out, 2)
    assert "cannot make benchmax/Math-v0: MathEnv got an unexpected keyword argument" in line, line
    assert "(did you mean 'max_turns'?)" in line
    assert "sk-secret" not in out.stderr and "was raised from" not in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, says", [
    (("tasks", "from-traces", "{episodes}", "--env", "me/NoKey-v0", "--out", "tasks.jsonl"),
     "cannot start me/NoKey-v0: "),
    (("export-sft", "{episodes}", "--env", "me/NoKey-v0", "--out", "sft.jsonl"),
     "cannot start me/NoKey-v0 for its tool schemas (--no-tools exports without them): "),
])
def test_an_env_that_cannot_start_is_one_line_exit_1_in_the_data_commands(command, says, tmp_path, episodes):
    """As run and mcp-serve say it (exit 1: it ran and failed); these printed the MCP client's traceback."""
    (tmp_path / "nokey.py").write_text(FAILING_MCP)
    if command[0] == "export-sft":  # a run that names no env (export-sft refuses --env naming another than the run's)
        unnamed = tmp_path / "unnamed" / "episodes.jsonl"
        unnamed.parent.mkdir()
        unnamed.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "env_id"}) + "\n"
                                   for line in episodes.read_text().splitlines()))
        episodes = unnamed
    args = [a.format(episodes=episodes) for a in command]
    out = cli("--import", "nokey", *args, cwd=tmp_path)
    line = error_line(out, 1)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert line.startswith("benchmax-gym: error: " + says) and "API_KEY not set" in line, line
    left = [p.name for p in tmp_path.iterdir() if p.suffix != ".py" and p.name not in ("__pycache__", "unnamed")]
    assert left == []


@pytest.mark.parametrize("json_flag", [False, True])
def test_an_eval_that_scored_no_episode_exits_1_with_its_summary(json_flag, tmp_path):
    """Every episode failed (its env cannot start): eval said so and exited 0, where run exits 1 for
    the same env and the data commands exit 1 when they produce nothing; `eval ... && compare` went on.
    The summary is still printed (--json: one JSON document, nothing else on stdout) and kept."""
    (tmp_path / "nokey.py").write_text(FAILING_MCP)
    flags = ["--json"] if json_flag else []
    out = cli("--import", "nokey", "eval", "me/NoKey-v0", "--policy", "solver", "--out", "run", "--quiet",
              "--no-plots", *flags, cwd=tmp_path)
    line = error_line(out, 1)
    # the server's own last words on the terminal, not only in the run directory (run shows them too)
    assert re.fullmatch(r"benchmax-gym: error: the one episode was not scored: env_error: the env's reset raised "
                        r"RuntimeError: MCP server .* API_KEY not set \(its error is in "
                        + re.escape(os.path.join('run', 'rollouts.jsonl')) + r"; --retry-failed runs it again\)",
                        line), line  # (it said "none of the 1 episodes was scored ... their errors")
    if json_flag:
        summary = json.loads(out.stdout)
        assert summary["scored_episodes"] == 0 and summary["outcomes"] == {"env_error": 1}
    else:
        assert "none scored" in out.stdout and "run directory: run" in out.stdout, out.stdout
    assert (tmp_path / "run" / "summary.json").is_file()
    baseline = cli("eval", "benchmax/Math-v0", "--policy", "empty", "--tasks", "2", "--out", "empty", "--quiet",
                   "--no-plots", "--json", cwd=tmp_path)  # scored, all 0: a result, exit 0
    assert baseline.returncode == 0 and json.loads(baseline.stdout)["scored_episodes"] == 2, baseline.stderr


@pytest.mark.parametrize("command, says", [
    (("export-sft", "{episodes}", "--out", "sft.jsonl", "--min-reward", "2"), "no episode to export of 2; "
     "--out sft.jsonl not written"),
    (("tasks", "from-traces", "{episodes}", "--env", "benchmax/Math-v0", "--out", "tasks.jsonl", "--keep", "reward>=2"),
     "no task kept of 2 traces; --out tasks.jsonl not written"),
    (("tasks", "from-corpus", "docs", "--out", "tasks.jsonl", "--quiet"), "no question kept; --out tasks.jsonl not "
     "written"),
])
def test_a_data_command_with_nothing_to_write_says_so_on_stderr(command, says, tmp_path, episodes):
    """Exit status 1 came with nothing on stderr (the summary on stdout, which --json turns into a
    document): a script's log showed a failed step without a word; now one line, as eval's."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Hello there.\n")  # no fact to ask about
    args = [a.format(episodes=episodes) for a in command]
    out = run_in_process(*args, "--json", cwd=tmp_path)
    assert error_line(out, 1) == f"benchmax-gym: error: {says}"
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert json.loads(out.stdout)["out"] is None
    assert not (tmp_path / args[args.index("--out") + 1]).exists()


# -- --help --------------------------------------------------------------------------------------------


def _commands(parser, words=()):
    import argparse

    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from _commands(command, (*words, name))


def test_every_command_help_says_what_it_does_and_each_options_default():
    """`benchmax-gym list --help` and `doctor --help` said nothing but usage; run's and mcp-serve's
    --seed left their default out."""
    import argparse

    from benchmax_gym.cli import build_parser

    for words, parser in _commands(build_parser()):
        assert words == () or parser.description, words
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, (words, action.option_strings or action.dest)
            default = action.default
            if action.option_strings and default not in (None, False, [], argparse.SUPPRESS):
                shown = f"{default:g}" if isinstance(default, float) else str(default)
                assert "default" in action.help or shown in action.help, (words, action.option_strings, action.help)
    listing = run_in_process("list", "--help").stdout
    assert "list the registered environments" in listing, listing


def _examples(text):
    section = text.partition("\nexamples:\n")[2]
    assert section, text
    return [shlex.split(line) for line in section.splitlines() if line.startswith("  benchmax-gym ")]


def test_the_examples_in_help_run_as_written(tmp_path):
    """Each example of `benchmax-gym --help`, copied and run in order in an empty folder (with the
    documents, the dataset file and, for the model, an OpenAI-compatible server where it names one):
    the runs one example writes are those the next reads. Servers (mcp-serve, openenv-serve) and
    SkyPilot (launch without --print-yaml) are left out: they do not end, or need a cloud. Each
    command's --help shows its own examples."""
    from benchmax_gym.testing.openai_server import FakeChatServer

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "tides.md").write_text(
        "# Tides\n\nTides are caused by the Moon's gravity. The Bay of Fundy has the highest tides, "
        "reaching 16 metres. Spring tides happen at new and full moon.\n")
    rows = [json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) for i in range(3)]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    examples = _examples(cli("--help").stdout)
    assert {e[1] for e in examples} >= {"list", "doctor", "run", "eval", "compare", "tasks", "export-sft", "new",
                                        "launch", "mcp-serve", "openenv-serve"}
    ran = 0
    with FakeChatServer(models=("Qwen/Qwen3-8B",)) as server:
        for example in examples:
            if example[1] in ("mcp-serve", "openenv-serve") or example[1] == "launch" and "--print-yaml" not in example:
                continue
            out = cli(*[server.url if a == "http://localhost:8000/v1" else a for a in example[1:]], cwd=tmp_path)
            assert out.returncode == 0, (example, out.stderr[-3000:])
            ran += 1
    assert ran >= 12
    assert (tmp_path / "traces.jsonl").is_file() and (tmp_path / "sft.jsonl").is_file()
    for command in ("run", "tasks", "tasks from-traces", "launch"):  # (argparse's text: in this process)
        shown = _examples(run_in_process(*command.split(), "--help").stdout)
        assert shown and all(e[1:1 + len(command.split())] == command.split() for e in shown), (command, shown)
        assert all(e in examples for e in shown)


# -- NO_COLOR --------------------------------------------------------------------------------------------


def test_no_color_keeps_a_servers_log_lines_plain_on_a_terminal():
    """uvicorn coloured its WARNING lines whenever stderr was a terminal, NO_COLOR or not."""
    import pty
    import socket

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on a terminal
        os.environ["NO_COLOR"] = "1"
        os.execv(CLI[0], [*CLI, "mcp-serve", "benchmax/Math-v0", "--transport", "http", "--port", "0"])
    said = b""

    def read_until(text):
        nonlocal said
        deadline = time.monotonic() + 120  # (stops a hung test; the wait is for the text)
        while text not in said:
            assert time.monotonic() < deadline, said
            if select.select([fd], [], [], 1)[0]:
                try:
                    said += os.read(fd, 4096)
                except OSError:  # the terminal closed: the command ended
                    assert text in said, said
                    return

    try:
        read_until(b"listening on")
        port = int(re.search(rb":(\d+)/mcp", said)[1])
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"NOT HTTP \x00\x01\r\n\r\n")
            read_until(b"Invalid HTTP request received.")
    finally:
        os.kill(pid, signal.SIGINT)
        _, status = os.waitpid(pid, 0)
        while select.select([fd], [], [], 0)[0]:  # what it said after Ctrl-C, for a failure's message
            try:
                said += os.read(fd, 4096)
            except OSError:  # (the terminal closed: all read)
                break
        os.close(fd)
    assert b"WARNING" in said and b"\x1b[" not in said, said
    assert os.waitstatus_to_exitcode(status) == 130, said[-3000:]
