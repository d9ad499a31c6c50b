"""The build matrix (``tests/matrix_envs.py``: a registered id, ``register_tool_env``,
``register_benchmax_env``, an MCP config, a mixture), and every other registered id as
tests/test_contract.py runs them, through ``gym.make_vec(..., vector_backend="ray")``, on this
folder's loopback cluster.

The matrix/* ids are registered in this (the driver's) process only, by a module of the user's
that the hosts never import (it is sent by value, cloudpickle, as to hosts on machines without
it): the hosts learn every id from the driver's registrations (``driver_registrations``), the MCP
config's ``gym.register`` with a module path for its entry point included.
"""

import os

# Before Ray is imported: every node and process of the test cluster stays on 127.0.0.1 (Ray
# reads this once), and no token file a user left in ~/.ray turns authentication on.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"

import functools  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import ray  # noqa: E402

from benchmax_gym.wrappers import RayVectorEnv  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import matrix_envs  # noqa: E402  (registers the matrix/* ids in this process only)
from matrix_envs import CASES, final_reply  # noqa: E402
from test_contract import BUILTIN, OFFLINE  # noqa: E402

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(matrix_envs)

HOST = {"num_cpus": 0, "resources": {"benchmax_env_host": 1}}
IDS = list(CASES)


@pytest.mark.parametrize("env_id", IDS)
def test_make_vec_on_ray_hosts(cluster, env_id):
    """Lock-step, then ready-first, on one host holding both envs."""
    kwargs, call, shows, _, reward = CASES[env_id]
    final = final_reply(env_id, kwargs)
    envs = gym.make_vec(env_id, num_envs=2, vector_backend="ray", envs_per_host=2, actor_options=HOST, **kwargs)
    try:
        assert isinstance(envs, RayVectorEnv)
        envs.reset(seed=0, options={"task_index": 0})
        obs, _, terminated, _, info = envs.step([call, call])
        assert all(shows in o for o in obs) and not terminated.any(), (obs, info.get("error"))
        envs.send([final, "<answer>wrong</answer>"], env_ids=np.arange(2))
        seen = {}
        while len(seen) < 2:
            _, rewards, terminated, _, _, ids = envs.recv(min_ready=1)
            seen.update(zip(ids.tolist(), zip(rewards.tolist(), terminated.tolist())))
        assert seen[0] == (reward, True) and seen[1][1] and seen[1][0] < reward
    finally:
        envs.close()



OTHERS = [i for i in BUILTIN if i not in CASES]


@pytest.fixture(scope="module")
def other_ids_on_hosts(cluster):
    """One env of each id in ``OTHERS`` on two hosts that their tests share (a host is a process
    to start), reset; with the reset's observations."""
    fns = [functools.partial(gym.make, i, **({"task_args": OFFLINE[i]} if i in OFFLINE else {})) for i in OTHERS]
    # (only "error" of the infos: the families' task_metadata differ, which one batch refuses)
    envs = RayVectorEnv(fns, num_hosts=2, actor_options=HOST, info_keys=["error"])
    try:
        obs, info = envs.reset(seed=0)
        yield envs, obs, info.get("error")
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", OTHERS)
def test_every_registered_id_runs_on_ray_hosts(other_ids_on_hosts, env_id):
    """As test_contract's make_vec modes: a reset, then a final reply, graded on a host (the id
    path, ``gym.make_vec(ID, vector_backend="ray")``, runs above and in test_ray_vector.py)."""
    envs, obs, errors = other_ids_on_hosts
    index = OTHERS.index(env_id)
    assert isinstance(obs[index], str) and obs[index], errors[index] if errors is not None else None
    envs.send(["I am done."], env_ids=[index])
    _, rewards, terminated, _, info, ids = envs.recv(min_ready=1)
    assert ids.tolist() == [index] and terminated[0] and not np.isnan(rewards[0]), info.get("error")
