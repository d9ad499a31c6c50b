import socket
import subprocess
import time

import pytest


@pytest.fixture
def http_server():
    """Start ``command(port)`` on a free loopback port; returns its MCP URL once it accepts
    connections. The process is killed at the end of the test."""
    started = []

    def start(command, timeout=60):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        started.append(subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        return f"http://127.0.0.1:{port}/mcp"

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
