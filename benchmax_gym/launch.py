"""``benchmax-gym launch``: a Ray cluster of N CPU nodes for ``RayVectorEnv``, provisioned by SkyPilot.

The SkyPilot task (``sky.Task`` with ``num_nodes``) installs this package with its ``ray`` extra
and the driver's Ray and Python versions (Ray refuses a driver whose versions differ), then runs
:data:`RUN_SCRIPT` on every node: rank 0 starts the Ray head, the others wait for it and join;
each node offers the ``benchmax_env_host`` resource that ``RayVectorEnv(actor_options=...)`` asks
for. Ray listens on 6379 (SkyPilot's own Ray uses 6380) and stays up as the task's job until the
cluster is taken down.

SkyPilot pins an old ``click`` that this package's dependencies cannot share, so it lives in a venv
of its own; this module uses only the standard library at import, and runs there as a script::

    python3 -m venv ~/.venv-sky && ~/.venv-sky/bin/pip install 'skypilot[kubernetes]==0.14.1'
    benchmax-gym launch --nodes 4 --infra k8s --sky-python ~/.venv-sky/bin/python
"""

from __future__ import annotations

import copy
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

RAY_PORT = 6379
RAY_VERSION = "2.60.0"  # the ray extra's pin (setup.cfg); used when this interpreter has no Ray
SKYPILOT = "skypilot==0.14.1"  # the skypilot extra's pin (setup.cfg)
VENV = "~/benchmax-venv"  # on each node
# what SkyPilot accepts (sky.Resources; sky.skylet.constants.CLUSTER_NAME_VALID_REGEX), checked
# here too so that --print-yaml, which runs without SkyPilot, never prints a task it would refuse
_CPUS = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)\+?")
_CLUSTER_NAME = re.compile(r"[a-zA-Z](?:[-_.a-zA-Z0-9]*[a-zA-Z0-9])?")

# Runs on every node with SkyPilot's SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS (one IP a line,
# the head's first) and `ray` on PATH. BENCHMAX_RAY_PORT, BENCHMAX_ENV_HOST_SLOTS (default: the
# node's CPUs), BENCHMAX_RAY_START_ARGS (all nodes) and BENCHMAX_RAY_HEAD_ARGS (the head) tune it.
RUN_SCRIPT = r"""set -euo pipefail
HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
MY_IP=$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK + 1))p")
PORT=${BENCHMAX_RAY_PORT:-6379}
SLOTS=${BENCHMAX_ENV_HOST_SLOTS:-$(nproc)}
RESOURCES="{\"benchmax_env_host\": $SLOTS}"
if [ "$SKYPILOT_NODE_RANK" = "0" ]; then
  echo "benchmax-gym: Ray head on $MY_IP:$PORT; RayVectorEnv(address='$HEAD_IP:$PORT')"
  exec ray start --head --port "$PORT" --node-ip-address "$MY_IP" --resources "$RESOURCES" \
    --disable-usage-stats --block ${BENCHMAX_RAY_START_ARGS:-} ${BENCHMAX_RAY_HEAD_ARGS:-}
fi
for _ in $(seq 1 300); do  # the head may still be installing: wait for its port
  if (exec 3<>"/dev/tcp/$HEAD_IP/$PORT") 2>/dev/null; then break; fi
  sleep 1
done
(exec 3<>"/dev/tcp/$HEAD_IP/$PORT") 2>/dev/null || { echo "benchmax-gym: no Ray head at $HEAD_IP:$PORT" >&2; exit 1; }
echo "benchmax-gym: node $SKYPILOT_NODE_RANK ($MY_IP) joins $HEAD_IP:$PORT"
exec ray start --address "$HEAD_IP:$PORT" --node-ip-address "$MY_IP" --resources "$RESOURCES" \
  --disable-usage-stats --block ${BENCHMAX_RAY_START_ARGS:-}
"""


def _ray_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("ray")
    except PackageNotFoundError:
        return RAY_VERSION


def _checkout() -> str | None:
    """The source checkout this package runs from (an editable install), if any."""
    root = Path(__file__).resolve().parent.parent
    return str(root) if (root / "setup.cfg").is_file() and (root / "benchmax_gym").is_dir() else None


