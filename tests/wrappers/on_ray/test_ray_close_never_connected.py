"""close() does not wait on an env host the parent never connected to (its actor placed, but the
start failed on another host first): that host heard no close and would wait in ``serve`` for a
parent for minutes; it is killed at once, and no actor of it is left.

On the loopback cluster of this folder's conftest.py.
"""

import sys
import threading

import pytest
import ray

from benchmax_gym.wrappers import RayVectorEnv
from benchmax_gym.wrappers import vector
from tests.wrappers.on_ray.test_ray_vector import HOST, Flaky, cannot_be_built, gone, our_actors

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

GUARD_S = 100  # a hang guard: starting three hosts takes seconds; the grace close() would wait out is an hour


@pytest.mark.parametrize("hears_close", [True, False], ids=["POLLRDHUP", "no POLLRDHUP (macOS)"])
def test_close_does_not_wait_on_a_host_never_connected(cluster, monkeypatch, hears_close):
    """Host 0 cannot build its envs, so the constructor fails before it connects to hosts 1 and 2,
    which are placed and listening; its close() kills them rather than wait out its grace (made an
    hour here) for a close they never heard, on a platform where a closed connection shows
    (POLLRDHUP: they were killed first) and one where it does not (close() waited 10 s)."""
    monkeypatch.setattr(vector, "HEARS_CLOSE", hears_close)
    monkeypatch.setattr(vector, "CLOSE_GRACE_S", 3600.0)
    raised = []

    def start():
        try:
            RayVectorEnv([cannot_be_built, Flaky, Flaky], num_hosts=3, actor_options=HOST)
        except RuntimeError as exc:
            raised.append(exc)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    starting.join(GUARD_S)
    assert not starting.is_alive(), "close() waited on the hosts it never connected to"
    assert raised and "not_installed_on" in str(raised[0])
    assert gone([], [], actors=True), our_actors()
