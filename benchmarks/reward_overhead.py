"""What do per-turn rewards cost a step? Prints one JSON object.

Times ``step()`` of ``benchmax/Math-v0`` (``gym.make``, so Gymnasium's default wrappers are in;
``python_tool=False``) for an action with one calculator call, mid-episode, three ways:

* ``final_only``: today's rubric (scored once, at the end: a mid-episode step scores nothing);
* ``dense``: ``dense_rewards=True``, Math's dense signal (a per-turn ``milestones`` component
  that reads the step's calculator result against the solution's intermediate values);
* ``per_turn_noop``: a per-turn component that returns 0 at once: the engine's own cost of
  scoring a turn (context, the scoring loop, ``info["reward_components"]``).

Also the final step (a ``\\boxed{}`` answer, graded by the rubric) with and without the dense
component, each on a fresh episode after one calculator step.

Rounds are interleaved, each starts a fresh episode, figures are medians over all steps with the
range of the round medians. The target (issue 30): dense rewards add at most 10% to a step.

    python benchmarks/reward_overhead.py [--rounds 10] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import gymnasium as gym

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.core.rubric import RewardFn, Rubric

ACTION = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3 - 4 / 2"}}\n</tool_call>'


def timed_steps(env, n: int) -> list[float]:
    out, step, clock = [], env.step, time.perf_counter_ns
    for _ in range(n):
        t = clock()
        step(ACTION)
        out.append((clock() - t) / 1000.0)
    return out


def timed_finals(env, n: int) -> list[float]:
    """The grading step of ``n`` fresh episodes, each after one calculator step."""
    out, clock = [], time.perf_counter_ns
    for i in range(n):
        env.reset(seed=i % 50)
        env.step(ACTION)
        answer = f"\\boxed{{{env.unwrapped.episode.task.answer}}}"
        t = clock()
        env.step(answer)
        out.append((clock() - t) / 1000.0)
    return out


def summary(rounds: list[list[float]]) -> dict[str, float]:
    samples = sorted(x for r in rounds for x in r)
    medians = [statistics.median(r) for r in rounds]
    return {"median": round(statistics.median(samples), 3), "p99": round(samples[min(len(samples) - 1, int(0.99 * len(samples)))], 3),
            "round_medians_min": round(min(medians), 3), "round_medians_max": round(max(medians), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=2000, help="steps per round")
    parser.add_argument("--finals", type=int, default=200, help="graded final steps per round")
    args = parser.parse_args()

    envs = {
        "final_only": gym.make("benchmax/Math-v0", max_turns=10**9, python_tool=False),
        "dense": gym.make("benchmax/Math-v0", max_turns=10**9, python_tool=False, dense_rewards=True),
        "per_turn_noop": gym.make("benchmax/Math-v0", max_turns=10**9, python_tool=False),
    }
    noop = envs["per_turn_noop"].unwrapped
    noop.rubric = Rubric([*noop.rubric.children, RewardFn("noop", lambda: 0.0, per_turn=True)])
    for env in envs.values():  # warm up
        env.reset(seed=0)
        timed_steps(env, 500)
    rounds: dict[str, list[list[float]]] = {name: [] for name in envs}
    finals: dict[str, list[list[float]]] = {"final_only": [], "dense": []}
    for _ in range(args.rounds):
        for name, env in envs.items():
            env.reset(seed=0)
            rounds[name].append(timed_steps(env, args.steps))
        for name in finals:
            finals[name].append(timed_finals(envs[name], args.finals))
    for env in envs.values():
        env.close()

    result = {"benchmark": "reward_overhead", "python": platform.python_version(), "rounds": args.rounds,
              "steps_per_round": args.steps, "finals_per_round": args.finals,
              **{f"step_{k}_us": summary(v) for k, v in rounds.items()},
              **{f"final_step_{k}_us": summary(v) for k, v in finals.items()}}
    base = result["step_final_only_us"]["median"]
    result["dense_step_overhead"] = round(result["step_dense_us"]["median"] / base - 1, 4)
    result["per_turn_noop_step_overhead"] = round(result["step_per_turn_noop_us"]["median"] / base - 1, 4)
    result["dense_final_step_overhead"] = round(
        result["final_step_dense_us"]["median"] / result["final_step_final_only_us"]["median"] - 1, 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
