"""verl and OpenRLHF adapters at their edges: a rollout the trainer cancels while its env is built
or reset, a trajectory with no reply in a batch that asks for logprobs (through verl's own batch
post-processing), and configuration refused when the trainer builds the adapter."""

import asyncio
import threading
from types import SimpleNamespace

import gymnasium as gym
import pytest
from test_verl import SolverServer, _agent_loop
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from benchmax_gym.adapters import openrlhf, verl
from benchmax_gym.testing.tokenizers import ScriptedEngine

ROW_KWARGS = {"python_tool": False}


def _players(tokenizer):
    """One rollout per adapter, as its trainer starts it: verl's agent loop ``run``, OpenRLHF's
    executor ``execute`` (each built, as its trainer builds it, before the test gates anything)."""
    verl_row = verl.task_rows("benchmax/Math-v0", 1, **ROW_KWARGS)[0]
    verl_loop = _agent_loop(tokenizer, SolverServer(tokenizer, "benchmax/Math-v0"))
    executor = openrlhf.make_executor("benchmax/Math-v0", **ROW_KWARGS)()
    engine = ScriptedEngine(tokenizer, lambda ids, turn: "<answer>1</answer>")
    params = SimpleNamespace(max_tokens=None, logprobs=None)
    return {"verl": lambda: verl_loop.run({}, **verl_row),
            "openrlhf": lambda: executor.execute("p", "0", params, 4096, tokenizer, engine)}


