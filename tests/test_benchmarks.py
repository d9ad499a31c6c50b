"""The benchmark scripts on the base install: extras blocked, each starts (``--help``) or says in
one line which extra it needs; peers' interpreters come from flags or variables (else this
interpreter, when the peer imports here)."""

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
         "adapter_overhead.py": "trl", "chaos.py": "trl",
         "reward_group_judge.py": "eval", "learning.py": "trl"}
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


def test_the_mixture_benchmark_reports_shares_overhead_and_the_curriculum():
    out = _run_on_base("mixture.py", "--quick")
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    stratified = figures["shares"]["stratified"]
    assert stratified["windows"] > 0 and set(stratified["overall_shares"]) == {"a", "b", "c"}
    assert {"member_step_us", "mix_step_us", "overhead_pct"} <= set(figures["step_overhead"])
    for run in ("controller", "uniform_difficulty"):
        assert 0 <= figures["curriculum"][run]["zero_variance_group_share"] <= 1


def test_corpus_tasks_reports_candidates_filters_and_time_per_thousand_documents():
    out = _run_on_base("corpus_tasks.py", "--documents", "40")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for corpus in ("sample_corpus", "encyclopedia_corpus"):
        summary = result[corpus]
        assert summary["candidates"]["total"] >= summary["kept"] > 0
        assert [f["filter"] for f in summary["filters"]] == ["answer_in_support", "question_free_of_answer", "unique"]
        assert summary["seconds_per_1000_documents"] > 0
    assert result["encyclopedia_corpus"]["documents"] == 40


def test_reward_group_judge_runs_briefly_and_prints_its_figures():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "reward_group_judge.py"), "--tasks", "2", "--k", "4",
                          "--judgments", "32", "--concurrency", "8", "--latency", "0.01"],
                         capture_output=True, text=True, timeout=120, cwd=BENCHMARKS,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(BENCHMARKS.parent), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["group"]["episodes"] == 8 and figures["group"]["group_rubric_us_per_episode"] > 0
    assert figures["judge"]["calls"] == 32 and figures["judge"]["rescore_calls"] == 0
    assert figures["judge"]["fraction_of_ideal"] > 0 and figures["judge"]["sdk_floor"]["calls_per_s"] > 0


