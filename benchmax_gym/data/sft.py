"""SFT data out: ``benchmax-gym export-sft RUN`` writes the scored, successful episodes of a run as
chat JSON Lines that TRL's ``SFTTrainer`` reads (``datasets.load_dataset("json", ...)``).

Each line is ``{"messages": [...], "tools": "<JSON list of the env's tool schemas>", "task_id",
"reward"}``: ``messages`` the whole transcript as ``chat_messages("hf")`` gives it (assistant
``tool_calls`` with ``arguments`` as objects, which templates such as Qwen2.5's ``tojson``;
tool results with their ``name``), ``tools`` a JSON string, as TRL accepts it (one type for every
row: tools of different shapes never meet in one Arrow column). A run is an eval run directory
(``run.json`` + ``rollouts.jsonl``: its env and ``env_kwargs`` give the tools) or a ``run --jsonl``
file (its records' ``env_id``); ``env_id=`` names the env of a run that does not name it (one that
names another is refused), ``env_kwargs=`` override the run's.

Kept: episodes whose outcome is ``scored`` (not truncated, not a failure) and that succeeded:
eval's ``success`` (full reward), else ``reward >= 1``; ``min_reward`` sets another bar.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from benchmax_gym.core.outcomes import SCORED


def _hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The transcript in the shape chat templates read; None when it is not a list of chat
    messages (a hand-edited or foreign log: left out and counted, never a crash)."""
    def shaped(m: Any) -> bool:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        return isinstance(m, dict) and (not calls or isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function") or {}, dict) for c in calls))

    if not all(shaped(m) for m in messages):
        return None
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                function = dict(c.get("function") or {})
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except (ValueError, RecursionError):  # kept as text, as chat_messages("hf") keeps it
                        pass
                calls.append({"type": "function", "function": function, **({"id": c["id"]} if c.get("id") else {})})
            m["tool_calls"] = calls
        out.append(m)
    return out


def read_run(run: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(run info, records)`` of an eval run directory or a ``run --jsonl`` file."""
    path = Path(run)
    if path.is_dir():
        from benchmax_gym.eval import load_run

        return load_run(path)
    if not path.is_file():
        raise FileNotFoundError(f"RUN {str(run)!r}: no such run directory or JSON Lines file")
    from benchmax_gym.data import read_jsonl

    records = read_jsonl(path, "RUN")
    ids = {r.get("env_id") for r in records if isinstance(r, dict)}
    return {"env_id": ids.pop() if len(ids) == 1 else None, "env_kwargs": {}}, records


def _registered(env_id: str) -> bool:
    import gymnasium as gym

    import benchmax_gym  # noqa: F401  (registers the ids)

    return env_id in gym.registry


def tool_schemas(env_id: str, env_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """The env's tool schemas (after a reset: an MCP env learns its tools from its server)."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401  (registers the ids)

    env = gym.make(env_id, **env_kwargs)
    try:
        base = env.unwrapped
        if not len(base.toolset):
            env.reset(seed=0)
        return list(base.tool_schemas)
    finally:
        env.close()


def export_sft(run: str | os.PathLike, *, min_reward: float | None = None, env_id: str | None = None,
               env_kwargs: dict[str, Any] | None = None, tools: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(rows, summary)``: the run's successful scored episodes as SFT rows (see the module
    docstring), and how many episodes each rule left out. ``tools=False``: no ``tools`` column
    (the env's system prompt already describes the tools in text, as in its episodes, and a
    template given ``tools`` would describe them a second time)."""
    info, records = read_run(run)
    recorded = info.get("env_id")
    # (a Math run was written with Wikipedia's tool schemas; an unknown id is gym.make's error below,
    # which names the registered id it is close to)
    if env_id and recorded and env_id != recorded and _registered(env_id):
        raise ValueError(f"--env {env_id}: RUN {str(run)!r} is a run of {recorded}, whose tools its transcripts "
                         "call; leave --env out (it is for a run that does not name its env)")
    env_id = env_id or recorded
    if not env_id and tools:
        raise ValueError(f"RUN {str(run)!r} does not name its env (records of several or none): pass --env ENV_ID")
    kwargs = info.get("env_kwargs") or {} if env_kwargs is None else env_kwargs
    schemas = json.dumps(tool_schemas(env_id, dict(kwargs)), ensure_ascii=False) if tools else None
    rows, left_out = [], Counter()
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            left_out["no transcript"] += 1
            continue
        outcome = record.get("outcome") or ("truncated" if record.get("truncated") else SCORED)
        reward = record.get("reward")
        if outcome != SCORED:
            left_out[f"outcome {outcome}"] += 1
            continue
        if min_reward is not None:
            good = isinstance(reward, (int, float)) and reward >= min_reward
        else:
            good = record["success"] if isinstance(record.get("success"), bool) else (
                isinstance(reward, (int, float)) and reward >= 1.0)
        if not good:
            left_out["not successful"] += 1
            continue
        messages = _hf_messages(record["messages"])
        if messages is None:
            left_out["malformed transcript"] += 1
            continue
        if not messages or messages[-1].get("role") != "assistant":
            left_out["does not end with the model's reply"] += 1
            continue
        row = {"messages": messages, "task_id": record.get("task_id"), "reward": reward}
        if schemas is not None:
            row["tools"] = schemas
        rows.append(row)
    summary = {"episodes": len(records), "exported": len(rows), "left_out": dict(left_out), "env_id": env_id}
    return rows, summary
