"""verl: an env that fails (its build, reset or step raising) fails its own trajectory, never the
batch. verl gathers a batch's trajectories without ``return_exceptions``: one that raised failed
the whole batch while the others played on. Played as verl's worker plays a batch (one gather),
then through verl's own ``_agent_loop_postprocess`` and ``_postprocess``."""

import asyncio
import math
from types import SimpleNamespace

import gymnasium as gym
import pytest
from test_verl import _agent_loop
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.workers.rollout.replica import TokenOutput

from benchmax_gym.adapters import ChatTemplate
from benchmax_gym.adapters.verl import task_rows
from benchmax_gym.registry import register_tool_env

TOOL_ENV = "benchmax-test/VerlAdd-v0"
ENV_ID = "benchmax-test/VerlBrokenAdd-v0"
BROKEN_TASKS: set[int] = set()  # tasks whose per-episode setup fails (a database copy, a disk full)
RESPONSE_LENGTH = 64


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def setup(task, episode):
    if int(task.id) in BROKEN_TASKS:
        raise OSError(f"copying task {task.id}'s database failed: No space left on device")


class StepFails(gym.Wrapper):
    """A backend lost mid-episode in a way the engine does not catch (a third-party env)."""

    def step(self, action):
        raise ConnectionResetError("the env's sandbox host reset the connection")


class CloseFails(gym.Wrapper):
    """An env whose teardown fails (a server that will not stop) after its episode was graded."""

    def close(self):
        super().close()
        raise OSError("the env's server would not stop")


def _make(broken=None, **kwargs):
    if broken == "make":
        raise ConnectionRefusedError("the env's server refused the connection")
    env = gym.make(TOOL_ENV, **kwargs)
    return {"step": StepFails, "close": CloseFails}.get(broken, lambda e: e)(env)


if TOOL_ENV not in gym.registry:
    register_tool_env(TOOL_ENV, tools=[add], rubric=exact, setup=setup,
                      tasks=[{"prompt": f"{i}+{i}?", "answer": str(2 * i)} for i in range(3)])
    gym.register(ENV_ID, entry_point=_make, disable_env_checker=True)


class AnswerServer:
    """verl's server manager: each trajectory answers its task (read from its prompt) at once."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        question = self.tokenizer.decode(prompt_ids).rsplit("?", 1)[0].rsplit("\n", 1)[-1]
        i = int(question.split("+")[0])
        ids = self.tokenizer.encode(str(2 * i), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def _verl_batch(tokenizer, rows):
    """The rows played as verl's AgentLoopWorker plays a batch (``asyncio.gather``, no
    ``return_exceptions``; ``raw_prompt`` the row's messages, as its dataset gives them), then
    post-processed by verl's own code."""
    loop = _agent_loop(tokenizer, AnswerServer(tokenizer), response_length=RESPONSE_LENGTH)

    async def main():
        outputs = await asyncio.gather(*(loop.run({"logprobs": True}, raw_prompt=r["prompt"], **r) for r in rows))
        worker = AgentLoopWorker.__new__(AgentLoopWorker)  # the attributes its post-processing reads
        worker.tokenizer, worker.processor, worker.mm_processor_kwargs = tokenizer, None, {}
        worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
        worker.rollout_config = SimpleNamespace(prompt_length=4096, response_length=RESPONSE_LENGTH)
        internal = [await worker._agent_loop_postprocess(o, False, raw_prompt=r["prompt"]) for o, r in zip(outputs, rows)]
        return outputs, worker._postprocess(internal)

    return asyncio.run(main())


@pytest.fixture
def rows():
    rows = task_rows(ENV_ID, 3)  # (made while every task's setup works)
    yield rows
    BROKEN_TASKS.clear()


