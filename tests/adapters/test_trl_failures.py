"""TRL on several processes when one process raises where the others wait at a gather (an env's
reset or step, a reward function, a value that cannot be pickled for a gather): every process
stops with that process's error, none waits forever at the gather the failing process never
reached. A real two-process GRPOTrainer on CPU (gloo, loopback only), one launch for every test
here: ``trl_two_processes.py OUT_DIR failures``."""

from pathlib import Path

import pytest
from launch import two_processes_raised


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each of the two processes' runs raised (``failures<k>.json``, written after each run:
    a run that hangs leaves the earlier ones'); see :func:`launch.two_processes_raised`."""
    out = tmp_path_factory.mktemp("trl-failures")
    return two_processes_raised(Path(__file__).with_name("trl_two_processes.py"), out, "failures", port=True)


def _both(raised, run):
    """What each process's ``run`` raised; a run a process never ended hung."""
    assert all(run in r for r in raised), f"run {run!r} never ended on every process: a process hangs at a gather"
    return raised[0][run], raised[1][run]


@pytest.mark.parametrize("run, call", [("reset", "reset"), ("step", "step"), ("reward", "step")])
def test_every_process_raises_the_failing_processs_error(raised, run, call):
    """reset: process 0 is on to the first round's gather (the trainer's generation, in lock-step);
    step: to the group gather (a generate of its own); reward: Env.reward's group gather. Each
    process raises an error naming process 1 and its own message; on process 1 the original
    exception is its cause."""
    zero, one = _both(raised, run)
    message = f"{call}: the task store at 10.0.0.7 is unreachable"
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed"
        assert "process 1 " in error["message"] and f"ConnectionError: {message}" in error["message"]
        assert "process 0 " not in error["message"]
    assert one["cause"] == message and zero["cause"] is None


@pytest.mark.parametrize("run", ["judge", "env_judge"])
def test_a_reward_function_raising_on_one_process_stops_every_process(raised, run):
    """The user's own reward function (passed with the env's: TRLRollout's, Env.reward) raises on
    process 1 only, where process 0 is on to TRL's gather of the rewards. Both raise an error
    naming process 1, its exception and the function; on process 1 the original exception is its
    cause. With environment_factory it raises at the second step (Env.reward sees the trainer at
    the first): the first step trains as before, on both."""
    zero, one = _both(raised, run)
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed"
        assert "process 1 raised ConnectionError: the judge at 10.0.0.7 is unreachable (reward function 'judge')" \
            in error["message"]
        assert "process 0 " not in error["message"]
    assert one["cause"] == "the judge at 10.0.0.7 is unreachable" and zero["cause"] is None
    if run == "env_judge":
        for rank in range(2):
            assert [c["step"] for c in raised[rank]["judge_calls"] if c["environments"]] == [0, 1]


def test_a_record_that_cannot_be_pickled_stops_every_process_naming_it(raised):
    """Process 1's record of group b (split over the processes: scored on process 0) holds a lock:
    process 1 cannot send it to the group gather process 0 waits at. Both raise an error naming
    process 1 and where the value it could not send is; on process 1 the pickling error is its
    cause."""
    zero, one = _both(raised, "unsendable")
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed"
        assert "process 1 raised TypeError: could not send the payload['samples'][0].record['trace'] (lock)" \
            in error["message"]
        assert "cannot pickle '_thread.lock' object" in error["message"]
        assert "process 0 " not in error["message"]
    assert "cannot pickle '_thread.lock' object" in one["cause"] and zero["cause"] is None
