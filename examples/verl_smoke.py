"""CPU smoke of the verl adapter: the "benchmax" agent loop built as verl's AgentLoopWorker builds
it (the entry of ``verl_agent_loops.yaml``, hydra-instantiated) with a tiny model generating real
tokens behind verl's server-manager interface, on rows ``make_dataset.py verl`` writes.

    pip install torch==2.13.0 --index-url <PyTorch's CPU wheel index>   # first: else the CUDA build
    pip install 'benchmax-gym[trl]' ray==2.60.0 hydra-core tensordict codetiming orjson cachetools fastapi pandas pillow && pip install --no-deps verl==0.9.1
    python examples/verl_smoke.py
"""

from __future__ import annotations

import asyncio

INSTALL = ("pip install 'benchmax-gym[trl]' ray==2.60.0 hydra-core tensordict codetiming orjson cachetools fastapi "
           "pandas pillow && pip install --no-deps verl==0.9.1")


def main(argv: list[str] | None = None) -> list:
    from pathlib import Path

    try:
        import hydra
        import torch  # noqa: F401  (the tiny model)
        import transformers  # noqa: F401
        from omegaconf import OmegaConf
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

        import benchmax_gym.adapters.verl  # noqa: F401  (what the yaml's _target_ imports)
        from benchmax_gym.adapters.tokens import task_dataset
        from benchmax_gym.testing.tokenizers import TinyGenerator, tiny_model, tiny_tokenizer
    except ImportError as exc:  # one line naming the install, not a traceback
        raise SystemExit(f"verl_smoke.py needs verl and transformers (on CPU): {INSTALL} ({exc})") from None

    tokenizer = tiny_tokenizer("qwen2.5")
    server = TinyGenerator(tiny_model(tokenizer), tokenizer).verl_server()
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 256}},
                               "data": {"apply_chat_template_kwargs": {}}})
    entries = {e.name: e for e in OmegaConf.load(Path(__file__).with_name("verl_agent_loops.yaml"))}
    loop = hydra.utils.instantiate(config=entries["benchmax"], trainer_config=DictConfigWrap(config),
                                   server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
                                   dataset_cls=None, data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))

    rows = [{"raw_prompt": r["prompt"], "extra_info": {"env_id": "benchmax/Math-v0", "task_index": r["task_index"]}}
            for r in task_dataset("benchmax/Math-v0", 4).to_list()]  # as make_dataset.py verl writes them

    async def run():
        return await asyncio.gather(*(loop.run({"temperature": 1.0}, **row) for row in rows))

    outputs = asyncio.run(run())
    print([(o.reward_score, o.num_turns, len(o.response_ids)) for o in outputs])
    return outputs


if __name__ == "__main__":
    main()
