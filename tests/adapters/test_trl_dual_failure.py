"""TRL on two processes with ``environment_factory`` and a group rubric, when both fail in the
same batch: process 0's env raises in the model's calculator call (its failure kept, to be raised
at TRL's gather of the rewards), and process 1's env raises when ``Env.reward`` grades it, at the
group gather process 0 makes in place of grading. The error every process raises there names
both failures, each with its own message. A real two-process GRPOTrainer on CPU (gloo, loopback
only): this file run as a script (``python test_trl_dual_failure.py OUT_DIR``) through
``trl_two_processes._train``."""

import os
import sys

import pytest
from launch import in_gloo_group, two_processes_raised
from test_trl_reset_fails import CALCULATOR

GRADER = "the grader's store at 10.0.0.8 is unreachable"
BOTH_DOWN = "benchmax-test/DownOnBothProcesses-v0"
WHERE = "benchmaxtestDownOnBothProcessesv0TRLEnvironment"


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each process's run raised; see :func:`launch.two_processes_raised`."""
    return two_processes_raised(__file__, tmp_path_factory.mktemp("trl-dual-failure"))


def test_an_env_failure_and_another_processs_grading_failure_are_both_named(raised):
    """Groups of 2, 3 samples a process (group b split): process 1's Env.reward raises where
    process 0 makes the group gather in place of grading. Both processes stop with one error naming
    process 0's kept env failure (where it was raised) and process 1's grading error; each
    process's own exception is its cause."""
    assert all("dual" in r for r in raised), "a process never ended the run: it hangs at a gather"
    zero, one = raised[0]["dual"], raised[1]["dual"]
    for said in (zero, one):
        assert said is not None and said["type"] == "ProcessFailed", said
        assert f"process 0 raised ConnectionError: {CALCULATOR} ({WHERE}.calculator" in said["message"], said
        assert f"process 1 raised ConnectionError: {GRADER}" in said["message"], said
    assert zero["cause"] == CALCULATOR and one["cause"] == GRADER


def _register_both_down() -> None:
    """:data:`BOTH_DOWN`: Math-v0 whose tool calls raise on process 0 and whose replies without a
    call (the answer Env.reward grades) raise on process 1, once ``STORE_DOWN``."""
    import gymnasium as gym
    from trl_two_processes import STORE_DOWN

    import benchmax_gym  # noqa: F401

    class BothDown(gym.Wrapper):
        def step(self, action):
            calls = bool(action.get("tool_calls"))
            if STORE_DOWN["down"] and calls == (os.environ["RANK"] == "0"):
                raise ConnectionError(CALCULATOR if calls else GRADER)
            return self.env.step(action)

    if BOTH_DOWN not in gym.registry:
        gym.register(BOTH_DOWN, entry_point=lambda **kwargs: BothDown(gym.make("benchmax/Math-v0", **kwargs)),
                     disable_env_checker=True)


def _runs(out_dir: str, rank: int) -> None:
    from trl_two_processes import _train

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.core.group import GroupRubric
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    _register_both_down()
    tokenizer = tiny_tokenizer("qwen2.5")  # (the one _train gives the trainer)
    turns = []

    def calculator_then_answer(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """The model: a calculator call first, then an answer."""
        text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
                if not turns else "\\boxed{4}")
        turns.append(text)
        return [tokenizer.encode(text) + [tokenizer.eos_token_id] for _ in prompt_ids], None

    rubric = GroupRubric([("size", lambda rewards: [float(len(rewards))] * len(rewards))], combine="replace")
    Env = trl_environment(BOTH_DOWN, group_rubric=rubric)
    _train(out_dir, rank, {}, "dual", generation=calculator_then_answer, reward_funcs=Env.reward,
           train_dataset=Env.dataset(6), environment_factory=Env)


if __name__ == "__main__":
    in_gloo_group(sys.argv[1], _runs)
