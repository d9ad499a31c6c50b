"""The benchmark scripts on the base install: extras blocked, each starts (``--help``) or says in
one line which extra it needs; peers' interpreters come only from flags or variables."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# top-level modules of the extras (and of the test extra): what a base install lacks
NOT_IN_BASE = ["psutil", "ray", "openai", "openenv", "trl", "transformers", "tokenizers", "torch", "matplotlib",
               "skyrl_gym", "verl", "openrlhf", "sky", "gem"]
NEEDS = {"remote_throughput.py": "ray", "openenv_overhead.py": "openenv", "eval_throughput.py": "eval",
         "adapter_overhead.py": "trl"}
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_") and p.name != "parse_hostile.py")


def _run_on_base(script: str, *args: str, env=None) -> subprocess.CompletedProcess:
    code = ("import runpy, sys\n"
            f"for name in {NOT_IN_BASE!r}: sys.modules[name] = None\n"
            f"sys.path.insert(0, {str(BENCHMARKS)!r}); sys.argv = [{script!r}, *sys.argv[1:]]\n"
            f"runpy.run_path({str(BENCHMARKS / script)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_starts_on_the_base_install_or_names_its_extra(script):
    out = _run_on_base(script, "--help")
    assert "Traceback" not in out.stderr, out.stderr
    if script in NEEDS:
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert lines[0].startswith(f"{script}: needs ")
        assert lines[0].endswith(f"pip install 'benchmax-gym[{NEEDS[script]}]'")
    else:
        assert out.returncode == 0 and "usage:" in out.stdout


def test_process_memory_and_children_come_from_proc():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from _bench import alive, descendants, memory
    finally:
        sys.path.remove(str(BENCHMARKS))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in descendants() and alive(child.pid)
        mine = memory()
        assert mine["pss"] > 0 and mine["rss"] >= mine["pss"]
    finally:
        child.kill()
        child.wait()
    assert child.pid not in descendants() and memory(child.pid) is None


def test_peers_without_an_interpreter_are_skipped_with_the_flag_named():
    env = {k: v for k, v in os.environ.items() if k not in ("BENCHMAX_GEM_PYTHON", "BENCHMAX_SKYRL_PYTHON")}
    out = _run_on_base("step_overhead.py", "--rounds", "1", "--steps", "5", env=env)
    assert out.returncode == 0, out.stderr
    missing = json.loads(out.stdout)["peers_not_measured"]
    assert "pass --gem-python PYTHON (or set BENCHMAX_GEM_PYTHON)" in missing["gem_tool_env_wrapper"]
    assert "pass --skyrl-python PYTHON (or set BENCHMAX_SKYRL_PYTHON)" in missing["skyrl_gym"]
    assert "--gem-python" in out.stderr and "--skyrl-python" in out.stderr
    named = _run_on_base("step_overhead.py", "--rounds", "1", "--steps", "5",
                         env={**env, "BENCHMAX_GEM_PYTHON": "/nonexistent/python"})
    missing = json.loads(named.stdout)["peers_not_measured"]
    assert "no interpreter at /nonexistent/python" in missing["gem_tool_env_wrapper"]


def test_reward_overhead_runs_briefly_and_prints_its_figures():
    out = _run_on_base("reward_overhead.py", "--rounds", "1", "--steps", "5", "--finals", "2")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["benchmark"] == "reward_overhead"
    for key in ("step_final_only_us", "step_dense_us", "step_per_turn_noop_us", "final_step_final_only_us",
                "final_step_dense_us"):
        assert result[key]["median"] > 0
    assert {"dense_step_overhead", "per_turn_noop_step_overhead", "dense_final_step_overhead"} <= set(result)
