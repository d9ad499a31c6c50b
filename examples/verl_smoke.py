"""CPU smoke of the verl adapter: the "benchmax" agent loop built as verl's AgentLoopWorker builds
it (hydra instantiate from verl's registry) with a tiny model generating real tokens behind verl's
server-manager interface, on rows ``make_dataset.py verl`` writes.

    python examples/verl_smoke.py
"""

from __future__ import annotations

import asyncio


def main(argv: list[str] | None = None) -> list:
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    import benchmax_gym.adapters.verl  # noqa: F401  (registers "benchmax")
    from benchmax_gym.adapters.verl import task_rows
    from benchmax_gym.testing.tokenizers import TinyGenerator, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    server = TinyGenerator(tiny_model(tokenizer), tokenizer).verl_server()
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 256}},
                               "data": {"apply_chat_template_kwargs": {}}})
    loop = hydra.utils.instantiate(config=_agent_loop_registry["benchmax"], trainer_config=DictConfigWrap(config),
                                   server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
                                   dataset_cls=None, data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))

    async def run():
        return await asyncio.gather(*(loop.run({"temperature": 1.0}, **row) for row in task_rows("benchmax/Math-v0", 4)))

    outputs = asyncio.run(run())
    print([(o.reward_score, o.num_turns, len(o.response_ids)) for o in outputs])
    return outputs


if __name__ == "__main__":
    main()
