"""Simulated-user costs (issue 31) on CRM-Service-v0. Prints one JSON object.

* ``user_step``: one ``env.step`` whose reply goes to the scripted customer (the conversation
  built, the customer's answer, the observation), next to ``tool_step``: a ``query`` step of the
  same episodes.
* ``episode``: a whole episode played by the reference solver (reset included), per second.
* ``llm_user_step`` (``--llm``, needs the ``eval`` extra): the same user step with the customer
  played by a scripted model on a loopback OpenAI-compatible server (``--latency`` seconds a reply).

    python benchmarks/user_turns.py [--episodes 200] [--llm] [--latency 0.0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import gymnasium as gym


def ms(samples):
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000, "n": len(ordered)}


def play(env, episodes):
    """Steps timed by kind over ``episodes`` solver episodes; the episodes' wall time."""
    user, tool, start = [], [], time.perf_counter()
    for index in range(episodes):
        obs, info = env.reset(options={"task_index": index})
        solver = env.unwrapped.reference_solver()
        done = False
        while not done:
            action = solver(obs, info)
            t = time.perf_counter()
            obs, _, terminated, truncated, info = env.step(action)
            (tool if info["tool_calls"] else user).append(time.perf_counter() - t)
            done = terminated or truncated
    return user, tool, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--llm", action="store_true", help="also time a model-played customer (eval extra)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds the loopback model waits a reply")
    args = parser.parse_args()

    import benchmax_gym  # noqa: F401

    env = gym.make("benchmax/CRM-Service-v0")
    play(env, 5)  # warm: the org loaded, the first tasks generated
    user, tool, wall = play(env, args.episodes)
    env.close()
    result = {"benchmark": "user_turns", "episodes": args.episodes, "user_step": ms(user), "tool_step": ms(tool),
              "episodes_per_s": args.episodes / wall}
    if args.llm:
        from _bench import need

        need("eval", "openai", "starlette", "uvicorn")
        from benchmax_gym.core.users import STOP
        from benchmax_gym.testing.openai_server import FakeChatServer

        def customer(body):
            system = body["messages"][0]["content"]
            facts = json.loads(system[system.index("{"):])["facts"]
            if body["messages"][-1]["content"].rstrip().endswith("?"):
                return {"content": f"My order number is {facts['order number']}. My email is {facts['email']}."}
            return {"content": f"Thanks. {STOP}"}

        with FakeChatServer(customer, latency=args.latency) as server:
            env = gym.make("benchmax/CRM-Service-v0", user="llm",
                           user_args={"model": "test-model", "base_url": server.url, "api_key": "x"})
            play(env, 2)
            user, _, wall = play(env, min(args.episodes, 50))
            env.close()
        result["llm_user_step"] = ms(user)
        result["llm_latency_s"] = args.latency
    print(json.dumps(result))


if __name__ == "__main__":
    main()
