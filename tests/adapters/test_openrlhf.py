"""OpenRLHF: the agent file loaded as ``--train.agent_func_path`` loads it, run with a scripted
generation engine (vLLM's generate shape), its outputs turned into a batch by OpenRLHF's own
samples generator and Experience concat; the launch script parsed by OpenRLHF's own entry point."""

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from launch import stub_vllm
from openrlhf.utils.agent import AgentExecutorBase

with stub_vllm():
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

from benchmax_gym.adapters.openrlhf import make_executor, task_rows
from benchmax_gym.testing.tokenizers import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]


def load_agent_file(path):
    """OpenRLHF's own loader for --train.agent_func_path."""
    executor = _load_agent_executor(str(path))
    assert isinstance(executor, AgentExecutorBase)
    return executor


def _params(logprobs=None):
    return SimpleNamespace(max_tokens=None, logprobs=logprobs)


class SolverEngine(ScriptedEngine):
    """Each conversation answered by its task's solver (a twin env fed the same replies)."""

    def __init__(self, tokenizer, env_id, logprobs=False):
        import gymnasium as gym

        self.twins, self.logprobs = {}, logprobs

        def reply(prompt_ids, turn):
            key = tuple(prompt_ids)
            if turn == 0:
                twin = gym.make(env_id)
                text = tokenizer.decode(prompt_ids)
                index = next(i for i in range(64) if twin.reset(options={"task_index": i})[0].split("\n\n")[-1] in text)
                self.twins[key] = [twin, *twin.reset(options={"task_index": index}), twin.unwrapped.reference_solver()]
            twin, obs, info, solver = self.twins[key]
            action = solver(obs, info)
            obs, _, term, trunc, info = twin.step(action)
            self.twins[key][1:3] = [obs, info]
            return action

        super().__init__(tokenizer, reply)

    async def generate(self, prompt_ids, sampling_params, multi_modal_data=None):
        out = await super().generate(prompt_ids, sampling_params, multi_modal_data)
        if sampling_params.logprobs is not None:
            ids = out.outputs[0].token_ids
            out.outputs[0].logprobs = [{t: SimpleNamespace(logprob=-0.25)} for t in ids]
        return out


def test_the_example_agent_file_loads_as_openrlhf_loads_it_and_plays(qwen_tokenizer):
    executor = load_agent_file(ROOT / "examples" / "openrlhf_agent.py")
    engine = SolverEngine(qwen_tokenizer, "benchmax/Math-v0")
    rows = task_rows("benchmax/Math-v0", 6)

    async def main():
        return await asyncio.gather(*(executor.execute(r["prompt"], r["label"], _params(1), 4096, qwen_tokenizer, engine)
                                      for r in rows))

    outputs = asyncio.run(main())
    for row, out in zip(rows, outputs):
        text = qwen_tokenizer.decode(out["observation_tokens"])
        assert row["prompt"][-1]["content"] in text  # its own task: no cross-talk
        assert out["reward"] == 1.0 and out["extra_logs"]["reward"] == 1.0 and out["extra_logs"]["truncated"] == 0.0
        assert len(out["action_ranges"]) >= 2  # a tool call, then the answer
        assert len(out["rollout_log_probs"]) == len(out["observation_tokens"])
        model = {i for a, b in out["action_ranges"] for i in range(a, b)}
        assert all((lp == -0.25) == (i in model) for i, lp in enumerate(out["rollout_log_probs"]))


