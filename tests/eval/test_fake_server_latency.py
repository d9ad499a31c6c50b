"""The loopback chat server's reply latency, which the eval benchmarks rate the harness against:
exact by default, spread around the same mean with ``latency_jitter`` (as a real server's)."""

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmax_gym.testing.openai_server import FakeChatServer, calculator_model

BODY = json.dumps({"model": "test-model", "messages": [{"role": "user", "content": "Compute: 1 + 1"}]}).encode()


def waits(server: FakeChatServer, n: int) -> list[float]:
    """Each of ``n`` requests sent at once: seconds until its reply."""
    def one(_):
        start = time.monotonic()
        request = urllib.request.Request(server.url + "/chat/completions", BODY, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.load(response)["choices"][0]["message"]["role"] == "assistant"
        return time.monotonic() - start

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_latency_jitter_spreads_replies_around_the_latency():
    with FakeChatServer(calculator_model, latency=0.3) as exact, \
            FakeChatServer(calculator_model, latency=0.3, latency_jitter=0.5) as spread:
        exact_waits, spread_waits = waits(exact, 16), waits(spread, 16)
    assert min(exact_waits) >= 0.3
    assert min(spread_waits) >= 0.15  # latency * (1 - 0.5)
    # 16 uniform draws over [0.15, 0.45] s: they span well over 0.1 s (all within 0.1 s: p < 1e-5)
    assert max(spread_waits) - min(spread_waits) > 0.1


@pytest.mark.parametrize("jitter", [-0.1, 1.5])
def test_a_latency_jitter_outside_0_to_1_is_refused(jitter):
    with pytest.raises(ValueError, match="latency_jitter must be between 0 and 1"):
        FakeChatServer(calculator_model, latency=0.1, latency_jitter=jitter)
