"""The servers and the command line, loose ends (helper 162): openenv-serve starts its env before it
serves, ``list --json`` and ``doctor --json`` for scripts, ``main()`` returns a failure's status as
it returns success's, and an empty ``--host`` is refused."""

import json
import socket
import subprocess
import sys

import gymnasium as gym
import pytest

from benchmax_gym.cli import main

CLI = [sys.executable, "-m", "benchmax_gym"]

# an MCP-v0 env whose server exits at once (a missing API key): made fine, it fails at its first reset
FAILING_MCP = """
import sys
import gymnasium as gym

gym.register("{env_id}", entry_point="benchmax_gym.envs.mcp.env:MCPEnv", kwargs=dict(
    server={{"command": sys.executable, "args": ["-c", "import sys; sys.exit('API_KEY not set')"]}},
    tasks=[{{"prompt": "p"}}], reward=lambda completion: 0.0))
"""


def cli(*args, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert "Traceback" not in stderr and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("benchmax-gym: error: "), lines
    return lines[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- 1. openenv-serve makes (and starts) its env before it serves -----------------------------------


def test_openenv_serve_with_an_env_that_cannot_start_fails_at_once_and_leaves_nothing_listening(tmp_path):
    """It said "listening" and served, and the env's failure came only to the first client's
    session; now, as mcp-serve, the command ends with the env's own message, exit 1."""
    (tmp_path / "nokey_oe.py").write_text(FAILING_MCP.format(env_id="me/NoKeyOE-v0"))
    port = free_port()
    server = subprocess.Popen([*CLI, "--import", "nokey_oe", "openenv-serve", "me/NoKeyOE-v0", "--port", str(port)],
                              cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        said = []
        for line in server.stderr:  # (to its end; a server that started says so, and is stopped here)
            said.append(line)
            assert "listening" not in line, "".join(said)
        status = server.wait(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stderr.close()
    assert status == 1, "".join(said)
    line = one_error_line("".join(said))
    assert "cannot start me/NoKeyOE-v0" in line and "API_KEY not set" in line, line
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=10):
        pass


def test_build_app_starts_the_env_once_so_a_failure_is_its_own_error():
    from benchmax_gym.openenv import build_app

    namespace = {}
    exec(FAILING_MCP.format(env_id="me/NoKeyApp-v0"), namespace)
    try:
        with pytest.raises(RuntimeError, match="API_KEY not set"):
            build_app("me/NoKeyApp-v0")
    finally:
        gym.registry.pop("me/NoKeyApp-v0", None)


# -- 2. list --json and doctor --json ---------------------------------------------------------------


def test_list_json_parses_and_agrees_with_the_table():
    table = cli("list")
    listed = cli("list", "--json")
    assert table.returncode == listed.returncode == 0, (table.stderr, listed.stderr)
    report = json.loads(listed.stdout)
    entries = report["environments"]
    rows = [line for line in table.stdout.splitlines() if not line.startswith("broken plugin: ")]
    assert [e["id"] for e in entries] == [row.split()[0] for row in rows]
    for entry, row in zip(entries, rows):
        origin = f"  [{entry['plugin']}]" if entry["plugin"] else ""
        assert row.split(None, 1)[1] == entry["description"] + origin, row
    by_id = {e["id"]: e for e in entries}
    assert by_id["benchmax/Math-v0"]["entry_point"] == "benchmax_gym.envs.math.env:MathEnv"
    assert by_id["benchmax/Math-v0"]["plugin"] is None
    assert report["broken_plugins"] == [line.removeprefix("broken plugin: ") for line in table.stdout.splitlines()
                                        if line.startswith("broken plugin: ")]


def _table_rows(text: str) -> list[tuple[str, str]]:
    """doctor's ``KEY  VALUE`` lines (keys padded to one width, some with spaces)."""
    lines = text.splitlines()
    column = len(lines[0]) - len(lines[0][len("python"):].lstrip())
    return [(line[:column].strip(), line[column:]) for line in lines]


def test_doctor_json_parses_and_agrees_with_the_table():
    table = cli("doctor")
    doctor = cli("doctor", "--json")
    assert table.returncode == doctor.returncode == 0, (table.stderr, doctor.stderr)
    report = json.loads(doctor.stdout)
    rows = _table_rows(table.stdout)
    shown = dict(rows)
    assert shown["python"] == f"{report['python']['version']} ({report['python']['executable']})"
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    for dist, version in report["packages"].items():
        assert shown[dist] == (version or "not installed"), dist
    assert report["packages"]["gymnasium"] == gym.__version__
    sandbox = report["sandbox"]
    assert shown["sandbox"] == sandbox["summary"] and sandbox["summary"].startswith(sandbox["level"])
    assert {k: v for k, v in rows if k.startswith("sandbox ")} == {f"sandbox {k}": v for k, v in
                                                                  sandbox["details"].items()}
    assert shown["environments"] == ", ".join(report["environments"]) and "benchmax/Math-v0" in report["environments"]
    assert [v for k, v in rows if k == "broken plugin"] == report["broken_plugins"]
    assert shown["libreoffice"] == report["libreoffice"]["summary"]
    extras = {k.removeprefix("extra "): v for k, v in rows if k.startswith("extra ")}
    assert extras == {name: status["state"] for name, status in report["extras"].items()}
    for status in report["extras"].values():
        assert status["installed"] == (not status["missing"]) == status["state"].startswith("installed")


@pytest.mark.parametrize("command", ["list", "doctor"])
def test_the_json_flag_is_in_the_commands_help_with_an_example(command):
    out = cli(command, "--help")
    assert out.returncode == 0 and "--json" in out.stdout and "JSON" in out.stdout, out.stdout
    assert f"  benchmax-gym {command} --json" in out.stdout.partition("\nexamples:\n")[2], out.stdout


# -- 3. main() in-process: a failure's status is returned, as success's is --------------------------


@pytest.fixture
def failing_env(tmp_path, monkeypatch):
    """``--import nokey_main`` registers me/NoKeyMain-v0 (an MCP server that exits at once)."""
    (tmp_path / "nokey_main.py").write_text(FAILING_MCP.format(env_id="me/NoKeyMain-v0"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # (so --import adds no path of its own, for good)
    monkeypatch.delitem(sys.modules, "nokey_main", raising=False)
    yield "me/NoKeyMain-v0"
    sys.modules.pop("nokey_main", None)
    gym.registry.pop("me/NoKeyMain-v0", None)


@pytest.mark.parametrize("command", [["run", "--quiet", "--episodes", "1"], ["mcp-serve"],
                                     ["eval", "--policy", "solver", "--out", "run", "--quiet", "--no-plots"]])
def test_main_returns_1_for_an_env_that_cannot_start_in_every_command(failing_env, command, capsys):
    """run and mcp-serve raised SystemExit(1) where eval (and the data commands) returned 1: an
    embedding caller had to handle both. Usage errors still raise SystemExit(2), as argparse's."""
    assert main(["--import", "nokey_main", command[0], failing_env, *command[1:]]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "API_KEY not set" in line or "the one episode was not scored" in line, line


def test_main_returns_0_on_success_and_raises_systemexit_2_on_a_usage_error(capsys):
    assert main(["list"]) == 0
    assert "benchmax/Math-v0" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["run", "benchmax/Math-v0", "--episodes", "0"])
    assert exit_.value.code == 2
    one_error_line(capsys.readouterr().err)


# -- hostile input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["openenv-serve"], ["mcp-serve", "--transport", "http"]])
@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused_not_every_interface(command, host):
    """``--host "$HOST"`` with the variable unset listened on every interface (the wildcard), with
    "listening on http://:PORT" and a warning naming no host."""
    out = subprocess.Popen([*CLI, command[0], "benchmax/Math-v0", *command[1:], "--host", host, "--port", "0"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        said = []
        for line in out.stderr:
            said.append(line)
            assert "listening" not in line, "".join(said)
        status = out.wait(timeout=120)
    finally:
        if out.poll() is None:
            out.kill()
            out.wait()
        out.stderr.close()
    assert status == 2, "".join(said)
    line = one_error_line("".join(said))
    assert f"--host {host!r}: name an address" in line, line
