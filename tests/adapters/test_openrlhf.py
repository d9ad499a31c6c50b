"""OpenRLHF: the agent file loaded as ``--agent_func_path`` loads it, run by OpenRLHF's own
MultiTurnAgentExecutor with a scripted generation engine (vLLM's generate shape)."""

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from openrlhf.utils.agent import AgentExecutorBase

from benchmax_gym.adapters.openrlhf import make_executor, task_rows
from benchmax_gym.testing.tokenizers import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]


def load_agent_file(path):
    """What OpenRLHF's vllm_engine._load_agent_executor does with --agent_func_path."""
    spec = importlib.util.spec_from_file_location("agent_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    return module.AgentExecutor()


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
        assert out["reward"] == 1.0 and out["extra_logs"]["reward/correct"] == 1.0
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
    assert out.stdout.strip() == "MultiTurnAgentExecutor"
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
    feedback = qwen_tokenizer.decode(out["observation_tokens"][b:c])
    assert feedback.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n2\n")


def test_bad_input_fails_when_the_agent_file_loads():
    import gymnasium as gym

    with pytest.raises(gym.error.Error, match="Mth"):
        make_executor("benchmax/Mth-v0")
    with pytest.raises(TypeError, match="max_turn"):
        make_executor("benchmax/Math-v0", max_turn=2)
