"""OpenRLHF: an env whose close raises after its episode was graded keeps the sample (its reward
and tokens), the failed close logged as a leak; an env's step or reset raising makes the sample a
failed one (``env_error``, NaN, its own error in ``outcome_detail``, not the close's), and a
cancelled sample still ends cancelled. (The close in the executor's ``finally`` raised out of
the sample: a graded sample, or its step's own error, or its cancellation, became the close's
error. Then a step's own error raised out of the sample, as this file asserted: but OpenRLHF's
``generate_responses`` gathers a prompt's samples without ``return_exceptions``, so one flaky
env failed the engine's Ray call and ended training; the verl adapter already made it a failed
trajectory.) Played as OpenRLHF's engine plays a prompt's samples (one gather), then through
OpenRLHF's own samples generator and Experience concat."""

import asyncio
import json
import math
from types import SimpleNamespace

import gymnasium as gym
import pytest
from test_openrlhf import _experiences, _params

from benchmax_gym.adapters.openrlhf import make_executor, task_rows
from benchmax_gym.core.group import GroupRubric, diversity_penalty
from benchmax_gym.registry import register_tool_env
from benchmax_gym.testing.tokenizers import ScriptedEngine

TOOL_ENV = "benchmax-test/OpenRLHFAdd-v0"
ENV_ID = "benchmax-test/OpenRLHFFragileAdd-v0"
CLOSES: list[str] = []  # one entry per close of a Fragile env


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


class Fragile(gym.Wrapper):
    """An env whose teardown fails (a server that will not stop) with ``close_fails``, and whose
    backend is lost mid-episode (a step raising, as a third-party env may) on a reply holding
    ``crash_marker``."""

    def __init__(self, env, close_fails=False, crash_marker=None, reset_fails=False):
        super().__init__(env)
        self.close_fails, self.crash_marker, self.reset_fails = close_fails, crash_marker, reset_fails

    def reset(self, **kwargs):
        if self.reset_fails:
            raise RuntimeError("the env's sandbox could not be provisioned\n(quota exceeded)")
        return self.env.reset(**kwargs)

    def step(self, action):
        if self.crash_marker and self.crash_marker in str(action):
            raise ConnectionResetError("the env's sandbox host reset the connection")
        return self.env.step(action)

    def close(self):
        CLOSES.append("close")
        super().close()
        if self.close_fails:
            raise OSError("the env's server would not stop")


def _make(close_fails=False, crash_marker=None, reset_fails=False, **kwargs):
    return Fragile(gym.make(TOOL_ENV, **kwargs), close_fails, crash_marker, reset_fails)


if TOOL_ENV not in gym.registry:
    register_tool_env(TOOL_ENV, tools=[add], rubric=exact,
                      tasks=[{"prompt": f"{i}+{i}?", "answer": str(2 * i)} for i in range(3)])
    gym.register(ENV_ID, entry_point=_make, disable_env_checker=True)


@pytest.fixture
def closes():
    CLOSES.clear()
    return CLOSES


def _answers(tokenizer, crash=None):
    """The model: answers its task ("i+i?") right, or says ``crash``."""

    def reply(prompt_ids, turn):
        i = int(tokenizer.decode(prompt_ids).rsplit("?", 1)[0].rsplit("\n", 1)[-1].split("+")[0])
        return crash or str(2 * i)

    return ScriptedEngine(tokenizer, reply)


def _with_kwargs(row, **env_kwargs):
    label = json.loads(row["label"])
    return {**row, "label": json.dumps({**label, "env_kwargs": {**label.get("env_kwargs", {}), **env_kwargs}})}


