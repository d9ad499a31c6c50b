"""TRL on two processes with ``environment_factory`` and an env whose rubric has a group leaf
(``Env.reward`` gathers each group's members from every process), when process 1's env raises
where TRL calls it (a tool call's step, or its reset): its error is raised on every process, as
without a group rubric; no process waits at ``Env.reward``'s group gather for one that went on
to TRL's gather of the rewards. A real two-process GRPOTrainer on CPU (gloo, loopback only, its
collectives timing out after 30 s), one launch for both tests: this file run as a script
(``python test_trl_group_failure.py OUT_DIR``), each run through ``trl_two_processes._train``."""

import sys

import pytest
from launch import two_processes_raised
from test_trl_first_batch import _errors
from test_trl_reset_fails import CALCULATOR, STORE

ENVIRONMENTS = "GRPOTrainer's environments"


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each process's runs raised (``failures<k>.json``, rewritten after each run); see
    :func:`launch.two_processes_raised`."""
    return two_processes_raised(__file__, tmp_path_factory.mktemp("trl-group-failure"))


@pytest.mark.parametrize("run, error, where", [
    ("tool", f"ConnectionError: {CALCULATOR}", "benchmaxtestToolDownOnOneProcessv0TRLEnvironment.calculator"),
    ("reset", f"ConnectionError: reset: {STORE}", "benchmaxtestBreaksOnOneProcessv0TRLEnvironment.reset"),
], ids=["tool-beside-a-function-of-yours", "reset"])
def test_an_env_raising_on_one_process_stops_every_process_with_a_group_rubric(raised, run, error, where):
    """tool: process 1's env raises in the model's calculator call, the user's function listed
    after Env.reward; reset: process 1's env raises in every reset of the first batch, Env.reward
    alone. Groups of 2, 3 samples a process: group b is split over the two processes, so process
    0's Env.reward gathers from process 1. Both processes stop with the error that names the
    environments, process 1, its exception and where it was raised; on process 1 that exception
    is its cause."""
    zero, one = _errors(raised, run)
    for said in (zero, one):
        assert said["message"].startswith(f"{ENVIRONMENTS}: process 1 raised {error} ({where}"), said["message"]
    assert one["cause"] == error.split(": ", 1)[1] and zero["cause"] is None


def _runs(out_dir: str, rank: int) -> None:
    from test_trl_reset_fails import TOOL_DOWN, _register_tool_down
    from trl_two_processes import BREAKS, _register_breaks, _train

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.core.group import GroupRubric
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    _register_breaks()
    _register_tool_down()
    tokenizer = tiny_tokenizer("qwen2.5")  # (the one _train gives the trainer)
    rubric = GroupRubric([("size", lambda rewards: [float(len(rewards))] * len(rewards))], combine="replace")
    turns, raised = [], {}

    def calculator_then_answer(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """The model: a calculator call first in each run, then an answer."""
        text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
                if not turns else "\\boxed{4}")
        turns.append(text)
        return [tokenizer.encode(text) + [tokenizer.eos_token_id] for _ in prompt_ids], None

    def one(completions, **kwargs):  # the user's own reward function
        return [1.0] * len(completions)

    def train(name, **kwargs):
        turns.clear()
        _train(out_dir, rank, raised, name, generation=calculator_then_answer, **kwargs)

    Env = trl_environment(TOOL_DOWN, group_rubric=rubric)
    train("tool", reward_funcs=[Env.reward, one], train_dataset=Env.dataset(6), environment_factory=Env)
    Env = trl_environment(BREAKS, group_rubric=rubric, at="reset")
    train("reset", reward_funcs=Env.reward, train_dataset=Env.dataset(6), environment_factory=Env)


if __name__ == "__main__":
    import datetime
    import os

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/store", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))  # a hang: an error on the one left waiting
    _runs(sys.argv[1], rank)
    dist.destroy_process_group()
