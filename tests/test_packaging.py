"""The package installs whole: every module and README ships, and wrappers/ and registry/ install as
benchmax_gym.wrappers / benchmax_gym.registry, never bare.

Proved for the editable install this suite runs in, and for a built wheel installed into a fresh
virtual environment (with its dependencies resolved from the package metadata alone).
"""

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import importlib.util, sys
import gymnasium as gym
for bare in ("registry", "wrappers"):
    assert importlib.util.find_spec(bare) is None, f"bare {bare!r} is importable"
env = gym.make("benchmax_gym:benchmax/Math-v0")
obs, info = env.reset(seed=0)
obs, reward, terminated, truncated, info = env.step(
    '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>')
assert "42" in obs, obs
import benchmax_gym.wrappers, benchmax_gym.registry
print(benchmax_gym.registry.__file__)
print(benchmax_gym.wrappers.RecordEpisodes.__name__)
"""


def test_editable_install_maps_the_folders(tmp_path):
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.splitlines()[0]).resolve().parent == ROOT / "registry"


def source_files() -> set[str]:
    """Every .py, README.md and SERVICE.md under benchmax_gym/, as wheel paths (os.walk follows the links
    to wrappers/ and registry/, which Path.glob("**") does not)."""
    found = set()
    for folder, dirs, files in os.walk(ROOT / "benchmax_gym", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = Path(folder).relative_to(ROOT)
        found |= {(rel / f).as_posix() for f in files if f.endswith(".py") or f in ("README.md", "SERVICE.md")}
    return found


def clean_copy(dest: Path) -> None:
    """Copy what a clean checkout holds: git's tracked and not-ignored files (links kept as links).
    Walking the whole tree raced other tests that write ignored folders into it (the sky venv a
    parallel worker installs under .venv-sky: a pip temp file vanished mid-copy and failed CI)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, timeout=60)
    if listed.returncode == 0:
        for name in sorted(set(filter(None, listed.stdout.decode().split("\0")))):
            src, dst = ROOT / name, dest / name
            if not os.path.lexists(src):  # deleted in the work tree, not yet in the index
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
        return
    # not a git checkout (an unpacked archive): leave out what .gitignore names, every .venv* above all
    shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache",
        ".pip-target-*"))


@pytest.mark.slow
def test_wheel_in_a_fresh_venv(tmp_path):
    # from a clean copy: a build/ left in the checkout would put stale files in the wheel
    source = tmp_path / "source"
    clean_copy(source)
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("benchmax_gym-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "benchmax_gym/registry/__init__.py" in names and "benchmax_gym/wrappers/record.py" in names
    assert not any(n.startswith(("registry/", "wrappers/", "tests/", "benchmarks/")) for n in names)
    # every module and README of the source tree (packages are found, not listed by hand),
    # through the benchmax_gym/wrappers and /registry links too
    expected = source_files()
    assert {"benchmax_gym/envs/mcp/README.md", "benchmax_gym/envs/crm/SERVICE.md", "benchmax_gym/serve.py", "benchmax_gym/testing/__init__.py",
            "benchmax_gym/testing/mediawiki.py", "benchmax_gym/wrappers/vector.py"} <= expected
    assert sorted(expected - set(names)) == []

    env_dir = tmp_path / "venv"
    # a fresh venv without pip of its own: this interpreter's pip installs into it (--python), and
    # --no-compile leaves the .pyc files to the first import; measured, 45 CPU-s became ~15, the
    # install being the same resolution from the wheel's metadata alone
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                              "--no-compile", str(wheel)], capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    run = subprocess.run([str(python), "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert str(env_dir) in run.stdout.splitlines()[0]
    cli = subprocess.run([str(env_dir / "bin" / "benchmax-gym"), "run", "benchmax/Math-v0", "--episodes", "3",
                          "--json", "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and '"mean_reward": 1.0' in cli.stdout, cli.stderr
