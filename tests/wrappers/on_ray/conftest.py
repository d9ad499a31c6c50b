"""One real multi-node Ray cluster on loopback for the modules here (a head and two nodes with the
env-host resource, everything on 127.0.0.1; tests/conftest.py keeps Ray on loopback), shared by
them: an xdist worker starts it with the first of these tests it runs and stops it as it leaves
this package."""

import pytest
import ray
from ray.cluster_utils import Cluster

NODE = {"num_cpus": 1, "resources": {"benchmax_env_host": 4}, "object_store_memory": 100 * 2**20,
        "node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="package")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 100 * 2**20, "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
        # a node that stops answering is declared dead within about two seconds
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
    })
    for _ in range(2):
        cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    yield cluster
    ray.shutdown()
    cluster.shutdown()
