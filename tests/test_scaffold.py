"""``benchmax-gym new NAME``: the scaffolded package installs and passes its own tests as generated."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmax_gym.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_a_new_package_installs_registers_and_passes_its_own_tests(tmp_path, capsys):
    assert main(["new", "acme-letters", "--dir", str(tmp_path)]) == 0
    assert "acme_letters/AcmeLetters-v0" in capsys.readouterr().out
    root = tmp_path / "acme-letters"
    for part in ("tasks", "tools", "rubric", "solver", "env"):
        assert (root / "acme_letters" / f"{part}.py").is_file()
    assert (root / "README.md").is_file() and (root / "acme_letters" / "README.md").is_file()
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(root)], check=True, timeout=300, capture_output=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout
    listed = subprocess.run([sys.executable, "-m", "benchmax_gym", "list"], env=env, capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert any(line.startswith("acme_letters/AcmeLetters-v0") and "[acme-letters 0.1.0]" in line
               for line in listed.stdout.splitlines()), listed.stdout


@pytest.mark.parametrize("args, says", [
    (["new", "9lives"], "must start with a letter"),
    (["new", "ok", "--id", "no-namespace"], "--id must look like"),
])
def test_bad_names_are_refused_in_one_line(args, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--dir", str(tmp_path)])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_an_existing_folder_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    with pytest.raises(SystemExit):
        main(["new", "taken", "--dir", str(tmp_path)])
    assert "exists" in capsys.readouterr().err and not any((tmp_path / "taken").iterdir())


@pytest.mark.parametrize("name, env_id, says", [
    ("acme\n", "acme/Acme-v0", "NAME must start with a letter"),  # ("$" matched before the newline)
    ("acme", "acme/Acme-v0\n", "--id must look like"),  # (a newline inside the pyproject's TOML key)
    ("json", None, "which is taken"),  # the stdlib's: `import json` in the solver would find the wrong one
    ("benchmax_gym", None, "which is taken"),  # installing it would replace the library itself
    ("Gymnasium", None, "which is taken"),
    ("tests", None, "which is taken"),
])
def test_names_that_would_break_or_shadow_are_refused_and_nothing_is_written(tmp_path, name, env_id, says):
    from benchmax_gym.scaffold import scaffold

    with pytest.raises(ValueError, match=says):
        scaffold(name, tmp_path, env_id)
    assert not any(tmp_path.iterdir())
