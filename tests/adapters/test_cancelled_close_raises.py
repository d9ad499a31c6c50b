"""A rollout cancelled while its env's reset runs in a thread: the env is closed when that reset
returns, by the thread. A close that raises there has no caller left to tell (the rollout is
gone): it must be logged as a leak, not dropped with the thread's result."""

import logging
import threading

import gymnasium as gym
import pytest
from test_adapter_edge_cases import _cancel_while, _players


@pytest.mark.parametrize("adapter", ["verl", "openrlhf"])
def test_a_close_that_raises_after_a_cancelled_reset_is_logged_as_a_leak(qwen_tokenizer, monkeypatch, caplog,
                                                                          adapter):
    play = _players(qwen_tokenizer)[adapter]
    resetting, release, events = threading.Event(), threading.Event(), []
    make = gym.make

    def made(*args, **kwargs):
        env = make(*args, **kwargs)
        base = env.unwrapped
        reset, close = base.reset, base.close

        def gated_reset(*a, **k):
            resetting.set()
            release.wait(60)
            return reset(*a, **k)

        def failing_close():
            events.append("close")
            close()
            raise OSError("the env's server would not stop")

        base.reset, base.close = gated_reset, failing_close
        return env

    monkeypatch.setattr(gym, "make", made)
    with caplog.at_level(logging.WARNING, logger="benchmax_gym.adapters.tokens"):
        _cancel_while(resetting, release, play)
    assert events == ["close"]
    leaks = [r.getMessage() for r in caplog.records if r.name == "benchmax_gym.adapters.tokens"]
    assert len(leaks) == 1 and "OSError: the env's server would not stop" in leaks[0], leaks