def test_a_sample_whose_env_close_raises_keeps_its_reward_and_tokens_logged_as_a_leak(qwen_tokenizer, closes,
                                                                                      caplog):
    executor = make_executor()()
    rows = task_rows(ENV_ID, 3)
    rows[1] = _with_kwargs(rows[1], close_fails=True)
    engine = _answers(qwen_tokenizer)
    closes.clear()  # (the rows' own env)

    async def main():
        return await asyncio.gather(*(executor.execute(r["prompt"], r["label"], _params(), 4096, qwen_tokenizer,
                                                       engine) for r in rows))

    outputs = asyncio.run(main())
    assert [o["reward"] for o in outputs] == [1.0, 1.0, 1.0]
    assert qwen_tokenizer.decode(outputs[1]["observation_tokens"]).rstrip().endswith("2<|im_end|>")  # "1+1?" -> 2
    _, batch = _experiences(outputs, 4096)
    assert batch.sequences.shape[0] == 3 and batch.info["reward"].tolist() == [1.0, 1.0, 1.0]
    assert closes == ["close"] * 3
    assert f"closing the env of {ENV_ID} task 1 raised OSError: the env's server would not stop" in caplog.text


def test_a_group_keeps_its_scores_when_closes_raise_and_a_crashed_step_is_a_failed_sample(qwen_tokenizer,
                                                                                          closes, caplog):
    """group_size=3, every env's close raising: the two played samples keep their group-scored
    rewards (alike: penalised); the third's step raised and its sample comes back failed
    (env_error, NaN: not a member), its step's error (not the close's) in its outcome_detail."""
    executor = make_executor(ENV_ID, group_size=3, group_timeout=60,
                             group_rubric=GroupRubric([("diverse", diversity_penalty, 0.5)]), crash_marker="CRASH")()
    row = _with_kwargs(task_rows(ENV_ID, 1)[0], close_fails=True)
    closes.clear()  # (the agent file's and the rows' own envs)

    async def play(engine):
        return await executor.execute(row["prompt"], row["label"], _params(), 4096, qwen_tokenizer, engine)

    async def main():  # (as OpenRLHF's generate_responses: no return_exceptions)
        return await asyncio.gather(play(_answers(qwen_tokenizer)), play(_answers(qwen_tokenizer)),
                                    play(_answers(qwen_tokenizer, crash="CRASH")))

    first, second, crashed = asyncio.run(main())
    assert math.isnan(crashed["reward"]) and math.isnan(crashed["scores"]) and crashed["truncated"] is False
    assert crashed["extra_logs"]["env/outcome/env_error"] == 1.0
    assert crashed["outcome_detail"] == (f"{ENV_ID} task 0: step raised ConnectionResetError: "
                                         "the env's sandbox host reset the connection")
    assert first["outcome_detail"] == second["outcome_detail"] == ""
    assert first["reward"] == second["reward"] == 0.5  # right (1.0), alike (-0.5): the group was scored
    assert closes == ["close"] * 3
    assert caplog.text.count("raised OSError: the env's server would not stop") == 3