def test_chaos_accounts_for_every_episode_and_loses_only_the_faulted_ones():
    """A short chaos run (issue 29): every episode has one result, each injected fault the
    outcome it must give, every scored episode the clean run's result, no failure a reward."""
    out = subprocess.run([sys.executable, str(BENCHMARKS / "chaos.py"), "--episodes", "60", "--kill", "0.1",
                          "--tool-timeouts", "0.05", "--model-errors", "0.05", "--batch", "12"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for path in ("subproc_vector_env", "trl_rollout"):
        result = report[path]
        assert result["accounted_for"] and result["episodes_with_a_result"] == 60
        assert result["as_expected"] == result["expected_failures"] >= sum(result["injected"].values()) == 12
        assert result["scored_equal_to_clean"] and result["failed_with_a_reward"] == 0
        assert sum(result["outcomes"].values()) == 60 and result["outcomes"]["scored"] >= 48


def test_user_turns_runs_briefly_and_prints_its_json():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "user_turns.py"), "--episodes", "3", "--llm"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["user_step"]["n"] >= 3 and result["llm_user_step"]["n"] >= 3 and result["episodes_per_s"] > 0


def test_reward_overhead_runs_briefly_and_prints_its_figures():
    out = _run_on_base("reward_overhead.py", "--rounds", "1", "--steps", "5", "--finals", "2")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["benchmark"] == "reward_overhead"
    for key in ("step_final_only_us", "step_dense_us", "step_per_turn_noop_us", "final_step_final_only_us",
                "final_step_dense_us"):
        assert result[key]["median"] > 0
    assert {"dense_step_overhead", "per_turn_noop_step_overhead", "dense_final_step_overhead"} <= set(result)


def test_vector_throughput_prints_the_parents_cpu_per_step_over_a_worker_sweep():
    out = _run_on_base("vector_throughput.py", "--sections", "parent", "--parent-envs", "8,40", "--sweep", "1,2,64",
                       "--rounds", "1", "--seconds", "0.2")
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["cpu_count"] == os.cpu_count()
    for size, default in (("8", 1), ("40", min(2, os.cpu_count()))):  # one worker per 16 envs at most
        entry = figures["parent_lockstep"][size]
        sweep = entry["by_workers"]
        assert set(sweep) == {"1", "2"} & {str(w) for w in range(1, os.cpu_count() + 1)}  # capped by the machine
        assert entry["default_workers"] == default
        for mode in ("info_keys", "full_infos"):
            assert sweep["1"][mode]["parent_cpu_us_per_step"] > 0 and sweep["1"][mode]["steps_per_s"] > 0
            assert entry[f"default_{mode}_over_gym_sync"] > 0
        assert entry["gym_sync"]["steps_per_s"] > 0
    assert "cheap_tool_steps_per_s" not in figures and "memory" not in figures  # only the sections asked for


def test_run_all_gathers_each_scripts_json_in_one_file(tmp_path):
    out = tmp_path / "results.jsonl"
    done = _run_on_base("run_all.py", "--only", "parse_hostile", "--out", str(out))
    assert done.returncode == 0, done.stderr
    [line] = map(json.loads, out.read_text().splitlines())
    assert line["script"] == "parse_hostile.py" and line["cpu_count"] == os.cpu_count()
    assert isinstance(line["result"], dict) and line["result"], line
    unknown = _run_on_base("run_all.py", "--only", "no_such_bench", "--out", str(out))
    assert unknown.returncode == 2 and "no benchmark ['no_such_bench.py']" in unknown.stderr


def test_step_overhead_reports_cpu_time_the_core_count_and_the_peer_side_by_side():
    """Each figure carries its CPU time per step; a peer (skyrl-gym, from the flag's interpreter)
    gets its figures and the ratios to it, wrapped and unwrapped; the core count is printed."""
    pytest.importorskip("skyrl_gym")
    out = _run_on_base("step_overhead.py", "--rounds", "2", "--steps", "20", "--skyrl-python", sys.executable)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["cpu_count"] == os.cpu_count()
    for figure in ("floor_us", "step_us", "step_unwrapped_us", "skyrl_gym_us"):
        assert result[figure]["median"] > 0 and result[figure]["cpu_us"] > 0, figure
    for ours in ("step", "step_unwrapped"):
        for theirs in ("floor", "skyrl_gym"):
            assert result[f"{ours}_to_{theirs}_ratio"] > 0 and result[f"{ours}_to_{theirs}_cpu_ratio"] > 0


def test_step_overhead_breakdown_names_each_part_of_the_fast_step():
    """``--breakdown`` stubs each part of the fast step in turn (the names it stubs must still be
    there: a refactor that moves one breaks this, not a measurement on a bigger machine)."""
    out = _run_on_base("step_overhead.py", "--rounds", "1", "--steps", "20", "--breakdown")
    assert out.returncode == 0, out.stderr[-2000:]
    parts = json.loads(out.stdout)["breakdown_us"]
    assert {"find and decode the call (one_call: markers, JSON)", "arguments JSON (the assistant message)",
            "tool call (invoke: check, calculator, text)", "calculator alone (evaluate, format_number)",
            "observation text (render_one)", "the engine's own (the rest)"} <= set(parts)
    assert parts["step_unwrapped_us"] > 0


def test_eval_throughput_prints_cpu_per_call_for_each_transport_and_worker_count():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "eval_throughput.py"), "--concurrency", "4",
                          "--workers", "1", "2", "64", "--transports", "lean", "sdk", "--episodes-per-slot", "1", "2",
                          "--server-processes", "2", "--latency", "0.01"],
                         capture_output=True, text=True, timeout=300, cwd=BENCHMARKS,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(BENCHMARKS.parent), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout)
    assert figures["cpu_count"] == os.cpu_count() and figures["server_processes"] == 2
    assert figures["env_cpu_ms_per_call"] > 0
    assert set(figures["client_alone"]["4"]) == {"lean", "sdk"}
    workers = [w for w in (1, 2) if w <= os.cpu_count()]  # 64 is past any test machine: left out
    assert [(r["transport"], r["workers"]) for r in figures["runs"]] == [(t, w) for t in ("lean", "sdk") for w in workers]
    for run in figures["runs"]:
        assert run["model_calls"] == 16 and run["harness_cpu_ms_per_call"] > 0
        assert run["server_cpu_ms_per_call"] >= 0  # (in clock ticks: 16 calls may take under one)
        assert 0 < run["fraction_of_ideal"] <= 1.5


