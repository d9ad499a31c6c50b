"""Fixtures of the engine's tests."""

import os

import pytest

from benchmax_gym.core.sandbox import bubblewrap_status


@pytest.fixture(scope="module")
def bubblewrap():
    """The full sandbox level: CI must have it; elsewhere its tests skip saying how to get it."""
    ok, why = bubblewrap_status()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the full sandbox level: {why}")
        pytest.skip(f"bubblewrap is not usable here ({why}); `apt-get install bubblewrap` to run these")
    return True
