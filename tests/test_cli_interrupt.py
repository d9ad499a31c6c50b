"""Ctrl-C early in a command (the command line read, ``--import``, its imports, gym.make) is the
same one line and exit status 130 as Ctrl-C while episodes run, never a KeyboardInterrupt traceback.

The moment is not a delay after start (on a loaded machine that lands anywhere, and a SIGINT before
the interpreter has installed its handler kills any Python program with -2): the child reports each
import as it ends (``PYTHONPROFILEIMPORTTIME``) and the test interrupts it right after a chosen one,
or the child interrupts itself from an ``--import`` module."""

import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(sys.executable), "benchmax-gym")  # the installed console script
ENV = "benchmax/Math-v0"
COMMANDS = {  # each runs until interrupted
    "run": ["run", ENV, "--episodes", "1000000", "--quiet"],
    "eval": ["eval", ENV, "--policy", "solver", "--tasks", "0:1000000", "--env-arg", "python_tool=false",
             "--quiet", "--no-plots"],
}


def interrupted(tmp_path, args, after_import=None):
    """Start the console script with ``args``, SIGINT its process group (as Ctrl-C in a terminal)
    right after the module ``after_import`` is imported (else it interrupts itself), and return
    its exit status and its stderr without the import report."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    if after_import:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    proc = subprocess.Popen([sys.executable, SCRIPT, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True)
    said = []
    try:
        if after_import:
            for line in proc.stderr:
                said.append(line)
                if line.startswith("import time:") and line.rpartition("|")[2].strip() == after_import:
                    os.killpg(proc.pid, signal.SIGINT)
                    break
            else:
                pytest.fail(f"{after_import} was never imported: {''.join(said)[-3000:]}")
        said.append(proc.communicate(timeout=120)[1])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(said)
    return proc.returncode, [x for x in err.splitlines() if x.strip() and not x.startswith("import time:")]


@pytest.mark.skipif(not os.path.isfile(SCRIPT), reason="benchmax-gym is not installed beside this python")
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("moment", [
    "benchmax_gym.data.commands",  # the command line being read (main builds its parser)
    "benchmax_gym.envs.math.rubric",  # the environment being made
    "--import",  # a module of the user's, imported first
])
def test_ctrl_c_while_a_command_starts_is_one_line_and_status_130(tmp_path, command, moment):
    args = [*COMMANDS[command], *(["--out", str(tmp_path / "run")] if command == "eval" else [])]
    if moment == "--import":
        (tmp_path / "ctrl_c_now.py").write_text("import os, signal\nos.killpg(os.getpgrp(), signal.SIGINT)\n")
        code, said = interrupted(tmp_path, ["--import", "ctrl_c_now", *args])
    else:
        code, said = interrupted(tmp_path, args, after_import=moment)
    assert code == 130 and not any("Traceback" in x or "Error" in x for x in said), (code, said[-40:])
    assert len(said) == 1 and said[0].startswith("interrupted"), said[-40:]
