"""A run directory is not trusted (issue #27 item 10): on resume, eval never writes through a
planted symlink, never blocks on a FIFO, never reads a device, and refuses records of pairs the
run does not have or has twice (counted, they would skew the summary)."""

import json
import os
import threading

import pytest

from benchmax_gym.eval import EvalError, evaluate, load_run

ENV = "benchmax/Math-v0"
ENV_KWARGS = {"python_tool": False}
RUN = {"env_kwargs": ENV_KWARGS, "tasks": 3, "k": 1}


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "run"
    evaluate(ENV, "solver", out=out, plots=True, **RUN)
    return out


def within(seconds, fn):
    """``fn()``'s outcome, or a failure if it blocks (a FIFO read would block forever)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.parametrize("name", ["rollouts.jsonl", "run.json"])
def test_a_symlinked_file_is_refused_and_its_target_untouched(run_dir, tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.replace(run_dir / name, tmp_path / "moved")
    os.symlink(victim, run_dir / name)
    with pytest.raises(EvalError, match=f"{name} refused"):
        evaluate(ENV, "solver", out=run_dir, **RUN)
    assert victim.read_text() == "precious\n"


def test_planted_temporaries_and_plots_are_replaced_not_written_through(run_dir, tmp_path):
    victims = {}
    for name in (".run.json.tmp", ".summary.json.tmp", "per_task.png", "rewards.png", "pass_at_k.png"):
        victim = tmp_path / f"victim-{name.strip('.')}"
        victim.write_text("precious\n")
        (run_dir / name).unlink(missing_ok=True)
        os.symlink(victim, run_dir / name)
        victims[name] = victim
    (run_dir / "rollouts.jsonl").write_text("".join((run_dir / "rollouts.jsonl").read_text().splitlines(True)[:2]))
    evaluate(ENV, "solver", out=run_dir, plots=True, **RUN)
    for name, victim in victims.items():
        assert victim.read_text() == "precious\n", name
    assert not (run_dir / "per_task.png").is_symlink()
    assert (run_dir / "per_task.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("name", ["rollouts.jsonl", "run.json"])
def test_a_fifo_does_not_block(run_dir, name):
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    with pytest.raises(EvalError, match="not a regular file|refused"):
        within(60, lambda: evaluate(ENV, "solver", out=run_dir, **RUN))
    with pytest.raises(EvalError):
        within(60, lambda: load_run(run_dir))


def test_a_device_is_not_read(run_dir):
    (run_dir / "rollouts.jsonl").unlink()
    os.symlink("/dev/zero", run_dir / "rollouts.jsonl")
    with pytest.raises(EvalError, match="refused"):
        within(60, lambda: evaluate(ENV, "solver", out=run_dir, **RUN))


def test_foreign_duplicate_and_mistyped_records_are_refused(run_dir):
    lines = (run_dir / "rollouts.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    cases = {
        "not a pair of this run": json.dumps({**first, "task_index": 999}),
        "repeats task 0 sample 0": lines[0],
        "reward is 'x', not a number": json.dumps({**first, "sample": 0, "task_index": 1, "reward": "x"}),
    }
    for says, extra in cases.items():
        body = [extra, *lines] if "repeats" not in says else [*lines, extra]
        (run_dir / "rollouts.jsonl").write_text("\n".join(body) + "\n")
        with pytest.raises(EvalError, match=says):
            evaluate(ENV, "solver", out=run_dir, **RUN)
    (run_dir / "rollouts.jsonl").write_text("\n".join([*lines, lines[0]]) + "\n")
    with pytest.raises(EvalError, match="repeats"):
        load_run(run_dir)  # compare refuses it too