def test_the_module_itself_is_an_agent_file_configured_by_environment_variables(tmp_path):
    import benchmax_gym.adapters.openrlhf as module

    script = (f"import importlib.util; spec = importlib.util.spec_from_file_location('agent_module', {module.__file__!r}); "
              "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
              "e = m.AgentExecutor(); print(type(e).__mro__[1].__name__)")
    env = {"BENCHMAX_ENV_ID": "benchmax/CRM-v0", "BENCHMAX_ENV_KWARGS": '{"max_turns": 3}', "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "AgentExecutorBase"
    env["BENCHMAX_ENV_KWARGS"] = '{"max_turn": 3}'
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "max_turn" in out.stderr.splitlines()[-1]


def test_a_reply_cut_by_the_engine_is_closed_by_environment_tokens(qwen_tokenizer):
    executor = make_executor("benchmax/Math-v0")()
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'

    class Cut(ScriptedEngine):
        async def generate(self, prompt_ids, sampling_params, multi_modal_data=None):
            out = await super().generate(prompt_ids, sampling_params, multi_modal_data)
            if out.outputs[0].text == call:
                out.outputs[0].token_ids = out.outputs[0].token_ids[:-1]  # no stop token: a length cut
                out.outputs[0].finish_reason = "length"
            return out

    engine = Cut(qwen_tokenizer, lambda ids, turn: call if turn == 0 else "\\boxed{0}")
    out = asyncio.run(executor.execute("p", "0", _params(), 4096, qwen_tokenizer, engine))
    (a, b), (c, _) = out["action_ranges"]
    assert out["observation_tokens"][a:b] == qwen_tokenizer.encode(call, add_special_tokens=False)  # kept as cut
    feedback = qwen_tokenizer.decode(out["observation_tokens"][b:c])
    assert feedback.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n2\n")


def test_bad_input_fails_when_the_agent_file_loads():
    import gymnasium as gym

    with pytest.raises(gym.error.Error, match="Mth"):
        make_executor("benchmax/Mth-v0")
    with pytest.raises(TypeError, match="max_turn"):
        make_executor("benchmax/Math-v0", max_turn=2)


def _experiences(outputs, max_len):
    """OpenRLHF's samples generator turns each output into an Experience, then concatenates the batch."""
    exps = [SamplesGenerator._process_response_into_experience(None, out, max_len=max_len) for out in outputs]
    return exps, Experience.concat_experiences(exps, 0)


def test_a_mixed_batch_of_math_excel_and_crm_rows_through_openrlhfs_post_processing(qwen_tokenizer):
    """One dataset mixing envs (each label names its env); OpenRLHF merges per-sample logs by
    the first sample's keys: every env's logs have the same keys."""
    executor = make_executor()()
    rows = [r for env_id in ("benchmax/Math-v0", "benchmax/Excel-v0", "benchmax/CRM-v0") for r in task_rows(env_id, 2)]
    engine = ScriptedEngine(qwen_tokenizer, lambda ids, turn: "<answer>1</answer>")

    async def main():
        return await asyncio.gather(*(executor.execute(r["prompt"], r["label"], _params(), 16384, qwen_tokenizer,
                                                       engine) for r in rows))

    outputs = asyncio.run(main())
    _, batch = _experiences(outputs, 16384)
    assert batch.sequences.shape[0] == 6 and set(batch.info) >= {"reward", "turns", "tool_errors", "truncated"}
    texts = [qwen_tokenizer.decode(o["observation_tokens"]) for o in outputs]
    assert all(r["prompt"][-1]["content"][:200] in t for r, t in zip(rows, texts))  # each row's own env and task


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(room=st.integers(1, 160), lengths=st.lists(st.integers(1, 90), max_size=5))
def test_budget_property_max_length_holds_and_cut_episodes_are_graded(qwen_tokenizer, room, lengths):
    """max_length = prompt + room: every request asks for 1..what is left, the sequence fits, and
    a trajectory the budget cut is truncated with its reward and logs (OpenRLHF's own loop
    stopped such trajectories ungraded)."""
    from benchmax_gym.adapters import ChatTemplate, TokenSession

    row = task_rows("benchmax/Math-v0", 1)[0]
    session = TokenSession("benchmax/Math-v0", ChatTemplate(qwen_tokenizer))
    prompt = len(session.reset(options={"task_index": 0}))
    session.close()
    asked, replies = [], list(lengths)
    call = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'

    class Lengths(ScriptedEngine):
        async def generate(self, prompt_ids, sampling_params, multi_modal_data=None):
            asked.append((len(prompt_ids), sampling_params.max_tokens))
            out = await super().generate(prompt_ids, sampling_params, multi_modal_data)
            n = replies.pop(0) if replies else 4
            ids = (out.outputs[0].token_ids[:-1] + qwen_tokenizer.encode(" x" * n))[:n] + [qwen_tokenizer.eos_token_id]
            out.outputs[0].token_ids = ids[: sampling_params.max_tokens]
            return out

    engine = Lengths(qwen_tokenizer, lambda ids, turn: call)
    out = asyncio.run(make_executor("benchmax/Math-v0")().execute(row["prompt"], row["label"], _params(), prompt + room,
                                                                  qwen_tokenizer, engine))
    assert all(1 <= m <= prompt + room - n for n, m in asked)
    assert len(out["observation_tokens"]) <= prompt + room
    assert out["action_ranges"][-1][1] == len(out["observation_tokens"])  # ends on the model's ids
    assert "reward" in out["extra_logs"] and out["extra_logs"]["truncated"] == float(out["truncated"])
    (experience,), _ = _experiences([out], prompt + room)
    assert experience.rewards is not None and experience.info["reward"].item() == out["reward"]


def test_the_launch_script_parses_with_openrlhfs_own_entry_point_and_loads_its_agent(tmp_path):
    import json

    from launch import run_fresh, script_argv

    argv = script_argv("openrlhf_math.sh", tmp_path)
    (tmp_path / "argv.json").write_text(json.dumps(argv))
    args = run_fresh([Path(__file__).with_name("openrlhf_parse.py"), tmp_path / "argv.json"])
    assert args["train.agent_func_path"].endswith("examples/openrlhf_agent.py")
    assert args["data.prompt_dataset"] == "data/benchmax-math/train.jsonl" and args["data.label_key"] == "label"
    assert args["algo.advantage.estimator"] == "group_norm"


def test_a_failed_sample_drops_its_group_through_openrlhfs_dynamic_filtering(qwen_tokenizer):
    """Two prompts, two samples each (FlakyMath): one group right + wrong, the other right +
    a failed sample. OpenRLHF's own _generate_vllm (its dynamic filter, over Ray object refs as
    its engines return them) keeps the first group and drops the second; no failed sample
    becomes an Experience. Outcomes are in every sample's extra_logs."""
    import math

    import ray
    from flaky import ENV_ID

    executor = make_executor(ENV_ID, fail_marker="FAULT")()
    rows = task_rows(ENV_ID, 2, fail_marker="FAULT")
    right = SolverEngine(qwen_tokenizer, "benchmax/Math-v0")
    wrong = ScriptedEngine(qwen_tokenizer, lambda ids, turn: "<answer>-1</answer>")
    fault = ScriptedEngine(qwen_tokenizer, lambda ids, turn: "FAULT")

    async def play(row, engine):
        return await executor.execute(row["prompt"], row["label"], _params(), 16384, qwen_tokenizer, engine)

    async def main():
        return await asyncio.gather(play(rows[0], right), play(rows[0], wrong), play(rows[1], right),
                                    play(rows[1], fault))

    outputs = asyncio.run(main())
    assert [o["reward"] for o in outputs[:3]] == [1.0, 0.0, 1.0] and math.isnan(outputs[3]["scores"])
    assert [o["extra_logs"]["env/outcome/tool_unavailable"] for o in outputs] == [0.0, 0.0, 0.0, 1.0]
    assert all(o["extra_logs"].keys() == outputs[0]["extra_logs"].keys() for o in outputs)
    # a Ray of its own on loopback ("local"): ray.init() would join a cluster another test runs on this machine
    ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=1, include_dashboard=False, log_to_driver=False,
             ignore_reinit_error=True)
    try:
        generator = SamplesGenerator.__new__(SamplesGenerator)
        generator.args = SimpleNamespace(algo=SimpleNamespace(dynamic_filtering_range=(0.0, 1.0)))
        groups = {rows[0]["label"]: outputs[:2], rows[1]["label"]: outputs[2:]}
        generator._dispatch_prompts_to_vllm = lambda prompts, labels, **kwargs: [ray.put(groups[lb]) for lb in labels]
        batches = iter([(None, [r["prompt"] for r in rows], [r["label"] for r in rows], [None, None])])
        experiences, consumed, _ = generator._generate_vllm(batches, 2, True, max_len=16384)
    finally:
        ray.shutdown()
    assert consumed == 2 and len(experiences) == 2  # the first group only
    assert [e.labels[0] for e in experiences] == [rows[0]["label"]] * 2
    assert sorted(e.rewards.item() for e in experiences) == [0.0, 1.0]


