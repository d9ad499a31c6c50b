"""RayVectorEnv against SubprocVectorEnv on a loopback Ray cluster. Prints one JSON object.

A head and two nodes on 127.0.0.1 (each with the ``benchmax_env_host`` resource), 64 envs, one
host (or worker process) per node's core; the environments and actions of
``vector_throughput.py``:
1. cheap tool (Math-v0's calculator): steps per second, lock-step and ready-first;
2. heavy-tailed tool latency (90% 5 ms, 10% 200 ms): steps per second, ready-first;
3. memory: proportional set size (PSS) of each host process, against a local worker's, after
   the first reset (``vector_throughput``'s episodes never end, so later figures grow with the
   transcripts, that is with how many steps a backend managed);
4. recovery: a node removed (its raylet killed) during ready-first stepping: seconds until its
   envs report the loss, and until their replacement host returns results again.

    python benchmarks/remote_throughput.py [--envs 64] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the cluster stays on 127.0.0.1
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench import memory, need  # noqa: E402

need("ray", "ray")
import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import vector_throughput as vt  # noqa: E402

from benchmax_gym.wrappers import RayVectorEnv, SubprocVectorEnv  # noqa: E402

NODE = {"num_cpus": 1, "resources": {"benchmax_env_host": 4}, "object_store_memory": 100 * 2**20,
        "node_ip_address": "127.0.0.1"}
# The hosts import vector_throughput (it registers the heavy-tailed id) from this directory.
HOST = {"num_cpus": 0, "resources": {"benchmax_env_host": 1},
        "runtime_env": {"env_vars": {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}}}


def ready_first_rate(envs, action, seconds: float, batch: int) -> float:
    envs.reset(seed=0)
    envs.send([action() for _ in range(envs.num_envs)], np.arange(envs.num_envs))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        *_, ids = envs.recv(min_ready=batch)
        steps += len(ids)
        envs.send([action() for _ in ids], ids)
    rate = steps / (time.perf_counter() - start)
    envs.recv(min_ready=envs.num_envs)
    return rate


def pss_mb(pids: list[int]) -> list[float]:
    return [round(m["pss"] / 2**20, 1) if (m := memory(p)) else None for p in pids]


def recovery(cluster, n: int) -> dict:
    """Remove the node of host 1 during ready-first stepping; time the loss and the replacement."""
    envs = RayVectorEnv([vt.slow_env] * n, num_hosts=2, actor_options=HOST)
    lost = [i for i in range(n) if envs._owner[i] == 1]
    victim = envs.hosts[1]
    node = next(node for node in cluster.worker_nodes if node.node_id == victim["node_id"])
    rng = np.random.default_rng(0)
    envs.reset(seed=0)
    envs.send([vt.latency_action(rng) for _ in range(n)], np.arange(n))
    for _ in range(20):
        *_, ids = envs.recv(min_ready=8)
        envs.send([vt.latency_action(rng) for _ in ids], ids)
    start = time.perf_counter()
    cluster.remove_node(node, allow_graceful=False)
    reported = back = None
    while back is None:
        _, _, _, truncated, info, ids = envs.recv(min_ready=1)
        now = time.perf_counter() - start
        for j, i in enumerate(ids.tolist()):
            if i in lost and truncated[j] and reported is None:
                reported = now
            elif i in lost and reported is not None and not truncated[j]:
                back = now
        envs.send([vt.latency_action(rng) for _ in ids], ids)
    envs.recv(min_ready=n)
    envs.close()
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    return {"node_lost_to_truncation_s": round(reported, 2), "node_lost_to_replacement_results_s": round(back, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    n, secs = args.envs, args.seconds
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 100 * 2**20, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3}})
    for _ in range(2):
        cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    result = {"benchmark": "remote_throughput", "envs": n, "cpus": os.cpu_count(), "nodes": 2,
              "hosts_or_workers": 2, "ray": ray.__version__}
    calc = lambda: vt.CALC  # noqa: E731
    rng = np.random.default_rng(0)
    tail = lambda: vt.latency_action(rng)  # noqa: E731
    makers = {
        "subproc": lambda fn: SubprocVectorEnv([fn] * n, num_workers=2),
        "ray": lambda fn: RayVectorEnv([fn] * n, num_hosts=2, actor_options=HOST),
    }
    cheap, heavy, memory = {}, {}, {}
    for name, make in makers.items():
        envs = make(vt.math_env)
        envs.reset(seed=0)
        memory[f"{name}_pss_mb_per_process"] = pss_mb(envs.worker_pids)
        cheap[f"{name}_lockstep"] = vt.lockstep_rate(envs, lambda: [vt.CALC] * n, secs)
        cheap[f"{name}_ready_first"] = ready_first_rate(envs, calc, secs, batch=n // 8)
        envs.close()
        envs = make(vt.slow_env)
        heavy[f"{name}_ready_first"] = ready_first_rate(envs, tail, secs, batch=n // 8)
        envs.close()
    cheap["ray_over_subproc_lockstep"] = cheap["ray_lockstep"] / cheap["subproc_lockstep"]
    cheap["ray_over_subproc_ready_first"] = cheap["ray_ready_first"] / cheap["subproc_ready_first"]
    heavy["ray_over_subproc_ready_first"] = heavy["ray_ready_first"] / heavy["subproc_ready_first"]
    result["cheap_tool_steps_per_s"] = cheap
    result["heavy_tail_steps_per_s"] = heavy
    result["memory"] = memory
    result["recovery"] = recovery(cluster, n)
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