@pytest.mark.parametrize("broken", ["make", "reset", "step"])
def test_an_env_that_raises_fails_its_trajectory_as_env_error_and_the_batch_completes(qwen_tokenizer, rows,
                                                                                      broken):
    """Task 1's env fails (building it, its reset's setup, its step); tasks 0 and 2 score. Its
    trajectory is env_error: no reward (NaN), no token in the loss, logprobs to stack (zeros
    where no reply came), and the error's text in ``outcome_detail``; verl batches all three."""
    if broken == "reset":
        BROKEN_TASKS.add(1)
    else:
        rows[1] = {**rows[1], "extra_info": {**rows[1]["extra_info"], "env_kwargs": {"broken": broken}}}
    outputs, batch = _verl_batch(qwen_tokenizer, rows)

    assert [o.reward_score for o in outputs[::2]] == [1.0, 1.0]
    failed = outputs[1]
    assert math.isnan(failed.reward_score) and not any(failed.response_mask)
    said = {"make": "ConnectionRefusedError: the env's server refused the connection",
            "reset": "OSError: copying task 1's database failed: No space left on device",
            "step": "ConnectionResetError: the env's sandbox host reset the connection"}[broken]
    assert said in failed.extra_fields["outcome_detail"] and ENV_ID in failed.extra_fields["outcome_detail"]
    assert [o.extra_fields["outcome_detail"] for o in outputs[::2]] == ["", ""]

    tensors, info = batch.batch, batch.non_tensor_batch
    assert tensors["responses"].shape == (3, RESPONSE_LENGTH) and tensors["rollout_log_probs"].shape == (3, RESPONSE_LENGTH)
    assert info["env/outcome/env_error"].tolist() == [0.0, 1.0, 0.0]
    assert info["env/outcome/scored"].tolist() == [1.0, 0.0, 1.0]
    assert [math.isnan(r) for r in info["reward"]] == [False, True, False]
    assert tensors["response_mask"][1].sum() == 0 and tensors["response_mask"][0].sum() > 0
    # (a step that raised: the reply was generated, and is masked out)
    assert (tensors["rollout_log_probs"][1] == 0).all() == (broken != "step")
    assert (len(failed.response_ids) > 0) == (broken == "step")
    scores = tensors["rm_scores"].sum(-1)
    assert scores[0] == scores[2] == 1.0 and math.isnan(scores[1])
    # a real prompt (the row's messages, through the template) where the env gave none: every
    # row of verl's batch attends to some token
    prompt = ChatTemplate(qwen_tokenizer).prompt_ids(rows[1]["prompt"])
    assert failed.prompt_ids == prompt
    assert (tensors["attention_mask"].sum(-1) > 0).all()


def test_an_env_whose_close_raises_keeps_its_graded_trajectory_and_the_batch(qwen_tokenizer, rows, caplog):
    """(The close in the rollout's finally raised out of the gather: the whole batch failed.)"""
    rows[1] = {**rows[1], "extra_info": {**rows[1]["extra_info"], "env_kwargs": {"broken": "close"}}}
    outputs, batch = _verl_batch(qwen_tokenizer, rows)
    assert [o.reward_score for o in outputs] == [1.0, 1.0, 1.0]
    assert batch.non_tensor_batch["env/outcome/scored"].tolist() == [1.0, 1.0, 1.0]
    assert "OSError: the env's server would not stop" in caplog.text


@pytest.mark.parametrize("wrong, said", [({"env_id": "benchmax-test/VerlNoSuch-v0"}, "VerlNoSuch"),
                                         ({"env_kwargs": {"max_turnz": 2}}, "TypeError")])
def test_a_row_naming_a_wrong_env_or_argument_fails_its_trajectory_not_the_batch(qwen_tokenizer, rows, wrong, said):
    """One row's unknown env id or bad argument (it raised out of verl's gather: every other
    row's trajectory was lost with the batch) is that trajectory's env_error, naming it, as in
    the OpenRLHF and SkyRL adapters; the other rows score."""
    rows[1] = {**rows[1], "extra_info": {**rows[1]["extra_info"], **wrong}}
    outputs, batch = _verl_batch(qwen_tokenizer, rows)
    assert [o.reward_score for o in outputs[::2]] == [1.0, 1.0]
    failed = outputs[1]
    assert math.isnan(failed.reward_score) and not any(failed.response_mask)
    assert said in failed.extra_fields["outcome_detail"] and "building the env" in failed.extra_fields["outcome_detail"]
    assert batch.non_tensor_batch["env/outcome/env_error"].tolist() == [0.0, 1.0, 0.0]


def test_a_row_naming_no_env_at_all_still_fails_the_batch(qwen_tokenizer, rows):
    """No env id anywhere (not in the row, not in the loop's config) is the dataset's format."""
    rows[1] = {**rows[1], "extra_info": {k: v for k, v in rows[1]["extra_info"].items() if k != "env_id"}}
    with pytest.raises(ValueError, match="env_id is missing"):
        _verl_batch(qwen_tokenizer, rows)


def test_a_failed_reset_whose_row_prompt_is_over_prompt_length_keeps_verls_width(qwen_tokenizer, rows):
    """The row's messages are too long for ``rollout.prompt_length`` (a good reset would say so):
    the failed trajectory's prompt is one token, so verl's padding keeps its batch's width."""
    BROKEN_TASKS.add(0)
    loop = _agent_loop(qwen_tokenizer, AnswerServer(qwen_tokenizer), response_length=RESPONSE_LENGTH, prompt_length=8)
    out = asyncio.run(loop.run({}, raw_prompt=rows[0]["prompt"], **rows[0]))
    assert len(ChatTemplate(qwen_tokenizer).prompt_ids(rows[0]["prompt"])) > 8
    assert len(out.prompt_ids) == 1 and out.response_ids == [] and math.isnan(out.reward_score)
    assert out.extra_fields["reward_extra_info"]["env/outcome/env_error"] == 1.0
