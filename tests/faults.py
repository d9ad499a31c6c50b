"""Real faults injected into running environments (issue 29's per-family tests)."""

import os
import signal
import threading
import time


def kill_sandbox_server_during(env, action: str, wait: float = 60.0):
    """Step ``env`` with ``action`` (model code that runs for long) in a thread and SIGKILL the
    sandbox server while the call runs: what the step returns."""
    box = env.unwrapped.episode.state["sandbox"]
    out = []
    stepping = threading.Thread(target=lambda: out.append(env.step(action)))
    stepping.start()
    deadline = time.monotonic() + wait
    while box._running is None and stepping.is_alive() and time.monotonic() < deadline:  # the call was sent
        time.sleep(0.02)
    assert box._running is not None, f"the call never reached the sandbox: {out}"
    server = box._running[0]
    os.killpg(server.proc.pid, signal.SIGKILL)
    stepping.join(wait)
    assert out, "the step did not return after its sandbox server was killed"
    return out[0]
