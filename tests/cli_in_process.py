"""A ``benchmax-gym`` command run in this process, with what a subprocess would give back.

For tests of a command's exit status and messages only: each start of the console script costs
about 0.6 CPU-s (gymnasium, numpy, the CLI's imports) before it reads its arguments. Each
subcommand is still run as the real console script by other tests (test_cli_consistency_audit.py,
test_cli_interrupt.py), which is where a start-up or exit that only a process shows is covered.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

from benchmax_gym.cli import main


def run_in_process(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """``benchmax-gym ARGS``'s exit status, stdout and stderr from :func:`benchmax_gym.cli.main`: a usage
    error's ``SystemExit(2)`` and ``--help``'s ``SystemExit(0)`` are the status, as the interpreter makes
    them. An exception main lets out fails the test with its traceback (a subprocess would print it)."""
    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as exc:  # what the interpreter does with it at exit
                if exc.code is None or isinstance(exc.code, int):
                    status = exc.code or 0
                else:
                    print(exc.code, file=err)
                    status = 1
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["benchmax-gym", *args], status, out.getvalue(), err.getvalue())
