"""CPU smoke of the SkyRL adapter: a tiny model generates real tokens through the env calls
SkyRL's generator makes (make per trajectory, init, step until done, get_metrics, close), from
worker threads, with the dataset rows ``make_dataset.py skyrl`` writes.

    pip install torch==2.13.0 --index-url <PyTorch's CPU wheel index>   # first: else the CUDA build
    pip install 'benchmax-gym[skyrl,trl]'
    python examples/skyrl_smoke.py
"""

from __future__ import annotations

import asyncio
import concurrent.futures

INSTALL = "pip install 'benchmax-gym[skyrl,trl]'"


async def trajectory(executor, row, generator, chat, max_turns=3):
    import skyrl_gym

    loop = asyncio.get_running_loop()
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")} | {"max_turns": max_turns}
    env = skyrl_gym.make(row["env_class"], env_config={}, extras=extras)
    history, _ = await loop.run_in_executor(executor, env.init, row["prompt"])
    input_ids = chat.prompt_ids(history)
    done, reward = False, 0.0
    while not done:
        ids, _ = await loop.run_in_executor(executor, generator.sample, input_ids)
        out = await loop.run_in_executor(executor, env.step, chat.text(ids))
        done, reward = out["done"], out["reward"]
        input_ids = input_ids + ids + ([] if done else chat.env_ids(out["observations"], ids))
    metrics = env.get_metrics()
    await loop.run_in_executor(executor, env.close)
    return reward, metrics


def main(argv: list[str] | None = None) -> list:
    try:
        import torch  # noqa: F401  (the tiny model)
        import transformers  # noqa: F401

        import benchmax_gym.adapters.skyrl  # noqa: F401  (registers "benchmax")
        from benchmax_gym.adapters import ChatTemplate
        from benchmax_gym.adapters.skyrl import task_rows
        from benchmax_gym.testing.tokenizers import TinyGenerator, tiny_model, tiny_tokenizer
    except ImportError as exc:  # one line naming the extras, not a traceback
        raise SystemExit(f"skyrl_smoke.py needs skyrl-gym and transformers: {INSTALL} ({exc})") from None

    tokenizer = tiny_tokenizer("qwen2.5")
    generator, chat = TinyGenerator(tiny_model(tokenizer), tokenizer), ChatTemplate(tokenizer)
    rows = task_rows("benchmax/Math-v0", 4)

    async def run():
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            return await asyncio.gather(*(trajectory(executor, row, generator, chat) for row in rows))

    results = asyncio.run(run())
    print(results)
    return results


if __name__ == "__main__":
    main()
