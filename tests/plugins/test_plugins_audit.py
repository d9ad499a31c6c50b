"""Plugins that go wrong (the ``benchmax_gym.envs`` entry-point group): each an installed
distribution (a ``*.dist-info`` with its ``entry_points.txt``, beside its module) on the path of
a fresh interpreter, as pip leaves one. ``import benchmax_gym`` never fails or waits for one, a
plugin that is not registered is a warning naming it and a ``benchmax-gym list`` line, and
``gym.make`` of a plugin's id raises the plugin's own error, a note naming the plugin."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ECHO = "from benchmax_gym.envs.math.env import MathEnv as Env\n"  # (a working env class)


def install(site: Path, package: str, entry_points: dict[str, str], modules: dict[str, str] | None = None,
            version: str = "1.0") -> Path:
    """A distribution as pip installs one: its dist-info (METADATA, entry_points.txt) and modules."""
    info = site / f"{package.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
                                   f"Summary: {package}'s envs\n")
    (info / "entry_points.txt").write_text("[benchmax_gym.envs]\n"
                                           + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for name, text in (modules or {}).items():
        (site / f"{name}.py").write_text(text)
    return info


def python(site: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    command = [sys.executable, *args] + (["-c", code] if code is not None else [])
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=site)


MAKE = """
import json, sys
import gymnasium as gym
import benchmax_gym
out = {"imported": sorted(m for m in sys.modules if m.endswith("_mod")), "made": {}}  # (plugin modules)
for env_id in sys.argv[1:]:
    try:
        env = gym.make(env_id)
        out["made"][env_id] = ["ok", type(env.unwrapped).__name__, []]
    except Exception as exc:
        out["made"][env_id] = [type(exc).__name__, str(exc), getattr(exc, "__notes__", [])]
