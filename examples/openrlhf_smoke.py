"""CPU smoke of the OpenRLHF adapter: the agent executor (loaded from
``examples/openrlhf_agent.py`` as ``--train.agent_func_path`` loads it) with a tiny model
generating real tokens in vLLM's output shape, under a ``max_length`` that holds the whole
prompt (~610 tokens with this tokenizer) and a 96-token response budget.

    pip install torch==2.13.0 --index-url <PyTorch's CPU wheel index>   # first: else the CUDA build
    pip install 'benchmax-gym[trl]' aiohttp pylatexenc && pip install --no-deps openrlhf==0.11.2
    python examples/openrlhf_smoke.py
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import SimpleNamespace

INSTALL = "pip install 'benchmax-gym[trl]' aiohttp pylatexenc && pip install --no-deps openrlhf==0.11.2"


def main(argv: list[str] | None = None) -> list:
    try:
        import torch  # noqa: F401  (the tiny model)
        import transformers  # noqa: F401

        from benchmax_gym.adapters.openrlhf import task_rows
        from benchmax_gym.testing.tokenizers import TinyGenerator, tiny_model, tiny_tokenizer

        spec = importlib.util.spec_from_file_location("agent_module", Path(__file__).with_name("openrlhf_agent.py"))
        agent = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(agent)
    except ImportError as exc:  # one line naming the install, not a traceback
        raise SystemExit(f"openrlhf_smoke.py needs openrlhf and transformers (on CPU): {INSTALL} ({exc})") from None
    executor = agent.AgentExecutor()
    tokenizer = tiny_tokenizer("qwen2.5")
    engine = TinyGenerator(tiny_model(tokenizer), tokenizer)
    rows = task_rows("benchmax/Math-v0", 4)
    session = __import__("benchmax_gym.adapters", fromlist=["TokenSession"]).TokenSession("benchmax/Math-v0", tokenizer)
    prompt = max(len(session.reset(options={"task_index": i})) for i in range(len(rows)))
    session.close()

    async def run():
        params = SimpleNamespace(max_tokens=None, logprobs=1)
        return await asyncio.gather(*(executor.execute(r["prompt"], r["label"], params, prompt + 96, tokenizer, engine)
                                      for r in rows))

    outputs = asyncio.run(run())
    print([(o["reward"], len(o["action_ranges"]), len(o["observation_tokens"])) for o in outputs])
    return outputs


if __name__ == "__main__":
    main()
