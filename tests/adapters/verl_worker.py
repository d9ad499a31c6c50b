"""Run in a fresh process by test_verl.py: verl's own path from a launch script's overrides to a
post-processed batch (after verl's driver's ``validate_config``), as a verl agent-loop worker process runs it, importing nothing of
benchmax-gym itself (the agent-loop config file's ``_target_`` must).

    python verl_worker.py SPEC.json    # prints one JSON line

SPEC: ``overrides`` (the launch script's Hydra overrides, then the test's), ``reply_tokens``
(the scripted model's reply length). verl's Hydra config (ppo_trainer) is composed with them,
the parquet files are read by verl's RLHFDataset and collated by its collate_fn, and
AgentLoopWorker (built from the config: tokenizer from model.path, agent loops from the config
file) runs generate_sequences against a scripted server.
"""

import asyncio
import json
import os
import sys


class ScriptedServer:
    """verl's LLM client ``generate``: a tool call padded to ``reply_tokens`` ids on the first
    turn, then a final answer; honours ``max_tokens`` and records every request."""

    def __init__(self, tokenizer, reply_tokens):
        self.tokenizer, self.reply_tokens, self.turns, self.requests = tokenizer, reply_tokens, {}, []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append({"max_tokens": sampling_params.get("max_tokens"), "prompt": len(prompt_ids)})
        turn = self.turns[request_id] = self.turns.get(request_id, -1) + 1
        text = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>' if turn == 0 else "<answer>1</answer>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ids = (ids + self.tokenizer.encode(" pad" * self.reply_tokens, add_special_tokens=False))[: self.reply_tokens]
        ids = ids + [self.tokenizer.eos_token_id]
        limit = sampling_params.get("max_tokens")
        ids = ids[:limit] if limit is not None else ids
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def main(spec_path):
    spec = json.loads(open(spec_path).read())
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=spec["overrides"])
    # the driver's own check before it starts anything (batch sizes, micro-batch settings): raises
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    assert "benchmax_gym.adapters.verl" not in sys.modules
    worker_config = config
    server = None

    async def run():
        nonlocal server
        worker = AgentLoopWorker(worker_config, llm_client=None)
        server = worker.llm_client = ScriptedServer(worker.tokenizer, spec["reply_tokens"])
        dataset = RLHFDataset(config.data.train_files, worker.tokenizer, config.data)
        batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
        return await worker.generate_sequences(batch)

    out = asyncio.run(run())
    print(json.dumps({
        "imported_adapter": "benchmax_gym.adapters.verl" in sys.modules,
        "responses_shape": list(out.batch["responses"].shape),
        "response_length": config.actor_rollout_ref.rollout.response_length,
        "response_lengths": out.batch["attention_mask"][:, out.batch["prompts"].shape[1]:].sum(-1).tolist(),
        "reward_extra_keys": out.meta_info.get("reward_extra_keys"),
        "rewards": out.batch["rm_scores"].sum(-1).tolist(),
        "truncated": [float(x) for x in out.non_tensor_batch["truncated"]],
        "components": [dict(c) for c in out.non_tensor_batch["reward_components"]],
        "env_ids": [e["env_id"] for e in out.non_tensor_batch["extra_info"]],
        "requests": server.requests,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
