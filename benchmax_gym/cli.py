"""The ``benchmax-gym`` command: list environments and play episodes with a built-in policy.

    benchmax-gym list
    benchmax-gym doctor
    benchmax-gym run benchmax/Math-v0 --policy solver --episodes 20
    benchmax-gym run benchmax/Math-v0 --policy random --episodes 5 --seed 1 --jsonl out.jsonl
    benchmax-gym run benchmax/Math-v0 --env-arg tasks=gsm8k --env-arg dataset=train.jsonl
    benchmax-gym mcp-serve benchmax/Excel-v0 --transport http --port 8000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import gymnasium as gym


def _parse_env_args(pairs: list[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env-arg expects KEY=VALUE, got {pair!r}")
        try:
            kwargs[key] = json.loads(raw)
        except ValueError:
            kwargs[key] = raw
    return kwargs


def cmd_list(args: argparse.Namespace) -> int:
    from benchmax_gym import registry

    ids = registry.env_ids()
    width = max(len(i) for i in ids)
    for env_id in ids:
        print(f"{env_id:<{width}}  {registry.describe(env_id)}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """What this machine gives benchmax-gym: versions, and the isolation level for model code."""
    import os
    import platform
    from importlib import metadata

    from benchmax_gym import registry
    from benchmax_gym.core.sandbox import BUBBLEWRAP, bubblewrap_status, resolve_level

    rows = [("python", f"{platform.python_version()} ({sys.executable})")]
    for dist in ("benchmax-gym", "gymnasium", "numpy", "datasets", "math-verify", "mcp", "openpyxl"):
        try:
            rows.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            rows.append((dist, "not installed"))
    level = resolve_level("auto")
    ok, detail = bubblewrap_status()
    if level == BUBBLEWRAP:
        who = ("root: each sandbox runs its code as its own unprivileged uid" if os.geteuid() == 0
               else "unprivileged: user namespace; the process limit counts all of this user's processes")
        sandbox = f"{level} ({detail}); {who}"
    else:
        sandbox = (f"{level}: {detail}. Tools that run model code are left out; install bubblewrap, "
                   "or opt in to resource limits only with sandbox='rlimits'")
    rows.append(("sandbox", sandbox))
    rows.append(("environments", ", ".join(registry.env_ids())))
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


def play(env: gym.Env, policy: str, episodes: int, seed: int, progress: bool = True) -> list[dict[str, Any]]:
    """Play ``episodes`` episodes; episode ``i`` is reset with seed ``seed + i``."""
    from tqdm import tqdm

    base = env.unwrapped
    if policy == "solver":
        act = base.reference_solver()
    else:
        env.action_space.seed(seed)

        def act(obs, info):
            return env.action_space.sample()

    results = []
    for i in tqdm(range(episodes), desc=env.spec.id if env.spec else "episodes", disable=not progress, unit="ep"):
        start = time.perf_counter()
        obs, info = env.reset(seed=seed + i)
        reward, terminated, truncated = 0.0, False, False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step(act(obs, info))
        results.append({
            "task_id": base.episode.task.id,
            "reward": reward,
            "terminated": terminated,
            "turns": base.episode.turn,
            "tool_errors": base.episode.tool_errors,
            "seconds": time.perf_counter() - start,
        })
    return results


def summarize(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    rewards = [r["reward"] for r in results]
    return {
        "episodes": len(results),
        "mean_reward": statistics.fmean(rewards),
        "success_rate": sum(r >= 1.0 for r in rewards) / len(rewards),
        "mean_turns": statistics.fmean(r["turns"] for r in results),
        "tool_errors": sum(r["tool_errors"] for r in results),
        "wall_seconds": wall,
        "episodes_per_second": len(results) / wall if wall > 0 else float("inf"),
    }


def cmd_run(args: argparse.Namespace) -> int:
    import benchmax_gym  # noqa: F401  (registers the ids)
    from benchmax_gym.wrappers import RecordEpisodes

    if args.episodes <= 0:
        raise SystemExit("--episodes must be a positive number")
    try:
        env = gym.make(args.env_id, **_parse_env_args(args.env_arg))
    except gym.error.Error as exc:
        raise SystemExit(f"{exc}\nRun `benchmax-gym list` for the available ids.") from None
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"cannot make {args.env_id}: {exc}") from None
    if args.jsonl:
        env = RecordEpisodes(env, args.jsonl)
    try:
        start = time.perf_counter()
        results = play(env, args.policy, args.episodes, args.seed, progress=not args.quiet)
        summary = summarize(results, time.perf_counter() - start)
    finally:
        env.close()
    summary = {"env_id": args.env_id, "policy": args.policy, **summary}
    if args.json:
        print(json.dumps(summary))
    else:
        rows = [
            ("environment", args.env_id),
            ("policy", args.policy),
            ("episodes", summary["episodes"]),
            ("mean reward", f"{summary['mean_reward']:.3f}"),
            ("success rate", f"{summary['success_rate']:.1%}"),
            ("mean turns", f"{summary['mean_turns']:.2f}"),
            ("tool errors", summary["tool_errors"]),
            ("wall time", f"{summary['wall_seconds']:.2f} s ({summary['episodes_per_second']:.1f} episodes/s)"),
        ]
        width = max(len(k) for k, _ in rows)
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
        if args.jsonl:
            print(f"{'episodes written to':<{width}}  {args.jsonl}")
    return 0


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    from benchmax_gym.envs.mcp.serve import serve

    if args.max_sessions < 1:
        raise SystemExit(f"--max-sessions must be at least 1, got {args.max_sessions}")
    if not 0 < args.idle_timeout < float("inf"):
        raise SystemExit(f"--idle-timeout must be a positive number of seconds, got {args.idle_timeout:g}")
    try:
        serve(args.env_id, args.transport, host=args.host, port=args.port,
              env_kwargs=_parse_env_args(args.env_arg), seed=args.seed, idle_timeout=args.idle_timeout,
              max_sessions=args.max_sessions, auth_token=args.auth_token)
    except gym.error.Error as exc:
        raise SystemExit(f"{exc}\nRun `benchmax-gym list` for the available ids.") from None
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmax-gym", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the registered environments").set_defaults(func=cmd_list)
    sub.add_parser("doctor", help="versions, and the sandbox level for model code on this machine").set_defaults(
        func=cmd_doctor)
    run = sub.add_parser("run", help="play episodes with a built-in policy and print a summary")
    run.add_argument("env_id", help="an id from `benchmax-gym list`, e.g. benchmax/Math-v0")
    run.add_argument("--policy", choices=("solver", "random"), default="solver",
                     help="solver: the reference solver (reads the solution); random: random text actions")
    run.add_argument("--episodes", type=int, default=10)
    run.add_argument("--seed", type=int, default=0, help="episode i is reset with seed SEED+i")
    run.add_argument("--jsonl", help="write each episode's messages and rewards to this JSON Lines file")
    run.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for gym.make (VALUE parsed as JSON when it can be)")
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)
    mcp = sub.add_parser("mcp-serve", help="serve an environment's tools as an MCP server (one workspace per session)")
    mcp.add_argument("env_id", help="an id from `benchmax-gym list`")
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="http: the address to listen on (loopback by default)")
    mcp.add_argument("--port", type=int, default=8000, help="http: the port (0: any free one; the URL is printed)")
    mcp.add_argument("--idle-timeout", type=float, default=600.0, metavar="SECONDS",
                     help="http: a session with no request in flight this long is closed with its environment")
    mcp.add_argument("--max-sessions", type=int, default=64,
                     help="http: sessions open at once; one more gets HTTP 503 until one ends")
    mcp.add_argument("--auth-token", default=None,
                     help="http: require 'Authorization: Bearer TOKEN' (401 without it); "
                          "prefer the BENCHMAX_GYM_MCP_TOKEN variable, which `ps` does not show")
    mcp.add_argument("--seed", type=int, default=0, help="each session's environment is reset with this seed")
    mcp.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument for gym.make (VALUE parsed as JSON when it can be)")
    mcp.set_defaults(func=cmd_mcp_serve)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