print(json.dumps(out))
"""


def made(site: Path, *env_ids: str, flags: tuple[str, ...] = ()) -> dict:
    out = python(site, *flags, "-c", MAKE, *env_ids)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_a_plugin_whose_import_raises_or_never_returns_costs_nothing_until_made_then_raises_its_own_error(tmp_path):
    """A plugin module that raises on import, and one whose import would block forever (a
    server it waits for): import benchmax_gym and ``list`` import neither (both are listed, with
    their package); making the first raises its own error, a note naming the plugin."""
    install(tmp_path, "boom-envs", {"boom/Boom-v0": "boom_mod:Env"},
            {"boom_mod": 'raise RuntimeError("boom: the plugin database is missing")\n'})
    install(tmp_path, "stuck-envs", {"stuck/Stuck-v0": "stuck_mod:Env"},
            {"stuck_mod": "import threading\nthreading.Event().wait()\n"})
    out = python(tmp_path, "-m", "benchmax_gym", "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("boom/Boom-v0") and "[boom-envs 1.0]" in line for line in lines)
    assert any(line.startswith("stuck/Stuck-v0") and "[stuck-envs 1.0]" in line for line in lines)
    result = made(tmp_path, "boom/Boom-v0")
    assert result["imported"] == []  # (stuck_mod would not have returned)
    error, message, notes = result["made"]["boom/Boom-v0"]
    assert (error, message) == ("RuntimeError", "boom: the plugin database is missing")
    assert notes == ["(loading boom/Boom-v0 from the plugin boom-envs 1.0, entry point 'boom_mod:Env')"]


def test_an_entry_point_that_is_no_env_class_fails_at_make_naming_it_and_a_dotted_one_is_made(tmp_path):
    """``module:CONSTANT`` (not callable) fails naming the entry point and the plugin, not
    "'int' object is not callable"; ``module:Class.factory`` (valid entry-point syntax) is made
    (Gymnasium's own loader looked up the attribute "Class.factory"); a value with no attribute
    is not registered, and making its id says why (not "Environment NoAttr doesn't exist")."""
    install(tmp_path, "odd-envs", {"odd/Const-v0": "odd_mod:CONST", "odd/Dotted-v0": "odd_mod:Holder.make",
                                   "odd/NoAttr-v0": "odd_mod"},
            {"odd_mod": ECHO + "CONST = 42\n\nclass Holder:\n    make = Env\n"})
    result = made(tmp_path, "odd/Const-v0", "odd/Dotted-v0", "odd/NoAttr-v0")
    assert result["made"]["odd/NoAttr-v0"][:2] == [
        "Error", "odd-envs 1.0: entry point 'odd/NoAttr-v0' = 'odd_mod': the value must be 'module:attribute' (a "
        "ToolEnv subclass or a factory)"]
    assert result["made"]["odd/Const-v0"] == [
        "TypeError", "odd_mod:CONST is int 42, not an env class or factory",
        ["(loading odd/Const-v0 from the plugin odd-envs 1.0, entry point 'odd_mod:CONST')"]]
    assert result["made"]["odd/Dotted-v0"] == ["ok", "MathEnv", []]
    doctor = python(tmp_path, "-m", "benchmax_gym", "doctor")
    broken = [line for line in doctor.stdout.splitlines() if line.startswith("broken plugin")]
    assert len(broken) == 2, doctor.stdout + doctor.stderr  # (NoAttr's, then Const's)
    assert "odd/Const-v0 (odd-envs 1.0): odd_mod:CONST does not load: TypeError: odd_mod:CONST is int 42" in broken[1]


def test_ids_that_clash_are_refused_with_a_warning_naming_the_plugin_and_no_package_silently_wins(tmp_path):
    """An id a built-in holds, one another library registered (Gymnasium's own
    tabular/Blackjack-v0), and one two plugins declare: import benchmax_gym (even with warnings
    as errors) warns naming each plugin, ``list`` prints each, the built-in and the library's
    env stay, and gym.make of the shared id says which packages declare it (neither wins:
    installing a package must not silently swap the env an id makes)."""
    install(tmp_path, "aaa-envs", {"benchmax/Math-v0": "own_mod:Env", "tabular/Blackjack-v0": "own_mod:Env",
                                   "shared/Env-v0": "own_mod:Env", "aaa/Own-v0": "own_mod:Env"},
            {"own_mod": ECHO})
    install(tmp_path, "zzz-envs", {"shared/Env-v0": "own_mod:Env"}, version="2.0")
    out = python(tmp_path, "-W", "error", code="import benchmax_gym")
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if line.startswith("benchmax-gym plugin not registered")]
    assert len(warned) == 3, out.stderr
    assert ("aaa-envs 1.0: entry point 'benchmax/Math-v0' = 'own_mod:Env': benchmax/Math-v0 is a built-in id"
            in warned[0])
    assert "shared/Env-v0 is declared by aaa-envs 1.0 and zzz-envs 2.0: registered by neither" in out.stderr
    assert "'tabular/Blackjack-v0' = 'own_mod:Env': tabular/Blackjack-v0 is already registered by another library" \
        in out.stderr
    listed = python(tmp_path, "-m", "benchmax_gym", "list").stdout.splitlines()
    assert sum(line.startswith("broken plugin: ") for line in listed) == 3
    assert any(line.startswith("aaa/Own-v0") for line in listed)
    assert not any(line.startswith("shared/") for line in listed)
    check = ("import gymnasium as gym, benchmax_gym\n"
             "print(gym.spec('benchmax/Math-v0').entry_point, gym.spec('tabular/Blackjack-v0').entry_point)")
    assert python(tmp_path, code=check).stdout.split() == ["benchmax_gym.envs.math.env:MathEnv",
                                                           "gymnasium.envs.tabular.blackjack:BlackJackJaxEnv"]
    result = made(tmp_path, "shared/Env-v0", "aaa/Own-v0")
    assert result["made"]["shared/Env-v0"][:2] == [
        "Error", "shared/Env-v0 is declared by aaa-envs 1.0 and zzz-envs 2.0: registered by neither; uninstall all "
        "but one"]
    assert result["made"]["aaa/Own-v0"] == ["ok", "MathEnv", []]


def test_a_plugin_uninstalled_after_import_registered_it_says_so_at_make(tmp_path):
    """The id was registered from the metadata at import; the package is uninstalled before
    gym.make: the import's own error, a note saying the package is gone."""
    info = install(tmp_path, "gone-envs", {"gone/Gone-v0": "gone_mod:Env"}, {"gone_mod": ECHO})
    code = f"""
import importlib, json, shutil, os
import gymnasium as gym
import benchmax_gym
shutil.rmtree({str(info)!r}); os.remove({str(tmp_path / 'gone_mod.py')!r})
importlib.invalidate_caches()
try:
    gym.make("gone/Gone-v0")
except ModuleNotFoundError as exc:
    print(json.dumps([str(exc), exc.__notes__]))
"""
    out = python(tmp_path, code=code)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["No module named 'gone_mod'", [
        "(loading gone/Gone-v0 from the plugin gone-envs 1.0, entry point 'gone_mod:Env'; gone-envs is no longer "
        "installed)"]]


def test_an_unreadable_entry_points_file_names_its_package_and_one_without_plugins_is_not_a_problem(tmp_path):
    """An ``entry_points.txt`` with a line that is no ``name = value``: a plugin's is reported
    naming its package (it was "a distribution's metadata is unreadable"); another package's
    (no benchmax_gym.envs section) is none of benchmax-gym's business."""
    install(tmp_path, "garbled-envs", {"garbled/Ok-v0": "garbled_mod:Env"}, {"garbled_mod": ECHO})
    with open(tmp_path / "garbled_envs-1.0.dist-info" / "entry_points.txt", "a") as f:
        f.write("garbled/Half-v0\n")
    info = install(tmp_path, "other-tool", {})
    (info / "entry_points.txt").write_text("[console_scripts]\nother-tool\n")
    out = python(tmp_path, "-m", "benchmax_gym", "list")
    assert out.returncode == 0, out.stderr
    broken = [line for line in out.stdout.splitlines() if line.startswith("broken plugin: ")]
    assert len(broken) == 1 and broken[0].startswith("broken plugin: garbled-envs 1.0: its entry points are unreadable")
    assert "garbled-envs 1.0: its entry points are unreadable" in out.stderr  # the import's warning