def test_a_prompts_samples_meet_and_are_group_scored_without_their_failures(qwen_tokenizer):
    """group_size=3 (--rollout.n_samples_per_prompt): as OpenRLHF's engine plays a prompt's
    samples (one gather), they wait for each other and a GroupRubric scores them; the failed
    sample (FlakyMath's FAULT, or an engine that raised: model_error) is not a member and keeps
    NaN, and does not leave its siblings waiting."""
    import math

    from flaky import ENV_ID

    from benchmax_gym.core.group import GroupRubric, diversity_penalty

    with pytest.raises(ValueError, match="group_size"):
        make_executor(ENV_ID, group_rubric=GroupRubric([diversity_penalty]))
    executor = make_executor(ENV_ID, fail_marker="FAULT", group_size=3,
                             group_rubric=GroupRubric([("diverse", diversity_penalty, 0.5)]))()
    rows = task_rows(ENV_ID, 2, fail_marker="FAULT")
    def says(text):
        return ScriptedEngine(qwen_tokenizer, lambda ids, turn: text)

    class Broken:
        async def generate(self, *args, **kwargs):
            raise RuntimeError("the engine died")

    async def play(row, engine):
        return await executor.execute(row["prompt"], row["label"], _params(), 16384, qwen_tokenizer, engine)

    async def main():
        first = await asyncio.gather(play(rows[0], says("<answer>7</answer>")), play(rows[0], says("<answer>7</answer>")),
                                     play(rows[0], says("FAULT")))
        second = await asyncio.gather(play(rows[1], says("<answer>1</answer>")), play(rows[1], says("<answer>2</answer>")),
                                      play(rows[1], Broken()), return_exceptions=True)
        return first, second

    first, second = asyncio.run(main())
    assert [o["reward"] for o in first[:2]] == [-0.5, -0.5] and math.isnan(first[2]["reward"])  # alike: penalised
    # an engine that raises is the model's endpoint failing: a model_error sample, NaN, not a member
    assert [o["reward"] for o in second[:2]] == [0.0, 0.0] and math.isnan(second[2]["reward"])


