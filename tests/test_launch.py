"""benchmax-gym launch: the SkyPilot task through the real `sky` package (in a venv of its own,
since SkyPilot's click pin cannot share this one), and the run script executed here for rank 0
and rank 1 (it starts a Ray head and joins it). Launching on a cloud is the one part not run.
"""

import configparser
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from benchmax_gym import launch

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "benchmax_gym.cli"]


def _extra(name: str) -> str:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg["options.extras_require"][name].strip()


@pytest.fixture(scope="session")
def sky_python(cached_venv):
    """A venv with the skypilot extra's pin, built once under the repository (.venv-sky) and reused."""
    return cached_venv(".venv-sky", _extra("skypilot"))


def test_pins_agree_with_setup_cfg():
    assert _extra("ray") == f"ray=={launch.RAY_VERSION}" and _extra("skypilot") == launch.SKYPILOT
    assert f"ray=={launch.RAY_VERSION}" in _extra("test").split()


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, 4])
def test_sky_task_round_trip(sky_python, nodes):
    out = subprocess.run([*CLI, "launch", "--nodes", str(nodes), "--infra", "k8s", "--print-yaml",
                          "--sky-python", sky_python], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    task = yaml.safe_load(out.stdout)  # as sky.Task.from_yaml_config read it and to_yaml_config wrote it back
    assert task["num_nodes"] == nodes and task["name"] == "benchmax-envs"
    assert task["resources"] == {"infra": "kubernetes", "cpus": "4+"}  # SkyPilot spells k8s out
    ours = launch.task_config(nodes, infra="k8s")
    assert task["run"] == ours["run"] and task["setup"] == ours["setup"]
    assert f"'ray=={launch.RAY_VERSION}'" in task["setup"] and "'.[ray]'" in task["setup"]
    assert task["envs"]["BENCHMAX_RAY_PORT"] == "6379"
    offline = subprocess.run([*CLI, "launch", "--nodes", str(nodes), "--infra", "k8s", "--print-yaml"],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "BENCHMAX_GYM_SKY_PYTHON": ""})
    assert yaml.safe_load(offline.stdout) == ours  # --print-yaml works without SkyPilot


def test_launch_without_skypilot_names_the_fix():
    out = subprocess.run([*CLI, "launch", "--nodes", "2"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "BENCHMAX_GYM_SKY_PYTHON": ""})
    assert out.returncode == 2 and out.stderr.startswith("benchmax-gym: error: ") and out.stderr.count("\n") == 1
    assert "needs SkyPilot" in out.stderr and "benchmax-gym[skypilot]" in out.stderr and "--sky-python" in out.stderr
    assert "pip install 'skypilot[kubernetes]==0.14.1'" in out.stderr  # (as the README installs it: k8s support)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_script_starts_a_head_and_a_node_joins_it(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(launch.RUN_SCRIPT)
    port = _free_port()
    temp = Path(f"/tmp/bgr-{os.getpid()}")  # Ray's sockets need a short path
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1", "BENCHMAX_RAY_PORT": str(port), "BENCHMAX_ENV_HOST_SLOTS": "3",
           "BENCHMAX_RAY_START_ARGS": "--num-cpus=1 --object-store-memory=100000000",
           "BENCHMAX_RAY_HEAD_ARGS": f"--include-dashboard=false --temp-dir={temp}",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_AUTH_MODE": "disabled"}  # 0 would refuse to join
    nodes = []
    try:
        for rank in (0, 1):
            nodes.append(subprocess.Popen(["bash", str(script)], env={**env, "SKYPILOT_NODE_RANK": str(rank)},
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        check = (
            "import json, time, ray\n"
            f"ray.init(address='127.0.0.1:{port}', logging_level='ERROR')\n"
            "deadline = time.time() + 90\n"
            "while len([n for n in ray.nodes() if n['Alive']]) < 2 and time.time() < deadline: time.sleep(0.5)\n"
            "print(json.dumps({'nodes': len([n for n in ray.nodes() if n['Alive']]), "
            "'slots': ray.cluster_resources().get('benchmax_env_host')}))\n"
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the head's port opens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=150, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == {"nodes": 2, "slots": 6.0}
    finally:
        sessions = {node.pid for node in nodes}  # each node's `ray start --block` and all it started
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (left := _in_sessions(sessions)):
            for proc in left:
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
            time.sleep(0.2)
        logs = [node.communicate(timeout=30)[0] for node in nodes]
        subprocess.run(["rm", "-rf", str(temp)])
    assert f"Ray head on 127.0.0.1:{port}" in logs[0] and f"node 1 (127.0.0.1) joins 127.0.0.1:{port}" in logs[1]
    assert _in_sessions(sessions) == []  # all stopped


def _in_sessions(sessions) -> list:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) in sessions and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            pass
    return found

