"""Third-party env packages: real packages (tests/plugins/) built and pip-installed into a target
folder, then used from a fresh interpreter that has it on its path, as a user's would."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"


def pip_install(target: Path, *folders: Path) -> None:
    """``pip install --target`` from copies (a build leaves egg-info beside the sources)."""
    for folder in folders:
        copy = target.parent / f"src-{folder.name}"
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(copy)], check=True, timeout=300, capture_output=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("plugins") / "site"
    pip_install(target, PLUGINS / "acme_envs", PLUGINS / "broken_envs")
    return target


def python(site: Path, code: str = "", *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    command = [sys.executable, "-c", code] if code else [sys.executable, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=site.parent)


def test_an_installed_package_registers_its_env_lazily(site):
    out = python(site, """
import sys, json
import gymnasium as gym
import benchmax_gym
loaded_at_import = "acme_envs.echo" in sys.modules
env = gym.make("acme/Echo-v0")
obs, info = env.reset(seed=0, options={"task_index": 1})
obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "shout", "arguments": {"word": "dog"}}</tool_call>')
shouted = obs
obs, reward, terminated, truncated, info = env.step("DOG")
print(json.dumps({"loaded_at_import": loaded_at_import, "loaded_after": "acme_envs.echo" in sys.modules,
                  "shouted": shouted, "reward": reward, "terminated": terminated,
                  "vector": type(gym.make_vec("acme/Echo-v0", num_envs=1).unwrapped).__name__}))
""")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["loaded_at_import"] is False and result["loaded_after"] is True
    assert "DOG" in result["shouted"] and result["reward"] == 1.0 and result["terminated"]
    assert result["vector"] == "SubprocVectorEnv"


def test_list_names_the_package_and_version_and_reports_a_broken_plugin_in_one_line(site):
    out = python(site, "", "-m", "benchmax_gym", "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    (echo,) = [line for line in lines if line.startswith("acme/Echo-v0")]
    assert "acme-envs 0.3.1" in echo and "Echo: say the word back" in echo
    assert any(line.startswith("benchmax/Math-v0") for line in lines)  # the built-ins are all there
    broken = [line for line in lines if line.startswith("broken plugin:")]
    assert len(broken) == 1 and "'not an id'" in broken[0] and "broken-envs 1.0" in broken[0]
    # the id whose module is missing is registered (its metadata is fine); making it says why
    made = python(site, "import gymnasium as gym, benchmax_gym\ntry:\n    gym.make('broken/Missing-v0')\n"
                  "except ModuleNotFoundError as exc:\n    print('refused:', exc)")
    assert "refused: No module named 'broken_envs.nowhere'" in made.stdout, made.stderr


def test_doctor_loads_each_plugin_and_names_the_one_that_does_not_load(site):
    out = python(site, "", "-m", "benchmax_gym", "doctor")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("broken plugin")]
    assert len(lines) == 2, out.stdout
    assert any("broken/Missing-v0 (broken-envs 1.0)" in line and "No module named 'broken_envs.nowhere'" in line
               for line in lines)
    assert "acme/Echo-v0 (acme-envs 0.3.1)" in out.stdout


def test_a_plugin_cannot_take_a_built_in_id(tmp_path):
    package = tmp_path / "thief"
    (package / "thief").mkdir(parents=True)
    (package / "thief" / "__init__.py").write_text("")
    (package / "pyproject.toml").write_text(
        (PLUGINS / "broken_envs" / "pyproject.toml").read_text()
        .replace('name = "broken-envs"', 'name = "thief"').replace('packages = ["broken_envs"]', 'packages = ["thief"]')
        .split('[project.entry-points')[0]
        + '[project.entry-points."benchmax_gym.envs"]\n"benchmax/Math-v0" = "thief:Env"\n\n'
        + '[tool.setuptools]\npackages = ["thief"]\n')
    target = tmp_path / "site"
    pip_install(target, package)
    out = python(target, "import gymnasium as gym, benchmax_gym\nfrom benchmax_gym.registry.plugins import PROBLEMS\n"
                 "print(gym.spec('benchmax/Math-v0').entry_point)\nprint(PROBLEMS)")
    assert out.returncode == 0, out.stderr
    entry, problems = out.stdout.splitlines()
    assert entry == "benchmax_gym.envs.math.env:MathEnv"
    assert "thief 1.0" in problems and "built-in" in problems