def task_config(nodes: int, *, cpus: str = "4+", infra: str | None = None, name: str = "benchmax-envs",
                env_host_slots: int | None = None, port: int = RAY_PORT, workdir: str | None = None,
                ray_version: str | None = None, python_version: str | None = None) -> dict[str, Any]:
    """The SkyPilot task, as the YAML config ``sky.Task.from_yaml_config`` reads.

    ``workdir`` (default: this package's checkout, if it runs from one) is synced to the nodes
    and installed from; without one the nodes install this version from the package index.
    """
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ValueError(f"nodes must be a positive int, got {nodes!r}")
    if not (isinstance(cpus, str) and _CPUS.fullmatch(cpus) and float(cpus.rstrip("+")) > 0):
        raise ValueError(f"cpus must be a positive number of CPUs, or one with '+' for at least that many "
                         f"(SkyPilot's notation: 4, 4+, 0.5), got {cpus!r}")
    if not (isinstance(name, str) and _CLUSTER_NAME.fullmatch(name)):
        raise ValueError("name must be a SkyPilot cluster name (a letter, then letters, digits, '-', '_' or '.', "
                         f"ending with a letter or digit), got {name!r}")
    ray_version = ray_version or _ray_version()
    python_version = python_version or platform.python_version()
    workdir = workdir if workdir is not None else _checkout()
    if workdir:
        package = "-e '.[ray]'"
    else:
        from importlib.metadata import version

        package = f"'benchmax-gym[ray]=={version('benchmax-gym')}'"
    setup = (
        "set -e\n"
        # (a system Python under PEP 668, Debian 12 or Ubuntu 24.04 images, refuses even --user
        # installs unless told: uv goes to ~/.local, never into the system's packages)
        "python3 -m pip install -q --user uv || python3 -m pip install -q --user --break-system-packages uv\n"
        f"python3 -m uv venv --python {python_version} --seed {VENV}\n"
        f"python3 -m uv pip install --python {VENV}/bin/python {package} 'ray=={ray_version}'\n"
    )
    resources: dict[str, Any] = {"cpus": cpus}
    if infra:
        resources["infra"] = infra
    config: dict[str, Any] = {"name": name, "num_nodes": nodes, "resources": resources}
    if workdir:
        config["workdir"] = workdir
    config.update({
        "envs": {"BENCHMAX_RAY_PORT": str(port), "BENCHMAX_ENV_HOST_SLOTS": str(env_host_slots or "")},
        "setup": setup,
        "run": f". {VENV}/bin/activate\n" + RUN_SCRIPT,
    })
    return config


# -- SkyPilot's side (in the interpreter that has it) ----------------------------------------------


def _sky():
    try:
        import sky
    except ImportError:
        raise SystemExit(
            "benchmax-gym launch needs SkyPilot, which cannot share this environment (its click pin "
            "conflicts): install it in a venv of its own, e.g. python3 -m venv ~/.venv-sky && "
            f"~/.venv-sky/bin/pip install '{SKYPILOT.replace('==', '[kubernetes]==')}' (the extra of your "
            "infra: [kubernetes] for --infra k8s, [aws], [gcp]...; 'benchmax-gym[skypilot]' names the same pin), "
            "and pass --sky-python ~/.venv-sky/bin/python (or set BENCHMAX_GYM_SKY_PYTHON)"
        ) from None
    return sky


def sky_action(action: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``yaml``: the task as SkyPilot reads and writes it back; ``up``: launch it; ``down``."""
    sky = _sky()
    if action == "down":
        sky.stream_and_get(sky.down(payload["name"]))
        return {"down": payload["name"]}
    task = sky.Task.from_yaml_config(copy.deepcopy(payload["config"]))  # (it consumes its argument)
    if action == "yaml":
        written = {k: v for k, v in task.to_yaml_config().items() if not k.startswith("_")}
        again = sky.Task.from_yaml_config(copy.deepcopy(written)).to_yaml_config()
        if {k: v for k, v in again.items() if not k.startswith("_")} != written:
            raise SystemExit("SkyPilot does not read back the task it wrote")
        return {"yaml": written}
    job_id, handle = sky.stream_and_get(sky.launch(task, cluster_name=payload["name"]))
    ips = getattr(handle, "cached_internal_ips", None) or [getattr(handle, "head_ip", None)]
    return {"job_id": job_id, "head_ip": ips[0], "port": int(payload["config"]["envs"]["BENCHMAX_RAY_PORT"])}


def run_sky(action: str, payload: dict[str, Any], sky_python: str | None = None) -> dict[str, Any]:
    """:func:`sky_action` here, or in ``sky_python``'s interpreter with this file as its script."""
    sky_python = sky_python or os.environ.get("BENCHMAX_GYM_SKY_PYTHON")
    if not sky_python:
        return sky_action(action, payload)
    out = subprocess.run([sky_python, __file__, action], input=json.dumps(payload), text=True,
                         stdout=subprocess.PIPE)
    try:
        reply = json.loads(out.stdout)
    except ValueError:
        reply = {}
    if out.returncode != 0 or "error" in reply or not reply:
        why = reply.get("error") or f"exit code {out.returncode}"
        raise SystemExit(f"SkyPilot ({sky_python}) failed: {why}")
    return reply


def _serve_parent() -> int:
    """The script's side of :func:`run_sky`: the payload from stdin, one JSON object on stdout (the
    result, or ``{"error": ...}``, SkyPilot's own message). Everything SkyPilot prints goes to
    stderr, so a launch shows its progress as it goes and cannot garble the reply."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        result = sky_action(sys.argv[1], json.loads(sys.stdin.read()))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent, named
        message = exc.code if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
        reply.write(json.dumps({"error": " ".join(str(message).split())[:2000]}))
        reply.close()
        return 1
    reply.write(json.dumps(result))
    reply.close()
    return 0


if __name__ == "__main__":  # run by run_sky in SkyPilot's venv
    sys.exit(_serve_parent())
