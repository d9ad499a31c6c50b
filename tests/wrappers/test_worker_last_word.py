"""A vector worker whose last word (the error that stopped it) cannot reach its parent.

The worker swallowed the failed send and exited 0: its own error was nowhere, and the parent said
only "the worker process exited (code 0)". Now the gist goes to the worker's stderr, it exits
LAST_WORD_LOST, and the parent's error says what that status means.
"""

import os
import socket
import sys

import gymnasium as gym
import pytest

from benchmax_gym import UnicodeText
LAST_WORD_LOST = 75  # (benchmax_gym.core.aio.LAST_WORD_LOST: a status a supervisor may act on)
from benchmax_gym.wrappers import SubprocVectorEnv


class Muted(gym.Env):
    """Its action ``mute`` ends its worker's side of the connection to the parent, as a send that
    fails does (the worker's connection, found in the worker loop's frame): every message the
    worker writes after it fails (EPIPE), its results and then its crash report."""

    observation_space = UnicodeText(1000)
    action_space = UnicodeText(1000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        if action == "mute":
            frame = sys._getframe()
            while frame.f_code.co_name != "_worker_main":
                frame = frame.f_back
            with socket.socket(fileno=os.dup(frame.f_locals["conn"].fileno())) as sock:
                sock.shutdown(socket.SHUT_WR)
        return f"echo {action}", 1.0, False, False, {}


@pytest.mark.timeout(120)
def test_a_worker_whose_crash_report_cannot_be_sent_says_it_on_stderr_and_the_parent_says_why(capfd):
    envs = SubprocVectorEnv([Muted] * 2, num_workers=2)
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, truncated, info = envs.step(["a", "mute"])
        assert truncated.tolist() == [False, True] and envs.faults == 1
        error = info["error"][1]
        assert f"exited (code {LAST_WORD_LOST})" in error, error
        assert "its last message could not be delivered; see its stderr" in error
        obs, *_ = envs.step(["b", "c"])  # (a fresh worker holds its envs)
        assert obs[0] == "echo b"
    finally:
        envs.close()
    lines = [line for line in capfd.readouterr().err.splitlines() if "could not be delivered" in line]
    assert len(lines) == 1, lines  # one line, with the worker's own error in it
    assert "crashed" in lines[0] and "BrokenPipeError" in lines[0], lines[0]
