"""What does a token-level turn cost over a plain step? Prints one JSON object.

One turn of ``benchmax/Math-v0`` with one calculator call, three ways, interleaved in rounds:

* ``step``: ``env.step(text)`` alone;
* ``encode``: the tokenizer encoding the turn's new environment text (its own cost, which any
  token-level trainer pays);
* ``adapter``: ``TokenSession.step(ids)``: decode the model's ids, step, render the env turn with
  the chat template, encode it, append ids, mask and logprobs.

Target (issue #16): adapter <= 2 x step + encode. The tokenizer is a byte-level BPE trained here
with Qwen2.5's real chat template (from TRL's copy); a real Qwen tokenizer costs about the same
per token (both are Rust ``tokenizers``).

    python benchmarks/adapter_overhead.py [--turns 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import gymnasium as gym

from _bench import need

need("trl", "transformers", "tokenizers")  # the tiny tokenizer is a transformers fast tokenizer
import benchmax_gym  # noqa: E402, F401
from benchmax_gym.adapters import ChatTemplate, TokenSession
from benchmax_gym.testing.tokenizers import tiny_tokenizer

ACTION = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3 - 4 / 2"}}\n</tool_call>'


def per_turn_us(fn, turns: int) -> float:
    start = time.perf_counter()
    for _ in range(turns):
        fn()
    return (time.perf_counter() - start) / turns * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--template", default="qwen2.5")
    args = parser.parse_args()

    tokenizer = tiny_tokenizer(args.template)
    chat = ChatTemplate(tokenizer)
    model_ids = chat.encode(ACTION) + [tokenizer.eos_token_id]
    env = gym.make("benchmax/Math-v0", max_turns=10**9)
    env.reset(seed=0)
    session = TokenSession(gym.make("benchmax/Math-v0", max_turns=10**9), chat)
    session.reset(seed=0)
    _, _, _, _, info = env.step(ACTION)
    env_text = chat.env_text(info["messages"], model_ids)

    def adapter():  # one long episode, as the plain env's: a reset (a sandbox start) is not a turn's cost
        session.step(model_ids)

    samples = {"step": [], "encode": [], "render": [], "adapter": []}
    for _ in range(args.rounds):
        samples["step"].append(per_turn_us(lambda: env.step(ACTION), args.turns))
        samples["encode"].append(per_turn_us(lambda: chat.encode(env_text), args.turns))
        samples["render"].append(per_turn_us(lambda: chat.render_turn(info["messages"]), args.turns))
        samples["adapter"].append(per_turn_us(adapter, args.turns))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(json.dumps({
        "benchmark": "adapter_overhead",
        "template": args.template,
        "env_tokens_per_turn": len(chat.encode(env_text)),
        "median_us": {k: round(v, 1) for k, v in med.items()},
        "range_us": {k: [round(min(v), 1), round(max(v), 1)] for k, v in samples.items()},
        "adapter_over_step_plus_encode": round(med["adapter"] / (med["step"] + med["encode"]), 2),
        "target_adapter_us": round(2 * med["step"] + med["encode"], 1),
        "meets_target": med["adapter"] <= 2 * med["step"] + med["encode"],
        "python": platform.python_version(),
    }, indent=2))
    session.close()
    env.close()


if __name__ == "__main__":
    main()
