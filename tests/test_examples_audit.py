"""The examples as a new user runs them: a missing trainer package or a bad flag is one line that
names the fix (never a traceback, never a wrong file written)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def load(script):
    spec = importlib.util.spec_from_file_location(Path(script).stem + "_audit", EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_line_exit(call):
    """What a user sees: SystemExit with a one-line message (Python prints it, no traceback)."""
    with pytest.raises(SystemExit) as caught:
        call()
    message = caught.value.code
    assert isinstance(message, str) and "\n" not in message, message
    return message


def without(packages, script, *argv, cwd=None):
    """Run an example in a fresh process where ``packages`` cannot be imported (as in a venv
    without them: a process of its own, since in the suite's process other tests have imported
    them, their submodules and their registries already)."""
    block = ("import runpy, sys\n"
             f"MISSING = {sorted(packages)!r}\n"
             "class Missing:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] in MISSING:\n"
             "            raise ModuleNotFoundError(f\"No module named {name.split('.')[0]!r}\", name=name)\n"
             "sys.meta_path.insert(0, Missing())\n"
             "sys.argv = sys.argv[1:]\n"
             "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", block, str(EXAMPLES / script), *argv], capture_output=True,
                          text=True, timeout=120, env=environ, cwd=cwd)


@pytest.mark.parametrize("script, argv, missing, install", [
    ("trl_grpo.py", ["--smoke"], ["trl"], "pip install 'benchmax-gym[trl]'"),
    ("skyrl_smoke.py", [], ["skyrl_gym"], "pip install 'benchmax-gym[skyrl,trl]'"),
    ("skyrl_smoke.py", [], ["transformers"], "pip install 'benchmax-gym[skyrl,trl]'"),
    ("openrlhf_smoke.py", [], ["openrlhf"], "pip install --no-deps openrlhf==0.11.2"),
    ("verl_smoke.py", [], ["verl"], "pip install --no-deps verl==0.9.1"),
    ("make_dataset.py", ["verl", "benchmax/Math-v0", "OUT"], ["verl"], "pip install 'benchmax-gym[verl]'"),
])
def test_a_missing_package_is_one_line_naming_what_to_install(script, argv, missing, install, tmp_path):
    out = without(missing, script, *[str(tmp_path / "out") if a == "OUT" else a for a in argv], cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert install in lines[0] and lines[0].startswith(script) and missing[0].replace("_", "-").split("-")[0] in lines[0]
    assert not (tmp_path / "out").exists()


def test_learn_without_torch_is_one_line_naming_the_extra_before_anything_runs(tmp_path):
    """In a fresh process where torch cannot be imported: no traceback, no run folder."""
    out = without(["torch"], "learn/learn.py", "--out", str(tmp_path / "run"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        "learn.py needs torch, transformers, tokenizers and TRL: pip install 'benchmax-gym[trl,plots]' "
        "(No module named 'torch')"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, names", [
    (["--train", "-1"], "--train"),  # wrote 98 rows for training and 1 for validation
    (["--validation", "-3"], "--validation"),
    (["--env-kwargs", "{max_turns: 3}"], "--env-kwargs"),
    (["--env-kwargs", "[3]"], "--env-kwargs"),
])
def test_make_dataset_refuses_bad_flags_naming_them_and_writes_nothing(argv, names, tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        load("make_dataset.py").main(["verl", "benchmax/Math-v0", str(tmp_path / "out"), *argv])
    assert caught.value.code == 2 and names in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("env_id, kwargs, says", [
    ("benchmax/Nope-v0", "{}", "Registered benchmax ids"),
    ("benchmax/Math-v0", '{"max_turn": 3}', "max_turns"),
])
def test_make_dataset_names_the_env_a_user_got_wrong_in_one_line(env_id, kwargs, says, tmp_path):
    module = load("make_dataset.py")
    line = one_line_exit(lambda: module.main(["skyrl", env_id, str(tmp_path / "out"), "--env-kwargs", kwargs]))
    assert line.startswith(f"make_dataset.py: {env_id}") and says in line
    assert not (tmp_path / "out").exists()


def test_trl_script_names_a_wrong_env_id_in_one_line():
    module = load("trl_grpo.py")
    line = one_line_exit(lambda: module.main(["--smoke", "--env-id", "benchmax/Nope-v0"]))
    assert line.startswith("trl_grpo.py: --env-id benchmax/Nope-v0: ") and "Registered benchmax ids" in line


def test_trl_script_names_a_model_it_cannot_load_in_one_line(tmp_path):
    module = load("trl_grpo.py")
    model = str(tmp_path / "no-such-model")
    assert one_line_exit(lambda: module.main(["--model", model])).startswith(f"trl_grpo.py: --model {model}: ")


@pytest.mark.parametrize("argv, names", [(["--tasks", "0"], "--tasks"), (["--max-steps", "-1"], "--max-steps")])
def test_trl_script_refuses_counts_below_one(argv, names, capsys):
    with pytest.raises(SystemExit):
        load("trl_grpo.py").parse(argv)
    assert names in capsys.readouterr().err


def test_learn_sft_from_a_folder_that_is_not_a_run_is_refused_at_parse(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load("learn/learn.py").parse(["--sft-from", str(tmp_path)])
    assert "--sft-from" in capsys.readouterr().err