# (the smallest run with every stage: this checks the parent's report, not learning; each seed's
# process still spends ~7 CPU-s importing torch, transformers and TRL)
LEARN_TOY = ["--train-tasks", "16", "--eval-tasks", "8", "--vocab", "300", "--hidden", "16", "--layers", "1",
             "--heads", "2", "--sft-steps", "2", "--sft-batch", "4", "--rl-steps", "1", "--rl-batch", "2",
             "--group", "2", "--max-tokens", "48", "--turn-tokens", "16"]


def test_excel_recalc_agreement_counts_every_case_under_each_recalc(shared_data):
    out = _run_on_base("excel_recalc_agreement.py", "--spreadsheetbench", str(shared_data / "spreadsheetbench"),
                       "--limit", "1")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["cases"] == 3
    from benchmax_gym.envs.excel.recalc import soffice_executable

    if soffice_executable() is None:  # (.ci/run installs it)
        assert "apt-get install libreoffice-calc-nogui" in report.pop("libreoffice")["skipped"]
    for recalc in {"auto", "libreoffice"} & set(report):
        assert report[recalc]["scored_1"] + len(report[recalc]["missed"]) == 3, report
        assert report[recalc]["seconds_per_grade"] > 0


def test_learning_checks_its_extra_without_importing_it():
    """The parent only starts learn.py per seed: importing trl, transformers and torch to check
    they are there cost each run ~2.4 s and 250 MB held for its whole length."""
    pytest.importorskip("trl")
    code = ("import runpy, sys\n"
            f"sys.path.insert(0, {str(BENCHMARKS)!r}); sys.argv = ['learning.py', '--seeds', 'none']\n"
            "try:\n"
            f"    runpy.run_path({str(BENCHMARKS / 'learning.py')!r}, run_name='__main__')\n"
            "finally:\n"
            "    print(sorted({'trl', 'transformers', 'tokenizers', 'torch'} & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--seeds must be comma-separated integers" in out.stderr, out.stderr
    assert out.stdout.strip() == "[]"


def test_learning_runs_seeds_in_parallel_and_reports_each_before_and_after():
    """benchmarks/learning.py at toy size (issue 34): two seeds as two processes, each seed's
    held-out figures, paired difference, tool use, stage times; a seed whose run fails is named."""
    pytest.importorskip("trl")
    out = subprocess.run([sys.executable, str(BENCHMARKS / "learning.py"), "--seeds", "0,1", "--jobs", "2", "--",
                          *LEARN_TOY], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["jobs"] == 2 and result["threads_per_run"] == max(1, os.cpu_count() // 2)
    assert [s["seed"] for s in result["seeds"]] == [0, 1]
    for seed in result["seeds"]:
        assert seed["heldout_tasks"] == 8 and 0 <= seed["sft_success"]["value"] <= 1
        assert seed["improved"] == (seed["rl_minus_sft"]["ci_low"] > 0)
        assert set(seed["tool_use"]) == {"sft", "rl"} and "parse_errors_per_turn" in seed["tool_use"]["rl"]
        assert set(seed["stage_seconds"]) >= {"3_sft", "4_rl", "5a_eval_sft", "5b_eval_rl"} and seed["peak_rss_mb"] > 0
        assert set(seed["rl_steps"]) == {"success", "zero_variance_groups", "entropy"}
    assert result["summary"]["other_seeds_improved"].endswith("of 1") and result["summary"]["failed_seeds"] == []
    bad = subprocess.run([sys.executable, str(BENCHMARKS / "learning.py"), "--seeds", "5", "--", *LEARN_TOY,
                          "--group", "3"], capture_output=True, text=True, timeout=120)
    failed = json.loads(bad.stdout)
    assert failed["summary"]["failed_seeds"] == [5] and "--rl-batch" in "\n".join(failed["seeds"][0]["log_tail"])
