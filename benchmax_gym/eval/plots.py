"""PNGs of a run (per-task scores, the pass@k curve, the reward distribution) and of a comparison.

matplotlib is in the ``plots`` extra (``pip install 'benchmax-gym[plots]'``); it is imported here
only, with the Agg backend, so nothing needs a display.
"""

from __future__ import annotations

import importlib.util
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def plots_available() -> bool:
    """Whether matplotlib (the ``plots`` extra) is installed, without importing it."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'benchmax-gym[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Render to memory, then replace ``path`` through an exclusive temporary file: a symlink
    planted at ``path`` is replaced, never written through."""
    import io

    from benchmax_gym.eval.runner import _replace_file

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    plt.close(fig)
    _replace_file(path.parent, path.name, buffer.getvalue())
    return path


def run_title(run: Mapping[str, Any] | None) -> str:
    """``env id - model`` (or the baseline's name) of a run record: what a plot's title names."""
    if not run:
        return ""
    policy = run.get("policy") or {}
    who = policy.get("model") or policy.get("name") or policy.get("kind") or "?"
    return f"{run.get('env_id', '?')} - {who}"


def plot_run(records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], out_dir: str | os.PathLike,
             run: Mapping[str, Any] | None = None) -> list[Path]:
    """``per_task.png`` (mean reward per task, sorted), ``pass_at_k.png`` and ``rewards.png``; titles
    name the env and model of ``run`` (the run record). Failed episodes (no reward) are left out."""
    plt = _pyplot()
    out = Path(out_dir)
    label = run_title(run)
    suffix = f"\n{label}" if label else ""
    records = [r for r in records if r.get("reward") is not None]
    per_task: dict[str, list[float]] = defaultdict(list)
    for r in records:
        per_task[str(r["task_id"])].append(float(r["reward"]))
    means = sorted(sum(v) / len(v) for v in per_task.values())
    written = []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(range(len(means)), means, width=1.0, color="#4C72B0")
    ax.set(xlabel=f"task (sorted; {len(means)} tasks)", ylabel="mean reward", title="Reward per task" + suffix)
    written.append(_save(plt, fig, out / "per_task.png"))
    ks = [int(k) for k in summary.get("pass_at_k", {})]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ks, [summary["pass_at_k"][str(k)] for k in ks], marker="o")
    ax.set(xlabel="k", ylabel="pass@k", ylim=(0, 1.02), title="pass@k" + suffix, xticks=ks)
    written.append(_save(plt, fig, out / "pass_at_k.png"))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.hist([float(r["reward"]) for r in records], bins=20, color="#55A868")
    ax.set(xlabel="episode reward", ylabel="episodes", title="Reward distribution" + suffix)
    written.append(_save(plt, fig, out / "rewards.png"))
    return written


def plot_compare(result: Mapping[str, Any], out_dir: str | os.PathLike,
                 runs: Mapping[str, Mapping[str, Any]] | None = None) -> list[Path]:
    """``compare.png``: each run's mean reward per shared task (tasks sorted by the baseline);
    ``runs`` (name -> run record) puts each run's env and model in the legend and title."""
    plt = _pyplot()
    runs = runs or {}
    rows = sorted(result["per_task"], key=lambda row: row[result["baseline"]])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name in result["runs"]:
        label = f"{name} ({run_title(runs[name])})" if name in runs else name
        ax.plot(range(len(rows)), [row[name] for row in rows], marker=".", linestyle="none", label=label)
    envs = sorted({str(run.get("env_id")) for run in runs.values()})
    title = "Runs per task" + (f"\n{', '.join(envs)}" if envs else "")
    ax.set(xlabel="shared task (sorted by the baseline)", ylabel="mean reward", title=title)
    ax.legend()
    return [_save(plt, fig, Path(out_dir) / "compare.png")]