def test_a_simulated_customers_turns_are_outside_the_action_ranges(qwen_tokenizer, customer_words):
    """Issue 31: the customer's answers are environment tokens: outside every action range."""
    from customer import SERVICE

    executor = make_executor(SERVICE)()
    out = asyncio.run(executor.execute("(prompt)", "0", _params(), 8192, qwen_tokenizer,
                                       SolverEngine(qwen_tokenizer, SERVICE)))
    ids = out["observation_tokens"]
    in_action = {i for a, b in out["action_ranges"] for i in range(a, b)}
    env_text = qwen_tokenizer.decode([t for i, t in enumerate(ids) if i not in in_action])
    model_text = qwen_tokenizer.decode([t for i, t in enumerate(ids) if i in in_action])
    assert out["reward"] == 1.0
    for said in customer_words(0)[:-1]:
        assert said in env_text and said not in model_text


def test_per_turn_rewards_sum_into_the_reward_as_openrlhfs_own_executor_sums_its_steps(qwen_tokenizer):
    """dense_rewards (issue 30): ``reward``/``scores`` are the return, ``turn_rewards`` one per action range."""
    executor = make_executor("benchmax/Math-v0", dense_rewards=True, python_tool=False)()
    engine = SolverEngine(qwen_tokenizer, "benchmax/Math-v0")
    rows = task_rows("benchmax/Math-v0", 2)

    async def main():
        return await asyncio.gather(*(executor.execute(r["prompt"], r["label"], _params(), 4096, qwen_tokenizer, engine)
                                      for r in rows))

    outputs = asyncio.run(main())
    for out in outputs:
        assert len(out["turn_rewards"]) == len(out["action_ranges"]) == 2  # the calls, then the answer
        assert out["turn_rewards"] == [pytest.approx(0.2), 1.0]
        assert out["reward"] == out["scores"] == pytest.approx(1.2) and out["extra_logs"]["turn_reward"] == pytest.approx(0.2)
    exps, batch = _experiences(outputs, 4096)
    assert batch.info["reward"].tolist() == pytest.approx([1.2, 1.2]) and "turn_reward" in batch.info
