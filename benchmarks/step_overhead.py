"""How much does the engine add to a tool call? Prints one JSON object.

Measures ``step()`` of ``benchmax/Math-v0`` (made with ``gym.make``: whatever wrappers it adds
are included - none since the ids are registered without Gymnasium's ``OrderEnforcing`` and
passive checker, which the engine's own checks replace; ``python_tool=False``, so that no sandbox - started at every reset before
this change - competes for the CPU) for an action with one calculator call, and the floor: the
same work without the engine - find the call with ``re``, decode it with ``json``, call the
calculator.

Peers, each in its own virtual environment and process, with the same calculator code (this
repository's ``calculator.py``, loaded by path) and the same action, timed the same way:

* GEM (``pip install gem-llm``): its ``ToolEnvWrapper`` around a minimal env, with a calculator
  tool written as GEM's own tools are (a regex finds the call, ``json`` decodes it);
* skyrl-gym (``pip install skyrl-gym``): a ``BaseTextEnv`` with a calculator ``ToolGroup``,
  stepping as its bundled environments do (chat history, parse, ``_execute_tool``, metadata).

Rounds are interleaved (floor, ours, ours unwrapped, each peer), each round starts a fresh
episode, and every figure is the median over all steps, with the range of the round medians.
``cpu_us`` is each loop's CPU time (``time.thread_time``, the same clock in every process) over
its steps: on a shared machine it moves less with the load than wall time, and, a mean, it
includes the garbage collector's passes over a growing transcript, which the wall medians leave
out. ``--breakdown`` adds where the step's time goes: each part's cost is the step's median minus
the median of a step with that part replaced by a constant (one process, interleaved rounds).
The defaults take about 30 s on 2 cores.

    python benchmarks/step_overhead.py [--rounds 60] [--steps 5000]
        [--gem-python PYTHON] [--skyrl-python PYTHON] [--breakdown]

A peer is measured when its interpreter is given (the flag, else ``$BENCHMAX_GEM_PYTHON`` /
``$BENCHMAX_SKYRL_PYTHON``; a path or a command such as ``python3``) or, without one, in this
interpreter when the peer's package imports here; else it is skipped, with the reason on stderr
and in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.envs.math.calculator import evaluate, format_number
from _bench import peer_python

ACTION = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3 - 4 / 2"}}\n</tool_call>'
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
CALCULATOR = Path(benchmax_gym.__file__).parent / "envs" / "math" / "calculator.py"

# Runs in the peer's own interpreter: reads a step count per line, answers with the step times (us).
PEER = r'''
import json, re, sys, time, types, importlib.util

tools = types.ModuleType("benchmax_gym.core.tools")  # all calculator.py imports from this package
class ToolError(Exception):
    def __init__(self, message, code="tool_error"):
        super().__init__(message)
        self.code = code
tools.ToolError = ToolError
for name in ("benchmax_gym", "benchmax_gym.core"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["benchmax_gym.core.tools"] = tools
spec = importlib.util.spec_from_file_location("calculator", CALCULATOR)
calculator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calculator)
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def calculate(action):
    call = json.loads(CALL.search(action).group(1))
    return calculator.format_number(calculator.evaluate(call["arguments"]["expression"]))


if PEER_NAME == "gem":
    from gem.core import Env
    from gem.tools.base_tool import BaseTool
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    class Question(Env):
        def step(self, action):
            return "", 0.0, True, False, {}

        def reset(self, seed=None):
            return "What is (12 + 7) * 3 - 4 / 2?", {}

    class CalculatorTool(BaseTool):
        tool_type = "calculator"
        name = "calculator"

        def instruction_string(self):
            return "Call the calculator as <tool_call>{...}</tool_call>."

        def execute_action(self, action):
            match = CALL.search(action)
            if not match:
                return False, True, "", action
            try:
                call = json.loads(match.group(1))
                result = calculator.format_number(calculator.evaluate(call["arguments"]["expression"]))
            except Exception as exc:
                return True, True, f"Error: {exc}", action[: match.end()]
            return True, False, f"<tool_response>\n{result}\n</tool_response>", action[: match.end()]

    def new_env():
        env = ToolEnvWrapper(Question(), tools=[CalculatorTool()], max_tool_uses=None)
        env.reset(seed=0)
        return env
else:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
    from skyrl_gym.tools.core import ToolGroup, tool

    class CalculatorGroup(ToolGroup):
        def __init__(self):
            super().__init__(name="CalculatorToolGroup")

        @tool
        def calculator(self, expression):
            return calculator.format_number(calculator.evaluate(expression))

    class CalculatorEnv(BaseTextEnv):  # as skyrl-gym's own search and SQL environments step
        def __init__(self):
            super().__init__()
            self.max_turns = 10 ** 9
            self.init_tool_groups([CalculatorGroup()])
            self.chat_history = []

        def step(self, action):
            self.turns += 1
            self.chat_history.append({"role": "assistant", "content": action})
            done = self.turns >= self.max_turns or ("<answer>" in action and "</answer>" in action)
            if done:
                return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata={})
            error, observation, query = None, None, None
            try:
                match = CALL.search(action)
                query = [json.loads(match.group(1))["arguments"]["expression"]]
                observation = self._execute_tool("CalculatorToolGroup", "calculator", query)
            except Exception as exc:
                error = str(exc)
            content = "<tool_response>\n" + observation + "\n</tool_response>" if observation else error
            new_obs = {"role": "user", "content": content}
            self.chat_history.append(new_obs)
            return BaseTextEnvStepOutput(observations=[new_obs], reward=0.0, done=False,
                                         metadata={"tool_group": "CalculatorToolGroup", "tool_name": "calculator",
                                                   "tool_input": query})

    def new_env():
        env = CalculatorEnv()
        env.init([{"role": "user", "content": "What is (12 + 7) * 3 - 4 / 2?"}])
        return env

assert calculate(ACTION) == "55"
env = new_env()
for _ in range(500):
    env.step(ACTION)
print(json.dumps({"ready": True}), flush=True)
clock = time.perf_counter_ns
for line in sys.stdin:
    if line.startswith("vector "):  # "vector N SECONDS": GEM's SyncVectorEnv of N envs, steps per second
        from gem.vector.sync_vector_env import SyncVectorEnv
        _, count, seconds = line.split()
        count = int(count)
        envs = SyncVectorEnv(["calculator"] * count, [new_env] * count)
        envs.reset(seed=0)
        actions = [ACTION] * count
        for _ in range(20):
            envs.step(actions)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < float(seconds):
            envs.step(actions)
            steps += count
        print(json.dumps(steps / (time.perf_counter() - start)), flush=True)
        continue
    timed = line.startswith("timed ")  # "timed N": {"times": [...], "cpu_us": CPU per step}
    n = int(line.split()[-1])
    env = new_env()
    out = []
    cpu = time.thread_time_ns()
    for _ in range(n):
        t = clock()
        env.step(ACTION)
        out.append((clock() - t) / 1000.0)
    cpu = (time.thread_time_ns() - cpu) / 1000.0 / n
    print(json.dumps({"times": out, "cpu_us": cpu} if timed else out), flush=True)
'''


def floor_once(action: str) -> str:
    call = json.loads(CALL.search(action).group(1))
    return format_number(evaluate(call["arguments"]["expression"]))


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_steps(fn, n: int, cpu: list[float] | None = None) -> list[float]:
    """Each step's wall time (us); the loop's CPU time per step is appended to ``cpu``."""
    out = []
    clock = time.perf_counter_ns
    start = time.thread_time_ns()
    for _ in range(n):
        t = clock()
        fn(ACTION)
        out.append((clock() - t) / 1000.0)
    if cpu is not None:
        cpu.append((time.thread_time_ns() - start) / 1000.0 / n)
    return out


class Peer:
    """A peer's stepping loop in its own interpreter."""

    def __init__(self, name: str, python: str):
        source = f"PEER_NAME = {name!r}\nCALCULATOR = {str(CALCULATOR)!r}\nACTION = {ACTION!r}\n" + PEER
        self.proc = subprocess.Popen([python, "-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{name} did not start: {self.proc.stderr.read()[-2000:]}")

    def round(self, n: int) -> list[float]:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def timed_round(self, n: int, cpu: list[float]) -> list[float]:
        """``round``, with the loop's CPU time per step appended to ``cpu``."""
        self.proc.stdin.write(f"timed {n}\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        cpu.append(answer["cpu_us"])
        return answer["times"]

    def vector_rate(self, envs: int, seconds: float) -> float:
        """Steps per second of the peer's own SyncVectorEnv over ``envs`` environments (GEM)."""
        self.proc.stdin.write(f"vector {envs} {seconds}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def summary(rounds: list[list[float]], cpu: list[float]) -> dict[str, float]:
    samples = [x for r in rounds for x in r]
    medians = [statistics.median(r) for r in rounds]
    return {"median": round(statistics.median(samples), 3), "p99": round(percentile(samples, 0.99), 3),
            "round_medians_min": round(min(medians), 3), "round_medians_max": round(max(medians), 3),
            "cpu_us": round(statistics.median(cpu), 3)}


def _defining(cls: type, attr: str) -> type:
    """The class in ``cls``'s MRO that defines ``attr`` (where a stub replaces it and is undone)."""
    return next(c for c in cls.__mro__ if attr in c.__dict__)


def breakdown(env, rounds: int, steps: int) -> dict[str, float]:
    """Each part's cost: the step's median minus the median with that part replaced by a constant."""
    from benchmax_gym.core import env as core_env
    from benchmax_gym.envs.math import tools as math_tools

    raw = env.unwrapped
    one = raw.format.one_call(ACTION)  # the step takes ToolEnv._step_one_call: these are its parts
    calculator = raw.toolset.tools["calculator"]
    assert one is not None and calculator.direct and calculator.invoke, "the benchmark's step left the fast path"
    parts = {
        "find and decode the call (one_call: markers, JSON)": [(type(raw.format), "one_call", lambda self, a: one)],
        "arguments JSON (the assistant message)": [(core_env, "dumps_arguments", lambda arguments: '{"x": "y"}')],
        "tool call (invoke: check, calculator, text)": [(calculator, "invoke", lambda *a: "55")],
        "calculator alone (evaluate, format_number)": [(math_tools, "evaluate", lambda expression: 55),
                                                       (math_tools, "format_number", lambda value: "55")],
        "observation text (render_one)": [(_defining(type(raw.format), "render_one"), "render_one", lambda self, *a: "55")],
    }
    medians: dict[str, list[float]] = {"step": [], **{k: [] for k in parts}}
    for _ in range(rounds):
        for name in medians:
            undo = []
            for owner, attr, stub in parts.get(name, ()):
                undo.append((owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)))
                setattr(owner, attr, stub)
            raw.reset(seed=0)
            medians[name].append(statistics.median(timed_steps(raw.step, steps)))
            for owner, attr, original in undo:
                setattr(owner, attr, original)
    step = statistics.median(medians["step"])
    out = {"step_unwrapped_us": round(step, 3),
           **{name: round(step - statistics.median(values), 3) for name, values in medians.items() if name != "step"}}
    out["the engine's own (the rest)"] = round(step - sum(v for k, v in out.items() if k in (
        "find and decode the call (one_call: markers, JSON)", "arguments JSON (the assistant message)",
        "tool call (invoke: check, calculator, text)", "observation text (render_one)")), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=5000, help="steps per round")
    parser.add_argument("--gem-python", help="an interpreter with gem-llm (default: $BENCHMAX_GEM_PYTHON)")
    parser.add_argument("--skyrl-python", help="an interpreter with skyrl-gym (default: $BENCHMAX_SKYRL_PYTHON)")
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args()

    peers, missing = {}, {}
    for name, flag, variable, package, given in (
            ("gem_tool_env_wrapper", "--gem-python", "BENCHMAX_GEM_PYTHON", "gem-llm", args.gem_python),
            ("skyrl_gym", "--skyrl-python", "BENCHMAX_SKYRL_PYTHON", "skyrl-gym", args.skyrl_python)):
        python, skipped = peer_python(flag, variable, package, given, "gem" if name.startswith("gem") else "skyrl_gym")
        if skipped:
            missing[name] = skipped
            print(f"{name} {skipped}", file=sys.stderr)
            continue
        try:
            peers[name] = Peer("gem" if name.startswith("gem") else "skyrl", python)
        except RuntimeError as exc:
            missing[name] = str(exc)[-500:]

    env = gym.make("benchmax/Math-v0", max_turns=10**9, python_tool=False)
    raw = env.unwrapped
    for _ in range(500):  # warm up
        floor_once(ACTION)
    env.reset(seed=0)
    timed_steps(env.step, 500)
    rounds: dict[str, list[list[float]]] = {"floor": [], "step": [], "step_unwrapped": [], **{k: [] for k in peers}}
    cpu: dict[str, list[float]] = {k: [] for k in rounds}
    for _ in range(args.rounds):
        rounds["floor"].append(timed_steps(floor_once, args.steps, cpu["floor"]))
        env.reset(seed=0)
        rounds["step"].append(timed_steps(env.step, args.steps, cpu["step"]))
        env.reset(seed=0)
        rounds["step_unwrapped"].append(timed_steps(raw.step, args.steps, cpu["step_unwrapped"]))
        for name, peer in peers.items():
            rounds[name].append(peer.timed_round(args.steps, cpu[name]))
    for peer in peers.values():
        peer.close()

    result = {"benchmark": "step_overhead", "python": platform.python_version(), "cpu_count": os.cpu_count(),
              "rounds": args.rounds, "steps_per_round": args.steps,
              **{f"{k}_us": summary(v, cpu[k]) for k, v in rounds.items()}}
    floor = result["floor_us"]
    for ours in ("step", "step_unwrapped"):  # each ratio of medians, and of CPU per step
        for name, theirs in (("floor", floor), *((name, result[f"{name}_us"]) for name in peers)):
            result[f"{ours}_to_{name}_ratio"] = round(result[f"{ours}_us"]["median"] / theirs["median"], 3)
            result[f"{ours}_to_{name}_cpu_ratio"] = round(result[f"{ours}_us"]["cpu_us"] / theirs["cpu_us"], 3)
    if missing:
        result["peers_not_measured"] = missing
    if args.breakdown:
        result["breakdown_us"] = breakdown(env, args.rounds, args.steps)
        result["breakdown_us"]["gymnasium's wrappers (step - step_unwrapped)"] = round(
            result["step_us"]["median"] - result["step_unwrapped_us"]["median"], 3)
    env.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
