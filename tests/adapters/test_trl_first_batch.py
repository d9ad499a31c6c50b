"""TRL on two processes when a reward function fails on one process in the trainer's first batch
(with ``environment_factory``: ``Env.reward`` has not yet seen the trainer), or returns what
TRL's own checks after it refuse (a wrong count, a value torch cannot convert): every process
stops with that process's error, none waits at TRL's gather of the rewards until the backend's
timeout. A real two-process GRPOTrainer on CPU (gloo, loopback only), one launch for every test
here: this file run as a script (``python test_trl_first_batch.py OUT_DIR``), each run through
``trl_two_processes._train``."""

import sys

import pytest
from launch import in_gloo_group, two_processes_raised

JUDGE = "the judge at 10.0.0.7 is unreachable"


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each process's runs raised (``failures<k>.json``, rewritten after each run); see
    :func:`launch.two_processes_raised`."""
    return two_processes_raised(__file__, tmp_path_factory.mktemp("trl-first-batch"))


def _errors(raised, run):
    """What each process's ``run`` raised, checked to be a ProcessFailed naming process 1 only."""
    assert all(run in r for r in raised), f"run {run!r} never ended on every process: a process hangs at a gather"
    zero, one = raised[0][run], raised[1][run]
    for error in (zero, one):
        assert error is not None and error["type"] == "ProcessFailed", error
        assert "process 1 raised " in error["message"] and "process 0 " not in error["message"]
    return zero, one


@pytest.mark.parametrize("run, error, function", [
    ("judge", f"ConnectionError: {JUDGE}", "judge"),
    ("grade", "ConnectionError: step: the task store at 10.0.0.7 is unreachable",
     "benchmaxtestBreaksOnOneProcessv0TRLEnvironment"),
], ids=["judge", "grade"])
def test_a_reward_function_raising_in_the_first_batch_stops_every_process(raised, run, error, function):
    """environment_factory, first batch: judge: a reward function of the user's, before Env.reward
    in reward_funcs (on process 1 Env.reward is never reached); grade: Env.reward itself, process
    1's env raising when it grades. Both processes raise an error naming process 1, its exception
    and the function; on process 1 the original exception is its cause."""
    zero, one = _errors(raised, run)
    for said in (zero, one):
        assert f"process 1 raised {error} (reward function {function!r})" in said["message"]
    assert one["cause"] == error.split(": ", 1)[1] and zero["cause"] is None


@pytest.mark.parametrize("run, error, function", [
    ("count", "ValueError: 2 rewards returned for 3 completions (one each)", "short"),
    ("value", "ValueError: rewards torch cannot convert to float32 (", "wordy"),
], ids=["count", "value"])
def test_rewards_trl_refuses_on_one_process_stop_every_process(raised, run, error, function):
    """What TRL checks once a reward function returns, refused on process 1 only: count (one
    reward short; environment_factory, first batch), value (words for rewards; TRLRollout). Both
    processes raise an error naming process 1, what was wrong and the function."""
    zero, one = _errors(raised, run)
    for said in (zero, one):
        assert f"process 1 raised {error}" in said["message"]
        assert f"(reward function {function!r})" in said["message"]
    assert one["cause"].startswith(error.split(": ", 1)[1]) and zero["cause"] is None


def _runs(out_dir: str, rank: int) -> None:
    from trl_two_processes import BREAKS, _register_breaks, _train

    from benchmax_gym.adapters.trl import TRLRollout, trl_environment
    from benchmax_gym.testing.tokenizers import model_ids, tiny_tokenizer

    _register_breaks()
    raised = {}

    def judge(completions, **kwargs):
        if rank == 1:
            raise ConnectionError(JUDGE)
        return [0.5] * len(completions)

    def short(completions, **kwargs):  # one reward short on process 1
        return [0.5] * (len(completions) - rank)

    def wordy(completions, **kwargs):
        return ["high" if rank == 1 else 0.5] * len(completions)

    def scripted(trainer, sessions):
        return [model_ids(s.chat, "<answer>4</answer>") for s in sessions], [None] * len(sessions)

    def train(name, **kwargs):
        _train(out_dir, rank, raised, name, **kwargs)

    Env = trl_environment("benchmax/Math-v0")
    train("judge", reward_funcs=[judge, Env.reward], train_dataset=Env.dataset(6), environment_factory=Env)
    Env = trl_environment(BREAKS, at="step")
    train("grade", reward_funcs=Env.reward, train_dataset=Env.dataset(6), environment_factory=Env)
    Env = trl_environment("benchmax/Math-v0")
    train("count", reward_funcs=[Env.reward, short], train_dataset=Env.dataset(6), environment_factory=Env)
    rollout = TRLRollout("benchmax/Math-v0", tiny_tokenizer("qwen"), generate=scripted, max_workers=2)
    train("value", reward_funcs=[rollout.reward, wordy], train_dataset=rollout.dataset(6), rollout_func=rollout)
    rollout.close()


if __name__ == "__main__":
    in_gloo_group(sys.argv[1], _runs)
