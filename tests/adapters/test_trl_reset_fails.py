"""TRL on two processes with ``environment_factory`` when process 1's env raises where TRL calls
it, not in a reward function: in its ``reset`` (TRL resets each env in
``_generate_and_score_completions``; process 0 goes on to generation and TRL's gathers) or in a
tool call (TRL catches the exception and shows it to the model as the tool's result). Every
process stops with process 1's error, raised at TRL's gather of the rewards; none waits at a
gather until the backend's timeout, none trains on. A real two-process GRPOTrainer on CPU (gloo,
loopback only), one launch for both tests: this file run as a script
(``python test_trl_reset_fails.py OUT_DIR``), each run through ``trl_two_processes._train``."""

import os
import sys

import pytest
from launch import in_gloo_group, two_processes_raised
from test_trl_first_batch import _errors

STORE = "the task store at 10.0.0.7 is unreachable"
CALCULATOR = "the calculator's backend at 10.0.0.7 is unreachable"
TOOL_DOWN = "benchmax-test/ToolDownOnOneProcess-v0"


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """What each process's runs raised (``failures<k>.json``, rewritten after each run); see
    :func:`launch.two_processes_raised`."""
    return two_processes_raised(__file__, tmp_path_factory.mktemp("trl-reset-fails"))


@pytest.mark.parametrize("run, error, where", [
    ("reset", f"ConnectionError: reset: {STORE}", "benchmaxtestBreaksOnOneProcessv0TRLEnvironment.reset"),
    ("tool", f"ConnectionError: {CALCULATOR}", "benchmaxtestToolDownOnOneProcessv0TRLEnvironment.calculator"),
], ids=["reset", "tool"])
def test_an_env_raising_on_one_process_stops_every_process(raised, run, error, where):
    """reset: process 1's env raises in every reset of the first batch (process 0 would wait at
    TRL's gather after generation); tool: process 1's env raises in the model's calculator call,
    then grades as usual (TRL would have shown the error to the model and trained on). Both
    processes raise an error naming process 1, its exception and where it was raised; on process 1
    the original exception is its cause."""
    zero, one = _errors(raised, run)
    for said in (zero, one):
        assert f"process 1 raised {error} ({where}" in said["message"]
    assert one["cause"] == error.split(": ", 1)[1] and zero["cause"] is None


def _register_tool_down() -> None:
    """:data:`TOOL_DOWN`: Math-v0 whose tool calls raise on process 1 (its calculator's backend
    unreachable from that host) once ``STORE_DOWN``; a reply without a call steps as usual."""
    import gymnasium as gym
    from trl_two_processes import STORE_DOWN

    import benchmax_gym  # noqa: F401

    class ToolDown(gym.Wrapper):
        def step(self, action):
            if os.environ["RANK"] == "1" and STORE_DOWN["down"] and action.get("tool_calls"):
                raise ConnectionError(CALCULATOR)
            return self.env.step(action)

    if TOOL_DOWN not in gym.registry:
        gym.register(TOOL_DOWN, entry_point=lambda **kwargs: ToolDown(gym.make("benchmax/Math-v0", **kwargs)),
                     disable_env_checker=True)


def _runs(out_dir: str, rank: int) -> None:
    from trl_two_processes import BREAKS, _register_breaks, _train

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    _register_breaks()
    _register_tool_down()
    tokenizer = tiny_tokenizer("qwen2.5")  # (the one _train gives the trainer)
    turns = []

    def calculator_then_answer(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """The model: a calculator call first in each run, then an answer."""
        text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
                if not turns else "\\boxed{4}")
        turns.append(text)
        return [tokenizer.encode(text) + [tokenizer.eos_token_id] for _ in prompt_ids], None

    def train(name, **kwargs):
        turns.clear()
        _train(out_dir, rank, raised, name, generation=calculator_then_answer, **kwargs)

    raised = {}
    Env = trl_environment(TOOL_DOWN)  # (first: on the previous code the reset run hangs)
    train("tool", reward_funcs=Env.reward, train_dataset=Env.dataset(6), environment_factory=Env)
    Env = trl_environment(BREAKS, at="reset")
    train("reset", reward_funcs=Env.reward, train_dataset=Env.dataset(6), environment_factory=Env)


if __name__ == "__main__":
    in_gloo_group(sys.argv[1], _runs)