def test_an_env_whose_reset_or_step_raises_is_a_failed_sample_openrlhfs_generate_responses_keeps(qwen_tokenizer,
                                                                                                   closes, caplog):
    """Played as OpenRLHF's engine plays a prompt (its ``generate_responses``: one gather, no
    ``return_exceptions``), with one env whose step raises and one whose reset raises: the
    gather returns every sample, the failed ones env_error with NaN scores, their own errors
    in a line in ``outcome_detail`` and logged with their tracebacks, each env closed once; then
    OpenRLHF's own samples generator and Experience concat take the batch, and its dynamic
    filtering (NaN is outside every range) drops the group."""
    import ray
    from test_openrlhf import SamplesGenerator

    executor = make_executor(ENV_ID, crash_marker="CRASH")()
    row = task_rows(ENV_ID, 1)[0]
    rows = [row, row, _with_kwargs(row, reset_fails=True)]
    engines = [_answers(qwen_tokenizer), _answers(qwen_tokenizer, crash="CRASH"), _answers(qwen_tokenizer)]
    closes.clear()  # (the agent file's and the rows' own envs)

    async def main():
        return await asyncio.gather(*(executor.execute(r["prompt"], r["label"], _params(), 4096, qwen_tokenizer, e)
                                      for r, e in zip(rows, engines)))

    played, stepped, reset = asyncio.run(main())
    assert played["reward"] == 1.0 and played["outcome_detail"] == ""
    for failed in (stepped, reset):
        assert math.isnan(failed["reward"]) and math.isnan(failed["scores"]) and failed["truncated"] is False
        assert failed["extra_logs"]["env/outcome/env_error"] == 1.0 and math.isnan(failed["extra_logs"]["reward"])
        assert failed["extra_logs"].keys() == played["extra_logs"].keys()
    assert stepped["outcome_detail"] == (f"{ENV_ID} task 0: step raised ConnectionResetError: "
                                         "the env's sandbox host reset the connection")
    assert reset["outcome_detail"] == (f"{ENV_ID} task 0: reset raised RuntimeError: the env's sandbox could not be "
                                       "provisioned (quota exceeded)")
    assert reset["action_ranges"] == []  # no reply was asked for; its prompt is the row's
    assert qwen_tokenizer.decode(reset["observation_tokens"]).count(row["prompt"][-1]["content"]) == 1
    assert closes == ["close"] * 3
    assert caplog.text.count("Traceback (most recent call last)") == 2
    assert 'raise ConnectionResetError("the env' in caplog.text and 'raise RuntimeError("the env' in caplog.text
    _, batch = _experiences([played, stepped, reset], 4096)
    assert batch.sequences.shape[0] == 3 and batch.info["env/outcome/env_error"].tolist() == [0.0, 1.0, 1.0]
    # a Ray of its own on loopback ("local"): ray.init() would join a cluster another test runs on this machine
    ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=1, include_dashboard=False, log_to_driver=False,
             ignore_reinit_error=True)
    try:
        generator = SamplesGenerator.__new__(SamplesGenerator)
        generator.args = SimpleNamespace(algo=SimpleNamespace(dynamic_filtering_range=(0.0, 1.0)))
        generator._dispatch_prompts_to_vllm = lambda prompts, labels, **kwargs: [ray.put([played, stepped, reset])]
        batches = iter([(None, [row["prompt"]], [row["label"]], [None])])
        experiences, consumed, _ = generator._generate_vllm(batches, 1, True, max_len=4096)
    finally:
        ray.shutdown()
    assert consumed == 1 and experiences == []


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_out_of_an_envs_step_still_stops_the_run(qwen_tokenizer, closes, monkeypatch, stop):
    """Only an env's exceptions become failed samples: a KeyboardInterrupt or SystemExit raised
    in its step still ends the run (after the env is closed)."""
    executor = make_executor(ENV_ID)()
    row = task_rows(ENV_ID, 1)[0]
    closes.clear()

    def step(env, action):
        raise stop()

    monkeypatch.setattr(Fragile, "step", step)
    with pytest.raises(stop):
        asyncio.run(executor.execute(row["prompt"], row["label"], _params(), 4096, qwen_tokenizer,
                                     _answers(qwen_tokenizer)))
    assert closes == ["close"]


def test_a_sample_cancelled_mid_episode_closes_its_env_once_and_ends_cancelled(qwen_tokenizer, closes, caplog):
    """Cancelled while its engine generates (an OpenRLHF engine shutting down): the env is closed
    once; its close raising is logged, and the sample still ends cancelled (not with the close's error)."""
    executor = make_executor(ENV_ID)()
    row = _with_kwargs(task_rows(ENV_ID, 1)[0], close_fails=True)
    closes.clear()  # (the agent file's and the rows' own envs)

    class Stalls:
        def __init__(self):
            self.generating = asyncio.Event()

        async def generate(self, prompt_ids, sampling_params, multi_modal_data=None):
            self.generating.set()
            await asyncio.Event().wait()  # until cancelled

    async def main():
        engine = Stalls()
        task = asyncio.create_task(executor.execute(row["prompt"], row["label"], _params(), 4096,
                                                    qwen_tokenizer, engine))
        await asyncio.wait_for(engine.generating.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert closes == ["close"]
    assert f"closing the env of {ENV_ID} task 0 raised OSError" in caplog.text