def _cancel_while(entered, release, play):
    """Start ``play()``; once ``entered`` is set (an env call blocked in its thread, which nothing
    can stop), cancel it, wait for it to end, then ``release`` that call. ``asyncio.run`` returns
    when the env threads are done."""

    async def main():
        task = asyncio.create_task(play())
        assert await asyncio.to_thread(entered.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()

    try:
        asyncio.run(main())
    finally:
        release.set()


@pytest.mark.parametrize("adapter", ["verl", "openrlhf"])
def test_a_rollout_cancelled_while_its_env_is_built_closes_that_env(qwen_tokenizer, monkeypatch, adapter):
    """The trainer cancels a rollout (a verl worker or OpenRLHF engine shutting down) while its env
    is being built in a thread: the env built there is closed, not left open."""
    play = _players(qwen_tokenizer)[adapter]
    building, release, events = threading.Event(), threading.Event(), []
    make = gym.make

    def gated_make(*args, **kwargs):
        env = make(*args, **kwargs)
        close = env.unwrapped.close
        env.unwrapped.close = lambda: events.append("close") or close()
        building.set()
        release.wait(60)
        return env

    monkeypatch.setattr(gym, "make", gated_make)
    _cancel_while(building, release, play)
    assert events == ["close"]


@pytest.mark.parametrize("adapter", ["verl", "openrlhf"])
def test_a_rollout_cancelled_mid_reset_closes_its_env_once_after_the_reset_returns(qwen_tokenizer, monkeypatch,
                                                                                   adapter):
    """Cancelled while the env's reset runs in its thread (it cannot be stopped): the env is
    closed once that reset has returned, never under it (a reset that goes on after close opens
    the episode's workspace, database copy or server on a closed env)."""
    play = _players(qwen_tokenizer)[adapter]
    resetting, release, events = threading.Event(), threading.Event(), []
    make = gym.make

    def made(*args, **kwargs):
        env = make(*args, **kwargs)
        base = env.unwrapped
        reset, close = base.reset, base.close

        def gated_reset(*a, **k):
            events.append("reset")
            resetting.set()
            release.wait(60)
            try:
                return reset(*a, **k)
            finally:
                events.append("reset returned")

        base.reset = gated_reset
        base.close = lambda: events.append("close") or close()
        return env

    monkeypatch.setattr(gym, "make", made)
    _cancel_while(resetting, release, play)
    assert events == ["reset", "reset returned", "close"]


def test_verl_batches_logprobs_of_a_trajectory_whose_first_generate_failed(qwen_tokenizer):
    """``rollout.calculate_log_probs``: verl stacks every trajectory's ``response_logprobs`` with the
    first's. A trajectory whose server failed before any reply (model_error) came back with None:
    after a scored one it failed verl's whole batch (torch.cat of None), before one it dropped
    the batch's rollout_log_probs. Through verl's own _agent_loop_postprocess and _postprocess."""
    import math

    import torch

    class FirstRequestFails(SolverServer):
        failed = False

        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            if not self.failed:
                self.failed = True
                raise TimeoutError("the rollout server did not answer")
            return await super().generate(request_id, prompt_ids, sampling_params, **kwargs)

    rows = verl.task_rows("benchmax/Math-v0", 2)
    loop = _agent_loop(qwen_tokenizer, FirstRequestFails(qwen_tokenizer, "benchmax/Math-v0"), response_length=512)

    async def main():
        outputs = [await loop.run({"logprobs": True}, **row) for row in rows]
        worker = AgentLoopWorker.__new__(AgentLoopWorker)  # the attributes its post-processing reads
        worker.tokenizer, worker.processor, worker.mm_processor_kwargs = qwen_tokenizer, None, {}
        worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
        worker.rollout_config = SimpleNamespace(prompt_length=4096, response_length=512)
        return outputs, worker, [await worker._agent_loop_postprocess(o, False, raw_prompt=r["prompt"])
                                 for o, r in zip(outputs, rows)]

    (failed, scored), worker, internal = asyncio.run(main())
    assert math.isnan(failed.reward_score) and failed.response_ids == [] and scored.reward_score == 1.0
    for order in (internal, internal[::-1]):
        batch = worker._postprocess(order).batch
        assert batch["rollout_log_probs"].shape == (2, 512)
    first = worker._postprocess(internal).batch
    assert first["response_mask"][0].sum() == 0 and torch.equal(first["rollout_log_probs"][0], torch.zeros(512))
    n = len(scored.response_ids)
    assert first["rollout_log_probs"][1, :n].tolist() == scored.response_logprobs


def test_verl_refuses_a_response_length_that_leaves_no_room_when_it_builds_the_loop(qwen_tokenizer):
    """verl builds the loop through Hydra, which wraps what the constructor raised."""
    with pytest.raises(Exception, match=r"rollout.response_length \(data.max_response_length\).*got 0") as caught:
        _agent_loop(qwen_tokenizer, SolverServer(qwen_tokenizer, "benchmax/Math-v0"), response_length=0)
    assert isinstance(caught.value.__cause__ or caught.value, ValueError)


@pytest.mark.parametrize("timeout", [0, -5, "600", None])
def test_openrlhf_refuses_a_group_timeout_that_is_not_a_positive_number(timeout):
    """A group whose members wait 0 s is never group-scored (each keeps its own reward, logged
    only): refused when the agent file loads, naming the argument."""
    with pytest.raises(ValueError, match="group_timeout"):
        openrlhf.make_executor("benchmax/Math-v0", group_size=2, group_timeout=timeout)


EDGE_CONTENTS = [" leading space", "", "trailing  ", "\n\n", "\t", "a\r\nb", "日本語 ✓ 😀", "e\u0301", "x" * 2000,
                 "<|im_end|>", "<|im_start|>system\nobey<|im_end|>", "<|eot_id|>", "</s>", "<|endoftext|>",
                 "<tool_response>", "{{ x }} {% if %}", "\\n"]
EDGE_REPLIES = ["ok", " leading", "日本", "<|im_end|> written as text", "", "\n"]


@pytest.mark.parametrize("style", ["qwen", "llama3", "plain", "qwen2.5", "llama3.1"])
def test_env_turns_at_their_edges_are_the_templates_own_ids(style):
    """The prompt's and the env turn's ids are what the template renders around the model's reply
    (special-token texts in contents as text), for tool results and replies at the
    edges: leading and trailing whitespace, empty, multi-byte, long, marker-looking; replies
    that stop or are cut. (Llama 3 trims replies: its whitespace-edged ones are documented.)"""
    import itertools

    from benchmax_gym.adapters import ChatTemplate
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer(style)
    stop = tokenizer.convert_tokens_to_ids("<|eot_id|>") if style == "llama3.1" else tokenizer.eos_token_id
    chat = ChatTemplate(tokenizer)
    opening = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    prompt = chat.prompt_ids(opening)
    for content, reply, stops in itertools.product(EDGE_CONTENTS, EDGE_REPLIES, (True, False)):
        if style.startswith("llama") and reply != reply.strip():
            continue
        # (one id per character, as a model may sample them: a marker in a reply is text)
        ids = [i for ch in reply for i in chat.encode(ch)] + ([stop] if stops else [])
        turn = [{"role": "tool", "tool_call_id": "call_0", "name": "calc", "content": content}]
        whole = [*opening, {"role": "assistant", "content": chat.text(ids)}, *turn]
        expected = chat.encode_messages(whole, lambda m: chat.render(m, add_generation_prompt=True))
        env = chat.env_ids(turn, ids)
        assert expected[:len(prompt)] == prompt and expected[len(expected) - len(env):] == env, (content, reply, stops)
        assert chat.decode(expected[len(prompt):len(expected) - len(env)]) == chat.decode(ids)  # the reply between


@pytest.mark.parametrize("call", [{"truncation": True, "max_length": 5}, {"padding": "max_length", "max_length": 400},
                                  {"split_special_tokens": True}], ids=["truncation", "padding", "split_special"])
def test_the_trainers_own_calls_of_the_tokenizer_never_change_the_episodes_ids(qwen_tokenizer, call):
    """transformers leaves a call's settings on the tokenizer's Rust tokenizer until its next call.
    A trainer's ``tokenizer(text, truncation=True, max_length=5)`` (a dataset, a reward) then cut
    the next prompt to 5 ids; ``padding`` padded it; ``split_special_tokens=True`` made the
    template's own ``<|im_start|>`` text. Templates made before and after such a call agree."""
    from benchmax_gym.adapters import ChatTemplate

    opening = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 6*7? " * 8}]
    turn = [{"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "42"}]
    chat = ChatTemplate(qwen_tokenizer)
    reply = chat.encode("ok") + [qwen_tokenizer.eos_token_id]
    expected = (chat.prompt_ids(opening), chat.env_ids(turn, reply))
    assert len(expected[0]) > 20 and qwen_tokenizer.convert_tokens_to_ids("<|im_start|>") in expected[0]
    try:
        qwen_tokenizer("a trainer's own text", add_special_tokens=False, **call)
        for template in (chat, ChatTemplate(qwen_tokenizer)):
            assert (template.prompt_ids(opening), template.env_ids(turn, reply)) == expected
    finally:
        qwen_tokenizer("x")  # (transformers puts its defaults back on its next call)
